//go:build tools

// The end-to-end tests run a real Prometheus and promtool. They are built
// from this module's own dependency graph (see `make tools`), so they share
// the build cache with gpustore and use the very Prometheus version gpustore
// imports; this file keeps their packages in go.mod and go.sum.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
