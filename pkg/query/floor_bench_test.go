package query

import (
	"context"

	"fmt"
	"github.com/prometheus/client_golang/prometheus"
	"testing"
	"time"

	"github.com/grafana/dskit/user"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/util/annotations"
)

var issuePanels = []string{
	`avg(DCGM_FI_DEV_GPU_UTIL)`,
	`max by (Hostname) (DCGM_FI_DEV_GPU_TEMP)`,
	`sum by (Hostname) (rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5m]))`,
	`avg by (Hostname, gpu) (DCGM_FI_DEV_POWER_USAGE)`,
	`max_over_time(DCGM_FI_DEV_GPU_TEMP[1h])`,
	`quantile(0.9, DCGM_FI_DEV_SM_CLOCK)`,
}

type arrSeries struct {
	lset labels.Labels
	t    []int64
	v    []float64
}

func (s *arrSeries) Labels() labels.Labels { return s.lset }
func (s *arrSeries) Iterator(it chunkenc.Iterator) chunkenc.Iterator {
	ai, ok := it.(*arrIt)
	if !ok {
		ai = &arrIt{}
	}
	ai.s, ai.i = s, -1
	return ai
}

type arrIt struct {
	s *arrSeries
	i int
}

func (a *arrIt) Next() chunkenc.ValueType {
	a.i++
	if a.i >= len(a.s.t) {
		a.i = len(a.s.t)
		return chunkenc.ValNone
	}
	return chunkenc.ValFloat
}
func (a *arrIt) Seek(t int64) chunkenc.ValueType {
	if a.i < 0 {
		a.i = 0
	}
	for a.i < len(a.s.t) && a.s.t[a.i] < t {
		a.i++
	}
	if a.i >= len(a.s.t) {
		return chunkenc.ValNone
	}
	return chunkenc.ValFloat
}
func (a *arrIt) At() (int64, float64) { return a.s.t[a.i], a.s.v[a.i] }
func (a *arrIt) AtHistogram(*histogram.Histogram) (int64, *histogram.Histogram) {
	panic("no")
}
func (a *arrIt) AtFloatHistogram(*histogram.FloatHistogram) (int64, *histogram.FloatHistogram) {
	panic("no")
}
func (a *arrIt) AtT() int64  { return a.s.t[a.i] }
func (a *arrIt) AtST() int64 { return 0 }
func (a *arrIt) Err() error  { return nil }

type arrQ struct{ series []*arrSeries }

func (q arrQ) Querier(int64, int64) (storage.Querier, error) { return q, nil }
func (q arrQ) Select(_ context.Context, _ bool, _ *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
	var out []storage.Series
outer:
	for _, s := range q.series {
		for _, m := range ms {
			if !m.Matches(s.lset.Get(m.Name)) {
				continue outer
			}
		}
		out = append(out, s)
	}
	return &arrListSet{s: out, i: -1}
}
func (q arrQ) LabelValues(context.Context, string, *storage.LabelHints, ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return nil, nil, nil
}
func (q arrQ) LabelNames(context.Context, *storage.LabelHints, ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return nil, nil, nil
}
func (q arrQ) Close() error { return nil }

type arrListSet struct {
	s []storage.Series
	i int
}

func (l *arrListSet) Next() bool                        { l.i++; return l.i < len(l.s) }
func (l *arrListSet) At() storage.Series                { return l.s[l.i] }
func (l *arrListSet) Err() error                        { return nil }
func (l *arrListSet) Warnings() annotations.Annotations { return nil }

func BenchmarkIssuePanels(b *testing.B) {
	d := benchPanelData(b)
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 200_000_000, Timeout: 10 * time.Minute, LookbackDelta: 5 * time.Minute})
	ctx := user.InjectOrgID(context.Background(), "bench")
	rng := 24 * time.Hour
	step := 5 * time.Minute
	end := d.end.Truncate(step)
	start := end.Add(-rng)
	// arrays
	q, _ := d.queryable.Querier(start.Add(-2*time.Hour).UnixMilli(), end.UnixMilli())
	ss := q.Select(ctx, true, nil, labels.MustNewMatcher(labels.MatchRegexp, "__name__", "DCGM_FI_DEV_(GPU_UTIL|GPU_TEMP|TOTAL_ENERGY_CONSUMPTION|POWER_USAGE|SM_CLOCK)"))
	var arr arrQ
	var it chunkenc.Iterator
	n := 0
	for ss.Next() {
		s := &arrSeries{lset: ss.At().Labels()}
		it = ss.At().Iterator(it)
		for it.Next() != chunkenc.ValNone {
			t, v := it.At()
			s.t, s.v = append(s.t, t), append(s.v, v)
			n++
		}
		arr.series = append(arr.series, s)
	}
	q.Close()
	b.Logf("%d series, %d samples", len(arr.series), n)
	for _, n := range []int{1, 4, 8, 16, 32} {
		for _, p := range issuePanels {
			b.Run(fmt.Sprintf("sliced%d/%s", n, p), func(b *testing.B) {
				c0 := processCPU()
				steps := int(end.Sub(start)/step) + 1
				per := (steps + n - 1) / n
				for b.Loop() {
					for i := 0; i < steps; i += per {
						s := start.Add(time.Duration(i) * step)
						e := start.Add(time.Duration(min(i+per, steps)-1) * step)
						qry, err := engine.NewRangeQuery(ctx, d.queryable, nil, p, s, e, step)
						if err != nil {
							b.Fatal(err)
						}
						if r := qry.Exec(ctx); r.Err != nil {
							b.Fatal(r.Err)
						}
						qry.Close()
					}
				}
				b.ReportMetric(float64((processCPU()-c0).Microseconds())/1000/float64(b.N), "cpu-ms/op")
			})
		}
	}
	pushed := newSlicingEngine(engine, 1, 1, prometheus.NewRegistry())
	pushed.pushDown, pushed.lookback = true, 5*time.Minute
	for _, src := range []struct {
		name string
		q    storage.Queryable
		e    promql.QueryEngine
	}{{"floor", arr, engine}, {"gpustore", d.queryable, engine}, {"pushed", d.queryable, pushed}} {
		engine := src.e
		for _, p := range issuePanels {
			b.Run(src.name+"/"+p, func(b *testing.B) {
				c0 := processCPU()
				for b.Loop() {
					qry, err := engine.NewRangeQuery(ctx, src.q, nil, p, start, end, step)
					if err != nil {
						b.Fatal(err)
					}
					if r := qry.Exec(ctx); r.Err != nil {
						b.Fatal(r.Err)
					}
					qry.Close()
				}
				b.ReportMetric(float64((processCPU()-c0).Microseconds())/1000/float64(b.N), "cpu-ms/op")
			})
		}
	}
}
