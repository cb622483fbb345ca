package app

import (
	"flag"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestExperimentalFunctions: Prometheus' experimental PromQL functions
// (limitk, limit_ratio, sort_by_label, double_exponential_smoothing) are
// refused (400) by default, as Prometheus refuses them, and with
// -query.enable-experimental-functions answered by the query API and usable
// in rule files. There was no way to enable them.
func TestExperimentalFunctions(t *testing.T) {
	queries := map[string]string{
		`limitk(1, gpu_util)`:                                  "",
		`limit_ratio(1, gpu_util)`:                             "",
		`sort_by_label(gpu_util, "gpu")`:                       "",
		`double_exponential_smoothing(gpu_util[5m], 0.5, 0.5)`: "",
	}
	rulesDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(rulesDir, "top.yml"), []byte(`groups:
  - name: top
    interval: 1s
    rules:
      - record: gpu:util:top1
        expr: limitk(1, gpu_util)
`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, on := range []bool{false, true} {
		args := []string{"-storage.tsdb.path=" + t.TempDir(), "-web.listen-address=127.0.0.1:0", "-rules.gpu-pack=false", "-rules.dir=" + rulesDir}
		if on {
			args = append(args, "-query.enable-experimental-functions")
		}
		cfg, _, err := Load(flag.NewFlagSet("gpustore", flag.ContinueOnError), args)
		if err != nil {
			t.Fatal(err)
		}
		a := startApp(t, cfg)
		base := "http://" + a.Server.Addr().String()
		now := time.Now()
		for gpu := range 3 {
			for i := range 5 {
				if code := postWrite(t, base, `gpu_util{gpu="`+string(rune('0'+gpu))+`"}`, now.Add(time.Duration(i-5)*time.Minute).UnixMilli(), float64(10*gpu+i)); code/100 != 2 {
					t.Fatalf("write: %d", code)
				}
			}
		}
		for q := range queries {
			resp, err := http.Get(base + "/api/v1/query?query=" + url.QueryEscape(q))
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			switch {
			case !on && (resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "experimental") && !strings.Contains(string(body), "not enabled")):
				t.Errorf("off: %s: %d %s, want 400: not enabled", q, resp.StatusCode, body)
			case on && (resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"result":[{`)):
				t.Errorf("on: %s: %d %s, want an answer", q, resp.StatusCode, body)
			}
		}
		if on {
			if v := instantValue(t, base, `count(limitk(2, gpu_util))`); v != "2" {
				t.Errorf("count(limitk(2, gpu_util)) = %s, want 2", v)
			}
			// The rule file loads and its recording rule evaluates.
			deadline := time.Now().Add(20 * time.Second)
			for queryValue(base, `count(gpu:util:top1)`) != "1" {
				if time.Now().After(deadline) {
					t.Fatal("the rule using limitk recorded nothing")
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
	}
}
