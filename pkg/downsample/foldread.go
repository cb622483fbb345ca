package downsample

import (
	"context"
	"slices"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/value"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/util/annotations"

	"github.com/gpustore/gpustore/pkg/seriesset"
)

// Folding says how the downsampled data a select reads was folded (Fold):
// which labels were removed from the series of which metrics. The raw data
// read beside it (a range's recent hours, the receiver's local TSDB) is
// folded alike at read time (FoldSeries), so that a query that does not
// name a folded label gets one series per GPU over the whole range rather
// than the folded series up to where raw data begins and the per-pod ones
// after it, each with the windows of its part of a range that straddles
// the edge.
type Folding struct {
	Labels  []string
	Metrics map[string]bool
}

// Empty says nothing is folded.
func (f Folding) Empty() bool { return len(f.Labels) == 0 || len(f.Metrics) == 0 }

// Merge adds o's labels and metrics to f.
func (f *Folding) Merge(o Folding) {
	for _, l := range o.Labels {
		if !slices.Contains(f.Labels, l) {
			f.Labels = append(f.Labels, l)
		}
	}
	for m := range o.Metrics {
		if f.Metrics == nil {
			f.Metrics = map[string]bool{}
		}
		f.Metrics[m] = true
	}
}

// FoldingQuerier is a querier that can say, before a select, how the
// downsampled data the select will read was folded (the bucket store's).
type FoldingQuerier interface {
	Folding(ctx context.Context, hints *storage.SelectHints, ms ...*labels.Matcher) (Folding, error)
}

// Querier is what a query source opens (query.Source): a querier that also
// says how the downsampled data a select will read was folded, so that the
// raw series read beside it (local TSDB, receivers) are folded alike. A
// source of raw data only embeds NoFolding.
type Querier interface {
	storage.Querier
	FoldingQuerier
}

// NoFolding is the Folding of a querier of raw data only: nothing folded.
type NoFolding struct{}

// Folding implements FoldingQuerier.
func (NoFolding) Folding(context.Context, *storage.SelectHints, ...*labels.Matcher) (Folding, error) {
	return Folding{}, nil
}

// NoopQuerier is a source's querier with nothing for the range: it answers
// nothing and folds nothing. The query path's merge leaves it out.
func NoopQuerier() Querier { return noopQuerier{} }

type noopQuerier struct{ NoFolding }

func (noopQuerier) Select(context.Context, bool, *storage.SelectHints, ...*labels.Matcher) storage.SeriesSet {
	return storage.EmptySeriesSet()
}

func (noopQuerier) LabelValues(context.Context, string, *storage.LabelHints, ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return nil, nil, nil
}

func (noopQuerier) LabelNames(context.Context, *storage.LabelHints, ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return nil, nil, nil
}

func (noopQuerier) Close() error { return nil }

// WithoutView returns ms without an AggrLabel matcher (Rewrite's explicit
// views), which names no series of a block.
func WithoutView(ms []*labels.Matcher) []*labels.Matcher {
	if rest, _, ok, err := explicitView(ms); ok && err == nil {
		return rest
	}
	return ms
}

// FoldSeries folds the series of set (sorted by labels) as Fold folds raw
// series when it downsamples: the series of a folded metric that differ
// only in the folded labels become one, their samples merged in time order,
// one per timestamp. A member's staleness marker is dropped when there are
// several (the pod ended, the GPU goes on): the folded series ends when its
// last member's samples do, as the lookback delta lets it.
func FoldSeries(set storage.SeriesSet, f Folding) storage.SeriesSet {
	return &foldSet{in: set, f: f}
}

type foldSet struct {
	in      storage.SeriesSet
	f       Folding
	pending storage.Series // the first series of the next metric
	out     []storage.Series
	cur     storage.Series
	lb      labels.Builder
}

func (s *foldSet) Next() bool {
	if len(s.out) == 0 && !s.fill() {
		return false
	}
	s.cur, s.out = s.out[0], s.out[1:]
	return true
}

// fill reads the next metric's series into out, folded when the metric is.
func (s *foldSet) fill() bool {
	var batch []storage.Series
	if s.pending != nil {
		batch, s.pending = append(batch, s.pending), nil
	}
	for s.in.Next() {
		ser := s.in.At()
		if len(batch) > 0 && ser.Labels().Get(model.MetricNameLabel) != batch[0].Labels().Get(model.MetricNameLabel) {
			s.pending = ser
			break
		}
		batch = append(batch, ser)
	}
	if len(batch) == 0 {
		return false
	}
	if !s.f.Metrics[batch[0].Labels().Get(model.MetricNameLabel)] {
		s.out = batch
		return true
	}
	members := make([]relabeled, len(batch))
	for i, ser := range batch {
		s.lb.Reset(ser.Labels())
		s.lb.Del(s.f.Labels...)
		members[i] = relabeled{s.lb.Labels(), ser}
	}
	slices.SortStableFunc(members, func(a, b relabeled) int { return labels.Compare(a.lset, b.lset) })
	for i := 0; i < len(members); {
		j := i + 1
		for j < len(members) && labels.Equal(members[j].lset, members[i].lset) {
			j++
		}
		if j == i+1 {
			s.out = append(s.out, members[i])
		} else {
			group := make([]storage.Series, 0, j-i)
			for _, m := range members[i:j] {
				group = append(group, relabeled{m.lset, noStaleSeries{m.Series}})
			}
			s.out = append(s.out, seriesset.ChainedSeriesMerge(group...))
		}
		i = j
	}
	return true
}

func (s *foldSet) At() storage.Series                { return s.cur }
func (s *foldSet) Err() error                        { return s.in.Err() }
func (s *foldSet) Warnings() annotations.Annotations { return s.in.Warnings() }

// noStaleSeries is a series without its staleness markers.
type noStaleSeries struct{ storage.Series }

func (n noStaleSeries) Iterator(it chunkenc.Iterator) chunkenc.Iterator {
	if ni, ok := it.(*noStaleIterator); ok {
		ni.Iterator = n.Series.Iterator(ni.Iterator)
		return ni
	}
	return &noStaleIterator{Iterator: n.Series.Iterator(nil)}
}

type noStaleIterator struct{ chunkenc.Iterator }

func (n *noStaleIterator) skip(vt chunkenc.ValueType) chunkenc.ValueType {
	for vt != chunkenc.ValNone && n.stale(vt) {
		vt = n.Iterator.Next()
	}
	return vt
}

func (n *noStaleIterator) stale(vt chunkenc.ValueType) bool {
	switch vt {
	case chunkenc.ValFloat:
		_, v := n.Iterator.At()
		return value.IsStaleNaN(v)
	case chunkenc.ValHistogram:
		_, h := n.Iterator.AtHistogram(nil)
		return value.IsStaleNaN(h.Sum)
	case chunkenc.ValFloatHistogram:
		_, fh := n.Iterator.AtFloatHistogram(nil)
		return value.IsStaleNaN(fh.Sum)
	}
	return false
}

func (n *noStaleIterator) Next() chunkenc.ValueType        { return n.skip(n.Iterator.Next()) }
func (n *noStaleIterator) Seek(t int64) chunkenc.ValueType { return n.skip(n.Iterator.Seek(t)) }
