package ringread

import (
	"math"
	"sync"

	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"

	"github.com/gpustore/gpustore/pkg/seriesset"
)

// chunksIterator reads a series' chunks one after the other (they are in
// time order and do not overlap), decoding each only when it is reached:
// a Seek skips whole chunks that end before its time, as the TSDB's own
// iterators do. Samples outside [mint, maxt], the select's range, are
// left out, as the TSDB's querier leaves them out.
type chunksIterator struct {
	chunks     []wireChunk
	clusters   [][][]wireChunk
	mint, maxt int64
	i          int                // the current chunk
	cur        chunkenc.Iterator  // over chunks[i]; nil before the first sample and at the end
	vt         chunkenc.ValueType // of the current sample
	err        error
	// Decoders reused from chunk to chunk and series to series, one per
	// encoding (a series' chunks may change encoding).
	decoders [chunkenc.EncFloatHistogramST + 1]struct {
		chunk chunkenc.Chunk
		it    chunkenc.Iterator
	}
	merge chunkenc.Iterator // a cluster's, reused
}

func (it *chunksIterator) reset(s *ringSeries, mint, maxt int64) {
	it.chunks, it.clusters, it.mint, it.maxt = s.chunks, s.clusters, mint, maxt
	it.i, it.cur, it.vt, it.err = 0, nil, chunkenc.ValNone, nil
}

func (it *chunksIterator) Next() chunkenc.ValueType {
	if it.cur != nil {
		if vt := it.cur.Next(); vt != chunkenc.ValNone {
			return it.within(vt)
		}
		if it.err = it.cur.Err(); it.err != nil {
			return it.stop()
		}
		it.i++
	} else if it.i > 0 || it.err != nil {
		return chunkenc.ValNone // exhausted
	}
	return it.seekFrom(it.mint)
}

func (it *chunksIterator) Seek(t int64) chunkenc.ValueType {
	if it.cur != nil {
		if it.cur.AtT() >= t {
			return it.vt
		}
		if it.chunks[it.i].maxT >= t {
			if vt := it.cur.Seek(t); vt != chunkenc.ValNone {
				return it.within(vt)
			}
			if it.err = it.cur.Err(); it.err != nil {
				return it.stop()
			}
		}
		it.i++
	} else if it.i > 0 || it.err != nil {
		return chunkenc.ValNone
	}
	return it.seekFrom(max(t, it.mint))
}

// seekFrom opens the chunks from it.i on and stops at the first sample at
// or after t.
func (it *chunksIterator) seekFrom(t int64) chunkenc.ValueType {
	for ; it.i < len(it.chunks); it.i++ {
		c := &it.chunks[it.i]
		if c.maxT < t {
			continue
		}
		if c.minT > it.maxt {
			break
		}
		if it.cur, it.err = it.open(c); it.err != nil {
			return it.stop()
		}
		var vt chunkenc.ValueType
		if c.minT < t {
			vt = it.cur.Seek(t)
		} else {
			vt = it.cur.Next()
		}
		if vt != chunkenc.ValNone {
			return it.within(vt)
		}
		if it.err = it.cur.Err(); it.err != nil {
			return it.stop()
		}
	}
	return it.stop()
}

// open returns an iterator over c, reusing the decoder of its encoding;
// over a cluster, the merge of its replicas' runs (one sample per
// timestamp, as storage.ChainedSeriesMerge).
func (it *chunksIterator) open(c *wireChunk) (chunkenc.Iterator, error) {
	if c.cluster > 0 {
		runs := it.clusters[c.cluster-1]
		parts := make([]storage.Series, len(runs))
		for i, r := range runs {
			parts[i] = &ringSeries{chunks: r, mint: it.mint, maxt: it.maxt}
		}
		it.merge = seriesset.ChainSampleIterator(it.merge, parts)
		return it.merge, nil
	}
	if int(c.enc) >= len(it.decoders) {
		chk, err := chunkenc.FromData(c.enc, c.data)
		if err != nil {
			return nil, err
		}
		return chk.Iterator(nil), nil
	}
	d := &it.decoders[c.enc]
	if d.chunk == nil {
		chk, err := chunkenc.FromData(c.enc, c.data)
		if err != nil {
			return nil, err
		}
		d.chunk = chk
	} else {
		d.chunk.Reset(c.data)
	}
	d.it = d.chunk.Iterator(d.it)
	return d.it, nil
}

// within returns vt unless the sample is past maxt, which ends the
// iteration.
func (it *chunksIterator) within(vt chunkenc.ValueType) chunkenc.ValueType {
	if it.cur.AtT() > it.maxt {
		return it.stop()
	}
	it.vt = vt
	return vt
}

func (it *chunksIterator) stop() chunkenc.ValueType {
	it.i, it.cur, it.vt = len(it.chunks)+1, nil, chunkenc.ValNone
	return chunkenc.ValNone
}

func (it *chunksIterator) At() (int64, float64) { return it.cur.At() }

func (it *chunksIterator) AtHistogram(h *histogram.Histogram) (int64, *histogram.Histogram) {
	return it.cur.AtHistogram(h)
}

func (it *chunksIterator) AtFloatHistogram(fh *histogram.FloatHistogram) (int64, *histogram.FloatHistogram) {
	return it.cur.AtFloatHistogram(fh)
}

func (it *chunksIterator) AtT() int64  { return it.cur.AtT() }
func (it *chunksIterator) AtST() int64 { return it.cur.AtST() }
func (it *chunksIterator) Err() error  { return it.err }

// appenders are chunksIterators lent to AppendFloats for their decoders.
var appenders = sync.Pool{New: func() any { return &chunksIterator{} }}

// AppendFloats appends the series' samples in [mint, maxt] (and the
// select's range) to ts and fs chunk after chunk, each read by its
// chunk's own decoder in a tight loop (seriesset.FloatAppender): the query
// path decodes a series the engine is about to read into arrays
// (seriesset.Decoded) and evaluates pushed-down range functions over them,
// without chunksIterator between the decoder and every sample. A cluster
// of replicas' differing chunks is merged from its runs' arrays
// (appendCluster). ok is false at the first sample that is not a float.
func (s *ringSeries) AppendFloats(ts []int64, fs []float64, mint, maxt int64) ([]int64, []float64, bool, error) {
	mint, maxt = max(mint, s.mint), min(maxt, s.maxt)
	d := appenders.Get().(*chunksIterator)
	defer func() { d.clusters = nil; appenders.Put(d) }()
	d.clusters, d.mint, d.maxt = s.clusters, mint, maxt
	for i := range s.chunks {
		c := &s.chunks[i]
		if c.maxT < mint {
			continue
		}
		if c.minT > maxt {
			break
		}
		if c.cluster > 0 {
			var ok bool
			var err error
			if ts, fs, ok, err = appendCluster(ts, fs, s.clusters[c.cluster-1], mint, maxt); !ok || err != nil {
				return ts, fs, ok, err
			}
			continue
		}
		it, err := d.open(c)
		if err != nil {
			return ts, fs, true, err
		}
		var vt chunkenc.ValueType
		if c.minT < mint {
			vt = it.Seek(mint)
		} else {
			vt = it.Next()
		}
		for ; vt == chunkenc.ValFloat; vt = it.Next() {
			t, f := it.At()
			if t > maxt {
				return ts, fs, true, nil
			}
			ts, fs = append(ts, t), append(fs, f)
		}
		if vt != chunkenc.ValNone {
			return ts, fs, false, nil
		}
		if err := it.Err(); err != nil {
			return ts, fs, true, err
		}
	}
	return ts, fs, true, nil
}

// clusterRuns are the decoded runs of a cluster, reused.
var clusterRuns = sync.Pool{New: func() any { return &decodedRuns{} }}

type decodedRuns struct {
	ts  [][]int64
	fs  [][]float64
	pos []int
}

// appendCluster appends the samples in [mint, maxt] of a cluster of
// replicas' differing chunks: each replica's run decoded into arrays, then
// merged one sample per timestamp, the earliest first and of equal ones
// the first run's, as seriesset.ChainSampleIterator merges them when the
// series is iterated (chunksIterator.open).
func appendCluster(ts []int64, fs []float64, runs [][]wireChunk, mint, maxt int64) ([]int64, []float64, bool, error) {
	r := clusterRuns.Get().(*decodedRuns)
	defer clusterRuns.Put(r)
	for len(r.ts) < len(runs) {
		r.ts, r.fs = append(r.ts, nil), append(r.fs, nil)
	}
	r.pos = r.pos[:0]
	for i, run := range runs {
		var ok bool
		var err error
		part := ringSeries{chunks: run, mint: mint, maxt: maxt}
		if r.ts[i], r.fs[i], ok, err = part.AppendFloats(r.ts[i][:0], r.fs[i][:0], mint, maxt); !ok || err != nil {
			return ts, fs, ok, err
		}
		r.pos = append(r.pos, 0)
	}
	rts, rfs := r.ts[:len(runs)], r.fs[:len(runs)]
	lastT := int64(math.MinInt64)
	for {
		best := -1
		for i, p := range r.pos {
			for p < len(rts[i]) && rts[i][p] <= lastT { // another run's copy of a sample taken
				p++
			}
			r.pos[i] = p
			if p < len(rts[i]) && (best < 0 || rts[i][p] < rts[best][r.pos[best]]) {
				best = i
			}
		}
		if best < 0 {
			return ts, fs, true, nil
		}
		p := r.pos[best]
		lastT = rts[best][p]
		ts, fs = append(ts, lastT), append(fs, rfs[best][p])
		r.pos[best]++
	}
}
