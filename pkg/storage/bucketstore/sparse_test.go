package bucketstore

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"
	"github.com/thanos-io/objstore"

	"github.com/gpustore/gpustore/pkg/readopts"
)

// stepWindows.overlaps against a brute force over every window.
func TestStepWindowsOverlaps(t *testing.T) {
	for _, w := range []stepWindows{{0, 10_000, 1000, 100}, {-7, 5_000, 700, 50}, {1000, 1000, 300, 10}} {
		for mint := w.start - 2000; mint < w.end+2000; mint += 37 {
			for _, span := range []int64{0, 5, 99, 250, 1500} {
				maxt := mint + span
				want := false
				for k := int64(0); w.start+k*w.step <= w.end; k++ {
					if from, to := w.start+k*w.step, w.start+k*w.step+w.rng; from <= maxt && to >= mint {
						want = true
					}
				}
				if got := w.overlaps(mint, maxt); got != want {
					t.Fatalf("%+v: overlaps(%d, %d) = %v, want %v", w, mint, maxt, got, want)
				}
			}
		}
	}
}

// A range query whose selects are evaluated at its steps only reads the
// chunks of the steps' windows and answers exactly as when it reads every
// chunk: range functions at steps longer than their range, with offsets,
// and steps shorter than the range (which read everything).
func TestSparseReadsAnswerAlike(t *testing.T) {
	dir := writeBlock(t, t.TempDir(), testSeries(2), 0, 12*time.Hour.Milliseconds(), 15_000)
	bkt := objstore.NewInMemBucket()
	uploadBlock(t, bkt, "team-a", dir)
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 10_000_000, Timeout: time.Minute})
	run := func(s *Store, ctx context.Context, q string, step time.Duration) string {
		out := ""
		for _, sr := range rangeMatrix(t, engine, s, ctx, q, 20*60_000+7_000, 11*time.Hour.Milliseconds(), step.Milliseconds()) {
			out += sr.Metric.String()
			for _, p := range sr.Floats {
				out += fmt.Sprintf(" %d:%x", p.T, math.Float64bits(p.F))
			}
			out += "\n"
		}
		return out
	}
	for _, c := range []struct {
		q      string
		step   time.Duration
		sparse bool // fewer samples read
	}{
		{"rate(DCGM_FI_DEV_GPU_UTIL[5m])", 2 * time.Hour, true},
		{"max_over_time(DCGM_FI_DEV_GPU_TEMP[10m] offset 47m)", 97 * time.Minute, true},
		{"sum by (Hostname) (count_over_time(DCGM_FI_DEV_POWER_USAGE[1m]))", time.Hour, true},
		{"increase(up[30m])", 10 * time.Minute, false},
		{"DCGM_FI_DEV_GPU_UTIL", 2 * time.Hour, false},
	} {
		s := newTestStore(t, bkt, 4<<10, 64<<20)
		want := run(s, context.Background(), c.q, c.step)
		got := run(s, atSteps(context.Background()), c.q, c.step)
		if want == "" {
			t.Fatalf("%s: no answer", c.q)
		}
		if got != want {
			t.Errorf("%s at %s: sparse reads answer differently\nwant %.500s\ngot  %.500s", c.q, c.step, want, got)
		}
	}
	// What a select reads: the windows' chunks only.
	s := newTestStore(t, bkt, 4<<10, 64<<20)
	h := &storage.SelectHints{Start: 20*60_000 - 5*60_000, End: 11 * time.Hour.Milliseconds(), Step: 2 * time.Hour.Milliseconds(), Range: 5 * 60_000}
	read := func(ctx context.Context) int {
		q, err := s.Querier("team-a", h.Start, h.End, readopts.FromContext(ctx))
		if err != nil {
			t.Fatal(err)
		}
		defer q.Close()
		n, err := samples(q.Select(ctx, true, h, labels.MustNewMatcher(labels.MatchEqual, model.MetricNameLabel, "DCGM_FI_DEV_GPU_UTIL")))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	all, some := read(context.Background()), read(atSteps(context.Background()))
	t.Logf("rate(x[5m]) at a 2h step over 30-minute chunks: %d samples read from every chunk, %d from the windows' chunks", all, some)
	if some == 0 || some*3 > all {
		t.Errorf("sparse select read %d samples of %d: want at most a third", some, all)
	}
}

// atSteps is ctx with read options that say the selects are evaluated at
// their steps only (as the API says of a range query without subqueries).
func atSteps(ctx context.Context) context.Context {
	o := readopts.Default()
	o.AtSteps = true
	return readopts.NewContext(ctx, o)
}

// rangeMatrix runs a range query over team-a's blocks in s, with the read's
// options in ctx.
func rangeMatrix(t *testing.T, engine *promql.Engine, s *Store, ctx context.Context, q string, start, end, step int64) promql.Matrix {
	t.Helper()
	qry, err := engine.NewRangeQuery(ctx, storeQueryable(s, "team-a", nil), nil, q, time.UnixMilli(start), time.UnixMilli(end), time.Duration(step)*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer qry.Close()
	r := qry.Exec(ctx)
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	m, err := r.Matrix()
	if err != nil {
		t.Fatal(err)
	}
	return m
}
