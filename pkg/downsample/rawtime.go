package downsample

import (
	"math"

	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
)

// rawTimeSeries reads kept samples (a counter's, native histograms') at
// their raw time: each is stored 1 ms early (window.go), which moved the
// raw sample 1 ms past a window's end out of a range ending there and put
// the kept samples of a range read partly from raw data and partly from
// downsampled data (the edge between raw and 5m blocks) on two time axes,
// so that rate and increase extrapolated differently from raw. Read at
// their own times, a range selects exactly the samples it selects raw.
//
// Gauge aggregates stay 1 ms before their window's end: a window (w-R, w]
// read at w would take the place of a raw sample at w of the same series
// read beside it (a block that is not among the downsampled block's
// sources), and ranges ending at window ends select the same windows
// either way.
type rawTimeSeries struct{ storage.Series }

func (s rawTimeSeries) Iterator(it chunkenc.Iterator) chunkenc.Iterator {
	if r, ok := it.(*rawTimeIterator); ok {
		r.Iterator = s.Series.Iterator(r.Iterator)
		return r
	}
	return &rawTimeIterator{Iterator: s.Series.Iterator(nil)}
}

type rawTimeIterator struct{ chunkenc.Iterator }

func (r *rawTimeIterator) Seek(t int64) chunkenc.ValueType {
	if t == math.MinInt64 {
		return r.Iterator.Seek(t)
	}
	return r.Iterator.Seek(t - 1)
}

func (r *rawTimeIterator) At() (int64, float64) {
	t, v := r.Iterator.At()
	return t + 1, v
}

func (r *rawTimeIterator) AtHistogram(h *histogram.Histogram) (int64, *histogram.Histogram) {
	t, h := r.Iterator.AtHistogram(h)
	return t + 1, h
}

func (r *rawTimeIterator) AtFloatHistogram(fh *histogram.FloatHistogram) (int64, *histogram.FloatHistogram) {
	t, fh := r.Iterator.AtFloatHistogram(fh)
	return t + 1, fh
}

func (r *rawTimeIterator) AtT() int64 { return r.Iterator.AtT() + 1 }
