package query

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/promql"
)

// pushdownTemplates hold a range function call (%[1]s) of a metric's
// selector (%[2]s) over a range (%[3]s), in the shapes dashboards use it.
var pushdownTemplates = []string{
	`%[1]s(%[2]s[%[3]s])`,
	`sum by (job) (%[1]s(%[2]s[%[3]s]))`,
	`avg(%[1]s(%[2]s[%[3]s]))`,
	`max by (i) (%[1]s(%[2]s[%[3]s] offset 7m))`,
	`quantile(0.9, %[1]s(%[2]s[%[3]s]))`,
	`%[1]s(%[2]s[%[3]s]) / on (i, job) %[1]s(%[2]s[%[3]s] offset 1h)`,
	`topk(2, %[1]s(%[2]s[%[3]s]))`,
	`%[1]s(%[2]s[%[3]s] offset -10m) > 1`,
	`sum(%[1]s(%[2]s[%[3]s])) / sum(%[1]s(%[2]s[%[3]s] offset 30s))`,
	`count(%[1]s(%[2]s[%[3]s]))`,
	`max_over_time(%[1]s(%[2]s[%[3]s])[20m:1m])`, // inside a subquery: not pushed down
}

// TestPushdownMatchesEngine: range functions evaluated in the query path
// (pushdown.go) give the engine's answers to the bit, with its annotations,
// for random functions, ranges, offsets, steps and windows, over counters
// with resets and gaps, gauges with NaN and staleness markers, series that
// start and stop, and native histograms; instant and range queries, whole
// and sliced.
func TestPushdownMatchesEngine(t *testing.T) {
	db := slicesTestDB(t)
	ng := promql.NewEngine(promql.EngineOpts{
		MaxSamples: 50_000_000, Timeout: time.Minute, LookbackDelta: 5 * time.Minute,
		EnableAtModifier: true, EnableNegativeOffset: true,
		NoStepSubqueryIntervalFn: func(int64) int64 { return 60_000 },
	})
	se := newSlicingEngine(ng, 0, 1, prometheus.NewRegistry())
	se.cores = func() int { return 3 }
	se.pushDown, se.lookback = true, 5*time.Minute
	funcs := slices.Sorted(mapsKeys(pushableFuncs))
	metrics := []string{`c_total`, `g`, `nh`, `c_total{job="job-1"}`, `g{i=~"[0-3]"}`}
	ranges := []string{"1m", "5m", "7m", "1h", "90s"}
	steps := []time.Duration{15 * time.Second, 30 * time.Second, time.Minute, 97 * time.Second, 5 * time.Minute, 30 * time.Minute}
	rng := rand.New(rand.NewPCG(9, 1))
	ctx := context.Background()
	pushed := 0
	for round := range 400 {
		qs := fmt.Sprintf(pushdownTemplates[rng.IntN(len(pushdownTemplates))], funcs[rng.IntN(len(funcs))], metrics[rng.IntN(len(metrics))], ranges[rng.IntN(len(ranges))])
		if _, ok := rewritePushdown(qs); ok {
			pushed++
		}
		step := steps[rng.IntN(len(steps))]
		start := time.UnixMilli(slicesDataStart - 20*60_000 + rng.Int64N(6*3600_000))
		end := start.Add(time.Duration(rng.IntN(300)) * step)
		se.maxSlices = 1 + rng.IntN(3)
		var wq, gq promql.Query
		var err error
		if round%5 == 0 {
			wq, err = ng.NewInstantQuery(ctx, db, nil, qs, end)
			if err == nil {
				gq, err = se.NewInstantQuery(ctx, db, nil, qs, end)
			}
		} else {
			wq, err = ng.NewRangeQuery(ctx, db, nil, qs, start, end, step)
			if err == nil {
				gq, err = se.NewRangeQuery(ctx, db, nil, qs, start, end, step)
			}
		}
		if err != nil {
			t.Fatalf("%s: %v", qs, err)
		}
		w, g := wq.Exec(ctx), gq.Exec(ctx)
		label := fmt.Sprintf("%s from %s to %s step %s", qs, start.UTC().Format(time.TimeOnly), end.UTC().Format(time.TimeOnly), step)
		if (w.Err == nil) != (g.Err == nil) || (w.Err != nil && w.Err.Error() != g.Err.Error()) {
			t.Fatalf("%s: engine error %v, pushed down %v", label, w.Err, g.Err)
		}
		if w.Err == nil {
			if d := diffValues(w.Value, g.Value); d != "" {
				t.Fatalf("%s: %s", label, d)
			}
		}
		if ww, gw := slices.Sorted(mapsKeys(w.Warnings)), slices.Sorted(mapsKeys(g.Warnings)); !slices.Equal(ww, gw) {
			t.Fatalf("%s: warnings %q, pushed down %q", label, ww, gw)
		}
		wq.Close()
		gq.Close()
	}
	if pushed < 300 {
		t.Fatalf("only %d of 400 queries were pushed down", pushed)
	}
}

func diffValues(w, g any) string {
	switch w := w.(type) {
	case promql.Matrix:
		return diffMatrices(w, g.(promql.Matrix))
	case promql.Vector:
		gv := g.(promql.Vector)
		var wm, gm promql.Matrix
		for _, s := range w {
			wm = append(wm, promql.Series{Metric: s.Metric, Floats: []promql.FPoint{{T: s.T, F: s.F}}})
		}
		for _, s := range gv {
			gm = append(gm, promql.Series{Metric: s.Metric, Floats: []promql.FPoint{{T: s.T, F: s.F}}})
		}
		if d := diffMatrices(wm, gm); d != "" {
			return d
		}
		for i := range w {
			if (w[i].H == nil) != (gv[i].H == nil) || (w[i].H != nil && !w[i].H.Equals(gv[i].H)) {
				return fmt.Sprintf("%s: histogram %v, pushed down %v", w[i].Metric, w[i].H, gv[i].H)
			}
		}
		return ""
	}
	if fmt.Sprint(w) != fmt.Sprint(g) {
		return fmt.Sprintf("%v, pushed down %v", w, g)
	}
	return ""
}

// TestPushdownRewriteKeepsPositions: the rewritten query has the same
// length, and every part not rewritten stays where it was, so the engine's
// annotations point where they point in the query as sent.
func TestPushdownRewriteKeepsPositions(t *testing.T) {
	for _, qs := range []string{
		`sum by (Hostname) (rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5m]))`,
		`max_over_time(DCGM_FI_DEV_GPU_TEMP{Hostname="a"}[1h]) - min_over_time(DCGM_FI_DEV_GPU_TEMP[1h])`,
		`rate(x[1m])`,
	} {
		pd, ok := rewritePushdown(qs)
		if !ok {
			t.Fatalf("%s: not rewritten", qs)
		}
		if len(pd.qs) != len(qs) {
			t.Fatalf("%s: rewritten to %d characters: %q", qs, len(pd.qs), pd.qs)
		}
		if !strings.Contains(pd.qs, pushdownLabel) {
			t.Fatalf("%s: %q", qs, pd.qs)
		}
	}
	for _, qs := range []string{`rate(x{a="b"}[5m] @ 100)`, `max_over_time(rate(x[1m])[5m:])`, `quantile_over_time(0.5, x[5m])`, `rate({__name__=~"x|y"}[5m])`} {
		if pd, ok := rewritePushdown(qs); ok {
			t.Errorf("%s rewritten to %q", qs, pd.qs)
		}
	}
}
