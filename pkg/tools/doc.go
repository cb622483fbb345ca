package tools

//go:generate go run ./gen -out ../../docs/tools.md
