package main

import (
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/gpustore/gpustore/bench/gpusim"
)

// The command simulates nodes shaped like an 8-GPU HGX H100 server (DGX
// H100: two 56-core Xeon Platinum 8480C with SMT, 224 logical CPUs), and
// node-exporter reports node_cpu_seconds_total for each logical CPU in 8
// modes: 1,792 series per node from its CPUs alone, which dominate a node's
// series count and so the receivers' sizing.
func TestDefaultNodeShapeIsHGX(t *testing.T) {
	const sockets, coresPerSocket, threadsPerCore = 2, 56, 2
	var f simFlags
	fs := flag.NewFlagSet("gpusim", flag.ContinueOnError)
	f.register(fs, false)
	if err := fs.Parse([]string{"--cluster.nodes=1"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := f.config(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if want := sockets * coresPerSocket * threadsPerCore; cfg.NodeCPUs != want {
		t.Fatalf("default --sim.node-cpus %d, want %d (an HGX H100 server's logical CPUs)", cfg.NodeCPUs, want)
	}
	c, err := gpusim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.StepNode(0, time.Now()); err != nil {
		t.Fatal(err)
	}
	page, err := c.AppendNodeText(nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(page), "\n") {
		if strings.HasPrefix(line, "node_cpu_seconds_total{") {
			n++
		}
	}
	if want := sockets * coresPerSocket * threadsPerCore * 8; n != want {
		t.Errorf("node page has %d node_cpu_seconds_total series, want %d", n, want)
	}
}
