package query

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/util/annotations"

	"github.com/gpustore/gpustore/pkg/downsample"
	"github.com/gpustore/gpustore/pkg/readopts"
	"github.com/gpustore/gpustore/pkg/seriesset"
	"github.com/gpustore/gpustore/pkg/tenantdb"
)

// Source is a place other than the tenant's local TSDB that holds its data:
// the bucket's blocks (pkg/storage/bucketstore) and the ring's receivers
// (pkg/ringread). All sources of a query are merged here, in one place
// (openQuerier/openChunkQuerier), with the head and local blocks.
//
// opts are the read's (readopts.ReadOptions): the request's, and what the
// caller serves itself, which the source leaves out or reads raw. A source
// with nothing for the range returns downsample.NoopQuerier (which the
// merges leave out), never nil. Its querier says how the downsampled data a
// select reads was folded (downsample.Querier; sources of raw data only
// embed downsample.NoFolding), so the raw series beside it fold alike.
type Source interface {
	Querier(tenant string, mint, maxt int64, opts readopts.ReadOptions) (downsample.Querier, error)
	ChunkQuerier(tenant string, mint, maxt int64, opts readopts.ReadOptions) (storage.ChunkQuerier, error)
	// HasDownsampled reports whether the source holds downsampled blocks
	// of the tenant: the API then rewrites the queries that need it
	// (downsample.Rewrite) and records the labels they name.
	HasDownsampled(tenant string) bool
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

// localDataFrom is the oldest time of any sample the local TSDB holds: its
// oldest block's, its head's and its out-of-order head's (math.MaxInt64
// when it holds none). openQuerier takes the older of the times before and
// after it opens the TSDB's querier, which then holds no older sample: a
// block it reads was in the TSDB before (it may be gone by retention
// after) or was cut from the head or the out-of-order head after (their
// samples were there before); a sample appended while the query runs is
// the only one that may be older, and is not read (seriesset.SpanQuerier).
func localDataFrom(db *tenantdb.DB) int64 {
	from := localMinTime(db)
	if h := db.Head(); h.NumSeries() > 0 {
		from = min(from, h.MinOOOTime())
	}
	return from
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
// The sources are told what the caller serves itself (opts.LocalBlocks,
// opts.LocalFrom): the local TSDB's blocks, which the bucket leaves out,
// and from when the local TSDB or the receivers hold raw data, which the
// bucket reads raw there.
//
// The receivers are read over the whole range: what they hold is there
// (backfilled or late samples older than their lookback; a block shipped
// but not yet seen by the bucket store), and a query must not hide it. The
// bucket reads raw data from receiversFrom on, where the receivers keep
// their data: a range both answers raw is merged sample by sample. (Only
// data older than that, still on a receiver and already downsampled in the
// bucket, could meet its own aggregates; the compactor downsamples only
// what has been in the bucket for longer than receivers keep blocks.)
func (q TenantQueryable) openQuerier(tenantID string, mint, maxt int64, opts readopts.ReadOptions) (storage.Querier, error) {
	var qs []storage.Querier
	src := opts // what the sources are told: nothing local yet
	if db := q.DBs.Existing(tenantID); db != nil {
		before := localDataFrom(db)
		dq, err := db.Querier(mint, maxt)
		if err != nil {
			return nil, fmt.Errorf("open querier of tenant %q: %w", tenantID, err)
		}
		// Raw data answers the explicit aggregates of rewritten queries
		// (see API.readOptions) as downsampled data does. Its series say
		// the range they hold: beside the bucket's blocks that end before
		// it, a series is read as the bucket's part, then the local one
		// (seriesset.MergeSpans), not merged sample by sample.
		from := min(max(mint, min(before, localDataFrom(db))), maxt)
		qs = append(qs, seriesset.SpanQuerier(downsample.NewRawQuerier(dq), from, maxt))
		src.LocalBlocks, src.LocalFrom = localBlocks(db), localMinTime(db)
	}
	openSources := func(src readopts.ReadOptions) ([]downsample.Querier, error) {
		sqs := make([]downsample.Querier, 0, len(q.Sources))
		for _, s := range q.Sources {
			sq, err := s.Querier(tenantID, mint, maxt, src)
			if err != nil {
				closeAll(sqs)
				return nil, fmt.Errorf("open querier of tenant %q: %w", tenantID, err)
			}
			if sq != downsample.NoopQuerier() {
				sqs = append(sqs, sq)
			}
		}
		return sqs, nil
	}
	var folders []downsample.FoldingQuerier
	if q.Receivers != nil {
		openReceivers := func(o readopts.ReadOptions) (storage.Querier, error) {
			rq, err := q.Receivers.Querier(tenantID, mint, maxt, o)
			if err != nil {
				return nil, fmt.Errorf("open querier of tenant %q: %w", tenantID, err)
			}
			return downsample.NewRawQuerier(rq), nil
		}
		rq, err := openReceivers(opts)
		if err != nil {
			closeAll(qs)
			return nil, err
		}
		src.LocalFrom = min(src.LocalFrom, q.receiversFrom())
		r := &ringQuerier{receivers: rq, receiverOpts: opts, openReceivers: openReceivers, opts: src, open: openSources}
		qs = append(qs, r)
		folders = append(folders, r)
	} else {
		sqs, err := openSources(src)
		if err != nil {
			closeAll(qs)
			return nil, err
		}
		for _, sq := range sqs {
			qs = append(qs, sq)
			folders = append(folders, sq)
		}
	}
	merged := seriesset.NewMergeQuerier(qs, seriesset.MergeSpans)
	if len(folders) > 0 {
		return foldingQuerier{Querier: merged, folders: folders}, nil
	}
	return merged, nil
}

// openChunkQuerier is openQuerier for chunk queries.
func (q TenantQueryable) openChunkQuerier(tenantID string, mint, maxt int64, opts readopts.ReadOptions) (storage.ChunkQuerier, error) {
	var qs []storage.ChunkQuerier
	fail := func(err error) (storage.ChunkQuerier, error) {
		for _, cq := range qs {
			_ = cq.Close()
		}
		return nil, fmt.Errorf("open chunk querier of tenant %q: %w", tenantID, err)
	}
	src := opts
	if db := q.DBs.Existing(tenantID); db != nil {
		dq, err := db.ChunkQuerier(mint, maxt)
		if err != nil {
			return fail(err)
		}
		qs = append(qs, dq)
		src.LocalBlocks = localBlocks(db)
	}
	if q.Receivers != nil {
		rq, err := q.Receivers.ChunkQuerier(tenantID, mint, maxt, opts)
		if err != nil {
			return fail(err)
		}
		qs = append(qs, rq)
	}
	for _, s := range q.Sources {
		sq, err := s.ChunkQuerier(tenantID, mint, maxt, src)
		if err != nil {
			return fail(err)
		}
		qs = append(qs, sq)
	}
	// The merge leaves out the no-op queriers of sources with nothing.
	return storage.NewMergeChunkQuerier(qs, nil, storage.NewCompactingChunkSeriesMerger(storage.ChainedSeriesMerge)), nil
}

func closeAll[Q storage.Querier](qs []Q) {
	for _, q := range qs {
		_ = q.Close()
	}
}

// ringQuerier reads the ring's receivers, then the sources (the bucket)
// without the blocks the receivers answered from their own disks.
//
// Receivers ship each block they cut and keep it on disk for their local
// retention, so for those hours the bucket holds a copy of what the
// receivers answer: one per receiver that shipped it (until the compactor
// merges them). Read beside the receivers' answers, every such copy is
// merged again sample by sample. A receiver's streamed answer lists the
// blocks it holds (ringread.LocalBlocksHeader), as of the moment its
// querier opened, and the receivers' source reports them to the select's
// own receivers querier (readopts.ReadOptions.ServedBlocks); the bucket's
// querier is opened after the receivers answered, leaving them out as it
// leaves out the blocks of the local TSDB. The receivers' select holds
// their answers whole before it returns, so the report is complete by
// then; a wrapper that deferred it would report nothing, and the bucket
// would read every block: more work, never missing data.
type ringQuerier struct {
	// receivers answers the label calls; each select opens its own
	// (openReceivers), told where to report the blocks it served.
	receivers     storage.Querier
	receiverOpts  readopts.ReadOptions // the request's
	openReceivers func(readopts.ReadOptions) (storage.Querier, error)
	// opts are the sources' options: the request's, the local TSDB's
	// blocks, and the raw time the local TSDB or the receivers hold.
	opts readopts.ReadOptions
	open func(readopts.ReadOptions) ([]downsample.Querier, error)

	mtx     sync.Mutex // the engine may select from several goroutines
	opened  []storage.Querier
	folders []downsample.Querier // the sources', opened on the first Folding
}

// Folding is the sources' (downsample.FoldingQuerier): how the downsampled
// data the select reads was folded. The receivers hold raw data only. The
// sources are opened for it once per querier, with every local block
// left out (which blocks are read does not change how they were folded).
func (q *ringQuerier) Folding(ctx context.Context, hints *storage.SelectHints, ms ...*labels.Matcher) (downsample.Folding, error) {
	q.mtx.Lock()
	if q.folders == nil {
		sqs, err := q.open(q.opts)
		if err != nil {
			q.mtx.Unlock()
			return downsample.Folding{}, err
		}
		for _, sq := range sqs {
			q.opened = append(q.opened, sq)
		}
		q.folders = append([]downsample.Querier{}, sqs...)
	}
	folders := q.folders
	q.mtx.Unlock()
	var f downsample.Folding
	for _, fq := range folders {
		g, err := fq.Folding(ctx, hints, ms...)
		if err != nil {
			return f, err
		}
		f.Merge(g)
	}
	return f, nil
}

func (q *ringQuerier) Select(ctx context.Context, _ bool, hints *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
	served := &servedBlocks{}
	ro := q.receiverOpts
	ro.ServedBlocks = served.add
	rq, err := q.openReceivers(ro)
	if err != nil {
		return storage.ErrSeriesSet(err)
	}
	q.mtx.Lock()
	q.opened = append(q.opened, rq)
	q.mtx.Unlock()
	sets := []storage.SeriesSet{rq.Select(ctx, true, hints, ms...)}
	opts := q.opts
	opts.LocalBlocks = served.or(q.opts.LocalBlocks)
	sqs, err := q.sources(opts)
	if err != nil {
		return storage.ErrSeriesSet(err)
	}
	for _, sq := range sqs {
		sets = append(sets, sq.Select(ctx, true, hints, ms...))
	}
	return seriesset.NewMergeSeriesSet(sets, seriesset.ChainedSeriesMerge)
}

// sources opens the sources' queriers, to be closed with q.
func (q *ringQuerier) sources(opts readopts.ReadOptions) ([]storage.Querier, error) {
	sqs, err := q.open(opts)
	if err != nil {
		return nil, err
	}
	qs := make([]storage.Querier, len(sqs))
	for i, sq := range sqs {
		qs[i] = sq
	}
	q.mtx.Lock()
	q.opened = append(q.opened, qs...)
	q.mtx.Unlock()
	return qs, nil
}

// all is the receivers beside every block of the sources (label calls).
func (q *ringQuerier) all() (storage.Querier, error) {
	sqs, err := q.sources(q.opts)
	if err != nil {
		return nil, err
	}
	return seriesset.NewMergeQuerier(append([]storage.Querier{q.receivers}, sqs...), seriesset.ChainedSeriesMerge), nil
}

func (q *ringQuerier) LabelValues(ctx context.Context, name string, hints *storage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	all, err := q.all()
	if err != nil {
		return nil, nil, err
	}
	return all.LabelValues(ctx, name, hints, ms...)
}

func (q *ringQuerier) LabelNames(ctx context.Context, hints *storage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	all, err := q.all()
	if err != nil {
		return nil, nil, err
	}
	return all.LabelNames(ctx, hints, ms...)
}

func (q *ringQuerier) Close() error {
	q.mtx.Lock()
	defer q.mtx.Unlock()
	errs := []error{q.receivers.Close()}
	for _, sq := range q.opened {
		errs = append(errs, sq.Close())
	}
	q.opened = nil
	return errors.Join(errs...)
}

// servedBlocks are the bucket blocks whose samples one select already had
// from the ring's receivers.
type servedBlocks struct {
	mtx sync.Mutex
	ids map[ulid.ULID]struct{}
}

// add records ids (readopts.ReadOptions.ServedBlocks of the select's
// receivers querier).
func (sb *servedBlocks) add(ids []ulid.ULID) {
	sb.mtx.Lock()
	defer sb.mtx.Unlock()
	if sb.ids == nil {
		sb.ids = make(map[ulid.ULID]struct{}, len(ids))
	}
	for _, id := range ids {
		sb.ids[id] = struct{}{}
	}
}

// or is local (nil: none) extended by the served blocks.
func (sb *servedBlocks) or(local func(ulid.ULID) bool) func(ulid.ULID) bool {
	sb.mtx.Lock()
	ids := sb.ids
	sb.mtx.Unlock()
	if len(ids) == 0 {
		return local
	}
	return func(id ulid.ULID) bool {
		if _, ok := ids[id]; ok {
			return true
		}
		return local != nil && local(id)
	}
}
