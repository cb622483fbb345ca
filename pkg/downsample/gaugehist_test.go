package downsample

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
)

// writeGaugeHistograms writes native gauge histograms (a distribution that
// goes up and down, as a gauge does: CounterResetHint GaugeType) of a few
// series every 15s over [mint, maxt) into a raw block.
func writeGaugeHistograms(t *testing.T, dir string, seed uint64, mint, maxt int64) *tsdb.Block {
	t.Helper()
	return writeBlock(t, dir, func(app storage.Appender) {
		for g := range 3 {
			rng := rand.New(rand.NewPCG(seed, uint64(g)))
			lset := labels.FromStrings(model.MetricNameLabel, "gpu_kernel_occupancy", "gpu", string(rune('0'+g)))
			buckets := []float64{10, 20, 30, 5}
			var ref storage.SeriesRef
			for ts := t0 - 10*60_000 + int64(g)*1_234; ts < t0+span+10*60_000; ts += interval {
				var count, sum float64
				for i := range buckets {
					buckets[i] = max(0, buckets[i]+float64(rng.IntN(7)-3)) // up and down
					count += buckets[i]
					sum += buckets[i] * float64(i+1) * 0.7
				}
				if ts < mint || ts >= maxt {
					continue
				}
				fh := &histogram.FloatHistogram{
					CounterResetHint: histogram.GaugeType, Schema: 0, Count: count, Sum: sum,
					PositiveSpans: []histogram.Span{{Offset: 0, Length: 4}}, PositiveBuckets: append([]float64(nil), buckets...),
				}
				var err error
				if ref, err = app.AppendHistogram(ref, lset, ts, nil, fh); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
}

// TestGaugeHistogramsKeepEverySample: a native gauge histogram is not a
// counter, so it does not get the counter treatment (only the samples
// around resets and window edges are kept, which is right only for
// something that never goes down): every sample is kept, and every function
// over 5m and 1h data answers as over raw data.
func TestGaugeHistogramsKeepEverySample(t *testing.T) {
	dir := t.TempDir()
	split := t0 + 2*Res1h + 7*60_000 + 123
	r1 := writeGaugeHistograms(t, filepath.Join(dir, "raw"), 7, t0-Res1h, split)
	r2 := writeGaugeHistograms(t, filepath.Join(dir, "raw"), 7, split, t0+span+Res1h)
	ctx := context.Background()
	id5, _, err := Downsample(ctx, []tsdb.BlockReader{r1, r2}, Config{SourceResolution: ResRaw, Resolution: Res5m, Mint: t0, Maxt: t0 + span, Dir: filepath.Join(dir, "5m")})
	if err != nil {
		t.Fatal(err)
	}
	b5 := openBlock(t, filepath.Join(dir, "5m", id5.String()))
	id1, _, err := Downsample(ctx, []tsdb.BlockReader{b5}, Config{SourceResolution: Res5m, Resolution: Res1h, Mint: t0, Maxt: t0 + span, Dir: filepath.Join(dir, "1h")})
	if err != nil {
		t.Fatal(err)
	}
	b1 := openBlock(t, filepath.Join(dir, "1h", id1.String()))
	raw := rawQueryable(r1, r2)
	for _, res := range []struct {
		name string
		res  int64
		q    storage.Queryable
	}{{"5m", Res5m, viewQueryable(Res5m, b5)}, {"1h", Res1h, viewQueryable(Res1h, b1)}} {
		rs := (time.Duration(res.res) * time.Millisecond).String()
		lb := time.Duration(res.res) * time.Millisecond
		start, end := t0+2*res.res, t0+span
		for _, c := range []struct {
			q     string
			check func(string, int64, float64, float64) bool
		}{
			{"histogram_count(avg_over_time(gpu_kernel_occupancy[" + rs + "]))", rounding},
			{"histogram_sum(sum_over_time(gpu_kernel_occupancy[" + rs + "]))", rounding},
			{"histogram_quantile(0.9, gpu_kernel_occupancy)", rounding},
			{"histogram_count(gpu_kernel_occupancy)", exact},
		} {
			compare(t, res.name+": "+c.q, rangeQuery(t, raw, c.q, lb, start, end, res.res), rangeQuery(t, res.q, c.q, lb, start, end, res.res), c.check)
		}
		qs := "count_over_time(gpu_kernel_occupancy[" + rs + "])"
		rq, _, err := rewriteQuery(qs)
		if err != nil {
			t.Fatal(err)
		}
		compare(t, res.name+": "+qs, rangeQuery(t, raw, qs, lb, start, end, res.res), rangeQuery(t, res.q, rq, lb, start, end, res.res), exact)
	}
}
