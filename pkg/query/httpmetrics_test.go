package query

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpustore/gpustore/pkg/tenancy"
)

// The query API counts and times its requests by Prometheus' route name and
// status code: label values and random label names in the path do not make
// new handler values, an unknown path is "other", and answers given before
// the router (a bad tenant, a subquery over the bound) are counted under
// their route with their code.
func TestQueryHTTPMetrics(t *testing.T) {
	var reg *prometheus.Registry
	srv, now := newTestAPIWith(t, func(o *Options) { reg = o.Registry })
	at := time.UnixMilli(now).UTC().Format(time.RFC3339)
	rnd := rand.New(rand.NewPCG(uint64(now), 32))

	want := map[[2]string]int{} // handler, code → requests
	do := func(method, path string, params url.Values, wantCode int, handler string, headers ...string) {
		t.Helper()
		if code, _ := call(t, srv, method, path, params, headers...); code != wantCode {
			t.Fatalf("%s %s %v: %d, want %d", method, path, params, code, wantCode)
		}
		want[[2]string{handler, fmt.Sprint(wantCode)}]++
	}
	get := func(path string, params url.Values, code int, handler string) {
		t.Helper()
		do(http.MethodGet, path, params, code, handler)
	}
	get("/api/v1/query", url.Values{"query": {"count(DCGM_FI_DEV_GPU_TEMP)"}, "time": {at}}, 200, "/api/v1/query")
	do(http.MethodPost, "/api/v1/query", url.Values{"query": {"max(DCGM_FI_DEV_GPU_TEMP)"}, "time": {at}}, 200, "/api/v1/query")
	get("/api/v1/query", url.Values{"query": {"sum("}}, 400, "/api/v1/query")
	get("/api/v1/query", url.Values{"query": {"x[100y:1s]"}}, 400, "/api/v1/query") // refused before the tenant is read
	do(http.MethodGet, "/api/v1/query", url.Values{"query": {"up"}}, 400, "/api/v1/query", tenancy.OrgIDHeader, "../x")
	get("/api/v1/query_range", url.Values{"query": {"min(DCGM_FI_DEV_GPU_TEMP)"}, "start": {at}, "end": {at}, "step": {"15s"}}, 200, "/api/v1/query_range")
	for range 5 {
		name := fmt.Sprintf("label_%x", rnd.Uint64())
		get("/api/v1/label/"+name+"/values", nil, 200, "/api/v1/label/:name/values")
	}
	get("/api/v1/labels", nil, 200, "/api/v1/labels")
	get("/api/v1/series", url.Values{"match[]": {"DCGM_FI_DEV_GPU_TEMP"}}, 200, "/api/v1/series")
	get("/api/v1/metadata", nil, 200, "/api/v1/metadata") // gpustore's own handler
	get("/api/v1/status/tsdb", nil, 200, "/api/v1/status/tsdb")
	get("/api/v1/status/buildinfo", nil, 200, "/api/v1/status/buildinfo")
	for range 3 {
		resp, err := http.Get(srv.URL + fmt.Sprintf("/api/v1/no_such_route_%x", rnd.Uint64()))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("unknown route: %d, want 404", resp.StatusCode)
		}
		want[[2]string{"other", "404"}]++
	}

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got, observed := map[[2]string]int{}, map[string]uint64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "gpustore_query_http_requests_total":
				got[[2]string{label(m, "handler"), label(m, "code")}] = int(m.GetCounter().GetValue())
			case "gpustore_query_http_request_duration_seconds":
				observed[label(m, "handler")] = m.GetHistogram().GetSampleCount()
			}
		}
	}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("requests{handler=%q, code=%q} = %d, want %d", k[0], k[1], got[k], n)
		}
	}
	for k, n := range got {
		if want[k] == 0 {
			t.Errorf("unexpected requests{handler=%q, code=%q} = %d", k[0], k[1], n)
		}
	}
	perHandler := map[string]uint64{}
	for k, n := range want {
		perHandler[k[0]] += uint64(n)
	}
	for h, n := range perHandler {
		if observed[h] != n {
			t.Errorf("duration{handler=%q} has %d observations, want %d", h, observed[h], n)
		}
	}
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// Every route Prometheus' API registers is a handler name, and a path of
// each resolves to its own route.
func TestQueryHTTPRouteNames(t *testing.T) {
	m := newHTTPMetrics(nil, []string{"/api/v1/*path", "/api/v1/query", "/api/v1/label/:name/values", "/api/v1/labels", "/api/v1/status/tsdb", "/api/v1/status/tsdb/blocks"})
	for path, want := range map[string]string{
		"/api/v1/query":               "/api/v1/query",
		"/api/v1/label/gpu/values":    "/api/v1/label/:name/values",
		"/api/v1/label//values":       "other",
		"/api/v1/label/a/b/values":    "other",
		"/api/v1/labels":              "/api/v1/labels",
		"/api/v1/status/tsdb":         "/api/v1/status/tsdb",
		"/api/v1/status/tsdb/blocks":  "/api/v1/status/tsdb/blocks",
		"/api/v1/status/tsdb/blocks/": "other",
		"/api/v1/anything":            "other",
	} {
		if got := m.route(path); got != want {
			t.Errorf("route(%q) = %q, want %q", path, got, want)
		}
	}
}
