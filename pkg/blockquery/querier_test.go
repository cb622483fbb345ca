package blockquery

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/value"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/tsdbutil"

	"github.com/gpustore/gpustore/internal/seriesread"
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
			w := seriesread.Walk(t, want.Select(ctx, true, hints, ms...), pattern(), mint, maxt)
			for pass := range 2 { // cold, then from the cache
				g := seriesread.Walk(t, got.Select(ctx, false, hints, ms...), pattern(), mint, maxt)
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
