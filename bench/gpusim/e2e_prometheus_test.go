package gpusim

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpustore/gpustore/internal/testbin"
)

// A real Prometheus scrapes the simulator's per-node pages and the
// kube-state-metrics page; its API must then report the DCGM metrics with
// dcgm-exporter's names, types (from scrape metadata) and labels.
func TestPrometheusScrapesSimulator(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real Prometheus")
	}
	bin := testbin.Need(t, "prometheus")

	c := newTestCluster(t, Config{Nodes: 2, Seed: 17})
	sim := httptest.NewServer(NewHandler(c, HandlerOptions{Pages: PagesNode}))
	t.Cleanup(sim.Close)
	simAddr := strings.TrimPrefix(sim.URL, "http://")

	dir := t.TempDir()
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n")
	fmt.Fprintf(&cfg, "  - job_name: gpu-node\n    static_configs:\n")
	for _, h := range c.Hostnames() {
		// One target per node page; instance names the node so the
		// node-exporter series of the two pages do not collide.
		fmt.Fprintf(&cfg, "      - targets: [%q]\n        labels: {__metrics_path__: %q, instance: %q}\n", simAddr, "/node/"+h+"/metrics", h)
	}
	fmt.Fprintf(&cfg, "  - job_name: kube-state-metrics\n    metrics_path: /cluster/metrics\n    static_configs:\n      - targets: [%q]\n", simAddr)
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	logPath := filepath.Join(dir, "prometheus.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address=127.0.0.1:"+port, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start prometheus: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("prometheus log:\n%s", b)
		}
	})
	api := "http://127.0.0.1:" + port

	// Wait for every GPU to have been scraped a few times.
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	for {
		var r queryResult
		err := getJSON(ctx, api+"/api/v1/query?query="+url.QueryEscape("count(count_over_time(DCGM_FI_DEV_GPU_TEMP[1m]) >= 3)"), &r)
		if err == nil && len(r.Data.Result) == 1 && r.Data.Result[0].Value[1] == "16" {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("Prometheus never scraped 16 GPUs 3 times (last error %v, result %+v)", err, r.Data.Result)
		}
		time.Sleep(500 * time.Millisecond)
	}

	var targets struct {
		Data struct {
			ActiveTargets []struct {
				Health    string `json:"health"`
				LastError string `json:"lastError"`
				ScrapeURL string `json:"scrapeUrl"`
			} `json:"activeTargets"`
		} `json:"data"`
	}
	if err := getJSON(ctx, api+"/api/v1/targets", &targets); err != nil {
		t.Fatal(err)
	}
	if len(targets.Data.ActiveTargets) != 3 {
		t.Errorf("%d targets, want 3", len(targets.Data.ActiveTargets))
	}
	for _, tg := range targets.Data.ActiveTargets {
		if tg.Health != "up" {
			t.Errorf("target %s: %s %s", tg.ScrapeURL, tg.Health, tg.LastError)
		}
	}

	var md struct {
		Data map[string][]struct {
			Type string `json:"type"`
			Help string `json:"help"`
		} `json:"data"`
	}
	if err := getJSON(ctx, api+"/api/v1/metadata", &md); err != nil {
		t.Fatal(err)
	}
	for _, held := range []map[string]string{dcgmDefaultCounters, dcgmExtraFields, dcgmPackFields} {
		for name, typ := range held {
			m, ok := md.Data[name]
			if !ok || len(m) == 0 {
				t.Errorf("Prometheus has no metadata for %s", name)
				continue
			}
			d, _ := LookupMetric(name)
			if m[0].Type != typ || m[0].Help != d.Help {
				t.Errorf("%s: Prometheus says %s %q, want %s %q", name, m[0].Type, m[0].Help, typ, d.Help)
			}
			var r queryResult
			if err := getJSON(ctx, api+"/api/v1/query?query="+name, &r); err != nil {
				t.Fatal(err)
			}
			if len(r.Data.Result) != 16 {
				t.Errorf("%s: %d series, want 16", name, len(r.Data.Result))
			}
			for _, s := range r.Data.Result {
				for _, l := range DCGMLabelNames {
					if s.Metric[l] == "" {
						t.Errorf("%s%v lacks label %s", name, s.Metric, l)
					}
				}
			}
		}
	}
	if m := md.Data["training_iteration_time_seconds"]; len(c.Hostnames()) > 0 && len(m) > 0 && m[0].Type != "histogram" {
		t.Errorf("training_iteration_time_seconds typed %s", m[0].Type)
	}
	var r queryResult
	if err := getJSON(ctx, api+"/api/v1/query?query="+url.QueryEscape(`sum(kube_node_status_condition{condition="Ready",status="true"})`), &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Data.Result) != 1 || r.Data.Result[0].Value[1] != "2" {
		t.Errorf("ready nodes: %+v", r.Data.Result)
	}
}

type queryResult struct {
	Status string `json:"status"`
	Data   struct {
		Result []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		} `json:"result"`
	} `json:"data"`
}

func getJSON(ctx context.Context, u string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	return port
}
