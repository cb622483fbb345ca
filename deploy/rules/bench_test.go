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
	benchRule(b, "gpu:xid_errors:recent", `DCGM_FI_DEV_XID_ERRORS{%s, err_code="0", err_msg="No Error"} 0x480`)
}

// BenchmarkCounterAlerts evaluates the counter alerts whose subqueries
// reduce each GPU's counter across an exporter rename and take `node` from
// an instant join, over the same two hours of 1000 GPUs: the hour-long
// single-bit ECC subquery and the 10-minute NVLink one.
func BenchmarkCounterAlerts(b *testing.B) {
	b.Run("GPUECCSingleBitErrorRate", func(b *testing.B) {
		benchRule(b, "GPUECCSingleBitErrorRate", `DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{%s} 0+1x480`)
	})
	b.Run("NVLinkReplayRecoveryErrors", func(b *testing.B) {
		benchRule(b, "NVLinkReplayRecoveryErrors", `DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL{%s} 0+1x480`)
	})
}

// BenchmarkGPUXidError evaluates GPUXidError, which ranks Xid 154 by the
// highest recovery action of the last 10 minutes (issue 39), over two hours
// of 1000 GPUs exporting the recovery action (the field the 154 ranking
// reads; no Xid recent, the steady state of a healthy fleet).
func BenchmarkGPUXidError(b *testing.B) {
	benchRule(b, "GPUXidError", `DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION{%s} 0x480`)
}

// BenchmarkGPUMemoryHigh evaluates GPUMemoryHigh, which since issue 39
// counts the five-minute intervals of the last 30 minutes in which each
// GPU's memory grew (a subquery), over two hours of 1000 GPUs whose jobs
// hold a preallocated pool (flat, 99.5 % used: the common case the alert
// must not fire on).
func BenchmarkGPUMemoryHigh(b *testing.B) {
	benchRule(b, "GPUMemoryHigh", "DCGM_FI_DEV_FB_USED{%[1]s} 80700x480\n  DCGM_FI_DEV_FB_FREE{%[1]s} 379x480")
}

// benchRule evaluates the pack's rule (record or alert) named name once,
// at the end of two hours of 15 s samples of series (a promqltest load line
// whose %s receives each GPU's dcgm-exporter 4.8.2 labels) from 125 nodes
// of 8 GPUs, a pod on each.
func benchRule(b *testing.B, name, series string) {
	expr := packExpr(b, name)
	var load strings.Builder
	load.WriteString("load 15s\n")
	for n := range 125 {
		for g := range 8 {
			gpuLabels := fmt.Sprintf(`gpu="%d", UUID="GPU-%04d-%d", pci_bus_id="00000000:%02d:00.0", device="nvidia%d", modelName="NVIDIA H100 80GB HBM3", Hostname="gpu-node-%03d", DCGM_FI_DRIVER_VERSION="570.172.08", instance="10.42.%d.3:9400", job="dcgm-exporter", cluster="c", pod="p-%d-%d", namespace="ns", container="c"`, g, n, g, g, g, n, n, n, g)
			fmt.Fprintf(&load, "  "+series+"\n", gpuLabels)
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

// packExpr is the expression of gpu-alerts.yml's rule named name.
func packExpr(b *testing.B, name string) string {
	raw, err := fs.ReadFile(FS, "gpu-alerts.yml")
	if err != nil {
		b.Fatal(err)
	}
	var rf struct {
		Groups []struct {
			Rules []struct{ Record, Alert, Expr string }
		}
	}
	if err := yaml.Unmarshal(raw, &rf); err != nil {
		b.Fatal(err)
	}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Record == name || r.Alert == name {
				return r.Expr
			}
		}
	}
	b.Fatalf("no rule %s in gpu-alerts.yml", name)
	return ""
}

// BenchmarkGPURecoveryActionRequired is the same data read by the alert on
// the recovery action itself: the cost of reading the field for every GPU,
// to compare GPUXidError's 154 ranking with.
func BenchmarkGPURecoveryActionRequired(b *testing.B) {
	benchRule(b, "GPURecoveryActionRequired", `DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION{%s} 0x480`)
}
