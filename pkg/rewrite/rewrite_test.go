package rewrite

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/tombstones"

	"github.com/gpustore/gpustore/pkg/block"
)

const hour = int64(time.Hour / time.Millisecond)

// writeBlock cuts a 2h block of 8 GPUs' temperature, two of them with a
// pod label, at 15 s.
func writeBlock(t *testing.T, start int64) string {
	t.Helper()
	parent := t.TempDir()
	w, err := tsdb.NewBlockWriter(slog.New(slog.DiscardHandler), parent, 2*hour)
	if err != nil {
		t.Fatal(err)
	}
	app := w.Appender(context.Background())
	for gpu := range 8 {
		b := labels.NewScratchBuilder(4)
		b.Add("__name__", "DCGM_FI_DEV_GPU_TEMP")
		b.Add("gpu", strconv.Itoa(gpu))
		if gpu < 2 {
			b.Add("pod", fmt.Sprintf("alice-notebook-%d", gpu))
		}
		b.Sort()
		for ts := start; ts < start+2*hour; ts += 15_000 {
			if _, err := app.Append(0, b.Labels(), ts, float64(gpu*100)+float64((ts-start)/15_000)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := app.Commit(); err != nil {
		t.Fatal(err)
	}
	id, err := w.Flush(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(parent, id.String())
}

type sample struct {
	t int64
	v float64
}

// read returns every series' samples of the block in dir, by labels.
func read(t *testing.T, dir string) (map[string][]sample, []string) {
	t.Helper()
	b, err := tsdb.OpenBlock(nil, dir, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	q, err := tsdb.NewBlockQuerier(b, math.MinInt64, math.MaxInt64)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	out := map[string][]sample{}
	ss := q.Select(context.Background(), false, nil, labels.MustNewMatcher(labels.MatchRegexp, "__name__", ".+"))
	var it chunkenc.Iterator
	for ss.Next() {
		s := ss.At()
		it = s.Iterator(it)
		var got []sample
		for it.Next() == chunkenc.ValFloat {
			ts, v := it.At()
			got = append(got, sample{ts, v})
		}
		out[s.Labels().String()] = got
	}
	if err := ss.Err(); err != nil {
		t.Fatal(err)
	}
	ir, err := b.Index()
	if err != nil {
		t.Fatal(err)
	}
	defer ir.Close()
	var syms []string
	it2 := ir.Symbols()
	for it2.Next() {
		syms = append(syms, strings.Clone(it2.At())) // the index is unmapped at return
	}
	return out, syms
}

// TestDropSeriesLeavesNoTrace: a rewritten block has every sample of the
// series it keeps, none of the dropped ones, and not even their label
// values in its symbol table; it replaces its source (same sources, the
// source as parent) and passes verification.
func TestDropSeriesLeavesNoTrace(t *testing.T) {
	src := writeBlock(t, 0)
	before, _ := read(t, src)
	dst := t.TempDir()
	res, err := Block(context.Background(), nil, src, dst, Options{
		Drop: [][]*labels.Matcher{{labels.MustNewMatcher(labels.MatchRegexp, "pod", "alice-.*")}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Meta == nil || res.DroppedSeries != 2 {
		t.Fatalf("result %+v, want a block and 2 series dropped", res)
	}
	after, syms := read(t, res.Dir)
	if len(after) != 6 {
		t.Fatalf("%d series left, want 6", len(after))
	}
	for k, v := range after {
		if !slices.Equal(v, before[k]) {
			t.Errorf("%s: samples changed", k)
		}
	}
	for _, s := range syms {
		if s == "pod" || s == "alice-notebook-0" || s == "alice-notebook-1" {
			t.Errorf("symbol %q of a dropped series is still in the index", s)
		}
	}
	srcMeta, _ := block.ReadLocalMeta(src)
	if !slices.Equal(res.Meta.Compaction.Sources, srcMeta.Compaction.Sources) || len(res.Meta.Compaction.Parents) != 1 || res.Meta.Compaction.Parents[0].ULID != srcMeta.ULID {
		t.Errorf("compaction %+v: want the source's sources and the source as parent", res.Meta.Compaction)
	}
	if res.Meta.MinTime != srcMeta.MinTime || res.Meta.MaxTime != srcMeta.MaxTime {
		t.Errorf("range [%d,%d), want the source's [%d,%d)", res.Meta.MinTime, res.Meta.MaxTime, srcMeta.MinTime, srcMeta.MaxTime)
	}
	if _, err := block.VerifyLocal(context.Background(), res.Dir); err != nil {
		t.Fatal(err)
	}
}

// TestCutAndTombstones: a piece of the range holds exactly the samples in
// it, with its own identity; tombstones of the source are applied.
func TestCutAndTombstones(t *testing.T) {
	src := writeBlock(t, 0)
	before, _ := read(t, src)
	// Delete gpu 7's first half hour with a tombstone, as Prometheus'
	// delete_series API leaves it in a block (and a snapshot copies it).
	b, err := tsdb.OpenBlock(nil, src, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Delete(context.Background(), 0, hour/2-1, labels.MustNewMatcher(labels.MatchEqual, "gpu", "7")); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if v, err := block.VerifyLocal(context.Background(), src); err != nil || v.TombstonedSeries != 1 {
		t.Fatalf("verify: %+v %v, want one tombstoned series", v, err)
	}
	id := NewULID(12345)
	res, err := Block(context.Background(), nil, src, t.TempDir(), Options{MinTime: hour, MaxTime: 2 * hour, ULID: id, Lineage: Piece})
	if err != nil {
		t.Fatal(err)
	}
	if res.Meta.ULID != id || filepath.Base(res.Dir) != id.String() || !slices.Equal(res.Meta.Compaction.Sources, []ulid.ULID{id}) || res.Meta.Compaction.Level != 1 {
		t.Fatalf("piece meta %+v in %s, want ULID %s as its own source", res.Meta, res.Dir, id)
	}
	after, _ := read(t, res.Dir)
	for k, v := range before {
		var want []sample
		for _, s := range v {
			if s.t >= hour && s.t < 2*hour {
				want = append(want, s)
			}
		}
		if !slices.Equal(after[k], want) {
			t.Errorf("%s: %d samples, want the %d in [1h,2h)", k, len(after[k]), len(want))
		}
	}
	first, err := Block(context.Background(), nil, src, t.TempDir(), Options{MinTime: 0, MaxTime: hour, Lineage: Piece})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := read(t, first.Dir)
	for _, s := range got[`{__name__="DCGM_FI_DEV_GPU_TEMP", gpu="7"}`] {
		if s.t < hour/2 {
			t.Fatalf("gpu 7 has a tombstoned sample at %d", s.t)
		}
	}
	if tr, _, err := tombstones.ReadTombstones(first.Dir); err != nil {
		t.Fatal(err)
	} else if err := tr.Iter(func(storage.SeriesRef, tombstones.Intervals) error { return fmt.Errorf("tombstone left") }); err != nil {
		t.Fatal(err)
	}
}

// TestDropEverything: nothing left, no block.
func TestDropEverything(t *testing.T) {
	src := writeBlock(t, 0)
	res, err := Block(context.Background(), nil, src, t.TempDir(), Options{
		Drop: [][]*labels.Matcher{{labels.MustNewMatcher(labels.MatchEqual, "__name__", "DCGM_FI_DEV_GPU_TEMP")}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Meta != nil || res.DroppedSeries != 8 {
		t.Fatalf("result %+v, want no block and 8 series dropped", res)
	}
}

// NewULID returns a ULID with the given time and random entropy.
func NewULID(ms uint64) ulid.ULID { return ulid.MustNew(ms, rand.Reader) }
