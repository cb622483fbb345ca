package deletion

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/util/annotations"
	"github.com/thanos-io/objstore"
)

func series(ls labels.Labels, ts ...int64) storage.Series {
	var s []chunks.Sample
	for _, t := range ts {
		s = append(s, sample{t, float64(t)})
	}
	return storage.NewListSeries(ls, s)
}

type sample struct {
	t int64
	v float64
}

func (s sample) T() int64                      { return s.t }
func (s sample) ST() int64                     { return 0 }
func (s sample) F() float64                    { return s.v }
func (s sample) H() *histogram.Histogram       { return nil }
func (s sample) FH() *histogram.FloatHistogram { return nil }
func (s sample) Type() chunkenc.ValueType      { return chunkenc.ValFloat }
func (s sample) Copy() chunks.Sample           { return s }

// Filter: a matching series loses the samples in the request's range (the
// range's ends included, as tombstones), a series left empty is not
// returned, others pass as they are; MIG instances are series like any.
func TestFilter(t *testing.T) {
	gpu := func(host, gpu, mig string) labels.Labels {
		b := labels.NewScratchBuilder(4)
		b.Add("__name__", "DCGM_FI_DEV_GPU_UTIL")
		b.Add("Hostname", host)
		b.Add("gpu", gpu)
		if mig != "" {
			b.Add("GPU_I_ID", mig)
		}
		b.Sort()
		return b.Labels()
	}
	r, err := New([]string{`{Hostname="node-1", GPU_I_ID=""}`, `DCGM_FI_DEV_GPU_UTIL{GPU_I_ID="3"}`}, 20, 40, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	in := []storage.Series{
		series(gpu("node-0", "0", ""), 10, 20, 30, 40, 50),
		series(gpu("node-1", "0", ""), 10, 20, 30, 40, 50),
		series(gpu("node-1", "1", ""), 20, 30, 40), // wholly deleted
		series(gpu("node-0", "0", "3"), 30, 60),    // a MIG instance: its series matches the second selector
		series(gpu("node-1", "0", "5"), 30),        // MIG on node-1: GPU_I_ID is set, the first selector does not match
	}
	got := map[string][]int64{}
	ss := Filter(&sliceSet{s: in}, []*Request{r})
	var it chunkenc.Iterator
	for ss.Next() {
		s := ss.At()
		it = s.Iterator(it)
		var ts []int64
		for it.Next() != chunkenc.ValNone {
			tt, _ := it.At()
			ts = append(ts, tt)
		}
		got[s.Labels().String()] = ts
	}
	if err := ss.Err(); err != nil {
		t.Fatal(err)
	}
	want := map[string][]int64{
		gpu("node-0", "0", "").String():  {10, 20, 30, 40, 50},
		gpu("node-1", "0", "").String():  {10, 50},
		gpu("node-0", "0", "3").String(): {60},
		gpu("node-1", "0", "5").String(): {30},
	}
	if len(got) != len(want) {
		t.Fatalf("series %v, want %v", got, want)
	}
	for k, w := range want {
		if g := got[k]; len(g) != len(w) || !equal(g, w) {
			t.Errorf("%s: %v, want %v", k, g, w)
		}
	}
	if Filter(storage.EmptySeriesSet(), nil) != storage.EmptySeriesSet() {
		t.Error("no requests: the set is not passed as it is")
	}
}

func equal(a, b []int64) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Requests round-trip through the bucket, are listed in the order they
// were made, and a cutoff record stays beside its request.
func TestWriteListCutoff(t *testing.T) {
	ctx := context.Background()
	bkt := objstore.NewInMemBucket()
	t0 := time.Now()
	var made []*Request
	for i := range 3 {
		r, err := New([]string{`{pod="alice"}`}, int64(i), 100, t0.Add(time.Duration(i)*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if err := Write(ctx, bkt, "t", r); err != nil {
			t.Fatal(err)
		}
		made = append(made, r)
	}
	if err := WriteCutoff(ctx, bkt, "t", made[0].ID, Cutoff{Time: t0, Checked: []ulid.ULID{made[1].ID}}); err != nil {
		t.Fatal(err)
	}
	got, err := List(ctx, bkt, "t", map[ulid.ULID]*Request{made[2].ID: made[2]})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].ID != made[0].ID || got[2] != made[2] {
		t.Fatalf("listed %v, want the 3 requests in order", got)
	}
	if !got[1].Matches(labels.FromStrings("pod", "alice")) || got[1].Matches(labels.FromStrings("pod", "bob")) || got[1].MinTime != 1 {
		t.Errorf("a request read back does not select what it was made for: %+v", got[1])
	}
	c, err := ReadCutoff(ctx, bkt, "t", made[0].ID)
	if err != nil || c == nil || len(c.Checked) != 1 || !c.Time.Equal(t0) {
		t.Errorf("cutoff: %+v %v", c, err)
	}
	if c, err := ReadCutoff(ctx, bkt, "t", made[1].ID); c != nil || err != nil {
		t.Errorf("cutoff of a request without one: %+v %v", c, err)
	}
	if _, err := New(nil, 0, 1, t0); err == nil {
		t.Error("a request without selectors was made")
	}
	if _, err := New([]string{"{"}, 0, 1, t0); err == nil {
		t.Error("a request with a bad selector was made")
	}
}

type sliceSet struct {
	s []storage.Series
	i int
}

func (s *sliceSet) Next() bool                        { s.i++; return s.i <= len(s.s) }
func (s *sliceSet) At() storage.Series                { return s.s[s.i-1] }
func (s *sliceSet) Err() error                        { return nil }
func (s *sliceSet) Warnings() annotations.Annotations { return nil }

// BenchmarkFilter: what a tenant with deletion requests pays per series a
// select returns from the bucket (1024 GPUs' series, 8 of them deleted; 120
// samples each), against the same set read without requests.
func BenchmarkFilter(b *testing.B) {
	var in []storage.Series
	ts := make([]int64, 120)
	for i := range ts {
		ts[i] = int64(i) * 30_000
	}
	for n := range 128 {
		for g := range 8 {
			in = append(in, series(labels.FromStrings("__name__", "DCGM_FI_DEV_GPU_UTIL", "Hostname", "node-"+strconv.Itoa(n), "gpu", strconv.Itoa(g)), ts...))
		}
	}
	r1, _ := New([]string{`{Hostname="node-7"}`}, 0, 1<<40, time.Now())
	r2, _ := New([]string{`{pod=~"alice-.*"}`}, 0, 1<<40, time.Now())
	for _, c := range []struct {
		name string
		reqs []*Request
	}{{"none", nil}, {"two requests", []*Request{r1, r2}}} {
		b.Run(c.name, func(b *testing.B) {
			var it chunkenc.Iterator
			for b.Loop() {
				ss := Filter(&sliceSet{s: in}, c.reqs)
				for ss.Next() {
					it = ss.At().Iterator(it)
					for it.Next() != chunkenc.ValNone {
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(in)), "ns/series")
		})
	}
}
