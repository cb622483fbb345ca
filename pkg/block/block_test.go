package block

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/thanos-io/objstore"
	"github.com/thanos-io/objstore/providers/filesystem"
)

// writeLocalBlock cuts a real TSDB block of a few series into a new
// directory and returns the block's directory and the meta gpustore would
// ship it with.
func writeLocalBlock(t *testing.T, tenant string) (string, Meta) {
	t.Helper()
	parent := t.TempDir()
	w, err := tsdb.NewBlockWriter(slog.New(slog.DiscardHandler), parent, int64(2*time.Hour/time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	app := w.Appender(context.Background())
	for gpu := range 8 {
		ls := labels.FromStrings("__name__", "DCGM_FI_DEV_GPU_TEMP", "gpu", strconv.Itoa(gpu))
		for i := range 120 {
			if _, err := app.Append(0, ls, int64(i)*15_000, float64(40+gpu+i%7)); err != nil {
				t.Fatal(err)
			}
		}
	}
	return flushLocalBlock(t, w, app, parent, tenant)
}

// flushLocalBlock commits app, writes w's block under parent and returns
// its directory and the meta a receiver of tenant would ship it with.
func flushLocalBlock(t testing.TB, w *tsdb.BlockWriter, app storage.Appender, parent, tenant string) (string, Meta) {
	t.Helper()
	if err := app.Commit(); err != nil {
		t.Fatal(err)
	}
	id, err := w.Flush(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(parent, id.String())
	bm, err := ReadLocalMeta(dir)
	if err != nil {
		t.Fatal(err)
	}
	return dir, Meta{BlockMeta: bm, GPUStore: GPUStoreMeta{
		Version: MetaVersion, Tenant: tenant, Labels: map[string]string{"receiver": "r0"},
		Source: SourceReceive, Downsample: Downsample{Resolution: ResolutionRaw},
	}}
}

// recordingBucket records the order of uploads and fails the upload of
// names for which failOn returns true.
type recordingBucket struct {
	objstore.Bucket
	failOn func(name string) bool

	mtx     sync.Mutex
	uploads []string
}

func (b *recordingBucket) Upload(ctx context.Context, name string, r io.Reader, opts ...objstore.ObjectUploadOption) error {
	if b.failOn != nil && b.failOn(name) {
		return errors.New("injected upload failure")
	}
	if err := b.Bucket.Upload(ctx, name, r, opts...); err != nil {
		return err
	}
	b.mtx.Lock()
	b.uploads = append(b.uploads, name)
	b.mtx.Unlock()
	return nil
}

// Upload copies every file of the block, meta.json last, and ReadMeta gives
// back what was uploaded, with the sizes of the files as they are on disk.
func TestUploadThenReadMeta(t *testing.T) {
	ctx := context.Background()
	dir, meta := writeLocalBlock(t, "gpu-prod")
	fsb, err := filesystem.NewBucket(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	bkt := &recordingBucket{Bucket: fsb}
	if err := Upload(ctx, bkt, dir, meta); err != nil {
		t.Fatal(err)
	}
	if n := len(bkt.uploads); n < 3 || bkt.uploads[n-1] != ObjectName("gpu-prod", meta.ULID, MetaFilename) {
		t.Fatalf("uploads %v: want chunks and index, then meta.json last", bkt.uploads)
	}
	got, err := ReadMeta(ctx, bkt, "gpu-prod", meta.ULID)
	if err != nil {
		t.Fatal(err)
	}
	if got.ULID != meta.ULID || got.MinTime != meta.MinTime || got.MaxTime != meta.MaxTime ||
		got.Stats.NumSamples != 8*120 || got.GPUStore.Tenant != "gpu-prod" || got.GPUStore.Labels["receiver"] != "r0" ||
		got.GPUStore.Source != SourceReceive {
		t.Fatalf("meta read back = %+v, uploaded %+v", got, meta)
	}
	// Every file but meta.json is listed with its size, and is in the bucket
	// with exactly that size and content.
	local, err := LocalFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.GPUStore.Files) != len(local) || got.Size(IndexFilename) <= 0 || len(got.ChunkSegments()) == 0 {
		t.Fatalf("files in meta.json %+v, on disk %+v", got.GPUStore.Files, local)
	}
	for _, f := range local {
		if got.Size(f.RelPath) != f.SizeBytes {
			t.Errorf("%s: meta.json says %d bytes, disk %d", f.RelPath, got.Size(f.RelPath), f.SizeBytes)
		}
		want, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(f.RelPath)))
		if err != nil {
			t.Fatal(err)
		}
		rc, err := bkt.Get(ctx, ObjectName("gpu-prod", meta.ULID, f.RelPath))
		if err != nil {
			t.Fatal(err)
		}
		have, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || !bytes.Equal(have, want) {
			t.Errorf("%s in the bucket differs from the local file (err %v)", f.RelPath, err)
		}
	}
	// The bucket's block directory parses back to the ULID.
	var dirs []string
	if err := bkt.Iter(ctx, "gpu-prod/", func(name string) error { dirs = append(dirs, name); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(dirs) != 1 {
		t.Fatalf("tenant directory lists %v", dirs)
	}
	if id, ok := ParseDir(dirs[0]); !ok || id != meta.ULID {
		t.Fatalf("ParseDir(%q) = %s, %v", dirs[0], id, ok)
	}
	if _, ok := ParseDir("gpu-prod/not-a-ulid/"); ok {
		t.Error("ParseDir accepted a name that is not a ULID")
	}
}

// An upload that fails at any object leaves no meta.json: readers see a
// partial block (ErrNoMeta) and never read it. Retrying completes it.
func TestFailedUploadIsPartialUntilRetried(t *testing.T) {
	ctx := context.Background()
	dir, meta := writeLocalBlock(t, "t")
	for _, failing := range []string{ChunksDirname + "/", IndexFilename, MetaFilename} {
		t.Run(strings.TrimSuffix(failing, "/"), func(t *testing.T) {
			bkt := &recordingBucket{Bucket: objstore.NewInMemBucket(), failOn: func(name string) bool {
				return strings.Contains(name, "/"+failing)
			}}
			if err := Upload(ctx, bkt, dir, meta); err == nil {
				t.Fatal("upload with a failing object reported success")
			}
			if _, err := ReadMeta(ctx, bkt, "t", meta.ULID); !errors.Is(err, ErrNoMeta) {
				t.Fatalf("ReadMeta of a partial block: %v, want ErrNoMeta", err)
			}
			bkt.failOn = nil
			if err := Upload(ctx, bkt, dir, meta); err != nil {
				t.Fatal(err)
			}
			if _, err := ReadMeta(ctx, bkt, "t", meta.ULID); err != nil {
				t.Fatalf("after a successful retry: %v", err)
			}
		})
	}
}

// meta.json that names another block or another tenant than where it lies
// is rejected: a reader must not serve a tenant another tenant's samples.
func TestReadMetaRejectsMisplacedMeta(t *testing.T) {
	ctx := context.Background()
	dir, meta := writeLocalBlock(t, "team-a")
	bkt := objstore.NewInMemBucket()
	if err := Upload(ctx, bkt, dir, meta); err != nil {
		t.Fatal(err)
	}
	rc, err := bkt.Get(ctx, ObjectName("team-a", meta.ULID, MetaFilename))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	other := ulid.MustNew(ulid.Now(), nil)
	for _, c := range []struct {
		tenant string
		id     ulid.ULID
		want   string
	}{
		{"team-b", meta.ULID, "names tenant"},
		{"team-a", other, "names block"},
	} {
		if err := bkt.Upload(ctx, ObjectName(c.tenant, c.id, MetaFilename), bytes.NewReader(b)); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadMeta(ctx, bkt, c.tenant, c.id); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("meta.json of team-a/%s read as %s/%s: %v, want an error that %s", meta.ULID, c.tenant, c.id, err, c.want)
		}
	}
	// Unparsable meta.json is an error, not a partial block.
	if err := bkt.Upload(ctx, ObjectName("team-c", other, MetaFilename), strings.NewReader("{")); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadMeta(ctx, bkt, "team-c", other); err == nil || errors.Is(err, ErrNoMeta) {
		t.Errorf("broken meta.json: %v", err)
	}
}

func TestValidate(t *testing.T) {
	_, good := writeLocalBlock(t, "t")
	good.GPUStore.Files = []File{{RelPath: "chunks/000001", SizeBytes: 10}, {RelPath: IndexFilename, SizeBytes: 20}}
	if err := good.Validate(); err != nil {
		t.Fatalf("valid meta: %v", err)
	}
	for name, mutate := range map[string]func(*Meta){
		"no ULID":           func(m *Meta) { m.ULID = ulid.ULID{} },
		"minTime > maxTime": func(m *Meta) { m.MinTime = m.MaxTime + 1 },
		"no tenant":         func(m *Meta) { m.GPUStore.Tenant = "" },
		"no index":          func(m *Meta) { m.GPUStore.Files = m.GPUStore.Files[:1] },
	} {
		m := good
		m.GPUStore.Files = append([]File(nil), good.GPUStore.Files...)
		mutate(&m)
		if err := m.Validate(); err == nil {
			t.Errorf("%s: validated", name)
		}
	}
	// Upload refuses an invalid meta before writing anything.
	dir, bad := writeLocalBlock(t, "")
	bkt := &recordingBucket{Bucket: objstore.NewInMemBucket()}
	if err := Upload(context.Background(), bkt, dir, bad); err == nil || len(bkt.uploads) != 0 {
		t.Fatalf("upload of a block without tenant: err %v, uploads %v", err, bkt.uploads)
	}
}

// The meta.json written is the TSDB's meta plus the "gpustore" section, so
// the TSDB's own fields keep their names.
func TestMetaJSONShape(t *testing.T) {
	dir, meta := writeLocalBlock(t, "t")
	bkt := objstore.NewInMemBucket()
	if err := Upload(context.Background(), bkt, dir, meta); err != nil {
		t.Fatal(err)
	}
	rc, err := bkt.Get(context.Background(), ObjectName("t", meta.ULID, MetaFilename))
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var raw map[string]json.RawMessage
	if err := json.NewDecoder(rc).Decode(&raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"ulid", "minTime", "maxTime", "stats", "compaction", "version", "gpustore"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("meta.json has no %q: %s", k, raw)
		}
	}
}
