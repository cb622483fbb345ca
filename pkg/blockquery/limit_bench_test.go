package blockquery

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/tsdb/chunkenc"

	"github.com/gpustore/gpustore/pkg/limits/querylimit"
)

// BenchmarkSelectRead reads every sample of a block's series, without a
// query limiter in the context (rule evaluation, tenants without query
// limits) and with one counting the chunk bytes (max_fetched_chunk_bytes_
// per_query): the cost of the counting hook on the read path.
func BenchmarkSelectRead(b *testing.B) {
	blk := testBlock(b, rand.New(rand.NewPCG(1, 1)))
	q, err := NewQuerier(blk, nil, math.MinInt64, math.MaxInt64, Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer q.Close()
	all := labels.MustNewMatcher(labels.MatchRegexp, "__name__", ".+")
	for _, bc := range []struct {
		name string
		ctx  func() context.Context
	}{
		{"no-limiter", context.Background},
		{"limiter", func() context.Context {
			return querylimit.With(context.Background(), querylimit.New("bench", 0, math.MaxInt))
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var it chunkenc.Iterator
			for b.Loop() {
				ss := q.Select(bc.ctx(), false, nil, all)
				for ss.Next() {
					it = ss.At().Iterator(it)
					for it.Next() != chunkenc.ValNone {
					}
					if it.Err() != nil {
						b.Fatal(it.Err())
					}
				}
			}
		})
	}
}
