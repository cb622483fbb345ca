package rulepack

import (
	"context"
	"fmt"
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/promql/promqltest"
	"gopkg.in/yaml.v3"
)

// BenchmarkXidRecentRule evaluates gpu:xid_errors:recent, the pack's
// costliest rule (two subqueries over an hour, every 15 s), once over two
// hours of 15 s data from 1000 GPUs (125 nodes, a pod on each GPU) with
// Prometheus' engine.
func BenchmarkXidRecentRule(b *testing.B) {
	raw, err := fs.ReadFile(FS, "gpu-alerts.yml")
	if err != nil {
		b.Fatal(err)
	}
	var rf struct {
		Groups []struct {
			Rules []struct{ Record, Expr string }
		}
	}
	if err := yaml.Unmarshal(raw, &rf); err != nil {
		b.Fatal(err)
	}
	expr := ""
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Record == "gpu:xid_errors:recent" {
				expr = r.Expr
			}
		}
	}
	var load strings.Builder
	load.WriteString("load 15s\n")
	for n := range 125 {
		for g := range 8 {
			fmt.Fprintf(&load, "  DCGM_FI_DEV_XID_ERRORS{gpu=\"%d\", UUID=\"GPU-%04d-%d\", pci_bus_id=\"00000000:%02d:00.0\", device=\"nvidia%d\", modelName=\"NVIDIA H100 80GB HBM3\", Hostname=\"gpu-node-%03d\", DCGM_FI_DRIVER_VERSION=\"570.172.08\", instance=\"10.42.%d.3:9400\", job=\"dcgm-exporter\", cluster=\"c\", pod=\"p-%d-%d\", namespace=\"ns\", container=\"c\", err_code=\"0\", err_msg=\"No Error\"} 0x480\n", g, n, g, g, g, n, n, n, g)
		}
	}
	storage := promqltest.LoadedStorage(b, load.String())
	engine := promqltest.NewTestEngine(b, false, 5*time.Minute, 1e9)
	b.ResetTimer()
	for b.Loop() {
		q, err := engine.NewInstantQuery(context.Background(), storage, nil, expr, time.Unix(0, 0).Add(2*time.Hour))
		if err != nil {
			b.Fatal(err)
		}
		if res := q.Exec(context.Background()); res.Err != nil {
			b.Fatal(res.Err)
		}
		q.Close()
	}
}
