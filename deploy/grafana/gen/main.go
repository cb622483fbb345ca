// Command gen writes gpustore's Grafana dashboards as JSON: `go generate
// ./deploy/grafana` or `make dashboards`.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/gpustore/gpustore/deploy/grafana"
)

func main() {
	out := flag.String("out", "dashboards", "Directory to write the dashboards into.")
	flag.Parse()
	if err := run(*out); err != nil {
		fmt.Fprintf(os.Stderr, "gen: %v\n", err)
		os.Exit(1)
	}
}

func run(dir string) error {
	ds, err := grafana.Dashboards()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, d := range ds {
		b, err := grafana.JSON(d.Board)
		if err != nil {
			return fmt.Errorf("%s: %w", d.File, err)
		}
		if err := os.WriteFile(filepath.Join(dir, d.File), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}
