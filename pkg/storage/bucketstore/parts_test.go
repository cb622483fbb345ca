package bucketstore

import (
	"context"
	"fmt"
	"testing"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/thanos-io/objstore"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/readopts"
)

// A compacted block whose sources the caller partly serves itself (the
// receiver keeps its shipped blocks for hours): the store reads the block
// only over the other sources' time, so the recent hours are not read
// twice; without recorded source ranges it reads the whole block.
func TestCompactedBlockReadOnlyWhereItsSourcesAreNotLocal(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	series := testSeries(1)
	var srcs []string
	var ranges []block.SourceRange
	for h := int64(0); h < 3; h++ {
		d := writeBlock(t, dir, series, h*60*minute, (h+1)*60*minute, 30_000)
		srcs = append(srcs, d)
		m, err := block.ReadLocalMeta(d)
		if err != nil {
			t.Fatal(err)
		}
		ranges = append(ranges, block.SourceRange{ULID: m.ULID, MinTime: m.MinTime, MaxTime: m.MaxTime})
	}
	compacted := compactBlocks(t, t.TempDir(), srcs...)
	bkt := objstore.NewInMemBucket()
	bm, err := block.ReadLocalMeta(compacted)
	if err != nil {
		t.Fatal(err)
	}
	upload := func(withRanges bool) {
		meta := block.Meta{BlockMeta: bm, GPUStore: block.GPUStoreMeta{
			Version: block.MetaVersion, Tenant: "t", Labels: map[string]string{}, Source: block.SourceCompactor,
		}}
		if withRanges {
			meta.GPUStore.SourceRanges = ranges
		}
		if err := block.Upload(ctx, bkt, compacted, meta); err != nil {
			t.Fatal(err)
		}
	}
	localOf := func(ids ...ulid.ULID) func(ulid.ULID) bool {
		return func(id ulid.ULID) bool {
			for _, l := range ids {
				if l == id {
					return true
				}
			}
			return false
		}
	}
	perHour := 120 * len(series) // a sample every 30 s
	for _, tc := range []struct {
		name    string
		ranges  bool
		local   []ulid.ULID
		samples int // read from the bucket over the 3 hours
	}{
		{"no local blocks", true, nil, 3 * perHour},
		{"last two hours local", true, []ulid.ULID{ranges[1].ULID, ranges[2].ULID}, perHour},
		{"middle hour local: the span around it", true, []ulid.ULID{ranges[1].ULID}, 3 * perHour},
		{"first hour local", true, []ulid.ULID{ranges[0].ULID}, 2 * perHour},
		{"all sources local", true, []ulid.ULID{ranges[0].ULID, ranges[1].ULID, ranges[2].ULID}, 0},
		{"the block itself local", true, []ulid.ULID{bm.ULID}, 0},
		{"sources unknown: whole block", false, []ulid.ULID{ranges[1].ULID, ranges[2].ULID}, 3 * perHour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			upload(tc.ranges)
			s := storeWith(t, bkt, nil, nil)
			q := mustQuerier(t, s, "t", 0, 3*60*minute, localOf(tc.local...))
			got, err := samples(q.Select(ctx, true, nil, labels.MustNewMatcher(labels.MatchRegexp, "__name__", ".+")))
			if err != nil {
				t.Fatal(err)
			}
			q.Close()
			if got != tc.samples {
				t.Errorf("read %d samples from the bucket, want %d", got, tc.samples)
			}
			o := readopts.Default()
			o.LocalBlocks = localOf(tc.local...)
			cq, err := s.ChunkQuerier("t", 0, 3*60*minute, o)
			if err != nil {
				t.Fatal(err)
			}
			if noop := cq == storage.NoopChunkedQuerier(); noop != (tc.samples == 0) {
				t.Errorf("chunk querier: %v, want a no-op one only when nothing is left to read", cq)
			}
		})
	}
	if got := fmt.Sprint((&block.Meta{BlockMeta: bm}).Sources()); got != "[]" {
		t.Errorf("sources of a compacted block without recorded ranges: %s, want none", got)
	}
}
