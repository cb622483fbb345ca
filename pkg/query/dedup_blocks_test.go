package query

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/grafana/dskit/user"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/thanos-io/objstore/providers/filesystem"

	"github.com/gpustore/gpustore/pkg/tenantdb"
)

// TestDedupAcrossHeadLocalAndBucketBlocks: replicas of two GPU series spread
// over blocks only in the bucket (minutes 0-4), local blocks (4-11) and the
// head (11-12), with switches inside a block, at a block boundary and in the
// head. The merged series has every 15 s scrape of the 12 minutes exactly
// once, and is what the reference rule makes of the samples written.
func TestDedupAcrossHeadLocalAndBucketBlocks(t *testing.T) {
	ctx := context.Background()
	const t0 = int64(1_700_000_040_000) // on a minute: blocks start on minutes
	// p0 sorts first but starts late, pauses and comes back; p1 (300 ms
	// behind) has a gap over two block boundaries and ends early.
	stretches := map[string][][2]int64{
		"p0": {{5 * minute, 10 * minute}, {11 * minute, 12 * minute}},
		"p1": {{0, 7 * minute}, {9 * minute, 11*minute + 30_000}},
	}
	lag := map[string]int64{"p0": 0, "p1": 300}
	written := map[string][][]fsample{} // gpu -> replicas p0, p1
	type point struct {
		lset labels.Labels
		s    fsample
	}
	var points []point
	for g := range 2 {
		gpu := fmt.Sprint(g)
		for i, r := range []string{"p0", "p1"} {
			var samples []fsample
			for _, st := range stretches[r] {
				for ts := st[0]; ts < st[1]; ts += scrapeEvery {
					s := fsample{t0 + ts + lag[r], float64(40 + i*10 + g)}
					samples = append(samples, s)
					points = append(points, point{labels.FromStrings("__name__", "DCGM_FI_DEV_GPU_TEMP", "gpu", gpu, "__replica__", r), s})
				}
			}
			written[gpu] = append(written[gpu], samples)
		}
	}
	slices.SortStableFunc(points, func(a, b point) int { return int(a.s.t - b.s.t) })

	cfg := tenantdb.DefaultConfig()
	cfg.BlockDuration = model.Duration(time.Minute)
	logger := slog.New(slog.DiscardHandler)
	open := func() *tenantdb.Manager {
		c := cfg
		c.Dir = t.TempDir()
		dbs, err := tenantdb.NewManager(c, logger, prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		return dbs
	}
	appendRange := func(db *tenantdb.DB, from, to int64) {
		app := db.Appender(ctx)
		for _, p := range points {
			if p.s.t >= t0+from && p.s.t < t0+to {
				if _, err := app.Append(0, p.lset, p.s.t, p.s.f); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := app.Commit(); err != nil {
			t.Fatal(err)
		}
	}

	// Minutes 0-4: a block per minute, only in the bucket (as after local
	// retention deleted them).
	bkt, err := filesystem.NewBucket(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	old := open()
	odb, err := old.Get("t")
	if err != nil {
		t.Fatal(err)
	}
	appendRange(odb, 0, 4*minute)
	for m := int64(0); m < 4; m++ {
		if err := odb.CompactHead(tsdb.NewRangeHead(odb.Head(), t0+m*minute, t0+(m+1)*minute-1)); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range odb.Blocks() {
		mustShip(t, ctx, bkt, b.Dir(), b.Meta(), "t")
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	store := mustSyncedStore(t, ctx, bkt)

	// Minutes 4-12: local blocks, the newest minute and a half in the head.
	dbs := open()
	defer dbs.Close()
	db, err := dbs.Get("t")
	if err != nil {
		t.Fatal(err)
	}
	appendRange(db, 4*minute, 12*minute)
	if err := db.Compact(ctx); err != nil {
		t.Fatal(err)
	}
	if nb, nl, hmin := len(store.Blocks("t")), len(db.Blocks()), db.Head().MinTime(); nb != 4 || nl < 6 || hmin > t0+11*minute+30_000 {
		t.Fatalf("data not spread as meant: %d bucket blocks, %d local blocks, head from minute %d", nb, nl, (hmin-t0)/minute)
	}

	q := TenantQueryable{DBs: dbs, Sources: []Source{store}}
	dctx := withDedup(user.InjectOrgID(ctx, "t"), []string{"__replica__"})
	temp := labels.MustNewMatcher(labels.MatchEqual, "__name__", "DCGM_FI_DEV_GPU_TEMP")
	querier, err := q.Querier(t0, t0+12*minute)
	if err != nil {
		t.Fatal(err)
	}
	defer querier.Close()
	merged := mergedSamples(t, querier.Select(dctx, true, nil, temp))
	if len(merged) != 2 {
		t.Fatalf("%d merged series, want 2", len(merged))
	}
	for gpu, got := range merged {
		if want := referenceDedup(written[gpu], scrapeEvery, false); !slices.Equal(got, want) {
			t.Errorf("gpu %s: merged %s\nreference %s", gpu, describeSamples(got), describeSamples(want))
		}
		slots := map[int64]int{}
		for _, s := range got {
			slots[(s.t-t0)/scrapeEvery]++
		}
		for slot := int64(0); slot < 12*minute/scrapeEvery; slot++ {
			if slots[slot] != 1 {
				t.Errorf("gpu %s: scrape %d (minute %.2f) is in the merged series %d times", gpu, slot, float64(slot*scrapeEvery)/minute, slots[slot])
			}
		}
	}
	// Chunk queries (remote read) merge the same way.
	cq, err := q.ChunkQuerier(t0, t0+12*minute)
	if err != nil {
		t.Fatal(err)
	}
	defer cq.Close()
	if chunked := mergedSamples(t, storage.NewSeriesSetFromChunkSeriesSet(cq.Select(dctx, true, nil, temp))); !maps.EqualFunc(chunked, merged, slices.Equal) {
		t.Errorf("the chunk querier merges differently:\n%v\n%v", chunked, merged)
	}

	// What a dashboard sees through PromQL.
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 1e6, Timeout: time.Minute, LookbackDelta: 5 * time.Minute})
	qry, err := engine.NewInstantQuery(dctx, q, nil, `sum(count_over_time(DCGM_FI_DEV_GPU_TEMP[12m]))`, time.UnixMilli(t0+12*minute))
	if err != nil {
		t.Fatal(err)
	}
	res := qry.Exec(dctx)
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	if v, err := res.Vector(); err != nil || len(v) != 1 || v[0].F != 2*48 {
		t.Fatalf("sum(count_over_time(...[12m])) = %v %v, want %d", v, err, 2*48)
	}
}

// mergedSamples reads a deduplicated series set: samples by gpu label.
func mergedSamples(t *testing.T, ss storage.SeriesSet) map[string][]fsample {
	t.Helper()
	out := map[string][]fsample{}
	for ss.Next() {
		s := ss.At()
		if s.Labels().Has("__replica__") {
			t.Fatalf("merged series keeps the replica label: %s", s.Labels())
		}
		it := s.Iterator(nil)
		for it.Next() == chunkenc.ValFloat {
			ts, v := it.At()
			out[s.Labels().Get("gpu")] = append(out[s.Labels().Get("gpu")], fsample{ts, v})
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := ss.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
