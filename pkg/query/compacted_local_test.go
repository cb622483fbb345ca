package query

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/grafana/dskit/user"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/thanos-io/objstore/providers/filesystem"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/compact"
	"github.com/gpustore/gpustore/pkg/downsample"
	"github.com/gpustore/gpustore/pkg/readopts"
	"github.com/gpustore/gpustore/pkg/tenantdb"
)

// TestLocalBlocksBesideTheirCompactedCopy: the receiver's local blocks were
// shipped, compacted in the bucket into larger blocks and downsampled, and
// are still on local disk (inside the local retention). A query over the
// whole range reads each sample once — the local block and the compacted
// bucket block that holds the same samples are merged — at raw and when 5m
// data is asked for (the ranges the local TSDB serves are read raw, never
// from downsampled blocks beside the local raw ones).
func TestLocalBlocksBesideTheirCompactedCopy(t *testing.T) {
	ctx := context.Background()
	const t0 = int64(1_700_001_600_000) // a multiple of 16 minutes and of 5
	logger := slog.New(slog.DiscardHandler)
	cfg := tenantdb.DefaultConfig()
	cfg.BlockDuration = model.Duration(time.Minute)
	dbs, db := tenantDB(t, cfg, "t")
	const minutes = 20
	app := db.Appender(ctx)
	written := 0
	for ts := t0 + scrapeEvery; ts <= t0+minutes*minute; ts += scrapeEvery {
		for _, gpu := range []string{"0", "1"} {
			if _, err := app.Append(0, labels.FromStrings("__name__", "DCGM_FI_DEV_GPU_UTIL", "gpu", gpu), ts, float64(ts/scrapeEvery%97)); err != nil {
				t.Fatal(err)
			}
			written++
		}
	}
	if err := app.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := db.Compact(ctx); err != nil {
		t.Fatal(err)
	}
	// Ship every local block, as the shipper does, then compact and
	// downsample the bucket: levels 1m → 4m → 16m.
	bkt, err := filesystem.NewBucket(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range db.Blocks() {
		mustShip(t, ctx, bkt, b.Dir(), b.Meta(), "t")
	}
	ccfg := compact.DefaultConfig()
	ccfg.BlockRanges = compact.DurationList{model.Duration(time.Minute), model.Duration(4 * time.Minute), model.Duration(16 * time.Minute)}
	ccfg.LeaseSettle, ccfg.DeleteDelay, ccfg.RetentionRaw = 0, 0, 0
	c, err := compact.New(ccfg, bkt, t.TempDir(), nil, logger, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		if err := c.CompactTenant(ctx, "t"); err != nil {
			t.Fatal(err)
		}
	}
	store := mustSyncedStore(t, ctx, bkt)
	var compacted, downsampled int
	for _, m := range store.Blocks("t") {
		switch {
		case m.GPUStore.Downsample.Resolution != block.ResolutionRaw:
			downsampled++
		case m.GPUStore.Source == block.SourceCompactor:
			compacted++
		}
	}
	if local := len(db.Blocks()); local < 10 || compacted == 0 || downsampled == 0 {
		t.Fatalf("data not laid out as meant: %d local blocks, %d compacted and %d downsampled bucket blocks", local, compacted, downsampled)
	}

	q := TenantQueryable{DBs: dbs, Sources: []Source{store}}
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 1e6, Timeout: time.Minute, LookbackDelta: 5 * time.Minute})
	for _, res := range []string{"raw", "5m"} {
		r, _ := downsample.ParseMaxSourceResolution(res)
		o := readopts.Default()
		o.MaxSourceResolution = r
		qctx := readopts.NewContext(user.InjectOrgID(ctx, "t"), o)
		// The plain count_over_time and its rewritten form, as the API runs
		// it for tenants with downsampled blocks.
		for _, qs := range []string{`sum(count_over_time(DCGM_FI_DEV_GPU_UTIL[25m]))`,
			`sum(sum_over_time(DCGM_FI_DEV_GPU_UTIL{__gpustore_aggr__="count"}[25m]))`} {
			qry, err := engine.NewInstantQuery(qctx, q, nil, qs, time.UnixMilli(t0+minutes*minute))
			if err != nil {
				t.Fatal(err)
			}
			out := qry.Exec(qctx)
			if out.Err != nil {
				t.Fatal(out.Err)
			}
			v, err := out.Vector()
			if err != nil || len(v) != 1 || v[0].F != float64(written) {
				t.Errorf("max_source_resolution=%s: %s = %v %v, want %d (every sample once)", res, qs, v, err, written)
			}
			qry.Close()
		}
	}
}
