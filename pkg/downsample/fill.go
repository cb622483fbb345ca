package downsample

import (
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/value"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
)

// fillEvery is the spacing of the points a plain selector's view repeats
// between two window points: below the engine's 5 m default lookback delta,
// so that an instant selector at any time finds the current window's value
// (a 1h point is otherwise visible only during the 5 minutes after its
// window ends). 5m points need no fill: they tile the 5m lookback. With a
// lookback delta under 5 m, plain selectors see gaps in downsampled data.
const fillEvery int64 = 4 * 60 * 1000

// plainSelect reports whether a Select is an instant selector (no range:
// the engine only looks back for the latest point), whatever encloses it
// (an aggregation, a function of instant vectors, a subquery's steps).
func plainSelect(h *storage.SelectHints) bool {
	return h != nil && h.Range == 0
}

// filledSeries repeats each point of s every fillEvery until the next one,
// over gaps no longer than res (a longer gap is a series absent for a
// window, which stays absent). Staleness markers are not repeated. Points
// outside [from, to] are read but not returned: the window before from is
// what fills the start, the window after to tells that the series goes on
// (without it the last window of the range is not repeated, as at the end
// of a series).
type filledSeries struct {
	storage.Series
	res, from, to int64
}

func (f filledSeries) Iterator(it chunkenc.Iterator) chunkenc.Iterator {
	return &fillIterator{it: f.Series.Iterator(nil), res: f.res, from: f.from, to: f.to}
}

type fillIterator struct {
	it            chunkenc.Iterator
	res, from, to int64

	cur       point // the current point
	next      point // the inner iterator's next point, when nextValid
	nextValid bool
	started   bool
	exhausted bool // the inner iterator is
	done      bool // this one is
}

// point is a float or, for histogram series (kept samples of native
// histograms), a float histogram, which is passed through unfilled.
type point struct {
	t  int64
	v  float64
	fh *histogram.FloatHistogram
}

func (p point) valueType() chunkenc.ValueType {
	if p.fh != nil {
		return chunkenc.ValFloatHistogram
	}
	return chunkenc.ValFloat
}

// pull reads the inner iterator's next point.
func (f *fillIterator) pull() bool {
	switch f.it.Next() {
	case chunkenc.ValNone:
		f.exhausted = true
		return false
	case chunkenc.ValFloat:
		t, v := f.it.At()
		f.next = point{t: t, v: v}
	default:
		t, fh := f.it.AtFloatHistogram(nil)
		f.next = point{t: t, fh: fh}
	}
	f.nextValid = true
	return true
}

func (f *fillIterator) Next() chunkenc.ValueType {
	vt := f.next1()
	for vt != chunkenc.ValNone && f.cur.t < f.from {
		vt = f.next1()
	}
	if vt != chunkenc.ValNone && f.cur.t > f.to {
		vt = chunkenc.ValNone
	}
	f.done = vt == chunkenc.ValNone
	return vt
}

func (f *fillIterator) next1() chunkenc.ValueType {
	if f.done {
		return chunkenc.ValNone
	}
	if !f.started {
		f.started = true
		if !f.pull() {
			return chunkenc.ValNone
		}
		f.cur, f.nextValid = f.next, false
		return f.cur.valueType()
	}
	if !f.nextValid && !f.exhausted {
		f.pull()
	}
	if !f.nextValid {
		return chunkenc.ValNone
	}
	cand := f.cur.t + fillEvery
	if f.cur.fh == nil && !value.IsStaleNaN(f.cur.v) && cand < f.next.t && f.next.t-f.cur.t <= f.res {
		f.cur = point{t: cand, v: f.cur.v}
		return chunkenc.ValFloat
	}
	f.cur, f.nextValid = f.next, false
	return f.cur.valueType()
}

// Seek jumps over the repeated points before t rather than stepping through
// them: the engine seeks once per step, and a year-long panel's 35 h step
// over 1h data would otherwise walk through 500 repeats per step and series.
func (f *fillIterator) Seek(t int64) chunkenc.ValueType {
	if f.done {
		return chunkenc.ValNone
	}
	if f.started && f.cur.t >= t {
		return f.cur.valueType()
	}
	for {
		f.skipRepeats(t)
		vt := f.Next()
		if vt == chunkenc.ValNone || f.cur.t >= t {
			return vt
		}
	}
}

// skipRepeats moves the current point to the last repeat before t (or
// before the next real point, if that comes first), on the repeats' grid,
// when next1 repeats it: the point is a float, not a marker, and the next
// real point is within res.
func (f *fillIterator) skipRepeats(t int64) {
	if !f.started || f.cur.t >= t || f.cur.fh != nil || value.IsStaleNaN(f.cur.v) {
		return
	}
	if !f.nextValid && !f.exhausted {
		f.pull()
	}
	if !f.nextValid || f.next.t-f.cur.t > f.res {
		return
	}
	// Repeats strictly before t, and strictly before the next real point.
	k := min(t-f.cur.t-1, f.next.t-f.cur.t-1) / fillEvery
	if k > 0 {
		f.cur.t += k * fillEvery
	}
}

func (f *fillIterator) At() (int64, float64) { return f.cur.t, f.cur.v }

// AtHistogram is never called: histograms are returned as float histograms.
func (f *fillIterator) AtHistogram(*histogram.Histogram) (int64, *histogram.Histogram) {
	return f.cur.t, nil
}
func (f *fillIterator) AtFloatHistogram(fh *histogram.FloatHistogram) (int64, *histogram.FloatHistogram) {
	if fh == nil {
		return f.cur.t, f.cur.fh.Copy()
	}
	f.cur.fh.CopyTo(fh)
	return f.cur.t, fh
}
func (f *fillIterator) AtT() int64  { return f.cur.t }
func (f *fillIterator) AtST() int64 { return 0 }
func (f *fillIterator) Err() error  { return f.it.Err() }
