package downsample

import (
	"math"
	"slices"
	"sort"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/value"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
)

// Where a counter starts or ends inside a range (a job that begins, a GPU
// that leaves), Prometheus' rate, increase and delta extrapolate past the
// first and last sample by half the average interval between the range's
// samples, not to the range's edges (promql's extrapolatedRate: an edge
// is "covered" when its sample is within 1.1 average intervals of it). The
// average is the sampled interval over the number of samples, and the kept
// samples (a window's first and last) are far fewer than the raw ones: over
// them the engine took the series to cover edges it does not cover, or
// extrapolated by half of a much longer "interval" (per-namespace energy
// per day 15–19 % high).
//
// Everything else the engine computes from a range is the same over the
// kept samples as over the raw ones: the first and last sample, the
// reset-adjusted increase between them. So where an evaluation's raw
// answer would not extrapolate to both edges, the reader puts back, in the
// windows of that range, as many samples as downsampling left out
// (counterSelector counts them), each a copy of the kept sample after it
// (the run between two kept samples has no reset, so copies add neither
// increase nor reset) at times spread between that sample and the one
// before it: the engine then counts the raw number of samples and answers
// as over raw data. Ranges whose raw answer extrapolates to both edges
// (a series that covers them) answer alike either way and get no copies.
//
// Where no two evaluations' ranges overlap (chargeback's increase[1d] at a
// 1d step), a day of samples put back for every job that starts or ends in
// it cost as much as reading raw data. There the reader works out the raw
// answer itself (the engine's arithmetic, with the raw number of samples)
// and gives the engine, in place of the range's samples, two that make it
// answer exactly that (fabricate).
//
// A range of whole windows (WindowFit's Fits) holds a kept sample's left-out
// samples whenever it holds the sample (they lie in its window), so the
// count is exact. A range that reaches past what this reader reads (the
// edge of raw data, another resolution, a block read elsewhere) gets the
// copies in all of its windows here, since the other side's samples are not
// seen: the raw side has every sample, so the sum is the raw count again.
//
// Data that does not record what it left out (blocks written before it
// did, native histograms, old-layout counter floats) cannot be filled in:
// there a select whose evaluations may not extrapolate to both edges (the
// first or last kept sample in a range further than 1.1 times the shortest
// interval between samples of consecutive windows from the edge) says it is
// approximate (heuristically: a series scraped unevenly can still differ).

// evaluations are the ranges a select is evaluated over, in raw time:
// (e - rng, e] for e = first + k·step, k ≥ 0, e ≤ last (one when step is 0).
type evaluations struct {
	fn                     string // rate, increase or delta
	first, last, step, rng int64
	counter                bool // rate or increase: the engine treats the samples as a counter's
}

// extrapolates says whether a function extrapolates from the samples it
// reads to the range's edges (and so counts them).
func extrapolates(fn string) bool {
	return fn == "rate" || fn == "increase" || fn == "delta"
}

// evaluationsOf returns the evaluations of a select with hints h (as the
// engine made them, not narrowed to a segment) over data of resolution
// res, when it is a rate, increase or delta whose ranges are whole windows
// at known times (WindowFit's Fits).
func evaluationsOf(atSteps bool, h *storage.SelectHints, res int64) *evaluations {
	if h == nil || h.Range <= 0 || res <= 0 || !extrapolates(h.Func) || WindowFit(atSteps, h, res) != Fits {
		return nil
	}
	e := &evaluations{fn: h.Func, first: h.Start + h.Range - 1, rng: h.Range, counter: h.Func != "delta"}
	e.last = e.first
	if h.Step > 0 && atSteps {
		e.step, e.last = h.Step, h.End
	}
	return e
}

// each calls f with the range (from, to] of every evaluation that ends at
// or after lo and begins before hi, in order.
func (e *evaluations) each(lo, hi int64, f func(from, to int64)) {
	at := e.first
	if e.step > 0 && lo > at {
		at += (lo - at) / e.step * e.step
	}
	for ; at <= e.last && at-e.rng < hi; at += e.step {
		if at >= lo {
			f(at-e.rng, at)
		}
		if e.step <= 0 {
			return
		}
	}
}

// apart says whether no two evaluations' ranges overlap.
func (e *evaluations) apart() bool { return e.step <= 0 || e.step >= e.rng }

// cut returns spans without the time of c.
func cut(spans []Span, c Span) []Span {
	var out []Span
	for _, s := range spans {
		if c.Hi < s.Lo || c.Lo > s.Hi {
			out = append(out, s)
			continue
		}
		if s.Lo < c.Lo {
			out = append(out, Span{s.Lo, c.Lo - 1})
		}
		if s.Hi > c.Hi {
			out = append(out, Span{c.Hi + 1, s.Hi})
		}
	}
	return out
}

// within says whether (from, to] lies inside one of spans.
func within(spans []Span, from, to int64) bool {
	return slices.ContainsFunc(spans, func(s Span) bool { return s.Lo <= from+1 && to <= s.Hi })
}

// extrapolation is what PromQL's rate, increase and delta make of the n
// samples of a range (from, to] from first to last (raw times): how far
// before the first and after the last sample they extrapolate, in seconds,
// and the sampled interval. Written after promql's extrapolatedRate, with
// the same float arithmetic, so that it decides as the engine does.
type extrapolation struct {
	toStart, toEnd, sampled float64
	threshold, average      float64
}

func extrapolationOf(from, to, first, last, n int64) extrapolation {
	x := extrapolation{toStart: float64(first-from) / 1000, toEnd: float64(to-last) / 1000, sampled: float64(last-first) / 1000}
	x.average = x.sampled / float64(n-1)
	x.threshold = x.average * 1.1
	return x
}

// toEdges says whether the samples are taken to cover both edges (the
// engine extrapolates to them).
func (x extrapolation) toEdges() bool { return x.toStart < x.threshold && x.toEnd < x.threshold }

// factor is what the engine multiplies the samples' increase (delta: their
// difference) by; vFirst is the first sample's value, a counter's zero
// point bounding the extrapolation before it.
func (x extrapolation) factor(counter bool, increase, vFirst float64) float64 {
	toStart, toEnd := x.toStart, x.toEnd
	if toStart >= x.threshold {
		toStart = x.average / 2
	}
	if counter {
		toZero := toStart
		if increase > 0 && vFirst >= 0 {
			toZero = x.sampled * (vFirst / increase)
		}
		if toZero < toStart {
			toStart = toZero
		}
	}
	if toEnd >= x.threshold {
		toEnd = x.average / 2
	}
	if x.sampled == 0 {
		return 1
	}
	return (x.sampled + toStart + toEnd) / x.sampled
}

// increase is the engine's increase of float samples vs (delta: their
// difference): the last less the first, plus the value before each drop
// for a counter.
func increase(vs []float64, counter bool) float64 {
	r := vs[len(vs)-1] - vs[0]
	if counter {
		for i := 1; i < len(vs); i++ {
			if vs[i] < vs[i-1] {
				r += vs[i-1]
			}
		}
	}
	return r
}

// densified reads a pairs series with the left-out samples put back in
// the windows of the evaluations that need them.
type densified struct {
	pairs pairsSeries
	evals *evaluations
	seen  []Span
	res   int64
}

func (d densified) Labels() labels.Labels { return d.pairs.Labels() }

func (d densified) Iterator(it chunkenc.Iterator) chunkenc.Iterator {
	di, ok := it.(*densifyIterator)
	if !ok {
		di = &densifyIterator{}
	}
	di.src = d.pairs.Iterator(di.src)
	di.d = d
	di.loaded, di.err = false, nil
	di.ts, di.vs, di.drops, di.marks = di.ts[:0], di.vs[:0], di.drops[:0], di.marks[:0]
	di.i, di.k, di.n = -1, 0, 0
	return di
}

// densifyIterator reads the whole pairs series (its kept samples, stored
// times) on first use, finds the samples whose left-out ones to put back,
// and then yields the kept samples with the copies before them.
type densifyIterator struct {
	floatOnly
	src chunkenc.Iterator
	d   densified

	loaded bool
	err    error
	ts     []int64 // kept samples, stored times
	vs     []float64
	drops  []int64
	marks  []bool // put back the samples left out before this one

	i    int   // the current kept sample
	k, n int   // the current copy before it (k < n), n copies in all
	lo   int64 // copies are spread over (lo, ts[i])

	// Buffers kept for the next series the iterator is reused for.
	live       []int
	count      []int64
	diff       []int
	fabricated []fabrication
	values     []float64
	spare      struct {
		ts, drops []int64
		vs        []float64
		marks     []bool
	}
}

func (d *densifyIterator) load() {
	d.loaded = true
	p := d.src.(*pairIterator)
	for p.Next() == chunkenc.ValFloat {
		t, v := p.At()
		d.ts, d.vs, d.drops = append(d.ts, t), append(d.vs, v), append(d.drops, p.drops())
	}
	if d.err = p.Err(); d.err != nil || len(d.ts) == 0 {
		return
	}
	d.marks = slices.Grow(d.marks[:0], len(d.ts))[:len(d.ts)]
	clear(d.marks)
	d.mark()
}

// mark marks the samples of every evaluation whose raw answer does not
// extrapolate to both edges, or whose range reaches past what is read. Where
// no two evaluations' ranges overlap (a daily chargeback's increase[1d] at a
// 1d step), such a range's samples, fully seen, are replaced instead by two
// that give the engine the raw answer, worked out here (fabricate): a day of
// raw samples put back for every job that starts or ends in it cost as much
// as reading raw data.
func (d *densifyIterator) mark() {
	// live are the indexes of the samples the engine reads (not markers);
	// count[k] is the raw samples up to and including live[k-1]'s.
	live, count, diff := d.live[:0], d.count[:0], slices.Grow(d.diff[:0], len(d.ts)+1)[:len(d.ts)+1]
	count = append(count, 0)
	clear(diff)
	defer func() { d.live, d.count, d.diff = live, count, diff }()
	total := int64(0)
	for i, v := range d.vs {
		if value.IsStaleNaN(v) {
			continue
		}
		total += 1 + max(d.drops[i], 0)
		live = append(live, i)
		count = append(count, total)
	}
	markRange := func(from, to int) { // sample indexes [from, to]
		if from <= to {
			diff[from]++
			diff[to+1]--
		}
	}
	fabricated, vs := d.fabricated[:0], d.values[:0]
	defer func() { d.fabricated, d.values = fabricated, vs }()
	evals := d.d.evals
	a, b := 0, 0 // live[a:b] are in the current range
	evals.each(d.ts[0]+1, d.ts[len(d.ts)-1]+1, func(from, to int64) {
		// Raw time is stored time + 1 ms.
		for a < len(live) && d.ts[live[a]]+1 <= from {
			a++
		}
		b = max(b, a)
		for b < len(live) && d.ts[live[b]]+1 <= to {
			b++
		}
		if a >= b {
			return
		}
		first, last := live[a], live[b-1]
		if !within(d.d.seen, from, to) {
			// Part of the range is read elsewhere: put back every left-out
			// sample of the part read here.
			i := sort.Search(len(d.ts), func(i int) bool { return d.ts[i]+1 > from })
			j := sort.Search(len(d.ts), func(i int) bool { return d.ts[i]+1 > to }) - 1
			markRange(i, j)
			return
		}
		// The raw samples from first to last, both included (the ones left
		// out before first are before it).
		n := 1 + count[b] - count[a+1]
		if n < 2 || n == int64(b-a) {
			return // one sample (no answer), or nothing left out: as raw
		}
		x := extrapolationOf(from, to, d.ts[first]+1, d.ts[last]+1, n)
		switch {
		case x.toEdges():
		case evals.apart():
			vs = vs[:0]
			for _, i := range live[a:b] {
				vs = append(vs, d.vs[i])
			}
			inc := increase(vs, evals.counter)
			fabricated = append(fabricated, fabricate(from, to, inc*x.factor(evals.counter, inc, vs[0]), evals.counter))
		default:
			markRange(first, last)
		}
	})
	on := 0
	for i := range d.ts {
		on += diff[i]
		d.marks[i] = on > 0
	}
	d.replace(fabricated)
}

// fabrication is two samples that make the engine answer v for the range
// (from, to]; they take the place of the range's samples.
type fabrication struct {
	from, to int64
	v1, v2   float64
}

// fabricate returns the samples at the range's first and last millisecond
// whose increase (counter) or difference the engine extrapolates to want:
// from 0 a counter's increase is not extrapolated before its first sample
// (its zero point is there), and the last sample is at the range's end; a
// difference, or a counter's increase that is not positive, is extrapolated
// by the millisecond before the first sample, which the second's value
// takes back.
func fabricate(from, to int64, want float64, counter bool) fabrication {
	f := fabrication{from: from, to: to, v2: want}
	if !counter || !(want > 0) {
		sampled := float64(to-from-1) / 1000
		f.v2 = want / ((sampled + 0.001) / sampled)
	}
	return f
}

// replace puts the fabricated samples in place of the kept samples of
// their ranges (in order, none overlapping another).
func (d *densifyIterator) replace(fs []fabrication) {
	if len(fs) == 0 {
		return
	}
	// The kept samples move to the spare buffers, the result takes theirs.
	ts, vs, drops, marks := d.ts, d.vs, d.drops, d.marks
	d.ts, d.vs, d.drops, d.marks = d.spare.ts[:0], d.spare.vs[:0], d.spare.drops[:0], d.spare.marks[:0]
	defer func() { d.spare.ts, d.spare.vs, d.spare.drops, d.spare.marks = ts, vs, drops, marks }()
	put := func(t int64, v float64, drops int64, mark bool) {
		d.ts, d.vs, d.drops, d.marks = append(d.ts, t), append(d.vs, v), append(d.drops, drops), append(d.marks, mark)
	}
	i := 0
	for _, f := range fs {
		for ; i < len(ts) && ts[i]+1 <= f.from; i++ {
			put(ts[i], vs[i], drops[i], marks[i])
		}
		put(f.from, f.v1, 0, false) // raw times from + 1 and to, stored 1 ms earlier
		put(f.to-1, f.v2, 0, false)
		for ; i < len(ts) && ts[i]+1 <= f.to; i++ {
		}
	}
	for ; i < len(ts); i++ {
		put(ts[i], vs[i], drops[i], marks[i])
	}
}

// enter makes kept sample i current, starting with its copies if marked.
func (d *densifyIterator) enter(i int) chunkenc.ValueType {
	d.i, d.k, d.n = i, 0, 0
	if i >= len(d.ts) {
		return chunkenc.ValNone
	}
	if d.marks[i] && d.drops[i] > 0 {
		d.n = int(d.drops[i])
		// Spread over the time between the kept sample before and this
		// one, within this one's window (its left-out samples were there).
		w := windowEnd(d.ts[i]+1, d.d.res) - d.d.res - 1 // the window's start, stored time
		d.lo = w
		if i > 0 {
			d.lo = max(d.lo, d.ts[i-1])
		}
		if d.ts[i]-d.lo <= int64(d.n) { // not room for them all: never in data we wrote
			d.n = 0
		}
	}
	return chunkenc.ValFloat
}

// at is the time of the current sample or copy.
func (d *densifyIterator) at() int64 {
	if d.k < d.n {
		gap := d.ts[d.i] - d.lo
		return d.lo + int64(d.k+1)*gap/int64(d.n+1)
	}
	return d.ts[d.i]
}

func (d *densifyIterator) Next() chunkenc.ValueType {
	if !d.loaded {
		d.load()
	}
	if d.err != nil {
		return chunkenc.ValNone
	}
	if d.i >= 0 && d.i < len(d.ts) && d.k < d.n {
		d.k++
		return chunkenc.ValFloat
	}
	return d.enter(d.i + 1)
}

func (d *densifyIterator) Seek(t int64) chunkenc.ValueType {
	if !d.loaded {
		d.load()
	}
	if d.err != nil {
		return chunkenc.ValNone
	}
	if d.i < 0 {
		d.enter(0)
	}
	if d.i >= len(d.ts) {
		return chunkenc.ValNone
	}
	if d.at() >= t {
		return chunkenc.ValFloat
	}
	if d.ts[d.i] < t { // past this kept sample: find the first at or after t
		j := d.i + sort.Search(len(d.ts)-d.i, func(j int) bool { return d.ts[d.i+j] >= t })
		if d.enter(j) == chunkenc.ValNone {
			return chunkenc.ValNone
		}
	}
	for d.at() < t { // among the copies before it
		d.k++
	}
	return chunkenc.ValFloat
}

func (d *densifyIterator) At() (int64, float64) { return d.at(), d.vs[d.i] }
func (d *densifyIterator) AtT() int64           { return d.at() }
func (d *densifyIterator) Err() error           { return d.err }

// mayNotCover says, for kept samples that do not record what was left out
// between them (series), whether an evaluation's raw answer may not
// extrapolate to both edges where the kept samples' does: the first or last
// kept sample in a range at least 1.1 times the shortest interval seen
// between samples of consecutive windows (two raw samples in a row) from
// its edge, or a range that reaches past what is read.
func mayNotCover(series storage.Series, evals *evaluations, seen []Span, res int64) (bool, error) {
	var ts []int64
	it := series.Iterator(nil)
	for vt := it.Next(); vt != chunkenc.ValNone; vt = it.Next() {
		var stale bool
		var t int64
		switch vt {
		case chunkenc.ValFloat:
			var v float64
			t, v = it.At()
			stale = value.IsStaleNaN(v)
		case chunkenc.ValHistogram:
			t = it.AtT()
			_, h := it.AtHistogram(nil)
			stale = value.IsStaleNaN(h.Sum)
		default:
			t = it.AtT()
			_, fh := it.AtFloatHistogram(nil)
			stale = value.IsStaleNaN(fh.Sum)
		}
		if !stale {
			ts = append(ts, t+1) // raw time
		}
	}
	if err := it.Err(); err != nil {
		return false, err
	}
	interval := int64(math.MaxInt64)
	for i := 1; i < len(ts); i++ {
		if windowEnd(ts[i], res) != windowEnd(ts[i-1], res) {
			interval = min(interval, ts[i]-ts[i-1])
		}
	}
	may := false
	a, b := 0, 0
	if len(ts) == 0 {
		return false, nil
	}
	evals.each(ts[0], ts[len(ts)-1], func(from, to int64) {
		for a < len(ts) && ts[a] <= from {
			a++
		}
		b = max(b, a)
		for b < len(ts) && ts[b] <= to {
			b++
		}
		switch {
		case may || b-a < 2:
		case !within(seen, from, to) || interval == math.MaxInt64:
			may = true
		default:
			edge := float64(interval) * 1.1
			may = float64(ts[a]-from) >= edge || float64(to-ts[b-1]) >= edge
		}
	})
	return may, nil
}
