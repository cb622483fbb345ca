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

// The overview's energy panels read the pack's chargeback records (issue
// 39): energy per namespace and job as gpu-chargeback.yml records it, each
// GPU shared among the pods that hold it. Adding up DCGM's energy counter per
// pod, as the panels did, charged a GPU time-sliced by 4 pods 4 times (2.7
// kWh where the records said 0.7), and it was cut into pieces by every
// exporter restart. Evaluated by Prometheus' own engine over an hour of
// 5-minute records: 600 W for an hour is 0.6 kWh.
func TestEnergyPanelsReadTheChargebackRecords(t *testing.T) {
	storage := promqltest.LoadedStorage(t, `
load 5m
  namespace:gpu_energy_joules:sum5m{namespace="research", cluster="gpu-cluster-prod-01"} 180000x12
  namespace:gpu_energy_joules:sum5m{namespace="inference", cluster="gpu-cluster-prod-01"} 180000x12
  namespace_job:gpu_energy_joules:sum5m{namespace="research", job_kind="PyTorchJob", job_name="llm-pretrain", cluster="gpu-cluster-prod-01"} 180000x12
  namespace_job:gpu_energy_joules:sum5m{namespace="inference", job_kind="ReplicaSet", job_name="vllm-7c9d5", cluster="gpu-cluster-prod-01"} 180000x12
  namespace:gpu_energy_joules:sum5m{namespace="research", cluster="gpu-cluster-lab"} 900000x12
`)
	engine := promqltest.NewTestEngine(t, false, 5*time.Minute, promqltest.DefaultMaxSamplesPerQuery)
	overview := committed(t)["gpu-cluster-overview.json"]
	const want = 0.6
	for _, tc := range []struct{ title, legendLabel string }{
		{"Energy by namespace", "namespace"},
		{"Energy by job", "job_name"},
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
				t.Errorf("panel %q: %s = %.4f kWh, want %.4f (the records' hour at 600 W)", tc.title, s.Metric.Get(tc.legendLabel), s.F, want)
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
