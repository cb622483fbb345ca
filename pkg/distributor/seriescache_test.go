package distributor

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	"github.com/prometheus/prometheus/storage"
)

func withMaxSeries(n int) clusterOption {
	return func(c *clusterConfig) { c.ring.DistributorSeriesCacheMaxSeries = n }
}

// churnSeries is series id of a fleet whose jobs come and go: its labels
// name the id, so a sample stored under another series' labels shows.
func churnSeries(id int, samples ...prompb.Sample) prompb.TimeSeries {
	return prompb.TimeSeries{
		Labels: []prompb.Label{
			{Name: "__name__", Value: "DCGM_FI_DEV_GPU_UTIL"}, {Name: "gpu", Value: fmt.Sprint(id % 8)},
			{Name: "pod", Value: fmt.Sprintf("job-%d-worker-%d", id/8, id%8)},
		},
		Samples: samples,
	}
}

// cachedSeries counts the distributor's cached series, from its maps.
func (c *cluster) cachedSeries() int {
	c.dist.mtx.RLock()
	defer c.dist.mtx.RUnlock()
	n := 0
	for _, t := range c.dist.tenants {
		t.mtx.RLock()
		n += len(t.byRef)
		t.mtx.RUnlock()
	}
	return n
}

// TestSeriesCacheBoundUnderChurn: with many more series than the bound
// (long-lived ones and jobs that come and go, sweeps between), the cache
// never holds more than the bound, and every receiver holds exactly the
// samples written, each under its own series' labels: series forwarded
// uncached, and series swept and written again, whose references the
// ingester still holds, are never appended under another series' labels.
// Without a bound the cache held every series written since the sweeps.
func TestSeriesCacheBoundUnderChurn(t *testing.T) {
	const bound, stable, jobs, rounds = 40, 30, 60, 8
	c := newShardedCluster(t, 4, 3, nil, nil, withMaxSeries(bound))
	want := map[string][]prompb.Sample{}
	maxCached := 0
	for round := range rounds {
		// The stable series, this round's jobs and the previous round's
		// (a job lasts two rounds), in an order that changes with the round.
		var ids []int
		for i := range stable {
			ids = append(ids, i)
		}
		for j := range 2 * jobs {
			if id := stable + (round-1)*jobs + j; id >= stable {
				ids = append(ids, id)
			}
		}
		if round%2 == 1 {
			for i, j := 0, len(ids)-1; i < j; i, j = i+1, j-1 {
				ids[i], ids[j] = ids[j], ids[i]
			}
		}
		for step := range 2 {
			ts := int64(round*2+step+1) * 1000
			var series []prompb.TimeSeries
			for _, id := range ids {
				smp := prompb.Sample{Timestamp: ts, Value: float64(id*1000 + round*2 + step)}
				series = append(series, churnSeries(id, smp))
				ls := labelsOf(churnSeries(id))
				want[ls] = append(want[ls], smp)
			}
			if code, msg := c.write(t, "", series...); code != http.StatusNoContent {
				t.Fatalf("round %d step %d: %d %s", round, step, code, msg)
			}
			maxCached = max(maxCached, c.cachedSeries())
			if n := c.dist.cached.Load(); n > bound || int(n) != c.cachedSeries() {
				t.Fatalf("round %d: %d series counted cached, %d in the maps, bound %d", round, n, c.cachedSeries(), bound)
			}
		}
		if round%3 == 2 {
			c.dist.Sweep() // the jobs gone since the last sweep leave, the cache takes new ones again
		}
	}
	if maxCached != bound {
		t.Errorf("the cache held at most %d series, want it filled to its bound %d", maxCached, bound)
	}
	copies := map[string]int{}
	for _, r := range c.receivers {
		for ls, got := range r.stored(t, "default") {
			copies[ls]++
			w, ok := want[ls]
			if !ok {
				t.Fatalf("receiver %s holds %s, never written", r.id, ls)
			}
			if fmt.Sprint(got) != fmt.Sprint(w) {
				t.Fatalf("receiver %s: %s = %v, want %v", r.id, ls, got, w)
			}
		}
	}
	if len(copies) != len(want) {
		t.Fatalf("%d series stored, want %d", len(copies), len(want))
	}
	for ls, k := range copies {
		if k != 3 {
			t.Fatalf("%s on %d receivers, want 3", ls, k)
		}
	}
	m := c.dist.metrics
	if got := testutil.ToFloat64(m.cached.WithLabelValues("default")); got != float64(c.cachedSeries()) {
		t.Errorf("gpustore_distributor_cached_series = %g, want %d", got, c.cachedSeries())
	}
	if got := testutil.ToFloat64(m.uncached.WithLabelValues("default")); got == 0 {
		t.Error("gpustore_distributor_uncached_series_total is 0 with more series than the bound")
	}
	if got := testutil.ToFloat64(m.swept.WithLabelValues("default")); got == 0 {
		t.Error("gpustore_distributor_series_cache_swept_total is 0 after sweeps of gone jobs")
	}
	t.Logf("%d series, %d uncached forwards, %g swept", len(want), int(testutil.ToFloat64(m.uncached.WithLabelValues("default"))), testutil.ToFloat64(m.swept.WithLabelValues("default")))
}

// TestSeriesCacheBoundAcrossTenants: the bound is the distributor's, over
// all its tenants, and a tenant's sweep gives its places back.
func TestSeriesCacheBoundAcrossTenants(t *testing.T) {
	c := newShardedCluster(t, 3, 3, nil, nil, withMaxSeries(25))
	for _, tenant := range []string{"team-a", "team-b"} {
		var series []prompb.TimeSeries
		for i := range 20 {
			series = append(series, churnSeries(i, prompb.Sample{Timestamp: 1000, Value: float64(i)}))
		}
		if code, msg := c.write(t, tenant, series...); code != http.StatusNoContent {
			t.Fatalf("%s: %d %s", tenant, code, msg)
		}
	}
	a, b := len(c.dist.tenants["team-a"].byRef), len(c.dist.tenants["team-b"].byRef)
	if a != 20 || b != 5 {
		t.Fatalf("cached: team-a %d, team-b %d; want 20 and the 5 left of 25", a, b)
	}
	c.dist.tenants["team-a"].sweep()
	c.dist.tenants["team-a"].sweep()
	if n := c.dist.cached.Load(); n != 5 {
		t.Fatalf("%d cached after team-a's sweeps, want team-b's 5", n)
	}
}

// TestForgottenReferenceIsUnknown: a reference the distributor handed out
// names its series or nothing, ever: after the series is swept, after
// other series took places in the cache, and for a series forwarded
// uncached. A reference reused for another series would make the
// ingester, which appends a known series by reference alone, store one
// series' samples under another's labels.
func TestForgottenReferenceIsUnknown(t *testing.T) {
	c := newShardedCluster(t, 3, 3, nil, nil, withMaxSeries(1))
	ten, err := c.dist.Tenant("default")
	if err != nil {
		t.Fatal(err)
	}
	tn := ten.(*tenant)
	lsOf := func(id int) labels.Labels {
		return labels.FromStrings("__name__", "up", "id", fmt.Sprint(id))
	}
	refs := map[int]storage.SeriesRef{}
	resolve := func(id int) *series {
		t.Helper()
		s, err := tn.resolve(0, lsOf(id))
		if err != nil {
			t.Fatal(err)
		}
		refs[id] = s.ref
		return s
	}
	if s := resolve(0); s.ls.IsEmpty() {
		t.Fatal("the first series is not cached under a bound of 1")
	}
	if s := resolve(1); !s.ls.IsEmpty() {
		t.Fatal("a second series is cached past a bound of 1")
	}
	tn.sweep()
	tn.sweep() // series 0 is forgotten
	if s := resolve(2); s.ls.IsEmpty() {
		t.Fatal("series 2 did not take the place series 0 left")
	}
	seen := map[storage.SeriesRef]int{}
	for id, ref := range refs {
		if other, dup := seen[ref]; dup {
			t.Fatalf("series %d and %d both got reference %d", id, other, ref)
		}
		seen[ref] = id
	}
	for _, id := range []int{0, 1} {
		if s, err := tn.resolve(refs[id], labels.EmptyLabels()); err == nil {
			t.Fatalf("series %d's forgotten reference %d resolved to the series of reference %d", id, refs[id], s.ref)
		}
	}
	if s, err := tn.resolve(refs[2], labels.EmptyLabels()); err != nil || s.ref != refs[2] {
		t.Fatalf("the cached series' reference: %v, %v", s, err)
	}
}

// TestEncodeLabels: a series' labels encoded once are those prompb
// marshals in a TimeSeries, to the byte, whatever the lengths' varints.
func TestEncodeLabels(t *testing.T) {
	long := strings.Repeat("v", 300)
	for _, ls := range []labels.Labels{
		labels.EmptyLabels(),
		labels.FromStrings("__name__", "up"),
		labels.FromStrings("__name__", "DCGM_FI_DEV_GPU_UTIL", "gpu", "0", "long", long, strings.Repeat("n", 130), long),
	} {
		var ts prompb.TimeSeries
		ls.Range(func(l labels.Label) { ts.Labels = append(ts.Labels, prompb.Label{Name: l.Name, Value: l.Value}) })
		want, err := ts.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		got := encodeLabels(ls)
		if !bytes.Equal(got, want) || cap(got) != len(want) {
			t.Errorf("%s: %x (cap %d), want %x", ls, got, cap(got), want)
		}
	}
}

// TestSeriesCacheBoundConcurrent: writes resolving new and known series at
// once, in two tenants, with sweeps between, never take more places than
// the bound, and the places counted are the series cached.
func TestSeriesCacheBoundConcurrent(t *testing.T) {
	c := newShardedCluster(t, 3, 3, nil, nil, withMaxSeries(100))
	var wg sync.WaitGroup
	for w := range 4 {
		ten, err := c.dist.Tenant(fmt.Sprintf("team-%d", w%2))
		if err != nil {
			t.Fatal(err)
		}
		tn := ten.(*tenant)
		wg.Go(func() {
			for i := range 2000 {
				// Half the workers share their series with the other
				// worker of their tenant, so both race to create them.
				id := i % 300
				if w >= 2 {
					id += 1000 * w
				}
				s, err := tn.resolve(0, labels.FromStrings("__name__", "up", "id", fmt.Sprint(id)))
				if err != nil {
					t.Error(err)
					return
				}
				s.used.Store(true)
				if i%500 == 499 {
					tn.sweep()
				}
			}
		})
	}
	wg.Wait()
	if n := c.dist.cached.Load(); n > 100 || int(n) != c.cachedSeries() {
		t.Fatalf("%d places taken, %d series cached, bound 100", n, c.cachedSeries())
	}
	for _, id := range []string{"team-0", "team-1"} {
		if got, want := testutil.ToFloat64(c.dist.metrics.cached.WithLabelValues(id)), len(c.dist.tenants[id].byRef); got != float64(want) {
			t.Errorf("%s: gpustore_distributor_cached_series %g, want %d", id, got, want)
		}
	}
}
