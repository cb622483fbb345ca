// Command rules writes the Xid catalogue as a Prometheus rule file
// (deploy/rules/xid-catalog.yml). It is run by `go generate ./pkg/rules/xid/`.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/gpustore/gpustore/pkg/rules/xid"
)

func main() {
	out := flag.String("o", "", "output file (required)")
	flag.Parse()
	if *out == "" {
		fmt.Fprintln(os.Stderr, "rules: -o is required")
		os.Exit(2)
	}
	if err := os.WriteFile(*out, xid.RuleFile(), 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "rules: write %s: %v\n", *out, err)
		os.Exit(1)
	}
}
