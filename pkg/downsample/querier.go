package downsample

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/value"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/util/annotations"

	"github.com/gpustore/gpustore/pkg/seriesset"
)

// View is how a selector reads a downsampled series. Every view answers for
// gauges and counters; where a series lacks the view's aggregate (counters
// store only kept samples, "pairs" and "counter", gauges neither) the view
// falls back as listed.
// A gauge's aggregates are the fields of its packed series (or its
// old-layout series of the same names).
//
//	view     gauge series           counter series
//	avg      sum/count per window   kept samples
//	min      min                    kept samples (exact min_over_time)
//	max      max                    kept samples (exact max_over_time)
//	sum      sum                    kept samples
//	count    count                  1 per kept sample
//	counter  sum/count per window   kept samples
type View string

// Views, also accepted as the value of an explicit AggrLabel="<view>"
// matcher in a query (see Rewrite).
const (
	ViewAvg     View = "avg"
	ViewMin     View = "min"
	ViewMax     View = "max"
	ViewSum     View = "sum"
	ViewCount   View = "count"
	ViewCounter View = "counter"
)

func parseView(s string) (View, bool) {
	switch v := View(s); v {
	case ViewAvg, ViewMin, ViewMax, ViewSum, ViewCount, ViewCounter:
		return v, true
	}
	return "", false
}

// ViewFor picks the view for a selector from the function around it
// (SelectHints.Func):
//
//   - min_over_time → min, max_over_time → max, sum_over_time → sum: each
//     exact over whole windows (the engine folds the per-window aggregates).
//   - count_over_time → count and avg_over_time → avg: the engine counts and
//     averages points, not raw samples, so on their own these give the number
//     of windows and the mean of window means. Rewrite turns them into
//     sum_over_time over explicit count and sum views, which is exact; a
//     query that is not rewritten gets the approximations.
//   - rate, increase, irate, resets, delta, idelta, deriv, changes,
//     predict_linear → counter (gauges fall back to avg): exact at window
//     edges for counters; irate becomes the rate between a window's first
//     and last sample.
//   - everything else (plain selectors, aggregations of them, other
//     functions) → avg: a plain selector at a window's end reads the
//     window's average, i.e. avg_over_time(x[R]) on raw data.
func ViewFor(h *storage.SelectHints) View {
	if h == nil {
		return ViewAvg
	}
	switch h.Func {
	case "min_over_time":
		return ViewMin
	case "max_over_time":
		return ViewMax
	case "sum_over_time":
		return ViewSum
	case "count_over_time":
		return ViewCount
	case "avg_over_time":
		return ViewAvg
	case "rate", "increase", "irate", "resets", "delta", "idelta", "deriv", "changes", "predict_linear":
		return ViewCounter
	}
	return ViewAvg
}

// explicitView removes an AggrLabel matcher from ms and returns the view it names.
func explicitView(ms []*labels.Matcher) ([]*labels.Matcher, View, bool, error) {
	for i, m := range ms {
		if m.Name != AggrLabel {
			continue
		}
		v, ok := parseView(m.Value)
		if m.Type != labels.MatchEqual || !ok {
			return nil, "", false, fmt.Errorf("%s accepts only = with avg, min, max, sum, count or counter, not %s", AggrLabel, m)
		}
		rest := make([]*labels.Matcher, 0, len(ms)-1)
		rest = append(rest, ms[:i]...)
		rest = append(rest, ms[i+1:]...)
		return rest, v, true, nil
	}
	return ms, "", false, nil
}

type querier struct {
	storage.Querier
	// pairs reads the pairs series: the same blocks up to a window past hi
	// (pairs.go); nil: Querier does.
	pairs    storage.Querier
	res      int64 // the blocks' resolution, for plain selectors' fill (0: no fill)
	from, to int64 // plain selectors' points outside are read but not returned
	lo, hi   int64 // the range Querier reads, to which pairs are cut
	// approx, when set, is why every answer read here is approximate (the
	// windows do not fit the select's ranges: GridReason).
	approx string
	// What rate, increase and delta need to answer as over raw data where
	// a series starts or ends inside their ranges (densify.go): the
	// selects' hints before a caller narrowed them (nil: their own), the
	// raw time the blocks are read over, and whether every block records
	// the samples downsampling left out.
	hints      *storage.SelectHints
	seen       []Span
	keptCounts bool
	atSteps    bool // Blocks.AtSteps
}

func (q *querier) Close() error {
	err := q.Querier.Close()
	if q.pairs != nil {
		err = errors.Join(err, q.pairs.Close())
	}
	return err
}

// aggregates read per view: the packed gauge series, the view's own
// old-layout series, then the counter's.
var viewAggrs = map[View][]string{
	ViewAvg:     {AggrPacked, AggrSum, AggrCount, AggrPairs, AggrCounter},
	ViewCounter: {AggrPacked, AggrSum, AggrCount, AggrPairs, AggrCounter},
	ViewMin:     {AggrPacked, AggrMin, AggrPairs, AggrCounter},
	ViewMax:     {AggrPacked, AggrMax, AggrPairs, AggrCounter},
	ViewSum:     {AggrPacked, AggrSum, AggrPairs, AggrCounter},
	ViewCount:   {AggrPacked, AggrCount, AggrPairs, AggrCounter},
}

func (q *querier) Select(ctx context.Context, _ bool, hints *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
	ms, view, ok, err := explicitView(ms)
	if err != nil {
		return storage.ErrSeriesSet(err)
	}
	if !ok {
		view = ViewFor(hints)
	}
	aggrs := viewAggrs[view]
	sets := make([]storage.SeriesSet, len(aggrs))
	// Pairs are read up to a window past the range and cut to it (pairs.go).
	lo, hi, pairHints := q.pairRange(hints)
	for i, a := range aggrs {
		sel := make([]*labels.Matcher, 0, len(ms)+1)
		sel = append(sel, ms...)
		sel = append(sel, labels.MustNewMatcher(labels.MatchEqual, AggrLabel, a))
		// Each set is sorted by its labels; AggrLabel is constant within it,
		// so it is sorted by the series' own labels too, and the sets join.
		if a == AggrPairs {
			from := q.Querier
			if q.pairs != nil {
				from = q.pairs
			}
			sets[i] = from.Select(ctx, true, pairHints, sel...)
			continue
		}
		sets[i] = q.Querier.Select(ctx, true, hints, sel...)
	}
	fill := int64(0)
	if plainSelect(hints) && q.res > fillEvery+60_000 {
		// 5m points already tile the default 5m lookback; 1h points do not.
		fill = q.res
	}
	j := &joinSet{view: view, explicit: ok, hints: hints, approx: q.approx,
		aggrs: aggrs, sets: sets, fill: fill, from: q.from, to: q.to, lo: lo, hi: hi}
	if view == ViewCounter && !ok && q.approx == "" {
		h := q.hints
		if h == nil {
			h = hints
		}
		if j.evals = evaluationsOf(q.atSteps, h, q.res); j.evals != nil {
			j.res, j.keptCounts, j.seen = q.res, q.keptCounts, q.seen
			if j.seen == nil {
				j.seen = []Span{{lo + 1, hi + 1}}
			}
		}
	}
	return j
}

// pairRange returns the range a select reads (the TSDB's block querier
// reads the hinted range when there are hints, its own otherwise) and the
// hints that read its pairs: up to a window less a millisecond further.
func (q *querier) pairRange(h *storage.SelectHints) (lo, hi int64, wide *storage.SelectHints) {
	lo, hi = q.lo, q.hi
	if h == nil {
		return lo, hi, nil
	}
	lo, hi = max(lo, h.Start), min(hi, h.End)
	further := Res1h - 1 // the coarsest resolution's, when the blocks' is not known
	if q.res > 0 {
		further = q.res - 1
	}
	wide = new(*h)
	wide.End = h.End + min(further, math.MaxInt64-h.End)
	return lo, hi, wide
}

func (q *querier) LabelNames(ctx context.Context, hints *storage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	names, annos, err := q.Querier.LabelNames(ctx, hints, ms...)
	out := names[:0]
	for _, n := range names {
		if n != AggrLabel {
			out = append(out, n)
		}
	}
	return out, annos, err
}

func (q *querier) LabelValues(ctx context.Context, name string, hints *storage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	if name == AggrLabel {
		return nil, nil, nil
	}
	return q.Querier.LabelValues(ctx, name, hints, ms...)
}

// joinSet merges the per-aggregate series sets of one Select by the series'
// labels without AggrLabel and builds one series per group through the view.
type joinSet struct {
	fill  int64 // repeat points for plain selectors over gaps up to this long (0: no fill)
	from  int64 // and return them from here on
	to    int64 // up to here
	lo    int64 // pairs are cut to [lo, hi]
	hi    int64
	view  View
	aggrs []string
	sets  []storage.SeriesSet
	// What the annotation of an approximate answer needs: the select's
	// hints, whether its view was explicit (Rewrite), and the planner's
	// reason when the windows do not fit the ranges.
	hints    *storage.SelectHints
	explicit bool
	approx   string
	info     error // the approximation, once a series is read approximately
	// evals, for a rate, increase or delta over whole windows, are its
	// ranges, which a counter's left-out samples are put back into where
	// its raw answer does not extrapolate to their edges (densify.go), in
	// the raw time seen of data of resolution res; keptCounts says the data
	// records them (otherwise such an answer says it is approximate).
	evals      *evaluations
	seen       []Span
	res        int64
	keptCounts bool

	started bool
	heads   []storage.Series
	bases   []labels.Labels
	cur     storage.Series
	err     error
	warns   annotations.Annotations
}

func (j *joinSet) advance(i int) {
	if j.sets[i].Next() {
		s := j.sets[i].At()
		j.heads[i] = s
		j.bases[i] = labels.NewBuilder(s.Labels()).Del(AggrLabel).Labels()
		return
	}
	j.heads[i] = nil
	if err := j.sets[i].Err(); err != nil && j.err == nil {
		j.err = err
	}
}

func (j *joinSet) Next() bool {
	if !j.started {
		j.started = true
		j.heads = make([]storage.Series, len(j.sets))
		j.bases = make([]labels.Labels, len(j.sets))
		for i := range j.sets {
			j.advance(i)
		}
	}
	if j.err != nil {
		return false
	}
	min := -1
	for i, h := range j.heads {
		if h != nil && (min < 0 || labels.Compare(j.bases[i], j.bases[min]) < 0) {
			min = i
		}
	}
	if min < 0 {
		return false
	}
	base := j.bases[min]
	comps := map[string]storage.Series{}
	for i, h := range j.heads {
		if h != nil && labels.Equal(j.bases[i], base) {
			comps[j.aggrs[i]] = h
			j.advance(i)
		}
	}
	var kept bool
	j.cur, kept = buildSeries(j.view, base, comps, j.lo, j.hi)
	if j.info == nil {
		j.info = j.approximation(kept)
	}
	if kept && j.evals != nil {
		if err := j.extrapolation(comps); err != nil {
			j.err = err
			return false
		}
	}
	if j.fill > 0 {
		j.cur = filledSeries{Series: j.cur, res: j.fill, from: j.from, to: j.to}
	}
	if kept {
		j.cur = rawTimeSeries{j.cur}
	}
	return true
}

func (j *joinSet) At() storage.Series { return j.cur }
func (j *joinSet) Err() error         { return j.err }
func (j *joinSet) Warnings() annotations.Annotations {
	for _, s := range j.sets {
		j.warns.Merge(s.Warnings())
	}
	if j.info != nil {
		j.warns.Add(j.info)
	}
	return j.warns
}

// approximation is the annotation of a series read here whose answer is
// not raw's (kept: it is read from kept samples), or nil.
func (j *joinSet) approximation(kept bool) error {
	switch {
	case j.approx != "":
		return Approximation(j.approx)
	case !exactRead(j.hints, j.view, j.explicit, kept):
		return Approximation(whyApproximate(j.hints, j.view, j.explicit, kept))
	}
	return nil
}

// extrapolation makes the current series, a counter's kept samples read by
// a rate, increase or delta over whole windows, answer as over raw data
// where the series starts or ends inside a range: with its left-out samples
// put back there, or, where the data does not record them, by saying the
// answer is approximate when it may not be raw's (densify.go).
func (j *joinSet) extrapolation(comps map[string]storage.Series) error {
	if p, ok := j.cur.(pairsSeries); ok && j.keptCounts && comps[AggrCounter] == nil {
		j.cur = densified{pairs: p, evals: j.evals, seen: j.seen, res: j.res}
		return nil
	}
	if j.info != nil {
		return nil
	}
	may, err := mayNotCover(j.cur, j.evals, j.seen, j.res)
	if may {
		j.info = Approximation(fmt.Sprintf("%s where a series starts or ends inside the range needs the number of raw samples, which these blocks do not record for it (native histograms, and blocks downsampled before it was recorded)", j.evals.fn))
	}
	return err
}

// buildSeries reads one series' aggregates through view (pairs cut to [lo,
// hi]); kept says the series is read from kept samples (a counter's, or
// native histograms) rather than gauge aggregates.
func buildSeries(view View, base labels.Labels, comps map[string]storage.Series, lo, hi int64) (s storage.Series, kept bool) {
	counter := counterSeries(base, comps, lo, hi)
	switch view {
	case ViewCounter:
		if counter != nil {
			return counter, true
		}
		s = gaugeSeries(ViewAvg, base, comps)
	case ViewCount:
		if s = gaugeSeries(view, base, comps); s == nil && counter != nil {
			return onesSeries{base, counter}, true
		}
	default:
		if s = gaugeSeries(view, base, comps); s == nil && counter != nil {
			return counter, true
		}
	}
	if s == nil {
		// An incomplete set of aggregates (a sum without its count): read
		// whatever there is rather than hide the series.
		for _, a := range []string{AggrSum, AggrCount, AggrMin, AggrMax} {
			if c := comps[a]; c != nil {
				return relabeled{base, c}, false
			}
		}
	}
	return s, false
}

// counterSeries reads a counter's kept samples: its pairs (cut to [lo, hi])
// and its "counter" series (native histograms, old-layout floats), merged
// when it has both; nil when it has neither.
func counterSeries(base labels.Labels, comps map[string]storage.Series, lo, hi int64) storage.Series {
	var pairs, kept storage.Series
	if p := comps[AggrPairs]; p != nil {
		pairs = pairsSeries{lset: base, s: p, lo: lo, hi: hi}
	}
	if c := comps[AggrCounter]; c != nil {
		kept = relabeled{base, c}
	}
	switch {
	case pairs == nil:
		return kept
	case kept == nil:
		return pairs
	}
	return seriesset.ChainedSeriesMerge(pairs, kept)
}

// gaugeSeries reads a gauge's aggregate for view (avg, min, max, sum or
// count) from its packed series and from old-layout series, or returns nil
// when there is neither. A series with both (old and new blocks merged into
// one resolution) reads them merged: a time held by both gives one point.
func gaugeSeries(view View, base labels.Labels, comps map[string]storage.Series) storage.Series {
	var old storage.Series
	if view == ViewAvg {
		if sum, count := comps[AggrSum], comps[AggrCount]; sum != nil && count != nil {
			old = &avgSeries{lset: base, sum: sum, count: count}
		}
	} else if own := comps[string(view)]; own != nil {
		old = relabeled{base, own}
	}
	p := comps[AggrPacked]
	switch {
	case p == nil:
		return old
	case old == nil:
		return packedSeries{lset: base, s: p, view: view}
	}
	return seriesset.ChainedSeriesMerge(packedSeries{lset: base, s: p, view: view}, old)
}

type relabeled struct {
	lset labels.Labels
	storage.Series
}

func (r relabeled) Labels() labels.Labels { return r.lset }

// onesSeries reads every sample of a series as 1 (staleness markers stay
// markers): the count view of raw data and of counters.
type onesSeries struct {
	lset labels.Labels
	storage.Series
}

func (o onesSeries) Labels() labels.Labels { return o.lset }
func (o onesSeries) Iterator(it chunkenc.Iterator) chunkenc.Iterator {
	if oi, ok := it.(*onesIterator); ok {
		oi.it = o.Series.Iterator(oi.it)
		return oi
	}
	return &onesIterator{it: o.Series.Iterator(nil)}
}

type onesIterator struct {
	floatOnly
	it chunkenc.Iterator
	vt chunkenc.ValueType
}

func (o *onesIterator) conv(vt chunkenc.ValueType) chunkenc.ValueType {
	o.vt = vt
	if vt == chunkenc.ValNone {
		return vt
	}
	return chunkenc.ValFloat
}
func (o *onesIterator) Next() chunkenc.ValueType        { return o.conv(o.it.Next()) }
func (o *onesIterator) Seek(t int64) chunkenc.ValueType { return o.conv(o.it.Seek(t)) }
func (o *onesIterator) At() (int64, float64) {
	var stale bool
	var t int64
	switch o.vt {
	case chunkenc.ValFloat:
		var v float64
		t, v = o.it.At()
		stale = value.IsStaleNaN(v)
	default:
		var fh *histogram.FloatHistogram
		t, fh = o.it.AtFloatHistogram(nil)
		stale = value.IsStaleNaN(fh.Sum)
	}
	if stale {
		return t, math.Float64frombits(value.StaleNaN)
	}
	return t, 1
}
func (o *onesIterator) AtT() int64 { return o.it.AtT() }
func (o *onesIterator) Err() error { return o.it.Err() }

// avgSeries divides a gauge's window sums by its window counts. Both have a
// point at the same times (they are written together), staleness markers too.
type avgSeries struct {
	lset       labels.Labels
	sum, count storage.Series
}

func (a *avgSeries) Labels() labels.Labels { return a.lset }
func (a *avgSeries) Iterator(it chunkenc.Iterator) chunkenc.Iterator {
	ai, ok := it.(*avgIterator)
	if !ok {
		ai = &avgIterator{}
	}
	ai.sum = a.sum.Iterator(ai.sum)
	ai.count = a.count.Iterator(ai.count)
	ai.t, ai.v = 0, 0
	return ai
}

type avgIterator struct {
	floatOnly
	sum, count chunkenc.Iterator
	t          int64
	v          float64
	err        error
}

// align moves both iterators to the next time they share.
func (a *avgIterator) align(vs, vc chunkenc.ValueType) chunkenc.ValueType {
	for vs != chunkenc.ValNone && vc != chunkenc.ValNone {
		if vs != chunkenc.ValFloat || vc != chunkenc.ValFloat {
			a.err = fmt.Errorf("downsampled sum/count aggregates hold histograms")
			return chunkenc.ValNone
		}
		ts, tc := a.sum.AtT(), a.count.AtT()
		switch {
		case ts < tc:
			vs = a.sum.Seek(tc)
		case tc < ts:
			vc = a.count.Seek(ts)
		default:
			_, s := a.sum.At()
			_, c := a.count.At()
			a.t = ts
			if value.IsStaleNaN(s) || value.IsStaleNaN(c) {
				a.v = math.Float64frombits(value.StaleNaN)
			} else {
				a.v = s / c
			}
			return chunkenc.ValFloat
		}
	}
	return chunkenc.ValNone
}

func (a *avgIterator) Next() chunkenc.ValueType {
	if a.err != nil {
		return chunkenc.ValNone
	}
	return a.align(a.sum.Next(), a.count.Next())
}

func (a *avgIterator) Seek(t int64) chunkenc.ValueType {
	if a.err != nil {
		return chunkenc.ValNone
	}
	return a.align(a.sum.Seek(t), a.count.Seek(t))
}
func (a *avgIterator) At() (int64, float64) { return a.t, a.v }
func (a *avgIterator) AtT() int64           { return a.t }
func (a *avgIterator) Err() error {
	if a.err != nil {
		return a.err
	}
	if err := a.sum.Err(); err != nil {
		return err
	}
	return a.count.Err()
}

type rawQuerier struct{ storage.Querier }

func (q rawQuerier) Select(ctx context.Context, sortSeries bool, hints *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
	ms, view, ok, err := explicitView(ms)
	if err != nil {
		return storage.ErrSeriesSet(err)
	}
	ss := q.Querier.Select(ctx, sortSeries, hints, ms...)
	if !ok || view != ViewCount {
		return ss
	}
	return onesSet{ss}
}

type onesSet struct{ storage.SeriesSet }

func (o onesSet) At() storage.Series {
	s := o.SeriesSet.At()
	return onesSeries{s.Labels(), s}
}

// Blocks is what NewQuerier reads: downsampled blocks of one resolution.
type Blocks struct {
	// Parts are the blocks, each read over its own range, in time order
	// (ordered by Lo). They are read merged (concatenated where they are
	// disjoint), so that a range function sees a series' samples across
	// the blocks' edges.
	Parts      []Part
	Resolution int64
	// Plain selectors see each window's value repeated until the next
	// window (fill.go), from From to To (the caller reads one window before
	// and one after, which fill the start and the end).
	From, To int64
	// Approximate, when set, is why the windows do not fit the ranges of
	// the selects (GridReason): every answer read here then carries an info
	// annotation saying it is approximate. Otherwise only the answers that
	// exactRead finds approximate do.
	Approximate string
	// Hints are the hints of the select the caller reads these blocks
	// for, before it narrowed them to the blocks' range (nil: each select's
	// own): rate, increase and delta need its evaluation times (densify.go).
	Hints *storage.SelectHints
	// Elsewhere is raw time whose samples the caller reads from other
	// blocks beside these (finer ones these do not hold): a range over it
	// has samples this view does not see.
	Elsewhere []Span
	// AtSteps says that the selects are evaluated at their hints' steps
	// only (readopts.ReadOptions.AtSteps): rate, increase and delta then
	// know every evaluation time, not only a single one.
	AtSteps bool
}

// Span is an inclusive range of time (raw time where it is said).
type Span struct{ Lo, Hi int64 }

// Part is one block of Blocks.
type Part struct {
	// Querier reads the block over [Lo, Hi].
	Querier storage.Querier
	// Pairs reads it over [Lo, Hi + Resolution - 1] (or less where the
	// block ends) for the pairs series, whose points a range ending
	// between a pair's two samples must still read (pairs.go). Nil:
	// Querier, when Hi is where the block ends.
	Pairs  storage.Querier
	Lo, Hi int64
	// KeptCounts says the block records how many raw samples its counters'
	// kept samples stand for (block.Downsample.KeptCounts).
	KeptCounts bool
}

// NewQuerier reads downsampled blocks of one resolution as series without
// AggrLabel, each through the view its selector asks for (an explicit
// AggrLabel matcher, else ViewFor(hints)). Pairs are cut where the parts
// begin and end (the least Lo, the greatest Hi); between parts they are
// not, which is right where the parts meet on a window's edge (blocks begin
// and end on the 2 h grid).
func NewQuerier(b Blocks) storage.Querier {
	q := &querier{res: b.Resolution, from: b.From, to: b.To, approx: b.Approximate, hints: b.Hints, keptCounts: true, atSteps: b.AtSteps}
	if len(b.Parts) == 0 {
		q.Querier, q.lo, q.hi = storage.NoopQuerier(), b.From, b.To
		return q
	}
	q.lo, q.hi = b.Parts[0].Lo, b.Parts[0].Hi
	var qs, pairs []storage.Querier
	wide := false
	for _, p := range b.Parts {
		qs = append(qs, seriesset.SpanQuerier(p.Querier, p.Lo, p.Hi))
		pq, hi := storage.Querier(unclosed{p.Querier}), p.Hi
		if p.Pairs != nil {
			pq, hi, wide = p.Pairs, p.Hi+max(b.Resolution-1, 0), true
		}
		pairs = append(pairs, seriesset.SpanQuerier(pq, p.Lo, hi))
		q.keptCounts = q.keptCounts && p.KeptCounts
		q.lo, q.hi = min(q.lo, p.Lo), max(q.hi, p.Hi)
		if n := len(q.seen); n > 0 && q.seen[n-1].Hi+1 >= p.Lo+1 {
			q.seen[n-1].Hi = max(q.seen[n-1].Hi, p.Hi+1)
		} else {
			q.seen = append(q.seen, Span{p.Lo + 1, p.Hi + 1}) // raw time: stored + 1 ms
		}
	}
	for _, e := range b.Elsewhere {
		q.seen = cut(q.seen, Span{e.Lo, e.Hi})
	}
	q.Querier = seriesset.NewMergeQuerier(qs, seriesset.MergeSpans)
	if wide {
		q.pairs = seriesset.NewMergeQuerier(pairs, seriesset.MergeSpans)
	}
	return q
}

// unclosed is a querier read twice (for pairs and the rest), closed once.
type unclosed struct{ storage.Querier }

func (unclosed) Close() error { return nil }

// NewRawQuerier lets raw data (q) answer the explicit views that Rewrite
// puts into queries, so one rewritten query reads raw and downsampled
// sources alike: count reads every sample as 1, every other view reads the
// samples as they are. Selects without an AggrLabel matcher pass through.
func NewRawQuerier(q storage.Querier) storage.Querier { return rawQuerier{q} }
