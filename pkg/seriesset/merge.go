// Package seriesset merges series sets for the query path: the blocks of
// a bucket segment, the local TSDB's blocks and head, the local TSDB beside
// the bucket, the ring's receivers.
//
// Prometheus' storage.NewMergeSeriesSet keeps its sets in a heap ordered by
// the labels of each set's current series: every series of every set is
// compared about 2·log2(k) times as it goes in and out of the heap, and a
// comparison of labels decodes both label sets string by string. Here
// (mergeSet) the sets are kept in a sorted list, and a set is put back by
// first asking whether its new series equals the series at the front, then
// comparing: the sets of one tenant hold mostly the same series (a series
// lives in the consecutive blocks of its lifetime), so a set usually
// advances in step with the others, and its new series equals theirs. With
// labels of one symbol table (pkg/blockquery builds the series of every
// block it caches in one), that equality is a comparison of their encoded
// bytes.
//
// Each set's current series is read with At once per Next (Prometheus'
// block series set builds a new series at every call).
//
// ChainedSeriesMerge (chain.go) merges the samples of a series found in
// several sets; MergeSpans (concat.go) concatenates them where they cannot
// overlap.
package seriesset

import (
	"context"
	"errors"
	"slices"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/util/annotations"
)

// NewMergeQuerier merges the selects of qs (all primary: an error of any
// fails the select) with merge for series found in several. No-op
// queriers (storage.NoopQuerier: a source with nothing for the range) are
// left out, as Prometheus' merge leaves them out, so that a source that has
// nothing costs no merge.
func NewMergeQuerier(qs []storage.Querier, merge storage.VerticalSeriesMergeFunc) storage.Querier {
	if slices.Contains(qs, storage.NoopQuerier()) {
		qs = slices.DeleteFunc(slices.Clone(qs), func(q storage.Querier) bool { return q == storage.NoopQuerier() })
	}
	switch len(qs) {
	case 0:
		return storage.NoopQuerier()
	case 1:
		return qs[0]
	}
	return &mergeQuerier{qs: qs, merge: merge}
}

type mergeQuerier struct {
	qs    []storage.Querier
	merge storage.VerticalSeriesMergeFunc
}

// Select selects from every querier, sorted (the merge needs it).
func (m *mergeQuerier) Select(ctx context.Context, _ bool, hints *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
	sets := make([]storage.SeriesSet, len(m.qs))
	for i, q := range m.qs {
		sets[i] = q.Select(ctx, true, hints, ms...)
	}
	return NewMergeSeriesSet(sets, m.merge)
}

// labelQuerier is Prometheus' merge of the label calls (sorted, unique,
// limited as the hints say), over queriers it does not close.
func (m *mergeQuerier) labelQuerier() storage.Querier {
	qs := make([]storage.Querier, len(m.qs))
	for i, q := range m.qs {
		qs[i] = noClose{q}
	}
	return storage.NewMergeQuerier(qs, nil, m.merge)
}

func (m *mergeQuerier) LabelValues(ctx context.Context, name string, hints *storage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return m.labelQuerier().LabelValues(ctx, name, hints, ms...)
}

func (m *mergeQuerier) LabelNames(ctx context.Context, hints *storage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return m.labelQuerier().LabelNames(ctx, hints, ms...)
}

func (m *mergeQuerier) Close() error {
	errs := make([]error, 0, len(m.qs))
	for _, q := range m.qs {
		errs = append(errs, q.Close())
	}
	return errors.Join(errs...)
}

type noClose struct{ storage.Querier }

func (noClose) Close() error { return nil }

// NewMergeSeriesSet merges sorted sets into one sorted set, with merge for
// the series found in several (given in the order of their sets).
func NewMergeSeriesSet(sets []storage.SeriesSet, merge storage.VerticalSeriesMergeFunc) storage.SeriesSet {
	if len(sets) == 1 {
		return sets[0]
	}
	return &mergeSet{sets: sets, merge: merge, cur: make([]storage.Series, len(sets)), lsets: make([]labels.Labels, len(sets))}
}

// mergeSet is a k-way merge of sorted series sets (see the package doc).
type mergeSet struct {
	sets  []storage.SeriesSet
	merge storage.VerticalSeriesMergeFunc
	cur   []storage.Series // each set's current series; nil once it is done
	lsets []labels.Labels  // their labels
	order []int            // the sets with a current series, by its labels
	group []int            // the sets whose series the last Next merged
	out   storage.Series
	parts []storage.Series
	err   error
	begun bool
}

func (m *mergeSet) Next() bool {
	if m.err != nil {
		return false
	}
	if !m.begun {
		m.begun = true
		for i := range m.sets {
			m.advance(i)
		}
	} else {
		for _, i := range m.group {
			m.advance(i)
		}
	}
	if m.err != nil || len(m.order) == 0 {
		m.out = nil
		return false
	}
	// The sets at the front with equal series make the next output.
	first := m.lsets[m.order[0]]
	n := 1
	for n < len(m.order) && labels.Equal(first, m.lsets[m.order[n]]) {
		n++
	}
	m.group = append(m.group[:0], m.order[:n]...)
	m.order = m.order[n:]
	if n == 1 {
		m.out = m.cur[m.group[0]]
		return true
	}
	slices.Sort(m.group) // series merged in the order of their sets
	m.parts = m.parts[:0]
	for _, i := range m.group {
		m.parts = append(m.parts, m.cur[i])
	}
	m.out = m.merge(m.parts...)
	return true
}

// advance moves set i to its next series and puts it in order.
func (m *mergeSet) advance(i int) {
	s := m.sets[i]
	if !s.Next() {
		m.cur[i] = nil
		if err := s.Err(); err != nil {
			m.err = err
		}
		return
	}
	m.cur[i] = s.At()
	m.lsets[i] = m.cur[i].Labels()
	m.insert(i)
}

// insert puts set i into order by its series' labels: at the front when
// they equal the front's (the common case, see the package doc), else
// where a binary search of the comparisons puts it.
func (m *mergeSet) insert(i int) {
	l := m.lsets[i]
	pos := 0
	if len(m.order) > 0 && !labels.Equal(l, m.lsets[m.order[0]]) {
		pos, _ = slices.BinarySearchFunc(m.order, l, func(j int, l labels.Labels) int {
			return labels.Compare(m.lsets[j], l)
		})
	}
	m.order = slices.Insert(m.order, pos, i)
}

func (m *mergeSet) At() storage.Series { return m.out }

func (m *mergeSet) Err() error { return m.err }

func (m *mergeSet) Warnings() annotations.Annotations {
	var ws annotations.Annotations
	for _, s := range m.sets {
		ws.Merge(s.Warnings())
	}
	return ws
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
