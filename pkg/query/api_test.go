package query

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/metadata"

	"github.com/gpustore/gpustore/pkg/tenancy"
	"github.com/gpustore/gpustore/pkg/tenantdb"
)

type apiResponse struct {
	Status    string          `json:"status"`
	Data      json.RawMessage `json:"data"`
	ErrorType string          `json:"errorType"`
	Error     string          `json:"error"`
	Warnings  []string        `json:"warnings"`
}

// newTestAPI serves the query API over two tenants' TSDBs holding GPU series.
func newTestAPI(t testing.TB, mutate func(*Config)) (*httptest.Server, int64) {
	t.Helper()
	return newTestAPIWith(t, func(o *Options) {
		if mutate != nil {
			mutate(&o.Config)
		}
	})
}

// newTestAPIWith is newTestAPI with the API's options set by mutate.
func newTestAPIWith(t testing.TB, mutate func(*Options)) (*httptest.Server, int64) {
	t.Helper()
	h, now := newTestAPIHandler(t, mutate)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv, now
}

// newTestAPIHandler is the handler newTestAPIWith serves.
func newTestAPIHandler(t testing.TB, mutate func(*Options)) (http.Handler, int64) {
	t.Helper()
	cfg := tenantdb.DefaultConfig()
	cfg.Dir = t.TempDir()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	dbs, err := tenantdb.NewManager(cfg, logger, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dbs.Close() })
	now := time.Now().Truncate(time.Minute).UnixMilli()
	for tenant, gpus := range map[string]int{"default": 8, "team-b": 2} {
		db, err := dbs.Get(tenant)
		if err != nil {
			t.Fatal(err)
		}
		app := db.Appender(context.Background())
		for g := 0; g < gpus; g++ {
			for i := int64(19); i >= 0; i-- { // oldest first
				ls := labels.FromStrings("__name__", "DCGM_FI_DEV_GPU_TEMP", "Hostname", "node-1", "gpu", string(rune('0'+g)))
				if _, err := app.Append(0, ls, now-i*15000, float64(60+g)); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := app.Commit(); err != nil {
			t.Fatal(err)
		}
		db.Metadata.Set("DCGM_FI_DEV_GPU_TEMP", metadata.Metadata{Type: model.MetricTypeGauge, Help: "GPU temperature (in C)."})
	}
	opts := Options{
		Config: DefaultConfig(), Tenants: tenancy.DefaultConfig(), DBs: dbs, Logger: logger, Registry: prometheus.NewRegistry(),
		Ready: func() error { return nil }, ActiveQueryDir: t.TempDir(),
	}
	mutate(&opts)
	api, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	api.RegisterRoutes(mux)
	return mux, now
}

func call(t testing.TB, srv *httptest.Server, method, path string, params url.Values, headers ...string) (int, apiResponse) {
	t.Helper()
	var req *http.Request
	if method == http.MethodPost {
		req, _ = http.NewRequest(method, srv.URL+path, strings.NewReader(params.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	} else {
		req, _ = http.NewRequest(method, srv.URL+path+"?"+params.Encode(), nil)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r apiResponse
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatalf("%s %s: not Prometheus' JSON envelope: %v", method, path, err)
	}
	return resp.StatusCode, r
}

func TestAPIEndpoints(t *testing.T) {
	srv, now := newTestAPI(t, nil)
	ts := func(ms int64) string { return time.UnixMilli(ms).UTC().Format(time.RFC3339) }
	for _, c := range []struct {
		method, path string
		params       url.Values
		want         string // a fragment of the data
	}{
		{"GET", "/api/v1/query", url.Values{"query": {"count(DCGM_FI_DEV_GPU_TEMP)"}, "time": {ts(now)}}, `"8"`},
		{"POST", "/api/v1/query", url.Values{"query": {"max(DCGM_FI_DEV_GPU_TEMP)"}, "time": {ts(now)}}, `"67"`},
		{"GET", "/api/v1/query_range", url.Values{"query": {"min(DCGM_FI_DEV_GPU_TEMP)"}, "start": {ts(now - 60000)}, "end": {ts(now)}, "step": {"15s"}}, `"resultType":"matrix"`},
		{"GET", "/api/v1/series", url.Values{"match[]": {`DCGM_FI_DEV_GPU_TEMP{gpu="3"}`}}, `"gpu":"3"`},
		{"GET", "/api/v1/labels", nil, `"Hostname"`},
		{"GET", "/api/v1/label/gpu/values", nil, `"7"`},
		{"GET", "/api/v1/metadata", url.Values{"metric": {"DCGM_FI_DEV_GPU_TEMP"}}, `"type":"gauge"`},
		{"GET", "/api/v1/query_exemplars", url.Values{"query": {"DCGM_FI_DEV_GPU_TEMP"}, "start": {ts(now - 60000)}, "end": {ts(now)}}, `[]`},
		{"GET", "/api/v1/format_query", url.Values{"query": {"sum by(gpu)(rate(x[5m]))"}}, `sum by (gpu) (rate(x[5m]))`},
		{"GET", "/api/v1/parse_query", url.Values{"query": {"up"}}, `"type":"vectorSelector"`},
		{"GET", "/api/v1/status/buildinfo", nil, `"version"`},
	} {
		code, r := call(t, srv, c.method, c.path, c.params)
		if code != http.StatusOK || r.Status != "success" || !strings.Contains(string(r.Data), c.want) {
			t.Errorf("%s %s: %d %s %s: data %s, want it to contain %s", c.method, c.path, code, r.Status, r.Error, r.Data, c.want)
		}
	}
}

func TestAPITenants(t *testing.T) {
	srv, now := newTestAPI(t, nil)
	q := url.Values{"query": {"count(DCGM_FI_DEV_GPU_TEMP)"}, "time": {time.UnixMilli(now).UTC().Format(time.RFC3339)}}
	for _, c := range []struct {
		headers []string
		want    string
	}{
		{nil, `"8"`},
		{[]string{tenancy.OrgIDHeader, "team-b"}, `"2"`},
		{[]string{tenancy.ThanosTenantHeader, "team-b"}, `"2"`},
		{[]string{tenancy.OrgIDHeader, "nobody"}, `"result":[]`},
	} {
		code, r := call(t, srv, "GET", "/api/v1/query", q, c.headers...)
		if code != http.StatusOK || !strings.Contains(string(r.Data), c.want) {
			t.Errorf("%v: %d %s, want %s", c.headers, code, r.Data, c.want)
		}
	}
	if code, _ := call(t, srv, "GET", "/api/v1/query", q, tenancy.OrgIDHeader, "../x"); code != http.StatusBadRequest {
		t.Errorf("invalid tenant: %d", code)
	}
}

// The error codes Grafana and other clients act on: 400 bad parameters,
// 422 execution errors, 503 timeouts.
func TestAPIErrorCodes(t *testing.T) {
	srv, now := newTestAPI(t, func(c *Config) { c.MaxSamples = 10 })
	ts := time.UnixMilli(now).UTC().Format(time.RFC3339)
	for _, c := range []struct {
		params  url.Values
		code    int
		errType string
	}{
		{url.Values{"query": {"sum("}}, http.StatusBadRequest, "bad_data"},
		{url.Values{"query": {"up"}, "time": {"yesterday"}}, http.StatusBadRequest, "bad_data"},
		{url.Values{"query": {"up"}, "dedup": {"maybe"}}, http.StatusBadRequest, "bad_data"},
		{url.Values{"query": {"sum(count_over_time(DCGM_FI_DEV_GPU_TEMP[5m]))"}, "time": {ts}}, http.StatusUnprocessableEntity, "execution"},
	} {
		code, r := call(t, srv, "GET", "/api/v1/query", c.params)
		if code != c.code || r.Status != "error" || r.ErrorType != c.errType {
			t.Errorf("%v: %d %s %s (%s), want %d %s", c.params, code, r.Status, r.ErrorType, r.Error, c.code, c.errType)
		}
	}

	slow, now := newTestAPI(t, func(c *Config) { c.Timeout = model.Duration(time.Nanosecond) })
	code, r := call(t, slow, "GET", "/api/v1/query", url.Values{"query": {"count(DCGM_FI_DEV_GPU_TEMP)"}, "time": {time.UnixMilli(now).UTC().Format(time.RFC3339)}})
	if code != http.StatusServiceUnavailable || r.Status != "error" {
		t.Errorf("timeout: %d %s %s", code, r.ErrorType, r.Error)
	}
}

// A subquery of billions of steps is refused at once (400): Prometheus'
// engine sizes and walks per-step statistics for a subquery without looking
// at the query's deadline, so it would hold a core long past query.timeout.
// A subquery of ordinary size still runs.
func TestSubqueryStepsBounded(t *testing.T) {
	srv, now := newTestAPI(t, func(c *Config) { c.Timeout = model.Duration(2 * time.Second) })
	client := &http.Client{Timeout: 10 * time.Second}
	at := time.UnixMilli(now).UTC().Format(time.RFC3339)
	for _, c := range []struct {
		path, query string
		code        int
	}{
		{"/api/v1/query", "count_over_time(DCGM_FI_DEV_GPU_TEMP[100y:1s])", http.StatusBadRequest},
		{"/api/v1/query_range", "count_over_time(DCGM_FI_DEV_GPU_TEMP[100y:1s])", http.StatusBadRequest},
		{"/api/v1/query", "max_over_time(rate(DCGM_FI_DEV_GPU_TEMP[5m:1s])[20y:])", http.StatusBadRequest}, // default step 1m
		{"/api/v1/query", "max_over_time(DCGM_FI_DEV_GPU_TEMP[1h:1m])", http.StatusOK},
		{"/api/v1/query", "max_over_time(DCGM_FI_DEV_GPU_TEMP[1d:])", http.StatusOK},
	} {
		p := url.Values{"query": {c.query}, "time": {at}, "start": {"0"}, "end": {"1"}, "step": {"1"}}
		began := time.Now()
		resp, err := client.Get(srv.URL + c.path + "?" + p.Encode())
		if err != nil {
			t.Fatalf("%s %s: %v", c.path, c.query, err)
		}
		var r apiResponse
		_ = json.NewDecoder(resp.Body).Decode(&r)
		resp.Body.Close()
		if resp.StatusCode != c.code {
			t.Errorf("%s %s: %d %s %s, want %d", c.path, c.query, resp.StatusCode, r.ErrorType, r.Error, c.code)
		}
		if c.code == http.StatusBadRequest && r.ErrorType != "bad_data" {
			t.Errorf("%s %s: error type %q", c.path, c.query, r.ErrorType)
		}
		if d := time.Since(began); d > 3*time.Second {
			t.Errorf("%s %s took %s", c.path, c.query, d)
		}
	}
}

// metadataSource is a MetadataSource answering fixed metadata and error
// (ringread.Source, the real one, is tested against real receivers in
// pkg/ringread and end to end in test/e2e).
type metadataSource struct {
	m   map[string]metadata.Metadata
	err error
}

func (s metadataSource) Metadata(context.Context, string) (map[string]metadata.Metadata, error) {
	return maps.Clone(s.m), s.err
}

// TestMetadataFromSource: /api/v1/metadata adds the source's families to the
// local TSDB's (limit and metric apply to the union), shows a partial
// answer's error as a warning, and answers 503 when neither the source nor
// the local TSDB has anything to answer with.
func TestMetadataFromSource(t *testing.T) {
	power := metadata.Metadata{Type: model.MetricTypeGauge, Help: "Power draw (in W).", Unit: "watts"}
	src := metadataSource{m: map[string]metadata.Metadata{"DCGM_FI_DEV_POWER_USAGE": power}}
	srv, _ := newTestAPIWith(t, func(o *Options) { o.Metadata = src })
	code, r := call(t, srv, "GET", "/api/v1/metadata", nil)
	var got map[string][]metadata.Metadata
	if err := json.Unmarshal(r.Data, &got); code != http.StatusOK || err != nil || len(got) != 2 ||
		got["DCGM_FI_DEV_POWER_USAGE"][0] != power || got["DCGM_FI_DEV_GPU_TEMP"][0].Type != model.MetricTypeGauge {
		t.Fatalf("metadata: %d %v %s; want the local TEMP and the source's POWER", code, err, r.Data)
	}
	if _, r := call(t, srv, "GET", "/api/v1/metadata", url.Values{"limit": {"1"}}); !strings.Contains(string(r.Data), "GPU_TEMP") || strings.Contains(string(r.Data), "POWER") {
		t.Errorf("limit=1: %s, want the first family by name only", r.Data)
	}
	if _, r := call(t, srv, "GET", "/api/v1/metadata", url.Values{"metric": {"DCGM_FI_DEV_POWER_USAGE"}}); !strings.Contains(string(r.Data), "watts") || strings.Contains(string(r.Data), "TEMP") {
		t.Errorf("metric=POWER: %s", r.Data)
	}

	partial := metadataSource{m: src.m, err: errors.New("receiver r2 down")}
	srv, _ = newTestAPIWith(t, func(o *Options) { o.Metadata = partial })
	if code, r := call(t, srv, "GET", "/api/v1/metadata", nil); code != http.StatusOK || !strings.Contains(string(r.Data), "POWER") || len(r.Warnings) != 1 {
		t.Errorf("partial: %d %s warnings %v; want the data and one warning", code, r.Data, r.Warnings)
	}
	srv, _ = newTestAPIWith(t, func(o *Options) { o.Metadata = metadataSource{err: errors.New("no receiver answered")} })
	if code, r := call(t, srv, "GET", "/api/v1/metadata", nil); code != http.StatusOK || !strings.Contains(string(r.Data), "GPU_TEMP") || len(r.Warnings) != 1 {
		t.Errorf("source down, local data: %d %s warnings %v; want the local data and a warning", code, r.Data, r.Warnings)
	}
	if code, r := call(t, srv, "GET", "/api/v1/metadata", nil, "X-Scope-OrgID", "team-c"); code != http.StatusServiceUnavailable || r.ErrorType != "unavailable" {
		t.Errorf("source down, no local data: %d %s, want 503 unavailable", code, r.ErrorType)
	}
}
