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

// A packed point holds one window's gauge aggregates as a float histogram of
// the custom-buckets schema (NHCB), so that one series in Prometheus' float
// histogram chunk encoding carries all four, each field XOR-compressed
// against the previous point's:
//
//	Count                 number of raw samples in the window
//	Sum                   their sum
//	PositiveBuckets[0]    their minimum
//	PositiveBuckets[1]    their maximum
//
// with CustomValues = packedBounds (one bound: two buckets), one positive
// span {0, 2}, no zero bucket and CounterResetHint = GaugeType (the values go
// up and down; a counter hint would make the chunk appender cut a chunk at
// every "reset"). The "buckets" are not counts: they may be negative, NaN or
// ±Inf, which FloatHistogram.Validate rejects, so packed points are never
// appended through a TSDB head (blocks are written with the TSDB's chunk and
// index writers, see blockwrite.go) and never reach PromQL as histograms
// (the Querier turns them into floats per view). A staleness marker is a
// packed point whose Sum is the stale NaN.
var packedBounds = []float64{0}

// packedSpan is the one span of a packed point's two buckets. Each point
// gets its own spans slice (spans are not immutable in Prometheus' code);
// CustomValues are, and are shared, as the TSDB's iterators share them.
var packedSpan = histogram.Span{Offset: 0, Length: 2}

// packAggr returns the packed point of a, written into fh when fh is not nil.
func packAggr(a aggr, fh *histogram.FloatHistogram) *histogram.FloatHistogram {
	if fh == nil {
		fh = &histogram.FloatHistogram{}
	}
	*fh = histogram.FloatHistogram{
		CounterResetHint: histogram.GaugeType,
		Schema:           histogram.CustomBucketsSchema,
		Count:            a.count,
		Sum:              a.sum,
		PositiveSpans:    append(fh.PositiveSpans[:0], packedSpan),
		PositiveBuckets:  append(fh.PositiveBuckets[:0], a.min, a.max),
		CustomValues:     packedBounds,
	}
	return fh
}

// packedStale is a packed staleness marker (same layout, so no chunk cut).
func packedStale(fh *histogram.FloatHistogram) *histogram.FloatHistogram {
	return packAggr(aggr{sum: math.Float64frombits(value.StaleNaN)}, fh)
}

// unpackAggr reads a packed point; stale says it is a staleness marker.
func unpackAggr(fh *histogram.FloatHistogram) (a aggr, stale bool, err error) {
	if value.IsStaleNaN(fh.Sum) {
		return aggr{}, true, nil
	}
	if fh.Schema != histogram.CustomBucketsSchema || len(fh.PositiveBuckets) != 2 || len(fh.PositiveSpans) != 1 ||
		fh.PositiveSpans[0].Offset != 0 {
		return aggr{}, false, fmt.Errorf("%s point is not a packed aggregate: schema %d, %d buckets", AggrPacked, fh.Schema, len(fh.PositiveBuckets))
	}
	return aggr{count: fh.Count, sum: fh.Sum, min: fh.PositiveBuckets[0], max: fh.PositiveBuckets[1]}, false, nil
}

// packedSeries reads a packed series as floats: the field of view (avg and
// counter: sum/count; min; max; sum; count).
type packedSeries struct {
	lset labels.Labels
	s    storage.Series
	view View
}

func (p packedSeries) Labels() labels.Labels { return p.lset }

func (p packedSeries) Iterator(it chunkenc.Iterator) chunkenc.Iterator {
	pi, ok := it.(*packedIterator)
	if !ok {
		pi = &packedIterator{}
	}
	pi.it = p.s.Iterator(pi.it)
	pi.view, pi.err, pi.t, pi.v = p.view, nil, 0, 0
	return pi
}

type packedIterator struct {
	floatOnly
	it   chunkenc.Iterator
	view View
	fh   histogram.FloatHistogram
	t    int64
	v    float64
	err  error
}

func (p *packedIterator) conv(vt chunkenc.ValueType) chunkenc.ValueType {
	if vt == chunkenc.ValNone || p.err != nil {
		return chunkenc.ValNone
	}
	if vt != chunkenc.ValFloatHistogram {
		p.err = fmt.Errorf("%s series holds a %s sample", AggrPacked, vt)
		return chunkenc.ValNone
	}
	var fh *histogram.FloatHistogram
	p.t, fh = p.it.AtFloatHistogram(&p.fh)
	a, stale, err := unpackAggr(fh)
	if err != nil {
		p.err = err
		return chunkenc.ValNone
	}
	switch {
	case stale:
		p.v = math.Float64frombits(value.StaleNaN)
	case p.view == ViewMin:
		p.v = a.min
	case p.view == ViewMax:
		p.v = a.max
	case p.view == ViewSum:
		p.v = a.sum
	case p.view == ViewCount:
		p.v = a.count
	default: // avg, counter
		p.v = a.sum / a.count
	}
	return chunkenc.ValFloat
}

func (p *packedIterator) Next() chunkenc.ValueType {
	if p.err != nil {
		return chunkenc.ValNone
	}
	return p.conv(p.it.Next())
}

func (p *packedIterator) Seek(t int64) chunkenc.ValueType {
	if p.err != nil {
		return chunkenc.ValNone
	}
	return p.conv(p.it.Seek(t))
}

func (p *packedIterator) At() (int64, float64) { return p.t, p.v }
func (p *packedIterator) AtT() int64           { return p.t }
func (p *packedIterator) Err() error {
	if p.err != nil {
		return p.err
	}
	return p.it.Err()
}

// floatOnly is the part of a chunkenc.Iterator that an iterator yielding
// only floats has nothing to say in.
type floatOnly struct{}

func (floatOnly) AtHistogram(*histogram.Histogram) (int64, *histogram.Histogram) {
	panic("AtHistogram on a float iterator")
}
func (floatOnly) AtFloatHistogram(*histogram.FloatHistogram) (int64, *histogram.FloatHistogram) {
	panic("AtFloatHistogram on a float iterator")
}
func (floatOnly) AtST() int64 { return 0 }
