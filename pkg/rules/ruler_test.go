package rules

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grafana/dskit/services"
	"github.com/grafana/dskit/user"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"
	v1 "github.com/prometheus/prometheus/web/api/v1"

	rulepack "github.com/gpustore/gpustore/deploy/rules"
	"github.com/gpustore/gpustore/pkg/query"
	"github.com/gpustore/gpustore/pkg/tenancy"
	"github.com/gpustore/gpustore/pkg/tenantdb"
)

// env is a ruler over real tenant TSDBs and gpustore's query API.
type env struct {
	t     *testing.T
	dbs   *tenantdb.Manager
	api   *query.API
	reg   *prometheus.Registry
	ruler *Ruler
	dir   string // rules dir
	mux   *http.ServeMux
}

func newEnv(t *testing.T, mutate func(*Config)) *env {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	reg := prometheus.NewRegistry()
	data := t.TempDir()
	tcfg := tenantdb.DefaultConfig()
	tcfg.Dir = data
	dbs, err := tenantdb.NewManager(tcfg, logger, reg)
	if err != nil {
		t.Fatal(err)
	}
	if err := dbs.OpenExisting(context.Background()); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, dbs: dbs, reg: reg, dir: filepath.Join(t.TempDir(), "rules"), mux: http.NewServeMux()}
	if err := os.MkdirAll(e.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Dir = e.dir
	cfg.GPUPack = false
	cfg.TenantPollInterval = model.Duration(100 * time.Millisecond)
	if mutate != nil {
		mutate(&cfg)
	}
	tenants := tenancy.DefaultConfig()
	api, err := query.New(query.Options{
		Config: query.DefaultConfig(), Tenants: tenants, DBs: dbs, Logger: logger, Registry: reg,
		Ready: func() error { return nil }, ActiveQueryDir: filepath.Join(data, "query"),
		Rules: func(ctx context.Context) v1.RulesRetriever {
			if e.ruler == nil {
				return NoRules{}
			}
			return e.ruler.RulesRetriever(ctx)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	e.api = api
	api.RegisterRoutes(e.mux)
	e.cfgRuler(cfg, tenants, logger)
	return e
}

func (e *env) cfgRuler(cfg Config, tenants tenancy.Config, logger *slog.Logger) {
	t := e.t
	r, err := New(Options{
		Config: cfg, Tenants: tenants, DBs: e.dbs, Engine: e.api.Engine(),
		Logger: logger, Registerer: e.reg, ListenAddress: "127.0.0.1:9201",
	})
	if err != nil {
		t.Fatal(err)
	}
	e.ruler = r
	e.mux.HandleFunc("/-/reload", r.ServeReload)
	t.Cleanup(func() {
		if err := services.StopAndAwaitTerminated(context.Background(), r); err != nil {
			t.Errorf("stop ruler: %v", err)
		}
		if err := e.dbs.Close(); err != nil {
			t.Errorf("close dbs: %v", err)
		}
	})
}

// replaceRuler swaps the env's ruler (not started) for one with the same
// options as changed by set, before the env starts.
func (e *env) replaceRuler(set func(*Options)) {
	t := e.t
	opts := Options{
		Config: e.ruler.cfg, Tenants: e.ruler.opts.Tenants, DBs: e.dbs, Engine: e.api.Engine(),
		Logger: e.ruler.logger, Registerer: prometheus.NewRegistry(), ListenAddress: "127.0.0.1:9201",
	}
	set(&opts)
	r, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	unused := e.ruler
	e.ruler = r
	t.Cleanup(func() {
		if err := services.StopAndAwaitTerminated(context.Background(), r); err != nil {
			t.Errorf("stop ruler: %v", err)
		}
		e.ruler = unused // the cleanup of newEnv stops the one it built
	})
}

func (e *env) start() {
	e.t.Helper()
	if err := services.StartAndAwaitRunning(context.Background(), e.ruler); err != nil {
		e.t.Fatal(err)
	}
}

// writeRules writes a rule file for tenant ("" = top of the rules dir).
func (e *env) writeRules(tenantID, name, content string) {
	e.t.Helper()
	dir := filepath.Join(e.dir, tenantID)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		e.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		e.t.Fatal(err)
	}
}

// appendTemps writes DCGM_FI_DEV_GPU_TEMP for gpus 0..len(temps)-1 of host
// at each of the timestamps.
func (e *env) appendTemps(tenantID, host string, temps []float64, ts ...time.Time) {
	e.t.Helper()
	db, err := e.dbs.Get(tenantID)
	if err != nil {
		e.t.Fatal(err)
	}
	app := db.AppenderV2(context.Background())
	for _, at := range ts {
		for gpu, v := range temps {
			ls := labels.FromStrings("__name__", "DCGM_FI_DEV_GPU_TEMP", "Hostname", host, "gpu", fmt.Sprint(gpu), "UUID", fmt.Sprintf("GPU-%s-%d", host, gpu))
			if _, err := app.Append(0, ls, 0, at.UnixMilli(), v, nil, nil, storage.AOptions{}); err != nil {
				e.t.Fatal(err)
			}
		}
	}
	if err := app.Commit(); err != nil {
		e.t.Fatal(err)
	}
}

// instant evaluates expr for tenant at ts through gpustore's engine and TenantQueryable.
func (e *env) instant(tenantID, expr string, ts time.Time) promql.Vector {
	e.t.Helper()
	ctx := user.InjectOrgID(context.Background(), tenantID)
	q, err := e.api.Engine().NewInstantQuery(ctx, query.TenantQueryable{DBs: e.dbs}, nil, expr, ts)
	if err != nil {
		e.t.Fatal(err)
	}
	defer q.Close()
	res := q.Exec(ctx)
	if res.Err != nil {
		e.t.Fatalf("%s: %v", expr, res.Err)
	}
	v, err := res.Vector()
	if err != nil {
		e.t.Fatal(err)
	}
	return v
}

// stored returns the raw samples of the series matching name in the tenant's
// TSDB, read through TenantQueryable, by series.
func (e *env) stored(tenantID, name string) map[string][]promql.FPoint {
	e.t.Helper()
	ctx := user.InjectOrgID(context.Background(), tenantID)
	q, err := query.TenantQueryable{DBs: e.dbs}.Querier(0, time.Now().Add(time.Hour).UnixMilli())
	if err != nil {
		e.t.Fatal(err)
	}
	defer q.Close()
	ss := q.Select(ctx, true, nil, labels.MustNewMatcher(labels.MatchEqual, "__name__", name))
	out := map[string][]promql.FPoint{}
	for ss.Next() {
		s := ss.At()
		it := s.Iterator(nil)
		for it.Next() != 0 {
			t, v := it.At()
			out[s.Labels().String()] = append(out[s.Labels().String()], promql.FPoint{T: t, F: v})
		}
	}
	if err := ss.Err(); err != nil {
		e.t.Fatal(err)
	}
	return out
}

func (e *env) groupNames(tenantID string) []string {
	var out []string
	for _, g := range e.ruler.RulesRetriever(user.InjectOrgID(context.Background(), tenantID)).RuleGroups() {
		out = append(out, g.File()+";"+g.Name())
	}
	return out
}

func waitFor(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		if err = f(); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s: %v", timeout, what, err)
}

type testLog struct{ t *testing.T }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

const maxTempRules = `groups:
  - name: temps
    interval: 1s
    rules:
      - record: node:gpu_temp:max
        expr: max by (Hostname) (DCGM_FI_DEV_GPU_TEMP)
`

// Recording rules are evaluated per tenant through gpustore's engine, their
// results land in that tenant's TSDB, can be read back through
// TenantQueryable, and equal the expression evaluated directly; another
// tenant's data neither leaks into them nor gets results of its own.
func TestRecordingRulesPerTenantAndIsolated(t *testing.T) {
	e := newEnv(t, nil)
	e.writeRules("team-a", "temps.yml", maxTempRules)
	now := time.Now()
	e.appendTemps("team-a", "node-1", []float64{61, 72, 55}, now.Add(-10*time.Second))
	e.appendTemps("team-b", "node-1", []float64{90, 95, 99}, now.Add(-10*time.Second))
	e.start()

	if got := e.ruler.Tenants(); !slices.Equal(got, []string{"team-a"}) {
		t.Fatalf("tenants with rules = %v, want [team-a] (GPU pack off, team-b has no files)", got)
	}
	var series map[string][]promql.FPoint
	waitFor(t, 10*time.Second, "recorded samples", func() error {
		series = e.stored("team-a", "node:gpu_temp:max")
		if len(series) == 0 {
			return fmt.Errorf("nothing recorded yet")
		}
		return nil
	})
	if len(series) != 1 {
		t.Fatalf("recorded series = %v, want one", series)
	}
	for ls, pts := range series {
		if ls != `{Hostname="node-1", __name__="node:gpu_temp:max"}` {
			t.Errorf("recorded series %s", ls)
		}
		last := pts[len(pts)-1]
		if last.F != 72 {
			t.Errorf("recorded value %v, want 72 (team-a's max; team-b's 99 must not leak)", last.F)
		}
		// The recorded sample equals the expression evaluated at its timestamp.
		direct := e.instant("team-a", "max by (Hostname) (DCGM_FI_DEV_GPU_TEMP)", time.UnixMilli(last.T))
		if len(direct) != 1 || direct[0].F != last.F || direct[0].Metric.Get("Hostname") != "node-1" {
			t.Errorf("direct evaluation %v, recorded %v", direct, last)
		}
	}
	// Queryable like any series, through the query path.
	if v := e.instant("team-a", "node:gpu_temp:max", time.Now()); len(v) != 1 || v[0].F != 72 {
		t.Errorf("query node:gpu_temp:max for team-a = %v", v)
	}
	if got := e.stored("team-b", "node:gpu_temp:max"); len(got) != 0 {
		t.Errorf("team-b got recorded series %v without rules", got)
	}
	if v := e.instant("team-b", "node:gpu_temp:max", time.Now()); len(v) != 0 {
		t.Errorf("team-b sees %v", v)
	}
	if len(e.groupNames("team-b")) != 0 {
		t.Errorf("team-b has groups %v", e.groupNames("team-b"))
	}

	// The rule managers' metrics are exposed per tenant.
	n, err := testutil.GatherAndCount(e.reg, "prometheus_rule_evaluations_total", "prometheus_rule_group_iterations_missed_total", "prometheus_rule_group_duration_seconds")
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Error("no rule manager metrics registered")
	}
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() != "prometheus_rule_evaluations_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "tenant" && l.GetValue() == "team-a" {
					found = true
				}
			}
		}
	}
	if !found {
		t.Error(`prometheus_rule_evaluations_total has no tenant="team-a" series`)
	}
}

// Files at the top of the rules directory belong to the default tenant.
func TestTopLevelFilesAreTheDefaultTenants(t *testing.T) {
	e := newEnv(t, nil)
	e.writeRules("", "temps.yml", maxTempRules)
	e.writeRules("", "README.md", "not a rule file")
	e.start()
	if got := e.groupNames("default"); !slices.Equal(got, []string{filepath.Join(e.dir, "temps.yml") + ";temps"}) {
		t.Errorf("default tenant groups = %v", got)
	}
}

// A broken file on reload is reported (error, gauge 0) and the tenant keeps
// evaluating its previous rules; a fixed file is picked up by the next reload.
func TestBrokenReloadKeepsPreviousRules(t *testing.T) {
	e := newEnv(t, nil)
	e.writeRules("team-a", "temps.yml", maxTempRules)
	e.appendTemps("team-a", "node-1", []float64{61, 72}, time.Now().Add(-5*time.Second))
	e.start()
	gauge := func() float64 {
		return testutil.ToFloat64(e.ruler.reloadSuccess.WithLabelValues("team-a"))
	}
	if gauge() != 1 {
		t.Fatalf("gauge after start = %v", gauge())
	}
	before := e.groupNames("team-a")

	e.writeRules("team-a", "temps.yml", strings.Replace(maxTempRules, "max by (Hostname)", "max by (Hostname", 1))
	e.writeRules("team-a", "more.yml", "groups:\n  - name: more\n    rules:\n      - record: x\n        expr: vector(1)\n")
	srv := httptest.NewServer(e.mux)
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/-/reload", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusInternalServerError || !strings.Contains(string(body), "temps.yml") {
		t.Errorf("POST /-/reload with a broken file: %d %s", resp.StatusCode, body)
	}
	if gauge() != 0 {
		t.Errorf("gauge after failed reload = %v, want 0", gauge())
	}
	if got := e.groupNames("team-a"); !slices.Equal(got, before) {
		t.Errorf("groups after failed reload = %v, want the previous %v", got, before)
	}
	// The previous rules keep being evaluated.
	count := func() int {
		n := 0
		for _, pts := range e.stored("team-a", "node:gpu_temp:max") {
			n += len(pts)
		}
		return n
	}
	n0 := count()
	waitFor(t, 10*time.Second, "evaluations after the failed reload", func() error {
		if c := count(); c <= n0 {
			return fmt.Errorf("%d samples, had %d", c, n0)
		}
		return nil
	})

	// GET is refused, as in Prometheus.
	if resp, err := http.Get(srv.URL + "/-/reload"); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /-/reload: %v %v", resp.StatusCode, err)
	}

	e.writeRules("team-a", "temps.yml", maxTempRules)
	if err := e.ruler.Reload(); err != nil {
		t.Fatal(err)
	}
	if gauge() != 1 {
		t.Errorf("gauge after good reload = %v", gauge())
	}
	if got := e.groupNames("team-a"); len(got) != 2 {
		t.Errorf("groups after good reload = %v, want temps and more", got)
	}

	// Removing the tenant's files removes its rules.
	if err := os.RemoveAll(filepath.Join(e.dir, "team-a")); err != nil {
		t.Fatal(err)
	}
	if err := e.ruler.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := e.groupNames("team-a"); len(got) != 0 {
		t.Errorf("groups after removing the files = %v", got)
	}
}

// The GPU pack runs for every tenant with a database, including tenants
// that appear later; a tenant known only from the rules dir gets it once it
// has data; a tenant's own group replaces the pack's group of that name.
func TestGPUPackForExistingAndNewTenants(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.GPUPack = true })
	e.appendTemps("team-a", "node-1", []float64{50}, time.Now())
	e.writeRules("team-c", "temps.yml", maxTempRules)
	e.writeRules("team-d", "override.yml", strings.Replace(maxTempRules, "name: temps", "name: gpu_recording", 1))
	e.appendTemps("team-d", "node-1", []float64{50}, time.Now())
	e.start()

	var pack []string
	for _, f := range rulepack.Files() {
		pack = append(pack, PackPrefix+f)
	}
	files := func(tenantID string) []string {
		var out []string
		for _, g := range e.ruler.RulesRetriever(user.InjectOrgID(context.Background(), tenantID)).RuleGroups() {
			if !slices.Contains(out, g.File()) {
				out = append(out, g.File())
			}
		}
		return out
	}
	if got := files("team-a"); !slices.Equal(got, pack) {
		t.Errorf("team-a's rule files = %v, want the pack %v", got, pack)
	}
	if got := files("team-c"); len(got) != 1 || !strings.HasSuffix(got[0], "temps.yml") {
		t.Errorf("team-c (no data yet) rule files = %v, want only its own", got)
	}
	// team-d's gpu_recording group is its own, not the pack's.
	for _, g := range e.ruler.RulesRetriever(user.InjectOrgID(context.Background(), "team-d")).RuleGroups() {
		if g.Name() == "gpu_recording" && strings.HasPrefix(g.File(), PackPrefix) {
			t.Errorf("team-d still evaluates the pack's gpu_recording")
		}
	}
	if got := len(e.groupNames("team-d")); got != len(e.groupNames("team-a")) {
		t.Errorf("team-d has %d groups, want %d (one replaced)", got, len(e.groupNames("team-a")))
	}

	// team-c's file breaks; a failed reload keeps its rules.
	e.writeRules("team-c", "temps.yml", "groups: [")
	if err := e.ruler.Reload(); err == nil || !strings.Contains(err.Error(), "team-c") {
		t.Errorf("reload with team-c's broken file: %v", err)
	}

	// New tenants: one that starts writing, and team-c once it has data.
	e.appendTemps("team-b", "node-1", []float64{50}, time.Now())
	e.appendTemps("team-c", "node-1", []float64{50}, time.Now())
	waitFor(t, 5*time.Second, "pack for new tenants", func() error {
		if got := files("team-b"); !slices.Equal(got, pack) {
			return fmt.Errorf("team-b files %v", got)
		}
		if got := files("team-c"); len(got) != len(pack)+1 {
			return fmt.Errorf("team-c files %v", got)
		}
		return nil
	})
	// Adding the pack to team-c's previous files does not hide its failed reload.
	gauge := func(tenantID string) float64 {
		return testutil.ToFloat64(e.ruler.reloadSuccess.WithLabelValues(tenantID))
	}
	if gauge("team-c") != 0 || gauge("team-b") != 1 {
		t.Errorf("reload gauges: team-c %v (want 0), team-b %v (want 1)", gauge("team-c"), gauge("team-b"))
	}
}

// Alerts go to the Alertmanager v2 API with the external labels, the tenant
// label and the tenant in X-Scope-OrgID, and /api/v1/rules and /api/v1/alerts
// answer per tenant in Prometheus' shape.
func TestAlertsSentAndListedPerTenant(t *testing.T) {
	type post struct {
		path, orgID string
		alerts      []map[string]any
	}
	var mu sync.Mutex
	var posts []post
	am := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var alerts []map[string]any
		_ = json.NewDecoder(r.Body).Decode(&alerts)
		mu.Lock()
		posts = append(posts, post{r.URL.Path, r.Header.Get("X-Scope-OrgID"), alerts})
		mu.Unlock()
	}))
	defer am.Close()

	e := newEnv(t, func(c *Config) {
		c.Alertmanager.URLs = []string{am.URL + "/prefix"}
		c.ExternalLabels = map[string]string{"region": "eu-1"}
		c.ExternalURL = "https://gpustore.example.com"
	})
	e.writeRules("team-a", "alerts.yml", `groups:
  - name: hot
    interval: 1s
    rules:
      - alert: Hot
        expr: DCGM_FI_DEV_GPU_TEMP > 85
        labels: {severity: info}
        annotations: {summary: "GPU {{ $labels.gpu }} at {{ $value }}"}
`)
	e.appendTemps("team-a", "node-1", []float64{90, 60}, time.Now())
	e.appendTemps("team-b", "node-1", []float64{99, 99}, time.Now())
	e.start()

	waitFor(t, 10*time.Second, "alert posted", func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(posts) == 0 {
			return fmt.Errorf("no post")
		}
		return nil
	})
	mu.Lock()
	p := posts[0]
	mu.Unlock()
	if p.path != "/prefix/api/v2/alerts" || p.orgID != "team-a" {
		t.Errorf("posted to %s with X-Scope-OrgID %q", p.path, p.orgID)
	}
	if len(p.alerts) != 1 {
		t.Fatalf("alerts %v", p.alerts)
	}
	lbls := p.alerts[0]["labels"].(map[string]any)
	want := map[string]any{"alertname": "Hot", "severity": "info", "gpu": "0", "Hostname": "node-1", "UUID": "GPU-node-1-0", "region": "eu-1", "tenant": "team-a"}
	for k, v := range want {
		if lbls[k] != v {
			t.Errorf("label %s = %v, want %v (labels %v)", k, lbls[k], v, lbls)
		}
	}
	if s := p.alerts[0]["annotations"].(map[string]any)["summary"]; s != "GPU 0 at 90" {
		t.Errorf("summary %v", s)
	}
	if g, _ := p.alerts[0]["generatorURL"].(string); !strings.HasPrefix(g, "https://gpustore.example.com/graph?g0.expr=") {
		t.Errorf("generatorURL %q", g)
	}

	srv := httptest.NewServer(e.mux)
	defer srv.Close()
	get := func(path, tenantID string, out any) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		req.Header.Set("X-Scope-OrgID", tenantID)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("%s: %d %s", path, resp.StatusCode, b)
		}
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			t.Fatal(err)
		}
	}
	var rules struct {
		Status string
		Data   struct {
			Groups []struct {
				Name, File string
				Interval   float64
				Rules      []struct {
					Name, Type, Health, State string
					Alerts                    []struct{ Labels map[string]string }
				}
			}
		}
	}
	get("/api/v1/rules", "team-a", &rules)
	if rules.Status != "success" || len(rules.Data.Groups) != 1 || rules.Data.Groups[0].Name != "hot" || rules.Data.Groups[0].Interval != 1 {
		t.Fatalf("team-a /api/v1/rules = %+v", rules)
	}
	r := rules.Data.Groups[0].Rules[0]
	if r.Name != "Hot" || r.Type != "alerting" || r.State != "firing" || r.Health != "ok" || len(r.Alerts) != 1 {
		t.Errorf("team-a rule = %+v", r)
	}
	var alerts struct {
		Status string
		Data   struct {
			Alerts []struct {
				Labels map[string]string
				State  string
			}
		}
	}
	get("/api/v1/alerts", "team-a", &alerts)
	if alerts.Status != "success" || len(alerts.Data.Alerts) != 1 || alerts.Data.Alerts[0].State != "firing" || alerts.Data.Alerts[0].Labels["gpu"] != "0" {
		t.Errorf("team-a /api/v1/alerts = %+v", alerts)
	}
	// team-b has hotter GPUs but no rules: nothing.
	rules.Data.Groups = nil
	get("/api/v1/rules", "team-b", &rules)
	if len(rules.Data.Groups) != 0 {
		t.Errorf("team-b /api/v1/rules = %+v", rules)
	}
	alerts.Data.Alerts = nil
	get("/api/v1/alerts", "team-b", &alerts)
	if len(alerts.Data.Alerts) != 0 {
		t.Errorf("team-b /api/v1/alerts = %+v", alerts)
	}
	// The ALERTS series is stored in team-a's TSDB only.
	waitFor(t, 5*time.Second, "ALERTS stored", func() error {
		if got := e.stored("team-a", "ALERTS"); len(got) != 1 {
			return fmt.Errorf("team-a ALERTS = %v", got)
		}
		return nil
	})
	if got := e.stored("team-b", "ALERTS"); len(got) != 0 {
		t.Errorf("team-b ALERTS = %v", got)
	}
}

func TestConfigValidateAndFlags(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("default config: %v", err)
	}
	good := DefaultConfig()
	good.Alertmanager.URLs = []string{"dns+http://alertmanager-operated.monitoring.svc:9093", "dnssrv+https://user:pw@_web._tcp.am.example/prefix", "dnssrvnoa+http://_web._tcp.am.example", "http://am:9093"}
	if err := good.Validate(); err != nil {
		t.Errorf("DNS-discovered Alertmanagers: %v", err)
	}
	for _, bad := range []func(*Config){
		func(c *Config) { c.Alertmanager.URLs = []string{"alertmanager:9093"} },
		func(c *Config) { c.Alertmanager.URLs = []string{"ftp://am:9093"} },
		func(c *Config) { c.Alertmanager.URLs = []string{"dns+http://am"} }, // an A lookup needs the port
		func(c *Config) { c.Alertmanager.URLs = []string{"dnsx+http://am:9093"} },
		func(c *Config) { c.Alertmanager.URLs = []string{"dnssrv+am"} },
		func(c *Config) { c.Alertmanager.RefreshInterval = 0 },
		func(c *Config) { c.EvaluationInterval = 0 },
		func(c *Config) { c.ExternalLabels = map[string]string{"__name__": "x"} },
		func(c *Config) { c.ExternalURL = "/relative" },
	} {
		c := DefaultConfig()
		bad(&c)
		if c.Validate() == nil {
			t.Errorf("config %+v validated", c)
		}
	}

	// --alertmanager.url repeats, replaces the file's list, and parsing the
	// same arguments twice (as app.Load does) gives the same list.
	c := DefaultConfig()
	c.Alertmanager.URLs = []string{"http://from-file:9093"}
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	c.RegisterFlags(fs)
	args := []string{"--alertmanager.url=http://a:9093", "--alertmanager.url=http://b:9093", "--rules.evaluation-interval=15s", "--rules.gpu-pack=false"}
	for range 2 {
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(c.Alertmanager.URLs, []string{"http://a:9093", "http://b:9093"}) {
		t.Errorf("urls = %v", c.Alertmanager.URLs)
	}
	if c.EvaluationInterval != model.Duration(15*time.Second) || c.GPUPack {
		t.Errorf("flags not applied: %+v", c)
	}
}

// A tenant whose file is broken at start-up runs the GPU pack only, its
// gauge stays 0 (also after the tenant polls), and other tenants load.
func TestBrokenFileAtStartup(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.GPUPack = true })
	e.writeRules("team-a", "broken.yml", "groups:\n  - name: b\n    rules:\n      - record: x\n        expr: sum(\n")
	e.writeRules("team-b", "temps.yml", maxTempRules)
	e.appendTemps("team-a", "node-1", []float64{50}, time.Now())
	e.appendTemps("team-b", "node-1", []float64{50}, time.Now())
	e.start()
	gauge := func(tenantID string) float64 {
		return testutil.ToFloat64(e.ruler.reloadSuccess.WithLabelValues(tenantID))
	}
	// The tenant polls must not reset the gauge. Run them here (the ticker
	// runs the same sync) rather than sleep and hope that some ran.
	for range 2 {
		if err := e.ruler.sync(false); err != nil {
			t.Fatalf("tenant poll: %v", err)
		}
	}
	if gauge("team-a") != 0 || gauge("team-b") != 1 {
		t.Errorf("gauges: team-a %v (want 0), team-b %v (want 1)", gauge("team-a"), gauge("team-b"))
	}
	for _, g := range e.groupNames("team-a") {
		if !strings.HasPrefix(g, PackPrefix) {
			t.Errorf("team-a runs %s from its broken files", g)
		}
	}
	if n, want := len(e.groupNames("team-a")), len(e.groupNames("team-b"))-1; n != want {
		t.Errorf("team-a has %d groups, want the pack's %d", n, want)
	}
}

// TestShardedRuler: with Options.Owns a ruler evaluates only its groups
// (with the ring, the receivers share them out), and when Ownership
// changes (the ring changed) the groups move at the next tenant poll.
func TestShardedRuler(t *testing.T) {
	var mine atomic.Value // the group names this ruler owns, a map[string]bool
	mine.Store(map[string]bool{"temps": true})
	var version, polls atomic.Int64
	e := newEnv(t, func(c *Config) { c.GPUPack = true })
	e.replaceRuler(func(o *Options) {
		o.Owns = func(_, _, group string) bool { return mine.Load().(map[string]bool)[group] }
		o.Ownership = func() string { polls.Add(1); return fmt.Sprint(version.Load()) }
	})
	e.appendTemps("team-a", "node-1", []float64{50}, time.Now())
	e.writeRules("team-a", "temps.yml", maxTempRules)
	e.start()
	names := func() []string {
		var out []string
		for _, g := range e.groupNames("team-a") {
			_, name, _ := strings.Cut(g, ";")
			out = append(out, name)
		}
		return out
	}
	if got := names(); !slices.Equal(got, []string{"temps"}) {
		t.Fatalf("owning temps only, the ruler evaluates %v", got)
	}
	mine.Store(map[string]bool{"gpu_recording": true, "node_alerts": true})
	// Polls without a ring change: nothing moves.
	seen := polls.Load()
	waitFor(t, 5*time.Second, "three polls", func() error {
		if polls.Load() < seen+3 {
			return fmt.Errorf("%d polls", polls.Load()-seen)
		}
		return nil
	})
	if got := names(); !slices.Equal(got, []string{"temps"}) {
		t.Fatalf("groups moved without a ring change: %v", got)
	}
	version.Add(1)
	waitFor(t, 5*time.Second, "the groups moved with the ring", func() error {
		if got := names(); !slices.Equal(got, []string{"gpu_recording", "node_alerts"}) {
			return fmt.Errorf("groups %v, want gpu_recording and node_alerts", got)
		}
		return nil
	})
}

// TestDataTenants: a ruler of its own (the ring) holds no tenant's data; the
// tenants the receivers hold get the GPU pack, and keep it through a full
// reload whose list misses them (a receiver that did not answer).
func TestDataTenants(t *testing.T) {
	var data atomic.Value // []string
	data.Store([]string{})
	var version atomic.Int64
	e := newEnv(t, func(c *Config) { c.GPUPack = true })
	e.replaceRuler(func(o *Options) {
		o.DataTenants = func() []string { return data.Load().([]string) }
		o.Ownership = func() string { return fmt.Sprint(version.Load()) }
	})
	e.appendTemps("local", "node-1", []float64{50}, time.Now()) // in DBs, not in DataTenants
	e.start()
	packGroups := len(rulepack.Files())
	if got := e.groupNames("local"); len(got) != 0 {
		t.Errorf("a tenant of the ruler's own DBs but not in DataTenants got %d groups", len(got))
	}
	e.appendTemps("remote", "node-1", []float64{50}, time.Now()) // its GPU data, read through the queryable
	data.Store([]string{"remote"})
	waitFor(t, 5*time.Second, "the pack for a tenant the receivers hold", func() error {
		if got := len(e.groupNames("remote")); got < packGroups {
			return fmt.Errorf("%d groups", got)
		}
		return nil
	})
	want := len(e.groupNames("remote"))
	reloaded := func() float64 { return testutil.ToFloat64(e.ruler.reloadTime.WithLabelValues("remote")) }
	before := reloaded()
	data.Store([]string{})
	version.Add(1) // a ring change: every tenant is loaded again
	waitFor(t, 5*time.Second, "the full reload after the ring change", func() error {
		if reloaded() <= before {
			return fmt.Errorf("remote last loaded at %v", before)
		}
		return nil
	})
	if got := len(e.groupNames("remote")); got != want {
		t.Errorf("after a full reload whose tenant list missed it: %d groups, want %d", got, want)
	}
}

// TestGPUPackOnlyForGPUData: a tenant whose data has no dcgm-exporter
// series (node-exporter's here) gets no pack (rules that would record and
// alert nothing of it), and gets it at the next poll once it sends GPU
// data.
func TestGPUPackOnlyForGPUData(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.GPUPack = true })
	db, err := e.dbs.Get("nodes-only")
	if err != nil {
		t.Fatal(err)
	}
	app := db.AppenderV2(context.Background())
	if _, err := app.Append(0, labels.FromStrings("__name__", "up", "job", "node-exporter", "instance", "node-1:9100"), 0, time.Now().UnixMilli(), 1, nil, nil, storage.AOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := app.Commit(); err != nil {
		t.Fatal(err)
	}
	e.start()
	for range 2 { // the ticker's tenant polls, run here
		if err := e.ruler.sync(false); err != nil {
			t.Fatal(err)
		}
	}
	if got := e.groupNames("nodes-only"); len(got) != 0 {
		t.Errorf("a tenant without GPU data runs %d groups", len(got))
	}
	e.appendTemps("nodes-only", "node-1", []float64{50}, time.Now())
	waitFor(t, 5*time.Second, "the pack once the tenant sends GPU data", func() error {
		if got := len(e.groupNames("nodes-only")); got < len(rulepack.Files()) {
			return fmt.Errorf("%d groups", got)
		}
		return nil
	})
}
