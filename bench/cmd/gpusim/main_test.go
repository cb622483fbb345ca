package main

import (
	"flag"
	"os"
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

// `make run` (scripts/run.sh) feeds gpustore a simulated cluster with the
// fault schedule scripts/run-faults.yaml, so a first run shows the rule
// pack at work (issue 38 item 13, issue 39 item 12): the command takes the
// file as run.sh passes it, for run.sh's 16 nodes, with a page-worthy
// incident (an Xid 79, an uncorrectable ECC error) starting within the
// first 5 minutes of the run and every fault in them.
func TestRunScriptFaultSchedule(t *testing.T) {
	const schedule = "../../../scripts/run-faults.yaml"
	var f simFlags
	fs := flag.NewFlagSet("gpusim", flag.ContinueOnError)
	f.register(fs, true)
	if err := fs.Parse([]string{"--cluster.nodes=16", "--faults.file=" + schedule}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	cfg, err := f.config(start)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gpusim.New(cfg); err != nil {
		t.Fatalf("%s does not fit run.sh's 16-node cluster: %v", schedule, err)
	}
	pages := 0
	for _, ft := range cfg.Faults {
		if ft.At > 5*time.Minute {
			t.Errorf("%s at %s: later than the first 5 minutes of the run", ft.Kind, ft.At)
		}
		if ft.Kind == gpusim.FaultECCDBE || (ft.Kind == gpusim.FaultXid && ft.Code == 79) {
			pages++
		}
	}
	if pages == 0 {
		t.Errorf("%s has no incident the pack pages P0 (Xid 79, ecc_dbe)", schedule)
	}
	run, err := os.ReadFile("../../../scripts/run.sh")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(run), "scripts/run-faults.yaml") || !strings.Contains(string(run), "--faults.file") {
		t.Error("scripts/run.sh does not pass scripts/run-faults.yaml to gpusim")
	}
}
