package ringread

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/grafana/dskit/user"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"

	"github.com/gpustore/gpustore/pkg/seriesset"
	"github.com/gpustore/gpustore/pkg/tenancy"
	"github.com/gpustore/gpustore/pkg/tenantdb"
)

// BenchmarkRingSelect is one dashboard select through the fan-out: all
// 256 GPUs' utilisation over an hour at 15 s (61,440 samples), read from
// three receivers with RF 3 over HTTP on loopback and every sample
// iterated, as PromQL does. "identical": every receiver took every write;
// "differing": each missed 1 % of them at random (each sample still on
// two), so their chunks are cut differently. "single": the same select
// from one receiver's TSDB in process, the single node's cost. The
// receivers run in the benchmark's process: the figures are the work of
// the querier and the receivers it asks together.
func BenchmarkRingSelect(b *testing.B) {
	for _, tc := range []struct {
		name string
		miss float64
	}{{"identical", 0}, {"differing", 0.01}} {
		dbs, src, mint, maxt := benchRing(b, tc.miss)
		ctx := user.InjectOrgID(context.Background(), "t")
		m := labels.MustNewMatcher(labels.MatchEqual, model.MetricNameLabel, "DCGM_FI_DEV_GPU_UTIL")
		hints := &storage.SelectHints{Start: mint, End: maxt}
		b.Run(tc.name+"/ring", func(b *testing.B) {
			for b.Loop() {
				q := mustQuerier(b, src, "t", mint, maxt)
				benchIterate(b, q.Select(ctx, false, hints, m), 256*240)
				_ = q.Close()
			}
		})
		// As the query path reads a series the engine is about to
		// evaluate: decoded into arrays (seriesset.Decoded).
		b.Run(tc.name+"/ring/decoded", func(b *testing.B) {
			var ts []int64
			var fs []float64
			for b.Loop() {
				q := mustQuerier(b, src, "t", mint, maxt)
				ss := q.Select(ctx, false, hints, m)
				n := 0
				for ss.Next() {
					var err error
					ts, fs, _, err = seriesset.AppendFloats(ss.At(), ts[:0], fs[:0], mint, maxt)
					if err != nil {
						b.Fatal(err)
					}
					n += len(ts)
				}
				if err := ss.Err(); err != nil || n != 256*240 {
					b.Fatalf("%d samples, want %d (%v)", n, 256*240, err)
				}
				_ = q.Close()
			}
		})
		if tc.miss == 0 {
			b.Run("single", func(b *testing.B) {
				for b.Loop() {
					q, err := dbs[0].Existing("t").Querier(mint, maxt)
					if err != nil {
						b.Fatal(err)
					}
					benchIterate(b, q.Select(ctx, false, hints, m), 256*240)
					_ = q.Close()
				}
			})
		}
	}
}

func benchIterate(b *testing.B, ss storage.SeriesSet, want int) {
	n := 0
	var it chunkenc.Iterator
	for ss.Next() {
		it = ss.At().Iterator(it)
		for it.Next() != chunkenc.ValNone {
			n++
		}
	}
	if err := ss.Err(); err != nil {
		b.Fatal(err)
	}
	if n != want {
		b.Fatalf("%d samples, want %d", n, want)
	}
}

// benchRing starts three receivers in a ring (RF 3) holding 256 GPU
// series over an hour, each missing the given share of samples.
func benchRing(b testing.TB, miss float64) ([]*tenantdb.Manager, *Source, int64, int64) {
	b.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	const steps = 240
	t0 := time.Now().Add(-70 * time.Minute).Truncate(time.Minute).UnixMilli()
	var series []labels.Labels
	for n := range 32 {
		for g := range 8 {
			series = append(series, labels.FromStrings(model.MetricNameLabel, "DCGM_FI_DEV_GPU_UTIL", "gpu", fmt.Sprint(g),
				"UUID", fmt.Sprintf("GPU-%08x", n*8+g), "Hostname", fmt.Sprintf("gpu-node-%03d", n), "modelName", "NVIDIA H100 80GB HBM3"))
		}
	}
	dbs := make([]*tenantdb.Manager, 3)
	for i := range dbs {
		dbs[i] = newManager(b)
	}
	for s := range steps {
		ts := t0 + int64(s)*15_000
		skip := -1
		if rng.Float64() < 3*miss {
			skip = rng.IntN(3)
		}
		for i, m := range dbs {
			db, err := m.Get("t")
			if err != nil {
				b.Fatal(err)
			}
			app := db.Appender(context.Background())
			for k, ls := range series {
				if i == skip && (k+s)%3 == 0 {
					continue
				}
				if _, err := app.Append(0, ls, ts, float64((s*7+k)%101)); err != nil {
					b.Fatal(err)
				}
			}
			if err := app.Commit(); err != nil {
				b.Fatal(err)
			}
		}
	}
	rg, store := startRing(b, 3)
	for i, m := range dbs {
		srv := httptest.NewServer(ReadHandler(m, tenancy.DefaultConfig(), quiet, prometheus.NewRegistry()))
		b.Cleanup(srv.Close)
		addToRing(b, store, fmt.Sprintf("r%d", i), srv.Listener.Addr().String(), []uint32{uint32(i) + 1})
	}
	waitRing(b, rg, len(dbs))
	src, err := NewSource(SourceConfig{Timeout: time.Minute}, rg, quiet, prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	return dbs, src, t0, t0 + (steps-1)*15_000
}

// BenchmarkRingDecode is the query path's decoding of a select's series
// into arrays (seriesset.AppendFloats, as seriesset.Decoded and the
// pushdown of range functions read them) alone: the series are read from
// the receivers once, outside the timer. Per op: 256 series over an hour
// at 15 s (61,440 samples).
func BenchmarkRingDecode(b *testing.B) {
	for _, tc := range []struct {
		name string
		miss float64
	}{{"identical", 0}, {"differing", 0.01}} {
		_, src, mint, maxt := benchRing(b, tc.miss)
		ctx := user.InjectOrgID(context.Background(), "t")
		q := mustQuerier(b, src, "t", mint, maxt)
		ss := q.Select(ctx, false, &storage.SelectHints{Start: mint, End: maxt},
			labels.MustNewMatcher(labels.MatchEqual, model.MetricNameLabel, "DCGM_FI_DEV_GPU_UTIL"))
		var series []storage.Series
		for ss.Next() {
			series = append(series, ss.At())
		}
		if err := ss.Err(); err != nil {
			b.Fatal(err)
		}
		b.Run(tc.name, func(b *testing.B) {
			var ts []int64
			var fs []float64
			for b.Loop() {
				n := 0
				for _, s := range series {
					var err error
					if ts, fs, _, err = seriesset.AppendFloats(s, ts[:0], fs[:0], mint, maxt); err != nil {
						b.Fatal(err)
					}
					n += len(ts)
				}
				if n != 256*240 {
					b.Fatalf("%d samples, want %d", n, 256*240)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*256*240), "ns/sample")
		})
		_ = q.Close()
	}
}
