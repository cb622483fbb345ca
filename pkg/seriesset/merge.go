// Package seriesset merges series sets the way Prometheus' storage package
// does, without rebuilding each set's current series at every comparison.
//
// storage.NewMergeQuerier and NewMergeSeriesSet keep their sets in a heap
// ordered by the labels of each set's current series, and read them with
// At at every push and pop. At of the TSDB's block series set allocates a
// new series on every call, and At of a merged set merges its pieces again,
// so a merge of merges (the local TSDB beside the bucket store, a bucket
// segment's blocks beside another segment) builds each series several
// times over before anyone reads it. The wrappers here call At once per
// Next and hand the same series to every comparison and to the caller.
//
// ChainedSeriesMerge (chain.go) is the merge function to pass them: the
// samples of a series found in several sets, without the allocations of
// Prometheus' chained iterator at every Seek.
package seriesset

import (
	"context"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
)

// NewMergeQuerier is storage.NewMergeQuerier over qs (all primary) with
// each select's current series built once.
func NewMergeQuerier(qs []storage.Querier, merge storage.VerticalSeriesMergeFunc) storage.Querier {
	if len(qs) == 1 {
		return qs[0]
	}
	wrapped := make([]storage.Querier, len(qs))
	for i, q := range qs {
		wrapped[i] = MemoQuerier(q)
	}
	return storage.NewMergeQuerier(wrapped, nil, merge)
}

// MemoQuerier returns q with each select's current series built once per
// Next (see Memo), for merges this package does not build: the TSDB's own
// merge of its head and blocks (tsdb.Options.BlockQuerierFunc).
func MemoQuerier(q storage.Querier) storage.Querier {
	if m, ok := q.(memoQuerier); ok {
		return m
	}
	return memoQuerier{q}
}

// NewMergeSeriesSet is storage.NewMergeSeriesSet over sets with each set's
// current series built once.
func NewMergeSeriesSet(sets []storage.SeriesSet, merge storage.VerticalSeriesMergeFunc) storage.SeriesSet {
	if len(sets) == 1 {
		return sets[0]
	}
	wrapped := make([]storage.SeriesSet, len(sets))
	for i, s := range sets {
		wrapped[i] = Memo(s)
	}
	return storage.NewMergeSeriesSet(wrapped, 0, merge)
}

type memoQuerier struct{ storage.Querier }

func (q memoQuerier) Select(ctx context.Context, sortSeries bool, hints *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
	return Memo(q.Querier.Select(ctx, sortSeries, hints, ms...))
}

// Memo returns s with At built once per Next. A series set's series stay
// readable after Next (the SeriesSet contract), so handing the same one out
// several times is safe.
func Memo(s storage.SeriesSet) storage.SeriesSet {
	if m, ok := s.(*memoSet); ok {
		return m
	}
	return &memoSet{SeriesSet: s}
}

type memoSet struct {
	storage.SeriesSet
	cur storage.Series
}

func (m *memoSet) Next() bool {
	m.cur = nil
	return m.SeriesSet.Next()
}

func (m *memoSet) At() storage.Series {
	if m.cur == nil {
		m.cur = m.SeriesSet.At()
	}
	return m.cur
}
