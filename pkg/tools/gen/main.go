// Command gen writes the reference of `gpustore tools` (docs/tools.md) from
// the commands' definitions in pkg/tools.
package main

import (
	"flag"
	"log"
	"os"

	"github.com/gpustore/gpustore/pkg/tools"
)

func main() {
	out := flag.String("out", "docs/tools.md", "file to write")
	flag.Parse()
	if err := os.WriteFile(*out, []byte(tools.Reference()), 0o644); err != nil {
		log.Fatal(err)
	}
}
