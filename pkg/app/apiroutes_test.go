package app

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/util/notifications"
)

// prometheusAPIRoutes lists the routes Prometheus' web/api/v1 registers
// (API.Register), read from the source of the Prometheus module this build
// uses, so that a route a Prometheus upgrade adds is swept too: method and
// path under /api/v1, path parameters as written (":name").
func prometheusAPIRoutes(t *testing.T) [][2]string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/prometheus/prometheus").Output()
	if err != nil {
		t.Fatalf("locate the Prometheus module: %v", err)
	}
	src, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "web", "api", "v1", "api.go"))
	if err != nil {
		t.Fatal(err)
	}
	body := string(src)
	start := strings.Index(body, "func (api *API) Register(")
	if start < 0 {
		t.Fatal("web/api/v1/api.go has no API.Register")
	}
	body = body[start:]
	end := strings.Index(body, "\n}\n")
	if end < 0 {
		t.Fatal("web/api/v1/api.go: API.Register has no end")
	}
	body = body[:end]
	var routes [][2]string
	for _, m := range regexp.MustCompile(`r\.(Get|Post|Put|Del|Options)\("([^"]+)"`).FindAllStringSubmatch(body, -1) {
		routes = append(routes, [2]string{strings.ToUpper(m[1]), m[2]})
	}
	if len(routes) < 50 {
		t.Fatalf("found only %d routes in API.Register: the pattern no longer matches Prometheus' source", len(routes))
	}
	return routes
}

// TestEveryPrometheusRouteAnswers sweeps every route Prometheus' v1 API
// registers, with every method and with and without the parameters the
// routes read, through the whole server (web config, tenant middleware,
// compression): none may panic, hang or answer 500. A 5xx tells clients
// and proxies to retry; a disabled admin or search endpoint is no fault of
// the server and never comes back by retrying (404, as Prometheus answers
// for its disabled receivers), and the notifications endpoints answer
// Prometheus' own way.
func TestEveryPrometheusRouteAnswers(t *testing.T) {
	cfg, _, err := Load(flag.NewFlagSet("gpustore", flag.ContinueOnError), []string{
		"-storage.tsdb.path=" + t.TempDir(), "-web.listen-address=127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	a := startApp(t, cfg)
	base := "http://" + a.Server.Addr().String() + "/api/v1"
	now := time.Now().UTC().Format(time.RFC3339)
	params := url.Values{
		"query": {"DCGM_FI_DEV_GPU_TEMP"}, "match[]": {"DCGM_FI_DEV_GPU_TEMP"}, "time": {now}, "start": {now},
		"end": {now}, "step": {"15"}, "scrapePool": {"gpu"}, "limit": {"5"},
	}
	routes := prometheusAPIRoutes(t)
	paths := map[string]bool{}
	for _, r := range routes {
		paths[strings.ReplaceAll(strings.ReplaceAll(r[1], ":name", "job"), "/*path", "/query")] = true
	}
	for _, p := range slices.Sorted(maps.Keys(paths)) {
		for _, method := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions} {
			for _, withParams := range []bool{false, true} {
				code, body, err := sweepCall(method, base+p, params, withParams)
				what := method + " /api/v1" + p
				if withParams {
					what += " (with parameters)"
				}
				switch {
				case err != nil:
					t.Errorf("%s: no answer (a panic closes the connection, a hang times out): %v", what, err)
				case code == http.StatusInternalServerError || code == http.StatusBadGateway:
					t.Errorf("%s: %d %.200s", what, code, body)
				case strings.Contains(p, "/admin/") || strings.Contains(p, "/search/"):
					if code != http.StatusNotFound && code != http.StatusMethodNotAllowed && code != http.StatusNoContent {
						t.Errorf("%s (disabled): %d, want 404 %.200s", what, code, body)
					}
				}
			}
		}
	}
}

// sweepCall sends one request and reads the answer, giving up after two
// seconds; a stream (notifications/live) counts as answered once its
// headers arrive.
func sweepCall(method, u string, params url.Values, withParams bool) (int, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var body io.Reader
	if withParams {
		if method == http.MethodGet || method == http.MethodHead || method == http.MethodDelete || method == http.MethodOptions {
			u += "?" + params.Encode()
		} else {
			body = strings.NewReader(params.Encode())
		}
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return 0, "", err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		return resp.StatusCode, "", nil
	}
	b, err := io.ReadAll(resp.Body)
	if errors.Is(err, context.DeadlineExceeded) {
		return resp.StatusCode, string(b), err
	}
	return resp.StatusCode, string(b), nil
}

// TestReloadFailureIsANotification: /api/v1/notifications answers as
// Prometheus' does, with Prometheus' notification while the last reload
// (POST /-/reload, SIGHUP) failed, gone once a reload succeeds. Before, the
// endpoint panicked on every call.
func TestReloadFailureIsANotification(t *testing.T) {
	rulesDir := t.TempDir()
	rule := filepath.Join(rulesDir, "gpu.yml")
	good := "groups:\n  - name: g\n    rules:\n      - record: gpu:temp:max\n        expr: max(DCGM_FI_DEV_GPU_TEMP)\n"
	if err := os.WriteFile(rule, []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, _, err := Load(flag.NewFlagSet("gpustore", flag.ContinueOnError), []string{
		"-storage.tsdb.path=" + t.TempDir(), "-web.listen-address=127.0.0.1:0", "-rules.dir=" + rulesDir})
	if err != nil {
		t.Fatal(err)
	}
	a := startApp(t, cfg)
	base := "http://" + a.Server.Addr().String()
	notes := func() []notifications.Notification {
		t.Helper()
		resp, err := http.Get(base + "/api/v1/notifications")
		if err != nil {
			t.Fatalf("/api/v1/notifications: %v", err)
		}
		defer resp.Body.Close()
		var r struct {
			Status string                       `json:"status"`
			Data   []notifications.Notification `json:"data"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || resp.StatusCode != http.StatusOK || r.Status != "success" {
			t.Fatalf("/api/v1/notifications: %d %v", resp.StatusCode, err)
		}
		return r.Data
	}
	reload := func() int {
		resp, err := http.Post(base+"/-/reload", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if n := notes(); len(n) != 0 {
		t.Fatalf("notifications at start: %v", n)
	}
	if err := os.WriteFile(rule, []byte("groups: [{name: g, rules: [{record: x, expr: 'sum('}]}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code := reload(); code != http.StatusInternalServerError {
		t.Fatalf("reload of a broken rule file: %d", code)
	}
	if n := notes(); len(n) != 1 || n[0].Text != notifications.ConfigurationUnsuccessful || !n[0].Active {
		t.Errorf("after a failed reload: %v, want Prometheus' %q", n, notifications.ConfigurationUnsuccessful)
	}
	if err := os.WriteFile(rule, []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	if code := reload(); code != http.StatusOK {
		t.Fatalf("reload of the mended rule file: %d", code)
	}
	if n := notes(); len(n) != 0 {
		t.Errorf("after a good reload: %v, want none", n)
	}
}
