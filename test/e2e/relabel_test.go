package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"math"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/common/promslog"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/gpustore/gpustore/bench/gpusim"
	rulepack "github.com/gpustore/gpustore/deploy/rules"
	"github.com/gpustore/gpustore/pkg/app"
)

// queryTenant evaluates expr at ts for a tenant (query-time dedup off).
func queryTenant(t *testing.T, base, tenant, expr string, ts time.Time) model.Vector {
	t.Helper()
	q := url.Values{"dedup": {"false"}, "query": {expr}, "time": {fmt.Sprintf("%.3f", float64(ts.UnixMilli())/1000)}}
	req, _ := http.NewRequest(http.MethodGet, base+"/api/v1/query?"+q.Encode(), nil)
	req.Header.Set("X-Scope-OrgID", tenant)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result model.Vector `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatal(err)
	}
	if r.Status != "success" {
		t.Fatalf("%s: query %s: %s", tenant, expr, r.Error)
	}
	return r.Data.Result
}

func scalarOf(t *testing.T, v model.Vector, what string) float64 {
	t.Helper()
	if len(v) != 1 {
		t.Fatalf("%s: %d results, want 1: %v", what, len(v), v)
	}
	return float64(v[0].Value)
}

// The dcgm preset end to end: a simulated cluster (2 nodes, 16 GPUs) whose
// dcgm-exporter is upgraded (Hostname → hostname) and then its driver
// (DCGM_FI_DRIVER_VERSION changes) is written to two tenants of one
// gpustore, "preset" (ingest_preset: dcgm) and "plain" (no rules). With the
// preset every GPU stays one series across both upgrades: count() stays at
// the number of GPUs, rate()/increase() over the upgrade is the simulator's
// true increase, and the driver version is one info series per GPU. Without
// it the series double after each upgrade (old and new identities both
// inside the lookback window) and a per-GPU increase over the upgrade sees
// only part of it. The rule pack's recording rules give every GPU in both
// tenants.
func TestDCGMPresetAcrossUpgrades(t *testing.T) {
	const (
		gpus     = 16
		interval = 15 * time.Second
	)
	start := time.Now().Add(-50 * time.Minute).Truncate(time.Minute)
	exporterUp, driverUp, end := start.Add(15*time.Minute), start.Add(30*time.Minute), start.Add(45*time.Minute)
	var faults []gpusim.Fault
	for _, n := range []string{"0", "1"} {
		faults = append(faults,
			gpusim.Fault{Kind: gpusim.FaultExporterUpgrade, At: exporterUp.Sub(start), Node: n, GPU: -1},
			gpusim.Fault{Kind: gpusim.FaultDriverUpgrade, At: driverUp.Sub(start), Node: n, GPU: -1})
	}
	// The simulator's jobs follow its epoch: anchored to the wall clock, a
	// job ending inside the window would give 8 GPUs a new pod label (a new
	// identity the preset rightly keeps) and the counts below would depend
	// on the hour the test runs. With the epoch 2 h before the start, seed
	// 7 runs the same jobs from 5 min before the start to the end.
	sim, err := gpusim.New(gpusim.Config{Name: "gpu-a", Nodes: 2, Seed: 7, TargetLabels: true, Faults: faults, FaultOrigin: start, Epoch: start.Add(-2 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	identities := map[string]bool{}
	for ts := start.Add(-5 * time.Minute); !ts.After(end); ts = ts.Add(interval) {
		for _, s := range sim.AppendSamples(nil, ts, gpusim.Replica{Name: "p0"}) {
			if s.Name() == "DCGM_FI_DEV_GPU_TEMP" {
				identities[s.Get("UUID")+"/"+s.Get("pod")] = true
			}
		}
	}
	if len(identities) != gpus {
		t.Fatalf("test setup: the simulator's jobs change pods within the window (%d GPU/pod pairs, want %d): pick another epoch", len(identities), gpus)
	}
	overrides := filepath.Join(t.TempDir(), "overrides.yaml")
	if err := os.WriteFile(overrides, []byte("overrides:\n  preset:\n    ingest_preset: dcgm\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, base := startGpustore(t, func(c *app.Config) {
		c.Limits.OverridesFile = overrides
		c.Rules.GPUPack = false // the pack's expressions are evaluated below, at the simulated times
	})

	ext := []gpusim.Label{{Name: "cluster", Value: "gpu-a"}, {Name: "__replica__", Value: "p0"}}
	var buf []gpusim.Series
	for _, tenant := range []string{"preset", "plain"} {
		snd, err := gpusim.NewSender(gpusim.SenderConfig{URL: base + "/api/v1/write", Protocol: gpusim.ProtocolV2, Tenant: tenant, ExternalLabels: ext, MaxRetries: 3})
		if err != nil {
			t.Fatal(err)
		}
		for ts := start; !ts.After(end); ts = ts.Add(interval) {
			buf = sim.AppendSamples(buf[:0], ts, gpusim.Replica{Name: "p0"})
			if err := snd.Send(context.Background(), buf); err != nil {
				t.Fatal(err)
			}
		}
		if st := snd.Stats(); st.DroppedSamples > 0 || st.MissingWritten > 0 {
			t.Fatalf("%s: the sender dropped samples: %+v", tenant, st)
		}
	}

	count := func(tenant, expr string, at time.Time) float64 {
		t.Helper()
		v := queryTenant(t, base, tenant, "count("+expr+")", at)
		if len(v) == 0 {
			return 0
		}
		return scalarOf(t, v, expr)
	}
	for _, c := range []struct {
		name          string
		at            time.Time
		preset, plain float64
	}{
		{"before the upgrades", exporterUp.Add(-time.Minute), gpus, gpus},
		{"2 min after the exporter upgrade", exporterUp.Add(2 * time.Minute), gpus, 2 * gpus},
		{"2 min after the driver upgrade", driverUp.Add(2 * time.Minute), gpus, 2 * gpus},
		{"at the end", end, gpus, gpus},
	} {
		if got := count("preset", "DCGM_FI_DEV_GPU_TEMP", c.at); got != c.preset {
			t.Errorf("%s: with the preset count(DCGM_FI_DEV_GPU_TEMP) = %v, want %v", c.name, got, c.preset)
		}
		if got := count("plain", "DCGM_FI_DEV_GPU_TEMP", c.at); got != c.plain {
			t.Errorf("%s: without the preset count(DCGM_FI_DEV_GPU_TEMP) = %v, want %v", c.name, got, c.plain)
		}
	}

	// rate()/increase() over a window that holds the upgrade.
	energyAt := func(at time.Time) map[string]float64 {
		out := map[string]float64{}
		for _, s := range sim.AppendSamples(nil, at, gpusim.Replica{Name: "p0"}) {
			if s.Name() == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" {
				out[s.Get("UUID")] = s.V
			}
		}
		return out
	}
	for _, up := range []struct {
		name string
		at   time.Time
	}{{"exporter upgrade", exporterUp}, {"driver upgrade", driverUp}} {
		from, to := up.at.Add(-5*time.Minute), up.at.Add(5*time.Minute)
		e0, e1 := energyAt(from), energyAt(to)
		if len(e0) != gpus || len(e1) != gpus {
			t.Fatalf("simulator energy counters: %d, %d GPUs", len(e0), len(e1))
		}
		truth := 0.0
		for uuid := range e1 {
			truth += e1[uuid] - e0[uuid]
		}
		if n := count("preset", "rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[10m])", to); n != gpus {
			t.Errorf("%s: with the preset rate() over it gives %v series, want %d", up.name, n, gpus)
		}
		if n := count("plain", "rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[10m])", to); n != 2*gpus {
			t.Errorf("%s: without the preset rate() over it gives %v series, want %d", up.name, n, 2*gpus)
		}
		perGPU := `sum(max by (UUID) (increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[10m])))`
		withPreset := scalarOf(t, queryTenant(t, base, "preset", perGPU, to), perGPU)
		without := scalarOf(t, queryTenant(t, base, "plain", perGPU, to), perGPU)
		// Each GPU's samples cover the 10 m window but for one scrape at
		// its start; increase() extrapolates that much at most.
		if rel := math.Abs(withPreset-truth) / truth; rel > 0.03 {
			t.Errorf("%s: with the preset the per-GPU increase over it is %.4g, the simulator's %.4g (%.1f%% off)", up.name, withPreset, truth, 100*rel)
		}
		if without > 0.7*truth {
			t.Errorf("%s: without the preset the per-GPU increase over it is %.4g, the simulator's %.4g: want it cut by the series change", up.name, without, truth)
		}
	}

	// The driver version: one info series per GPU with the preset, a label
	// of every metric without.
	for _, c := range []struct {
		at     time.Time
		driver string
	}{{driverUp.Add(-time.Minute), "570.133.20"}, {end, gpusim.UpgradedDriverVersion}} {
		if n := count("preset", `dcgm_gpu_driver_info{driver_version="`+c.driver+`", Hostname!="", UUID!=""}`, c.at); n != gpus {
			t.Errorf("at %s: %v dcgm_gpu_driver_info series for driver %s, want %d", c.at.Sub(start), n, c.driver, gpus)
		}
		if n := count("preset", `dcgm_gpu_driver_info`, c.at); n != gpus {
			t.Errorf("at %s: %v dcgm_gpu_driver_info series, want one per GPU", c.at.Sub(start), n)
		}
		if n := count("preset", `{DCGM_FI_DRIVER_VERSION!=""}`, c.at); n != 0 {
			t.Errorf("with the preset %v series still carry DCGM_FI_DRIVER_VERSION", n)
		}
	}
	if n := count("plain", `{__name__=~"DCGM_.+", DCGM_FI_DRIVER_VERSION="`+gpusim.UpgradedDriverVersion+`"}`, end); n == 0 {
		t.Error("without the preset the driver version label is gone")
	}
	if n := count("plain", "dcgm_gpu_driver_info", end); n != 0 {
		t.Errorf("without the preset %v driver info series", n)
	}
	// The preset keeps the rule pack's and dashboards' host label.
	if n := count("preset", `DCGM_FI_DEV_GPU_TEMP{Hostname=~"gpu-node-.+"}`, end); n != gpus {
		t.Errorf("with the preset %v GPU_TEMP series have Hostname after the exporter upgrade, want %d", n, gpus)
	}

	// The rule pack works with and without the preset, before and after
	// the exporter upgrade: every recording rule over DCGM metrics gives
	// both nodes, from Hostname or hostname alike.
	recorded := 0
	err = fs.WalkDir(rulepack.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yml") {
			return err
		}
		b, err := fs.ReadFile(rulepack.FS, path)
		if err != nil {
			return err
		}
		groups, errs := rulefmt.Parse(b, false, model.UTF8Validation, parser.NewParser(parser.Options{}), promslog.NewNopLogger())
		if len(errs) > 0 {
			return nil // not a rule file (the Xid catalogue)
		}
		for _, g := range groups.Groups {
			for _, r := range g.Rules {
				if r.Record == "" || !strings.HasPrefix(r.Record, "node:gpu") {
					continue
				}
				recorded++
				for _, tenant := range []string{"preset", "plain"} {
					for _, at := range []time.Time{exporterUp.Add(-time.Minute), end} {
						nodes := map[string]bool{}
						for _, s := range queryTenant(t, base, tenant, r.Expr, at) {
							nodes[string(s.Metric["node"])] = true
						}
						if len(nodes) != 2 || nodes[""] {
							t.Errorf("%s: rule %s at %s gives nodes %v, want gpu-node-000 and gpu-node-001", tenant, r.Record, at.Sub(start), nodes)
						}
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if recorded == 0 {
		t.Fatal("no node:gpu recording rule in the rule pack")
	}
}
