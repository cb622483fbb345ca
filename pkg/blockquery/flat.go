package blockquery

import (
	"math"

	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
)

// flatSeries is a series of a select: its chunks that overlap [mint, maxt].
type flatSeries struct {
	lset       labels.Labels
	chunks     []chunkMeta
	cr         tsdb.ChunkReader
	mint, maxt int64
}

func (s *flatSeries) Labels() labels.Labels { return s.lset }

func (s *flatSeries) Iterator(it chunkenc.Iterator) chunkenc.Iterator {
	fi, ok := it.(*flatIterator)
	if !ok {
		fi = &flatIterator{}
	}
	fi.reset(s)
	return fi
}

// flatIterator reads a series' chunks one after another with each chunk's
// own iterator, and leaves out the samples outside [mint, maxt] (a chunk
// may begin before the range or end after it). Seek passes over whole
// chunks that end before its time without reading them.
type flatIterator struct {
	s    *flatSeries
	i    int                // the current chunk; len(s.chunks) when done
	cur  chunkenc.Iterator  // the current chunk's iterator, nil before it is opened
	vt   chunkenc.ValueType // the current sample's type, ValNone before the first
	err  error
	pool [4]chunkenc.Iterator // an iterator per encoding, reused across chunks
}

func (f *flatIterator) reset(s *flatSeries) {
	f.s, f.i, f.cur, f.vt, f.err = s, 0, nil, chunkenc.ValNone, nil
}

// open opens chunk i, or ends the iteration past the last.
func (f *flatIterator) open(i int) bool {
	f.i, f.cur = i, nil
	if i >= len(f.s.chunks) {
		return false
	}
	c := f.s.chunks[i]
	chk, iterable, err := f.s.cr.ChunkOrIterable(chunks.Meta{Ref: chunks.ChunkRef(c.ref), MinTime: c.mint, MaxTime: c.maxt})
	if err != nil {
		f.err, f.i = err, len(f.s.chunks)
		return false
	}
	if chk == nil {
		f.cur = iterable.Iterator(nil)
		return true
	}
	enc := chk.Encoding()
	var reuse chunkenc.Iterator
	if int(enc) < len(f.pool) {
		reuse = f.pool[enc]
	}
	f.cur = chk.Iterator(reuse)
	if int(enc) < len(f.pool) {
		f.pool[enc] = f.cur
	}
	return true
}

// settle checks the sample the current iterator moved to: past maxt ends
// the iteration; ValNone moves on to the next chunk (at or after from).
func (f *flatIterator) settle(vt chunkenc.ValueType, from int64) chunkenc.ValueType {
	for {
		if vt != chunkenc.ValNone {
			if f.cur.AtT() > f.s.maxt {
				f.i, f.cur = len(f.s.chunks), nil
				f.vt = chunkenc.ValNone
				return f.vt
			}
			f.vt = vt
			return vt
		}
		if err := f.cur.Err(); err != nil {
			f.err, f.i, f.cur = err, len(f.s.chunks), nil
			f.vt = chunkenc.ValNone
			return f.vt
		}
		if !f.open(f.i + 1) {
			f.vt = chunkenc.ValNone
			return f.vt
		}
		vt = f.cur.Seek(from)
	}
}

func (f *flatIterator) Next() chunkenc.ValueType {
	if f.cur == nil {
		if f.vt != chunkenc.ValNone || f.i >= len(f.s.chunks) || !f.open(f.i) {
			f.vt = chunkenc.ValNone
			return f.vt
		}
		return f.settle(f.cur.Seek(f.s.mint), f.s.mint)
	}
	return f.settle(f.cur.Next(), f.s.mint)
}

func (f *flatIterator) Seek(t int64) chunkenc.ValueType {
	t = max(t, f.s.mint)
	if f.cur != nil && f.vt != chunkenc.ValNone && f.cur.AtT() >= t {
		return f.vt
	}
	if f.i >= len(f.s.chunks) {
		return chunkenc.ValNone
	}
	// Whole chunks that end before t are not read.
	j := f.i
	for j < len(f.s.chunks) && f.s.chunks[j].maxt < t {
		j++
	}
	if j != f.i || f.cur == nil {
		if !f.open(j) {
			f.vt = chunkenc.ValNone
			return f.vt
		}
	}
	return f.settle(f.cur.Seek(t), t)
}

func (f *flatIterator) At() (int64, float64) { return f.cur.At() }

func (f *flatIterator) AtHistogram(h *histogram.Histogram) (int64, *histogram.Histogram) {
	return f.cur.AtHistogram(h)
}

func (f *flatIterator) AtFloatHistogram(fh *histogram.FloatHistogram) (int64, *histogram.FloatHistogram) {
	return f.cur.AtFloatHistogram(fh)
}

func (f *flatIterator) AtT() int64 {
	if f.cur == nil {
		return math.MinInt64
	}
	return f.cur.AtT()
}

func (f *flatIterator) AtST() int64 { return f.cur.AtST() }
func (f *flatIterator) Err() error  { return f.err }

// AppendFloats appends the series' samples in [mint, maxt] (and its own
// range) chunk after chunk, each read with the chunk's own iterator and
// nothing between (seriesset.FloatAppender). ok is false at the first
// sample that is not a float.
func (s *flatSeries) AppendFloats(ts []int64, fs []float64, mint, maxt int64) ([]int64, []float64, bool, error) {
	mint, maxt = max(mint, s.mint), min(maxt, s.maxt)
	var it chunkenc.Iterator
	for _, c := range s.chunks {
		if c.maxt < mint {
			continue
		}
		if c.mint > maxt {
			break
		}
		chk, iterable, err := s.cr.ChunkOrIterable(chunks.Meta{Ref: chunks.ChunkRef(c.ref), MinTime: c.mint, MaxTime: c.maxt})
		if err != nil {
			return ts, fs, true, err
		}
		if chk == nil {
			it = iterable.Iterator(nil)
		} else {
			if chk.Encoding() != chunkenc.EncXOR {
				return ts, fs, false, nil
			}
			it = chk.Iterator(it)
		}
		var vt chunkenc.ValueType
		if c.mint < mint {
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
