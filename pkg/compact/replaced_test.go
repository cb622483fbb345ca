package compact_test

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/tsdb"

	"github.com/gpustore/gpustore/pkg/storage/bucketstore"
)

// TestDoubleCompactionReadersServeWhatStays: two results of the same
// compaction in the bucket (a compactor that compacted again before its
// marks landed, or two that raced) and their sources. The compactor marks
// all but one; the bucket store, which hides replaced blocks until the
// marks' delay has passed, must serve that one, before the marked blocks
// are deleted and after: the block the compactor keeps is the block readers
// read, so a query never reads a block that is about to go.
func TestDoubleCompactionReadersServeWhatStays(t *testing.T) {
	store := startStore(t)
	bkt := openBucket(t, store)
	const tenant = "double"
	start := time.UnixMilli(1_767_225_600_000) // an 8h boundary
	tmp := t.TempDir()
	srcs := smallBlocks(t, filepath.Join(tmp, "src"), start, 2)
	upload(t, bkt, tenant, nil, srcs...)
	// The same two blocks compacted twice, as the TSDB's compactor does it.
	out := filepath.Join(tmp, "out")
	lc, err := tsdb.NewLeveledCompactor(context.Background(), nil, quiet(), []int64{2 * 3_600_000, 8 * 3_600_000}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var results []string
	for range 2 {
		ids, err := lc.Compact(out, srcs, nil)
		if err != nil || len(ids) != 1 {
			t.Fatalf("compact: %v %v", ids, err)
		}
		results = append(results, filepath.Join(out, ids[0].String()))
	}
	upload(t, bkt, tenant, nil, results...)

	served := func() []ulid.ULID {
		t.Helper()
		cfg := bucketstore.DefaultConfig() // marked blocks stay readable for a minute
		s, err := bucketstore.New(cfg, bkt, quiet(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.SyncTenant(context.Background(), tenant); err != nil {
			t.Fatal(err)
		}
		var ids []ulid.ULID
		for _, m := range s.Blocks(tenant) {
			ids = append(ids, m.ULID)
		}
		return ids
	}
	c, _ := newCompactor(t, testConfig(), bkt, nil)
	if err := c.CompactTenant(context.Background(), tenant); err != nil {
		t.Fatal(err)
	}
	st := readBucket(t, bkt, tenant)
	if len(st.live) != 1 || len(st.marked) != 3 {
		t.Fatalf("after the pass: live %s, marked %v; want one of the two results live, the rest marked", st.spans(), st.marked)
	}
	kept := st.live[0].ULID
	before := served()
	if !slices.Equal(before, []ulid.ULID{kept}) {
		t.Fatalf("readers serve %v while the compactor keeps %s (and marked %v for deletion)", before, kept, st.marked)
	}
	// The next pass deletes the marked blocks (DeleteDelay 0): what readers
	// serve does not change.
	if err := c.CompactTenant(context.Background(), tenant); err != nil {
		t.Fatal(err)
	}
	if after := served(); !slices.Equal(after, before) {
		t.Fatalf("readers served %v, then %v once the marked blocks were deleted", before, after)
	}
}
