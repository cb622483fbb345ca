package tenantdb

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"

	"github.com/gpustore/gpustore/pkg/blockquery"
)

// TestChunkQuerierUnmerged: the chunk querier the ring's receivers answer
// from holds the samples the TSDB's own chunk querier holds, for random
// ranges, with out-of-order samples in blocks of their own overlapping
// in-order blocks and in the head; where parts overlap it passes their
// chunks on as stored (they overlap in its answer) instead of merging
// and encoding them again.
func TestChunkQuerierUnmerged(t *testing.T) {
	const hour = int64(time.Hour / time.Millisecond)
	m := newTestManager(t, func(c *Config) {
		c.BlockDuration = model.Duration(time.Hour)
		c.Retention = model.Duration(1000 * time.Hour)
	})
	m.SetLimits(windowLimits{window: 8 * time.Hour})
	m.SetBlockCache(blockquery.NewCache(64<<20, nil))
	db, err := m.Get("team-a")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rnd := rand.New(rand.NewPCG(9, 9))
	base := 100 * hour
	add := func(ts int64) {
		app := db.Appender(ctx)
		for gpu := range 4 {
			lset := labels.FromStrings("__name__", "gpu_temp", "gpu", fmt.Sprint(gpu), "Hostname", "gpu-node-001")
			if _, err := app.Append(0, lset, ts, float64(ts%1000)+rnd.Float64()); err != nil {
				t.Fatal(err)
			}
		}
		if err := app.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	// samples reads a chunk series set as the ring's query process does:
	// every chunk decoded, one sample per timestamp, cut to [mint, maxt].
	type sample struct {
		t int64
		f float64
	}
	samples := func(ss storage.ChunkSeriesSet, mint, maxt int64) (map[string][]sample, int) {
		out, overlaps := map[string][]sample{}, 0
		for ss.Next() {
			s := ss.At()
			var got []sample
			it := s.Iterator(nil)
			prevMax := int64(-1 << 63)
			for it.Next() {
				meta := it.At()
				if meta.MinTime <= prevMax {
					overlaps++
				}
				prevMax = max(prevMax, meta.MaxTime)
				ci := meta.Chunk.Iterator(nil)
				for ci.Next() == chunkenc.ValFloat {
					ts, f := ci.At()
					if ts >= mint && ts <= maxt {
						got = append(got, sample{ts, f})
					}
				}
			}
			if err := it.Err(); err != nil {
				t.Fatal(err)
			}
			slices.SortStableFunc(got, func(a, b sample) int { return int(a.t - b.t) })
			got = slices.CompactFunc(got, func(a, b sample) bool { return a.t == b.t })
			out[s.Labels().String()] = got
		}
		if err := ss.Err(); err != nil {
			t.Fatal(err)
		}
		return out, overlaps
	}
	check := func(stage string) int {
		overlaps := 0
		for round := range 30 {
			mint := base - hour + rnd.Int64N(9*hour)
			maxt := mint + rnd.Int64N(base+8*hour-mint)
			hints := &storage.SelectHints{Start: mint, End: maxt, DisableTrimming: true}
			ms := labels.MustNewMatcher(labels.MatchEqual, "__name__", "gpu_temp")
			want, err := db.DB.ChunkQuerier(mint, maxt)
			if err != nil {
				t.Fatal(err)
			}
			w, _ := samples(want.Select(ctx, true, hints, ms), mint, maxt)
			_ = want.Close()
			got, err := db.ChunkQuerierUnmerged(mint, maxt)
			if err != nil {
				t.Fatal(err)
			}
			g, n := samples(got.Select(ctx, true, hints, ms), mint, maxt)
			_ = got.Close()
			overlaps += n
			if fmt.Sprint(g) != fmt.Sprint(w) {
				t.Fatalf("%s: round %d [%d, %d]:\ngot  %.1500v\nwant %.1500v", stage, round, mint-base, maxt-base, g, w)
			}
		}
		return overlaps
	}
	for ts := base; ts < base+7*hour; ts += 30_000 {
		add(ts)
	}
	if err := db.Compact(ctx); err != nil {
		t.Fatal(err)
	}
	check("in order")
	for ts := base + hour + 15_000; ts < base+3*hour; ts += 600_000 {
		add(ts)
	}
	if err := db.CompactOOOHead(ctx); err != nil {
		t.Fatal(err)
	}
	for ts := base + 4*hour + 15_000; ts < base+5*hour; ts += 900_000 {
		add(ts)
	}
	if n := check("out of order"); n == 0 {
		t.Error("no overlapping chunks passed on: the out-of-order parts were merged and encoded again")
	}
}

// TestChunkQueriersConcurrently: a tenant's plain chunk querier (remote
// read through the query API) opened while a receiver's unmerged one opens
// gets every block, never one handed to the other.
func TestChunkQueriersConcurrently(t *testing.T) {
	const hour = int64(time.Hour / time.Millisecond)
	m := newTestManager(t, func(c *Config) {
		c.BlockDuration = model.Duration(time.Hour)
		c.Retention = model.Duration(1000 * time.Hour)
	})
	m.SetBlockCache(blockquery.NewCache(64<<20, nil))
	db, err := m.Get("team-a")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	base := 100 * hour
	lset := labels.FromStrings("__name__", "gpu_temp", "gpu", "0")
	for ts := base; ts < base+5*hour; ts += 60_000 {
		app := db.Appender(ctx)
		if _, err := app.Append(0, lset, ts, 1); err != nil {
			t.Fatal(err)
		}
		if err := app.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Compact(ctx); err != nil {
		t.Fatal(err)
	}
	count := func(open func(int64, int64) (storage.ChunkQuerier, error)) int {
		q, err := open(base, base+5*hour)
		if err != nil {
			t.Error(err)
			return -1
		}
		defer q.Close()
		ss := q.Select(ctx, false, &storage.SelectHints{Start: base, End: base + 5*hour, DisableTrimming: true},
			labels.MustNewMatcher(labels.MatchEqual, "__name__", "gpu_temp"))
		n := 0
		for ss.Next() {
			it := ss.At().Iterator(nil)
			for it.Next() {
				n += it.At().Chunk.NumSamples()
			}
		}
		return n
	}
	want := count(db.ChunkQuerier)
	if want != 300 {
		t.Fatalf("%d samples, want 300", want)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 300 {
			count(db.ChunkQuerierUnmerged)
		}
	}()
	for range 300 {
		if n := count(db.ChunkQuerier); n != want {
			t.Fatalf("the plain chunk querier read %d samples beside an unmerged one, want %d", n, want)
		}
	}
	<-done
}
