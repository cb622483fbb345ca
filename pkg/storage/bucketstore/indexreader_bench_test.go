package bucketstore

import (
	"context"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/tsdb/index"
	"github.com/thanos-io/objstore"
)

// BenchmarkIndexReader: what a select asks of a bucket block's index, with
// the block's pages cached (the header loaded once): the postings of a
// dashboard's matchers, every matching series' labels and chunk metas, and
// a label's values. 64 nodes × 8 GPUs × 3 DCGM metrics.
func BenchmarkIndexReader(b *testing.B) {
	bkt := objstore.NewInMemBucket()
	dir := writeBlock(b, b.TempDir(), testSeries(64), 0, 2*3_600_000, 60_000)
	meta := uploadBlock(b, bkt, "t", dir)
	blk, err := newBucketBlock(bkt, NewPageCache(32<<10, 256<<20), 4, &meta)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	ms := []*labels.Matcher{
		labels.MustNewMatcher(labels.MatchEqual, "__name__", "DCGM_FI_DEV_GPU_UTIL"),
		labels.MustNewMatcher(labels.MatchRegexp, "Hostname", "node-0[0-3].*"),
		labels.MustNewMatcher(labels.MatchNotEqual, "gpu", "7"),
	}
	var (
		sb   labels.ScratchBuilder
		chks []chunks.Meta
	)
	for b.Loop() {
		ir, err := newView(ctx, blk, 0, 2*3_600_000).Index()
		if err != nil {
			b.Fatal(err)
		}
		p, err := tsdb.PostingsForMatchers(ctx, ir, ms...)
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for p = ir.SortedPostings(p); p.Next(); n++ {
			if err := ir.Series(p.At(), &sb, &chks); err != nil {
				b.Fatal(err)
			}
		}
		if p.Err() != nil || n != 40*7 {
			b.Fatalf("%d series, %v", n, p.Err())
		}
		if vs, err := ir.SortedLabelValues(ctx, "UUID", nil); err != nil || len(vs) != 64*8 {
			b.Fatalf("%d values, %v", len(vs), err)
		}
		name, value := index.AllPostingsKey()
		if _, err := ir.Postings(ctx, name, value); err != nil {
			b.Fatal(err)
		}
	}
}
