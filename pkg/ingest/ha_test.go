package ingest

import (
	"context"
	"math"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
	"github.com/prometheus/prometheus/promql"

	"github.com/gpustore/gpustore/pkg/hatracker"
)

type testClock struct{ ms atomic.Int64 }

func (c *testClock) now() time.Time { return time.UnixMilli(c.ms.Load()) }
func (c *testClock) set(ms int64)   { c.ms.Store(ms) }

func haSetup(clock *testClock) func(*testSetup) {
	return func(s *testSetup) {
		cfg := hatracker.DefaultConfig()
		cfg.FailoverTimeout = model.Duration(30 * time.Second)
		cfg.UpdateTimeout = model.Duration(5 * time.Second)
		s.ha = &cfg
		s.clock = clock.now
	}
}

// energy is the counter both replicas scrape from the same target: 300 J/s.
func energy(ms int64) float64 { return 1e9 + 300*float64(ms)/1000 }

func replicaRequest(replica string, ms int64) *prompb.WriteRequest {
	return &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{
		v1Series([]prompb.Sample{{Timestamp: ms, Value: energy(ms)}},
			"__name__", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Hostname", "node-1", "gpu", "0",
			"cluster", "gpu-a", "__replica__", replica),
		v1Series([]prompb.Sample{{Timestamp: ms, Value: 1}}, "__name__", "up", "job", "dcgm", "cluster", "gpu-a", "__replica__", replica),
	}}
}

func TestHADedupStoresOneReplica(t *testing.T) {
	clock := &testClock{}
	start := time.Now().Add(-time.Hour).UnixMilli()
	clock.set(start)
	ti := newTestIngester(t, haSetup(clock))
	for i := int64(0); i < 10; i++ {
		ts := start + i*15000
		clock.set(ts + 500)
		for _, r := range []string{"p0", "p1"} {
			lag := map[string]int64{"p0": 0, "p1": 300}[r]
			if resp := ti.post(t, ctV1, encodeV1(t, replicaRequest(r, ts+lag))); resp.code != http.StatusNoContent {
				t.Fatalf("%s: status %d %s", r, resp.code, resp.body)
			}
		}
	}
	got := ti.stored(t, "default")
	if len(got) != 2 {
		t.Fatalf("want 2 series (one per metric, replica label removed), got %v", got)
	}
	key := `{Hostname="node-1", __name__="DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", cluster="gpu-a", gpu="0"}`
	if len(got[key]) != 10 {
		t.Fatalf("series %s has %d samples, want 10 (one replica): %v", key, len(got[key]), got)
	}
	if v := testutil.ToFloat64(ti.metrics.dedup.WithLabelValues("default", "gpu-a")); v != 20 {
		t.Fatalf("deduplicated samples %v, want 20", v)
	}
	// 2.0: the dropped replica's samples are reported as written, so its
	// Prometheus does not count a failed partial write.
	b := newV2Builder()
	b.add(writev2.TimeSeries{Samples: []writev2.Sample{{Value: 1, Timestamp: start + 10*15000}}}, "__name__", "up", "job", "dcgm", "cluster", "gpu-a", "__replica__", "p1")
	resp := ti.post(t, ctV2, encodeV2(t, b.build()))
	if resp.code != http.StatusNoContent || resp.header.Get(headerSamplesWritten) != "1" {
		t.Fatalf("v2 from the non-elected replica: %d %q", resp.code, resp.header.Get(headerSamplesWritten))
	}
	// Series without the HA labels pass through untouched.
	plain := &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{v1Series([]prompb.Sample{{Timestamp: start, Value: 1}}, "__name__", "x", "__replica__", "keep")}}
	if resp := ti.post(t, ctV1, encodeV1(t, plain)); resp.code != http.StatusNoContent {
		t.Fatal(resp.body)
	}
	if _, ok := ti.stored(t, "default")[`{__name__="x", __replica__="keep"}`]; !ok {
		t.Fatal("series with a replica label but no cluster label was changed")
	}
}

// Across a failover, rate() and increase() of a counter match the
// single-replica truth: no spike (duplicates, fake resets) and no dip beyond
// the failover gap.
func TestHAFailoverHasNoCounterArtefacts(t *testing.T) {
	clock := &testClock{}
	const step = 15000
	start := time.Now().Add(-2 * time.Hour).UnixMilli()
	start -= start % step
	ti := newTestIngester(t, haSetup(clock))
	post := func(r string, ts int64) {
		t.Helper()
		clock.set(ts + 200)
		if resp := ti.post(t, ctV1, encodeV1(t, replicaRequest(r, ts))); resp.code != http.StatusNoContent {
			t.Fatalf("%s at %d: %d %s", r, ts, resp.code, resp.body)
		}
	}
	p0Down, p0Back := start+60*step, start+100*step
	end := start + 160*step
	for ts := start; ts <= end; ts += step {
		if ts < p0Down || ts >= p0Back { // p0 dies for 10 minutes, then restarts
			post("p0", ts)
		}
		post("p1", ts+300) // p1 scrapes the same target 300 ms later
	}

	db := ti.dbs.Existing("default")
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 1e7, Timeout: time.Minute, LookbackDelta: 5 * time.Minute})
	check := func(expr string, want, tol float64) {
		t.Helper()
		q, err := engine.NewRangeQuery(context.Background(), db, nil, expr, time.UnixMilli(start+41*step), time.UnixMilli(end), 15*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		res := q.Exec(context.Background())
		if res.Err != nil {
			t.Fatal(res.Err)
		}
		m, _ := res.Matrix()
		if len(m) != 1 {
			t.Fatalf("%s: %d series, want 1", expr, len(m))
		}
		points := 0
		for _, p := range m[0].Floats {
			points++
			if math.Abs(p.F-want) > tol {
				t.Errorf("%s at %s = %g, want %g ± %g", expr, time.UnixMilli(p.T).UTC().Format(time.TimeOnly), p.F, want, tol)
			}
		}
		if want := 120; points != want {
			t.Errorf("%s: %d points, want %d", expr, points, want)
		}
	}
	// Gap filling keeps the switch within one scrape interval, so even a
	// 1-minute rate and a 10-minute increase stay at the truth (±1%).
	check(`rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[1m])`, 300, 300*0.01)
	check(`increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[10m])`, 300*600, 300*600*0.01)
	check(`resets(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[10m])`, 0, 0)

	// The failover happened once (p0 → p1) and p0's return did not take over.
	st := ti.ha.Statuses()
	if len(st) != 1 || st[0].Replica != "p1" {
		t.Fatalf("elections %+v, want p1 elected", st)
	}
	// No duplicates: one sample per scrape interval, never two.
	got := ti.stored(t, "default")[`{Hostname="node-1", __name__="DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", cluster="gpu-a", gpu="0"}`]
	if n := len(got); n > 161 || n < 161-1 {
		t.Fatalf("%d samples stored for 161 scrapes", n)
	}
	for i := 1; i < len(got); i++ {
		if got[i] < got[i-1] {
			t.Fatalf("counter went down at sample %d: %g → %g", i, got[i-1], got[i])
		}
	}
}

// A sample the other replica already covered (older than the series' newest)
// is a duplicate, acknowledged with 2xx: not the 400 a plain series gets.
func TestHAOutOfOrderFromReplicaIsDeduplicated(t *testing.T) {
	clock := &testClock{}
	start := time.Now().Add(-time.Hour).UnixMilli()
	ti := newTestIngester(t, haSetup(clock))
	clock.set(start)
	ti.post(t, ctV1, encodeV1(t, replicaRequest("p0", start)))
	clock.set(start + 40000) // p0 silent for 40 s: p1 takes over
	resp := ti.post(t, ctV1, encodeV1(t, replicaRequest("p1", start-5000)))
	if resp.code != http.StatusNoContent {
		t.Fatalf("status %d %s", resp.code, resp.body)
	}
	if v := testutil.ToFloat64(ti.metrics.rejectedV.WithLabelValues("default", reasonOutOfOrder)); v != 0 {
		t.Fatalf("out-of-order rejections %v", v)
	}
}

func TestHAClusterLabelsKeptReplicaLabelRemoved(t *testing.T) {
	clock := &testClock{}
	clock.set(time.Now().UnixMilli())
	ti := newTestIngester(t, haSetup(clock))
	ti.post(t, ctV1, encodeV1(t, replicaRequest("p0", time.Now().UnixMilli())))
	for k := range ti.stored(t, "default") {
		if strings.Contains(k, "__replica__") || !strings.Contains(k, `cluster="gpu-a"`) {
			t.Fatalf("stored series %s", k)
		}
	}
	if n := len(ti.stored(t, "default")); n != 2 {
		t.Fatalf("%d series, want 2", n)
	}
}

func TestSeriesKeyLeavesOutTheReplicaOfHASeries(t *testing.T) {
	pairs := func(kv ...string) []labelPair {
		var out []labelPair
		for i := 0; i+1 < len(kv); i += 2 {
			out = append(out, labelPair{[]byte(kv[i]), []byte(kv[i+1])})
		}
		return out
	}
	key := func(p []labelPair) [2]uint64 {
		var k seriesKey
		k.compute(p, "cluster", "__replica__")
		return [2]uint64{k.h1, k.h2}
	}
	p0 := key(pairs("__name__", "x", "__replica__", "p0", "cluster", "a", "gpu", "1"))
	p1 := key(pairs("__name__", "x", "__replica__", "p1", "cluster", "a", "gpu", "1"))
	none := key(pairs("__name__", "x", "cluster", "a", "gpu", "1"))
	if p0 != p1 || p0 != none {
		t.Fatal("both replicas of a series must share one key, that of the series without the replica label")
	}
	// Without the cluster label the replica label is an ordinary label.
	if key(pairs("__name__", "x", "__replica__", "p0")) == key(pairs("__name__", "x", "__replica__", "p1")) {
		t.Fatal("series without a cluster label lost their replica label from the key")
	}
	if key(pairs("__name__", "x", "cluster", "a", "gpu", "1")) == key(pairs("__name__", "x", "cluster", "b", "gpu", "1")) {
		t.Fatal("different clusters share a key")
	}
}
