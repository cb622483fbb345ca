package query

import (
	"context"
	"log/slog"
	"testing"

	"github.com/prometheus/prometheus/tsdb"
	"github.com/thanos-io/objstore"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/storage/bucketstore"
)

// shipReceived uploads the TSDB block in dir to bkt as tenant's, as a
// receiver ships it.
func shipReceived(ctx context.Context, bkt objstore.Bucket, dir string, bm tsdb.BlockMeta, tenant string) error {
	meta := block.Meta{BlockMeta: bm, GPUStore: block.GPUStoreMeta{Version: block.MetaVersion, Tenant: tenant, Labels: map[string]string{}, Source: block.SourceReceive}}
	return block.Upload(ctx, bkt, dir, meta)
}

// syncedStore is a bucket store over bkt, synced once.
func syncedStore(ctx context.Context, bkt objstore.Bucket) (*bucketstore.Store, error) {
	store, err := bucketstore.New(bucketstore.DefaultConfig(), bkt, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		return nil, err
	}
	return store, store.Sync(ctx)
}

func mustShip(t testing.TB, ctx context.Context, bkt objstore.Bucket, dir string, bm tsdb.BlockMeta, tenant string) {
	t.Helper()
	if err := shipReceived(ctx, bkt, dir, bm, tenant); err != nil {
		t.Fatal(err)
	}
}

func mustSyncedStore(t testing.TB, ctx context.Context, bkt objstore.Bucket) *bucketstore.Store {
	t.Helper()
	store, err := syncedStore(ctx, bkt)
	if err != nil {
		t.Fatal(err)
	}
	return store
}
