package seriesset

import (
	"cmp"
	"context"
	"math"
	"slices"

	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
)

// A series is often read from parts that cannot overlap in time: the
// blocks of one resolution after compaction (a year of 1h data is 28
// blocks of 14 days), or the bucket's blocks before the local TSDB's first
// time and the local TSDB after it (a 24 h panel of a receiver that has run
// for a day). Merging such parts sample by sample costs the chained
// iterator's bookkeeping at every sample and a scan of the parts at every
// Seek the engine makes (once per step and series). Parts that say which
// range they hold (SpanQuerier) are concatenated instead by MergeSpans,
// where their ranges are disjoint; it falls back to the chained merge
// otherwise (blocks not compacted yet, out-of-order data, replicas).

// MergeSpans merges the series of SpanQueriers (and what MergeSpans made of
// them) by concatenation where their ranges are disjoint, as
// ChainedSeriesMerge otherwise, and series of other queriers as
// ChainedSeriesMerge.
func MergeSpans(series ...storage.Series) storage.Series {
	if len(series) == 1 {
		return series[0]
	}
	if c := concatenation(series); c != nil {
		return c
	}
	return ChainedSeriesMerge(series...)
}

// SpanQuerier is q whose series hold samples in [lo, hi] (inclusive) only:
// its selects' hints are narrowed to the range (the TSDB's block querier
// reads the hinted range rather than its own) and its series carry it.
// The range may be wider than the data; hi must hold (the hints make the
// TSDB's queriers return no later sample), and a sample before lo is not
// read where the series is concatenated (concatIterator).
func SpanQuerier(q storage.Querier, lo, hi int64) storage.Querier {
	return spanQuerier{Querier: q, lo: lo, hi: hi}
}

type spanQuerier struct {
	storage.Querier
	lo, hi int64
}

func (q spanQuerier) Select(ctx context.Context, sorted bool, h *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
	if h != nil && (h.Start < q.lo || h.End > q.hi) {
		c := *h
		c.Start, c.End = max(c.Start, q.lo), min(c.End, q.hi)
		h = &c
	}
	return spanSet{SeriesSet: q.Querier.Select(ctx, sorted, h, ms...), lo: q.lo, hi: q.hi}
}

type spanSet struct {
	storage.SeriesSet
	lo, hi int64
}

func (s spanSet) At() storage.Series {
	return spanSeries{Series: s.SeriesSet.At(), lo: s.lo, hi: s.hi}
}

// spanSeries is a series of a SpanQuerier.
type spanSeries struct {
	storage.Series
	lo, hi int64
}

// concatenation returns series as one series read piece after piece when
// every one carries its range and the ranges are disjoint, nil otherwise.
// A concatenation among them contributes its pieces.
func concatenation(series []storage.Series) storage.Series {
	n := 0
	for _, s := range series {
		switch s := s.(type) {
		case spanSeries:
			n++
		case *concatSeries:
			n += len(s.pieces)
		default:
			return nil
		}
	}
	pieces := make([]spanSeries, 0, n)
	for _, s := range series {
		if c, ok := s.(*concatSeries); ok {
			pieces = append(pieces, c.pieces...)
			continue
		}
		pieces = append(pieces, s.(spanSeries))
	}
	slices.SortFunc(pieces, func(a, b spanSeries) int { return cmp.Compare(a.lo, b.lo) })
	for i := 1; i < len(pieces); i++ {
		if pieces[i].lo <= pieces[i-1].hi {
			return nil
		}
	}
	return &concatSeries{pieces: pieces}
}

// concatSeries is a series made of time-disjoint pieces in time order.
type concatSeries struct{ pieces []spanSeries }

func (c *concatSeries) Labels() labels.Labels { return c.pieces[0].Labels() }

func (c *concatSeries) Iterator(it chunkenc.Iterator) chunkenc.Iterator {
	ci, ok := it.(*concatIterator)
	if !ok {
		ci = &concatIterator{}
	}
	if cap(ci.its) < len(c.pieces) {
		ci.its = make([]chunkenc.Iterator, len(c.pieces))
	}
	ci.its, ci.pieces = ci.its[:len(c.pieces)], c.pieces
	for i, p := range c.pieces {
		ci.its[i] = p.Iterator(ci.its[i])
	}
	ci.i, ci.started, ci.err, ci.consecutive = 0, false, nil, false
	return ci
}

// concatIterator reads its pieces one after another. A piece is entered
// with a Seek to its lo: a sample before it (one the piece's source took
// in after its range was taken, such as an out-of-order append racing the
// query) would come out of order, and is not read.
type concatIterator struct {
	its     []chunkenc.Iterator
	pieces  []spanSeries
	i       int  // the current piece
	started bool // the current piece has been entered
	err     error
	// consecutive: the current sample follows the previous one in the same
	// piece. As in Prometheus' chained merge, a counter histogram's reset
	// hint is not trusted otherwise.
	consecutive bool
}

func (c *concatIterator) Next() chunkenc.ValueType {
	if c.i >= len(c.its) {
		return chunkenc.ValNone
	}
	if c.started {
		if vt := c.its[c.i].Next(); vt != chunkenc.ValNone {
			c.consecutive = true
			return vt
		}
		if c.err = c.its[c.i].Err(); c.err != nil {
			return chunkenc.ValNone
		}
		c.i++
	}
	return c.enter(math.MinInt64)
}

// Seek skips the pieces that end before t without touching them.
func (c *concatIterator) Seek(t int64) chunkenc.ValueType {
	for c.i < len(c.its) && c.pieces[c.i].hi < t {
		c.i, c.started = c.i+1, false
	}
	if c.i >= len(c.its) {
		return chunkenc.ValNone
	}
	c.consecutive = false
	if c.started {
		if vt := c.its[c.i].Seek(t); vt != chunkenc.ValNone {
			return vt
		}
		if c.err = c.its[c.i].Err(); c.err != nil {
			return chunkenc.ValNone
		}
		c.i++
	}
	return c.enter(t)
}

// enter enters the pieces from the current one on, at the first sample at
// or after both t and the piece's lo.
func (c *concatIterator) enter(t int64) chunkenc.ValueType {
	c.consecutive = false
	for ; c.i < len(c.its); c.i++ {
		c.started = true
		if vt := c.its[c.i].Seek(max(t, c.pieces[c.i].lo)); vt != chunkenc.ValNone {
			return vt
		}
		if c.err = c.its[c.i].Err(); c.err != nil {
			return chunkenc.ValNone
		}
	}
	return chunkenc.ValNone
}

func (c *concatIterator) At() (int64, float64) { return c.its[c.i].At() }

func (c *concatIterator) AtHistogram(h *histogram.Histogram) (int64, *histogram.Histogram) {
	t, h := c.its[c.i].AtHistogram(h)
	if !c.consecutive && h.CounterResetHint != histogram.GaugeType {
		h.CounterResetHint = histogram.UnknownCounterReset
	}
	return t, h
}

func (c *concatIterator) AtFloatHistogram(fh *histogram.FloatHistogram) (int64, *histogram.FloatHistogram) {
	t, fh := c.its[c.i].AtFloatHistogram(fh)
	if !c.consecutive && fh.CounterResetHint != histogram.GaugeType {
		fh.CounterResetHint = histogram.UnknownCounterReset
	}
	return t, fh
}

func (c *concatIterator) AtT() int64  { return c.its[c.i].AtT() }
func (c *concatIterator) AtST() int64 { return c.its[c.i].AtST() }
func (c *concatIterator) Err() error  { return c.err }
