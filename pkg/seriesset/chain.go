package seriesset

import (
	"math"

	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
)

// ChainedSeriesMerge is storage.ChainedSeriesMerge (one sample per
// timestamp from series that may overlap) with an iterator built for the
// query path, where the engine calls Seek once per step and series:
//
//   - Prometheus' chained iterator builds a new heap of every part at every
//     Seek and allocates a slice at every Err; this one keeps each part's
//     current timestamp, moves the current part alone while it stays ahead
//     of the others and scans the parts only when they take turns,
//     allocating nothing after it is built;
//   - a Seek leaves parts already at or past the time where they are
//     instead of seeking each again;
//   - a part that is itself a chained series (a merge of merges: the bucket
//     beside the local TSDB, a downsampled view beside another) is merged
//     as its parts, one level instead of nested iterators.
//
// Where timestamps are equal the earlier part's sample is kept (Prometheus
// keeps an unspecified one; both are meant for identical samples).
func ChainedSeriesMerge(series ...storage.Series) storage.Series {
	switch len(series) {
	case 0:
		return nil
	case 1:
		return series[0]
	}
	parts := make([]storage.Series, 0, len(series))
	for _, s := range series {
		if c, ok := s.(*chainedSeries); ok {
			parts = append(parts, c.parts...)
			continue
		}
		parts = append(parts, s)
	}
	return &chainedSeries{lset: series[0].Labels(), parts: parts}
}

type chainedSeries struct {
	lset  labels.Labels
	parts []storage.Series
}

func (s *chainedSeries) Labels() labels.Labels { return s.lset }

func (s *chainedSeries) Iterator(it chunkenc.Iterator) chunkenc.Iterator {
	return ChainSampleIterator(it, s.parts)
}

// ChainSampleIterator iterates over series' samples in time order, one per
// timestamp (see ChainedSeriesMerge), reusing it when it is one of its own.
func ChainSampleIterator(it chunkenc.Iterator, series []storage.Series) chunkenc.Iterator {
	c, ok := it.(*chainIterator)
	if !ok {
		c = &chainIterator{}
	}
	if cap(c.parts) < len(series) {
		c.parts = make([]part, len(series))
	}
	c.parts = c.parts[:len(series)]
	for i, s := range series {
		c.parts[i] = part{it: s.Iterator(c.parts[i].it)}
	}
	c.curr, c.other, c.lastT, c.consecutive, c.err = -1, -1, math.MinInt64, false, nil
	return c
}

// part is one series' iterator and where it stands.
type part struct {
	it    chunkenc.Iterator
	state partState
	t     int64              // the current sample's timestamp when positioned
	vt    chunkenc.ValueType // and its type
}

type partState uint8

const (
	unstarted partState = iota
	positioned
	exhausted
)

type chainIterator struct {
	parts []part
	curr  int // the part whose sample is current; -1 before the first and after the last
	// other is the earliest positioned part but curr (-1: none): while
	// curr's next sample comes before other's, Next moves curr alone.
	// Frames of a remote-read stream or blocks one after another make many
	// parts that seldom take turns.
	other int
	lastT int64
	// consecutive says the current sample follows the previous one in the
	// same part (no Seek, no switch), as Prometheus' iterator tracks it for
	// the counter-reset hints of histograms.
	consecutive bool
	err         error
}

// move positions p with Next (next) or Seek(t), recording an error.
func (c *chainIterator) move(p *part, next bool, t int64) bool {
	if next {
		p.vt = p.it.Next()
	} else {
		p.vt = p.it.Seek(t)
	}
	if p.vt == chunkenc.ValNone {
		p.state = exhausted
		if err := p.it.Err(); err != nil {
			c.err = err
			return false
		}
		return true
	}
	p.state, p.t = positioned, p.it.AtT()
	return true
}

// pick makes the earliest positioned part current (the first of equals)
// and finds the next earliest, first stepping every part off the timestamp
// just returned (another part's copy of it).
func (c *chainIterator) pick() chunkenc.ValueType {
	best, other := -1, -1
	for i := range c.parts {
		p := &c.parts[i]
		for p.state == positioned && p.t <= c.lastT {
			if !c.move(p, true, 0) {
				c.curr = -1
				return chunkenc.ValNone
			}
		}
		switch {
		case p.state != positioned:
		case best < 0 || p.t < c.parts[best].t:
			best, other = i, best
		case other < 0 || p.t < c.parts[other].t:
			other = i
		}
	}
	c.curr, c.other = best, other
	if best < 0 {
		return chunkenc.ValNone
	}
	c.lastT = c.parts[best].t
	return c.parts[best].vt
}

func (c *chainIterator) Next() chunkenc.ValueType {
	if c.err != nil {
		return chunkenc.ValNone
	}
	prev := c.curr
	if prev < 0 {
		if c.lastT != math.MinInt64 { // exhausted (or emptied by a Seek)
			return chunkenc.ValNone
		}
		for i := range c.parts { // the first Next
			if p := &c.parts[i]; p.state == unstarted && !c.move(p, true, 0) {
				return chunkenc.ValNone
			}
		}
	} else {
		p := &c.parts[prev]
		if !c.move(p, true, 0) {
			c.curr = -1
			return chunkenc.ValNone
		}
		// Before the other parts' earliest (which is then after the sample
		// just returned: no copy of it to step off), curr goes on alone.
		if p.state == positioned && (c.other < 0 || p.t < c.parts[c.other].t) {
			c.lastT, c.consecutive = p.t, true
			return p.vt
		}
	}
	vt := c.pick()
	c.consecutive = prev >= 0 && c.curr == prev
	return vt
}

func (c *chainIterator) Seek(t int64) chunkenc.ValueType {
	if c.err != nil {
		return chunkenc.ValNone
	}
	if c.curr >= 0 && c.lastT >= t {
		return c.parts[c.curr].vt
	}
	if c.curr < 0 && c.lastT != math.MinInt64 {
		return chunkenc.ValNone // exhausted: Seek does not go back
	}
	for i := range c.parts {
		p := &c.parts[i]
		if p.state == exhausted || (p.state == positioned && p.t >= t) {
			continue
		}
		if !c.move(p, false, t) {
			c.curr = -1
			return chunkenc.ValNone
		}
	}
	// Every positioned part is at or past t, after the last sample returned.
	c.lastT = math.MinInt64
	vt := c.pick()
	if c.curr < 0 {
		c.lastT = math.MaxInt64 // exhausted
	}
	c.consecutive = false
	return vt
}

func (c *chainIterator) At() (int64, float64) {
	return c.parts[c.curr].it.At()
}

func (c *chainIterator) AtHistogram(h *histogram.Histogram) (int64, *histogram.Histogram) {
	t, h := c.parts[c.curr].it.AtHistogram(h)
	// Across parts, nothing says whether the counter reset in between.
	if !c.consecutive && h.CounterResetHint != histogram.GaugeType {
		h.CounterResetHint = histogram.UnknownCounterReset
	}
	return t, h
}

func (c *chainIterator) AtFloatHistogram(fh *histogram.FloatHistogram) (int64, *histogram.FloatHistogram) {
	t, fh := c.parts[c.curr].it.AtFloatHistogram(fh)
	if !c.consecutive && fh.CounterResetHint != histogram.GaugeType {
		fh.CounterResetHint = histogram.UnknownCounterReset
	}
	return t, fh
}

func (c *chainIterator) AtT() int64 { return c.lastT }

func (c *chainIterator) AtST() int64 { return c.parts[c.curr].it.AtST() }

func (c *chainIterator) Err() error { return c.err }
