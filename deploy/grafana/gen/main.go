// Command gen writes gpustore's Grafana dashboards as JSON, and a picture of
// each one's layout as PNG: `go generate ./deploy/grafana` or `make
// dashboards`.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"image/png"
	"os"
	"path/filepath"
	"strings"

	"github.com/gpustore/gpustore/deploy/grafana"
	"github.com/gpustore/gpustore/deploy/grafana/render"
)

func main() {
	out := flag.String("out", "dashboards", "Directory to write the dashboards into.")
	pictures := flag.String("png", "", "Directory to write a PNG of each dashboard's layout into (none when empty).")
	flag.Parse()
	if err := run(*out, *pictures); err != nil {
		fmt.Fprintf(os.Stderr, "gen: %v\n", err)
		os.Exit(1)
	}
}

func run(dir, pngDir string) error {
	ds, err := grafana.Dashboards()
	if err != nil {
		return err
	}
	for _, d := range []string{dir, pngDir} {
		if d != "" {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
	}
	for _, d := range ds {
		b, err := grafana.JSON(d.Board)
		if err != nil {
			return fmt.Errorf("%s: %w", d.File, err)
		}
		if err := os.WriteFile(filepath.Join(dir, d.File), b, 0o644); err != nil {
			return err
		}
		if pngDir == "" {
			continue
		}
		img, err := render.Image(b)
		if err != nil {
			return fmt.Errorf("%s: %w", d.File, err)
		}
		var buf bytes.Buffer
		if err := (&png.Encoder{CompressionLevel: png.BestCompression}).Encode(&buf, img); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(pngDir, strings.TrimSuffix(d.File, ".json")+".png"), buf.Bytes(), 0o644); err != nil {
			return err
		}
	}
	return nil
}
