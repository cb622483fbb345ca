package downsample

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/value"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
)

// TestFillRepeatsWindowsForPlainSelectors: 1h points are repeated every 4
// minutes until the next window, not across a missing window, not after a
// staleness marker; Seek lands on the repeated points.
func TestFillRepeatsWindowsForPlainSelectors(t *testing.T) {
	const m = 60_000
	s := storage.NewListSeries(labels.FromStrings("a", "b"), []chunks.Sample{
		fSample{60*m - 1, 1}, fSample{120*m - 1, 2}, // adjacent windows: filled
		fSample{240*m - 1, 3}, // a window missing before it: not filled
		fSample{300*m - 1, math.Float64frombits(value.StaleNaN)}, fSample{360*m - 1, 5},
	})
	it := filledSeries{Series: s, res: Res1h, from: math.MinInt64, to: math.MaxInt64}.Iterator(nil)
	var ts []int64
	for it.Next() == chunkenc.ValFloat {
		tt, _ := it.At()
		ts = append(ts, tt)
	}
	want := []int64{60*m - 1}
	for k := int64(1); 60*m-1+k*fillEvery < 120*m-1; k++ {
		want = append(want, 60*m-1+k*fillEvery)
	}
	want = append(want, 120*m-1, 240*m-1)
	for k := int64(1); 240*m-1+k*fillEvery < 300*m-1; k++ {
		want = append(want, 240*m-1+k*fillEvery)
	}
	want = append(want, 300*m-1, 360*m-1)
	if len(ts) != len(want) {
		t.Fatalf("times %v\nwant %v", ts, want)
	}
	for i := range ts {
		if ts[i] != want[i] {
			t.Fatalf("times %v\nwant %v", ts, want)
		}
	}
	it = filledSeries{Series: s, res: Res1h, from: math.MinInt64, to: math.MaxInt64}.Iterator(nil)
	if it.Seek(100*m) != chunkenc.ValFloat {
		t.Fatal("seek into a filled window found nothing")
	}
	if tt, v := it.At(); tt < 100*m || tt >= 120*m || v != 1 {
		t.Fatalf("seek(100m) = %d, %v; want a repeat of the first window's 1 before 120m", tt, v)
	}
	if it.Seek(400*m) != chunkenc.ValNone || it.Next() != chunkenc.ValNone {
		t.Fatal("seek past the end did not end the iterator")
	}
}

// Seek lands where stepping with Next lands, for any target, from any
// position: its jump over repeats keeps their grid and stops at real points,
// gaps, markers and the [from, to] bounds.
func TestFillSeekMatchesScan(t *testing.T) {
	const m = 60_000
	rng := rand.New(rand.NewPCG(7, 11))
	var samples []chunks.Sample
	for w := int64(1); w < 200; w++ {
		switch rng.IntN(8) {
		case 0: // a missing window
			continue
		case 1:
			samples = append(samples, fSample{w*60*m - 1, math.Float64frombits(value.StaleNaN)})
		default:
			samples = append(samples, fSample{w*60*m - 1, float64(w)})
		}
	}
	s := storage.NewListSeries(labels.FromStrings("a", "b"), samples)
	from, to := int64(7*60*m), int64(190*60*m)
	var all []int64 // what Next gives
	for it := (filledSeries{Series: s, res: Res1h, from: from, to: to}).Iterator(nil); it.Next() != chunkenc.ValNone; {
		all = append(all, it.AtT())
	}
	for round := 0; round < 200; round++ {
		it := filledSeries{Series: s, res: Res1h, from: from, to: to}.Iterator(nil)
		pos := -1 // index in all of the iterator's point
		if rng.IntN(2) == 0 && it.Next() != chunkenc.ValNone {
			pos = 0
		}
		for seek := int64(0); seek < 205*60*m; seek += rng.Int64N(40 * 60 * m) {
			want := pos
			if want < 0 || all[want] < seek {
				want, _ = slices.BinarySearch(all, seek)
			}
			vt := it.Seek(seek)
			if want >= len(all) {
				if vt != chunkenc.ValNone {
					t.Fatalf("seek(%d) = %d, want the end", seek, it.AtT())
				}
				break
			}
			if vt == chunkenc.ValNone || it.AtT() != all[want] {
				t.Fatalf("seek(%d) from point %d: %v at %d, want %d", seek, pos, vt, it.AtT(), all[want])
			}
			pos = want
		}
	}
}

type fSample struct {
	t int64
	f float64
}

func (s fSample) T() int64                      { return s.t }
func (s fSample) ST() int64                     { return 0 }
func (s fSample) F() float64                    { return s.f }
func (s fSample) H() *histogram.Histogram       { return nil }
func (s fSample) FH() *histogram.FloatHistogram { return nil }
func (s fSample) Type() chunkenc.ValueType      { return chunkenc.ValFloat }
func (s fSample) Copy() chunks.Sample           { return s }

// TestFillPassesHistogramsThrough: kept samples of a native histogram are
// returned as they are, not filled and not cut short.
func TestFillPassesHistogramsThrough(t *testing.T) {
	const m = 60_000
	h := &histogram.FloatHistogram{Count: 3, Sum: 6, Schema: 0, PositiveSpans: []histogram.Span{{Offset: 0, Length: 1}}, PositiveBuckets: []float64{3}}
	s := storage.NewListSeries(labels.FromStrings("a", "b"), []chunks.Sample{
		hSample{60*m - 1, h}, hSample{120*m - 1, h}, hSample{180*m - 1, h},
	})
	it := filledSeries{Series: s, res: Res1h, from: math.MinInt64, to: math.MaxInt64}.Iterator(nil)
	n := 0
	for vt := it.Next(); vt != chunkenc.ValNone; vt = it.Next() {
		if vt != chunkenc.ValFloatHistogram {
			t.Fatalf("point %d: value type %v, want float histogram", n, vt)
		}
		if _, got := it.AtFloatHistogram(nil); got.Count != 3 {
			t.Fatalf("point %d: %v", n, got)
		}
		n++
	}
	if n != 3 {
		t.Fatalf("%d points, want the 3 histograms as they are", n)
	}
}

type hSample struct {
	t  int64
	fh *histogram.FloatHistogram
}

func (s hSample) T() int64                      { return s.t }
func (s hSample) ST() int64                     { return 0 }
func (s hSample) F() float64                    { return 0 }
func (s hSample) H() *histogram.Histogram       { return nil }
func (s hSample) FH() *histogram.FloatHistogram { return s.fh }
func (s hSample) Type() chunkenc.ValueType      { return chunkenc.ValFloatHistogram }
func (s hSample) Copy() chunks.Sample           { return hSample{s.t, s.fh.Copy()} }
