// Command gen writes the configuration reference into docs/configuration.md
// between its markers: `make docs` (go generate ./pkg/app/configref).
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/gpustore/gpustore/pkg/app/configref"
)

func main() {
	root := flag.String("root", "../../..", "The module's directory (for the configuration structs' doc comments).")
	out := flag.String("out", "../../../docs/configuration.md", "The page to write the reference into, between its markers.")
	flag.Parse()
	if err := run(*root, *out); err != nil {
		fmt.Fprintf(os.Stderr, "gen: %v\n", err)
		os.Exit(1)
	}
}

func run(root, out string) error {
	page, err := os.ReadFile(out)
	if err != nil {
		return err
	}
	r := configref.New(configref.Comments(root))
	if keys := r.Undescribed(); len(keys) > 0 {
		return fmt.Errorf("YAML keys with neither a flag nor a doc comment: %v", keys)
	}
	updated, err := configref.Update(string(page), r)
	if err != nil {
		return err
	}
	return os.WriteFile(out, []byte(updated), 0o644)
}
