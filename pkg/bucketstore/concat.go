package bucketstore

import (
	"cmp"
	"context"
	"slices"

	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"

	"github.com/gpustore/gpustore/pkg/seriesset"
)

// A series of a long range is read from many blocks of one resolution (a
// year of 1h data: 28 blocks of 14 days). Prometheus' chained merge seeks
// every block's iterator at every Seek, which the engine calls once per
// step and series; after compaction the blocks a select reads do not
// overlap, and a series is their pieces one after another. spanQuerier
// tags each block's series with the time range its block reads, and
// mergeSpans concatenates pieces whose ranges are disjoint (a Seek moves
// through the pieces in order), falling back to the chained merge where
// they overlap (blocks not compacted yet, out-of-order data, replicas).

// spanQuerier is a block's querier whose series carry [lo, hi], the
// inclusive range it reads: its selects' hints are narrowed to it (the
// TSDB's block querier reads the hinted range rather than its own).
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

type spanSeries struct {
	storage.Series
	lo, hi int64
}

// mergeSpans merges the pieces of one series from several blocks.
func mergeSpans(series ...storage.Series) storage.Series {
	if len(series) == 1 {
		return series[0]
	}
	pieces := make([]spanSeries, 0, len(series))
	for _, s := range series {
		p, ok := s.(spanSeries)
		if !ok {
			return seriesset.ChainedSeriesMerge(series...)
		}
		pieces = append(pieces, p)
	}
	slices.SortFunc(pieces, func(a, b spanSeries) int { return cmp.Compare(a.lo, b.lo) })
	for i := 1; i < len(pieces); i++ {
		if pieces[i].lo <= pieces[i-1].hi {
			return seriesset.ChainedSeriesMerge(series...)
		}
	}
	return concatSeries{pieces: pieces}
}

// concatSeries is a series made of time-disjoint pieces in time order.
type concatSeries struct{ pieces []spanSeries }

func (c concatSeries) Labels() labels.Labels { return c.pieces[0].Labels() }

func (c concatSeries) Iterator(chunkenc.Iterator) chunkenc.Iterator {
	it := &concatIterator{its: make([]chunkenc.Iterator, len(c.pieces)), his: make([]int64, len(c.pieces))}
	for i, p := range c.pieces {
		it.its[i], it.his[i] = p.Iterator(nil), p.hi
	}
	return it
}

// concatIterator reads its pieces one after another.
type concatIterator struct {
	its []chunkenc.Iterator
	his []int64 // each piece's last possible time
	i   int     // the current piece
	err error
	// consecutive: the current sample follows the previous one in the same
	// piece. As in Prometheus' chained merge, a counter histogram's reset
	// hint is not trusted otherwise.
	consecutive bool
}

func (c *concatIterator) Next() chunkenc.ValueType {
	c.consecutive = true
	for c.i < len(c.its) {
		if vt := c.its[c.i].Next(); vt != chunkenc.ValNone {
			return vt
		}
		if c.err = c.its[c.i].Err(); c.err != nil {
			return chunkenc.ValNone
		}
		c.i++
		c.consecutive = false
	}
	return chunkenc.ValNone
}

// Seek skips the pieces that end before t without touching them.
func (c *concatIterator) Seek(t int64) chunkenc.ValueType {
	c.consecutive = false
	for c.i < len(c.its) && c.his[c.i] < t {
		c.i++
	}
	for c.i < len(c.its) {
		if vt := c.its[c.i].Seek(t); vt != chunkenc.ValNone {
			return vt
		}
		if c.err = c.its[c.i].Err(); c.err != nil {
			return chunkenc.ValNone
		}
		c.i++
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
