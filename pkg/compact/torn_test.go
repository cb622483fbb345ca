package compact_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/storage/bucketindex"
)

// TestTornFilesAffectOneBlock: in the folder bucket (the embedded default),
// files truncated as a power cut leaves them on a filesystem without the
// bucket's durable writes: an empty deletion mark, a no-compact mark cut
// short, a meta.json cut in half. Each is a fault of its block only: the
// pass goes on and compacts the others, writes the bucket index, and a
// deletion mark that does not parse counts as absent (the block is marked
// again as the pass sees fit), a no-compact mark as present, a meta.json
// as a corrupt block left alone, which compacts once a whole meta.json is
// uploaded again (a receiver's shipper does that, see pkg/storage/shipper).
func TestTornFilesAffectOneBlock(t *testing.T) {
	store := testStore{dir: t.TempDir()} // files to truncate
	bkt := openBucket(t, store)
	start := time.UnixMilli(1_767_225_600_000)
	dirs := smallBlocks(t, t.TempDir(), start, 5) // four of [0,8h), one after
	metas := upload(t, bkt, "torn", nil, dirs...)
	id := func(i int) string { return metas[i].ULID.String() }
	file := func(i int, name string) string { return filepath.Join(store.dir, "torn", id(i), name) }
	ctx := context.Background()
	if err := block.WriteDeletionMark(ctx, bkt, "torn", metas[0].ULID, "retention 1d", time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := block.WriteNoCompactMark(ctx, bkt, "torn", metas[1].ULID, "block-read-failure", "x", time.Now()); err != nil {
		t.Fatal(err)
	}
	metaJSON, err := os.ReadFile(file(2, block.MetaFilename))
	if err != nil {
		t.Fatal(err)
	}
	for f, size := range map[string]int64{
		file(0, block.DeletionMarkFilename):  0,
		file(1, block.NoCompactMarkFilename): 20,
		file(2, block.MetaFilename):          int64(len(metaJSON) / 2),
	} {
		if err := os.Truncate(f, size); err != nil {
			t.Fatal(err)
		}
	}

	c, _ := newCompactor(t, testConfig(), bkt, nil)
	if err := c.CompactTenant(ctx, "torn"); err != nil {
		t.Fatalf("a pass over the tenant with torn files failed: %v", err)
	}
	st := readBucket(t, bkt, "torn")
	// Blocks 0 (its torn deletion mark counts as absent) and 3 are
	// compacted into one; 1 (no-compact) and 2 (corrupt) stay, unmarked.
	var compacted []string
	for _, m := range st.live {
		if len(m.Compaction.Sources) > 1 {
			for _, s := range m.Compaction.Sources {
				compacted = append(compacted, s.String())
			}
		}
	}
	slices.Sort(compacted)
	if want := []string{id(0), id(3)}; !slices.Equal(compacted, want) {
		t.Errorf("compacted %v, want blocks 0 and 3 %v (%s)", compacted, want, st.spans())
	}
	if m, err := block.ReadDeletionMark(ctx, bkt, "torn", metas[0].ULID); err != nil || m == nil {
		t.Errorf("block 0's deletion mark after the pass: %+v, %v; want a whole mark (compacted)", m, err)
	}
	if _, err := os.Stat(file(2, block.NoCompactMarkFilename)); !os.IsNotExist(err) {
		t.Errorf("the block with a torn meta.json got a no-compact mark (%v): it would never compact once its meta.json is whole", err)
	}
	x, err := bucketindex.Read(ctx, bkt, "torn")
	if err != nil {
		t.Fatalf("bucket index after the pass: %v", err)
	}
	if len(x.Corrupted) != 1 || x.Corrupted[0] != metas[2].ULID {
		t.Errorf("index lists corrupted %v, want block 2", x.Corrupted)
	}
	if nc := x.NoCompactMarkMap(); nc[metas[1].ULID] == nil {
		t.Errorf("index lists no-compact marks %v, want block 1's (torn, but there)", x.NoCompactMarks)
	}

	// meta.json uploaded again whole: block 2 compacts with the others.
	if err := os.WriteFile(file(2, block.MetaFilename), metaJSON, 0o644); err != nil {
		t.Fatal(err)
	}
	st = compactUntilStable(t, c, bkt, "torn")
	for _, m := range st.live {
		if slices.Contains(m.Compaction.Sources, metas[2].ULID) && len(m.Compaction.Sources) > 1 {
			return
		}
	}
	t.Errorf("block 2 not compacted once its meta.json was whole: %s", st.spans())
}
