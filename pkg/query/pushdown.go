package query

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/value"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/promql/parser/posrange"
	"github.com/prometheus/prometheus/schema"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/util/annotations"

	"github.com/gpustore/gpustore/pkg/seriesset"
)

// Range functions are where a dashboard's time goes: `rate(x[5m])` at
// every step of a day for every GPU's series. Prometheus' engine evaluates
// them one series and one step at a time, copying each step's window of
// samples out of the series' iterator into a buffer before it calls the
// function: hundreds of nanoseconds a step, more than reading the samples
// costs. Here the query path evaluates such calls itself, where the
// samples already lie decoded in arrays (seriesset.Decoded): each step's
// window is a sub-slice of the series' points, handed to Prometheus' own
// implementation of the function (promql.FunctionCalls), so the values are
// the engine's to the bit.
//
// The engine is told by rewriting the query: each call it can take over
// (pushable) becomes a selector of one reserved label, written with as
// many characters as the call had, so that the positions in the engine's
// own annotations stay those of the query as sent. The engine then reads
// the call's results as a plain series at each step (a result exactly at
// the step; after a step with a result and before one without, a staleness
// marker, so that the engine's lookback does not carry a result to the
// next step) and does the rest (aggregations, binary operators) itself.

// pushdownLabel names the calls a rewritten query's selectors stand for.
const pushdownLabel = "__p__"

// pushableFuncs are the range functions taken over: one range-vector
// argument, no other, and nothing the engine does around the call but drop
// the metric name (and for rate and increase, note a name that does not
// look like a counter's).
var pushableFuncs = map[string]bool{
	"rate": true, "increase": true, "irate": true, "delta": true, "idelta": true, "deriv": true,
	"resets": true, "changes": true,
	"avg_over_time": true, "min_over_time": true, "max_over_time": true, "sum_over_time": true,
	"count_over_time": true, "last_over_time": true, "present_over_time": true,
	"stddev_over_time": true, "stdvar_over_time": true,
}

// pushedCall is a call a rewritten query's selector stands for.
type pushedCall struct {
	fn       promql.FunctionCall
	name     string
	args     parser.Expressions // the call's own, for the function and its annotations
	matchers []*labels.Matcher
	rng      int64 // the range, ms
	offset   int64 // the selector's offset, ms
	keepName bool
}

// pushdown is a query rewritten for the calls it stands for.
type pushdown struct {
	qs    string
	calls []pushedCall
}

// rewritePushdown rewrites qs for the pushable calls it holds; ok is false
// when there are none (or qs does not parse: the engine will say why).
func rewritePushdown(qs string) (pushdown, bool) {
	expr, err := parser.NewParser(parser.Options{}).ParseExpr(qs)
	if err != nil {
		return pushdown{}, false
	}
	var (
		calls []pushedCall
		spans []posSpan
	)
	parser.Inspect(expr, func(node parser.Node, path []parser.Node) error {
		if inSubquery(path) {
			return nil
		}
		c, pr, ok := pushable(node, path)
		if !ok {
			return nil
		}
		repl := fmt.Sprintf(`{%s="%d"}`, pushdownLabel, len(calls))
		if int(pr.End-pr.Start) < len(repl) {
			return nil
		}
		calls = append(calls, c)
		spans = append(spans, posSpan{int(pr.Start), int(pr.End), repl})
		return nil
	})
	if len(calls) == 0 {
		return pushdown{}, false
	}
	var sb strings.Builder
	at := 0
	for _, s := range spans { // in the order of the text: Inspect walks it so
		sb.WriteString(qs[at:s.from])
		sb.WriteString(s.repl)
		sb.WriteString(strings.Repeat(" ", s.to-s.from-len(s.repl)))
		at = s.to
	}
	sb.WriteString(qs[at:])
	return pushdown{qs: sb.String(), calls: calls}, true
}

// pushable returns the call node stands for, if the query path can
// evaluate it: a pushable range function of one plain selector, or a plain
// selector read as an instant vector (each step's latest sample within the
// lookback: cheap here, where the samples lie in arrays, and the engine
// then steps through one sample a step instead of every sample).
func pushable(node parser.Node, path []parser.Node) (pushedCall, posrange.PositionRange, bool) {
	plain := func(vs *parser.VectorSelector) bool {
		return vs.Timestamp == nil && vs.StartOrEnd == 0 && !vs.Anchored && !vs.Smoothed && vs.OriginalOffsetExpr == nil
	}
	switch n := node.(type) {
	case *parser.Call:
		if !pushableFuncs[n.Func.Name] || len(n.Args) != 1 {
			return pushedCall{}, posrange.PositionRange{}, false
		}
		ms, ok := n.Args[0].(*parser.MatrixSelector)
		if !ok || ms.RangeExpr != nil {
			return pushedCall{}, posrange.PositionRange{}, false
		}
		vs, ok := ms.VectorSelector.(*parser.VectorSelector)
		if !ok || !plain(vs) || !namesOneMetric(vs.LabelMatchers) {
			return pushedCall{}, posrange.PositionRange{}, false
		}
		// As the engine prepares a selector without @ (its functions read
		// Offset).
		vs.Offset = vs.OriginalOffset
		return pushedCall{
			fn: promql.FunctionCalls[n.Func.Name], name: n.Func.Name, args: n.Args,
			matchers: vs.LabelMatchers, rng: ms.Range.Milliseconds(), offset: vs.OriginalOffset.Milliseconds(),
			keepName: n.Func.Name == "last_over_time",
		}, n.PositionRange(), true
	case *parser.VectorSelector:
		parent := parser.Node(nil)
		for i := len(path) - 1; i >= 0 && parent == nil; i-- {
			if _, paren := path[i].(*parser.ParenExpr); !paren { // the engine looks through them
				parent = path[i]
			}
		}
		if !plain(n) || readsSelector(parent) {
			return pushedCall{}, posrange.PositionRange{}, false
		}
		return pushedCall{name: "instant vector selector", matchers: n.LabelMatchers,
			offset: n.OriginalOffset.Milliseconds(), keepName: true}, n.PositionRange(), true
	}
	return pushedCall{}, posrange.PositionRange{}, false
}

// readsSelector: a selector under parent is read for more than each step's
// latest value: as a range, for its samples' own timestamps, or for its
// matchers (absent builds its labels from them).
func readsSelector(parent parser.Node) bool {
	switch p := parent.(type) {
	case *parser.MatrixSelector:
		return true
	case *parser.Call:
		return p.Func.Name == "timestamp" || p.Func.Name == "info" || p.Func.Name == "absent"
	}
	return false
}

type posSpan struct {
	from, to int
	repl     string
}

func inSubquery(path []parser.Node) bool {
	for _, n := range path {
		if _, ok := n.(*parser.SubqueryExpr); ok {
			return true
		}
	}
	return false
}

// namesOneMetric: the selector's series all have one name, so that the
// results, which lose it, never collide (the engine would refuse them).
func namesOneMetric(ms []*labels.Matcher) bool {
	for _, m := range ms {
		if m.Name == model.MetricNameLabel && m.Type == labels.MatchEqual {
			return true
		}
	}
	return false
}

// pushdownQueryable is the queryable a rewritten query reads: a select of
// a call's reserved label is the call, evaluated over its own select of
// the queryable underneath (through a querier of the call's own range:
// the engine sizes the queriers it opens by the rewritten query, whose
// plain selectors reach back a lookback, not a range and an offset).
type pushdownQueryable struct {
	storage.Queryable
	calls    []pushedCall
	lookback int64 // the query's lookback delta, ms
	// maxSamples is the engine's bound on the samples a query holds
	// (query.max_samples), which a call's windows and results count
	// against as they would in the engine.
	maxSamples int
}

func (p pushdownQueryable) Querier(mint, maxt int64) (storage.Querier, error) {
	q, err := p.Queryable.Querier(mint, maxt)
	if err != nil {
		return nil, err
	}
	return &pushdownQuerier{Querier: q, p: p}, nil
}

type pushdownQuerier struct {
	storage.Querier
	p pushdownQueryable

	mtx    sync.Mutex // the engine may select from several goroutines
	opened []storage.Querier
}

func (q *pushdownQuerier) Select(ctx context.Context, sortSeries bool, hints *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
	call, ok, err := q.pushed(ms)
	if err != nil {
		return storage.ErrSeriesSet(err)
	}
	if !ok {
		return q.Querier.Select(ctx, sortSeries, hints, ms...)
	}
	return evalPushed(ctx, call, hints, q.p.lookback, q.p.maxSamples, func(h *storage.SelectHints) storage.SeriesSet {
		inner, err := q.p.Queryable.Querier(h.Start, h.End)
		if err != nil {
			return storage.ErrSeriesSet(err)
		}
		q.mtx.Lock()
		q.opened = append(q.opened, inner)
		q.mtx.Unlock()
		return inner.Select(ctx, true, h, call.matchers...)
	})
}

// pushed returns the call ms stand for, if they stand for one.
func (q *pushdownQuerier) pushed(ms []*labels.Matcher) (pushedCall, bool, error) {
	for _, m := range ms {
		if m.Name != pushdownLabel {
			continue
		}
		i, err := strconv.Atoi(m.Value)
		if err != nil || i < 0 || i >= len(q.p.calls) || len(ms) != 1 || m.Type != labels.MatchEqual {
			return pushedCall{}, false, fmt.Errorf("selector {%s} stands for no range function of this query", m)
		}
		return q.p.calls[i], true, nil
	}
	return pushedCall{}, false, nil
}

func (q *pushdownQuerier) Close() error {
	q.mtx.Lock()
	defer q.mtx.Unlock()
	errs := []error{q.Querier.Close()}
	for _, o := range q.opened {
		errs = append(errs, o.Close())
	}
	q.opened = nil
	return errors.Join(errs...)
}

// evalPushed evaluates call at the steps of the select hinted by h: it
// selects the call's own series with the hints the engine would have given
// the call's selector, and returns a series per input series with a
// result.
func evalPushed(ctx context.Context, call pushedCall, h *storage.SelectHints, lookback int64, maxSamples int, sel func(*storage.SelectHints) storage.SeriesSet) storage.SeriesSet {
	if h == nil {
		return storage.ErrSeriesSet(fmt.Errorf("range function %s pushed down without its query's steps", call.name))
	}
	// The rewritten selector is plain: its hints start a lookback (less a
	// millisecond) before the first step.
	first, last, step := h.Start+lookback-1, h.End, h.Step
	hints := &storage.SelectHints{
		Start: first - (call.rng - 1) - call.offset, End: last - call.offset,
		Step: step, Range: call.rng, Func: call.name,
	}
	if call.fn == nil { // a selector reaches back a lookback
		hints.Start, hints.Func = first-(lookback-1)-call.offset, ""
	}
	ss := sel(hints)
	e := &pushEval{call: call, first: first, last: last, step: step, lookback: lookback, maxSamples: maxSamples}
	var out []storage.Series
	for ss.Next() {
		if err := ctx.Err(); err != nil {
			return storage.ErrSeriesSet(err)
		}
		s, err := e.series(ss.At())
		if err != nil {
			return storage.ErrSeriesSet(err)
		}
		if s != nil {
			out = append(out, s)
		}
	}
	if err := ss.Err(); err != nil {
		return storage.ErrSeriesSet(err)
	}
	ws := ss.Warnings()
	ws.Merge(e.annos)
	return &listSet{series: out, i: -1, ws: ws}
}

// pushEval evaluates one call over the series of its select.
type pushEval struct {
	call              pushedCall
	first, last, step int64
	lookback          int64
	maxSamples, held  int // held: the results so far, as the engine counts them
	fs                []promql.FPoint
	hs                []promql.HPoint
	ts                []int64
	vs                []float64
	it                chunkenc.Iterator
	annos             annotations.Annotations
	enh               promql.EvalNodeHelper
	in                promql.Matrix
	vectorVals        []promql.Vector
}

// series evaluates the call over s at every step; nil when it has no result.
func (e *pushEval) series(s storage.Series) (storage.Series, error) {
	if e.call.fn == nil {
		return e.selected(s)
	}
	if err := e.points(s, false); err != nil {
		return nil, err
	}
	lset := s.Labels()
	out := promql.Series{Metric: lset}
	if !e.call.keepName {
		out.Metric = lset.DropReserved(schema.IsMetadataLabel)
	}
	if e.in == nil {
		e.in = make(promql.Matrix, 1)
	}
	e.in[0].Metric = lset
	e.enh.LookbackDelta = time.Duration(e.lookback) * time.Millisecond
	var lo, hi, hlo, hhi int // the window: fs[lo:hi], hs[hlo:hhi]
	results, floats := 0, 0
	for ts, prev := e.first, false; ts <= e.last; ts += max(e.step, 1) {
		maxt := ts - e.call.offset
		mint := maxt - e.call.rng
		for hi < len(e.fs) && e.fs[hi].T <= maxt {
			hi++
		}
		for lo < hi && e.fs[lo].T <= mint {
			lo++
		}
		for hhi < len(e.hs) && e.hs[hhi].T <= maxt {
			hhi++
		}
		for hlo < hhi && e.hs[hlo].T <= mint {
			hlo++
		}
		got := false
		if e.maxSamples > 0 && e.held+len(out.Floats)+len(out.Histograms)+(hi-lo)+(hhi-hlo) > e.maxSamples {
			return nil, promql.ErrTooManySamples("query execution")
		}
		if hi > lo || hhi > hlo {
			e.in[0].Floats, e.in[0].Histograms = e.fs[lo:hi:hi], e.hs[hlo:hhi:hhi]
			e.enh.Ts, e.enh.Out = ts, e.enh.Out[:0]
			vec, annos := e.call.fn(e.vectorVals, e.in, e.call.args, &e.enh)
			e.annos.Merge(annos)
			if len(vec) > 0 {
				got = true
				if vec[0].H == nil {
					floats++
					out.Floats = append(out.Floats, promql.FPoint{T: ts, F: vec[0].F})
				} else {
					out.Histograms = append(out.Histograms, promql.HPoint{T: ts, H: vec[0].H.Copy()})
				}
				results++
			}
			e.enh.Out = vec[:0]
		}
		if !got && prev && e.step > 0 && e.step < e.lookback {
			// Nothing here, a result at the step before: without a marker
			// the engine would carry it on.
			out.Floats = append(out.Floats, promql.FPoint{T: ts, F: math.Float64frombits(value.StaleNaN)})
		}
		prev = got
		if e.step == 0 {
			break
		}
	}
	if results == 0 {
		return nil, nil
	}
	e.held += len(out.Floats) + len(out.Histograms)
	if floats > 0 { // as the engine: its note is on float results
		e.noteCounterName(lset)
	}
	return promql.NewStorageSeries(out), nil
}

// noteCounterName: the engine's note on rate and increase of a metric whose
// name does not end as a counter's does.
func (e *pushEval) noteCounterName(lset labels.Labels) {
	if e.call.name != "rate" && e.call.name != "increase" {
		return
	}
	name := lset.Get(model.MetricNameLabel)
	if name == "" || strings.HasSuffix(name, "_total") || strings.HasSuffix(name, "_sum") ||
		strings.HasSuffix(name, "_count") || strings.HasSuffix(name, "_bucket") {
		return
	}
	e.annos.Add(annotations.NewPossibleNonCounterInfo(name, e.call.args[0].PositionRange()))
}

// selected reads s as an instant vector selector at every step: the
// latest sample at or before the step (less the offset), if it is newer
// than the lookback and not a staleness marker, as the engine selects.
func (e *pushEval) selected(s storage.Series) (storage.Series, error) {
	if err := e.points(s, true); err != nil {
		return nil, err
	}
	out := promql.Series{Metric: s.Labels()}
	fi, hi := 0, 0 // the samples at or before the step: fs[:fi], hs[:hi]
	prev := false
	for ts := e.first; ts <= e.last; ts += max(e.step, 1) {
		ref := ts - e.call.offset
		for fi < len(e.fs) && e.fs[fi].T <= ref {
			fi++
		}
		for hi < len(e.hs) && e.hs[hi].T <= ref {
			hi++
		}
		got := false
		switch {
		case fi > 0 && (hi == 0 || e.fs[fi-1].T > e.hs[hi-1].T):
			if p := e.fs[fi-1]; p.T > ref-e.lookback && !value.IsStaleNaN(p.F) {
				out.Floats, got = append(out.Floats, promql.FPoint{T: ts, F: p.F}), true
			}
		case hi > 0:
			if p := e.hs[hi-1]; p.T > ref-e.lookback && !value.IsStaleNaN(p.H.Sum) {
				out.Histograms, got = append(out.Histograms, promql.HPoint{T: ts, H: p.H.Copy()}), true
			}
		}
		if !got && prev && e.step > 0 && e.step < e.lookback {
			out.Floats = append(out.Floats, promql.FPoint{T: ts, F: math.Float64frombits(value.StaleNaN)})
		}
		prev = got
		if e.maxSamples > 0 && e.held+len(out.Floats)+len(out.Histograms) > e.maxSamples {
			return nil, promql.ErrTooManySamples("query execution")
		}
		if e.step == 0 {
			break
		}
	}
	if len(out.Floats) == 0 && len(out.Histograms) == 0 {
		return nil, nil
	}
	e.held += len(out.Floats) + len(out.Histograms)
	return promql.NewStorageSeries(out), nil
}

// points reads s into e.fs and e.hs, without staleness markers (the
// engine leaves them out of a window) unless stale.
func (e *pushEval) points(s storage.Series, stale bool) error {
	e.fs, e.hs = e.fs[:0], e.hs[:0]
	var ok bool
	var err error
	e.ts, e.vs, ok, err = seriesset.AppendFloats(s, e.ts[:0], e.vs[:0], math.MinInt64, math.MaxInt64)
	if err != nil {
		return err
	}
	if ok {
		for i, t := range e.ts {
			if stale || !value.IsStaleNaN(e.vs[i]) {
				e.fs = append(e.fs, promql.FPoint{T: t, F: e.vs[i]})
			}
		}
		return nil
	}
	e.it = s.Iterator(e.it)
	for vt := e.it.Next(); vt != chunkenc.ValNone; vt = e.it.Next() {
		switch vt {
		case chunkenc.ValFloat:
			t, f := e.it.At()
			if stale || !value.IsStaleNaN(f) {
				e.fs = append(e.fs, promql.FPoint{T: t, F: f})
			}
		case chunkenc.ValHistogram, chunkenc.ValFloatHistogram:
			t, h := e.it.AtFloatHistogram(&histogram.FloatHistogram{})
			if stale || !value.IsStaleNaN(h.Sum) {
				e.hs = append(e.hs, promql.HPoint{T: t, H: h})
			}
		}
	}
	return e.it.Err()
}

// listSet is a series set of series in memory.
type listSet struct {
	series []storage.Series
	i      int
	ws     annotations.Annotations
}

func (l *listSet) Next() bool                        { l.i++; return l.i < len(l.series) }
func (l *listSet) At() storage.Series                { return l.series[l.i] }
func (l *listSet) Err() error                        { return nil }
func (l *listSet) Warnings() annotations.Annotations { return l.ws }
