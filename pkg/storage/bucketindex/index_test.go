package bucketindex

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/thanos-io/objstore"
	"github.com/thanos-io/objstore/providers/filesystem"

	"github.com/gpustore/gpustore/pkg/block"
)

// testMeta is the meta.json of a block of tenant covering [mint, maxt) made of sources.
func testMeta(tenant string, id ulid.ULID, mint, maxt int64, sources ...ulid.ULID) *block.Meta {
	if len(sources) == 0 {
		sources = []ulid.ULID{id}
	}
	m := &block.Meta{
		BlockMeta: tsdb.BlockMeta{ULID: id, MinTime: mint, MaxTime: maxt, Version: 1,
			Compaction: tsdb.BlockMetaCompaction{Level: 1, Sources: sources}},
		GPUStore: block.GPUStoreMeta{Version: block.MetaVersion, Tenant: tenant, Labels: map[string]string{},
			Source: block.SourceReceive, Files: []block.File{{RelPath: "chunks/000001", SizeBytes: 10}, {RelPath: "index", SizeBytes: 20}}},
	}
	if len(sources) > 1 {
		m.Compaction.Level = 2
	}
	return m
}

// putBlock writes a block's objects (fake chunks and index, then meta.json).
func putBlock(t *testing.T, bkt objstore.Bucket, m *block.Meta) {
	t.Helper()
	ctx := context.Background()
	for _, f := range m.GPUStore.Files {
		if err := bkt.Upload(ctx, block.ObjectName(m.GPUStore.Tenant, m.ULID, f.RelPath), strings.NewReader("x")); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := json.Marshal(m)
	if err := bkt.Upload(ctx, block.ObjectName(m.GPUStore.Tenant, m.ULID, block.MetaFilename), bytes.NewReader(b)); err != nil {
		t.Fatal(err)
	}
}

func id(n uint64) ulid.ULID { return ulid.MustNew(n, bytes.NewReader(make([]byte, 16))) }

func buckets(t *testing.T) map[string]objstore.Bucket {
	fs, err := filesystem.NewBucket(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return map[string]objstore.Bucket{"inmem": objstore.NewInMemBucket(), "filesystem": fs}
}

func TestUpdateListsCompleteBlocksAndMarks(t *testing.T) {
	for name, bkt := range buckets(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			now := time.Unix(1_700_000_000, 0)
			a, b, c := testMeta("t1", id(3), 200, 300), testMeta("t1", id(1), 0, 100), testMeta("t1", id(2), 100, 200)
			for _, m := range []*block.Meta{a, b, c} {
				putBlock(t, bkt, m)
			}
			// Another tenant's block is not listed.
			putBlock(t, bkt, testMeta("t2", id(9), 0, 100))
			// A partial upload: chunks without meta.json.
			if err := bkt.Upload(ctx, block.ObjectName("t1", id(4), "chunks/000001"), strings.NewReader("x")); err != nil {
				t.Fatal(err)
			}
			// A corrupted meta.json.
			if err := bkt.Upload(ctx, block.ObjectName("t1", id(5), block.MetaFilename), strings.NewReader("{not json")); err != nil {
				t.Fatal(err)
			}
			if err := block.WriteDeletionMark(ctx, bkt, "t1", b.ULID, "compacted", now); err != nil {
				t.Fatal(err)
			}
			if err := block.WriteNoCompactMark(ctx, bkt, "t1", c.ULID, "index-read-failure", "boom", now); err != nil {
				t.Fatal(err)
			}
			before := time.Now().Unix()
			x, err := Update(ctx, bkt, "t1", nil)
			if err != nil {
				t.Fatal(err)
			}
			var got []ulid.ULID
			for _, m := range x.Blocks {
				got = append(got, m.ULID)
			}
			if want := []ulid.ULID{b.ULID, c.ULID, a.ULID}; !reflect.DeepEqual(got, want) {
				t.Fatalf("blocks %v, want %v (by MinTime)", got, want)
			}
			if len(x.DeletionMarks) != 1 || x.DeletionMarks[0].ID != b.ULID || x.DeletionMarks[0].DeletionTime != now.Unix() {
				t.Fatalf("deletion marks %+v", x.DeletionMarks)
			}
			if len(x.NoCompactMarks) != 1 || x.NoCompactMarks[0].ID != c.ULID || x.NoCompactMarks[0].Reason != "index-read-failure" {
				t.Fatalf("no-compact marks %+v", x.NoCompactMarks)
			}
			if !reflect.DeepEqual(x.Partial, []ulid.ULID{id(4)}) || !reflect.DeepEqual(x.Corrupted, []ulid.ULID{id(5)}) {
				t.Fatalf("partial %v corrupted %v", x.Partial, x.Corrupted)
			}
			if x.UpdatedAt < before || x.UpdatedAt > time.Now().Unix() || x.Tenant != "t1" {
				t.Fatalf("updated_at %d tenant %q", x.UpdatedAt, x.Tenant)
			}

			if _, err := Read(ctx, bkt, "t1"); !errors.Is(err, ErrNotFound) {
				t.Fatalf("read before write: %v", err)
			}
			if err := Write(ctx, bkt, x); err != nil {
				t.Fatal(err)
			}
			r, err := Read(ctx, bkt, "t1")
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(r, x) {
				t.Fatalf("read back differs:\n%+v\n%+v", r, x)
			}
			// The index object itself is not taken for a block.
			x2, err := Update(ctx, bkt, "t1", r)
			if err != nil {
				t.Fatal(err)
			}
			x2.UpdatedAt = x.UpdatedAt
			if !reflect.DeepEqual(x2, x) {
				t.Fatalf("update over an unchanged bucket differs:\n%+v\n%+v", x2, x)
			}
		})
	}
}

// countingBucket counts GETs per object.
type countingBucket struct {
	objstore.Bucket
	mtx  sync.Mutex
	gets map[string]int
	fail func(name string) error
}

func (b *countingBucket) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	b.mtx.Lock()
	b.gets[name]++
	fail := b.fail
	b.mtx.Unlock()
	if fail != nil {
		if err := fail(name); err != nil {
			return nil, err
		}
	}
	return b.Bucket.Get(ctx, name)
}

func (b *countingBucket) reset() map[string]int {
	b.mtx.Lock()
	defer b.mtx.Unlock()
	g := b.gets
	b.gets = map[string]int{}
	return g
}

func TestUpdateReadsOnlyWhatIsNew(t *testing.T) {
	ctx := context.Background()
	bkt := &countingBucket{Bucket: objstore.NewInMemBucket(), gets: map[string]int{}}
	var metas []*block.Meta
	for i := uint64(1); i <= 50; i++ {
		m := testMeta("t", id(i), int64(i)*100, int64(i+1)*100)
		putBlock(t, bkt, m)
		metas = append(metas, m)
	}
	if err := block.WriteDeletionMark(ctx, bkt, "t", metas[0].ULID, "retention", time.Unix(1000, 0)); err != nil {
		t.Fatal(err)
	}
	old, err := Update(ctx, bkt, "t", nil)
	if err != nil {
		t.Fatal(err)
	}
	if g := bkt.reset(); len(g) != 51 {
		t.Fatalf("first build read %d objects, want 50 meta.json and 1 mark: %v", len(g), g)
	}

	// One block added, one deleted, one newly marked.
	added := testMeta("t", id(100), 9000, 9100)
	putBlock(t, bkt, added)
	for _, f := range []string{"chunks/000001", "index", block.MetaFilename} {
		if err := bkt.Delete(ctx, block.ObjectName("t", metas[1].ULID, f)); err != nil {
			t.Fatal(err)
		}
	}
	if err := block.WriteDeletionMark(ctx, bkt, "t", metas[2].ULID, "compacted", time.Unix(2000, 0)); err != nil {
		t.Fatal(err)
	}
	bkt.reset()
	x, err := Update(ctx, bkt, "t", old)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{
		block.ObjectName("t", added.ULID, block.MetaFilename):            1,
		block.ObjectName("t", metas[2].ULID, block.DeletionMarkFilename): 1,
	}
	if g := bkt.reset(); !reflect.DeepEqual(g, want) {
		t.Fatalf("incremental update read %v, want only %v", g, want)
	}
	if len(x.Blocks) != 50 || x.Block(metas[1].ULID) != nil || x.Block(added.ULID) == nil {
		t.Fatalf("blocks after update: %d, deleted present %v, added present %v", len(x.Blocks), x.Block(metas[1].ULID) != nil, x.Block(added.ULID) != nil)
	}
	dm := x.DeletionMarkMap()
	if len(dm) != 2 || dm[metas[0].ULID].DeletionTime != 1000 || dm[metas[2].ULID].DeletionTime != 2000 {
		t.Fatalf("deletion marks %v", dm)
	}
	// old is untouched.
	if len(old.Blocks) != 50 || old.Block(metas[1].ULID) == nil || len(old.DeletionMarks) != 1 {
		t.Fatal("Update modified the old index")
	}
}

func TestUpdateFailsRatherThanDropABlock(t *testing.T) {
	ctx := context.Background()
	bkt := &countingBucket{Bucket: objstore.NewInMemBucket(), gets: map[string]int{}}
	m := testMeta("t", id(1), 0, 100)
	putBlock(t, bkt, m)
	bkt.fail = func(name string) error {
		if strings.HasSuffix(name, block.MetaFilename) {
			return errors.New("503 slow down")
		}
		return nil
	}
	if x, err := Update(ctx, bkt, "t", nil); err == nil || !strings.Contains(err.Error(), "503 slow down") {
		t.Fatalf("update with an unreadable meta.json: index %+v, err %v", x, err)
	}
	// With the block already indexed, nothing needs to be read.
	bkt.fail = nil
	old, err := Update(ctx, bkt, "t", nil)
	if err != nil {
		t.Fatal(err)
	}
	bkt.fail = func(string) error { return errors.New("503 slow down") }
	x, err := Update(ctx, bkt, "t", old)
	if err != nil || len(x.Blocks) != 1 {
		t.Fatalf("update of an indexed block: %+v %v", x, err)
	}
}

func TestReadRejectsBadIndexes(t *testing.T) {
	ctx := context.Background()
	bkt := objstore.NewInMemBucket()
	if err := bkt.Upload(ctx, ObjectName("t"), strings.NewReader("not gzip")); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(ctx, bkt, "t"); err == nil || errors.Is(err, ErrNotFound) {
		t.Fatalf("garbage index: %v", err)
	}
	// An index written for another tenant (copied by hand) is refused.
	x := &Index{Version: Version, Tenant: "other", Blocks: []*block.Meta{testMeta("other", id(1), 0, 1)}}
	if err := Write(ctx, bkt, x); err != nil {
		t.Fatal(err)
	}
	if err := bkt.Upload(ctx, ObjectName("t"), mustGet(t, bkt, ObjectName("other"))); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(ctx, bkt, "t"); err == nil || !strings.Contains(err.Error(), "names tenant") {
		t.Fatalf("other tenant's index: %v", err)
	}
	x.Version = Version + 1
	if err := Write(ctx, bkt, x); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(ctx, bkt, "other"); err == nil || !strings.Contains(err.Error(), "version") {
		t.Fatalf("future version: %v", err)
	}
}

func mustGet(t *testing.T, bkt objstore.Bucket, name string) io.Reader {
	t.Helper()
	rc, err := bkt.Get(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.NewReader(b)
}

func TestReplaced(t *testing.T) {
	a1, a2, a3, a4 := testMeta("t", id(1), 0, 10), testMeta("t", id(2), 10, 20), testMeta("t", id(3), 20, 30), testMeta("t", id(4), 30, 40)
	// c is a1+a2; d is c+a3 (its sources are the level-1 blocks, as the TSDB's compactor writes them).
	c := testMeta("t", id(10), 0, 20, a1.ULID, a2.ULID)
	c.Compaction.Parents = []tsdb.BlockDesc{{ULID: a1.ULID}, {ULID: a2.ULID}}
	d := testMeta("t", id(11), 0, 30, a1.ULID, a2.ULID, a3.ULID)
	d.Compaction.Parents = []tsdb.BlockDesc{{ULID: c.ULID}, {ULID: a3.ULID}}
	// A second compaction of a1+a2 (a compactor that crashed before marking and ran again).
	c2 := testMeta("t", id(12), 0, 20, a1.ULID, a2.ULID)
	// A downsampled block of a4 does not replace the raw one.
	ds := testMeta("t", id(13), 30, 40, a4.ULID)
	ds.GPUStore.Downsample.Resolution = 300_000

	got := Replaced([]*block.Meta{a1, a2, a3, a4, c, c2})
	want := map[ulid.ULID]ulid.ULID{a1.ULID: c.ULID, a2.ULID: c.ULID, c.ULID: c2.ULID}
	// a1 and a2 may be reported as replaced by c or c2: both hold them.
	for k, v := range got {
		if (k == a1.ULID || k == a2.ULID) && v == c2.ULID {
			got[k] = c.ULID
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("replaced %v, want %v", got, want)
	}
	got = Replaced([]*block.Meta{a1, a2, a3, a4, c, d, ds})
	for _, r := range []ulid.ULID{a1.ULID, a2.ULID, a3.ULID, c.ULID} {
		if got[r] != d.ULID && !(got[r] == c.ULID && r != c.ULID) {
			t.Fatalf("%s replaced by %s, want %s (or c for a1/a2)", r, got[r], d.ULID)
		}
	}
	for _, keep := range []ulid.ULID{d.ULID, a4.ULID, ds.ULID} {
		if _, ok := got[keep]; ok {
			t.Fatalf("%s replaced, must stay: %v", keep, got)
		}
	}
	// A child whose sources omit a parent still replaces it.
	p := testMeta("t", id(20), 50, 60)
	p.Compaction.Sources = []ulid.ULID{id(99)}
	ch := testMeta("t", id(21), 50, 70, id(98))
	ch.Compaction.Parents = []tsdb.BlockDesc{{ULID: p.ULID}}
	if got := Replaced([]*block.Meta{p, ch}); got[p.ULID] != ch.ULID || len(got) != 1 {
		t.Fatalf("parent rule: %v", got)
	}
	// A block of another group (other external labels) replaces nothing,
	// whatever its sources or parents.
	other := testMeta("t", id(30), 0, 20, a1.ULID, a2.ULID)
	other.GPUStore.Labels = map[string]string{"replica": "b"}
	other.Compaction.Parents = []tsdb.BlockDesc{{ULID: c.ULID}}
	if got := Replaced([]*block.Meta{a1, a2, c, other}); got[c.ULID] != (ulid.ULID{}) || got[other.ULID] != (ulid.ULID{}) || got[a1.ULID] != c.ULID {
		t.Fatalf("across groups: %v", got)
	}
}

func TestWithUnindexedSeesNewAndDeletedBlocks(t *testing.T) {
	ctx := context.Background()
	bkt := &countingBucket{Bucket: objstore.NewInMemBucket(), gets: map[string]int{}}
	a, b := testMeta("t", id(1), 0, 100), testMeta("t", id(2), 100, 200)
	putBlock(t, bkt, a)
	putBlock(t, bkt, b)
	x, err := Update(ctx, bkt, "t", nil)
	if err != nil {
		t.Fatal(err)
	}
	// Since the index was written: b deleted, c uploaded and marked, d partial.
	for _, f := range []string{"chunks/000001", "index", block.MetaFilename} {
		if err := bkt.Delete(ctx, block.ObjectName("t", b.ULID, f)); err != nil {
			t.Fatal(err)
		}
	}
	c := testMeta("t", id(3), 200, 300)
	putBlock(t, bkt, c)
	if err := block.WriteDeletionMark(ctx, bkt, "t", c.ULID, "retention", time.Unix(5, 0)); err != nil {
		t.Fatal(err)
	}
	if err := bkt.Upload(ctx, block.ObjectName("t", id(4), "index"), strings.NewReader("x")); err != nil {
		t.Fatal(err)
	}
	bkt.reset()
	got, err := WithUnindexed(ctx, bkt, x, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Blocks) != 2 || got.Block(a.ULID) == nil || got.Block(c.ULID) == nil || got.Block(b.ULID) != nil {
		t.Fatalf("blocks %v", got.Blocks)
	}
	if dm := got.DeletionMarkMap(); len(dm) != 1 || dm[c.ULID] == nil {
		t.Fatalf("deletion marks %v", dm)
	}
	if !reflect.DeepEqual(got.Partial, []ulid.ULID{id(4)}) || got.UpdatedAt != x.UpdatedAt {
		t.Fatalf("partial %v updated_at %d", got.Partial, got.UpdatedAt)
	}
	// Nothing of the indexed block a was read.
	for name := range bkt.reset() {
		if strings.Contains(name, a.ULID.String()) {
			t.Fatalf("read %s of an indexed block", name)
		}
	}
	// With the previous view, the unindexed block is not read again.
	if _, err := WithUnindexed(ctx, bkt, x, got); err != nil {
		t.Fatal(err)
	}
	if g := bkt.reset(); g[block.ObjectName("t", c.ULID, block.MetaFilename)] != 0 || g[block.ObjectName("t", c.ULID, block.DeletionMarkFilename)] != 0 {
		t.Fatalf("known unindexed block read again: %v", g)
	}
}
