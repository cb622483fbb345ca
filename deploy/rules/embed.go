// Package rulepack embeds gpustore's GPU rule pack: the Prometheus rule files
// in this folder (recording rules, P0/P1/P2 alerts and the Xid catalogue), so
// that gpustore can load them by default. The same files work unchanged in a
// plain Prometheus (rule_files). README.md in this folder lists every rule;
// tests/ holds the promtool unit tests, which are not embedded.
package rulepack

import (
	"embed"
	"io/fs"
	"slices"
)

// FS holds the rule files, at the root of the file system.
//
//go:embed *.yml
var FS embed.FS

// Files returns the sorted names of the rule files in FS.
func Files() []string {
	names, err := fs.Glob(FS, "*.yml")
	if err != nil {
		// The pattern is constant and valid.
		panic(err)
	}
	slices.Sort(names)
	return names
}
