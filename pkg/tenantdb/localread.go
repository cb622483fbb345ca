package tenantdb

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"

	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"

	"github.com/gpustore/gpustore/pkg/blockquery"
	"github.com/gpustore/gpustore/pkg/limits/querylimit"
	"github.com/gpustore/gpustore/pkg/seriesset"
)

// localReads is how a tenant's TSDB is read: its persisted blocks through
// pkg/blockquery (selectors resolved once per block, chunks read without
// the TSDB's iterator layers), its head through the TSDB's own querier, and
// the parts concatenated where they cannot overlap (seriesset.MergeSpans)
// instead of merged sample by sample.
//
// tsdb.DB.Querier opens a querier per block and one for the head under the
// database's lock (so retention cannot close a block before its querier
// holds it) through tsdb.Options.BlockQuerierFunc, then merges them with
// Prometheus' chained merge. Querier below takes that call over: while it
// runs, the hook opens each persisted block's querier for Querier to merge
// itself and hands the TSDB a no-op querier (which its merge drops), so the
// TSDB's querier is the head's alone.
type localReads struct {
	cache *blockquery.Cache

	mtx           sync.Mutex // one Querier or ChunkQuerierUnmerged call at a time per tenant
	collect       *[]storage.Querier
	collectChunks *[]storage.ChunkQuerier
}

// blockChunkQuerier is the database's tsdb.Options.BlockChunkQuerierFunc:
// the TSDB's own, but while ChunkQuerierUnmerged runs, each persisted
// block's chunk querier (through pkg/blockquery: whole-chunk selects
// resolved once per block) is handed to it and the TSDB a no-op one, as
// blockQuerier does for Querier.
func (l *localReads) blockChunkQuerier(b tsdb.BlockReader, mint, maxt int64) (storage.ChunkQuerier, error) {
	if blk, ok := b.(*tsdb.Block); ok && l.collectChunks != nil {
		q, err := blockquery.NewChunkQuerier(blk, l.cache, mint, maxt, blockquery.Options{Key: blk.Meta().ULID.String()})
		if err != nil {
			return nil, err
		}
		*l.collectChunks = append(*l.collectChunks, q)
		return storage.NoopChunkedQuerier(), nil
	}
	return tsdb.NewBlockChunkQuerier(b, mint, maxt)
}

// ChunkQuerier is the TSDB's own chunk querier, opened under the lock
// ChunkQuerierUnmerged holds while it collects the blocks' chunk queriers
// (blockChunkQuerier), so that one opened meanwhile keeps its blocks.
func (db *DB) ChunkQuerier(mint, maxt int64) (storage.ChunkQuerier, error) {
	l := db.reads
	if l == nil {
		return db.DB.ChunkQuerier(mint, maxt)
	}
	l.mtx.Lock()
	defer l.mtx.Unlock()
	return db.DB.ChunkQuerier(mint, maxt)
}

// ChunkQuerierUnmerged returns a chunk querier of the tenant's blocks and
// head in [mint, maxt] whose series hold every part's chunks as they are,
// in order of their first time: where parts overlap (an out-of-order
// block beside an in-order one, or the head), their chunks overlap too,
// instead of being decoded, merged and encoded again as tsdb.DB's chunk
// querier does for every series found in several parts. For readers that
// merge overlapping chunks themselves: the ring's query processes, which
// merge replicas' chunks the same way (pkg/ringread).
func (db *DB) ChunkQuerierUnmerged(mint, maxt int64) (storage.ChunkQuerier, error) {
	l := db.reads
	if l == nil {
		return db.DB.ChunkQuerier(mint, maxt)
	}
	var qs []storage.ChunkQuerier
	l.mtx.Lock()
	l.collectChunks = &qs
	head, err := db.DB.ChunkQuerier(mint, maxt)
	l.collectChunks = nil
	l.mtx.Unlock()
	if err != nil {
		for _, q := range qs {
			_ = q.Close()
		}
		return nil, err
	}
	return storage.NewMergeChunkQuerier(append(qs, head), nil, concatChunks), nil
}

// concatChunks is a series' parts' chunks one after the other in order of
// their first time (each part's are in order), never re-encoded.
func concatChunks(parts ...storage.ChunkSeries) storage.ChunkSeries {
	if len(parts) == 1 {
		return parts[0]
	}
	return &storage.ChunkSeriesEntry{
		Lset: parts[0].Labels(),
		ChunkIteratorFn: func(chunks.Iterator) chunks.Iterator {
			var metas []chunks.Meta
			for _, p := range parts {
				it := p.Iterator(nil)
				for it.Next() {
					metas = append(metas, it.At())
				}
				if err := it.Err(); err != nil {
					return errChunks{err}
				}
			}
			slices.SortStableFunc(metas, func(a, b chunks.Meta) int { return cmp.Compare(a.MinTime, b.MinTime) })
			return storage.NewListChunkSeriesIterator(metas...)
		},
	}
}

// blockQuerier is the database's tsdb.Options.BlockQuerierFunc.
func (l *localReads) blockQuerier(b tsdb.BlockReader, mint, maxt int64) (storage.Querier, error) {
	if blk, ok := b.(*tsdb.Block); ok && l.collect != nil {
		m := blk.Meta()
		q, err := blockquery.NewQuerier(blk, l.cache, mint, maxt, blockquery.Options{Key: m.ULID.String()})
		if err != nil {
			return nil, err
		}
		*l.collect = append(*l.collect, seriesset.SpanQuerier(q, m.MinTime, m.MaxTime-1))
		return storage.NoopQuerier(), nil
	}
	// The head: its chunks are counted against the query's
	// max_fetched_chunk_bytes_per_query as the TSDB's querier reads them.
	counted := &countedReader{BlockReader: b}
	q, err := tsdb.NewBlockQuerier(counted, mint, maxt)
	if err != nil {
		return nil, err
	}
	return limitedQuerier{Querier: seriesset.MemoQuerier(q), r: counted}, nil
}

// countedReader is a block reader (the head's) whose chunks count against
// the limiter of the query reading it. A querier is opened per query, so
// its reader counts for one query: the limiter its selects carry.
type countedReader struct {
	tsdb.BlockReader
	limiter atomic.Pointer[querylimit.Limiter]
}

func (r *countedReader) Chunks() (tsdb.ChunkReader, error) {
	cr, err := r.BlockReader.Chunks()
	if err != nil {
		return nil, err
	}
	return countedChunks{ChunkReader: cr, r: r}, nil
}

type countedChunks struct {
	tsdb.ChunkReader
	r *countedReader
}

func (c countedChunks) ChunkOrIterable(meta chunks.Meta) (chunkenc.Chunk, chunkenc.Iterable, error) {
	chk, it, err := c.ChunkReader.ChunkOrIterable(meta)
	if err == nil && chk != nil {
		if l := c.r.limiter.Load(); l != nil {
			if err := l.AddChunkBytes(len(chk.Bytes())); err != nil {
				return nil, nil, err
			}
		}
	}
	return chk, it, err
}

// EnableChunkCache passes the TSDB's request for the head's chunk cache on
// (range queries read every chunk of a series in turn).
func (c countedChunks) EnableChunkCache() {
	if e, ok := c.ChunkReader.(interface{ EnableChunkCache() }); ok {
		e.EnableChunkCache()
	}
}

// limitedQuerier hands its selects' limiter to the reader its chunks come
// from.
type limitedQuerier struct {
	storage.Querier
	r *countedReader
}

func (q limitedQuerier) Select(ctx context.Context, sortSeries bool, hints *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
	if l := querylimit.From(ctx); l != nil {
		q.r.limiter.Store(l)
	}
	return q.Querier.Select(ctx, sortSeries, hints, ms...)
}

// Querier returns a querier of the tenant's blocks and head in [mint, maxt].
func (db *DB) Querier(mint, maxt int64) (storage.Querier, error) {
	l := db.reads
	if l == nil {
		return db.DB.Querier(mint, maxt)
	}
	// The head's samples begin no earlier than this, unless an
	// out-of-order sample older than it arrives while the query runs (it
	// is then not read, as any sample written after the query began).
	h := db.Head()
	headFrom := min(h.MinTime(), h.MinOOOTime())
	var blocks []storage.Querier
	l.mtx.Lock()
	l.collect = &blocks
	head, err := db.DB.Querier(mint, maxt)
	l.collect = nil
	l.mtx.Unlock()
	if err != nil {
		for _, q := range blocks {
			_ = q.Close()
		}
		return nil, err
	}
	if len(blocks) == 0 {
		return head, nil
	}
	qs := blocks
	if head != storage.NoopQuerier() {
		qs = append(qs, seriesset.SpanQuerier(head, max(mint, headFrom), maxt))
	}
	return seriesset.NewMergeQuerier(qs, seriesset.MergeSpans), nil
}

// errChunks is a chunk iterator that failed.
type errChunks struct{ err error }

func (errChunks) At() chunks.Meta { return chunks.Meta{} }
func (errChunks) Next() bool      { return false }
func (e errChunks) Err() error    { return e.err }
