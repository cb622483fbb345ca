package tenantdb

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"

	"github.com/gpustore/gpustore/internal/seriesread"
	"github.com/gpustore/gpustore/pkg/blockquery"
)

// TestLocalReadsSameAsTSDB: a tenant's querier (blocks through
// pkg/blockquery, concatenated with the head) returns what the TSDB's own
// querier returns, sample for sample, for random ranges and read patterns:
// series that start and stop (churning pods) across blocks and the head,
// out-of-order samples in the head and in blocks compacted from it that
// overlap in-order blocks, with the cache cold and warm.
func TestLocalReadsSameAsTSDB(t *testing.T) {
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
	rnd := rand.New(rand.NewPCG(7, 7))
	base := 100 * hour
	add := func(ts int64, pod int) {
		app := db.Appender(ctx)
		for gpu := range 4 {
			lset := labels.FromStrings("__name__", "gpu_temp", "gpu", fmt.Sprint(gpu), "pod", fmt.Sprintf("job-%d", pod))
			if _, err := app.Append(0, lset, ts, float64(ts%1000)+rnd.Float64()); err != nil {
				t.Fatal(err)
			}
		}
		if err := app.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	check := func(stage string) {
		selectors := [][]*labels.Matcher{
			{labels.MustNewMatcher(labels.MatchEqual, "__name__", "gpu_temp")},
			{labels.MustNewMatcher(labels.MatchEqual, "__name__", "gpu_temp"), labels.MustNewMatcher(labels.MatchEqual, "gpu", "2")},
			{labels.MustNewMatcher(labels.MatchRegexp, "pod", "job-[1-4]")},
		}
		for round := range 40 {
			mint := base - hour + rnd.Int64N(9*hour)
			maxt := mint + rnd.Int64N(base+8*hour-mint)
			ms := selectors[rnd.IntN(len(selectors))]
			var hints *storage.SelectHints
			if rnd.IntN(2) == 0 {
				hints = &storage.SelectHints{Start: mint, End: maxt, Step: 60_000}
			}
			readSeed := rnd.Uint64()
			pattern := func() *rand.Rand {
				if readSeed%2 == 0 {
					return nil
				}
				return rand.New(rand.NewPCG(readSeed, 1))
			}
			want, err := db.DB.Querier(mint, maxt)
			if err != nil {
				t.Fatal(err)
			}
			w := seriesread.Walk(t, want.Select(ctx, true, hints, ms...), pattern(), mint, maxt)
			_ = want.Close()
			for pass := range 2 {
				got, err := db.Querier(mint, maxt)
				if err != nil {
					t.Fatal(err)
				}
				g := seriesread.Walk(t, got.Select(ctx, true, hints, ms...), pattern(), mint, maxt)
				_ = got.Close()
				if fmt.Sprint(g) != fmt.Sprint(w) {
					t.Fatalf("%s: round %d pass %d, %v [%d, %d]:\ngot  %d series %.1500v\nwant %d series %.1500v", stage, round, pass, ms, mint-base, maxt-base, len(g), g, len(w), w)
				}
			}
		}
	}
	// 7 h in order, a new pod every 50 minutes.
	for ts := base; ts < base+7*hour; ts += 30_000 {
		add(ts, int((ts-base)/(50*60_000)))
	}
	if err := db.Compact(ctx); err != nil {
		t.Fatal(err)
	}
	check("in order")
	// Out of order into hours already in blocks: some compacted into
	// blocks of their own, some left in the head.
	for ts := base + hour + 15_000; ts < base+3*hour; ts += 600_000 {
		add(ts, int((ts-base)/(50*60_000)))
	}
	if err := db.CompactOOOHead(ctx); err != nil {
		t.Fatal(err)
	}
	for ts := base + 4*hour + 15_000; ts < base+5*hour; ts += 900_000 {
		add(ts, int((ts-base)/(50*60_000)))
	}
	if n := len(db.Blocks()); n < 5 {
		t.Fatalf("%d blocks, want the in-order ones and the out-of-order ones", n)
	}
	check("out of order")
}
