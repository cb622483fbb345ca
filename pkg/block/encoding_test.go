package block

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/thanos-io/objstore/providers/filesystem"
)

// TestEncodedUploadDownloadsAlike: a block uploaded zstd-encoded has its
// files as <rel>.zst objects (no plain object an older reader could
// misread), meta.json records each file's encoding, decoded and stored
// size, and DownloadFile gives back the TSDB's bytes exactly; a torn or
// missing encoded object is the block's fault (the compactor marks it), not
// a retryable bucket error.
func TestEncodedUploadDownloadsAlike(t *testing.T) {
	ctx := context.Background()
	dir, meta := writeLocalBlock(t, "t")
	bkt, err := filesystem.NewBucket(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := UploadEncoded(ctx, bkt, dir, &meta, EncodingZstd); err != nil {
		t.Fatal(err)
	}
	got, err := ReadMeta(ctx, bkt, "t", meta.ULID)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.GPUStore.Files) != 2 {
		t.Fatalf("files %+v, want a chunk segment and the index", got.GPUStore.Files)
	}
	bad := errors.New("unreadable")
	for _, f := range got.GPUStore.Files {
		plain, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(f.RelPath)))
		if err != nil {
			t.Fatal(err)
		}
		if f.Encoding != EncodingZstd || f.SizeBytes != int64(len(plain)) || f.StoredBytes <= 0 || f.StoredBytes >= f.SizeBytes {
			t.Errorf("%s recorded as %+v, want zstd, %d bytes decoded, fewer stored", f.RelPath, f, len(plain))
		}
		if ok, _ := bkt.Exists(ctx, ObjectName("t", meta.ULID, f.RelPath)); ok {
			t.Errorf("plain object %s uploaded beside the encoded one", f.RelPath)
		}
		name := ObjectName("t", meta.ULID, f.ObjectRel())
		dst := filepath.Join(t.TempDir(), "out")
		if err := DownloadFile(ctx, bkt, name, dst, f, bad); err != nil {
			t.Fatal(err)
		}
		if back, _ := os.ReadFile(dst); !bytes.Equal(back, plain) {
			t.Errorf("%s decodes to %d bytes unlike the %d the TSDB wrote", f.RelPath, len(back), len(plain))
		}

		// Torn: the object cut short.
		rc, err := bkt.Get(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		obj := new(bytes.Buffer)
		_, _ = obj.ReadFrom(rc)
		rc.Close()
		if err := bkt.Upload(ctx, name, bytes.NewReader(obj.Bytes()[:obj.Len()/2])); err != nil {
			t.Fatal(err)
		}
		if err := DownloadFile(ctx, bkt, name, dst, f, bad); !errors.Is(err, bad) {
			t.Errorf("%s torn: %v, want the block's fault", f.RelPath, err)
		}
		// Missing.
		if err := bkt.Delete(ctx, name); err != nil {
			t.Fatal(err)
		}
		if err := DownloadFile(ctx, bkt, name, dst, f, bad); !errors.Is(err, bad) || !strings.Contains(err.Error(), "missing") {
			t.Errorf("%s missing: %v, want the block's fault", f.RelPath, err)
		}
	}
	if _, err := ParseEncoding("gzip"); err == nil {
		t.Error("encoding gzip accepted")
	}
}
