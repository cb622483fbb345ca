package grafana

import (
	"context"
	"fmt"
	"io/fs"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/api"
	v1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
	"gopkg.in/yaml.v3"

	"github.com/gpustore/gpustore/bench/gpusim"
	rulepack "github.com/gpustore/gpustore/deploy/rules"
	"github.com/gpustore/gpustore/internal/testbin"
	"github.com/gpustore/gpustore/pkg/app"
	"github.com/gpustore/gpustore/pkg/compact"
	"github.com/gpustore/gpustore/test/gpustoretest"
)

const (
	simCluster = "gpu-cluster-test"
	migCluster = "gpu-cluster-mig"
	simNodes   = 4
	simGPUs    = 8
	scrape     = 15 * time.Second
	// scrapeNodes is the cluster a real Prometheus scrapes from gpusim's
	// pages: two blocks of 8 nodes, so two nccl-tests results.
	scrapeNodes = 16
	// scrapeFor is how long it scrapes before the panels are queried.
	scrapeFor = 55 * time.Second
)

// notCompactedInTheTest are the metrics whose series appear with the
// compactor's first compaction of a tenant: the hour the test loads, in 20m
// blocks, holds no whole 2h range to compact (the passes, the bucket index
// and downsampling do run), so a panel reading only these may be empty here.
// TestOperationsPanelsReadRegisteredMetrics checks that gpustore registers
// them.
var notCompactedInTheTest = []string{"gpustore_compact_blocks_compacted_total"}

// everyFiveMinutes are the pack's chargeback records (gpu-chargeback.yml):
// their group runs every 5 minutes, which the test may not see once. A panel
// reading only these may be empty here; TestEnergyPanelsReadTheChargebackRecords
// checks the energy panels on the records.
var everyFiveMinutes = []string{"namespace:gpu_energy_joules:sum5m", "namespace_job:gpu_energy_joules:sum5m"}

func startGpustore(t *testing.T, mutate ...func(*app.Config)) string {
	t.Helper()
	// The shipper reports a tenant once it has looked at it: look often, so
	// the operations dashboard's backlog panels have data within the test.
	// The GPU pack (on by default) records what the dashboards read
	// (cluster:gpu_available:count, gpu:xid_errors:recent, ALERTS): find
	// the tenants quickly.
	often := func(c *app.Config) {
		c.Shipper.Interval = model.Duration(time.Second)
		c.Rules.TenantPollInterval = model.Duration(time.Second)
	}
	a := gpustoretest.Start(t, append([]func(*app.Config){often}, mutate...)...)
	return "http://" + a.Server.Addr().String()
}

// tenantAPI is the Prometheus API client Grafana would use, for one tenant
// ("" is the default tenant).
func tenantAPI(t *testing.T, base, tenant string) v1.API {
	t.Helper()
	rt := api.DefaultRoundTripper
	if tenant != "" {
		rt = tenantHeader{tenant: tenant, next: rt}
	}
	client, err := api.NewClient(api.Config{Address: base, RoundTripper: rt})
	if err != nil {
		t.Fatal(err)
	}
	return v1.NewAPI(client)
}

type tenantHeader struct {
	tenant string
	next   http.RoundTripper
}

func (h tenantHeader) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-Scope-OrgID", h.tenant)
	return h.next.RoundTrip(r)
}

// runningJobsAt reports the training jobs that step (tokens/s > 0) on the
// first node at t.
func runningJobsAt(c *gpusim.Cluster, t time.Time) map[string]bool {
	jobs := map[string]bool{}
	for _, s := range c.AppendSamples(nil, t, gpusim.Replica{Name: "p0"}) {
		if s.Name() == "training_tokens_per_second" && s.V > 0 && s.Get("Hostname") == c.Hostnames()[0] {
			jobs[s.Get("job_name")] = true
		}
	}
	return jobs
}

// simWindow finds a simulated span in which one training job runs from
// start to end on the first node (the node dashboards' default), so that
// every dashboard has something to show.
func simWindow(t *testing.T, nodes int, span time.Duration) time.Time {
	t.Helper()
	probe, err := gpusim.New(gpusim.Config{Name: simCluster, Nodes: nodes, GPUsPerNode: simGPUs, Seed: 1})
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
	t.Fatal("no simulated span with a training job running throughout")
	return time.Time{}
}

// gpuFaults are the faults the GPU dashboards' panels are exercised with,
// at offsets from the end of the data (end): on the first node (every
// dashboard's default), each class the panels show, late enough for the
// rule pack's 10-minute Xid window to see the Xids.
func gpuFaults(end time.Duration) []gpusim.Fault {
	at := func(before time.Duration) time.Duration { return end - before }
	return []gpusim.Fault{
		{Kind: gpusim.FaultOverheat, At: at(40 * time.Minute), Duration: 40 * time.Minute, Node: "0", GPU: 1},
		{Kind: gpusim.FaultHBMOverheat, At: at(40 * time.Minute), Duration: 40 * time.Minute, Node: "0", GPU: 2},
		{Kind: gpusim.FaultThrottle, At: at(40 * time.Minute), Duration: 40 * time.Minute, Node: "0", GPU: 3},
		{Kind: gpusim.FaultNVLinkCRCBurst, At: at(40 * time.Minute), Duration: 40 * time.Minute, Node: "0", GPU: 4},
		{Kind: gpusim.FaultNVLinkReplay, At: at(40 * time.Minute), Duration: 40 * time.Minute, Node: "0", GPU: 4},
		{Kind: gpusim.FaultXid, At: at(9 * time.Minute), Duration: 9 * time.Minute, Every: 20 * time.Second, Node: "0", GPU: 5, Code: 13},
		{Kind: gpusim.FaultRecoveryAction, At: at(9 * time.Minute), Duration: 9 * time.Minute, Node: "0", GPU: 6, Code: 1},
		{Kind: gpusim.FaultRowRemapFailure, At: at(40 * time.Minute), Duration: 40 * time.Minute, Node: "0", GPU: 7},
		// Last: it ends the node's job (its pods leave the DCGM series).
		{Kind: gpusim.FaultECCDBE, At: at(50 * time.Second), Duration: time.Minute, Node: "0", GPU: 0},
	}
}

// loadSimulatedCluster remote-writes the last `span` of a simulated
// cluster into a gpustore tenant as one Prometheus of an HA pair would: the
// simulator's state of a busy span, stamped so that it ends now. Faults are
// placed relative to the start of that span.
func loadSimulatedCluster(t *testing.T, base, tenant, cluster string, now time.Time, span time.Duration, faults ...gpusim.Fault) *gpusim.Cluster {
	t.Helper()
	simEnd := simWindow(t, simNodes, span)
	c, err := gpusim.New(gpusim.Config{Name: cluster, Nodes: simNodes, GPUsPerNode: simGPUs, Seed: 1, TargetLabels: true, Faults: faults, FaultOrigin: simEnd.Add(-span)})
	if err != nil {
		t.Fatal(err)
	}
	snd, err := gpusim.NewSender(gpusim.SenderConfig{
		URL: base + "/api/v1/write", Protocol: gpusim.ProtocolV2, MaxSamplesPerSend: 5000, Shards: 2, Tenant: tenant,
		ExternalLabels: []gpusim.Label{{Name: "cluster", Value: cluster}, {Name: "__replica__", Value: "p0"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	r := gpusim.Replica{Name: "p0", Offset: now.Sub(simEnd)}
	var buf []gpusim.Series
	ctx := context.Background()
	for ts := simEnd.Add(-span); !ts.After(simEnd); ts = ts.Add(scrape) {
		buf = c.AppendStaleMarkers(c.AppendSamples(buf[:0], ts, r), ts, r)
		if err := snd.Send(ctx, buf); err != nil {
			t.Fatalf("remote write: %v", err)
		}
	}
	st := snd.Stats()
	if st.Samples == 0 || st.DroppedSamples > 0 {
		t.Fatalf("remote write: %+v", st)
	}
	t.Logf("tenant %q: loaded %d samples of %s (simulated %s–%s)", tenant, st.Samples, cluster, simEnd.Add(-span).Format(time.RFC3339), simEnd.Format(time.RFC3339))
	return c
}

// scrapeSetup runs the real Prometheus the way deploy/compose does: it
// scrapes gpustore's own /metrics (job gpustore, written back to the
// default tenant for the operations dashboard) and a simulated 16-node
// cluster served by gpusim as its exporters' pages (per-node pages, and
// kube-state-metrics with the Pushgateway's nccl-tests results scraped
// with honor_labels), written to the tenant "scrape". The simulator's clock
// runs in a busy span of its timeline, with the GPU faults under way.
func scrapeSetup(t *testing.T, base string) {
	t.Helper()
	bin := testbin.Need(t, "prometheus")
	const lead = 45 * time.Minute // how far into the faults the scrape starts
	simNow := simWindow(t, scrapeNodes, time.Hour)
	shift := time.Until(simNow)
	// The faults' "end" 25 s after the scrape's: the DBE that ends the
	// first node's job comes 30 s into the scrape, once the job's series
	// have been scraped.
	faults := gpuFaults(lead + scrapeFor + 25*time.Second)
	faults = append(faults, gpusim.Fault{Kind: gpusim.FaultMIG, At: 0, Duration: 2 * time.Hour, Node: fmt.Sprint(scrapeNodes - 1), GPU: -1})
	sim, err := gpusim.New(gpusim.Config{Name: simCluster, Nodes: scrapeNodes, GPUsPerNode: simGPUs, Seed: 1, Faults: faults, FaultOrigin: simNow.Add(-lead)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gpusim.NewHandler(sim, gpusim.HandlerOptions{Pages: gpusim.PagesNode, Now: func() time.Time { return time.Now().Add(shift) }}))
	t.Cleanup(srv.Close)
	simAddr := strings.TrimPrefix(srv.URL, "http://")

	var cfg strings.Builder
	fmt.Fprintf(&cfg, `global: {scrape_interval: 1s, scrape_timeout: 1s, external_labels: {cluster: %q}}
scrape_configs:
  - job_name: gpustore
    static_configs: [{targets: [%q]}]
  - job_name: kube-state-metrics
    honor_labels: true
    metrics_path: /cluster/metrics
    static_configs: [{targets: [%q]}]
  - job_name: gpu-node
    static_configs:
`, simCluster, strings.TrimPrefix(base, "http://"), simAddr)
	for _, h := range sim.Hostnames() {
		fmt.Fprintf(&cfg, "      - {targets: [%q], labels: {__metrics_path__: %q, instance: %q}}\n", simAddr, "/node/"+h+"/metrics", h)
	}
	fmt.Fprintf(&cfg, `remote_write:
  - url: %[1]s/api/v1/write
    queue_config: {batch_send_deadline: 1s}
    write_relabel_configs: [{source_labels: [job], regex: gpustore, action: keep}]
  - url: %[1]s/api/v1/write
    headers: {X-Scope-OrgID: scrape}
    queue_config: {batch_send_deadline: 1s, max_samples_per_send: 5000}
    write_relabel_configs: [{source_labels: [job], regex: gpustore, action: drop}]
`, base)
	startPrometheus(t, bin, cfg.String())
}

func startPrometheus(t *testing.T, bin, config string) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	gpustoretest.StartProcess(t, "prometheus", bin, dir, func(addr string) []string {
		return []string{"--config.file=" + filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path=" + filepath.Join(dir, "data"),
			"--web.listen-address=" + addr, "--log.level=warn"}
	})
}

// waitFor polls an instant query until ok accepts its result.
func waitFor(t *testing.T, c v1.API, what, expr string, timeout time.Duration, ok func(model.Vector) bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		v, _, _, err := c.Query(context.Background(), expr, time.Now())
		if vec, isVec := v.(model.Vector); err == nil && isVec && ok(vec) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s = %v (%v) after %s", what, expr, v, err, timeout)
		}
		time.Sleep(time.Second)
	}
}

func atLeast(n float64) func(model.Vector) bool {
	return func(v model.Vector) bool { return len(v) == 1 && float64(v[0].Value) >= n }
}

// resolveVars fills the dashboard's query variables in order, as Grafana
// does when the dashboard opens: each one's label_values query over the
// dashboard's range, with the variables before it substituted; a variable
// that includes "All" is at All (its allValue), the others at their first
// value.
func resolveVars(t *testing.T, ds dataset, d board, start, end time.Time) map[string]string {
	t.Helper()
	vals := map[string]string{}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		sel, _ := labelValuesSelector(v.Definition)
		sel = fillVars(sel, vals)
		got, _, _, err := ds.api.LabelValues(context.Background(), labelValuesLabel(v.Definition), []string{sel}, start, end)
		if err != nil {
			t.Fatalf("%s: variable %s: %v", d.UID, v.Name, err)
		}
		if len(got) == 0 && !ds.requireData {
			t.Skipf("%s: variable %s: nothing in this data set has %s", d.UID, v.Name, sel)
		}
		if len(got) == 0 {
			t.Fatalf("%s: variable %s: label_values of %s is empty", d.UID, v.Name, sel)
		}
		if v.IncludeAll {
			vals[v.Name] = v.AllValue
			continue
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

// dataset is simulated GPU data in one gpustore tenant.
type dataset struct {
	name string
	api  v1.API
	gpus int // GPUs a sum may cover
	// requireData: every panel must return data (the faults make every
	// class happen); otherwise only the shape of what comes back is checked.
	requireData bool
}

// Every panel query of every dashboard, run by gpustore like Grafana runs it
// (variables resolved through the label API at their defaults, range query
// over the default range at a 15s step), against the simulated cluster as a
// Prometheus remote-writes it, as a real Prometheus scrapes it from
// gpusim's pages, and with MIG GPUs: it parses, returns data, every value
// is sane for the panel's unit and within the panel's own min/max, no NaN,
// no two series a viewer cannot tell apart (same legend at the same time).
// The overview's stats agree with the rule pack's recording rules, and with
// the simulator's own count and power of its GPUs when some are in MIG mode.
func TestPanelQueriesAgainstGpustore(t *testing.T) {
	if testing.Short() {
		t.Skip("loads simulated clusters into gpustore")
	}
	// The scale-out path in one process (distributor, receiver, querier,
	// ruler and compactor on the ring), so that every row of the operations
	// dashboard has data, with a real Alertmanager to notify; the GPU
	// dashboards are read through it too.
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
		c.TSDB.BlockDuration = model.Duration(20 * time.Minute)
		c.Compact.BlockRanges = compact.DurationList{model.Duration(20 * time.Minute), model.Duration(2 * time.Hour)}
		c.Limits.Defaults.OutOfOrderWindow = model.Duration(time.Hour)
		c.Compact.Interval = model.Duration(time.Second)
		c.BucketStore.SyncInterval = model.Duration(time.Second)
	})
	scrapeSetup(t, base) // scrapes while the rest is loaded
	scrapeStart := time.Now()
	now := time.Now().Truncate(scrape)
	const span = time.Hour + 5*time.Minute
	rw := dataset{name: "remote-write", api: tenantAPI(t, base, ""), gpus: simNodes * simGPUs, requireData: true}
	loadSimulatedCluster(t, base, "", simCluster, now, span, gpuFaults(span)...)
	migNow := time.Now().Truncate(scrape)
	mig := dataset{name: "mig", api: tenantAPI(t, base, "mig"), gpus: simNodes * simGPUs}
	// Its own cluster name: two tenants' HA pairs of one cluster name are
	// the operations dashboard's business, not this test's.
	migSim := loadSimulatedCluster(t, base, "mig", migCluster, migNow, 20*time.Minute,
		gpusim.Fault{Kind: gpusim.FaultMIG, At: -time.Hour, Duration: 3 * time.Hour, Node: fmt.Sprint(simNodes - 1), GPU: -1})
	scraped := dataset{name: "scrape", api: tenantAPI(t, base, "scrape"), gpus: scrapeNodes * simGPUs, requireData: true}

	// The rule pack has evaluated in every tenant, and the scrape has run
	// long enough for rates and for the Xid and ECC events to be seen.
	for _, ds := range []dataset{rw, mig, scraped} {
		waitFor(t, ds.api, ds.name+": recording rules evaluated", `count(cluster:gpu_available:count)`, 90*time.Second, atLeast(1))
	}
	time.Sleep(time.Until(scrapeStart.Add(scrapeFor)))
	waitFor(t, scraped.api, "scraped GPUs", `count(count by (UUID) (DCGM_FI_DEV_GPU_TEMP))`, 30*time.Second, atLeast(scrapeNodes*simGPUs))
	waitFor(t, rw.api, "ALERTS recorded", `count(ALERTS{alertstate="firing"})`, 60*time.Second, atLeast(1))
	waitFor(t, scraped.api, "ALERTS recorded", `count(ALERTS{alertstate="firing"})`, 60*time.Second, atLeast(1))

	boards := committed(t)
	names := make([]string, 0, len(boards))
	for n := range boards {
		names = append(names, n)
	}
	sort.Strings(names)
	const ops = "gpustore-operations.json"
	for _, ds := range []dataset{rw, scraped, mig} {
		for _, name := range names {
			if name == ops {
				continue
			}
			t.Run(ds.name+"/"+strings.TrimSuffix(name, ".json"), func(t *testing.T) {
				runDashboard(t, ds, boards[name], time.Now(), 0)
			})
		}
	}
	t.Run("remote-write/overview agrees with the recording rules", func(t *testing.T) {
		checkOverviewAgreesWithRules(t, rw.api, boards["gpu-cluster-overview.json"])
	})
	t.Run("mig/overview counts each GPU once", func(t *testing.T) {
		checkOverviewMIG(t, mig.api, boards["gpu-cluster-overview.json"], migSim, migNow)
	})
	// A dashboard refreshed: the same range query, over steps older than the
	// out-of-order window, again hits the results cache, whose panel the
	// operations dashboard has.
	old := v1.Range{Start: now.Add(-span), End: now.Add(-span + 4*time.Minute), Step: scrape}
	for range 2 {
		if _, _, _, err := rw.api.QueryRange(context.Background(), `max(DCGM_FI_DEV_GPU_TEMP)`, old); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, rw.api, "a results-cache hit scraped twice (for rate)", `max(count_over_time(gpustore_query_frontend_cache_hits_total{job="gpustore"}[1m]))`, 30*time.Second, atLeast(2))
	waitFor(t, rw.api, "gpustore's own metrics", `count_over_time(up{job="gpustore"}[1m])`, 30*time.Second, atLeast(15))
	t.Run("gpustore-operations", func(t *testing.T) {
		runDashboard(t, dataset{name: "gpustore", api: rw.api, requireData: true}, boards[ops], time.Now(), 0)
	})
}

// runDashboard runs every panel of d over its default range ending at end
// (at most maxRange long when not 0).
func runDashboard(t *testing.T, ds dataset, d board, end time.Time, maxRange time.Duration) {
	t.Helper()
	rng, err := time.ParseDuration(strings.TrimPrefix(d.Time.From, "now-"))
	if err != nil || d.Time.To != "now" {
		t.Fatalf("default range %s to %s: want now-<duration> to now", d.Time.From, d.Time.To)
	}
	if maxRange > 0 {
		rng = min(rng, maxRange)
	}
	start := end.Add(-rng)
	vals := resolveVars(t, ds, d, start, end)
	t.Logf("variables: %v", vals)
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			checkPanelQuery(t, ds, p, tg.Legend, fillVars(tg.Expr, vals), v1.Range{Start: start, End: end, Step: scrape})
		}
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
	c := tenantAPI(t, base, "")
	now := time.Now().Truncate(scrape)
	const span = time.Hour
	upgrades := gpuFaults(span + 5*time.Minute)
	for n := 0; n < simNodes; n++ {
		upgrades = append(upgrades, gpusim.Fault{Kind: gpusim.FaultExporterUpgrade, Node: fmt.Sprint(n), GPU: -1})
	}
	loadSimulatedCluster(t, base, "", simCluster, now, span+5*time.Minute, upgrades...)
	// The data is the new exporter's: hostname on the wire, Hostname stored.
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
	waitFor(t, c, "recording rules evaluated", `count(cluster:gpu_available:count)`, 90*time.Second, atLeast(1))
	waitFor(t, c, "ALERTS recorded", `count(ALERTS{alertstate="firing"})`, 60*time.Second, atLeast(1))
	checked := 0
	for name, d := range committed(t) {
		if name == "gpustore-operations.json" {
			continue
		}
		checked++
		t.Run(strings.TrimSuffix(name, ".json"), func(t *testing.T) {
			runDashboard(t, dataset{name: "upgraded", api: c, gpus: simNodes * simGPUs, requireData: true}, d, time.Now(), span)
		})
	}
	if checked == 0 {
		t.Fatal("no GPU dashboard")
	}
}

var legendRef = regexp.MustCompile(`\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}`)

// legendOf renders a series' name as Grafana does: the legend format with
// its {{label}} references filled in, or the whole label set without one.
func legendOf(format string, m model.Metric) string {
	if format == "" {
		return m.String()
	}
	return legendRef.ReplaceAllStringFunc(format, func(ref string) string {
		return string(m[model.LabelName(legendRef.FindStringSubmatch(ref)[1])])
	})
}

func checkPanelQuery(t *testing.T, ds dataset, p panel, legend, expr string, r v1.Range) {
	t.Helper()
	what := fmt.Sprintf("panel %q: %s", p.Title, expr)
	if _, err := parser.NewParser(parser.Options{}).ParseExpr(expr); err != nil {
		t.Errorf("%s: %v", what, err)
		return
	}
	res, _, _, err := ds.api.QueryRange(context.Background(), expr, r)
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
		switch {
		case readsOnly(expr, notCompactedInTheTest):
			t.Logf("%s: no data (nothing compacted yet)", what)
		case readsOnly(expr, everyFiveMinutes):
			t.Logf("%s: no data (the chargeback group has not run yet)", what)
		case ds.requireData:
			t.Errorf("%s: no data", what)
		}
		return
	}
	checkDistinct(t, what, p, legend, m)
	lim, _ := unitRange(p.FieldConfig.Defaults.Unit, ds.gpus)
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

// checkDistinct fails when a viewer cannot tell two series apart: the same
// legend at the same instant (a GPU counted twice after its pod changed, a
// MIG instance drawn as its GPU), or a single-value panel (stat, gauge)
// with several values at once.
func checkDistinct(t *testing.T, what string, p panel, legend string, m model.Matrix) {
	t.Helper()
	single := legend == "" && (p.Type == "stat" || p.Type == "gauge")
	seen := map[string]map[model.Time]model.Metric{}
	bad := 0
	for _, s := range m {
		name := legendOf(legend, s.Metric)
		if single {
			name = ""
		}
		if seen[name] == nil {
			seen[name] = map[model.Time]model.Metric{}
		}
		for _, v := range s.Values {
			if other, dup := seen[name][v.Timestamp]; dup {
				if bad < 3 {
					t.Errorf("%s: %s and %s both drawn as %q at %s", what, other, s.Metric, name, v.Timestamp.Time().Format(time.TimeOnly))
				}
				bad++
				continue
			}
			seen[name][v.Timestamp] = s.Metric
		}
	}
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

// panelByTitle returns the first target of the panel titled title.
func panelByTitle(t *testing.T, d board, title string) (panel, string) {
	t.Helper()
	for _, p := range d.Panels {
		if p.Title == title && len(p.Targets) > 0 {
			return p, p.Targets[0].Expr
		}
	}
	t.Fatalf("%s has no panel %q", d.UID, title)
	return panel{}, ""
}

// recordingRule returns the expression of the pack's recording rule name.
func recordingRule(t *testing.T, name string) string {
	t.Helper()
	for _, f := range rulepack.Files() {
		b, err := fs.ReadFile(rulepack.FS, f)
		if err != nil {
			t.Fatal(err)
		}
		var rf struct {
			Groups []struct {
				Rules []struct{ Record, Expr string }
			}
		}
		if err := yaml.Unmarshal(b, &rf); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, g := range rf.Groups {
			for _, r := range g.Rules {
				if r.Record == name {
					return r.Expr
				}
			}
		}
	}
	t.Fatalf("the rule pack records no %s", name)
	return ""
}

// pointsOf returns a single-series result's values by time.
func pointsOf(t *testing.T, c v1.API, what, expr string, r v1.Range) map[model.Time]float64 {
	t.Helper()
	res, _, _, err := c.QueryRange(context.Background(), expr, r)
	if err != nil {
		t.Fatalf("%s: %s: %v", what, expr, err)
	}
	out := map[model.Time]float64{}
	for _, s := range res.(model.Matrix) {
		if c := s.Metric["cluster"]; c != "" && c != simCluster {
			continue
		}
		for _, v := range s.Values {
			if _, dup := out[v.Timestamp]; dup {
				t.Fatalf("%s: %s has several series", what, expr)
			}
			out[v.Timestamp] = float64(v.Value)
		}
	}
	return out
}

// The overview's GPU count, power and utilisation are what the rule pack
// records (evaluated here over the whole range as the ruler evaluates them
// at each instant), and "GPUs available" reads cluster:gpu_available:count
// itself: a dashboard must not count GPUs one way while the alerts and
// capacity rules count them another.
func checkOverviewAgreesWithRules(t *testing.T, c v1.API, d board) {
	end := time.Now()
	r := v1.Range{Start: end.Add(-time.Hour), End: end, Step: scrape}
	vals := map[string]string{"cluster": simCluster}
	for _, tc := range []struct {
		title, rule string
		scale       float64 // panel = rule × scale
		recorded    bool    // compare with what the ruler recorded, not the rule's expression
	}{
		{"GPUs", "cluster:gpu_total:count", 1, false},
		{"Total power", "cluster:gpu_power_draw:sum", 1.0 / 1000, false},
		{"Average GPU utilisation", "cluster:gpu_utilization:avg", 1, false},
		// Its rule reads other recorded series (gpu:xid_errors:recent):
		// compare where the ruler has run.
		{"GPUs available", "cluster:gpu_available:count", 1, true},
	} {
		_, expr := panelByTitle(t, d, tc.title)
		got := pointsOf(t, c, tc.title, fillVars(expr, vals), r)
		ruleExpr := tc.rule
		if !tc.recorded {
			ruleExpr = recordingRule(t, tc.rule)
		}
		want := pointsOf(t, c, tc.rule, ruleExpr, r)
		if len(want) == 0 {
			t.Fatalf("%s: the rule's expression has no data", tc.rule)
		}
		bad := 0
		for ts, w := range want {
			g, ok := got[ts]
			if !ok || math.Abs(g-w*tc.scale) > 1e-9*math.Max(1, math.Abs(w*tc.scale)) {
				if bad < 3 {
					t.Errorf("panel %q at %s: %v (present %v), rule %s says %v", tc.title, ts.Time().Format(time.TimeOnly), g, ok, tc.rule, w*tc.scale)
				}
				bad++
			}
		}
		t.Logf("panel %q vs %s: %d points, %d differ", tc.title, tc.rule, len(want), bad)
	}
}

// With a node's GPUs in MIG mode (dcgm-exporter then exports each GPU
// instance with the GPU's own temperature and power), the overview counts
// and sums each GPU once: its last point equals the simulator's own count
// of GPUs and sum of their power at the last sample.
func checkOverviewMIG(t *testing.T, c v1.API, d board, sim *gpusim.Cluster, end time.Time) {
	vals := map[string]string{"cluster": migCluster}
	power, uuids := 0.0, map[string]bool{}
	inst := 0
	simEnd := simWindow(t, simNodes, 20*time.Minute)
	for _, s := range sim.AppendSamples(nil, simEnd, gpusim.Replica{}) {
		if s.Name() != "DCGM_FI_DEV_POWER_USAGE" {
			continue
		}
		if s.Get("GPU_I_ID") != "" {
			inst++
		}
		if !uuids[s.Get("UUID")] {
			uuids[s.Get("UUID")] = true
			power += s.V
		}
	}
	if inst == 0 {
		t.Fatal("no MIG instance in the simulated data")
	}
	for _, tc := range []struct {
		title string
		want  float64
	}{{"GPUs", float64(len(uuids))}, {"Total power", power / 1000}} {
		_, expr := panelByTitle(t, d, tc.title)
		v, _, _, err := c.Query(context.Background(), fillVars(expr, vals), end)
		if err != nil {
			t.Fatal(err)
		}
		vec, _ := v.(model.Vector)
		if len(vec) != 1 || math.Abs(float64(vec[0].Value)-tc.want) > 1e-6*math.Max(1, tc.want) {
			t.Errorf("panel %q with %d MIG instances = %v, want %v (each GPU once)", tc.title, inst, vec, tc.want)
		}
	}
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
