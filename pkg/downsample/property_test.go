package downsample

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"path/filepath"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/value"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
)

// The property tests write random raw series (gauges, counters with resets,
// gaps, staleness markers, NaN, timestamps on and off window boundaries)
// into two raw blocks, downsample them to 5m and the 5m block to 1h, and
// run the same PromQL through Prometheus' engine over raw and over each
// downsampled block, at every multiple of the resolution.

const (
	t0       = int64(1_767_225_600_000) // 2026-01-01T00:00:00Z, a multiple of 1h
	span     = 6 * Res1h
	interval = int64(15_000)
)

type rawSeries struct {
	lset    labels.Labels
	counter bool
	ts      []int64
	vs      []float64
}

// genSeries makes n gauges and n counters over [t0-10m, t0+span+10m].
func genSeries(rng *rand.Rand, n int) []rawSeries {
	var out []rawSeries
	for i := range 2 * n {
		counter := i >= n
		name := "gauge_metric"
		if counter {
			name = "counter_metric_total"
		}
		s := rawSeries{lset: labels.FromStrings(model.MetricNameLabel, name, "id", strconv.Itoa(i)), counter: counter}
		// Half the series are scraped exactly on multiples of 15s (so
		// samples sit on window ends), half with a phase and jitter.
		aligned := i%2 == 0
		phase := int64(0)
		if !aligned {
			phase = rng.Int64N(interval)
		}
		// A gap (absent) and the start/end of the series, at random.
		gapFrom, gapTo := int64(math.MaxInt64), int64(math.MaxInt64)
		if rng.IntN(2) == 0 {
			gapFrom = t0 + rng.Int64N(span)
			gapTo = gapFrom + rng.Int64N(2*Res1h)
		}
		start, end := t0-10*60_000, t0+span+10*60_000
		if rng.IntN(4) == 0 {
			start = t0 + rng.Int64N(span/2)
		}
		if rng.IntN(4) == 0 {
			end = t0 + span/2 + rng.Int64N(span/2)
		}
		staleAtGap := rng.IntN(2) == 0
		v := rng.Float64() * 100
		integer := rng.IntN(3) == 0
		var last int64
		inGap := false
		for t := start - start%interval + phase; t <= end; t += interval {
			ts := t
			if !aligned {
				ts += rng.Int64N(1000) - 500
				// A sample 1 ms after a window end is the one raw time the
				// 1 ms shift of downsampled points moves out of its
				// window (see the package comment); keep it off.
				if (ts-1)%Res5m == 0 {
					ts++
				}
			}
			if ts >= gapFrom && ts < gapTo {
				if !inGap && staleAtGap && len(s.ts) > 0 {
					s.ts = append(s.ts, ts)
					s.vs = append(s.vs, math.Float64frombits(value.StaleNaN))
				}
				inGap = true
				continue
			}
			inGap = false
			if counter {
				v += rng.ExpFloat64() * 5
				if rng.IntN(300) == 0 {
					v = rng.Float64() * 3 // reset
				}
			} else {
				v += rng.NormFloat64() * 3
			}
			x := v
			if integer {
				x = math.Round(v)
			}
			if rng.IntN(500) == 0 {
				x = math.NaN()
			}
			if ts <= last {
				continue
			}
			s.ts = append(s.ts, ts)
			s.vs = append(s.vs, x)
			last = ts
		}
		if rng.IntN(2) == 0 && len(s.ts) > 0 {
			s.ts = append(s.ts, last+interval)
			s.vs = append(s.vs, math.Float64frombits(value.StaleNaN))
		}
		out = append(out, s)
	}
	return out
}

// writeRaw writes the samples of series in [mint, maxt) into a raw block.
func writeRaw(t testing.TB, dir string, series []rawSeries, mint, maxt int64) *tsdb.Block {
	t.Helper()
	return writeBlock(t, dir, func(app storage.Appender) {
		for _, s := range series {
			var ref storage.SeriesRef
			for i, ts := range s.ts {
				if ts < mint || ts >= maxt {
					continue
				}
				var err error
				if ref, err = app.Append(ref, s.lset, ts, s.vs[i]); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
}

// writeBlock writes what add appends into a raw block and opens it.
func writeBlock(t testing.TB, dir string, add func(app storage.Appender)) *tsdb.Block {
	t.Helper()
	w, err := tsdb.NewBlockWriter(slog.New(slog.DiscardHandler), dir, 4*Res1h*4)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	app := w.Appender(context.Background())
	add(app)
	if err := app.Commit(); err != nil {
		t.Fatal(err)
	}
	id, err := w.Flush(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return openBlock(t, filepath.Join(dir, id.String()))
}

func openBlock(t testing.TB, dir string) *tsdb.Block {
	t.Helper()
	b, err := tsdb.OpenBlock(nil, dir, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func blocksQueryable(blocks ...tsdb.BlockReader) storage.Queryable {
	return storage.QueryableFunc(func(mint, maxt int64) (storage.Querier, error) {
		var qs []storage.Querier
		for _, b := range blocks {
			q, err := tsdb.NewBlockQuerier(b, mint, maxt)
			if err != nil {
				return nil, err
			}
			qs = append(qs, q)
		}
		return storage.NewMergeQuerier(qs, nil, storage.ChainedSeriesMerge), nil
	})
}

// viewQueryable reads downsampled blocks of resolution res as the bucket
// store does: one view over the blocks, each read over the part of the
// querier's range it holds (its pairs a window further), merged. Its
// selects are evaluated at their steps (Blocks.AtSteps), as those of the
// query API's range queries without subqueries are (rangeQuery).
func viewQueryable(res int64, blocks ...tsdb.BlockReader) storage.Queryable {
	return storage.QueryableFunc(func(mint, maxt int64) (storage.Querier, error) {
		var parts []Part
		closeAll := func() {
			for _, p := range parts {
				p.Querier.Close()
				if p.Pairs != nil {
					p.Pairs.Close()
				}
			}
		}
		for _, b := range blocks {
			m := b.Meta()
			lo, hi := max(mint, m.MinTime), min(maxt, m.MaxTime-1)
			if lo > hi {
				continue
			}
			q, err := tsdb.NewBlockQuerier(b, lo, hi)
			if err != nil {
				closeAll()
				return nil, err
			}
			p := Part{Querier: q, Lo: lo, Hi: hi, KeptCounts: true}
			if wide := min(maxt+res-1, m.MaxTime-1); wide > hi {
				if p.Pairs, err = tsdb.NewBlockQuerier(b, lo, wide); err != nil {
					q.Close()
					closeAll()
					return nil, err
				}
			}
			parts = append(parts, p)
		}
		sort.Slice(parts, func(i, j int) bool { return parts[i].Lo < parts[j].Lo })
		return NewQuerier(Blocks{Parts: parts, Resolution: res, From: mint, To: maxt, AtSteps: true}), nil
	})
}

// rawQueryable reads raw blocks as the bucket store and the local TSDB
// read raw data for a rewritten query (NewRawQuerier).
func rawQueryable(blocks ...tsdb.BlockReader) storage.Queryable {
	q := blocksQueryable(blocks...)
	return storage.QueryableFunc(func(mint, maxt int64) (storage.Querier, error) {
		inner, err := q.Querier(mint, maxt)
		if err != nil {
			return nil, err
		}
		return NewRawQuerier(inner), nil
	})
}

// rewriteQuery is Rewrite on a query string.
func rewriteQuery(qs string) (string, bool, error) {
	expr, err := parser.NewParser(parser.Options{}).ParseExpr(qs)
	if err != nil {
		return qs, false, err
	}
	expr, changed := Rewrite(expr)
	if !changed {
		return qs, false, nil
	}
	return expr.String(), true, nil
}

func resOf(name string) int64 {
	r, err := ParseResolution(name)
	if err != nil {
		panic(err)
	}
	return r
}

type fixture struct {
	series     []rawSeries
	raw        storage.Queryable
	ds5m, ds1h storage.Queryable
	b5m, b1h   *tsdb.Block
}

func newFixture(t testing.TB, seed uint64, n int) *fixture {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	series := genSeries(rng, n)
	dir := t.TempDir()
	// Two raw blocks split off a window boundary, so the downsampler must
	// merge sources, and the sample at exactly t0+span lives in the second.
	split := t0 + 3*Res1h + 7*60_000 + 123
	r1 := writeRaw(t, filepath.Join(dir, "raw"), series, t0-Res1h, split)
	r2 := writeRaw(t, filepath.Join(dir, "raw"), series, split, t0+span+Res1h)

	ctx := context.Background()
	id5, st5, err := Downsample(ctx, []tsdb.BlockReader{r1, r2}, Config{
		SourceResolution: ResRaw, Resolution: Res5m, Mint: t0, Maxt: t0 + span, Dir: filepath.Join(dir, "5m"),
	})
	if err != nil {
		t.Fatal(err)
	}
	b5 := openBlock(t, filepath.Join(dir, "5m", id5.String()))
	id1, st1, err := Downsample(ctx, []tsdb.BlockReader{b5}, Config{
		SourceResolution: Res5m, Resolution: Res1h, Mint: t0, Maxt: t0 + span, Dir: filepath.Join(dir, "1h"),
	})
	if err != nil {
		t.Fatal(err)
	}
	b1 := openBlock(t, filepath.Join(dir, "1h", id1.String()))
	t.Logf("seed %d: raw→5m %+v; 5m→1h %+v", seed, st5, st1)
	for _, b := range []*tsdb.Block{b5, b1} {
		if m := b.Meta(); m.MinTime != t0 || m.MaxTime != t0+span {
			t.Fatalf("downsampled block covers [%d, %d), want [%d, %d)", m.MinTime, m.MaxTime, t0, t0+span)
		}
	}
	return &fixture{
		series: series,
		raw:    rawQueryable(r1, r2),
		ds5m:   viewQueryable(Res5m, b5),
		ds1h:   viewQueryable(Res1h, b1),
		b5m:    b5, b1h: b1,
	}
}

var testEngine = promql.NewEngine(promql.EngineOpts{MaxSamples: 50_000_000, Timeout: time.Minute})

// points maps a series (its labels) to its points of a range query.
type points map[string]map[int64]float64

// rangeQuery runs a range query as the query API runs one without
// subqueries (the queryables here read their selects as evaluated at the
// steps: Blocks.AtSteps).
func rangeQuery(t testing.TB, q storage.Queryable, qs string, lookback time.Duration, start, end int64, step int64) points {
	t.Helper()
	p, _ := rangeQueryInfos(t, q, qs, lookback, start, end, step)
	return p
}

// rangeQueryInfos is rangeQuery with the answer's annotations.
func rangeQueryInfos(t testing.TB, q storage.Queryable, qs string, lookback time.Duration, start, end int64, step int64) (points, []string) {
	t.Helper()
	ctx := context.Background()
	qry, err := testEngine.NewRangeQuery(ctx, q, promql.NewPrometheusQueryOpts(false, lookback, nil), qs,
		time.UnixMilli(start), time.UnixMilli(end), time.Duration(step)*time.Millisecond)
	if err != nil {
		t.Fatalf("%s: %v", qs, err)
	}
	defer qry.Close()
	res := qry.Exec(ctx)
	if res.Err != nil {
		t.Fatalf("%s: %v", qs, res.Err)
	}
	m, err := res.Matrix()
	if err != nil {
		t.Fatalf("%s: %v", qs, err)
	}
	out := points{}
	for _, s := range m {
		ps := map[int64]float64{}
		for _, p := range s.Floats {
			ps[p.T] = p.F
		}
		out[s.Metric.String()] = ps
	}
	var infos []string
	for _, err := range res.Warnings {
		infos = append(infos, err.Error())
	}
	return out, infos
}

func sameFloat(a, b, rel float64) bool {
	if math.IsNaN(a) || math.IsNaN(b) {
		return math.IsNaN(a) && math.IsNaN(b)
	}
	if a == b {
		return true
	}
	return math.Abs(a-b) <= rel*math.Max(math.Abs(a), math.Abs(b))
}

// compare checks that got and want have the same series and timestamps and
// that ok(series, t, want, got) holds for every point.
func compare(t *testing.T, what string, want, got points, ok func(series string, ts int64, w, g float64) bool) {
	t.Helper()
	var keys []string
	for k := range want {
		keys = append(keys, k)
	}
	for k := range got {
		if _, found := want[k]; !found {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	bad := 0
	total := 0
	for _, k := range keys {
		w, g := want[k], got[k]
		for ts, wv := range w {
			total++
			gv, found := g[ts]
			if !found {
				bad++
				if bad <= 5 {
					t.Errorf("%s: %s at %s: raw %v, downsampled has no point", what, k, time.UnixMilli(ts).UTC().Format(time.RFC3339), wv)
				}
				continue
			}
			if !ok(k, ts, wv, gv) {
				bad++
				if bad <= 5 {
					t.Errorf("%s: %s at %s: raw %v, downsampled %v", what, k, time.UnixMilli(ts).UTC().Format(time.RFC3339), wv, gv)
				}
			}
		}
		for ts, gv := range g {
			if _, found := w[ts]; !found {
				bad++
				if bad <= 5 {
					t.Errorf("%s: %s at %s: downsampled %v, raw has no point", what, k, time.UnixMilli(ts).UTC().Format(time.RFC3339), gv)
				}
			}
		}
	}
	if bad > 0 {
		t.Errorf("%s: %d of %d points differ", what, bad, total)
	}
	if total == 0 {
		t.Errorf("%s: raw answered nothing; the test checks nothing", what)
	}
}

func exact(_ string, _ int64, w, g float64) bool    { return sameFloat(w, g, 0) }
func rounding(_ string, _ int64, w, g float64) bool { return sameFloat(w, g, 1e-9) }

func TestDownsampledPromQLMatchesRaw(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			f := newFixture(t, seed, 12)
			for _, res := range []struct {
				name string
				res  int64
				q    storage.Queryable
			}{{"5m", Res5m, f.ds5m}, {"1h", Res1h, f.ds1h}} {
				t.Run(res.name, func(t *testing.T) {
					lb := time.Duration(res.res) * time.Millisecond
					start, end, step := t0+3*res.res, t0+span, res.res
					for _, mult := range []int64{1, 3} {
						r := res.res * mult
						rs := (time.Duration(r) * time.Millisecond).String()
						run := func(qs string, check func(string, int64, float64, float64) bool) {
							want := rangeQuery(t, f.raw, qs, lb, start, end, step)
							got, infos := rangeQueryInfos(t, res.q, qs, lb, start, end, step)
							compare(t, qs, want, got, check)
							if len(infos) > 0 {
								t.Errorf("%s: exact, but says %q", qs, infos)
							}
						}
						runRewritten := func(qs string, check func(string, int64, float64, float64) bool) {
							rq, changed, err := rewriteQuery(qs)
							if err != nil || !changed {
								t.Fatalf("rewrite %s: %v, changed %v", qs, err, changed)
							}
							want := rangeQuery(t, f.raw, qs, lb, start, end, step)
							got := rangeQuery(t, res.q, rq, lb, start, end, step)
							compare(t, qs+" (rewritten "+rq+")", want, got, check)
						}
						run("resets(counter_metric_total["+rs+"])", exact)
						run("increase(counter_metric_total["+rs+"])", rounding)
						run("rate(counter_metric_total["+rs+"])", rounding)
						run("delta(counter_metric_total["+rs+"])", rounding)
						run("max_over_time(counter_metric_total["+rs+"])", exact)
						run("min_over_time(counter_metric_total["+rs+"])", exact)
						run("max_over_time(gauge_metric["+rs+"])", exact)
						run("min_over_time(gauge_metric["+rs+"])", exact)
						run("sum_over_time(gauge_metric["+rs+"])", rounding)
						runRewritten("count_over_time(gauge_metric["+rs+"])", exact)
						runRewritten("avg_over_time(gauge_metric["+rs+"])", rounding)
					}
					// A plain selector reads the window's average: at the
					// end of a window it is avg_over_time over the window
					// on raw data, for series that are not stale there.
					rs := (time.Duration(res.res) * time.Millisecond).String()
					for _, agg := range []string{"avg", "max", "sum", "min"} {
						want := rangeQuery(t, f.raw, agg+"(avg_over_time(gauge_metric["+rs+"]) and gauge_metric)", lb, start, end, step)
						got := rangeQuery(t, res.q, agg+"(gauge_metric)", lb, start, end, step)
						compare(t, agg+"(gauge_metric)", want, got, rounding)
					}
					want := rangeQuery(t, f.raw, "avg_over_time(gauge_metric["+rs+"]) and gauge_metric", lb, start, end, step)
					got := rangeQuery(t, res.q, "gauge_metric", lb, start, end, step)
					compare(t, "gauge_metric", dropName(want), got, rounding)
				})
			}
		})
	}
}

// dropName re-keys series as they come back from a plain selector (with
// __name__): avg_over_time drops the name, the selector keeps it.
func dropName(p points) points {
	out := points{}
	for k, v := range p {
		ls, err := parseLabels(k)
		if err != nil {
			panic(err)
		}
		out[labels.NewBuilder(ls).Set(model.MetricNameLabel, "gauge_metric").Labels().String()] = v
	}
	return out
}

func parseLabels(s string) (labels.Labels, error) {
	return parser.NewParser(parser.Options{}).ParseMetric(s)
}
