package grafana

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/prometheus/prometheus/promql/promqltest"
)

// The dashboards across a dcgm-exporter upgrade, evaluated by Prometheus'
// own engine over hand-written series with dcgm-exporter 4.8.2's labels.

// The overview's energy panels add up the pieces a GPU's energy counter is
// cut into within the range. An exporter upgrade (or any restart of its pod)
// gives every series a new `instance`, the new pod's address, and a build
// from dcgm-exporter's main branch names the host `hostname` instead of
// `Hostname` (the dcgm ingest preset writes Hostname for both). Taking the
// largest piece per pod, as the panels did, dropped the energy on the other
// side of the upgrade. Evaluated by Prometheus' own engine over an hour
// with the upgrade at 20m: 600 W for an hour is 0.6 kWh per GPU.
func TestEnergyPanelsAddUpAnExporterUpgrade(t *testing.T) {
	// dcgm-exporter 4.8.2's labels; the energy counter (mJ, since the driver
	// loaded) goes on through the upgrade: 600 W = 18e6 mJ per 30 s scrape.
	// The old series end with a staleness marker at 20m, the new exporter's
	// first scrape is at 20m30s. research's GPU arrives through the dcgm
	// preset (Hostname on both sides), inference's as the exporter sends it.
	const gpu0 = `gpu="0", UUID="GPU-3f1c2a9e-8b7d-4e61-a0c5-1d2e3f4a5b60", pci_bus_id="00000000:18:00.0", device="nvidia0", modelName="NVIDIA H100 80GB HBM3", DCGM_FI_DRIVER_VERSION="570.172.08", job="dcgm-exporter", cluster="gpu-cluster-prod-01", pod="llm-pretrain-worker-0", namespace="research", container="pytorch"`
	const gpu1 = `gpu="1", UUID="GPU-2b3c4d5e-6f70-4812-9a3b-4c5d6e7f8091", pci_bus_id="00000000:2A:00.0", device="nvidia1", modelName="NVIDIA H100 80GB HBM3", DCGM_FI_DRIVER_VERSION="570.172.08", job="dcgm-exporter", cluster="gpu-cluster-prod-01", pod="vllm-7c9d5-x2k4p", namespace="inference", container="vllm"`
	storage := promqltest.LoadedStorage(t, `
load 30s
  DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{`+gpu0+`, Hostname="gpu-node-01", instance="10.42.1.17:9400"} 0+18000000x39 stale
  DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{`+gpu0+`, Hostname="gpu-node-01", instance="10.42.1.23:9400"} _x41 738000000+18000000x79
  DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{`+gpu1+`, Hostname="gpu-node-01", instance="10.42.1.17:9400"} 0+18000000x39 stale
  DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{`+gpu1+`, hostname="gpu-node-01", instance="10.42.1.23:9400"} _x41 738000000+18000000x79
  kube_pod_owner{namespace="research", pod="llm-pretrain-worker-0", owner_kind="PyTorchJob", owner_name="llm-pretrain", owner_is_controller="true", job="kube-state-metrics", instance="10.42.0.5:8080", cluster="gpu-cluster-prod-01"} 1x120
  kube_pod_owner{namespace="inference", pod="vllm-7c9d5-x2k4p", owner_kind="ReplicaSet", owner_name="vllm-7c9d5", owner_is_controller="true", job="kube-state-metrics", instance="10.42.0.5:8080", cluster="gpu-cluster-prod-01"} 1x120
`)
	engine := promqltest.NewTestEngine(t, false, 5*time.Minute, promqltest.DefaultMaxSamplesPerQuery)
	overview := committed(t)["gpu-cluster-overview.json"]
	// increase() loses the 30 s between the old exporter's last scrape and
	// the new one's first: 119 of the hour's 120 scrape intervals.
	const want = 0.6 * 119 / 120
	for _, tc := range []struct{ title, legendLabel string }{
		{"Energy by namespace", "namespace"},
		{"Energy by job", "owner_name"},
	} {
		_, expr := panelByTitle(t, overview, tc.title)
		expr = fillVars(expr, map[string]string{"cluster": "gpu-cluster-prod-01"}) // $__range is 1h
		q, err := engine.NewInstantQuery(context.Background(), storage, nil, expr, time.Unix(0, 0).Add(time.Hour))
		if err != nil {
			t.Fatalf("panel %q: %s: %v", tc.title, expr, err)
		}
		res := q.Exec(context.Background())
		if res.Err != nil {
			t.Fatalf("panel %q: %s: %v", tc.title, expr, res.Err)
		}
		vec, err := res.Vector()
		if err != nil {
			t.Fatal(err)
		}
		if len(vec) != 2 {
			t.Errorf("panel %q: %v, want one value for each of two owners", tc.title, vec)
		}
		for _, s := range vec {
			if math.Abs(s.F-want) > 1e-9 {
				t.Errorf("panel %q: %s = %.4f kWh, want %.4f (an hour at 600 W, less the upgrade's 30 s gap)", tc.title, s.Metric.Get(tc.legendLabel), s.F, want)
			}
		}
	}
}

// The overview's cluster-wide stats (GPUs, total power, average
// utilisation) count a GPU once while its old and new series are both in
// the 5-minute lookback: an exporter upgrade renamed Hostname to hostname
// and no staleness marker was written (Prometheus restarted meanwhile).
// They give what the rule pack's cluster:* records give over the same data.
func TestOverviewStatsCountAGPUOnceAcrossTheRename(t *testing.T) {
	const gpu0 = `gpu="0", UUID="GPU-3f1c2a9e-8b7d-4e61-a0c5-1d2e3f4a5b60", pci_bus_id="00000000:18:00.0", device="nvidia0", modelName="NVIDIA H100 80GB HBM3", DCGM_FI_DRIVER_VERSION="570.172.08", job="dcgm-exporter", cluster="gpu-cluster-prod-01", pod="llm-pretrain-worker-0", namespace="research", container="pytorch"`
	const old, upgraded = `Hostname="gpu-node-01", instance="10.42.1.17:9400"`, `hostname="gpu-node-01", instance="10.42.1.23:9400"`
	storage := promqltest.LoadedStorage(t, `
load 30s
  DCGM_FI_DEV_GPU_TEMP{`+gpu0+`, `+old+`} 60x15
  DCGM_FI_DEV_GPU_TEMP{`+gpu0+`, `+upgraded+`} _x17 60x30
  DCGM_FI_DEV_POWER_USAGE{`+gpu0+`, `+old+`} 540x15
  DCGM_FI_DEV_POWER_USAGE{`+gpu0+`, `+upgraded+`} _x17 675x30
  DCGM_FI_DEV_GPU_UTIL{`+gpu0+`, `+old+`} 80x15
  DCGM_FI_DEV_GPU_UTIL{`+gpu0+`, `+upgraded+`} _x17 100x30
`)
	engine := promqltest.NewTestEngine(t, false, 5*time.Minute, promqltest.DefaultMaxSamplesPerQuery)
	at := time.Unix(0, 0).Add(10 * time.Minute) // old series last seen at 7m30s
	eval := func(expr string) float64 {
		t.Helper()
		q, err := engine.NewInstantQuery(context.Background(), storage, nil, expr, at)
		if err != nil {
			t.Fatalf("%s: %v", expr, err)
		}
		vec, err := q.Exec(context.Background()).Vector()
		if err != nil || len(vec) != 1 {
			t.Fatalf("%s: %v %v, want one value", expr, vec, err)
		}
		return vec[0].F
	}
	overview := committed(t)["gpu-cluster-overview.json"]
	for _, tc := range []struct {
		title, rule string
		scale, want float64 // panel = rule × scale = want
	}{
		{"GPUs", "cluster:gpu_total:count", 1, 1},
		{"Total power", "cluster:gpu_power_draw:sum", 1.0 / 1000, 0.675},
		{"Average GPU utilisation", "cluster:gpu_utilization:avg", 1, 100},
	} {
		_, expr := panelByTitle(t, overview, tc.title)
		panel, rule := eval(fillVars(expr, map[string]string{"cluster": "gpu-cluster-prod-01"})), eval(recordingRule(t, tc.rule))
		if math.Abs(panel-tc.want) > 1e-9 || math.Abs(rule*tc.scale-tc.want) > 1e-9 {
			t.Errorf("panel %q = %v and %s = %v (x %v), want %v: one GPU (the higher of its two names' readings), not two", tc.title, panel, tc.rule, rule, tc.scale, tc.want)
		}
	}
}
