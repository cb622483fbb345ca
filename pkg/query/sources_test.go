package query

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/grafana/dskit/user"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/thanos-io/objstore"

	"github.com/gpustore/gpustore/pkg/downsample"
	"github.com/gpustore/gpustore/pkg/readopts"
	"github.com/gpustore/gpustore/pkg/storage/bucketstore"
	"github.com/gpustore/gpustore/pkg/tenantdb"
)

// spySource records what the merge asked of the bucket store.
type spySource struct {
	*bucketstore.Store
	skipped, asked int
}

func (s *spySource) Querier(tenant string, mint, maxt int64, o readopts.ReadOptions) (downsample.Querier, error) {
	s.asked++
	for _, m := range s.Blocks(tenant) {
		if o.Local(m.ULID) {
			s.skipped++
		}
	}
	return s.Store.Querier(tenant, mint, maxt, o)
}

func dumpAll(t *testing.T, ctx context.Context, q storage.Querier) (string, int) {
	t.Helper()
	ss := q.Select(ctx, true, nil, labels.MustNewMatcher(labels.MatchRegexp, "__name__", ".+"))
	out, n := "", 0
	for ss.Next() {
		it := ss.At().Iterator(nil)
		out += ss.At().Labels().String()
		for it.Next() == chunkenc.ValFloat {
			ts, v := it.At()
			out += fmt.Sprintf(" %d=%g", ts, v)
			n++
		}
		out += "\n"
	}
	if err := ss.Err(); err != nil {
		t.Fatal(err)
	}
	return out, n
}

// TestBucketBlocksMergeWithLocalOnes: blocks both on local disk and in the
// bucket are read once (from disk); blocks only in the bucket, and tenants
// with nothing local, are read from the bucket.
func TestBucketBlocksMergeWithLocalOnes(t *testing.T) {
	ctx := context.Background()
	cfg := tenantdb.DefaultConfig()
	cfg.Dir = t.TempDir()
	cfg.BlockDuration = model.Duration(time.Minute)
	dbs, err := tenantdb.NewManager(cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer dbs.Close()
	db, err := dbs.Get("team-a")
	if err != nil {
		t.Fatal(err)
	}
	const t0 = int64(1_700_000_040_000)
	for ts := t0; ts < t0+8*60_000; ts += 15_000 {
		app := db.Appender(ctx)
		for g := 0; g < 4; g++ {
			if _, err := app.Append(0, labels.FromStrings("__name__", "DCGM_FI_DEV_GPU_TEMP", "gpu", fmt.Sprint(g)), ts, float64(ts/1000%100+int64(g))); err != nil {
				t.Fatal(err)
			}
		}
		if err := app.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Compact(ctx); err != nil {
		t.Fatal(err)
	}
	blocks := db.Blocks()
	if len(blocks) < 4 {
		t.Fatalf("%d blocks cut", len(blocks))
	}
	bkt := objstore.NewInMemBucket()
	for _, b := range blocks {
		for _, tenant := range []string{"team-a", "team-b"} { // team-b: a tenant with nothing local
			mustShip(t, ctx, bkt, b.Dir(), b.Meta(), tenant)
		}
	}
	store := mustSyncedStore(t, ctx, bkt)
	spy := &spySource{Store: store}

	localOnly := TenantQueryable{DBs: dbs}
	merged := TenantQueryable{DBs: dbs, Sources: []Source{spy}}
	actx := user.InjectOrgID(ctx, "team-a")
	lq, _ := localOnly.Querier(0, 1<<62)
	want, n := dumpAll(t, actx, lq)
	mq, _ := merged.Querier(0, 1<<62)
	got, _ := dumpAll(t, actx, mq)
	if got != want || n != 8*4*4 {
		t.Fatalf("merged answer differs from the local one (%d samples)\nwant:\n%s\ngot:\n%s", n, want, got)
	}
	if spy.asked != 1 || spy.skipped != len(blocks) {
		t.Fatalf("the bucket was asked %d times and skipped %d of %d local blocks", spy.asked, spy.skipped, len(blocks))
	}
	lq.Close()
	mq.Close()

	// A tenant known only to the bucket.
	bctx := user.InjectOrgID(ctx, "team-b")
	bq, _ := merged.Querier(0, 1<<62)
	got, nb := dumpAll(t, bctx, bq)
	bq.Close()
	var inBlocks int
	for _, b := range blocks {
		inBlocks += int(b.Meta().Stats.NumSamples)
	}
	if nb != inBlocks || got == "" {
		t.Fatalf("bucket-only tenant: %d samples, the blocks hold %d", nb, inBlocks)
	}
	vals, _, err := func() ([]string, any, error) {
		q, _ := merged.Querier(0, 1<<62)
		defer q.Close()
		v, w, err := q.LabelValues(bctx, "gpu", nil)
		return v, w, err
	}()
	if err != nil || fmt.Sprint(vals) != "[0 1 2 3]" {
		t.Fatalf("label values from the bucket: %v %v", vals, err)
	}
}
