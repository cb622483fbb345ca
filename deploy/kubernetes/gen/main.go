// Command gen writes the Prometheus Operator component's PrometheusRules
// from deploy/rules/self: `go generate ./deploy/kubernetes` or
// `make manifests`.
package main

import (
	"fmt"
	"os"

	"github.com/gpustore/gpustore/deploy/kubernetes"
)

func main() {
	b, err := kubernetes.PrometheusRules(kubernetes.SelfRulesGlob)
	if err == nil {
		err = os.WriteFile(kubernetes.PrometheusRulesFile, b, 0o644)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "gen: %v\n", err)
		os.Exit(1)
	}
}
