// Command table turns pkg/rules/xid/catalog.tsv (NVIDIA's Xid catalogue as
// transcribed for gpustore) into the Go table catalog_gen.go. It is run by
// `go generate ./pkg/rules/xid/`, before gen/rules renders the rule file.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/gpustore/gpustore/pkg/rules/xid/xidtable"
)

func main() {
	in := flag.String("in", "", "catalogue TSV (required)")
	out := flag.String("o", "", "output Go file (required)")
	flag.Parse()
	if *in == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "table: -in and -o are required")
		os.Exit(2)
	}
	if err := run(*in, *out); err != nil {
		fmt.Fprintln(os.Stderr, "table:", err)
		os.Exit(1)
	}
}

func run(in, out string) error {
	f, err := os.Open(in)
	if err != nil {
		return err
	}
	defer f.Close()
	rows, err := xidtable.Parse(f)
	if err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	src, err := xidtable.GoSource(rows)
	if err != nil {
		return err
	}
	if err := os.WriteFile(out, src, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", out, err)
	}
	return nil
}
