package ingest

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/grafana/dskit/services"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/prompb"

	"github.com/gpustore/gpustore/pkg/limits"
)

func rejectedCount(ti *testIngester, reason string) float64 {
	return testutil.ToFloat64(ti.metrics.rejectedV.WithLabelValues("default", reason))
}

func nSeries(n int, ts int64, extra ...string) []prompb.TimeSeries {
	out := make([]prompb.TimeSeries, n)
	for i := range out {
		kv := append([]string{"__name__", "DCGM_FI_DEV_GPU_UTIL", "gpu", fmt.Sprint(i)}, extra...)
		out[i] = v1Series([]prompb.Sample{{Timestamp: ts, Value: float64(i)}}, kv...)
	}
	return out
}

// Each limit answers with the code its table in docs/limits.md promises and
// counts the rejection by tenant and reason.
func TestLimits(t *testing.T) {
	now := nowMs()
	withLimits := func(f func(*limits.Limits)) func(*testSetup) {
		return func(s *testSetup) { f(&s.limits.Defaults) }
	}

	t.Run("ingestion rate: 503 with Retry-After, nothing stored", func(t *testing.T) {
		ti := newTestIngester(t, withLimits(func(l *limits.Limits) { l.IngestionRate, l.IngestionBurstSize = 10, 10 }))
		resp := ti.post(t, ctV1, encodeV1(t, &prompb.WriteRequest{Timeseries: nSeries(15, now)}))
		if resp.code != http.StatusServiceUnavailable || resp.header.Get("Retry-After") == "" || !strings.Contains(resp.body, "rate limit") {
			t.Fatalf("status %d retry-after %q body %q", resp.code, resp.header.Get("Retry-After"), resp.body)
		}
		if got := ti.stored(t, "default"); len(got) != 0 {
			t.Fatalf("stored %d series of a rate-limited request", len(got))
		}
		if v := rejectedCount(ti, reasonRateLimited); v != 15 {
			t.Fatalf("rate_limited %v", v)
		}
		// Within the burst, accepted.
		if resp := ti.post(t, ctV1, encodeV1(t, &prompb.WriteRequest{Timeseries: nSeries(5, now)})); resp.code != http.StatusNoContent {
			t.Fatalf("within burst: %d %s", resp.code, resp.body)
		}
	})

	t.Run("ingestion rate: 429 when configured", func(t *testing.T) {
		ti := newTestIngester(t, withLimits(func(l *limits.Limits) {
			l.IngestionRate, l.IngestionBurstSize, l.RateLimitStatusCode = 10, 10, http.StatusTooManyRequests
		}))
		if resp := ti.post(t, ctV1, encodeV1(t, &prompb.WriteRequest{Timeseries: nSeries(15, now)})); resp.code != http.StatusTooManyRequests || resp.header.Get("Retry-After") != "2" {
			t.Fatalf("status %d retry-after %q", resp.code, resp.header.Get("Retry-After"))
		}
	})

	t.Run("max active series: 400, series below the limit stored", func(t *testing.T) {
		ti := newTestIngester(t, withLimits(func(l *limits.Limits) { l.MaxActiveSeries = 3 }))
		resp := ti.post(t, ctV1, encodeV1(t, &prompb.WriteRequest{Timeseries: nSeries(5, now)}))
		if resp.code != http.StatusBadRequest || !strings.Contains(resp.body, "max_active_series: 2") {
			t.Fatalf("status %d body %q", resp.code, resp.body)
		}
		if got := ti.stored(t, "default"); len(got) != 3 {
			t.Fatalf("stored %d series, want 3", len(got))
		}
		if v := rejectedCount(ti, reasonMaxSeries); v != 2 {
			t.Fatalf("max_active_series %v", v)
		}
		// Existing series keep being written.
		if resp := ti.post(t, ctV1, encodeV1(t, &prompb.WriteRequest{Timeseries: nSeries(3, now+1000)})); resp.code != http.StatusNoContent {
			t.Fatalf("existing series: %d %s", resp.code, resp.body)
		}
	})

	t.Run("max series per metric: 400 for a metric's new series past it, others stored", func(t *testing.T) {
		ti := newTestIngester(t, withLimits(func(l *limits.Limits) { l.MaxSeriesPerMetric = 16 }))
		// dcgm-exporter through a Kubernetes scrape: every job's pod label
		// re-creates the series of each of the node's 8 GPUs.
		job := func(pod string, ts int64, metrics ...string) []prompb.TimeSeries {
			var out []prompb.TimeSeries
			for _, m := range metrics {
				for g := range 8 {
					out = append(out, v1Series([]prompb.Sample{{Timestamp: ts, Value: 1}}, "__name__", m, "gpu", fmt.Sprint(g),
						"UUID", fmt.Sprintf("GPU-0a1b-%02d", g), "Hostname", "gpu-node-007", "modelName", "NVIDIA H100 80GB HBM3",
						"pod", pod, "namespace", "training", "container", "trainer"))
				}
			}
			return out
		}
		for _, pod := range []string{"llm-a-0", "llm-b-0"} {
			if resp := ti.post(t, ctV1, encodeV1(t, &prompb.WriteRequest{Timeseries: job(pod, now, "DCGM_FI_DEV_GPU_UTIL")})); resp.code != http.StatusNoContent {
				t.Fatalf("within the limit: %d %s", resp.code, resp.body)
			}
		}
		resp := ti.post(t, ctV1, encodeV1(t, &prompb.WriteRequest{Timeseries: job("llm-c-0", now, "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE")}))
		if resp.code != http.StatusBadRequest || !strings.Contains(resp.body, "max_series_per_metric: 8") {
			t.Fatalf("status %d body %q", resp.code, resp.body)
		}
		if v := rejectedCount(ti, reasonMaxSeriesMetric); v != 8 {
			t.Fatalf("max_series_per_metric rejections %v", v)
		}
		if got := ti.stored(t, "default"); len(got) != 24 { // 16 of GPU_UTIL, 8 of POWER_USAGE
			t.Fatalf("stored %d series, want 24", len(got))
		}
		if resp := ti.post(t, ctV1, encodeV1(t, &prompb.WriteRequest{Timeseries: job("llm-a-0", now+15_000, "DCGM_FI_DEV_GPU_UTIL")})); resp.code != http.StatusNoContent {
			t.Fatalf("existing series: %d %s", resp.code, resp.body)
		}
	})

	t.Run("max new series per day: 400 past it", func(t *testing.T) {
		ti := newTestIngester(t, withLimits(func(l *limits.Limits) { l.MaxNewSeriesPerDay = 3 }))
		resp := ti.post(t, ctV1, encodeV1(t, &prompb.WriteRequest{Timeseries: nSeries(5, now, "pod", "job-1")}))
		if resp.code != http.StatusBadRequest || !strings.Contains(resp.body, "max_new_series_per_day: 2") {
			t.Fatalf("status %d body %q", resp.code, resp.body)
		}
		if got := ti.stored(t, "default"); len(got) != 3 {
			t.Fatalf("stored %d series, want 3", len(got))
		}
	})

	t.Run("label limits: 400 naming the series", func(t *testing.T) {
		ti := newTestIngester(t, withLimits(func(l *limits.Limits) {
			l.MaxLabelNamesPerSeries, l.MaxLabelNameLength, l.MaxLabelValueLength = 4, 10, 12
		}))
		req := &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{
			v1Series([]prompb.Sample{{Timestamp: now, Value: 1}}, "__name__", "a", "b", "1", "c", "2", "d", "3", "e", "4"),
			v1Series([]prompb.Sample{{Timestamp: now, Value: 1}}, "__name__", "a", "a_very_long_name", "1"),
			v1Series([]prompb.Sample{{Timestamp: now, Value: 1}}, "__name__", "a", "pod", "llama-70b-worker-17"),
			v1Series([]prompb.Sample{{Timestamp: now, Value: 1}}, "__name__", "ok"),
		}}
		resp := ti.post(t, ctV1, encodeV1(t, req))
		for _, want := range []string{"too_many_labels: 1", "label_name_too_long: 1", "label_value_too_long: 1", "limit max_label_names_per_series"} {
			if !strings.Contains(resp.body, want) {
				t.Errorf("body %q lacks %q", resp.body, want)
			}
		}
		if resp.code != http.StatusBadRequest || len(ti.stored(t, "default")) != 1 {
			t.Fatalf("status %d, stored %v", resp.code, ti.stored(t, "default"))
		}
		for _, r := range []string{reasonTooManyLabels, reasonLabelNameTooLong, reasonLabelValueTooLong} {
			if v := rejectedCount(ti, r); v != 1 {
				t.Errorf("%s = %v", r, v)
			}
		}
	})

	t.Run("default label limit fits dcgm-exporter with pod labels", func(t *testing.T) {
		ti := newTestIngester(t)
		kv := dcgmLabels("DCGM_FI_DEV_GPU_TEMP", 1, 2)
		kv = append(kv, "GPU_I_PROFILE", "1g.10gb", "GPU_I_ID", "3", "err_code", "0", "err_msg", "", "hostname", "node-1")
		req := &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{v1Series([]prompb.Sample{{Timestamp: now, Value: 1}}, kv...)}}
		if resp := ti.post(t, ctV1, encodeV1(t, req)); resp.code != http.StatusNoContent {
			t.Fatalf("%d labels: %d %s", len(kv)/2, resp.code, resp.body)
		}
	})

	t.Run("max series per request: 400, nothing stored", func(t *testing.T) {
		ti := newTestIngester(t, withLimits(func(l *limits.Limits) { l.MaxSeriesPerRequest = 3 }))
		resp := ti.post(t, ctV1, encodeV1(t, &prompb.WriteRequest{Timeseries: nSeries(4, now)}))
		if resp.code != http.StatusBadRequest || !strings.Contains(resp.body, "max_series_per_request") {
			t.Fatalf("status %d body %q", resp.code, resp.body)
		}
		if got := ti.stored(t, "default"); len(got) != 0 {
			t.Fatalf("stored %v", got)
		}
		if v := rejectedCount(ti, reasonTooManySeries); v != 4 {
			t.Fatalf("too_many_series_in_request %v", v)
		}
	})
}

// The overrides file is reloaded without a restart: a tenant's limit and its
// out-of-order window change while gpustore runs.
func TestOverridesReload(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "overrides.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(file+".tmp", []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(file+".tmp", file); err != nil {
			t.Fatal(err)
		}
	}
	write("overrides:\n  default:\n    max_series_per_request: 2\n")
	ti := newTestIngester(t, func(s *testSetup) {
		s.limits.OverridesFile = file
		s.limits.ReloadPeriod = model.Duration(50 * time.Millisecond)
	})
	if err := services.StartAndAwaitRunning(t.Context(), ti.limits); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = services.StopAndAwaitTerminated(t.Context(), ti.limits) })
	now := nowMs()
	if resp := ti.post(t, ctV1, encodeV1(t, &prompb.WriteRequest{Timeseries: nSeries(3, now)})); resp.code != http.StatusBadRequest {
		t.Fatalf("override not applied: %d", resp.code)
	}
	// Raise the limit and open a 1 h out-of-order window for this tenant only.
	write("overrides:\n  default:\n    max_series_per_request: 10\n    out_of_order_window: 1h\n")
	waitUntil(t, func() bool { return ti.limits.For("default").MaxSeriesPerRequest == 10 })
	if resp := ti.post(t, ctV1, encodeV1(t, &prompb.WriteRequest{Timeseries: nSeries(3, now)})); resp.code != http.StatusNoContent {
		t.Fatalf("after reload: %d %s", resp.code, resp.body)
	}
	if err := ti.dbs.ApplyLimits(); err != nil { // what the storage role does on reload
		t.Fatal(err)
	}
	old := &prompb.WriteRequest{Timeseries: nSeries(3, now-10*60*1000)}
	if resp := ti.post(t, ctV1, encodeV1(t, old)); resp.code != http.StatusNoContent {
		t.Fatalf("10-minute-old samples inside the new window: %d %s", resp.code, resp.body)
	}
	// A broken file keeps the previous overrides. Check that only once the
	// file was read: dskit's reload gauge goes from 1 to 0.
	if g := overridesReloadGauge(t, ti.reg); g != 1 {
		t.Fatalf("reload gauge %v before the broken file", g)
	}
	write("overrides: [this is not a map\n")
	waitUntil(t, func() bool { return overridesReloadGauge(t, ti.reg) == 0 })
	if ti.limits.For("default").MaxSeriesPerRequest != 10 {
		t.Fatal("a broken overrides file replaced the previous one")
	}
	if ti.limits.For("other").MaxSeriesPerRequest != limits.Defaults().MaxSeriesPerRequest {
		t.Fatal("another tenant got the override")
	}
}

// overridesReloadGauge is dskit runtimeconfig's
// runtime_config_last_reload_successful for the overrides file.
func overridesReloadGauge(t *testing.T, g prometheus.Gatherer) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "runtime_config_last_reload_successful" {
			for _, m := range mf.GetMetric() {
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatal("runtime_config_last_reload_successful is not registered")
	return 0
}

func waitUntil(t *testing.T, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 5s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A reload of the overrides file keeps the tenants' series caches and the
// HA dedup state in them (dropping them cost a CPU spike of label builds and
// let a replica's sample be stored right after the other's gap fill), and the
// new limits apply, also to series the cache already knows.
func TestOverridesReloadKeepsSeriesCacheAndHAState(t *testing.T) {
	file := filepath.Join(t.TempDir(), "overrides.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(file+".tmp", []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(file+".tmp", file); err != nil {
			t.Fatal(err)
		}
	}
	write("overrides:\n  default:\n    max_label_names_per_series: 10\n")
	clock := &testClock{}
	start := time.Now().Add(-time.Hour).UnixMilli()
	clock.set(start)
	ti := newTestIngester(t, haSetup(clock), func(s *testSetup) {
		s.limits.OverridesFile = file
		s.limits.ReloadPeriod = model.Duration(20 * time.Millisecond)
	})
	if err := services.StartAndAwaitRunning(t.Context(), ti.limits); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = services.StopAndAwaitTerminated(t.Context(), ti.limits) })
	post := func(req *prompb.WriteRequest, want int) {
		t.Helper()
		if resp := ti.post(t, ctV1, encodeV1(t, req)); resp.code != want {
			t.Fatalf("status %d (%s), want %d", resp.code, resp.body, want)
		}
	}
	wide := func(ms int64) *prompb.WriteRequest { // six labels, not an HA pair's
		return &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{v1Series([]prompb.Sample{{Timestamp: ms, Value: 1}},
			"__name__", "DCGM_FI_DEV_GPU_UTIL", "Hostname", "node-1", "gpu", "0", "pod", "p", "namespace", "n", "container", "c")}}
	}
	post(replicaRequest("p0", start), http.StatusNoContent)
	post(wide(start), http.StatusNoContent)
	// p0 silent for 15 s: p1 fills the gap with its sample at t+12s.
	clock.set(start + 15000)
	post(replicaRequest("p1", start+12000), http.StatusNoContent)
	st, err := ti.tenant("default")
	if err != nil {
		t.Fatal(err)
	}
	cached := st.cache.len()

	write("overrides:\n  default:\n    max_label_names_per_series: 5\n")
	waitUntil(t, func() bool { return ti.limits.For("default").MaxLabelNamesPerSeries == 5 })
	ti.ApplyLimits() // what the storage role does on every reload

	if n := st.cache.len(); n != cached || n == 0 {
		t.Fatalf("series cache has %d entries after the reload, %d before", n, cached)
	}
	// p0 is back at t+15s, 3 s after p1's stored sample: a duplicate, unless
	// the reload made the series forget who wrote it last.
	post(replicaRequest("p0", start+15000), http.StatusNoContent)
	got := ti.stored(t, "default")[`{Hostname="node-1", __name__="DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", cluster="gpu-a", gpu="0"}`]
	if want := []float64{energy(start), energy(start + 12000)}; len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("stored %v, want %v (p0 at t, p1's gap fill at t+12s; p0's sample at t+15s is a duplicate)", got, want)
	}
	// The lowered label limit applies to a series the cache knows.
	resp := ti.post(t, ctV1, encodeV1(t, wide(start+15000)))
	if resp.code != http.StatusBadRequest || !strings.Contains(resp.body, "too_many_labels: 1") {
		t.Fatalf("known series over the new label limit: %d %s", resp.code, resp.body)
	}
}

// The ingestion rate is checked before anything is appended: a rejected
// request creates no head series (which would count against
// max_active_series until the next head GC) and keeps its answer code.
func TestRateLimitedRequestCreatesNoHeadSeries(t *testing.T) {
	for _, code := range []int{http.StatusServiceUnavailable, http.StatusTooManyRequests} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			clock := &testClock{}
			clock.set(time.Now().UnixMilli())
			ti := newTestIngester(t, func(s *testSetup) {
				l := &s.limits.Defaults
				l.IngestionRate, l.IngestionBurstSize, l.RateLimitStatusCode, l.MaxActiveSeries = 10, 10, code, 10
			})
			ti.now = clock.now
			now := clock.now().UnixMilli()
			resp := ti.post(t, ctV1, encodeV1(t, &prompb.WriteRequest{Timeseries: nSeries(15, now)}))
			if resp.code != code || resp.header.Get("Retry-After") != "2" {
				t.Fatalf("status %d retry-after %q, want %d and 2", resp.code, resp.header.Get("Retry-After"), code)
			}
			if n := ti.dbs.Existing("default").Head().NumSeries(); n != 0 {
				t.Fatalf("the rate-limited request created %d head series", n)
			}
			if v := rejectedCount(ti, reasonRateLimited); v != 15 {
				t.Fatalf("rate_limited %v, want 15", v)
			}
			// Ten other series within the burst fit max_active_series = 10.
			clock.set(clock.ms.Load() + 2000)
			resp = ti.post(t, ctV1, encodeV1(t, &prompb.WriteRequest{Timeseries: nSeries(10, now+1000, "pod", "other")}))
			if resp.code != http.StatusNoContent {
				t.Fatalf("next request: %d %s", resp.code, resp.body)
			}
		})
	}
}

// TestRateSharedByDistributors: with the ring each distributor allows its
// share of a tenant's ingestion rate (the rate divided by the healthy
// distributors), and the whole burst.
func TestRateSharedByDistributors(t *testing.T) {
	for _, c := range []struct {
		distributors int
		want         int // status of the second request, a second after the burst
	}{{1, http.StatusNoContent}, {2, http.StatusTooManyRequests}} {
		t.Run(fmt.Sprint(c.distributors), func(t *testing.T) {
			clock := &testClock{}
			clock.set(time.Now().UnixMilli())
			ti := newTestIngester(t, func(s *testSetup) {
				l := &s.limits.Defaults
				l.IngestionRate, l.IngestionBurstSize, l.RateLimitStatusCode = 10, 10, http.StatusTooManyRequests
				s.share = func() int { return c.distributors }
			})
			ti.now = clock.now
			now := clock.now().UnixMilli()
			if resp := ti.post(t, ctV1, encodeV1(t, &prompb.WriteRequest{Timeseries: nSeries(10, now)})); resp.code != http.StatusNoContent {
				t.Fatalf("the burst: %d %s", resp.code, resp.body)
			}
			// A second later the bucket holds 10 samples alone, 5 shared by two.
			clock.set(clock.ms.Load() + 1000)
			resp := ti.post(t, ctV1, encodeV1(t, &prompb.WriteRequest{Timeseries: nSeries(8, now+1000)}))
			if resp.code != c.want {
				t.Fatalf("8 samples a second after the burst with %d distributors: %d %s, want %d", c.distributors, resp.code, resp.body, c.want)
			}
		})
	}
}
