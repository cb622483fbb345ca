package query

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/value"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
)

// slicesDataStart is where slicesTestDB's samples begin (ms).
const slicesDataStart = int64(1_700_000_000_000)

// slicesTestDB holds six hours of counters with resets and gaps, gauges
// with NaN and staleness markers, classic and native histograms.
func slicesTestDB(t *testing.T) *tsdb.DB {
	t.Helper()
	opts := tsdb.DefaultOptions()
	db, err := tsdb.Open(t.TempDir(), nil, nil, opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	rng := rand.New(rand.NewPCG(7, 11))
	app := db.Appender(context.Background())
	add := func(ls labels.Labels, ts int64, v float64) {
		if _, err := app.Append(0, ls, ts, v); err != nil {
			t.Fatal(err)
		}
	}
	const span = 6 * 3600 * 1000
	for i := range 6 {
		job := fmt.Sprintf("job-%d", i%2)
		c := labels.FromStrings("__name__", "c_total", "i", fmt.Sprint(i), "job", job)
		g := labels.FromStrings("__name__", "g", "i", fmt.Sprint(i), "job", job)
		nh := labels.FromStrings("__name__", "nh", "i", fmt.Sprint(i), "job", job)
		var cv float64
		born, died := int64(rng.IntN(span/2)), int64(span/2+rng.IntN(span/2)) // series come and go
		if i < 2 {
			born, died = 0, span
		}
		for ts := born; ts < died; ts += 15_000 + int64(rng.IntN(2000)) - 1000 {
			at := slicesDataStart + ts
			if rng.IntN(50) == 0 { // a gap
				ts += int64(rng.IntN(20)) * 60_000
				continue
			}
			cv += float64(rng.IntN(100))
			if rng.IntN(200) == 0 {
				cv = float64(rng.IntN(10)) // a counter reset
			}
			add(c, at, cv)
			gv := 50 + 40*math.Sin(float64(ts)/1e6) + rng.Float64()*10
			switch rng.IntN(300) {
			case 0:
				gv = math.NaN()
			case 1:
				gv = math.Float64frombits(value.StaleNaN)
			}
			add(g, at, gv)
			for b, le := range []string{"0.1", "0.5", "1", "+Inf"} {
				add(labels.FromStrings("__name__", "h_bucket", "le", le, "i", fmt.Sprint(i), "job", job), at, cv*float64(b+1)/4)
			}
			h := &histogram.Histogram{
				Count: uint64(cv) + 3, ZeroCount: 1, Sum: cv * 1.5, Schema: 0,
				PositiveSpans:   []histogram.Span{{Offset: 0, Length: 2}},
				PositiveBuckets: []int64{int64(cv) / 2, 0},
			}
			h.Count = h.ZeroCount + 2*uint64(h.PositiveBuckets[0])
			if _, err := app.AppendHistogram(0, nh, at, h, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := app.Commit(); err != nil {
		t.Fatal(err)
	}
	return db
}

var slicedQueries = []string{
	`g`,
	`g offset 17m`,
	`g @ 1700003600`,
	`rate(c_total[5m])`,
	`sum by (job) (rate(c_total[5m]))`,
	`increase(c_total[10m])`,
	`irate(c_total[1m])`,
	`resets(c_total[30m])`,
	`deriv(g[10m])`,
	`predict_linear(g[15m], 600)`,
	`avg_over_time(g[7m])`,
	`max_over_time(g[5m]) - min_over_time(g[5m])`,
	`quantile_over_time(0.9, g[20m])`,
	`last_over_time(g[10m])`,
	`changes(g[10m])`,
	`histogram_quantile(0.9, sum by (le, job) (rate(h_bucket[5m])))`,
	`histogram_quantile(0.5, rate(nh[5m]))`,
	`sum by (job) (nh)`,
	`rate(nh[5m])`,
	`topk(2, g)`,
	`count_values("v", round(g / 10))`,
	`absent(nonexistent)`,
	`absent_over_time(g{i="3"}[3m])`,
	`time() - timestamp(g)`,
	`label_replace(g, "x", "$1", "i", "(.*)")`,
	`max_over_time(rate(c_total[2m])[20m:1m])`,
	`g > 50`,
	`sum(c_total) / count(g)`,
	`avg(g) by (job) * on (job) group_left sum by (job) (c_total)`,
	`scalar(sum(g)) + vector(1)`,
	`1 + 2`,
}

// TestSlicedRangeQueriesMatchWhole runs random range queries whole and as
// slices: the answers, their warnings and samples read are the same.
func TestSlicedRangeQueriesMatchWhole(t *testing.T) {
	db := slicesTestDB(t)
	ng := promql.NewEngine(promql.EngineOpts{
		MaxSamples: 50_000_000, Timeout: time.Minute, LookbackDelta: 5 * time.Minute,
		EnableAtModifier: true, EnableNegativeOffset: true,
		NoStepSubqueryIntervalFn: func(int64) int64 { return 60_000 },
	})
	reg := prometheus.NewRegistry()
	se := newSlicingEngine(ng, 0, 1, reg)
	se.cores = func() int { return 5 }
	rng := rand.New(rand.NewPCG(3, 5))
	steps := []time.Duration{15 * time.Second, 30 * time.Second, time.Minute, 97 * time.Second, 5 * time.Minute}
	ctx := context.Background()
	for round := range 300 {
		qs := slicedQueries[round%len(slicedQueries)]
		step := steps[rng.IntN(len(steps))]
		start := time.UnixMilli(slicesDataStart - 20*60_000 + rng.Int64N(6*3600_000))
		end := start.Add(time.Duration(rng.IntN(300)) * step)
		se.maxSlices = 2 + rng.IntN(4)

		want := ng.NewRangeQuery
		wq, err := want(ctx, db, nil, qs, start, end, step)
		if err != nil {
			t.Fatal(err)
		}
		gq, err := se.NewRangeQuery(ctx, db, nil, qs, start, end, step)
		if err != nil {
			t.Fatal(err)
		}
		before := testutil.ToFloat64(se.sliced)
		w, g := wq.Exec(ctx), gq.Exec(ctx)
		if w.Err != nil || g.Err != nil {
			t.Fatalf("%s: whole: %v, sliced: %v", qs, w.Err, g.Err)
		}
		if steps := int(end.Sub(start)/step) + 1; steps >= 2 && testutil.ToFloat64(se.sliced) != before+1 {
			t.Fatalf("%s over %d steps was not sliced", qs, steps)
		}
		label := fmt.Sprintf("%s from %s to %s step %s in %d slices", qs, start.UTC().Format(time.TimeOnly), end.UTC().Format(time.TimeOnly), step, se.maxSlices)
		if d := diffMatrices(w.Value.(promql.Matrix), g.Value.(promql.Matrix)); d != "" {
			t.Fatalf("%s: %s", label, d)
		}
		if ww, gw := slices.Sorted(mapsKeys(w.Warnings)), slices.Sorted(mapsKeys(g.Warnings)); !slices.Equal(ww, gw) {
			t.Fatalf("%s: warnings %q, sliced %q", label, ww, gw)
		}
		if ws, gs := wq.Stats().Samples.TotalSamples, gq.Stats().Samples.TotalSamples; ws != gs {
			t.Fatalf("%s: %d samples, sliced %d", label, ws, gs)
		}
		wq.Close()
		gq.Close()
	}
}

func mapsKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// diffMatrices describes the first difference between two matrices, NaN
// equal to NaN: "" when they are the same.
func diffMatrices(want, got promql.Matrix) string {
	if len(want) != len(got) {
		return fmt.Sprintf("%d series, sliced %d", len(want), len(got))
	}
	for i := range want {
		w, g := want[i], got[i]
		if !labels.Equal(w.Metric, g.Metric) {
			return fmt.Sprintf("series %d: %s, sliced %s", i, w.Metric, g.Metric)
		}
		if len(w.Floats) != len(g.Floats) || len(w.Histograms) != len(g.Histograms) {
			at := ""
			for j := range min(len(w.Floats), len(g.Floats)) {
				if w.Floats[j] != g.Floats[j] {
					at = fmt.Sprintf(" (first difference: %v, sliced %v)", w.Floats[j], g.Floats[j])
					break
				}
			}
			return fmt.Sprintf("%s: %d+%d points, sliced %d+%d%s", w.Metric, len(w.Floats), len(w.Histograms), len(g.Floats), len(g.Histograms), at)
		}
		for j := range w.Floats {
			if w.Floats[j].T != g.Floats[j].T || math.Float64bits(w.Floats[j].F) != math.Float64bits(g.Floats[j].F) {
				return fmt.Sprintf("%s: point %d %v, sliced %v", w.Metric, j, w.Floats[j], g.Floats[j])
			}
		}
		for j := range w.Histograms {
			if w.Histograms[j].T != g.Histograms[j].T || !w.Histograms[j].H.Equals(g.Histograms[j].H) {
				return fmt.Sprintf("%s: histogram %d %v, sliced %v", w.Metric, j, w.Histograms[j], g.Histograms[j])
			}
		}
	}
	return ""
}

// TestRangeQueriesNamingTheirRangeRunWhole: @ start(), @ end() and
// range() mean the query's own start, end and range, which a slice would
// change.
func TestRangeQueriesNamingTheirRangeRunWhole(t *testing.T) {
	db := slicesTestDB(t)
	ng := promql.NewEngine(promql.EngineOpts{MaxSamples: 50_000_000, Timeout: time.Minute, EnableAtModifier: true})
	se := newSlicingEngine(ng, 4, 1, prometheus.NewRegistry())
	se.cores = func() int { return 4 }
	start := time.UnixMilli(slicesDataStart + 3600_000)
	end := start.Add(2 * time.Hour)
	for _, qs := range []string{`g @ start()`, `rate(c_total[5m] @ end())`, `max_over_time(g[1h:1m] @ start())`, `sum(g) - sum(g @ end())`} {
		q, err := se.NewRangeQuery(context.Background(), db, nil, qs, start, end, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := q.(*slicedQuery); ok {
			t.Errorf("%s would be sliced", qs)
		}
		w, err := ng.NewRangeQuery(context.Background(), db, nil, qs, start, end, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if d := diffMatrices(w.Exec(context.Background()).Value.(promql.Matrix), q.Exec(context.Background()).Value.(promql.Matrix)); d != "" {
			t.Errorf("%s: %s", qs, d)
		}
	}
	for _, qs := range []string{`g`, `g @ 1700003600`, `rate(c_total[5m] offset 1h)`} {
		q, err := se.NewRangeQuery(context.Background(), db, nil, qs, start, end, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := q.(*slicedQuery); !ok {
			t.Errorf("%s would not be sliced", qs)
		}
	}
}

// TestSlicesOnlyOnIdleCores: a range query takes the cores other queries
// leave, and short queries run whole.
func TestSlicesOnlyOnIdleCores(t *testing.T) {
	se := newSlicingEngine(nil, 0, 60, prometheus.NewRegistry())
	se.cores = func() int { return 4 }
	for _, c := range []struct {
		steps  int
		others int64
		want   int
	}{
		{250, 0, 4}, {250, 1, 3}, {250, 3, 1}, {250, 9, 1}, {119, 0, 1}, {120, 0, 2}, {241, 0, 4},
	} {
		if got := se.slicesFor(c.steps, c.others); got != c.want {
			t.Errorf("%d steps, %d others: %d slices, want %d", c.steps, c.others, got, c.want)
		}
	}
	se.maxSlices = 2
	if got := se.slicesFor(250, 0); got != 2 {
		t.Errorf("query.range-parallelism 2: %d slices", got)
	}
}

// TestSlicedQueryFailsAsTheWholeWould: a slice's error (here the samples
// limit) is the query's, not a partial answer.
func TestSlicedQueryFailsAsTheWholeWould(t *testing.T) {
	db := slicesTestDB(t)
	ng := promql.NewEngine(promql.EngineOpts{MaxSamples: 100, Timeout: time.Minute})
	se := newSlicingEngine(ng, 3, 1, prometheus.NewRegistry())
	se.cores = func() int { return 3 }
	start := time.UnixMilli(slicesDataStart + 3600_000)
	q, err := se.NewRangeQuery(context.Background(), db, nil, `sum(rate(h_bucket[30m]))`, start, start.Add(time.Hour), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	res := q.Exec(context.Background())
	if res.Err == nil || !strings.Contains(res.Err.Error(), "too many samples") {
		t.Fatalf("sliced query over the samples limit: %v", res.Err)
	}
	q.Close()
}

// TestRangeDurationRunsWhole: range() in a duration expression is the
// query's range.
func TestRangeDurationRunsWhole(t *testing.T) {
	expr, err := parser.NewParser(parser.Options{}).ParseExpr(`max_over_time(g[5m])`)
	if err != nil {
		t.Fatal(err)
	}
	if readsQueryRange(expr) {
		t.Fatal("a plain range read as range()")
	}
	ms := expr.(*parser.Call).Args[0].(*parser.MatrixSelector)
	ms.RangeExpr = &parser.DurationExpr{Op: parser.ADD, LHS: &parser.NumberLiteral{Val: 60}, RHS: &parser.DurationExpr{Op: parser.RANGE}}
	if !readsQueryRange(expr) {
		t.Fatal("5m + range() not seen")
	}
}

// gatedQueryable holds every Select until gate is closed.
type gatedQueryable struct {
	storage.Queryable
	gate chan struct{}
}

func (g gatedQueryable) Querier(mint, maxt int64) (storage.Querier, error) {
	q, err := g.Queryable.Querier(mint, maxt)
	return gatedQuerier{q, g.gate}, err
}

type gatedQuerier struct {
	storage.Querier
	gate chan struct{}
}

func (g gatedQuerier) Select(ctx context.Context, sorted bool, h *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
	<-g.gate
	return g.Querier.Select(ctx, sorted, h, ms...)
}

// TestSlicesTakeTheirCores: while a query runs as slices, they count as
// running queries, so a query starting meanwhile runs whole.
func TestSlicesTakeTheirCores(t *testing.T) {
	db := slicesTestDB(t)
	ng := promql.NewEngine(promql.EngineOpts{MaxSamples: 50_000_000, Timeout: time.Minute})
	se := newSlicingEngine(ng, 0, 1, prometheus.NewRegistry())
	se.cores = func() int { return 3 }
	gate := make(chan struct{})
	release := sync.OnceFunc(func() { close(gate) })
	t.Cleanup(release) // before the database closes
	start := time.UnixMilli(slicesDataStart + 3600_000)
	q, err := se.NewRangeQuery(context.Background(), gatedQueryable{db, gate}, nil, `sum(rate(c_total[5m]))`, start, start.Add(time.Hour), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan *promql.Result, 1)
	go func() { done <- q.Exec(context.Background()) }()
	for deadline := time.Now().Add(10 * time.Second); se.running.Load() != 3; {
		if time.Now().After(deadline) {
			t.Fatalf("%d queries running, want the query's 3 slices", se.running.Load())
		}
		time.Sleep(time.Millisecond)
	}
	if n := se.slicesFor(60, se.running.Load()); n != 1 {
		t.Errorf("a query starting while 3 slices hold the 3 cores would run as %d slices", n)
	}
	release()
	if r := <-done; r.Err != nil || len(r.Value.(promql.Matrix)) != 1 || len(r.Value.(promql.Matrix)[0].Floats) < 30 {
		t.Fatalf("sliced query: %v %v", r.Err, r.Value)
	}
	q.Close()
	if n := se.running.Load(); n != 0 {
		t.Errorf("%d queries still counted as running", n)
	}
}

// TestAPIRangeQueriesSliced: through the HTTP API, a long range query is
// sliced (query.range-parallelism left at its default) and answers what it
// answers unsliced.
func TestAPIRangeQueriesSliced(t *testing.T) {
	reg := prometheus.NewRegistry()
	sliced, now := newTestAPIWith(t, func(o *Options) { o.Registry = reg })
	whole, _ := newTestAPI(t, func(c *Config) { c.RangeParallelism = 1 })
	ts := func(ms int64) string { return time.UnixMilli(ms).UTC().Format(time.RFC3339) }
	for _, q := range []string{`max by (gpu) (DCGM_FI_DEV_GPU_TEMP)`, `DCGM_FI_DEV_GPU_TEMP`, `count(DCGM_FI_DEV_GPU_TEMP) > 4`} {
		params := url.Values{"query": {q}, "start": {ts(now - 10*60_000)}, "end": {ts(now)}, "step": {"1s"}} // 601 steps
		sc, sr := call(t, sliced, http.MethodGet, "/api/v1/query_range", params)
		wc, wr := call(t, whole, http.MethodGet, "/api/v1/query_range", params)
		if sc != http.StatusOK || wc != http.StatusOK || sr.Status != "success" {
			t.Fatalf("%s: %d %s / %d %s", q, sc, sr.Error, wc, wr.Error)
		}
		if string(sr.Data) != string(wr.Data) {
			t.Errorf("%s: sliced answer\n%s\nwhole\n%s", q, sr.Data, wr.Data)
		}
		if !strings.Contains(string(sr.Data), `"values":[[`) {
			t.Errorf("%s: no points: %s", q, sr.Data)
		}
	}
	if runtime.GOMAXPROCS(0) >= 2 { // one core: nothing to slice over
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var n float64
		for _, mf := range mfs {
			if mf.GetName() == "gpustore_query_range_sliced_total" {
				n = mf.GetMetric()[0].GetCounter().GetValue()
			}
		}
		if n != 3 {
			t.Errorf("%v of the 3 range queries were sliced", n)
		}
	}
}
