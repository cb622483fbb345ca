package downsample

import (
	"fmt"
	"math"

	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/value"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
)

// A counter's kept samples (counterSelector: the first and last sample of
// every window, both samples of a reset, NaNs with their neighbours,
// staleness markers) are stored two at a time, as "pairs": one point holds
// two consecutive kept float samples of the same window, in the layout of a
// packed point (packed.go):
//
//	Count                 the first sample's value
//	Sum                   the second sample's value
//	PositiveBuckets[0]    the second's time minus the first's, in ms (> 0)
//	PositiveBuckets[1]    0
//
// stored at the second sample's time. A kept sample without a partner (a
// window's only sample, the odd one of a window with three, a staleness
// marker) is a point with a time difference of 0 and its value in both
// fields. Expanding the points gives back exactly the kept samples.
//
// Why: kept samples alternate between a window's first and last sample, so
// their time deltas alternate too (4 m 45 s, 15 s at a 15 s scrape) and the
// XOR chunk stores every timestamp in its 24-bit form (at 1h in its 64-bit
// form); a window's pair is one point per window, a regular time series
// whose timestamps take a bit and whose constant time difference another.
// Measured on one day of a counter at 15 s: 6.4 → 1.4 bytes per 5m window
// for a constant counter, 19.5 → 14.9 for a jittered float counter, and at
// 1h 17.2 → 3.1 and 31.5 → 16.9.
//
// The price of storing a point at its second sample's time: a range that
// ends between a pair's two samples must still read the pair (its first
// sample is inside), so readers of pairs widen the range they read by one
// window less a millisecond and drop the expanded samples outside the range
// they were asked for (pairIterator's lo and hi).

// pairWriter turns a series' kept float samples (in time order) into pairs.
type pairWriter struct {
	res     int64
	out     *outSeries
	first   sample
	pending bool
}

// add takes the next kept sample (raw time, as counterSelector emits it).
func (p *pairWriter) add(s *sample) {
	if p.pending && !s.isStale() && windowEnd(s.t, p.res) == windowEnd(p.first.t, p.res) {
		p.out.appendPair(&p.first, s)
		p.pending = false
		return
	}
	p.flush()
	if s.isStale() {
		p.out.appendPair(s, s)
		return
	}
	p.first, p.pending = *s, true
}

// flush writes a sample still waiting for its partner on its own.
func (p *pairWriter) flush() {
	if p.pending {
		p.out.appendPair(&p.first, &p.first)
		p.pending = false
	}
}

// appendPair appends the point of kept samples a and b (a alone when b is
// a), stored at b's raw time - 1 ms like every kept sample.
func (o *outSeries) appendPair(a, b *sample) {
	if value.IsStaleNaN(b.f) {
		o.append(outSample{t: b.t - 1, kind: chunkenc.ValFloatHistogram, stale: true})
		return
	}
	o.append(outSample{t: b.t - 1, kind: chunkenc.ValFloatHistogram, a: aggr{count: a.f, sum: b.f, min: float64(b.t - a.t)}})
}

// unpackPair reads a pair point stored at t: its first sample's time and
// value, and its second's value (the second is at t; first == t when the
// point holds one sample).
func unpackPair(t int64, fh *histogram.FloatHistogram) (first int64, v1, v2 float64, err error) {
	if value.IsStaleNaN(fh.Sum) {
		return t, fh.Sum, fh.Sum, nil
	}
	a, _, err := unpackAggr(fh)
	if err != nil {
		return 0, 0, 0, err
	}
	d := a.min
	if d < 0 || d != math.Trunc(d) || d > float64(Res1h) || a.max != 0 {
		return 0, 0, 0, fmt.Errorf("%s point at %d has a time difference of %g ms", AggrPairs, t, d)
	}
	return t - int64(d), a.count, a.sum, nil
}

// pairsSeries reads a pairs series as the kept float samples it holds, those
// in [lo, hi] (stored times, as the TSDB's block querier bounds them).
type pairsSeries struct {
	lset   labels.Labels
	s      storage.Series
	lo, hi int64
}

func (p pairsSeries) Labels() labels.Labels { return p.lset }

func (p pairsSeries) Iterator(it chunkenc.Iterator) chunkenc.Iterator {
	pi, ok := it.(*pairIterator)
	if !ok {
		pi = &pairIterator{}
	}
	*pi = pairIterator{it: p.s.Iterator(pi.it), lo: p.lo, hi: p.hi, fh: pi.fh}
	return pi
}

type pairIterator struct {
	floatOnly
	it     chunkenc.Iterator
	lo, hi int64
	fh     histogram.FloatHistogram

	t, t2   int64   // the current sample, the second of its pair
	v, v2   float64 // their values
	second  bool    // the current sample is the first of a pair: t2, v2 follow
	started bool
	done    bool
	err     error
}

// read expands the inner iterator's point (vt is what it returned) and
// makes its first sample current.
func (p *pairIterator) read(vt chunkenc.ValueType) bool {
	if vt == chunkenc.ValNone {
		p.done = true
		return false
	}
	if vt != chunkenc.ValFloatHistogram {
		p.err, p.done = fmt.Errorf("%s series holds a %s sample", AggrPairs, vt), true
		return false
	}
	p.started = true
	t, fh := p.it.AtFloatHistogram(&p.fh)
	first, v1, v2, err := unpackPair(t, fh)
	if err != nil {
		p.err, p.done = err, true
		return false
	}
	p.t, p.v = first, v1
	p.t2, p.v2, p.second = t, v2, first != t
	return true
}

// settle skips samples before lo and ends the iteration past hi.
func (p *pairIterator) settle() chunkenc.ValueType {
	for !p.done {
		switch {
		case p.t > p.hi:
			p.done = true
		case p.t >= p.lo:
			return chunkenc.ValFloat
		case p.second:
			p.t, p.v, p.second = p.t2, p.v2, false
		default:
			p.read(p.it.Next())
		}
	}
	return chunkenc.ValNone
}

func (p *pairIterator) Next() chunkenc.ValueType {
	if p.done {
		return chunkenc.ValNone
	}
	if p.second {
		p.t, p.v, p.second = p.t2, p.v2, false
	} else if !p.read(p.it.Next()) {
		return chunkenc.ValNone
	}
	return p.settle()
}

func (p *pairIterator) Seek(t int64) chunkenc.ValueType {
	if p.done {
		return chunkenc.ValNone
	}
	if p.started {
		if p.t >= t {
			return chunkenc.ValFloat
		}
		if p.second && p.t2 >= t {
			p.t, p.v, p.second = p.t2, p.v2, false
			return p.settle()
		}
	}
	// The point at or after t holds the first sample at or after t: every
	// earlier point's samples are before its stored time, so before t.
	if !p.read(p.it.Seek(max(t, p.lo))) {
		return chunkenc.ValNone
	}
	if p.t < t && p.second {
		p.t, p.v, p.second = p.t2, p.v2, false
	}
	return p.settle()
}

func (p *pairIterator) At() (int64, float64) { return p.t, p.v }
func (p *pairIterator) AtT() int64           { return p.t }
func (p *pairIterator) Err() error {
	if p.err != nil {
		return p.err
	}
	return p.it.Err()
}
