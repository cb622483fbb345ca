package grafana

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/api"
	v1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/gpustore/gpustore/bench/gpusim"
	"github.com/gpustore/gpustore/internal/gpustoretest"
	"github.com/gpustore/gpustore/internal/testbin"
	"github.com/gpustore/gpustore/pkg/app"
	"github.com/gpustore/gpustore/pkg/compact"
)

const (
	simCluster = "gpu-cluster-test"
	simNodes   = 4
	simGPUs    = 8
	scrape     = 15 * time.Second
)

// notCompactedInTheTest are the metrics whose series appear with the
// compactor's first compaction of a tenant: the hour the test loads, in 20m
// blocks, holds no whole 2h range to compact (the passes, the bucket index
// and downsampling do run), so a panel reading only these may be empty here.
// TestOperationsPanelsReadRegisteredMetrics checks that gpustore registers
// them.
var notCompactedInTheTest = []string{"gpustore_compact_blocks_compacted_total"}

func startGpustore(t *testing.T, mutate ...func(*app.Config)) string {
	t.Helper()
	// The shipper reports a tenant once it has looked at it: look often, so
	// the operations dashboard's backlog panels have data within the test.
	often := func(c *app.Config) { c.Shipper.Interval = model.Duration(time.Second) }
	a := gpustoretest.Start(t, append([]func(*app.Config){often}, mutate...)...)
	return "http://" + a.Server.Addr().String()
}

// runningJobAt reports a training job that steps (tokens/s > 0) at t.
func runningJobsAt(c *gpusim.Cluster, t time.Time) map[string]bool {
	jobs := map[string]bool{}
	for _, s := range c.AppendSamples(nil, t, gpusim.Replica{Name: "p0"}) {
		if s.Name() == "training_tokens_per_second" && s.V > 0 {
			jobs[s.Get("job_name")] = true
		}
	}
	return jobs
}

// simWindow finds a simulated hour in which one training job runs from
// start to end, so that every dashboard has something to show.
func simWindow(t *testing.T, span time.Duration) time.Time {
	t.Helper()
	probe, err := gpusim.New(gpusim.Config{Name: simCluster, Nodes: simNodes, GPUsPerNode: simGPUs, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	for end := gpusim.DefaultEpoch.Add(48 * time.Hour); end.Before(gpusim.DefaultEpoch.Add(30 * 24 * time.Hour)); end = end.Add(20 * time.Minute) {
		a, b := runningJobsAt(probe, end.Add(-span)), runningJobsAt(probe, end)
		for j := range a {
			if b[j] {
				return end
			}
		}
	}
	t.Fatal("no simulated hour with a training job running throughout")
	return time.Time{}
}

// loadSimulatedCluster remote-writes the last `span` of a simulated 4-node
// cluster into gpustore as one Prometheus of an HA pair would: the
// simulator's state of a busy hour, stamped so that it ends now. Faults are
// placed relative to the start of that span.
func loadSimulatedCluster(t *testing.T, base string, now time.Time, span time.Duration, faults ...gpusim.Fault) {
	t.Helper()
	simEnd := simWindow(t, span)
	c, err := gpusim.New(gpusim.Config{Name: simCluster, Nodes: simNodes, GPUsPerNode: simGPUs, Seed: 1, TargetLabels: true, Faults: faults, FaultOrigin: simEnd.Add(-span)})
	if err != nil {
		t.Fatal(err)
	}
	snd, err := gpusim.NewSender(gpusim.SenderConfig{
		URL: base + "/api/v1/write", Protocol: gpusim.ProtocolV2, MaxSamplesPerSend: 5000, Shards: 2,
		ExternalLabels: []gpusim.Label{{Name: "cluster", Value: simCluster}, {Name: "__replica__", Value: "p0"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	r := gpusim.Replica{Name: "p0", Offset: now.Sub(simEnd)}
	var buf []gpusim.Series
	ctx := context.Background()
	for ts := simEnd.Add(-span); !ts.After(simEnd); ts = ts.Add(scrape) {
		buf = c.AppendSamples(buf[:0], ts, r)
		if err := snd.Send(ctx, buf); err != nil {
			t.Fatalf("remote write: %v", err)
		}
	}
	st := snd.Stats()
	if st.Samples == 0 || st.DroppedSamples > 0 {
		t.Fatalf("remote write: %+v", st)
	}
	t.Logf("loaded %d samples of %s (simulated %s–%s)", st.Samples, simCluster, simEnd.Add(-span).Format(time.RFC3339), simEnd.Format(time.RFC3339))
}

// scrapeGpustoreIntoItself runs the real Prometheus scraping gpustore's
// /metrics (job "gpustore", as in deploy/compose) and remote-writing them
// back, until it has enough samples for the operations dashboard's rates.
func scrapeGpustoreIntoItself(t *testing.T, base string, apiClient v1.API) {
	t.Helper()
	bin := testbin.Need(t, "prometheus")
	dir := t.TempDir()
	target := strings.TrimPrefix(base, "http://")
	cfg := fmt.Sprintf(`global: {scrape_interval: 1s, scrape_timeout: 1s}
scrape_configs:
  - job_name: gpustore
    static_configs: [{targets: [%q]}]
remote_write:
  - url: %s/api/v1/write
    queue_config: {batch_send_deadline: 1s}
`, target, base)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	gpustoretest.StartProcess(t, "prometheus", bin, dir, func(addr string) []string {
		return []string{"--config.file=" + filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path=" + filepath.Join(dir, "data"),
			"--web.listen-address=" + addr, "--log.level=warn"}
	})
	deadline := time.Now().Add(90 * time.Second)
	for {
		v, _, _, err := apiClient.Query(context.Background(), `count_over_time(up{job="gpustore"}[1m])`, time.Now())
		if err == nil {
			if vec, ok := v.(model.Vector); ok && len(vec) == 1 && vec[0].Value >= 15 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("gpustore's own metrics did not arrive through Prometheus: %v %v", v, err)
		}
		time.Sleep(time.Second)
	}
}

// resolveVars fills the dashboard's query variables in order, as Grafana
// does: each one's label_values query, over the dashboard's range, with the
// variables before it substituted; the first value is taken.
func resolveVars(t *testing.T, c v1.API, d board, start, end time.Time) map[string]string {
	t.Helper()
	vals := map[string]string{}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		sel, _ := labelValuesSelector(v.Definition)
		sel = fillVars(sel, vals)
		got, _, _, err := c.LabelValues(context.Background(), labelValuesLabel(v.Definition), []string{sel}, start, end)
		if err != nil {
			t.Fatalf("%s: variable %s: %v", d.UID, v.Name, err)
		}
		if len(got) == 0 {
			t.Fatalf("%s: variable %s: label_values of %s is empty", d.UID, v.Name, sel)
		}
		s := make([]string, len(got))
		for i, x := range got {
			s[i] = string(x)
		}
		sort.Strings(s)
		vals[v.Name] = s[0]
	}
	return vals
}

// Every panel query of every dashboard, run by gpustore like Grafana runs it
// (variables resolved through the label API, range query over the default
// range at a 15s step): it parses, returns data, and every value is sane for
// the panel's unit and within the panel's own min/max; no NaN.
func TestPanelQueriesAgainstGpustore(t *testing.T) {
	if testing.Short() {
		t.Skip("loads an hour of a simulated cluster into gpustore")
	}
	// The scale-out path in one process (distributor, receiver, querier and
	// ruler on the ring), so that every row of the operations dashboard has
	// data, with a real Alertmanager to notify; the GPU dashboards are read
	// through it too.
	// Blocks of 20 minutes, so that the 65 minutes loaded cut at least two
	// blocks (the head keeps 30), whatever the wall clock's alignment, which
	// the shipper uploads and the compactor passes over (compacting nothing:
	// no whole 2h range; downsampling the finished one) within the test. The
	// head then takes samples only 10 minutes behind its newest: an
	// out-of-order window lets the loader's two shards drift apart more. The
	// bucket store syncs every second.
	am := gpustoretest.StartAlertmanager(t)
	base := startGpustore(t, gpustoretest.Ring, func(c *app.Config) {
		c.Rules.Alertmanager.URLs = []string{am}
		c.Rules.TenantPollInterval = model.Duration(time.Second)
		c.TSDB.BlockDuration = model.Duration(20 * time.Minute)
		c.Compact.BlockRanges = compact.DurationList{model.Duration(20 * time.Minute), model.Duration(2 * time.Hour)}
		c.Limits.Defaults.OutOfOrderWindow = model.Duration(time.Hour)
		c.Compact.Interval = model.Duration(time.Second)
		c.BucketStore.SyncInterval = model.Duration(time.Second)
	})
	client, err := api.NewClient(api.Config{Address: base})
	if err != nil {
		t.Fatal(err)
	}
	c := v1.NewAPI(client)
	now := time.Now().Truncate(scrape)
	const span = time.Hour
	loadSimulatedCluster(t, base, now, span+5*time.Minute)

	boards := committed(t)
	names := make([]string, 0, len(boards))
	for n := range boards {
		names = append(names, n)
	}
	sort.Strings(names)
	// The operations dashboard last: its metrics arrive through Prometheus,
	// and its query-latency panel needs the queries run before it.
	ops := "gpustore-operations.json"
	names = append(slices.DeleteFunc(names, func(n string) bool { return n == ops }), ops)
	for _, name := range names {
		d := boards[name]
		if name == ops {
			scrapeGpustoreIntoItself(t, base, c)
		}
		t.Run(strings.TrimSuffix(name, ".json"), func(t *testing.T) {
			end := time.Now()
			rng, err := time.ParseDuration(strings.TrimPrefix(d.Time.From, "now-"))
			if err != nil || d.Time.To != "now" {
				t.Fatalf("default range %s to %s: want now-<duration> to now", d.Time.From, d.Time.To)
			}
			start := end.Add(-rng)
			vals := resolveVars(t, c, d, start, end)
			t.Logf("variables: %v", vals)
			for _, p := range d.Panels {
				for _, tg := range p.Targets {
					checkPanelQuery(t, c, p, fillVars(tg.Expr, vals), v1.Range{Start: start, End: end, Step: scrape})
				}
			}
		})
	}
}

// The GPU dashboards group by dcgm-exporter's `Hostname`; a newer exporter
// names it `hostname`. With the dcgm ingest preset (which keeps Hostname by
// default) every GPU panel still has data after the whole cluster's
// exporters were upgraded (the test above covers the old exporter without
// the preset). The operations dashboard reads no DCGM metric.
func TestGPUPanelsAfterExporterUpgradeWithDCGMPreset(t *testing.T) {
	if testing.Short() {
		t.Skip("loads an hour of a simulated cluster into gpustore")
	}
	overrides := filepath.Join(t.TempDir(), "overrides.yaml")
	if err := os.WriteFile(overrides, []byte("overrides:\n  default:\n    ingest_preset: dcgm\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	base := startGpustore(t, func(c *app.Config) { c.Limits.OverridesFile = overrides })
	client, err := api.NewClient(api.Config{Address: base})
	if err != nil {
		t.Fatal(err)
	}
	c := v1.NewAPI(client)
	now := time.Now().Truncate(scrape)
	const span = time.Hour
	var upgrades []gpusim.Fault
	for n := 0; n < simNodes; n++ {
		upgrades = append(upgrades, gpusim.Fault{Kind: gpusim.FaultExporterUpgrade, Node: fmt.Sprint(n), GPU: -1})
	}
	loadSimulatedCluster(t, base, now, span+5*time.Minute, upgrades...)
	// The data is the new exporter's: hostname on the wire, Hostname stored.
	// GPUs (a job change inside the lookback gives a GPU two series).
	for _, q := range []string{`count(count by (Hostname, gpu) (DCGM_FI_DEV_GPU_TEMP{Hostname!=""}))`, `count(DCGM_FI_DEV_GPU_TEMP{hostname!=""})`} {
		v, _, _, err := c.Query(context.Background(), q, now)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		if vec, ok := v.(model.Vector); ok && len(vec) == 1 {
			n = int(vec[0].Value)
		}
		if want := map[bool]int{true: simNodes * simGPUs, false: 0}[strings.Contains(q, "Hostname")]; n != want {
			t.Fatalf("%s = %d, want %d", q, n, want)
		}
	}
	boards := committed(t)
	checked := 0
	for name, d := range boards {
		if name == "gpustore-operations.json" {
			continue
		}
		checked++
		t.Run(strings.TrimSuffix(name, ".json"), func(t *testing.T) {
			end := time.Now()
			rng, err := time.ParseDuration(strings.TrimPrefix(d.Time.From, "now-"))
			if err != nil {
				t.Fatal(err)
			}
			start := end.Add(-min(rng, span))
			vals := resolveVars(t, c, d, start, end)
			for _, p := range d.Panels {
				for _, tg := range p.Targets {
					checkPanelQuery(t, c, p, fillVars(tg.Expr, vals), v1.Range{Start: start, End: end, Step: scrape})
				}
			}
		})
	}
	if checked == 0 {
		t.Fatal("no GPU dashboard")
	}
}

func checkPanelQuery(t *testing.T, c v1.API, p panel, expr string, r v1.Range) {
	t.Helper()
	what := fmt.Sprintf("panel %q: %s", p.Title, expr)
	if _, err := parser.NewParser(parser.Options{}).ParseExpr(expr); err != nil {
		t.Errorf("%s: %v", what, err)
		return
	}
	res, _, _, err := c.QueryRange(context.Background(), expr, r)
	if err != nil {
		t.Errorf("%s: %v", what, err)
		return
	}
	m, ok := res.(model.Matrix)
	if !ok {
		t.Errorf("%s: result %s, want a matrix", what, res.Type())
		return
	}
	points := 0
	for _, s := range m {
		points += len(s.Values)
	}
	if points == 0 {
		if readsOnly(expr, notCompactedInTheTest) {
			t.Logf("%s: no data (nothing compacted yet)", what)
			return
		}
		t.Errorf("%s: no data", what)
		return
	}
	lim, _ := unitRange(p.FieldConfig.Defaults.Unit, simNodes*simGPUs)
	if mn := p.FieldConfig.Defaults.Min; mn != nil {
		lim[0] = math.Max(lim[0], *mn)
	}
	if mx := p.FieldConfig.Defaults.Max; mx != nil {
		lim[1] = math.Min(lim[1], *mx)
	}
	bad := 0
	for _, s := range m {
		for _, v := range s.Values {
			f := float64(v.Value)
			if math.IsNaN(f) || math.IsInf(f, 0) || f < lim[0] || f > lim[1] {
				if bad < 3 {
					t.Errorf("%s: %s = %g at %s, want a number in [%g, %g] (%s)", what, s.Metric, f, v.Timestamp.Time().Format(time.TimeOnly), lim[0], lim[1], p.FieldConfig.Defaults.Unit)
				}
				bad++
			}
		}
	}
	t.Logf("%s: %d series, %d points", what, len(m), points)
}

// readsOnly reports whether every metric expr selects is in names.
func readsOnly(expr string, names []string) bool {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return false
	}
	n := 0
	for _, sel := range parser.ExtractSelectors(e) {
		for _, m := range sel {
			if m.Name == model.MetricNameLabel {
				if !slices.Contains(names, m.Value) {
					return false
				}
				n++
			}
		}
	}
	return n > 0
}

// Every metric the operations dashboard reads (panels and variables) is one
// a running gpustore with every role and the ring registers, or up (which
// the scraping Prometheus makes): a misspelt or renamed metric fails here
// even where the panel may be empty in the long test above.
func TestOperationsPanelsReadRegisteredMetrics(t *testing.T) {
	// The notifier exists with an Alertmanager to send to.
	am := gpustoretest.StartAlertmanager(t)
	a := gpustoretest.Start(t, gpustoretest.Ring, func(c *app.Config) {
		c.Rules.Alertmanager.URLs = []string{am}
		c.Rules.TenantPollInterval = model.Duration(100 * time.Millisecond)
	})
	// A tenant's TSDB, rule manager and notifier register their metrics
	// when the tenant first writes: write one scrape of one node.
	sim, err := gpusim.New(gpusim.Config{Name: simCluster, Nodes: 1, GPUsPerNode: 1, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	snd, err := gpusim.NewSender(gpusim.SenderConfig{URL: "http://" + a.Server.Addr().String() + "/api/v1/write", Protocol: gpusim.ProtocolV2, MaxSamplesPerSend: 5000, Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := snd.Send(context.Background(), sim.AppendSamples(nil, time.Now(), gpusim.Replica{Name: "p0"})); err != nil {
		t.Fatal(err)
	}
	var names map[string]bool
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if names = gpustoretest.MetricNames(a); names["prometheus_rule_evaluations_total"] && names["prometheus_notifications_sent_total"] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the tenant's rule manager did not start")
		}
	}
	names["up"] = true
	d := committed(t)["gpustore-operations.json"]
	var exprs []string
	for _, v := range d.Templating.List {
		if sel, ok := labelValuesSelector(v.Definition); ok {
			exprs = append(exprs, sel)
		}
	}
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	checked := 0
	for _, expr := range exprs {
		e, err := parser.NewParser(parser.Options{}).ParseExpr(fillVars(expr, nil))
		if err != nil {
			t.Errorf("%s: %v", expr, err)
			continue
		}
		for _, sel := range parser.ExtractSelectors(e) {
			for _, m := range sel {
				if m.Name != model.MetricNameLabel {
					continue
				}
				checked++
				if !names[m.Value] {
					t.Errorf("%s reads %s, which a running gpustore does not register", expr, m.Value)
				}
			}
		}
	}
	if checked < 50 {
		t.Fatalf("only %d metric selectors checked", checked)
	}
}
