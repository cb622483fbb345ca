package seriesset

import (
	"sort"

	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
)

// The engine reads a series one sample per call: MemoizedSeriesIterator or
// BufferedSeriesIterator on top, then the concatenation of the series'
// parts, then the chunk iteration of each block, then the chunk's own
// decoder: eight interface calls per sample (Next and At at each level),
// most of a dashboard's evaluation time once the selects are cached. A
// series the engine is about to read is decoded here instead, all at once,
// into arrays of timestamps and values: the parts that can append their
// float samples themselves (FloatAppender: a block's chunks read in a tight
// loop, a concatenation passing the call on to its pieces) do so without
// the layers between, the others are iterated once; then the engine's
// iterators read the arrays. The engine reads one series at a time and
// hands the last iterator back to Iterator, so the arrays of one series
// are reused for the next: a query holds the samples of one series, not of
// all.

// FloatAppender is a series that can append its samples in [mint, maxt]
// (inclusive) to ts and fs in time order. ok is false when it holds a
// sample that is not a float (a native histogram): the caller then reads
// it through its iterator; ts and fs may hold part of it by then.
type FloatAppender interface {
	AppendFloats(ts []int64, fs []float64, mint, maxt int64) (_ []int64, _ []float64, ok bool, err error)
}

// Decoded wraps ss so that each of its series is decoded into arrays when
// the caller asks for its iterator (see above). Series holding native
// histograms are read through their own iterators.
func Decoded(ss storage.SeriesSet) storage.SeriesSet {
	return decodedSet{ss}
}

type decodedSet struct{ storage.SeriesSet }

func (d decodedSet) At() storage.Series { return decodedSeries{d.SeriesSet.At()} }

type decodedSeries struct{ storage.Series }

func (s decodedSeries) Iterator(it chunkenc.Iterator) chunkenc.Iterator {
	d, ok := it.(*decodedIterator)
	if !ok {
		d = &decodedIterator{}
	}
	var floats bool
	d.ts, d.fs, floats, d.err = AppendFloats(s.Series, d.ts[:0], d.fs[:0], minTime, maxTime)
	if !floats {
		return s.Series.Iterator(nil) // native histograms: read as they are
	}
	d.i = -1
	return d
}

// AppendFloats is the series' own (FloatAppender).
func (s decodedSeries) AppendFloats(ts []int64, fs []float64, mint, maxt int64) ([]int64, []float64, bool, error) {
	return AppendFloats(s.Series, ts, fs, mint, maxt)
}

const (
	minTime = -1 << 63
	maxTime = 1<<63 - 1
)

// decodedIterator reads a decoded series.
type decodedIterator struct {
	ts  []int64
	fs  []float64
	i   int // the current sample; -1 before the first
	err error
}

func (d *decodedIterator) Next() chunkenc.ValueType {
	if d.i+1 >= len(d.ts) {
		d.i = len(d.ts)
		return chunkenc.ValNone
	}
	d.i++
	return chunkenc.ValFloat
}

// Seek moves to the first sample at or after t, never back: a step ahead
// is usually a few samples away (scanned), a gap far away (searched).
func (d *decodedIterator) Seek(t int64) chunkenc.ValueType {
	i := max(d.i, 0)
	if i >= len(d.ts) {
		d.i = len(d.ts)
		return chunkenc.ValNone
	}
	for n := 0; i < len(d.ts) && d.ts[i] < t; n++ {
		if n == 8 {
			i += sort.Search(len(d.ts)-i, func(k int) bool { return d.ts[i+k] >= t })
			break
		}
		i++
	}
	d.i = i
	if i >= len(d.ts) {
		return chunkenc.ValNone
	}
	return chunkenc.ValFloat
}

func (d *decodedIterator) At() (int64, float64) { return d.ts[d.i], d.fs[d.i] }
func (d *decodedIterator) AtT() int64           { return d.ts[d.i] }
func (d *decodedIterator) AtST() int64          { return 0 }
func (d *decodedIterator) Err() error           { return d.err }

func (d *decodedIterator) AtHistogram(*histogram.Histogram) (int64, *histogram.Histogram) {
	panic("seriesset: a decoded series holds floats only")
}

func (d *decodedIterator) AtFloatHistogram(*histogram.FloatHistogram) (int64, *histogram.FloatHistogram) {
	panic("seriesset: a decoded series holds floats only")
}

// AppendFloats of a concatenation: each piece's samples from its lo on
// (as concatIterator enters each piece), piece after piece.
func (c *concatSeries) AppendFloats(ts []int64, fs []float64, mint, maxt int64) ([]int64, []float64, bool, error) {
	for _, p := range c.pieces {
		var (
			ok  bool
			err error
		)
		if ts, fs, ok, err = AppendFloats(p.Series, ts, fs, max(mint, p.lo), maxt); !ok || err != nil {
			return ts, fs, ok, err
		}
	}
	return ts, fs, true, nil
}

// AppendFloats of a piece is its series'.
func (s spanSeries) AppendFloats(ts []int64, fs []float64, mint, maxt int64) ([]int64, []float64, bool, error) {
	return AppendFloats(s.Series, ts, fs, mint, maxt)
}

// AppendFloats appends the samples of s in [mint, maxt] to ts and fs: by
// s itself when it is a FloatAppender, else read through its iterator.
func AppendFloats(s storage.Series, ts []int64, fs []float64, mint, maxt int64) ([]int64, []float64, bool, error) {
	if fa, ok := s.(FloatAppender); ok {
		return fa.AppendFloats(ts, fs, mint, maxt)
	}
	it := s.Iterator(nil)
	for vt := it.Seek(mint); vt != chunkenc.ValNone; vt = it.Next() {
		if vt != chunkenc.ValFloat {
			return ts, fs, false, nil
		}
		t, f := it.At()
		if t > maxt {
			break
		}
		ts, fs = append(ts, t), append(fs, f)
	}
	return ts, fs, true, it.Err()
}
