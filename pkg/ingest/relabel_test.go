package ingest

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/grafana/dskit/services"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	promrelabel "github.com/prometheus/prometheus/model/relabel"
	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"

	"github.com/gpustore/gpustore/pkg/relabel"
)

func withRules(t testing.TB, preset, yaml string) func(*testSetup) {
	t.Helper()
	var cfgs []*promrelabel.Config
	if yaml != "" {
		var err error
		if cfgs, err = relabel.ParseConfigs(yaml); err != nil {
			t.Fatal(err)
		}
	}
	return func(s *testSetup) {
		s.limits.Defaults.MetricRelabelConfigs = cfgs
		s.limits.Defaults.IngestPreset = preset
	}
}

func relabelDropped(ti *testIngester, tenant string) float64 {
	return testutil.ToFloat64(ti.metrics.relabel.WithLabelValues(tenant))
}

// postSeries writes series (alternating label names and values, one sample
// each at ts) with remote write 1.0 or 2.0 and returns the answer.
func (ti *testIngester) postSeries(t testing.TB, v2 bool, ts int64, series [][]string, headers ...string) response {
	t.Helper()
	if !v2 {
		req := &prompb.WriteRequest{}
		for _, kv := range series {
			req.Timeseries = append(req.Timeseries, v1Series([]prompb.Sample{{Timestamp: ts, Value: 1}}, kv...))
		}
		return ti.post(t, ctV1, encodeV1(t, req), headers...)
	}
	b := newV2Builder()
	for _, kv := range series {
		b.add(writev2.TimeSeries{Samples: []writev2.Sample{{Value: 1, Timestamp: ts}}}, kv...)
	}
	return ti.post(t, ctV2, encodeV2(t, b.build()), headers...)
}

func storedNames(m map[string][]float64) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Each relabel action on both protocol versions: what is stored, what is
// counted as dropped, and the answer (2xx; a 2.0 answer counts dropped
// samples as written, as they are acknowledged).
func TestRelabelActions(t *testing.T) {
	in := [][]string{
		{"__name__", "DCGM_FI_DEV_GPU_TEMP", "Hostname", "n1", "gpu", "0", "pci_bus_id", "00:18", "exported_pod", "p-0"},
		{"__name__", "DCGM_FI_DEV_GPU_UTIL", "Hostname", "n1", "gpu", "0", "pci_bus_id", "00:18"},
		{"__name__", "go_goroutines", "job", "dcgm"},
	}
	for _, c := range []struct {
		name, rules string
		want        []string
		dropped     int
	}{
		{"keep", "- action: keep\n  source_labels: [__name__]\n  regex: DCGM_.+\n",
			[]string{`{Hostname="n1", __name__="DCGM_FI_DEV_GPU_TEMP", exported_pod="p-0", gpu="0", pci_bus_id="00:18"}`, `{Hostname="n1", __name__="DCGM_FI_DEV_GPU_UTIL", gpu="0", pci_bus_id="00:18"}`}, 1},
		{"drop", "- action: drop\n  source_labels: [__name__, gpu]\n  regex: 'DCGM_FI_DEV_GPU_UTIL;0'\n",
			[]string{`{Hostname="n1", __name__="DCGM_FI_DEV_GPU_TEMP", exported_pod="p-0", gpu="0", pci_bus_id="00:18"}`, `{__name__="go_goroutines", job="dcgm"}`}, 1},
		{"replace", "- action: replace\n  source_labels: [Hostname, gpu]\n  regex: '(.+);(.+)'\n  target_label: gpu_id\n  replacement: '$1/$2'\n",
			[]string{`{Hostname="n1", __name__="DCGM_FI_DEV_GPU_TEMP", exported_pod="p-0", gpu="0", gpu_id="n1/0", pci_bus_id="00:18"}`, `{Hostname="n1", __name__="DCGM_FI_DEV_GPU_UTIL", gpu="0", gpu_id="n1/0", pci_bus_id="00:18"}`, `{__name__="go_goroutines", job="dcgm"}`}, 0},
		{"labelmap", "- action: labelmap\n  regex: 'exported_(.+)'\n  replacement: '$1'\n",
			[]string{`{Hostname="n1", __name__="DCGM_FI_DEV_GPU_TEMP", exported_pod="p-0", gpu="0", pci_bus_id="00:18", pod="p-0"}`, `{Hostname="n1", __name__="DCGM_FI_DEV_GPU_UTIL", gpu="0", pci_bus_id="00:18"}`, `{__name__="go_goroutines", job="dcgm"}`}, 0},
		{"labeldrop", "- action: labeldrop\n  regex: 'pci_bus_id|exported_.+'\n",
			[]string{`{Hostname="n1", __name__="DCGM_FI_DEV_GPU_TEMP", gpu="0"}`, `{Hostname="n1", __name__="DCGM_FI_DEV_GPU_UTIL", gpu="0"}`, `{__name__="go_goroutines", job="dcgm"}`}, 0},
	} {
		for _, v2 := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/v2=%v", c.name, v2), func(t *testing.T) {
				ti := newTestIngester(t, withRules(t, "", c.rules))
				now := nowMs()
				// Twice: the second request's series are all cache hits.
				for i := int64(0); i < 2; i++ {
					resp := ti.postSeries(t, v2, now+i*1000, in)
					if resp.code != http.StatusNoContent {
						t.Fatalf("status %d: %s", resp.code, resp.body)
					}
					if v2 && resp.header.Get(headerSamplesWritten) != fmt.Sprint(len(in)) {
						t.Fatalf("samples written %q, want %d (dropped ones are acknowledged)", resp.header.Get(headerSamplesWritten), len(in))
					}
				}
				got := ti.stored(t, "default")
				if names := storedNames(got); !slices.Equal(names, c.want) {
					t.Fatalf("stored\n  %s\nwant\n  %s", strings.Join(names, "\n  "), strings.Join(c.want, "\n  "))
				}
				for k, v := range got {
					if len(v) != 2 {
						t.Errorf("%s has %d samples, want 2", k, len(v))
					}
				}
				if d := relabelDropped(ti, "default"); d != float64(2*c.dropped) {
					t.Errorf("gpustore_ingest_relabel_dropped_samples_total = %v, want %d", d, 2*c.dropped)
				}
			})
		}
	}
}

// Relabeling runs before the label limits: a rule can make a series fit.
func TestRelabelBeforeLabelLimits(t *testing.T) {
	series := [][]string{{"__name__", "DCGM_FI_DEV_GPU_TEMP", "Hostname", "n1", "gpu", "0", "pci_bus_id", "00:18", "modelName", "H100"}}
	small := func(s *testSetup) { s.limits.Defaults.MaxLabelNamesPerSeries = 3 }
	ti := newTestIngester(t, small)
	if resp := ti.postSeries(t, false, nowMs(), series); resp.code != http.StatusBadRequest || !strings.Contains(resp.body, "too_many_labels") {
		t.Fatalf("without rules: %d %s", resp.code, resp.body)
	}
	ti = newTestIngester(t, small, withRules(t, "", "- action: labeldrop\n  regex: pci_bus_id|modelName\n"))
	if resp := ti.postSeries(t, false, nowMs(), series); resp.code != http.StatusNoContent {
		t.Fatalf("with a labeldrop rule: %d %s", resp.code, resp.body)
	}
	// A rule that makes a series invalid is the series' rejection, with the
	// relabeled labels in the message.
	ti = newTestIngester(t, withRules(t, "", "- action: labeldrop\n  regex: __name__\n"))
	if resp := ti.postSeries(t, true, nowMs(), series); resp.code != http.StatusBadRequest || !strings.Contains(resp.body, "no metric name") || !strings.Contains(resp.body, "after relabeling") {
		t.Fatalf("rule removing the name: %d %s", resp.code, resp.body)
	}
}

// Property: whatever the rules and labels, the ingester stores exactly the
// series Prometheus' own relabeling (relabel.ProcessBuilder, what
// relabel.Process was) makes of them, and drops exactly
// the ones it drops (both protocol versions, cache misses and hits).
func TestRelabelMatchesPrometheusProcess(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	names := []string{"__name__", "a", "b", "c", "exported_pod", "pod"}
	values := []string{"", "x", "y", "xy", "DCGM_A", "DCGM_B", "1"}
	pick := func(s []string) string { return s[rng.IntN(len(s))] }
	regexes := []string{".*", "x", "x.*", "(.+)", "DCGM_.+", "(.*);(.*)", "a|b", "exported_(.+)", "[a-c]", "y|1"}
	actions := []promrelabel.Action{promrelabel.Replace, promrelabel.Keep, promrelabel.Drop, promrelabel.LabelMap, promrelabel.LabelDrop, promrelabel.LabelKeep, promrelabel.HashMod, promrelabel.Lowercase, promrelabel.KeepEqual, promrelabel.DropEqual}
	randomRule := func() *promrelabel.Config {
		for {
			c := promrelabel.DefaultRelabelConfig
			c.Action = actions[rng.IntN(len(actions))]
			re := pick(regexes)
			switch c.Action {
			case promrelabel.LabelDrop, promrelabel.LabelKeep:
				if c.Action == promrelabel.LabelKeep {
					re = "__name__|" + re
				}
			case promrelabel.LabelMap:
				c.Replacement = pick([]string{"$1", "mapped_$1", "pod"})
			case promrelabel.KeepEqual, promrelabel.DropEqual:
				c.SourceLabels = model.LabelNames{model.LabelName(pick(names[1:]))}
				c.TargetLabel = pick(names[1:])
				re = ""
			default:
				for n := 1 + rng.IntN(2); n > 0; n-- {
					c.SourceLabels = append(c.SourceLabels, model.LabelName(pick(names)))
				}
				c.TargetLabel = pick(names[1:])
				c.Replacement = pick([]string{"$1", "${2}z", "", "v"})
				c.Modulus = 3
			}
			if re != "" {
				c.Regex = promrelabel.MustNewRegexp(re)
			}
			if relabel.Validate(&c) == nil {
				return &c
			}
		}
	}
	for iter := 0; iter < 40; iter++ {
		var cfgs []*promrelabel.Config
		for n := 1 + rng.IntN(4); n > 0; n-- {
			cfgs = append(cfgs, randomRule())
		}
		var series [][]string
		want := map[string]bool{}
		dropped := 0
		for n := 0; n < 20; n++ {
			kv := []string{"__name__", pick([]string{"DCGM_A", "DCGM_B", "up"})}
			seen := map[string]bool{"__name__": true}
			for m := rng.IntN(4); m > 0; m-- {
				name := pick(names[1:])
				if !seen[name] {
					seen[name] = true
					kv = append(kv, name, pick(values))
				}
			}
			if slices.ContainsFunc(series, func(s []string) bool { return slices.Equal(s, kv) }) {
				continue
			}
			series = append(series, kv)
			lb := labels.NewBuilder(labels.FromStrings(kv...))
			keep := promrelabel.ProcessBuilder(lb, cfgs...)
			out := lb.Labels()
			switch {
			case !keep:
				dropped++
			case out.Get("__name__") != "":
				want[out.String()] = true
			}
		}
		for _, v2 := range []bool{false, true} {
			ti := newTestIngester(t, func(s *testSetup) { s.limits.Defaults.MetricRelabelConfigs = cfgs })
			now := nowMs()
			for i := int64(0); i < 2; i++ {
				resp := ti.postSeries(t, v2, now+i, series)
				if resp.code != http.StatusNoContent && resp.code != http.StatusBadRequest {
					t.Fatalf("rules %v: status %d %s", cfgs, resp.code, resp.body)
				}
			}
			got := storedNames(ti.stored(t, "default"))
			wantNames := storedNames(func() map[string][]float64 {
				m := map[string][]float64{}
				for k := range want {
					m[k] = nil
				}
				return m
			}())
			if !slices.Equal(got, wantNames) {
				t.Fatalf("rules %s, v2 %v:\nstored %v\nwant   %v (relabel.ProcessBuilder)", yamlOf(cfgs), v2, got, wantNames)
			}
			if d := relabelDropped(ti, "default"); d != float64(2*dropped) {
				t.Fatalf("rules %s: %v samples counted as dropped, want %d", yamlOf(cfgs), d, 2*dropped)
			}
		}
	}
}

func yamlOf(cfgs []*promrelabel.Config) string {
	var b strings.Builder
	for _, c := range cfgs {
		fmt.Fprintf(&b, "[%s %v %q→%s %q] ", c.Action, c.SourceLabels, c.Regex.String(), c.TargetLabel, c.Replacement)
	}
	return b.String()
}

// Relabel rules do not see the HA replica label: it is removed before the
// rules run, as before storage, so both replicas' copies of a series
// relabel to one series and the dedup (which keys on the series without
// the replica label) stays right whatever the rules. The cluster label is an
// ordinary stored label: rules see it.
func TestRelabelRulesDoNotSeeTheReplicaLabel(t *testing.T) {
	clock := &testClock{}
	start := time.Now().Add(-time.Hour).UnixMilli()
	clock.set(start)
	ti := newTestIngester(t, haSetup(clock), withRules(t, "", `
- source_labels: [__replica__]
  regex: '(.+)'
  target_label: seen_replica
- source_labels: [__replica__]
  regex: 'p1'
  action: drop
- source_labels: [cluster]
  target_label: seen_cluster
`))
	post := func(replica string, ms int64) {
		t.Helper()
		if resp := ti.post(t, ctV1, encodeV1(t, replicaRequest(replica, ms))); resp.code != http.StatusNoContent {
			t.Fatalf("%s: %d %s", replica, resp.code, resp.body)
		}
	}
	post("p0", start)
	post("p1", start+300) // not elected: deduplicated, not relabeled
	// p0 goes silent past the failover timeout (30 s): p1 takes over.
	clock.set(start + 45000)
	post("p1", start+45000)
	got := ti.stored(t, "default")
	const key = `{Hostname="node-1", __name__="DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", cluster="gpu-a", gpu="0", seen_cluster="gpu-a"}`
	if v := got[key]; len(v) != 2 || v[0] != energy(start) || v[1] != energy(start+45000) {
		t.Fatalf("stored %v; want %s with p0's and p1's samples", storedNames(got), key)
	}
	if d := relabelDropped(ti, "default"); d != 0 {
		t.Fatalf("%v samples dropped by a rule on the replica label", d)
	}
}

// The series cache keeps what the rules made of a series; a reload that
// changes the rules relabels known series again, one that breaks the file
// keeps the previous rules, one that removes them stores the labels as sent.
func TestRelabelRulesReload(t *testing.T) {
	file := filepath.Join(t.TempDir(), "overrides.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(file+".tmp", []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(file+".tmp", file); err != nil {
			t.Fatal(err)
		}
	}
	write("overrides:\n  default:\n    metric_relabel_configs:\n      - action: drop\n        source_labels: [gpu]\n        regex: '1'\n")
	ti := newTestIngester(t, func(s *testSetup) {
		s.limits.OverridesFile = file
		s.limits.ReloadPeriod = model.Duration(20 * time.Millisecond)
	})
	if err := services.StartAndAwaitRunning(t.Context(), ti.limits); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = services.StopAndAwaitTerminated(t.Context(), ti.limits) })
	series := [][]string{{"__name__", "m", "gpu", "0"}, {"__name__", "m", "gpu", "1"}}
	ts := nowMs() - 60_000
	post := func() {
		t.Helper()
		ts += 1000
		if resp := ti.postSeries(t, false, ts, series); resp.code != http.StatusNoContent {
			t.Fatalf("status %d %s", resp.code, resp.body)
		}
	}
	count := func(name string) int { return len(ti.stored(t, "default")[name]) }
	post()
	post()
	if count(`{__name__="m", gpu="0"}`) != 2 || count(`{__name__="m", gpu="1"}`) != 0 || relabelDropped(ti, "default") != 2 {
		t.Fatalf("first rules: stored %v, dropped %v", storedNames(ti.stored(t, "default")), relabelDropped(ti, "default"))
	}

	write("overrides:\n  default:\n    metric_relabel_configs:\n      - action: replace\n        source_labels: [gpu]\n        target_label: g\n")
	waitUntil(t, func() bool {
		return len(ti.limits.For("default").Relabel().Configs()) == 1 && ti.limits.For("default").Relabel().Configs()[0].Action == promrelabel.Replace
	})
	ti.ApplyLimits()
	post()
	if count(`{__name__="m", g="0", gpu="0"}`) != 1 || count(`{__name__="m", g="1", gpu="1"}`) != 1 {
		t.Fatalf("new rules not applied to known series: %v", storedNames(ti.stored(t, "default")))
	}

	before := ti.limits.For("default").Relabel()
	write("overrides:\n  default:\n    metric_relabel_configs:\n      - action: replace\n        source_labels: [gpu]\n")
	waitUntil(t, func() bool { return overridesReloadGauge(t, ti.reg) == 0 })
	ti.ApplyLimits()
	if ti.limits.For("default").Relabel() != before {
		t.Fatal("a broken file replaced the rules")
	}
	post()
	if count(`{__name__="m", g="0", gpu="0"}`) != 2 {
		t.Fatalf("after a broken file: %v", storedNames(ti.stored(t, "default")))
	}

	write("overrides:\n  default:\n    max_active_series: 0\n")
	waitUntil(t, func() bool { return ti.limits.For("default").Relabel().Empty() })
	ti.ApplyLimits()
	post()
	if count(`{__name__="m", gpu="0"}`) != 3 || count(`{__name__="m", gpu="1"}`) != 1 {
		t.Fatalf("rules removed, labels not stored as sent: %v", storedNames(ti.stored(t, "default")))
	}
}

// The dcgm preset end to end through the write path: the driver version
// leaves every metric and is kept once per GPU and scrape as
// dcgm_gpu_driver_info; a driver upgrade changes that one series per GPU;
// only the elected replica writes it, without its replica label; the
// sender's 2.0 answer counts only what it sent.
func TestDCGMPresetDriverInfo(t *testing.T) {
	clock := &testClock{}
	start := time.Now().Add(-time.Hour).UnixMilli()
	clock.set(start)
	ti := newTestIngester(t, haSetup(clock), withRules(t, relabel.PresetDCGM, ""))
	scrape := func(replica, driver string, ms int64, v2 bool) response {
		t.Helper()
		var series [][]string
		for gpu := 0; gpu < 2; gpu++ {
			for _, m := range []string{"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_UTIL"} {
				kv := dcgmLabels(m, 1, gpu) // cluster gpu-cluster-prod-01, Hostname, driver 550.54.15
				kv[3] = driver
				series = append(series, append(kv, "__replica__", replica))
			}
		}
		resp := ti.postSeries(t, v2, ms, series)
		if resp.code != http.StatusNoContent {
			t.Fatalf("status %d %s", resp.code, resp.body)
		}
		if v2 && resp.header.Get(headerSamplesWritten) != fmt.Sprint(len(series)) {
			t.Fatalf("2.0 answer: %s samples written, sent %d", resp.header.Get(headerSamplesWritten), len(series))
		}
		return resp
	}
	scrape("p0", "550.54.15", start, false)
	scrape("p1", "550.54.15", start+300, true) // not elected
	scrape("p0", "550.54.15", start+15000, true)
	scrape("p0", "570.133.20", start+30000, false) // driver upgrade
	got := ti.stored(t, "default")
	for k := range got {
		if strings.Contains(k, "DCGM_FI_DRIVER_VERSION") || strings.Contains(k, "__replica__") {
			t.Errorf("stored %s", k)
		}
	}
	if n := len(got); n != 6+4 {
		t.Errorf("%d series stored, want 6 metrics + 2 GPUs × 2 drivers info series:\n%s", n, strings.Join(storedNames(got), "\n"))
	}
	info := func(gpu int, driver string) []float64 {
		return got[fmt.Sprintf(`{Hostname="gpu-node-001", UUID="GPU-00000001-1b2c-4d5e-8f90-%012x", __name__="dcgm_gpu_driver_info", cluster="gpu-cluster-prod-01", driver_version="%s"}`, gpu, driver)]
	}
	for gpu := 0; gpu < 2; gpu++ {
		if v := info(gpu, "550.54.15"); len(v) != 2 || v[0] != 1 || v[1] != 1 {
			t.Errorf("GPU %d, old driver: info samples %v, want one per elected scrape (2)", gpu, v)
		}
		if v := info(gpu, "570.133.20"); len(v) != 1 {
			t.Errorf("GPU %d, new driver: info samples %v, want 1", gpu, v)
		}
	}
	temp := got[`{Hostname="gpu-node-001", UUID="GPU-00000001-1b2c-4d5e-8f90-000000000000", __name__="DCGM_FI_DEV_GPU_TEMP", cluster="gpu-cluster-prod-01", container="trainer", device="nvidia0", gpu="0", instance="10.0.0.1:9400", job="dcgm-exporter", modelName="NVIDIA H100 80GB HBM3", namespace="training", pci_bus_id="00000000:18:00.0", pod="llama-70b-worker-1", region="us-east-1"}`]
	if len(temp) != 3 {
		t.Errorf("GPU_TEMP across the driver upgrade: %d samples in one series, want 3\n%s", len(temp), strings.Join(storedNames(got), "\n"))
	}
	if w := testutil.ToFloat64(ti.metrics.samples.WithLabelValues("default", "sample")); w != 3*6+6 {
		t.Errorf("gpustore_ingest_written_total = %v, want %d (the info samples are written too)", w, 3*6+6)
	}
}

// Concurrent requests of a tenant with the preset (Prometheus' shards: each
// request a part of a scrape's series) write one driver info sample per GPU
// and timestamp, whichever request carries the GPU's first series.
func TestDCGMPresetDriverInfoConcurrentShards(t *testing.T) {
	ti := newTestIngester(t, withRules(t, relabel.PresetDCGM, ""))
	start := time.Now().Add(-time.Hour).UnixMilli()
	const scrapes, shards = 20, 4
	for s := int64(0); s < scrapes; s++ {
		ts := start + s*15000
		var wg sync.WaitGroup
		for sh := 0; sh < shards; sh++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var series [][]string
				for i, m := range benchMetrics {
					if i%shards == sh {
						for gpu := 0; gpu < 4; gpu++ {
							series = append(series, dcgmLabels(m, 2, gpu))
						}
					}
				}
				if resp := ti.postSeries(t, sh%2 == 0, ts, series); resp.code != http.StatusNoContent {
					t.Errorf("shard %d: %d %s", sh, resp.code, resp.body)
				}
			}()
		}
		wg.Wait()
	}
	n := 0
	for k, v := range ti.stored(t, "default") {
		if strings.Contains(k, relabel.DriverInfoMetric) {
			n++
			if len(v) != scrapes {
				t.Errorf("%s: %d samples, want one per scrape (%d)", k, len(v), scrapes)
			}
		}
	}
	if n != 4 {
		t.Errorf("%d driver info series, want one per GPU (4)", n)
	}
}

// A series of the dcgm preset whose cached reference the head no longer
// knows (garbage collected while idle) is resolved again from its labels,
// and its sample is stored in the preset's unit as every other: dcgm-exporter
// 4.9's SM clock in Hz is stored as DCGM_FI_DEV_SM_CLOCK in MHz.
func TestStaleCachedReferenceKeepsUnitScale(t *testing.T) {
	ti := newTestIngester(t, withRules(t, relabel.PresetDCGM, ""))
	now := nowMs()
	s := v1Series([]prompb.Sample{{Timestamp: now, Value: 1.98e9}}, dcgmLabels("DCGM_FI_DEV_SM_CLOCK_HERTZ", 1, 0)...)
	if resp := ti.post(t, ctV1, encodeV1(t, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{s}})); resp.code != http.StatusNoContent {
		t.Fatalf("status %d %s", resp.code, resp.body)
	}
	staleCachedRefs(ti)
	s.Samples = []prompb.Sample{{Timestamp: now + 15_000, Value: 1.41e9}}
	if resp := ti.post(t, ctV1, encodeV1(t, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{s}})); resp.code != http.StatusNoContent {
		t.Fatalf("status %d %s", resp.code, resp.body)
	}
	for k, v := range ti.stored(t, "default") {
		if strings.Contains(k, `__name__="DCGM_FI_DEV_SM_CLOCK"`) {
			if !slices.Equal(v, []float64{1980, 1410}) {
				t.Errorf("%s: stored %v, want 1980 and 1410 MHz", k, v)
			}
			return
		}
	}
	t.Fatalf("no DCGM_FI_DEV_SM_CLOCK stored: %v", storedNames(ti.stored(t, "default")))
}
