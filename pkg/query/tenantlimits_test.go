package query

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/grafana/dskit/services"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"

	"github.com/gpustore/gpustore/pkg/limits"
	"github.com/gpustore/gpustore/pkg/tenancy"
	"github.com/gpustore/gpustore/pkg/tenantdb"
)

// dcgmMetrics are dcgm-exporter fields a GPU node sends.
var dcgmMetrics = []string{"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_FB_USED"}

// dcgmSeries is a DCGM series as dcgm-exporter sends it through a
// Kubernetes scrape: the GPU's labels and the pod using it.
func dcgmSeries(metric string, node, gpu int, pod string) labels.Labels {
	return labels.FromStrings(
		"__name__", metric, "gpu", strconv.Itoa(gpu), "UUID", fmt.Sprintf("GPU-%04x-%02d", node, gpu),
		"device", "nvidia"+strconv.Itoa(gpu), "modelName", "NVIDIA H100 80GB HBM3", "Hostname", fmt.Sprintf("gpu-node-%03d", node),
		"DCGM_FI_DRIVER_VERSION", "550.54.15", "pod", pod, "namespace", "training", "container", "trainer",
		"cluster", "prod", "job", "dcgm-exporter", "instance", fmt.Sprintf("10.0.%d.%d:9400", node/250, node%250))
}

// limitedAPI serves the query API over tenants' TSDBs with the limits of
// an overrides file the test may rewrite (reloaded every 50 ms).
type limitedAPI struct {
	srv       *httptest.Server
	overrides string // the file's path
	limits    *limits.Overrides
	dbs       *tenantdb.Manager
	now       int64
}

// newLimitedAPI writes nodes × 8 GPUs × dcgmMetrics for each tenant over
// the last hour at 1 m, cut into 30-minute blocks (the head keeps the
// last), and serves them with overrides as the limits file.
func newLimitedAPI(t *testing.T, overrides string, nodes map[string]int, mutate func(*Options)) *limitedAPI {
	t.Helper()
	ctx := context.Background()
	cfg := tenantdb.DefaultConfig()
	cfg.Dir = t.TempDir()
	cfg.BlockDuration = model.Duration(30 * time.Minute)
	logger := slog.New(slog.DiscardHandler)
	dbs, err := tenantdb.NewManager(cfg, logger, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dbs.Close() })
	now := time.Now().Truncate(time.Minute).UnixMilli()
	for tenant, n := range nodes {
		db, err := dbs.Get(tenant)
		if err != nil {
			t.Fatal(err)
		}
		for ts := now - time.Hour.Milliseconds(); ts <= now; ts += 60_000 {
			app := db.Appender(ctx)
			for node := range n {
				for gpu := range 8 {
					pod := fmt.Sprintf("llm-train-%d-worker-%d", node/2, node%2)
					for i, m := range dcgmMetrics {
						if _, err := app.Append(0, dcgmSeries(m, node, gpu, pod), ts, float64(ts/60_000%100+int64(i))); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
			if err := app.Commit(); err != nil {
				t.Fatal(err)
			}
		}
		if err := db.Compact(ctx); err != nil {
			t.Fatal(err)
		}
		if len(db.Blocks()) == 0 {
			t.Fatalf("tenant %s: no blocks cut", tenant)
		}
	}
	path := filepath.Join(t.TempDir(), "overrides.yaml")
	if err := os.WriteFile(path, []byte(overrides), 0o644); err != nil {
		t.Fatal(err)
	}
	lcfg := limits.DefaultConfig()
	lcfg.OverridesFile, lcfg.ReloadPeriod = path, model.Duration(50*time.Millisecond)
	lim, err := limits.New(lcfg, logger, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	if err := services.StartAndAwaitRunning(ctx, lim); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = services.StopAndAwaitTerminated(context.Background(), lim) })
	opts := Options{
		Config: DefaultConfig(), Tenants: tenancy.DefaultConfig(), DBs: dbs, Logger: logger, Registry: prometheus.NewRegistry(),
		Ready: func() error { return nil }, ActiveQueryDir: t.TempDir(), Limits: lim,
	}
	if mutate != nil {
		mutate(&opts)
	}
	api, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	api.RegisterRoutes(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &limitedAPI{srv: srv, overrides: path, limits: lim, dbs: dbs, now: now}
}

// setOverrides rewrites the limits file and waits until tenant's limits
// are what check says.
func (a *limitedAPI) setOverrides(t *testing.T, content, tenant string, check func(limits.QueryLimits) bool) {
	t.Helper()
	if err := os.WriteFile(a.overrides, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !check(a.limits.QueryLimits(tenant)) {
		if time.Now().After(deadline) {
			t.Fatal("the overrides file was not reloaded")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// rangeQuery asks a range query of the last hour as tenant, at a step and
// an offset Grafana could send.
func (a *limitedAPI) rangeQuery(t *testing.T, rng *rand.Rand, tenant, q string) (int, apiResponse) {
	t.Helper()
	step := []int64{15, 30, 60, 120}[rng.IntN(4)]
	end := a.now - rng.Int64N(60)*1000
	params := url.Values{"query": {q}, "start": {strconv.FormatInt((end-time.Hour.Milliseconds())/1000, 10)},
		"end": {strconv.FormatInt(end/1000, 10)}, "step": {strconv.FormatInt(step, 10)}}
	return call(t, a.srv, http.MethodPost, "/api/v1/query_range", params, "X-Scope-OrgID", tenant)
}

// podRates is a panel of each pod's rates of every DCGM metric: 128
// series of 4 nodes, through the pushed-down range functions.
const podRates = `sum by (pod) (rate(DCGM_FI_DEV_GPU_UTIL[5m])) + sum by (pod) (rate(DCGM_FI_DEV_POWER_USAGE[5m]))` +
	` + sum by (pod) (max_over_time(DCGM_FI_DEV_FB_USED[5m])) + sum by (pod) (avg_over_time(DCGM_FI_DEV_GPU_TEMP[5m]))`

// TestTenantMaxFetchedSeries: a tenant whose max_fetched_series_per_query
// is below what {__name__=~"DCGM.*"} matches is answered 422 with the
// limit named, on the engine's path and the pushed-down one, while a
// query within it and the other tenants' queries are answered; a reload
// of the limits file raises the bound without a restart.
func TestTenantMaxFetchedSeries(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const over = "overrides:\n  gpu-prod:\n    max_fetched_series_per_query: 100\n"
	a := newLimitedAPI(t, over, map[string]int{"gpu-prod": 4, "lab": 4}, nil) // 4 nodes × 8 GPUs × 4 metrics: 128 series each
	for _, q := range []string{`{__name__=~"DCGM.*"}`, `count by (Hostname) ({__name__=~"DCGM.*"})`, podRates} {
		code, r := a.rangeQuery(t, rng, "gpu-prod", q)
		if code != http.StatusUnprocessableEntity || r.ErrorType != "execution" || !strings.Contains(r.Error, "max_fetched_series_per_query") {
			t.Errorf("%s over the limit: %d %s %q, want 422 execution naming max_fetched_series_per_query", q, code, r.ErrorType, r.Error)
		}
		if code, r := a.rangeQuery(t, rng, "lab", q); code != http.StatusOK {
			t.Errorf("%s of another tenant: %d %q", q, code, r.Error)
		}
	}
	// One metric of every GPU (32 series) is within the limit.
	if code, r := a.rangeQuery(t, rng, "gpu-prod", `avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL{pod=~".+"})`); code != http.StatusOK {
		t.Errorf("a query within the limit: %d %q", code, r.Error)
	}
	// Two selectors of the same series count them once: 64 distinct series.
	if code, r := a.rangeQuery(t, rng, "gpu-prod", `DCGM_FI_DEV_GPU_UTIL / on(UUID) group_left DCGM_FI_DEV_GPU_UTIL + on(UUID) group_left DCGM_FI_DEV_POWER_USAGE`); code != http.StatusOK {
		t.Errorf("a series selected twice is fetched once: %d %q", code, r.Error)
	}
	// The series API is bounded too.
	code, r := call(t, a.srv, http.MethodGet, "/api/v1/series", url.Values{"match[]": {`{__name__=~"DCGM.*"}`}}, "X-Scope-OrgID", "gpu-prod")
	if code != http.StatusUnprocessableEntity {
		t.Errorf("series over the limit: %d %q", code, r.Error)
	}
	a.setOverrides(t, "overrides:\n  gpu-prod:\n    max_fetched_series_per_query: 1000\n", "gpu-prod", func(l limits.QueryLimits) bool { return l.MaxFetchedSeries == 1000 })
	if code, r := a.rangeQuery(t, rng, "gpu-prod", `{__name__=~"DCGM.*"}`); code != http.StatusOK {
		t.Errorf("after the limit was raised: %d %q", code, r.Error)
	}
}

// TestTenantMaxFetchedChunkBytes: the bytes of block chunks a query reads
// are bounded per tenant; a narrower query and other tenants are answered.
func TestTenantMaxFetchedChunkBytes(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const over = "overrides:\n  gpu-prod:\n    max_fetched_chunk_bytes_per_query: 5000\n"
	a := newLimitedAPI(t, over, map[string]int{"gpu-prod": 4, "lab": 4}, nil)
	for _, q := range []string{`{__name__=~"DCGM.*"}`, podRates} {
		code, r := a.rangeQuery(t, rng, "gpu-prod", q)
		if code != http.StatusUnprocessableEntity || !strings.Contains(r.Error, "max_fetched_chunk_bytes_per_query") {
			t.Errorf("%s over the limit: %d %s %q, want 422 naming max_fetched_chunk_bytes_per_query", q, code, r.ErrorType, r.Error)
		}
		if code, r := a.rangeQuery(t, rng, "lab", q); code != http.StatusOK {
			t.Errorf("%s of another tenant: %d %q", q, code, r.Error)
		}
	}
	if code, r := a.rangeQuery(t, rng, "gpu-prod", `DCGM_FI_DEV_GPU_TEMP{gpu="0", Hostname="gpu-node-001"}`); code != http.StatusOK {
		t.Errorf("one GPU's temperature: %d %q", code, r.Error)
	}
}

// TestTenantMaxSamplesPerQuery: a tenant's max_samples_per_query lowers
// (or raises) query.max_samples for its queries only, answered as
// Prometheus answers a query over max samples (422, execution).
func TestTenantMaxSamplesPerQuery(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	const over = "overrides:\n  gpu-prod:\n    max_samples_per_query: 100\n"
	a := newLimitedAPI(t, over, map[string]int{"gpu-prod": 2, "lab": 2}, nil)
	for _, q := range []string{`{__name__=~"DCGM.*"}`, `sum(rate(DCGM_FI_DEV_POWER_USAGE[5m]))`, `max_over_time(DCGM_FI_DEV_GPU_TEMP[10m])`} {
		code, r := a.rangeQuery(t, rng, "gpu-prod", q)
		if code != http.StatusUnprocessableEntity || r.ErrorType != "execution" || !strings.Contains(r.Error, "too many samples") {
			t.Errorf("%s over the tenant's max samples: %d %s %q", q, code, r.ErrorType, r.Error)
		}
		if code, r := a.rangeQuery(t, rng, "lab", q); code != http.StatusOK {
			t.Errorf("%s of another tenant: %d %q", q, code, r.Error)
		}
	}
}

// TestTenantQueryTimeout: a tenant's query_timeout ends its query with
// Prometheus' timeout answer (503) long before query.timeout.
func TestTenantQueryTimeout(t *testing.T) {
	stall := newStallingSource()
	const over = "overrides:\n  gpu-prod:\n    query_timeout: 300ms\n"
	a := newLimitedAPI(t, over, map[string]int{"gpu-prod": 1}, func(o *Options) {
		o.Sources = []Source{stall}
		o.Config.Timeout = model.Duration(20 * time.Second)
	})
	start := time.Now()
	code, r := call(t, a.srv, http.MethodGet, "/api/v1/query", url.Values{"query": {"stall"}}, "X-Scope-OrgID", "gpu-prod")
	if took := time.Since(start); code != http.StatusServiceUnavailable || r.ErrorType != "timeout" || took > 10*time.Second {
		t.Fatalf("a stalled query with query_timeout 300ms: %d %s %q after %v, want 503 timeout", code, r.ErrorType, r.Error, took)
	}
}

// TestTenantConcurrencyLeavesOthersUnaffected: one tenant's queries that
// take long (a dashboard of {__name__=~"DCGM.*"} over 90 days) fill the
// tenant's max_concurrent_queries and wait for its own slots, while
// another tenant's queries are answered at once from the process's.
func TestTenantConcurrencyLeavesOthersUnaffected(t *testing.T) {
	stall := newStallingSource()
	const over = "overrides:\n  gpu-prod:\n    max_concurrent_queries: 2\n"
	a := newLimitedAPI(t, over, map[string]int{"gpu-prod": 1, "lab": 2}, func(o *Options) {
		o.Config.MaxConcurrency = 4
		o.Sources = []Source{stall}
	})
	var wg sync.WaitGroup
	defer func() { close(stall.release); wg.Wait() }()
	const heavy = 8 // more than the process's slots
	for range heavy {
		wg.Go(func() {
			code, r := call(t, a.srv, http.MethodGet, "/api/v1/query", url.Values{"query": {"stall"}}, "X-Scope-OrgID", "gpu-prod")
			if code != http.StatusOK {
				t.Errorf("heavy query once released: %d %q", code, r.Error)
			}
		})
	}
	// The tenant's two slots are taken, its other queries wait.
	for range 2 {
		select {
		case <-stall.started:
		case <-time.After(10 * time.Second):
			t.Fatal("the heavy queries did not start")
		}
	}
	rng := rand.New(rand.NewPCG(7, 8))
	for i := range 10 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		params := url.Values{"query": {`avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)`}, "time": {strconv.FormatInt(a.now/1000-rng.Int64N(600), 10)}}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, a.srv.URL+"/api/v1/query?"+params.Encode(), nil)
		req.Header.Set("X-Scope-OrgID", "lab")
		resp, err := http.DefaultClient.Do(req)
		cancel()
		if err != nil {
			t.Fatalf("query %d of another tenant while one tenant's queries wait: %v", i, err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("query %d of another tenant: %d", i, resp.StatusCode)
		}
	}
	select {
	case <-stall.started:
		t.Fatal("a third query of the tenant ran past its max_concurrent_queries 2")
	default:
	}
}
