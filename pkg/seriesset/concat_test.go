package seriesset

import (
	"math/rand/v2"
	"testing"

	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
)

type concatSample struct {
	t int64
	f float64
}

func (s concatSample) T() int64                      { return s.t }
func (s concatSample) ST() int64                     { return 0 }
func (s concatSample) F() float64                    { return s.f }
func (s concatSample) H() *histogram.Histogram       { return nil }
func (s concatSample) FH() *histogram.FloatHistogram { return nil }
func (s concatSample) Type() chunkenc.ValueType      { return chunkenc.ValFloat }
func (s concatSample) Copy() chunks.Sample           { return s }

// Time-disjoint pieces of a series, concatenated, read as the chained merge
// reads them, through any mix of Next and Seek, also where a concatenation
// is one of the pieces; overlapping pieces fall back to the chained merge.
func TestMergeSpansReadsLikeTheChainedMerge(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	ls := labels.FromStrings("__name__", "x")
	for round := 0; round < 300; round++ {
		var pieces []storage.Series
		lo := int64(rng.IntN(100))
		n := 1 + rng.IntN(6)
		for range n {
			hi := lo + int64(rng.IntN(500))
			var ss []chunks.Sample
			for ts := lo + int64(rng.IntN(20)); ts <= hi; ts += 1 + int64(rng.IntN(40)) {
				// A timestamp's value is the same in every piece: where
				// pieces overlap, the merges may keep either's sample.
				ss = append(ss, concatSample{ts, float64(ts) / 7})
			}
			pieces = append(pieces, spanSeries{Series: storage.NewListSeries(ls, ss), lo: lo, hi: hi})
			lo = hi + 1 + int64(rng.IntN(100))
			if rng.IntN(10) == 0 { // an overlap now and then
				lo -= 50
			}
		}
		rng.Shuffle(len(pieces), func(i, j int) { pieces[i], pieces[j] = pieces[j], pieces[i] })
		if len(pieces) > 2 && rng.IntN(3) == 0 { // a merge of merges (the bucket's blocks beside the local TSDB)
			pieces = append([]storage.Series{MergeSpans(pieces[:2]...)}, pieces[2:]...)
		}
		got := MergeSpans(pieces...).Iterator(nil)
		want := storage.ChainedSeriesMerge(pieces...).Iterator(nil)
		for step := 0; step < 60; step++ {
			var gv, wv chunkenc.ValueType
			if rng.IntN(2) == 0 {
				gv, wv = got.Next(), want.Next()
			} else {
				at := int64(rng.IntN(3000))
				gv, wv = got.Seek(at), want.Seek(at)
			}
			if gv != wv {
				t.Fatalf("round %d step %d: %v, chained merge %v", round, step, gv, wv)
			}
			if gv == chunkenc.ValNone {
				break
			}
			gt, gf := got.At()
			wt, wf := want.At()
			if gt != wt || gf != wf {
				t.Fatalf("round %d step %d: (%d, %v), chained merge (%d, %v)", round, step, gt, gf, wt, wf)
			}
		}
	}
}
