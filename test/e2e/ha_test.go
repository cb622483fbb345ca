package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"

	"github.com/gpustore/gpustore/bench/gpusim"
	"github.com/gpustore/gpustore/internal/testbin"
	"github.com/gpustore/gpustore/pkg/app"
)

// TestRealPrometheusHAPair: two real Prometheus servers (external labels
// cluster=gpu-a, __replica__=p0|p1) scrape the same simulated DCGM targets
// and remote-write to gpustore. Every series is stored once; when p0 stops,
// p1's samples are stored within the failover timeout plus one scrape
// interval; when p0 returns nothing is stored twice; counters never reset.
func TestRealPrometheusHAPair(t *testing.T) {
	bin := testbin.Need(t, "prometheus")
	const failover = 6 * time.Second
	_, gsURL := startGpustore(t, func(c *app.Config) {
		c.HA.FailoverTimeout = model.Duration(failover)
		c.HA.UpdateTimeout = model.Duration(2 * time.Second)
		c.HA.GapFillAfter = model.Duration(3 * time.Second)
	})
	sim, err := gpusim.New(gpusim.Config{Name: "gpu-a", Nodes: 2, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	page := httptest.NewServer(gpusim.NewHandler(sim, gpusim.HandlerOptions{Pages: gpusim.PagesNode}))
	defer page.Close()
	config := func(replica string) string {
		var b strings.Builder
		fmt.Fprintf(&b, "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  external_labels:\n    cluster: gpu-a\n    __replica__: %s\n", replica)
		b.WriteString("scrape_configs:\n")
		for _, h := range sim.Hostnames() {
			fmt.Fprintf(&b, "  - job_name: %s\n    metrics_path: /node/%s/metrics\n    static_configs:\n      - targets: [%q]\n", h, h, strings.TrimPrefix(page.URL, "http://"))
		}
		fmt.Fprintf(&b, "remote_write:\n  - url: %s/api/v1/write\n    queue_config:\n      batch_send_deadline: 500ms\n      max_samples_per_send: 2000\n      min_backoff: 100ms\n      max_backoff: 1s\n", gsURL)
		return b.String()
	}
	dirs := map[string]string{"p0": t.TempDir(), "p1": t.TempDir()}
	stops := map[string]func(){}
	for _, r := range []string{"p0", "p1"} {
		_, stops[r] = startPrometheusProc(t, bin, dirs[r], config(r))
	}
	gs := promClient(t, gsURL)
	ctx := context.Background()

	// query evaluates expr at ts with query-time dedup off, so that what is
	// checked is what ingest stored.
	query := func(expr string, ts time.Time) model.Vector {
		t.Helper()
		v, err := queryNoDedup(gsURL, expr, ts)
		if err != nil {
			t.Fatalf("%s: %v", expr, err)
		}
		return v
	}
	one := func(expr string) float64 {
		t.Helper()
		v := query(expr, time.Now())
		if len(v) != 1 {
			t.Fatalf("%s: %d results, want 1: %v", expr, len(v), v)
		}
		return float64(v[0].Value)
	}

	waitFor(t, 60*time.Second, "both replicas writing, 20 s of data", func() error {
		v, err := queryNoDedup(gsURL, `count_over_time(DCGM_FI_DEV_GPU_TEMP{Hostname="gpu-node-001",gpu="0"}[20s])`, time.Now())
		if err != nil {
			return err
		}
		if len(v) != 1 || v[0].Value < 15 {
			return fmt.Errorf("not yet: %v", v)
		}
		return nil
	})
	// Every series once: no replica label stored, up counted once per target,
	// one sample per scrape interval.
	if n := len(query(`{__replica__!=""}`, time.Now())); n != 0 {
		t.Fatalf("%d series stored with the replica label", n)
	}
	if v := one(`count(up)`); v != 2 {
		t.Fatalf("count(up) = %v, want 2 (one per target, not per replica)", v)
	}
	if v := one(`count_over_time(DCGM_FI_DEV_GPU_TEMP{Hostname="gpu-node-001",gpu="0"}[20s])`); v > 21 {
		t.Fatalf("%v samples in 20 s of a 1 s scrape: duplicates", v)
	}
	elected := func() string {
		resp, err := http.Get(gsURL + "/ha-tracker")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var st struct {
			Elections []struct {
				Cluster string `json:"cluster"`
				Replica string `json:"elected_replica"`
			} `json:"elections"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
			t.Fatal(err)
		}
		if len(st.Elections) != 1 || st.Elections[0].Cluster != "gpu-a" {
			t.Fatalf("elections %+v", st.Elections)
		}
		return st.Elections[0].Replica
	}
	// Stop the elected replica; the other must take over.
	leader := elected()
	other := map[string]string{"p0": "p1", "p1": "p0"}[leader]
	stops[leader]()
	stoppedAt := time.Now()
	t.Logf("stopped %s at %s", leader, stoppedAt.Format(time.TimeOnly))
	waitFor(t, failover+10*time.Second, "the other replica's samples after the leader stopped", func() error {
		v, err := queryNoDedup(gsURL, `timestamp(DCGM_FI_DEV_GPU_TEMP{Hostname="gpu-node-001",gpu="0"})`, time.Now())
		if err != nil || len(v) != 1 {
			return fmt.Errorf("%v %v", v, err)
		}
		if ts := time.Unix(int64(v[0].Value), 0); !ts.After(stoppedAt.Add(2 * time.Second)) {
			return fmt.Errorf("newest sample at %s", ts.Format(time.TimeOnly))
		}
		return nil
	})
	if d := time.Since(stoppedAt); d > failover+time.Second+2*time.Second {
		t.Errorf("%s took over after %s, want within failover %s + scrape interval", other, d, failover)
	}
	waitFor(t, failover+5*time.Second, other+" elected", func() error {
		if r := elected(); r != other {
			return fmt.Errorf("elected %s", r)
		}
		return nil
	})

	// Restart the old leader (same data dir): it must not take over, and
	// nothing is stored twice.
	startPrometheusProc(t, bin, dirs[leader], config(leader))
	// A bounded wait for something that must NOT happen (its return taking
	// over or its samples stored too): the window the count below reads.
	time.Sleep(8 * time.Second)
	if r := elected(); r != other {
		t.Fatalf("%s's return took over: elected %s", leader, r)
	}
	now := time.Now()
	if v := query(`count_over_time(DCGM_FI_DEV_GPU_TEMP{Hostname="gpu-node-001",gpu="0"}[8s])`, now); len(v) != 1 || v[0].Value > 9 {
		t.Fatalf("after p0's return: %v samples in 8 s", v)
	}
	// Counters: no reset and no hole longer than the gap-fill delay plus a
	// scrape interval, across the whole run.
	if v := query(`resets(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5m]) > 0`, now); len(v) != 0 {
		t.Fatalf("counter resets across the failover: %v", v)
	}
	m, _, _, err := gs.Query(ctx, `DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{Hostname="gpu-node-001",gpu="0"}[5m]`, now)
	if err != nil {
		t.Fatal(err)
	}
	mat := m.(model.Matrix)
	if len(mat) != 1 {
		t.Fatalf("%d series", len(mat))
	}
	var maxGap time.Duration
	pts := mat[0].Values
	for i := 1; i < len(pts); i++ {
		if pts[i].Value < pts[i-1].Value {
			t.Fatalf("energy counter went down at %s", pts[i].Timestamp.Time().Format(time.TimeOnly))
		}
		maxGap = max(maxGap, pts[i].Timestamp.Sub(pts[i-1].Timestamp))
	}
	t.Logf("largest gap between stored samples across the failover: %s", maxGap)
	if maxGap > 3*time.Second+time.Second+1500*time.Millisecond {
		t.Fatalf("a hole of %s across the failover (gap fill 3s + scrape 1s)", maxGap)
	}
}

// queryNoDedup runs an instant query with dedup=false.
func queryNoDedup(base, expr string, ts time.Time) (model.Vector, error) {
	q := url.Values{"dedup": {"false"}, "query": {expr}, "time": {fmt.Sprintf("%.3f", float64(ts.UnixMilli())/1000)}}
	resp, err := http.Get(base + "/api/v1/query?" + q.Encode())
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result model.Vector `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return nil, err
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("query %s: %s", expr, r.Error)
	}
	return r.Data.Result, nil
}
