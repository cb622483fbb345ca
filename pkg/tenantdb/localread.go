package tenantdb

import (
	"sync"

	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"

	"github.com/gpustore/gpustore/pkg/blockquery"
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

	mtx     sync.Mutex // one Querier call at a time per tenant
	collect *[]storage.Querier
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
	q, err := tsdb.NewBlockQuerier(b, mint, maxt)
	if err != nil {
		return nil, err
	}
	return seriesset.MemoQuerier(q), nil
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
