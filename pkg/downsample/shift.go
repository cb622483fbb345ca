package downsample

import (
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
)

// ShiftSeries reads the series of set with their points moved by s (a
// select that FitsShifted): those of each evaluation's range on the window
// grid moved to the evaluation, the others dropped. Raw series read beside
// downsampled ones in the same range are moved alike.
func ShiftSeries(set storage.SeriesSet, s *StepShift) storage.SeriesSet {
	return shiftedSet{SeriesSet: set, shift: s}
}

type shiftedSet struct {
	storage.SeriesSet
	shift *StepShift
}

func (s shiftedSet) At() storage.Series {
	return shiftedSeries{Series: s.SeriesSet.At(), shift: s.shift}
}

// shiftedSeries is a series whose points a StepShift moves.
type shiftedSeries struct {
	storage.Series
	shift *StepShift
}

func (s shiftedSeries) Iterator(it chunkenc.Iterator) chunkenc.Iterator {
	si, ok := it.(*shiftIterator)
	if !ok {
		si = &shiftIterator{}
	}
	si.it, si.shift, si.vt = s.Series.Iterator(si.it), s.shift, chunkenc.ValNone
	return si
}

type shiftIterator struct {
	it    chunkenc.Iterator
	shift *StepShift
	vt    chunkenc.ValueType
	t     int64 // the current point's moved time
}

// find moves to the first point from the current one on that an
// evaluation reads.
func (s *shiftIterator) find(vt chunkenc.ValueType) chunkenc.ValueType {
	for ; vt != chunkenc.ValNone; vt = s.it.Next() {
		if t, ok := s.shift.Map(s.it.AtT()); ok {
			s.t, s.vt = t, vt
			return vt
		}
	}
	s.vt = chunkenc.ValNone
	return s.vt
}

func (s *shiftIterator) Next() chunkenc.ValueType { return s.find(s.it.Next()) }

// Seek: a point moves forward by less than a window, so the first one at
// or after t is read at or after t - res.
func (s *shiftIterator) Seek(t int64) chunkenc.ValueType {
	if s.vt != chunkenc.ValNone && s.t >= t {
		return s.vt
	}
	vt := s.find(s.it.Seek(t - s.shift.res))
	for vt != chunkenc.ValNone && s.t < t {
		vt = s.Next()
	}
	return vt
}

func (s *shiftIterator) At() (int64, float64) {
	_, v := s.it.At()
	return s.t, v
}

func (s *shiftIterator) AtHistogram(h *histogram.Histogram) (int64, *histogram.Histogram) {
	_, h = s.it.AtHistogram(h)
	return s.t, h
}

func (s *shiftIterator) AtFloatHistogram(fh *histogram.FloatHistogram) (int64, *histogram.FloatHistogram) {
	_, fh = s.it.AtFloatHistogram(fh)
	return s.t, fh
}

func (s *shiftIterator) AtT() int64  { return s.t }
func (s *shiftIterator) AtST() int64 { return s.it.AtST() }
func (s *shiftIterator) Err() error  { return s.it.Err() }
