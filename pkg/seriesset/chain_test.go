package seriesset

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
)

// randomParts returns k pieces of one series over timestamps 0..59: each
// holds a random subset (possibly none); a timestamp's value is the same in
// every piece, as for the copies the merge is meant for. With histograms
// the pieces hold float histograms hinted NotCounterReset and share no
// timestamp, so which piece a sample comes from is never a tie.
func randomParts(rng *rand.Rand, k int, histograms bool) [][]int64 {
	parts := make([][]int64, k)
	for t := range int64(60) {
		for i := range parts {
			if rng.IntN(3) == 0 {
				parts[i] = append(parts[i], t)
				if histograms {
					break
				}
			}
		}
	}
	return parts
}

// buildSeries makes fresh series of parts (each build its own samples, so
// that the hints an iterator rewrites are not shared between two merges).
func buildSeries(parts [][]int64, histograms bool) []storage.Series {
	lset := labels.FromStrings("__name__", "x")
	out := make([]storage.Series, len(parts))
	for i, ts := range parts {
		s := promql.Series{Metric: lset}
		for _, t := range ts {
			if histograms {
				fh := &histogram.FloatHistogram{Count: float64(t), Sum: float64(t) / 2, CounterResetHint: histogram.NotCounterReset}
				s.Histograms = append(s.Histograms, promql.HPoint{T: t, H: fh})
				continue
			}
			s.Floats = append(s.Floats, promql.FPoint{T: t, F: float64(t) * 1.5})
		}
		out[i] = promql.NewStorageSeries(s)
	}
	return out
}

// observe describes where an iterator stands after an operation.
func observe(it chunkenc.Iterator, vt chunkenc.ValueType) string {
	switch vt {
	case chunkenc.ValFloat:
		t, v := it.At()
		return fmt.Sprintf("float %d %g (AtT %d)", t, v, it.AtT())
	case chunkenc.ValFloatHistogram:
		t, fh := it.AtFloatHistogram(nil)
		return fmt.Sprintf("fh %d %g hint %d (AtT %d)", t, fh.Count, fh.CounterResetHint, it.AtT())
	case chunkenc.ValNone:
		return fmt.Sprintf("none err=%v", it.Err())
	}
	return vt.String()
}

// TestChainMatchesPrometheus drives the chained iterator and Prometheus'
// through the same random Next and Seek calls over random overlapping
// pieces (some empty, some nested merges) and compares every step.
func TestChainMatchesPrometheus(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for c := range 3000 {
		k := 1 + rng.IntN(4)
		histograms := c%3 == 0
		parts := randomParts(rng, k, histograms)

		// Prometheus' merges hand a series found in one set over as it is,
		// without the chain (and its hints) around it: so does ours.
		ref := buildSeries(parts, histograms)
		want := ref[0].Iterator(nil)
		if k > 1 {
			want = storage.ChainedSeriesMerge(ref...).Iterator(nil)
		}
		ours := buildSeries(parts, histograms)
		var got chunkenc.Iterator
		if k >= 3 && rng.IntN(2) == 0 { // a merge of merges
			got = ChainedSeriesMerge(ChainedSeriesMerge(ours[:2]...), ChainedSeriesMerge(ours[2:]...)).Iterator(nil)
		} else {
			got = ChainedSeriesMerge(ours...).Iterator(nil)
		}
		if c%7 == 0 { // reuse an iterator of a previous case
			got = ChainedSeriesMerge(ours...).Iterator(ChainedSeriesMerge(buildSeries(randomParts(rng, 3, false), false)...).Iterator(nil))
		}

		var trace []string
		for step := range 50 {
			var op string
			var wv, gv chunkenc.ValueType
			if rng.IntN(3) == 0 {
				st := int64(rng.IntN(70) - 5)
				op = fmt.Sprintf("Seek(%d)", st)
				wv, gv = want.Seek(st), got.Seek(st)
			} else {
				op = "Next()"
				wv, gv = want.Next(), got.Next()
			}
			w, g := observe(want, wv), observe(got, gv)
			trace = append(trace, op+" -> "+g)
			if w != g {
				t.Fatalf("case %d (parts %v), step %d %s: got %s, Prometheus %s\ntrace: %v", c, parts, step, op, g, w, trace)
			}
		}
	}
}

// TestChainSeeksWithoutAllocating: the engine seeks every series at every
// step; Prometheus' chained iterator builds a heap there and a slice at
// every Err. Rewinding (the iterator handed back for the next series) does
// not allocate either.
func TestChainSeeksWithoutAllocating(t *testing.T) {
	series := []storage.Series{
		&sliceSeries{ts: []int64{0, 2, 4, 6, 8, 10}},
		&sliceSeries{ts: []int64{1, 3, 5, 7, 9, 11}},
		&sliceSeries{ts: []int64{20, 21, 22}},
	}
	it := ChainSampleIterator(nil, series)
	allocs := testing.AllocsPerRun(100, func() {
		it = ChainSampleIterator(it, series)
		for st := int64(0); st < 24; st += 3 {
			if it.Seek(st) == chunkenc.ValNone && st <= 22 {
				t.Fatalf("Seek(%d) found nothing", st)
			}
			_ = it.Err()
		}
	})
	if allocs > 0 {
		t.Fatalf("%.1f allocations per run of seeks, want 0", allocs)
	}
}

// sliceSeries is a float series over ts whose iterator is reused in place.
type sliceSeries struct{ ts []int64 }

func (s *sliceSeries) Labels() labels.Labels { return labels.EmptyLabels() }

func (s *sliceSeries) Iterator(it chunkenc.Iterator) chunkenc.Iterator {
	si, ok := it.(*sliceIterator)
	if !ok {
		si = &sliceIterator{}
	}
	*si = sliceIterator{ts: s.ts, i: -1}
	return si
}

type sliceIterator struct {
	ts   []int64
	i    int
	fail bool // Err after the samples
}

func (s *sliceIterator) Next() chunkenc.ValueType {
	if s.i+1 >= len(s.ts) {
		s.i = len(s.ts)
		return chunkenc.ValNone
	}
	s.i++
	return chunkenc.ValFloat
}

func (s *sliceIterator) Seek(t int64) chunkenc.ValueType {
	if s.i < 0 {
		s.i = 0
	}
	for s.i < len(s.ts) && s.ts[s.i] < t {
		s.i++
	}
	if s.i >= len(s.ts) {
		return chunkenc.ValNone
	}
	return chunkenc.ValFloat
}

func (s *sliceIterator) At() (int64, float64) { return s.ts[s.i], float64(s.ts[s.i]) }
func (s *sliceIterator) AtHistogram(*histogram.Histogram) (int64, *histogram.Histogram) {
	panic("no histograms")
}
func (s *sliceIterator) AtFloatHistogram(*histogram.FloatHistogram) (int64, *histogram.FloatHistogram) {
	panic("no histograms")
}
func (s *sliceIterator) AtT() int64  { return s.ts[s.i] }
func (s *sliceIterator) AtST() int64 { return 0 }
func (s *sliceIterator) Err() error {
	if s.fail && s.i >= len(s.ts) {
		return errTruncated
	}
	return nil
}

var errTruncated = errors.New("chunk truncated")

type failingSeries struct{ ts []int64 }

func (s failingSeries) Labels() labels.Labels { return labels.EmptyLabels() }
func (s failingSeries) Iterator(chunkenc.Iterator) chunkenc.Iterator {
	return &sliceIterator{ts: s.ts, i: -1, fail: true}
}

// TestChainStopsAtAnError: a piece that fails (a chunk that does not
// decode) ends the merged series with its error, as in Prometheus, rather
// than answering the other pieces' samples as if the series were whole.
func TestChainStopsAtAnError(t *testing.T) {
	good := &sliceSeries{ts: []int64{1, 2, 3, 4, 5, 6}}
	bad := failingSeries{ts: []int64{2}}
	for _, seek := range []bool{false, true} {
		it := ChainedSeriesMerge(good, bad).Iterator(nil)
		var ts []int64
		vt := it.Next()
		for ; vt != chunkenc.ValNone; vt = it.Next() {
			ts = append(ts, it.AtT())
			if seek {
				vt = it.Seek(it.AtT() + 1)
				if vt == chunkenc.ValNone {
					break
				}
				ts = append(ts, it.AtT())
			}
		}
		if !errors.Is(it.Err(), errTruncated) {
			t.Fatalf("seek=%v: Err() = %v after %v, want the piece's error", seek, it.Err(), ts)
		}
		if len(ts) > 2 {
			t.Fatalf("seek=%v: read %v past the failing piece", seek, ts)
		}
	}
}

// BenchmarkChain reads series the query path merges: a series in 2 parts
// that take turns (a receiver's replicas), 2 parts one after the other (the
// bucket beside the local TSDB), 200 frames one after the other (a
// remote-read stream) and 2 identical copies (two receivers' blocks), by
// Next and by a Seek per step, with Prometheus' chained merge beside this
// package's.
func BenchmarkChain(b *testing.B) {
	frames := func(n, per int, interleave bool) []storage.Series {
		out := make([]storage.Series, n)
		for i := range out {
			ts := make([]int64, per)
			for j := range ts {
				if interleave {
					ts[j] = int64(j*n + i)
				} else {
					ts[j] = int64(i*per + j)
				}
			}
			out[i] = &sliceSeries{ts: ts}
		}
		return out
	}
	for _, c := range []struct {
		name   string
		series []storage.Series
	}{
		{"2-taking-turns", frames(2, 2000, true)},
		{"2-one-after-the-other", frames(2, 2000, false)},
		{"200-frames", frames(200, 20, false)},
		{"2-copies", append(frames(1, 2000, false), frames(1, 2000, false)...)},
	} {
		for _, m := range []struct {
			name  string
			merge func(...storage.Series) storage.Series
		}{{"prometheus", storage.ChainedSeriesMerge}, {"seriesset", ChainedSeriesMerge}, {"spans", spanned(MergeSpans)}} {
			s := m.merge(c.series...)
			b.Run(c.name+"/next/"+m.name, func(b *testing.B) {
				var it chunkenc.Iterator
				for b.Loop() {
					it = s.Iterator(it)
					for it.Next() != chunkenc.ValNone {
					}
				}
			})
			b.Run(c.name+"/seek/"+m.name, func(b *testing.B) {
				var it chunkenc.Iterator
				for b.Loop() {
					it = s.Iterator(it)
					for t := int64(0); it.Seek(t) != chunkenc.ValNone; t += 7 {
						_ = it.Err()
					}
				}
			})
		}
	}
}

// spanned is merge over series that say their time range (SpanQuerier),
// the range of each's timestamps.
func spanned(merge func(...storage.Series) storage.Series) func(...storage.Series) storage.Series {
	return func(series ...storage.Series) storage.Series {
		out := make([]storage.Series, len(series))
		for i, s := range series {
			ts := s.(*sliceSeries).ts
			out[i] = spanSeries{Series: s, lo: slices.Min(ts), hi: slices.Max(ts)}
		}
		return merge(out...)
	}
}
