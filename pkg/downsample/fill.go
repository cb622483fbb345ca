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
// before from are read (they are what fills the start) but not returned.
type filledSeries struct {
	storage.Series
	res, from int64
}

func (f filledSeries) Iterator(it chunkenc.Iterator) chunkenc.Iterator {
	return &fillIterator{it: f.Series.Iterator(nil), res: f.res, from: f.from}
}

type fillIterator struct {
	it        chunkenc.Iterator
	res, from int64

	t         float64Point // the current point
	next      float64Point // the inner iterator's next point, when nextValid
	nextValid bool
	started   bool
	exhausted bool // the inner iterator is
	done      bool // this one is
}

type float64Point struct {
	t int64
	v float64
}

// pull reads the inner iterator's next float point.
func (f *fillIterator) pull() bool {
	switch f.it.Next() {
	case chunkenc.ValNone:
		f.exhausted = true
		return false
	case chunkenc.ValFloat:
		t, v := f.it.At()
		f.next, f.nextValid = float64Point{t, v}, true
		return true
	default: // downsampled views are floats only
		f.exhausted = true
		return false
	}
}

func (f *fillIterator) Next() chunkenc.ValueType {
	vt := f.next1()
	for vt != chunkenc.ValNone && f.t.t < f.from {
		vt = f.next1()
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
		f.t, f.nextValid = f.next, false
		return chunkenc.ValFloat
	}
	if !f.nextValid && !f.exhausted {
		f.pull()
	}
	if !f.nextValid {
		return chunkenc.ValNone
	}
	cand := f.t.t + fillEvery
	if !value.IsStaleNaN(f.t.v) && cand < f.next.t && f.next.t-f.t.t <= f.res {
		f.t = float64Point{cand, f.t.v}
		return chunkenc.ValFloat
	}
	f.t, f.nextValid = f.next, false
	return chunkenc.ValFloat
}

func (f *fillIterator) Seek(t int64) chunkenc.ValueType {
	if f.done {
		return chunkenc.ValNone
	}
	if f.started && f.t.t >= t {
		return chunkenc.ValFloat
	}
	for {
		vt := f.Next()
		if vt == chunkenc.ValNone || f.t.t >= t {
			return vt
		}
	}
}

func (f *fillIterator) At() (int64, float64) { return f.t.t, f.t.v }
func (f *fillIterator) AtHistogram(*histogram.Histogram) (int64, *histogram.Histogram) {
	return f.t.t, nil
}
func (f *fillIterator) AtFloatHistogram(*histogram.FloatHistogram) (int64, *histogram.FloatHistogram) {
	return f.t.t, nil
}
func (f *fillIterator) AtT() int64  { return f.t.t }
func (f *fillIterator) AtST() int64 { return 0 }
func (f *fillIterator) Err() error  { return f.it.Err() }
