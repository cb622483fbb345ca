package app

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/golang/snappy"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/prompb"

	"github.com/gpustore/gpustore/internal/abuse"
)

// tenantCostApp starts gpustore as it runs embedded (-target=all, GPU rule
// pack on) with a fast rules tenant poll, plus args.
func tenantCostApp(t *testing.T, args ...string) (*App, string) {
	t.Helper()
	cfg, _, err := Load(flag.NewFlagSet("gpustore", flag.ContinueOnError), append([]string{
		"-storage.tsdb.path=" + t.TempDir(), "-web.listen-address=127.0.0.1:0", "-rules.tenant-poll-interval=100ms"}, args...))
	if err != nil {
		t.Fatal(err)
	}
	a := startApp(t, cfg)
	return a, "http://" + a.Server.Addr().String()
}

// oneSample is a remote write 1.0 body of one sample of metric now.
func oneSample(t testing.TB, metric string) []byte {
	b, err := (&prompb.WriteRequest{Timeseries: []prompb.TimeSeries{{
		Labels:  []prompb.Label{{Name: "__name__", Value: metric}, {Name: "instance", Value: "node-1:9100"}, {Name: "job", Value: "node-exporter"}},
		Samples: []prompb.Sample{{Timestamp: time.Now().UnixMilli(), Value: 1}},
	}}}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return snappy.Encode(nil, b)
}

// liveHeap is the heap in use after two collections.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// steadyHeap is the least of five liveHeap measures 200 ms apart: a rule
// group evaluating while one is taken holds its query's memory for the
// moment (1.0 MiB a GPU tenant measured alone, 2.7 MiB in some runs of the
// whole package).
func steadyHeap() uint64 {
	least := liveHeap()
	for range 4 {
		time.Sleep(200 * time.Millisecond)
		least = min(least, liveHeap())
	}
	return least
}

// waitForPacks waits until the ruler runs rule groups (the GPU pack) for
// every tenant given.
func waitForPacks(t *testing.T, a *App, tenants []string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for _, tenant := range tenants {
		for m := a.Ruler.Manager(tenant); m == nil || len(m.RuleGroups()) == 0; m = a.Ruler.Manager(tenant) {
			if time.Now().After(deadline) {
				t.Fatalf("tenant %s has no GPU rule pack after 30 s", tenant)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// measureTenants writes one sample of metric to n new tenants (the
// abuse.TenantFlood workload), waits for the ruler's tenant polls, and
// returns the live heap and goroutines each new tenant added.
func measureTenants(t *testing.T, a *App, base, metric, prefix string, n int) (heapPerTenant float64, goroutinesPerTenant float64) {
	t.Helper()
	time.Sleep(300 * time.Millisecond) // the ruler's first polls are done
	h0, g0 := steadyHeap(), runtime.NumGoroutine()
	ans := abuse.TenantFlood(context.Background(), http.DefaultClient, base+"/api/v1/write", oneSample(t, metric), prefix, n, 4, nil)
	if got := ans.Count(http.StatusNoContent); got != n {
		t.Fatalf("tenant writes: %v, want %d answered 204", ans.ByCode, n)
	}
	if strings.HasPrefix(metric, "DCGM_") {
		// The ruler's tenant polls give each tenant with GPU data the pack:
		// measured once every one has it.
		var tenants []string
		for i := range n {
			tenants = append(tenants, fmt.Sprintf("%s%d", prefix, i))
		}
		waitForPacks(t, a, tenants)
	} else {
		// A tenant without GPU data leaves the ruler nothing to wait for:
		// several of its polls (100 ms) look at it and load nothing.
		time.Sleep(500 * time.Millisecond)
	}
	h1, g1 := steadyHeap(), runtime.NumGoroutine()
	return (float64(h1) - float64(h0)) / float64(n), float64(g1-g0) / float64(n)
}

// TestIdleTenantCost measures what a tenant costs the process that holds
// it when it has no GPU data (one sample of node-exporter's `up`): its
// database, ingest state and rules. Target (issue 30): at most 1 MB of heap,
// so that a flood of new tenants, and the reopening of every tenant on disk
// at start, cannot run the process out of memory. bench/RESULTS.md keeps the
// figures.
func TestIdleTenantCost(t *testing.T) {
	a, base := tenantCostApp(t)
	const n = 20
	heap, goroutines := measureTenants(t, a, base, "up", "idle-", n)
	t.Logf("idle tenant: %.0f KiB of heap, %.1f goroutines (%d tenants)", heap/1024, goroutines, n)
	if heap > 1<<20 {
		t.Errorf("an idle tenant costs %.1f MiB of heap, want at most 1 MiB", heap/(1<<20))
	}
}

// TestGPUTenantCost measures a tenant with GPU data (one dcgm-exporter
// sample): it has the GPU rule pack besides what an idle tenant has, and
// checks the pack loaded. Target (issue 38): at most 2 MiB of heap. It was
// 13 MiB while Prometheus' rule manager gave each of the pack's rule label
// sets and annotations a symbol table of its own (pkg/rules/share.go);
// bench/RESULTS.md keeps the figures.
func TestGPUTenantCost(t *testing.T) {
	a, base := tenantCostApp(t)
	const n = 5
	heap, goroutines := measureTenants(t, a, base, "DCGM_FI_DEV_GPU_TEMP", "gpu-", n)
	t.Logf("tenant with GPU data: %.1f MiB of heap, %.1f goroutines (%d tenants)", heap/(1<<20), goroutines, n)
	if got := len(a.Ruler.Manager("gpu-0").RuleGroups()); got == 0 {
		t.Error("a tenant with GPU data runs no rule groups")
	}
	if heap > 2<<20 {
		t.Errorf("a tenant with GPU data costs %.1f MiB of heap, want at most 2 MiB", heap/(1<<20))
	}
}

// TestTenantFloodStopsAtMaxTenants: a flood of writes for new tenants (the
// abuse.TenantFlood workload) gets as many tenants as limits.max_tenants
// leaves room for; the rest is answered 429 and costs nothing that stays,
// and the tenant already there keeps writing.
func TestTenantFloodStopsAtMaxTenants(t *testing.T) {
	a, base := tenantCostApp(t, "-limits.max-tenants=10")
	body := oneSample(t, "DCGM_FI_DEV_GPU_TEMP")
	write := func(tenant string) int {
		ans := abuse.TenantFlood(context.Background(), http.DefaultClient, base+"/api/v1/write", body, tenant, 1, 1, nil)
		for code := range ans.ByCode {
			return code
		}
		return 0
	}
	if code := write("gpu-prod"); code != http.StatusNoContent {
		t.Fatalf("the first tenant: %d", code)
	}
	h0 := liveHeap()
	ans := abuse.TenantFlood(context.Background(), http.DefaultClient, base+"/api/v1/write", body, "flood-", 300, 8, nil)
	if ans.Count(http.StatusNoContent) != 9 || ans.Count(http.StatusTooManyRequests) != 291 {
		t.Errorf("the flood's answers: %v, want 9 × 204 and 291 × 429", ans.ByCode)
	}
	if got := len(a.DBs.Tenants()); got != 10 {
		t.Errorf("%d tenants after the flood, want 10", got)
	}
	if code := write("gpu-prod"); code != http.StatusNoContent {
		t.Errorf("the first tenant after the flood: %d", code)
	}
	// Nothing per refused tenant stays, not even a metric series.
	if n, err := testutil.GatherAndCount(a.Registry, "gpustore_server_inflight_write_requests"); err != nil || n != 0 {
		t.Errorf("gpustore_server_inflight_write_requests has %d series with no write in progress (%v)", n, err)
	}
	// The ruler's polls: the flood's 9 tenants get the pack.
	waitForPacks(t, a, a.DBs.Tenants())
	if grown := float64(liveHeap()) - float64(h0); grown > 9*20<<20 {
		t.Errorf("the heap grew %.0f MiB with 9 tenants added", grown/(1<<20))
	}
}
