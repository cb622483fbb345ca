package downsample

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/value"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
)

// keptStream returns a counter's kept samples (stored times: raw - 1 ms)
// for random raw samples: scrapes at a random interval and phase, resets,
// NaNs, staleness markers, gaps and lone samples in a window.
func keptStream(rng *rand.Rand, res int64) []sample {
	var kept []sample
	cs := &counterSelector{res: res, emit: func(s *sample) {
		k := *s
		k.t--
		kept = append(kept, k)
	}}
	interval := []int64{1_000, 15_000, 60_000, 7 * 60_000}[rng.IntN(4)]
	v := 0.0
	for t := t0 + rng.Int64N(interval); t < t0+span; t += interval + rng.Int64N(3) {
		switch r := rng.IntN(100); {
		case r < 3:
			t += rng.Int64N(3 * res) // a gap
		case r < 5:
			cs.add(sample{t: t, f: math.Float64frombits(value.StaleNaN)})
			continue
		case r < 7:
			cs.add(sample{t: t, f: math.NaN()})
			continue
		case r < 10:
			v = rng.Float64() // a reset
		}
		v += rng.ExpFloat64()
		cs.add(sample{t: t, f: v})
	}
	cs.finish()
	return kept
}

// Pairs give back exactly the kept samples, within the bounds they are read
// with, by Next and by Seek.
func TestPairsGiveBackTheKeptSamples(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 200 {
		res := []int64{Res5m, Res1h}[i%2]
		kept := keptStream(rng, res)
		if len(kept) == 0 {
			continue
		}
		out := &outSeries{w: &writer{}}
		pw := &pairWriter{res: res, out: out}
		for _, s := range kept {
			raw := s
			raw.t++
			pw.add(&raw)
		}
		pw.flush()
		if out.w.err != nil {
			t.Fatal(out.w.err)
		}
		if len(out.samples) > len(kept) || len(out.samples) < (len(kept)+1)/2 {
			t.Fatalf("%d kept samples in %d points", len(kept), len(out.samples))
		}
		lo, hi := int64(math.MinInt64), int64(math.MaxInt64)
		if i%3 != 0 {
			lo = kept[0].t + rng.Int64N(kept[len(kept)-1].t-kept[0].t+1)
			hi = lo + rng.Int64N(kept[len(kept)-1].t-lo+res)
		}
		var want []sample
		for _, s := range kept {
			if s.t >= lo && s.t <= hi {
				want = append(want, s)
			}
		}
		ps := pairsSeries{lset: labels.EmptyLabels(), s: &bufSeries{samples: out.samples}, lo: lo, hi: hi}
		var got []sample
		it := ps.Iterator(nil)
		for it.Next() == chunkenc.ValFloat {
			t, v := it.At()
			got = append(got, sample{t: t, f: v})
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
		sameSamples(t, "Next", want, got)

		// Seeks forward to random times, with a Next now and then.
		it = ps.Iterator(it)
		at, pos := kept[0].t-res, 0 // pos: index in want of the current sample
		for range 50 {
			if rng.IntN(3) == 0 && pos < len(want) && at >= want[0].t {
				vt := it.Next()
				pos++
				if pos >= len(want) {
					if vt != chunkenc.ValNone {
						t.Fatalf("Next after the last sample gives %v", vt)
					}
					break
				}
				sameSamples(t, "Next after Seek", want[pos:pos+1], []sample{atSample(it)})
				at = want[pos].t
				continue
			}
			at += rng.Int64N(2 * res)
			vt := it.Seek(at)
			for pos < len(want) && want[pos].t < at {
				pos++
			}
			if pos >= len(want) {
				if vt != chunkenc.ValNone {
					t.Fatalf("Seek(%d) past the last sample gives %v", at, vt)
				}
				break
			}
			if vt != chunkenc.ValFloat {
				t.Fatalf("Seek(%d) gives %v, want the sample at %d", at, vt, want[pos].t)
			}
			sameSamples(t, "Seek", want[pos:pos+1], []sample{atSample(it)})
			at = want[pos].t
		}
	}
}

func atSample(it chunkenc.Iterator) sample {
	t, v := it.At()
	return sample{t: t, f: v}
}

func sameSamples(t *testing.T, what string, want, got []sample) {
	t.Helper()
	if len(want) != len(got) {
		t.Fatalf("%s: %d samples, want %d", what, len(got), len(want))
	}
	for i := range want {
		if want[i].t != got[i].t || math.Float64bits(want[i].f) != math.Float64bits(got[i].f) &&
			!(math.IsNaN(want[i].f) && math.IsNaN(got[i].f) && value.IsStaleNaN(want[i].f) == value.IsStaleNaN(got[i].f)) {
			t.Fatalf("%s: sample %d is %d:%v, want %d:%v", what, i, got[i].t, got[i].f, want[i].t, want[i].f)
		}
	}
}

// A range that ends between a pair's two samples still reads its first:
// counter functions answer at a step the same whether the query ends there
// or goes on.
func TestPairsAnswerAtEveryRangeEnd(t *testing.T) {
	f := newFixture(t, 5, 8)
	for _, c := range []struct {
		q    storage.Queryable
		res  int64
		step int64
	}{{f.ds5m, Res5m, 7*60_000 + 13_000}, {f.ds1h, Res1h, 37*60_000 + 11_000}} {
		for _, qs := range []string{"resets(counter_metric_total[%s])", "increase(counter_metric_total[%s])", "max_over_time(counter_metric_total[%s])"} {
			rs := (time.Duration(c.res) * time.Millisecond).String()
			q := fmt.Sprintf(qs, rs)
			start := t0 + c.res
			long := rangeQuery(t, c.q, q, 5*time.Minute, start, t0+span, c.step)
			for end := start; end < t0+span; end += 5 * c.step {
				short := rangeQuery(t, c.q, q, 5*time.Minute, start, end, c.step)
				want := points{}
				for k, ps := range long {
					for ts, v := range ps {
						if ts <= end {
							if want[k] == nil {
								want[k] = map[int64]float64{}
							}
							want[k][ts] = v
						}
					}
				}
				compare(t, fmt.Sprintf("%s ending at %s", q, time.UnixMilli(end).UTC().Format(time.TimeOnly)), want, short, exact)
			}
		}
	}
}

// A querier opened to the end of time (as /api/v1/series without an end
// may) reads pairs too: the window it adds for them must not wrap maxt.
func TestPairsQuerierToTheEndOfTime(t *testing.T) {
	f := newFixture(t, 5, 8)
	q, err := f.ds5m.Querier(t0, math.MaxInt64)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	ss := q.Select(context.Background(), false, nil, labels.MustNewMatcher(labels.MatchEqual, "__name__", "counter_metric_total"))
	series, samples := 0, 0
	var it chunkenc.Iterator
	for ss.Next() {
		series++
		it = ss.At().Iterator(it)
		for it.Next() != chunkenc.ValNone {
			samples++
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := ss.Err(); err != nil {
		t.Fatal(err)
	}
	if series == 0 || samples == 0 {
		t.Fatalf("a querier to the end of time read %d series, %d samples of the counter", series, samples)
	}
}

// Each kept sample says how many raw samples were left out before it, so
// that a range of whole windows can count its raw samples from the kept
// ones (densify.go): per window, the kept samples and what they say was
// left out add up to the raw samples, at 5m from raw data and at 1h from
// the 5m pairs, and the pairs give the counts back.
func TestKeptSamplesCountTheRawSamples(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for i := range 100 {
		// Raw samples as keptStream makes them, recorded.
		interval := []int64{1_000, 15_000, 60_000}[rng.IntN(3)]
		var raw []sample
		v := 0.0
		for ts := t0 + rng.Int64N(interval); ts < t0+span; ts += interval + rng.Int64N(3) {
			switch r := rng.IntN(100); {
			case r < 3:
				ts += rng.Int64N(3 * Res5m) // a gap
			case r < 5:
				raw = append(raw, sample{t: ts, f: math.Float64frombits(value.StaleNaN)})
				continue
			case r < 7:
				raw = append(raw, sample{t: ts, f: math.NaN()})
				continue
			case r < 10:
				v = rng.Float64() // a reset
			}
			v += rng.ExpFloat64()
			raw = append(raw, sample{t: ts, f: v})
		}
		count := func(res int64) map[int64]int64 { // non-stale raw samples per window
			out := map[int64]int64{}
			for _, s := range raw {
				if !s.isStale() {
					out[windowEnd(s.t, res)]++
				}
			}
			return out
		}
		// raw → 5m pairs → read back (raw time) → 1h pairs → read back.
		in := raw
		for _, res := range []int64{Res5m, Res1h} {
			out := &outSeries{w: &writer{}}
			pw := &pairWriter{res: res, out: out}
			cs := &counterSelector{res: res, emit: pw.add}
			for _, s := range in {
				cs.add(s)
			}
			cs.finish()
			pw.flush()
			if out.w.err != nil {
				t.Fatal(out.w.err)
			}
			it := pairsSeries{lset: labels.EmptyLabels(), s: &bufSeries{samples: out.samples}, lo: math.MinInt64, hi: math.MaxInt64}.Iterator(nil).(*pairIterator)
			got := map[int64]int64{}
			in = in[:0:0]
			for it.Next() == chunkenc.ValFloat {
				ts, v := it.At()
				d := it.drops()
				if d < 0 {
					t.Fatalf("round %d, %s: a kept sample at %d does not say what was left out", i, ResolutionName(res), ts)
				}
				if !value.IsStaleNaN(v) {
					got[windowEnd(ts+1, res)] += 1 + d
				} else if d != 0 {
					t.Fatalf("round %d, %s: a staleness marker stands for %d left-out samples", i, ResolutionName(res), d)
				}
				in = append(in, sample{t: ts + 1, f: v, drops: d})
			}
			if err := it.Err(); err != nil {
				t.Fatal(err)
			}
			want := count(res)
			for w, n := range want {
				if got[w] != n {
					t.Fatalf("round %d (interval %d), %s window ending %d: kept samples count %d raw samples, want %d", i, interval, ResolutionName(res), w, got[w], n)
				}
			}
			if len(got) != len(want) {
				t.Fatalf("round %d, %s: %d windows counted, want %d", i, ResolutionName(res), len(got), len(want))
			}
		}
	}
}
