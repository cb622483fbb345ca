package block

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/thanos-io/objstore"

	"github.com/gpustore/gpustore/pkg/storage/bucket"
)

// snapshot is the content of a block's files.
func snapshot(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	files, err := LocalFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(f.RelPath)))
		if err != nil {
			t.Fatal(err)
		}
		out[f.RelPath] = b
	}
	return out
}

// TestFolderBucketStoresABlockOnce: a block uploaded into the embedded
// folder bucket from the same disk shares its files with the local block
// (hard links: one copy on disk while both exist), a re-upload leaves the
// local files whole, the bucket's copy outlives the local block, and a
// failed link falls back to a copy without truncating the local file it
// may already be a link of.
func TestFolderBucketStoresABlockOnce(t *testing.T) {
	ctx := context.Background()
	data := t.TempDir()
	bkt, err := bucket.New(bucket.DefaultConfig(), data, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := bkt.(Linker); !ok {
		t.Fatalf("the embedded folder bucket (%T) does not take files by link", bkt)
	}
	dir, meta := writeLocalBlock(t, "t")
	want := snapshot(t, dir)
	inBucket := func(rel string) string {
		return filepath.Join(data, bucket.DefaultDirName, filepath.FromSlash(ObjectName("t", meta.ULID, rel)))
	}
	check := func(when string, shared bool) {
		t.Helper()
		for rel, b := range want {
			local, err1 := os.Stat(filepath.Join(dir, filepath.FromSlash(rel)))
			remote, err2 := os.Stat(inBucket(rel))
			if err1 != nil || err2 != nil {
				t.Fatalf("%s: %s: %v %v", when, rel, err1, err2)
			}
			if os.SameFile(local, remote) != shared {
				t.Errorf("%s: %s shared by the local block and the bucket: %v, want %v", when, rel, !shared, shared)
			}
			if got := snapshot(t, dir)[rel]; !bytes.Equal(got, b) {
				t.Fatalf("%s: local %s changed: %d bytes, was %d", when, rel, len(got), len(b))
			}
			rc, err := bkt.Get(ctx, ObjectName("t", meta.ULID, rel))
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(rc)
			rc.Close()
			if !bytes.Equal(got, b) {
				t.Fatalf("%s: %s in the bucket differs from the block's", when, rel)
			}
		}
	}
	if err := Upload(ctx, bkt, dir, meta); err != nil {
		t.Fatal(err)
	}
	check("uploaded", true)
	if lm, bm := mustStat(t, filepath.Join(dir, MetaFilename)), mustStat(t, inBucket(MetaFilename)); os.SameFile(lm, bm) {
		t.Error("meta.json is shared: the bucket's is gpustore's own and must be a file of its own")
	}
	if err := Upload(ctx, bkt, dir, meta); err != nil { // a retry after a crash
		t.Fatal(err)
	}
	check("uploaded again", true)

	// A link that fails after an earlier attempt left one in place: the
	// copy goes into a new file.
	if err := Upload(ctx, failingLinker{bkt}, dir, meta); err != nil {
		t.Fatal(err)
	}
	check("copied over a link", false)

	if err := Upload(ctx, bkt, dir, meta); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil { // local retention
		t.Fatal(err)
	}
	for rel, b := range want {
		got, err := os.ReadFile(inBucket(rel))
		if err != nil || !bytes.Equal(got, b) {
			t.Fatalf("%s in the bucket after the local block went: %v", rel, err)
		}
	}
}

func mustStat(t *testing.T, p string) os.FileInfo {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi
}

// failingLinker links as the folder bucket does, then reports a failure
// (as a link to another filesystem would, after a crashed attempt left a
// link at the name).
type failingLinker struct{ objstore.InstrumentedBucket }

func (b failingLinker) Link(src, name string) error {
	if err := b.InstrumentedBucket.(Linker).Link(src, name); err != nil {
		return err
	}
	return errors.New("injected link failure")
}
