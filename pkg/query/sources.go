package query

import (
	"fmt"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/storage"

	"github.com/gpustore/gpustore/pkg/downsample"
	"github.com/gpustore/gpustore/pkg/tenantdb"
)

// Source is a place other than the tenant's local TSDB that holds its data:
// the bucket's blocks (pkg/bucketstore) today; downsampled blocks and the
// other receivers of a cluster later. All sources of a query are merged here,
// in one place (openQuerier/openChunkQuerier), with the head and local
// blocks.
//
// local reports the blocks the local TSDB serves to this query: a block that
// was just uploaded and is still on local disk (it stays until it is past
// the local retention) is read from disk, and the source leaves it out. The
// source returns nil when it has nothing for the range.
type Source interface {
	Querier(tenant string, mint, maxt int64, local func(ulid.ULID) bool) storage.Querier
	ChunkQuerier(tenant string, mint, maxt int64, local func(ulid.ULID) bool) storage.ChunkQuerier
}

// localBlocks lists the blocks of db. It is called after db's querier is
// opened: a block the TSDB deletes in between (only ever after its upload)
// is then read from both the querier's snapshot and the bucket, and the
// merge below deduplicates the identical samples; a block cut from the head
// in between is skipped by the bucket and read from the head's snapshot. So
// the race costs at most a duplicate read, never a missing sample.
//
// Excluding by ULID rather than by time range keeps reading bucket blocks
// that overlap local ones in time (out-of-order blocks, blocks of a previous
// data directory), which a time cut-off would drop or double.
func localBlocks(db *tenantdb.DB) func(ulid.ULID) bool {
	bs := db.Blocks()
	ids := make(map[ulid.ULID]struct{}, len(bs))
	for _, b := range bs {
		ids[b.Meta().ULID] = struct{}{}
	}
	return func(id ulid.ULID) bool { _, ok := ids[id]; return ok }
}

func noLocalBlocks(ulid.ULID) bool { return false }

// openQuerier merges the tenant's head and local blocks with every source.
// Series present in several sources are merged (storage.ChainedSeriesMerge
// keeps one sample per timestamp), and every source is primary: an error of
// any (a bucket outage) fails the query rather than silently answering
// without its data.
func openQuerier(dbs *tenantdb.Manager, sources []Source, tenantID string, mint, maxt int64) (storage.Querier, error) {
	var qs []storage.Querier
	local := noLocalBlocks
	if db := dbs.Existing(tenantID); db != nil {
		q, err := db.Querier(mint, maxt)
		if err != nil {
			return nil, fmt.Errorf("open querier of tenant %q: %w", tenantID, err)
		}
		// Raw data answers the explicit aggregates of rewritten queries
		// (see API.resolution) as downsampled data does.
		qs = append(qs, downsample.NewRawQuerier(q))
		local = localBlocks(db)
	}
	for _, src := range sources {
		if q := src.Querier(tenantID, mint, maxt, local); q != nil {
			qs = append(qs, q)
		}
	}
	switch len(qs) {
	case 0:
		return storage.NoopQuerier(), nil
	case 1:
		return qs[0], nil
	}
	return storage.NewMergeQuerier(qs, nil, storage.ChainedSeriesMerge), nil
}

// openChunkQuerier is openQuerier for chunk queries.
func openChunkQuerier(dbs *tenantdb.Manager, sources []Source, tenantID string, mint, maxt int64) (storage.ChunkQuerier, error) {
	var qs []storage.ChunkQuerier
	local := noLocalBlocks
	if db := dbs.Existing(tenantID); db != nil {
		q, err := db.ChunkQuerier(mint, maxt)
		if err != nil {
			return nil, fmt.Errorf("open chunk querier of tenant %q: %w", tenantID, err)
		}
		qs = append(qs, q)
		local = localBlocks(db)
	}
	for _, src := range sources {
		if q := src.ChunkQuerier(tenantID, mint, maxt, local); q != nil {
			qs = append(qs, q)
		}
	}
	switch len(qs) {
	case 0:
		return storage.NoopChunkedQuerier(), nil
	case 1:
		return qs[0], nil
	}
	return storage.NewMergeChunkQuerier(qs, nil, storage.NewCompactingChunkSeriesMerger(storage.ChainedSeriesMerge)), nil
}
