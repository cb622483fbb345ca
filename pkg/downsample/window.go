package downsample

import (
	"math"

	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/value"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/util/kahansum"
)

// sample is one input point at its raw time t (a downsampled input point is
// given at its stored time + 1 ms). Exactly one of f, h, fh is used.
type sample struct {
	t  int64
	f  float64
	h  *histogram.Histogram
	fh *histogram.FloatHistogram
	// drops is how many raw samples were left out between the previous
	// sample of the series and this one (a kept counter sample's, see
	// counterSelector; 0 for a raw sample), or unknownDrops.
	drops int64
}

// unknownDrops is the drops of a sample read from data that does not
// record them: blocks written before pairs counted them, native
// histograms, and old-layout "counter" floats.
const unknownDrops = -1

// readSample is the point it is at (vt is what its Next returned).
func readSample(it chunkenc.Iterator, vt chunkenc.ValueType) sample {
	var s sample
	switch vt {
	case chunkenc.ValFloat:
		s.t, s.f = it.At()
	case chunkenc.ValHistogram:
		s.t, s.h = it.AtHistogram(nil)
	case chunkenc.ValFloatHistogram:
		s.t, s.fh = it.AtFloatHistogram(nil)
	}
	return s
}

// out is s as a point of a buffered series (bufIterator).
func (s *sample) out() outSample {
	switch {
	case s.h != nil:
		return outSample{t: s.t, kind: chunkenc.ValHistogram, h: s.h}
	case s.fh != nil:
		return outSample{t: s.t, kind: chunkenc.ValFloatHistogram, fh: s.fh}
	}
	return outSample{t: s.t, kind: chunkenc.ValFloat, f: s.f}
}

func (s *sample) isHistogram() bool { return s.h != nil || s.fh != nil }

// isGaugeHistogram says whether s is a native gauge histogram (its chunk
// says so: CounterResetHint GaugeType).
func (s *sample) isGaugeHistogram() bool {
	switch {
	case s.h != nil:
		return s.h.CounterResetHint == histogram.GaugeType
	case s.fh != nil:
		return s.fh.CounterResetHint == histogram.GaugeType
	}
	return false
}

func (s *sample) isStale() bool {
	switch {
	case s.h != nil:
		return value.IsStaleNaN(s.h.Sum)
	case s.fh != nil:
		return value.IsStaleNaN(s.fh.Sum)
	}
	return value.IsStaleNaN(s.f)
}

func (s *sample) floatHistogram() *histogram.FloatHistogram {
	if s.fh != nil {
		return s.fh
	}
	return s.h.ToFloat(nil)
}

// aggr is one window's gauge aggregates: the number of samples, their sum,
// minimum and maximum.
type aggr struct{ count, sum, min, max float64 }

// rawAggr is what one raw sample v adds to a window.
func rawAggr(v float64) aggr { return aggr{count: 1, sum: v, min: v, max: v} }

// reducer folds the aggregates of consecutive windows of one series into one
// aggregate per window of res, emitted at the window's end - 1 ms. Its input
// is raw samples (rawAggr) or the aggregates of finer windows (a packed 5m
// point, or one field of an old-layout 5m series). Counts and sums add (sums
// with Kahan compensation), min and max follow PromQL's min/max_over_time
// rule: NaN only if every value is NaN.
//
// Staleness markers are not values: they are passed on when a window's last
// point is one (the series ended there), as a marker after the window's
// aggregate, which then sits at the last real point's time - 1 ms rather than
// at the window's end, so an instant query sees the series end as it does on
// raw data.
type reducer struct {
	res       int64
	emit      func(t int64, a aggr)
	emitStale func(t int64)

	w         int64 // end of the current window; valid when open
	open      bool
	n         int
	a         aggr
	c         float64 // Kahan compensation of a.sum
	lastReal  int64
	staleAt   int64
	staleLast bool
}

func (r *reducer) window(t int64) {
	if w := windowEnd(t, r.res); !r.open || w != r.w {
		r.flush()
		r.w, r.open = w, true
	}
}

// addStale records a staleness marker at raw time t.
func (r *reducer) addStale(t int64) {
	r.window(t)
	r.staleLast, r.staleAt = true, t
}

// add folds in at raw time t.
func (r *reducer) add(t int64, in aggr) {
	r.window(t)
	r.staleLast, r.lastReal = false, t
	r.n++
	a := &r.a
	a.count += in.count
	a.sum, r.c = kahansum.Inc(in.sum, a.sum, r.c)
	if r.n == 1 || in.min < a.min || math.IsNaN(a.min) {
		a.min = in.min
	}
	if r.n == 1 || in.max > a.max || math.IsNaN(a.max) {
		a.max = in.max
	}
}

// flush emits the open window and closes it.
func (r *reducer) flush() {
	if !r.open {
		return
	}
	if r.n > 0 {
		at := r.w
		if r.staleLast {
			at = r.lastReal
		}
		a := r.a
		if !math.IsInf(a.sum, 0) {
			a.sum += r.c
		}
		r.emit(at-1, a)
	}
	if r.staleLast {
		r.emitStale(r.staleAt - 1)
	}
	r.open, r.n, r.a, r.c, r.staleLast = false, 0, aggr{}, 0, false
}

// counterSelector keeps the points of a counter series that PromQL's counter
// functions need (and every point of a native gauge histogram, which shares
// the histograms' "counter" series but is no counter): the first and last point of every window, both points of
// every counter reset (as PromQL detects it: a float below its predecessor,
// or a histogram whose DetectReset says so), every NaN with its neighbours,
// and every staleness marker. Between two kept points the input is a run
// without reset or NaN, so PromQL's reset-adjusted increase over the kept
// points equals the one over all points, resets() counts the same resets,
// and the run's minimum and maximum are its ends, which are kept.
// Kept points are emitted at their raw time - 1 ms, in order, each with the
// number of raw samples left out since the point kept before it (drops):
// where a series starts or ends inside their range, rate and increase
// extrapolate by half the average interval between raw samples, which the
// readers rebuild from it (densify.go). The points left out lie between
// two kept points of the same window, so a range of whole windows holds a
// kept point's drops whenever it holds the point.
type counterSelector struct {
	res  int64
	emit func(s *sample)

	prev        sample
	hasPrev     bool
	prevEmitted bool
	prevW       int64
	// dropped counts the raw samples left out since the last emitted
	// point, before prev (unknownDrops once one of them is unknown).
	dropped int64
}

func (c *counterSelector) add(s sample) {
	if s.isStale() {
		// PromQL drops markers from range vectors, so the points around it
		// are neighbours for reset detection; the marker itself ends the
		// series for instant queries. Keep the pending point so output
		// stays in time order.
		c.flushPrev()
		c.put(&s)
		return
	}
	w := windowEnd(s.t, c.res)
	keep := !c.hasPrev || w != c.prevW || c.breaksRun(&s)
	if keep {
		c.flushPrev()
		c.put(&s)
	} else if !c.prevEmitted {
		c.dropped = addDrops(c.dropped, addDrops(1, c.prev.drops)) // prev is left out
	}
	c.prev, c.hasPrev, c.prevEmitted, c.prevW = s, true, keep, w
}

// put emits s with the raw samples left out before it.
func (c *counterSelector) put(s *sample) {
	s.drops = addDrops(c.dropped, s.drops)
	c.dropped = 0
	c.emit(s)
}

// addDrops adds two counts of left-out samples, either of which may be
// unknown.
func addDrops(a, b int64) int64 {
	if a < 0 || b < 0 {
		return unknownDrops
	}
	return a + b
}

// breaksRun says whether s and the previous point may not be folded into one
// run: a reset, a NaN, a change between floats and histograms, or a gauge
// histogram (it goes up and down like any gauge, so there are no runs to
// fold: every sample is kept, and every function reads them all).
func (c *counterSelector) breaksRun(s *sample) bool {
	p := &c.prev
	if p.isHistogram() != s.isHistogram() || s.isGaugeHistogram() || p.isGaugeHistogram() {
		return true
	}
	if !s.isHistogram() {
		return s.f < p.f || math.IsNaN(s.f) || math.IsNaN(p.f)
	}
	cur, prev := s.floatHistogram(), p.floatHistogram()
	return cur.DetectReset(prev) || math.IsNaN(cur.Sum) || math.IsNaN(prev.Sum)
}

func (c *counterSelector) flushPrev() {
	if c.hasPrev && !c.prevEmitted {
		c.put(&c.prev)
		c.prevEmitted = true
	}
}

// finish emits the last point.
func (c *counterSelector) finish() { c.flushPrev() }
