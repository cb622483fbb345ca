package query

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
)

// fuzzRoutes are the query API's routes that read request parameters.
var fuzzRoutes = []string{
	"/api/v1/query", "/api/v1/query_range", "/api/v1/series", "/api/v1/labels", "/api/v1/label/__name__/values",
	"/api/v1/label/gpu/values", "/api/v1/metadata", "/api/v1/query_exemplars", "/api/v1/format_query", "/api/v1/status/tsdb",
}

// parsesPromQL are the routes that read PromQL from query or match[]
// (bounded before parsing: bounds.go).
var parsesPromQL = map[string]bool{
	"/api/v1/query": true, "/api/v1/query_range": true, "/api/v1/series": true, "/api/v1/labels": true,
	"/api/v1/label/__name__/values": true, "/api/v1/label/gpu/values": true, "/api/v1/query_exemplars": true,
	"/api/v1/format_query": true,
}

// acceptsPost are the routes Prometheus serves to POST as well as GET.
var acceptsPost = map[string]bool{
	"/api/v1/query": true, "/api/v1/query_range": true, "/api/v1/series": true, "/api/v1/labels": true,
	"/api/v1/query_exemplars": true, "/api/v1/format_query": true,
}

func rawCall(t *testing.T, srv *httptest.Server, method, path string, params url.Values) (int, []byte) {
	t.Helper()
	var req *http.Request
	if method == http.MethodPost {
		req, _ = http.NewRequest(method, srv.URL+path, strings.NewReader(params.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	} else {
		req, _ = http.NewRequest(method, srv.URL+path+"?"+params.Encode(), nil)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// FuzzQueryParams: whatever parameters a client sends to any query route
// (expression, times, step, dedup, max_source_resolution, limits, GET or
// POST), the answer is Prometheus' JSON envelope, "success" with 200 or
// "error" with an error type and a 4xx (or 503 for a query cut by the
// timeout); never a 500, a panic or a hang.
func FuzzQueryParams(f *testing.F) {
	now := time.Now().Unix()
	for _, s := range []struct {
		route                                          uint8
		query, tm, start, end, step, dedup, res, limit string
		post                                           bool
	}{
		{0, "DCGM_FI_DEV_GPU_TEMP", "", "", "", "", "", "", "", false},
		{1, "rate(DCGM_FI_DEV_GPU_TEMP[1m])", "", "-1", "9999999999", "15", "false", "auto", "", true},
		{1, "up", "", "2026-01-01T00:00:00Z", "2025-01-01T00:00:00Z", "0.001", "", "", "", false},
		{0, "sum(", "yesterday", "", "", "", "maybe", "10s", "-1", false},
		{2, "{gpu=~\"(\"}", "", "NaN", "+Inf", "", "", "", "1", false},
		{3, "{__name__=~\".+\"}", "", "", "", "", "", "raw", "0", true},
		{4, "", "", "-9223372036854775808", "9223372036854775807", "", "", "1h", "", false},
		{7, "DCGM_FI_DEV_GPU_TEMP", "", "1e300", "-1e300", "", "", "5m", "", false},
		{1, "count_over_time(DCGM_FI_DEV_GPU_TEMP[100y:1s])", "", "0", "1", "1", "", "", "", false},
		{0, "DCGM_FI_DEV_GPU_TEMP\xff\xfe", "\x00", "", "", "", "true", "\xff", "", false},
		{8, "sum by (gpu) (DCGM_FI_DEV_GPU_TEMP)", "", "", "", "", "", "", "", false},
		// Parse bombs (internal/abuse), answered 400 before they are parsed.
		{8, strings.Repeat("(", 2000) + "x" + strings.Repeat(")", 2000), "", "", "", "", "", "", "", true},
		{0, strings.Repeat("(", 100_000) + "x" + strings.Repeat(")", 100_000), "", "", "", "", "", "", "", true},
		{1, "x" + strings.Repeat(" + x", 5000), "", "", "", "60", "", "", "", true},
		{2, strings.Repeat("-", 50_000) + "x", "", "", "", "", "", "", "", true},
		{3, `{__name__=~"` + strings.Repeat("a|", 150_000) + `b"}`, "", "", "", "", "", "", "", true},
		{7, strings.Repeat("abs(", 3000) + "x", "", "", "", "", "", "", "", true},
	} {
		tm := s.tm
		if tm == "" {
			tm = time.Unix(now, 0).UTC().Format(time.RFC3339)
		}
		f.Add(s.route, s.query, tm, s.start, s.end, s.step, s.dedup, s.res, s.limit, s.post)
	}
	srv, _ := newTestAPI(f, func(c *Config) {
		c.Timeout = model.Duration(2 * time.Second)
		c.MaxSamples = 100_000
	})
	f.Fuzz(func(t *testing.T, route uint8, query, tm, start, end, step, dedup, res, limit string, post bool) {
		path := fuzzRoutes[int(route)%len(fuzzRoutes)]
		p := url.Values{"query": {query}, "match[]": {query}, "time": {tm}, "start": {start}, "end": {end}, "step": {step},
			"dedup": {dedup}, "max_source_resolution": {res}, "limit": {limit}}
		method := http.MethodGet
		if post {
			method = http.MethodPost
		}
		code, body := rawCall(t, srv, method, path, p)
		if code == http.StatusMethodNotAllowed && post && !acceptsPost[path] {
			return // Prometheus' router answers 405 in plain text, as Prometheus does
		}
		if code == http.StatusRequestHeaderFieldsTooLarge && method == http.MethodGet {
			return // net/http's answer to a URL past the server's header bytes, before any route (a parse bomb sent by GET)
		}
		if code == http.StatusNoContent && len(body) == 0 && path == "/api/v1/query_exemplars" && noSelectors(query) {
			return // Prometheus' answer to an exemplar query that selects nothing (e.g. "0")
		}
		var r apiResponse
		if err := json.Unmarshal(body, &r); err != nil {
			t.Fatalf("%s %s %v: %d, not Prometheus' JSON envelope: %.200s", method, path, p, code, body)
		}
		if checkExprBounds(query, defaultMaxExpressionBytes, defaultMaxExpressionDepth) != nil && parsesPromQL[path] &&
			(code != http.StatusBadRequest || r.ErrorType != "bad_data" || !strings.Contains(r.Error, "query.max_expression_")) {
			t.Fatalf("%s %s: an expression past the bounds got %d %s %q, want 400 bad_data naming the bound", method, path, code, r.ErrorType, r.Error)
		}
		switch {
		case code == http.StatusOK && r.Status == "success":
		case code >= 400 && code < 500 && r.Status == "error" && r.ErrorType != "":
		case code == http.StatusServiceUnavailable && r.Status == "error":
		default:
			t.Fatalf("%s %s %v: %d %s %s %s", method, path, p, code, r.Status, r.ErrorType, r.Error)
		}
	})
}

// noSelectors reports whether query parses to an expression without series
// selectors.
func noSelectors(query string) bool {
	expr, err := parser.NewParser(parser.Options{}).ParseExpr(query)
	return err == nil && len(parser.ExtractSelectors(expr)) == 0
}
