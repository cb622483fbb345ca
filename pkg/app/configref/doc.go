package configref

//go:generate go run ./gen -root ../../.. -out ../../../docs/configuration.md
