package ringread

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/grafana/dskit/user"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"

	"github.com/gpustore/gpustore/pkg/seriesset"
)

// TestRingSeriesAppendFloats: the series the receivers' select hands the
// query path append their samples to arrays themselves
// (seriesset.FloatAppender, which seriesset.Decoded and the pushdown of
// range functions use instead of a per-sample iterator), and append what
// their iterator reads, over random ranges, where replicas sent the same
// chunks and where they differ (each receiver missed writes: chunks merged
// sample by sample).
func TestRingSeriesAppendFloats(t *testing.T) {
	for _, miss := range []float64{0, 0.05} {
		_, src, mint, maxt := benchRing(t, miss)
		ctx := user.InjectOrgID(context.Background(), "t")
		rng := rand.New(rand.NewPCG(uint64(miss*100), 7))
		merged := 0 // series read with clusters of differing chunks
		for range 20 {
			qmint := mint + rng.Int64N(maxt-mint)/2 - 30_000
			qmaxt := maxt - rng.Int64N(maxt-mint)/2 + 30_000
			q := mustQuerier(t, src, "t", qmint, qmaxt)
			ss := q.Select(ctx, false, &storage.SelectHints{Start: qmint, End: qmaxt},
				labels.MustNewMatcher(labels.MatchEqual, model.MetricNameLabel, "DCGM_FI_DEV_GPU_UTIL"))
			n := 0
			for ss.Next() {
				s := ss.At()
				if rs, ok := s.(*ringSeries); ok && len(rs.clusters) > 0 {
					merged++
				}
				fa, ok := s.(seriesset.FloatAppender)
				if !ok {
					t.Fatalf("%T is not a seriesset.FloatAppender", s)
				}
				// A sub-range as the pushdown or a decoded slice asks.
				from, to := qmint+rng.Int64N(600_000)-300_000, qmaxt-rng.Int64N(600_000)+300_000
				var wantT []int64
				var wantF []float64
				it := s.Iterator(nil)
				for vt := it.Next(); vt != chunkenc.ValNone; vt = it.Next() {
					ts, f := it.At()
					if ts >= from && ts <= to {
						wantT, wantF = append(wantT, ts), append(wantF, f)
					}
				}
				if err := it.Err(); err != nil {
					t.Fatal(err)
				}
				gotT, gotF, floats, err := fa.AppendFloats(nil, nil, from, to)
				if err != nil || !floats {
					t.Fatalf("AppendFloats: floats %v, %v", floats, err)
				}
				if len(gotT) != len(wantT) {
					t.Fatalf("miss %v, %s over [%d, %d]: %d samples appended, the iterator reads %d", miss, s.Labels(), from, to, len(gotT), len(wantT))
				}
				for i := range gotT {
					if gotT[i] != wantT[i] || gotF[i] != wantF[i] {
						t.Fatalf("miss %v, %s sample %d: appended (%d, %v), the iterator reads (%d, %v)", miss, s.Labels(), i, gotT[i], gotF[i], wantT[i], wantF[i])
					}
				}
				n++
			}
			if err := ss.Err(); err != nil {
				t.Fatal(err)
			}
			if n != 256 {
				t.Fatalf("%d series, want 256", n)
			}
			_ = q.Close()
		}
		if miss > 0 && merged == 0 {
			t.Errorf("miss %v: no series had replicas' chunks to merge", miss)
		}
	}
}
