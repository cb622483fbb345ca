package query

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/util/annotations"
	"github.com/prometheus/prometheus/util/stats"
)

// defaultMinStepsPerSlice: a 1 h panel at a 15 s step (241 steps) runs as
// two slices, at a 1 m step (61 steps) whole; sliced in two, the latter was
// no faster (p50 790 against 767 µs on a bench-compare week).
const defaultMinStepsPerSlice = 60

// slicingEngine is the API's PromQL engine. A range query long enough to be
// worth it runs as consecutive slices of its steps, each an ordinary range
// query of the same engine, in parallel on the cores no other query of
// this engine is using; their matrices are joined in memory. A PromQL range
// query evaluates each step on its own (a step's answer depends on its
// time, never on the query's start or end), so the joined answer is the
// whole query's, except where the expression names the query's range
// (@ start(), @ end(), range()): such queries run whole. A dashboard's
// panels load one at a time or a few at once, so on a lightly loaded
// receiver the heaviest panel otherwise uses one core of several.
//
// Everything else (instant queries, cost estimation, the engine's
// metrics) is the engine's own.
type slicingEngine struct {
	*promql.Engine
	maxSlices int // 0: GOMAXPROCS
	minSteps  int // fewest steps a slice may have
	cores     func() int
	// pushDown: the query path evaluates range functions (pushdown.go);
	// lookback is the engine's default lookback delta, which it needs.
	pushDown   bool
	lookback   time.Duration
	maxSamples int

	running atomic.Int64 // queries of this engine executing now

	sliced prometheus.Counter
	pieces prometheus.Counter
}

func newSlicingEngine(ng *promql.Engine, maxSlices, minSteps int, reg prometheus.Registerer) *slicingEngine {
	f := promauto.With(reg)
	return &slicingEngine{
		Engine: ng, maxSlices: maxSlices, minSteps: max(minSteps, 1),
		cores: func() int { return runtime.GOMAXPROCS(0) },
		sliced: f.NewCounter(prometheus.CounterOpts{
			Name: "gpustore_query_range_sliced_total",
			Help: "Range queries executed as slices of their steps in parallel (query.range-parallelism).",
		}),
		pieces: f.NewCounter(prometheus.CounterOpts{
			Name: "gpustore_query_range_slices_total",
			Help: "Slices those range queries ran as.",
		}),
	}
}

// NewInstantQuery counts the query among those running.
func (e *slicingEngine) NewInstantQuery(ctx context.Context, q storage.Queryable, opts promql.QueryOpts, qs string, ts time.Time) (promql.Query, error) {
	qs, pushed := e.pushdown(qs)
	qry, err := e.Engine.NewInstantQuery(ctx, e.pushdownOf(q, pushed, opts), opts, qs, ts)
	if err != nil {
		return nil, err
	}
	return &countedQuery{Query: qry, running: &e.running}, nil
}

// pushdown rewrites qs for the range functions the query path evaluates
// itself (pushdown.go).
func (e *slicingEngine) pushdown(qs string) (string, []pushedCall) {
	if !e.pushDown {
		return qs, nil
	}
	pd, ok := rewritePushdown(qs)
	if !ok {
		return qs, nil
	}
	return pd.qs, pd.calls
}

// pushdownOf is the queryable a query rewritten for calls reads: q itself
// without calls.
func (e *slicingEngine) pushdownOf(q storage.Queryable, calls []pushedCall, opts promql.QueryOpts) storage.Queryable {
	if len(calls) == 0 {
		return q
	}
	lookback := e.lookback
	if opts != nil && opts.LookbackDelta() > 0 {
		lookback = opts.LookbackDelta()
	}
	return pushdownQueryable{Queryable: q, calls: calls, lookback: lookback.Milliseconds(), maxSamples: e.maxSamples}
}

// NewRangeQuery builds the whole query (which validates it) and, when it
// may be sliced, defers the choice to Exec, when the load is known.
func (e *slicingEngine) NewRangeQuery(ctx context.Context, q storage.Queryable, opts promql.QueryOpts, qs string, start, end time.Time, step time.Duration) (promql.Query, error) {
	qs, pushed := e.pushdown(qs)
	q = e.pushdownOf(q, pushed, opts)
	whole, err := e.Engine.NewRangeQuery(ctx, q, opts, qs, start, end, step)
	if err != nil {
		return nil, err
	}
	steps := 1
	if step > 0 {
		steps += int(end.Sub(start) / step)
	}
	stmt, ok := whole.Statement().(*parser.EvalStmt)
	if e.maxSlices == 1 || steps < 2*e.minSteps || (opts != nil && opts.EnablePerStepStats()) || !ok || readsQueryRange(stmt.Expr) {
		return &countedQuery{Query: whole, running: &e.running}, nil
	}
	return &slicedQuery{e: e, whole: whole, queryable: q, opts: opts, qs: qs, start: start, step: step, steps: steps}, nil
}

// slicesFor is how many slices a query of the given steps runs as while
// others other queries (or slices) are running: one per idle core, each of
// at least minSteps steps, at most maxSlices.
func (e *slicingEngine) slicesFor(steps int, others int64) int {
	cores := e.cores()
	n := e.maxSlices
	if n <= 0 {
		n = cores
	}
	return max(1, min(n, cores-int(others), steps/e.minSteps))
}

// readsQueryRange reports whether expr names the query's start, end or
// range, whose values a slice would change.
func readsQueryRange(expr parser.Expr) bool {
	found := false
	names := func(d *parser.DurationExpr) {
		if d != nil && !found {
			found = durationReadsRange(d)
		}
	}
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.VectorSelector:
			found = found || n.StartOrEnd != 0
			names(n.OriginalOffsetExpr)
		case *parser.MatrixSelector:
			names(n.RangeExpr)
		case *parser.SubqueryExpr:
			found = found || n.StartOrEnd != 0
			names(n.RangeExpr)
			names(n.StepExpr)
			names(n.OriginalOffsetExpr)
		case *parser.DurationExpr:
			names(n)
		}
		if found {
			return errors.New("found") // stops the walk
		}
		return nil
	})
	return found
}

func durationReadsRange(d *parser.DurationExpr) bool {
	if d.Op == parser.RANGE {
		return true
	}
	for _, c := range []parser.Expr{d.LHS, d.RHS} {
		if sub, ok := c.(*parser.DurationExpr); ok && durationReadsRange(sub) {
			return true
		}
	}
	return false
}

// countedQuery is a query of the engine counted while it executes, so
// that a range query knows how many cores are left to it.
type countedQuery struct {
	promql.Query
	running *atomic.Int64
}

func (q *countedQuery) Exec(ctx context.Context) *promql.Result {
	q.running.Add(1)
	defer q.running.Add(-1)
	return q.Query.Exec(ctx)
}

// slicedQuery is a range query that may run as slices of its steps.
type slicedQuery struct {
	e         *slicingEngine
	whole     promql.Query
	queryable storage.Queryable
	opts      promql.QueryOpts
	qs        string
	start     time.Time
	step      time.Duration
	steps     int

	mu     sync.Mutex
	cancel context.CancelFunc
	parts  []promql.Query // the slices' queries, closed with this one
	stats  *stats.Statistics
}

func (q *slicedQuery) Exec(ctx context.Context) *promql.Result {
	others := q.e.running.Add(1) - 1
	defer q.e.running.Add(-1)
	n := q.e.slicesFor(q.steps, others)
	if n < 2 {
		return q.whole.Exec(ctx)
	}
	// The slices count as running queries: a query starting meanwhile
	// finds their cores taken.
	q.e.running.Add(int64(n - 1))
	defer q.e.running.Add(-int64(n - 1))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	timer := stats.NewQueryTimers()
	total := timer.GetTimer(stats.ExecTotalTime).Start()

	parts := make([]promql.Query, n)
	pieces := make([]Slice, n) // in each slice's context, see SliceOf
	shared := newSharedReads()
	end := q.start.Add(time.Duration(q.steps-1) * q.step).UnixMilli()
	for i := range n {
		first, last := i*q.steps/n, (i+1)*q.steps/n-1
		from := q.start.Add(time.Duration(first) * q.step)
		to := q.start.Add(time.Duration(last) * q.step)
		pieces[i] = Slice{From: from.UnixMilli(), To: to.UnixMilli(), Start: q.start.UnixMilli(), End: end, shared: shared}
		p, err := q.e.Engine.NewRangeQuery(ctx, q.queryable, q.opts, q.qs, from, to, q.step)
		if err != nil { // the whole query was built from the same string
			for _, b := range parts[:i] {
				b.Close()
			}
			return &promql.Result{Err: err}
		}
		parts[i] = p
	}
	q.mu.Lock()
	q.parts, q.cancel = parts, cancel
	q.mu.Unlock()
	q.e.sliced.Inc()
	q.e.pieces.Add(float64(n))

	results := make([]*promql.Result, n)
	var (
		wg     sync.WaitGroup
		failed atomic.Int64 // the first slice to fail, whose error is the query's
	)
	failed.Store(-1)
	for i, p := range parts {
		wg.Go(func() {
			results[i] = p.Exec(withSlice(ctx, pieces[i]))
			if results[i].Err != nil && failed.CompareAndSwap(-1, int64(i)) {
				cancel() // the answer is an error: the other slices are not needed
			}
		})
	}
	wg.Wait()
	total.Stop()
	q.mu.Lock()
	q.stats = joinStats(timer, parts)
	q.mu.Unlock()
	var warnings annotations.Annotations
	for _, r := range results {
		warnings.Merge(r.Warnings)
	}
	if i := failed.Load(); i >= 0 { // not the others' cancellation by it
		return &promql.Result{Err: results[i].Err, Warnings: warnings}
	}
	mats := make([]promql.Matrix, n)
	for i, r := range results {
		m, err := r.Matrix()
		if err != nil {
			return &promql.Result{Err: err, Warnings: warnings}
		}
		mats[i] = m
	}
	return &promql.Result{Value: joinMatrices(mats), Warnings: warnings}
}

// joinMatrices joins matrices of consecutive step ranges, each sorted by
// labels as the engine returns them, into one sorted matrix: a series in
// several is one series with their points in order. Points are copied
// where series join, so no slice shares another query's pooled points.
func joinMatrices(mats []promql.Matrix) promql.Matrix {
	n := 0
	for _, m := range mats {
		n += len(m)
	}
	all := make(promql.Matrix, 0, n)
	for _, m := range mats {
		all = append(all, m...)
	}
	// Stable: a series' pieces stay in step order.
	slices.SortStableFunc(all, func(a, b promql.Series) int { return labels.Compare(a.Metric, b.Metric) })
	out := all[:0]
	for i := 0; i < len(all); {
		j := i + 1
		for j < len(all) && labels.Equal(all[j].Metric, all[i].Metric) {
			j++
		}
		s := all[i]
		if j > i+1 {
			var nf, nh int
			for _, p := range all[i:j] {
				nf += len(p.Floats)
				nh += len(p.Histograms)
			}
			floats, hists := make([]promql.FPoint, 0, nf), make([]promql.HPoint, 0, nh)
			for _, p := range all[i:j] {
				floats = append(floats, p.Floats...)
				hists = append(hists, p.Histograms...)
			}
			s.Floats, s.Histograms = nil, nil
			if nf > 0 {
				s.Floats = floats
			}
			if nh > 0 {
				s.Histograms = hists
			}
		}
		out = append(out, s)
		i = j
	}
	return out
}

// joinStats sums the slices' samples; the timers are the sliced query's
// own (wall time).
func joinStats(timers *stats.QueryTimers, parts []promql.Query) *stats.Statistics {
	samples := stats.NewQuerySamples(false)
	for _, p := range parts {
		s := p.Stats()
		if s == nil || s.Samples == nil {
			continue
		}
		samples.TotalSamples += s.Samples.TotalSamples
		samples.SamplesRead += s.Samples.SamplesRead
		samples.TotalSeries += s.Samples.TotalSeries
		samples.PeakSamples = max(samples.PeakSamples, s.Samples.PeakSamples)
	}
	return &stats.Statistics{Timers: timers, Samples: samples}
}

func (q *slicedQuery) Stats() *stats.Statistics {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.stats != nil {
		return q.stats
	}
	return q.whole.Stats()
}

func (q *slicedQuery) Cancel() {
	q.whole.Cancel()
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.cancel != nil {
		q.cancel()
	}
}

// Close returns the points of the whole query and of every slice to the
// engine's pools: only once the joined answer has been encoded.
func (q *slicedQuery) Close() {
	q.whole.Close()
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, p := range q.parts {
		p.Close()
	}
	q.parts = nil
}

func (q *slicedQuery) Statement() parser.Statement { return q.whole.Statement() }
func (q *slicedQuery) String() string              { return q.whole.String() }
