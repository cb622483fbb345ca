package query

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"

	"github.com/gpustore/gpustore/pkg/downsample"
	"github.com/gpustore/gpustore/pkg/seriesset"
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

// localMinTime is the oldest time the local TSDB holds data for (its oldest
// block or its head), math.MaxInt64 when it holds none.
func localMinTime(db *tenantdb.DB) int64 {
	from := int64(math.MaxInt64)
	if bs := db.Blocks(); len(bs) > 0 {
		from = bs[0].Meta().MinTime
	}
	if h := db.Head(); h.NumSeries() > 0 {
		from = min(from, h.MinTime())
	}
	return from
}

// localFromQuerier tells a source's selects from when the local TSDB serves
// the tenant's raw data (downsample.WithLocalFrom): the bucket store reads
// that range raw, never downsampled beside the same samples.
type localFromQuerier struct {
	storage.Querier
	from int64
}

func (q localFromQuerier) Select(ctx context.Context, sortSeries bool, hints *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
	if q.from != math.MaxInt64 {
		ctx = downsample.WithLocalFrom(ctx, q.from)
	}
	return q.Querier.Select(ctx, sortSeries, hints, ms...)
}

// Folding is the inner querier's (downsample.FoldingQuerier), with the
// same local range as its selects.
func (q localFromQuerier) Folding(ctx context.Context, hints *storage.SelectHints, ms ...*labels.Matcher) (downsample.Folding, error) {
	fq, ok := q.Querier.(downsample.FoldingQuerier)
	if !ok {
		return downsample.Folding{}, nil
	}
	if q.from != math.MaxInt64 {
		ctx = downsample.WithLocalFrom(ctx, q.from)
	}
	return fq.Folding(ctx, hints, ms...)
}

// foldingQuerier folds the raw series a select reads (the local TSDB's,
// the receivers', the bucket's raw blocks) as the downsampled data read
// beside them was folded (downsample.FoldSeries), so that one series per
// GPU runs through the whole range instead of the folded series up to where
// raw data begins and per-pod series after it.
type foldingQuerier struct {
	storage.Querier
	folders []downsample.FoldingQuerier
}

func (q foldingQuerier) Select(ctx context.Context, sortSeries bool, hints *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
	var f downsample.Folding
	for _, fq := range q.folders {
		g, err := fq.Folding(ctx, hints, ms...)
		if err != nil {
			return storage.ErrSeriesSet(err)
		}
		f.Merge(g)
	}
	if f.Empty() {
		return q.Querier.Select(ctx, sortSeries, hints, ms...)
	}
	return downsample.FoldSeries(q.Querier.Select(ctx, true, hints, ms...), f)
}

// receiversFrom is the oldest time the bucket is read raw from because the
// ring's receivers hold that range raw; math.MaxInt64 without receivers.
func (q TenantQueryable) receiversFrom() int64 {
	if q.Receivers == nil {
		return math.MaxInt64
	}
	return time.Now().Add(-q.ReceiversLookback).UnixMilli()
}

// openQuerier merges the tenant's head and local blocks, the ring's
// receivers and every source. Series present in several of them are merged
// (storage.ChainedSeriesMerge keeps one sample per timestamp: a receiver's
// replicas, a block both on disk and in the bucket), and every source is
// primary: an error of any (a bucket outage) fails the query rather than
// silently answering without its data. (The receivers source tolerates its
// replicas' failures itself, with a warning.)
//
// The receivers are read over the whole range: what they hold is there
// (backfilled or late samples older than their lookback; a block shipped
// but not yet seen by the bucket store), and a query must not hide it. The
// bucket reads raw data from receiversFrom on, where the receivers keep
// their data: a range both answers raw is merged sample by sample. (Only
// data older than that, still on a receiver and already downsampled in the
// bucket, could meet its own aggregates; the compactor downsamples only
// what has been in the bucket for longer than receivers keep blocks.)
func (q TenantQueryable) openQuerier(tenantID string, mint, maxt int64) (storage.Querier, error) {
	var qs []storage.Querier
	local := noLocalBlocks
	localFrom := int64(math.MaxInt64)
	if db := q.DBs.Existing(tenantID); db != nil {
		dq, err := db.Querier(mint, maxt)
		if err != nil {
			return nil, fmt.Errorf("open querier of tenant %q: %w", tenantID, err)
		}
		// Raw data answers the explicit aggregates of rewritten queries
		// (see API.resolution) as downsampled data does.
		qs = append(qs, downsample.NewRawQuerier(dq))
		local, localFrom = localBlocks(db), localMinTime(db)
	}
	if q.Receivers != nil {
		if rq := q.Receivers.Querier(tenantID, mint, maxt, noLocalBlocks); rq != nil {
			qs = append(qs, downsample.NewRawQuerier(rq))
			localFrom = min(localFrom, q.receiversFrom())
		}
	}
	var folders []downsample.FoldingQuerier
	for _, src := range q.Sources {
		if sq := src.Querier(tenantID, mint, maxt, local); sq != nil {
			lq := localFromQuerier{Querier: sq, from: localFrom}
			qs = append(qs, lq)
			if _, ok := sq.(downsample.FoldingQuerier); ok {
				folders = append(folders, lq)
			}
		}
	}
	var merged storage.Querier
	switch len(qs) {
	case 0:
		return storage.NoopQuerier(), nil
	case 1:
		merged = qs[0]
	default:
		merged = seriesset.NewMergeQuerier(qs, seriesset.ChainedSeriesMerge)
	}
	if len(folders) > 0 {
		return foldingQuerier{Querier: merged, folders: folders}, nil
	}
	return merged, nil
}

// openChunkQuerier is openQuerier for chunk queries.
func (q TenantQueryable) openChunkQuerier(tenantID string, mint, maxt int64) (storage.ChunkQuerier, error) {
	var qs []storage.ChunkQuerier
	local := noLocalBlocks
	if db := q.DBs.Existing(tenantID); db != nil {
		dq, err := db.ChunkQuerier(mint, maxt)
		if err != nil {
			return nil, fmt.Errorf("open chunk querier of tenant %q: %w", tenantID, err)
		}
		qs = append(qs, dq)
		local = localBlocks(db)
	}
	if q.Receivers != nil {
		if rq := q.Receivers.ChunkQuerier(tenantID, mint, maxt, noLocalBlocks); rq != nil {
			qs = append(qs, rq)
		}
	}
	for _, src := range q.Sources {
		if sq := src.ChunkQuerier(tenantID, mint, maxt, local); sq != nil {
			qs = append(qs, sq)
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
