package distributor

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/tsdbutil"
)

// withCreatedTimestampZeros turns created_timestamp_zero_ingestion on for
// every tenant of the distributor's ingester (not the receivers').
func withCreatedTimestampZeros() clusterOption {
	return func(c *clusterConfig) { c.limits.Defaults.CreatedTimestampZeroIngestion = true }
}

// v2Series is one series of a remote-write 2.0 request.
type v2Series struct {
	name       string
	samples    []writev2.Sample
	histograms []writev2.Histogram
}

// postV2 sends the series to the distributor as one remote-write 2.0 request.
func (c *cluster) postV2(t *testing.T, series ...v2Series) (int, string) {
	t.Helper()
	syms := writev2.NewSymbolTable()
	req := writev2.Request{}
	for _, s := range series {
		req.Timeseries = append(req.Timeseries, writev2.TimeSeries{
			LabelsRefs: syms.SymbolizeLabels(labels.FromStrings("__name__", s.name), nil),
			Samples:    s.samples, Histograms: s.histograms,
		})
	}
	req.Symbols = syms.Symbols()
	b, err := req.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return c.post(t, "", "application/x-protobuf;proto=io.prometheus.write.v2.Request", b)
}

// timestamps are the times of samples.
func timestamps(samples []prompb.Sample) []int64 {
	out := make([]int64, len(samples))
	for i, s := range samples {
		out[i] = s.Timestamp
	}
	return out
}

// TestStartTimestampZerosThroughRing: with created_timestamp_zero_ingestion,
// a counter scraped again and again (its start timestamp repeated with every
// sample, a new one after a restart) is stored on every receiver with a zero
// at each start timestamp, once, where it was first accepted, and every
// write is answered 204, with the series cache unbounded and bounded (the
// series forwarded uncached). The zero's repetition was forwarded as an
// ordinary sample, which the receivers rejected as out of order: every write
// after the first answered 400 (which Prometheus does not retry) although
// the rest of it was stored.
func TestStartTimestampZerosThroughRing(t *testing.T) {
	for _, bound := range []int{0, 1} {
		t.Run(fmt.Sprintf("max_series=%d", bound), func(t *testing.T) {
			c := newShardedCluster(t, 3, 3, nil, nil, withMaxSeries(bound), withCreatedTimestampZeros())
			now := time.Now().UnixMilli()
			s1, t1, t2 := now-4_000_000, now-3_600_000, now-3_000_000 // a counter's first start, two scrapes
			s2, t3, t4 := now-1_500_000, now-1_000_000, now           // restarted, two scrapes
			h := tsdbutil.GenerateTestHistogram(3)
			for i, w := range []struct {
				st, t int64
				v     float64
			}{{s1, t1, 5}, {s1, t2, 6}, {s2, t3, 2}, {s2, t4, 3}} {
				code, msg := c.postV2(t,
					v2Series{name: "plain_total", samples: []writev2.Sample{{Value: 1, Timestamp: w.t}}},
					v2Series{name: "x_total", samples: []writev2.Sample{{Value: w.v, Timestamp: w.t, StartTimestamp: w.st}}},
					v2Series{name: "h_seconds", histograms: []writev2.Histogram{writev2.FromIntHistogram(w.st, w.t, h)}},
				)
				if code != http.StatusNoContent {
					t.Fatalf("write %d: %d %s", i+1, code, msg)
				}
				c.settle(t) // the next write must not overtake this one on the slowest replica
			}
			wantX := []prompb.Sample{{Timestamp: s1}, {Timestamp: t1, Value: 5}, {Timestamp: t2, Value: 6}, {Timestamp: s2}, {Timestamp: t3, Value: 2}, {Timestamp: t4, Value: 3}}
			wantPlain := []prompb.Sample{{Timestamp: t1, Value: 1}, {Timestamp: t2, Value: 1}, {Timestamp: t3, Value: 1}, {Timestamp: t4, Value: 1}}
			wantH := []int64{s1, t1, t2, s2, t3, t4}
			for _, r := range c.receivers {
				got := r.stored(t, "default")
				if g := got[`{__name__="x_total"}`]; fmt.Sprint(g) != fmt.Sprint(wantX) {
					t.Errorf("receiver %s: x_total = %v, want %v", r.id, g, wantX)
				}
				if g := got[`{__name__="plain_total"}`]; fmt.Sprint(g) != fmt.Sprint(wantPlain) {
					t.Errorf("receiver %s: plain_total = %v, want %v", r.id, g, wantPlain)
				}
				if g := timestamps(got[`{__name__="h_seconds"}`]); fmt.Sprint(g) != fmt.Sprint(wantH) {
					t.Errorf("receiver %s: h_seconds at %v, want %v", r.id, g, wantH)
				}
			}
		})
	}
}

// TestStartTimestampZeroBesideOutOfOrderSample: a sample genuinely out of
// order is still answered 400, naming it alone, when the request also
// repeats a series' start timestamp; the rest of the request is stored.
// (A receiver's out-of-order window is at least ring.remote_timeout, so a
// sample further behind its series than that is rejected as too old.)
func TestStartTimestampZeroBesideOutOfOrderSample(t *testing.T) {
	c := newShardedCluster(t, 3, 3, nil, nil, withCreatedTimestampZeros())
	now := time.Now().UnixMilli()
	st, t1, t3 := now-600_000, now-500_000, now-200_000
	yNew, yOld := now-300_000, now-400_000
	if code, msg := c.postV2(t,
		v2Series{name: "x_total", samples: []writev2.Sample{{Value: 5, Timestamp: t1, StartTimestamp: st}}},
		v2Series{name: "y", samples: []writev2.Sample{{Value: 1, Timestamp: yNew}}},
	); code != http.StatusNoContent {
		t.Fatalf("first write: %d %s", code, msg)
	}
	c.settle(t) // the next write must not overtake this one on the slowest replica
	code, msg := c.postV2(t,
		v2Series{name: "x_total", samples: []writev2.Sample{{Value: 6, Timestamp: t3, StartTimestamp: st}}},
		v2Series{name: "y", samples: []writev2.Sample{{Value: 2, Timestamp: yOld}}},
	)
	if code != http.StatusBadRequest {
		t.Fatalf("write with an out-of-order sample: %d %s, want 400", code, msg)
	}
	for _, want := range []string{"receivers rejected the data", "1 samples rejected (too_old: 1)", `{__name__="y"}`} {
		if !strings.Contains(msg, want) {
			t.Errorf("answer %q does not say %q", msg, want)
		}
	}
	if strings.Contains(msg, "x_total") {
		t.Errorf("answer %q names x_total, whose zero is best effort", msg)
	}
	wantX := []prompb.Sample{{Timestamp: st}, {Timestamp: t1, Value: 5}, {Timestamp: t3, Value: 6}}
	for _, r := range c.receivers {
		got := r.stored(t, "default")
		if g := got[`{__name__="x_total"}`]; fmt.Sprint(g) != fmt.Sprint(wantX) {
			t.Errorf("receiver %s: x_total = %v, want %v", r.id, g, wantX)
		}
		if g := got[`{__name__="y"}`]; fmt.Sprint(g) != fmt.Sprint([]prompb.Sample{{Timestamp: yNew, Value: 1}}) {
			t.Errorf("receiver %s: y = %v, want only its sample at %d", r.id, g, yNew)
		}
	}
}

// TestStartTimestampZeroAfterSweep: a counter that restarts after the
// distributor forgot its series (the ingester's cached reference is then
// unknown to it, and the ingester resolves the series again from its
// labels) still gets its zero at the new start. The zero was appended
// under the forgotten reference alone, failed, and was not tried again.
func TestStartTimestampZeroAfterSweep(t *testing.T) {
	c := newShardedCluster(t, 3, 3, nil, nil, withCreatedTimestampZeros())
	now := time.Now().UnixMilli()
	s1, t1, s2, t2 := now-60_000, now-50_000, now-30_000, now-20_000
	for i, w := range []struct{ st, t int64 }{{s1, t1}, {s2, t2}} {
		if code, msg := c.postV2(t, v2Series{name: "x_total", samples: []writev2.Sample{{Value: float64(i + 1), Timestamp: w.t, StartTimestamp: w.st}}}); code != http.StatusNoContent {
			t.Fatalf("write %d: %d %s", i+1, code, msg)
		}
		c.settle(t)
		c.dist.Sweep() // the first sweep marks the series unused, the second forgets it
		c.dist.Sweep()
		if n := c.cachedSeries(); n != 0 {
			t.Fatalf("%d series cached after two sweeps", n)
		}
	}
	want := []prompb.Sample{{Timestamp: s1}, {Timestamp: t1, Value: 1}, {Timestamp: s2}, {Timestamp: t2, Value: 2}}
	for _, r := range c.receivers {
		if g := r.stored(t, "default")[`{__name__="x_total"}`]; fmt.Sprint(g) != fmt.Sprint(want) {
			t.Errorf("receiver %s: x_total = %v, want %v", r.id, g, want)
		}
	}
}

// TestRejectOutOfOrderIsNotAZero: an append with RejectOutOfOrder, as the
// rules manager makes every rule result's, is a sample like any other, sent
// as it is; only AppendZero asks for a zero.
func TestRejectOutOfOrderIsNotAZero(t *testing.T) {
	c := newCluster(t, 3, 3, nil)
	ts, err := c.dist.Tenant("default")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixMilli()
	app := ts.AppenderV2(t.Context())
	ls := labels.FromStrings("__name__", "gpu:temp:max")
	if _, err := app.Append(0, ls, 0, now, 61, nil, nil, storage.AOptions{RejectOutOfOrder: true}); err != nil {
		t.Fatal(err)
	}
	if err := app.Commit(); err != nil {
		t.Fatal(err)
	}
	want := []prompb.Sample{{Timestamp: now, Value: 61}}
	for _, r := range c.receivers {
		if g := r.stored(t, "default")[`{__name__="gpu:temp:max"}`]; fmt.Sprint(g) != fmt.Sprint(want) {
			t.Errorf("receiver %s: %v, want %v", r.id, g, want)
		}
	}
}
