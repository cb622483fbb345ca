package blockquery

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/value"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/tsdbutil"
)

// testBlock writes a block of series that start and stop at random
// (churning pods), with random gaps, stale markers and some native
// histograms, spanning several chunks each, and opens it.
func testBlock(t testing.TB, rnd *rand.Rand) *tsdb.Block {
	t.Helper()
	dir := t.TempDir()
	const blockLen = 4 * 3600 * 1000
	w, err := tsdb.NewBlockWriter(slog.New(slog.DiscardHandler), dir, blockLen)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	app := w.Appender(ctx)
	for s := range 60 {
		lset := labels.FromStrings("__name__", []string{"gpu_temp", "gpu_util", "energy"}[s%3],
			"Hostname", fmt.Sprintf("node-%d", s%4), "gpu", fmt.Sprint(s%8), "pod", fmt.Sprintf("job-%d", s/8))
		from := int64(rnd.IntN(blockLen / 2))
		to := from + int64(rnd.IntN(blockLen/2)) + 1
		step := int64(15000 + rnd.IntN(3)*15000)
		hist := s%11 == 0
		for ts := from; ts < to; ts += step {
			if rnd.IntN(50) == 0 {
				ts += int64(rnd.IntN(20)) * step // a gap
				if ts >= to {
					break
				}
			}
			switch {
			case hist:
				h := tsdbutil.GenerateTestHistogram(int64(ts / step))
				_, err = app.AppendHistogram(0, lset, ts, h, nil)
			case rnd.IntN(100) == 0:
				_, err = app.Append(0, lset, ts, math.Float64frombits(value.StaleNaN))
			default:
				_, err = app.Append(0, lset, ts, float64(ts/1000)+rnd.Float64())
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := app.Commit(); err != nil {
		t.Fatal(err)
	}
	id, err := w.Flush(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	b, err := tsdb.OpenBlock(nil, filepath.Join(dir, id.String()), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

var testSelectors = [][]*labels.Matcher{
	{labels.MustNewMatcher(labels.MatchEqual, "__name__", "gpu_temp")},
	{labels.MustNewMatcher(labels.MatchEqual, "__name__", "gpu_util"), labels.MustNewMatcher(labels.MatchEqual, "Hostname", "node-1")},
	{labels.MustNewMatcher(labels.MatchRegexp, "__name__", "gpu_.*"), labels.MustNewMatcher(labels.MatchNotEqual, "gpu", "3")},
	{labels.MustNewMatcher(labels.MatchEqual, "__name__", "energy"), labels.MustNewMatcher(labels.MatchRegexp, "pod", "job-[0-3]")},
	{labels.MustNewMatcher(labels.MatchEqual, "__name__", "none")},
}

// sample is one sample as an iterator gives it.
type sample struct {
	t  int64
	f  float64
	h  string
	vt chunkenc.ValueType
}

func (s sample) String() string {
	if s.vt == chunkenc.ValFloat {
		return fmt.Sprintf("%d=%v", s.t, math.Float64bits(s.f))
	}
	return fmt.Sprintf("%d=%s", s.t, s.h)
}

func at(it chunkenc.Iterator, vt chunkenc.ValueType) sample {
	switch vt {
	case chunkenc.ValFloat:
		t, f := it.At()
		return sample{t: t, f: f, vt: vt}
	case chunkenc.ValHistogram, chunkenc.ValFloatHistogram:
		t, fh := it.AtFloatHistogram(nil)
		return sample{t: t, h: fh.String(), vt: vt}
	}
	return sample{}
}

// walk reads a series set as the engine does: every sample, or a Seek per
// step with Next in between now and then; it returns the labels and what
// each read returned.
func walk(t testing.TB, ss storage.SeriesSet, rnd *rand.Rand, mint, maxt int64) []string {
	t.Helper()
	var out []string
	var it chunkenc.Iterator
	for ss.Next() {
		s := ss.At()
		var sb strings.Builder
		sb.WriteString(s.Labels().String())
		it = s.Iterator(it)
		if rnd == nil {
			for vt := it.Next(); vt != chunkenc.ValNone; vt = it.Next() {
				fmt.Fprintf(&sb, " %s", at(it, vt))
			}
		} else {
			step := int64(10_000 + rnd.IntN(600_000))
			for ts := mint - int64(rnd.IntN(100_000)); ts <= maxt+step; ts += step {
				vt := it.Seek(ts)
				if vt == chunkenc.ValNone {
					sb.WriteString(" end")
					break
				}
				fmt.Fprintf(&sb, " s%d:%s", ts, at(it, vt))
				if rnd.IntN(3) == 0 {
					if vt = it.Next(); vt == chunkenc.ValNone {
						sb.WriteString(" end")
						break
					}
					fmt.Fprintf(&sb, " n:%s", at(it, vt))
				}
			}
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
		out = append(out, sb.String())
	}
	if err := ss.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestSameAsBlockQuerier: for random blocks, ranges, hints and read
// patterns, a select through this package (cache cold and warm) returns
// exactly what the TSDB's block querier returns.
func TestSameAsBlockQuerier(t *testing.T) {
	ctx := context.Background()
	cache := NewCache(64<<20, nil)
	for seed := range uint64(6) {
		rnd := rand.New(rand.NewPCG(seed, 42))
		b := testBlock(t, rnd)
		m := b.Meta()
		for round := range 40 {
			mint := m.MinTime + rnd.Int64N(m.MaxTime-m.MinTime)
			maxt := mint + rnd.Int64N(m.MaxTime-mint)
			var hints *storage.SelectHints
			if rnd.IntN(2) == 0 {
				hints = &storage.SelectHints{Start: mint + rnd.Int64N(60_000), End: maxt - rnd.Int64N(60_000), Step: 60_000}
			}
			ms := testSelectors[rnd.IntN(len(testSelectors))]
			want, err := tsdb.NewBlockQuerier(b, mint, maxt)
			if err != nil {
				t.Fatal(err)
			}
			got, err := NewQuerier(b, cache, mint, maxt, Options{Key: m.ULID.String()})
			if err != nil {
				t.Fatal(err)
			}
			closeLater(t, want, got)
			readSeed := rnd.Uint64()
			var pattern func() *rand.Rand
			if rnd.IntN(2) == 0 {
				pattern = func() *rand.Rand { return rand.New(rand.NewPCG(readSeed, 1)) }
			} else {
				pattern = func() *rand.Rand { return nil }
			}
			w := walk(t, want.Select(ctx, true, hints, ms...), pattern(), mint, maxt)
			for pass := range 2 { // cold, then from the cache
				g := walk(t, got.Select(ctx, false, hints, ms...), pattern(), mint, maxt)
				if fmt.Sprint(g) != fmt.Sprint(w) {
					t.Fatalf("seed %d round %d pass %d, %v [%d, %d] hints %+v:\ngot  %d series %.2000v\nwant %d series %.2000v",
						seed, round, pass, ms, mint, maxt, hints, len(g), g, len(w), w)
				}
			}
		}
	}
}

// closeLater closes queriers before the blocks they hold (cleanups run
// last in, first out): a block waits for its readers before it closes.
func closeLater(t testing.TB, qs ...storage.Querier) {
	t.Cleanup(func() {
		for _, q := range qs {
			_ = q.Close()
		}
	})
}
