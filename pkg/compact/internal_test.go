package compact

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/thanos-io/objstore"
	"github.com/thanos-io/objstore/providers/filesystem"

	"github.com/gpustore/gpustore/pkg/block"
)

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// TestLeaseExpiresAfterHolderDies: a second compactor cannot take a held
// lease, takes it once the holder stops renewing and it expires, and the
// first then finds it lost before its next change.
func TestLeaseExpiresAfterHolderDies(t *testing.T) {
	ctx := context.Background()
	bkt, err := filesystem.NewBucket(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	a := NewBucketLease(bkt, "a", time.Second, 10*time.Millisecond)
	b := NewBucketLease(bkt, "b", time.Second, 10*time.Millisecond)
	ha, err := a.Acquire(ctx, "t")
	if err != nil || ha == nil {
		t.Fatalf("first acquire: %v %v", ha, err)
	}
	if hb, err := b.Acquire(ctx, "t"); err != nil || hb != nil {
		t.Fatalf("second compactor took a held lease: %v %v", hb, err)
	}
	if hb, err := b.Acquire(ctx, "other"); err != nil || hb == nil {
		t.Fatalf("another tenant's lease: %v %v", hb, err)
	}
	time.Sleep(1100 * time.Millisecond) // a stops renewing (killed)
	hb, err := b.Acquire(ctx, "t")
	if err != nil || hb == nil {
		t.Fatalf("expired lease not taken over: %v %v", hb, err)
	}
	if err := ha.Check(ctx); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("old holder's check: %v", err)
	}
	if err := ha.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := hb.Check(ctx); err != nil {
		t.Fatalf("the old holder's release removed the new holder's lease: %v", err)
	}
}

// TestWorkingDirectoryBounded: the working directory is emptied at start,
// holds at most one plan's sources plus its result while compacting (the
// bound docs/compaction.md states), and nothing after a pass.
func TestWorkingDirectoryBounded(t *testing.T) {
	ctx := context.Background()
	bkt, err := filesystem.NewBucket(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	start := int64(1_767_225_600_000)
	var sizes []int64
	for i := int64(0); i < 8; i++ {
		d := writeTestBlock(t, src, start+i*2*3_600_000)
		sizes = append(sizes, uploadTestBlock(t, bkt, d))
	}
	cfg := DefaultConfig()
	cfg.LeaseSettle = 0
	cfg.RetentionRaw = 0 // the blocks are from 2026-01-01: keep them whatever today is
	cfg.Downsample = false
	c, err := New(cfg, bkt, t.TempDir(), nil, quietLogger(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(c.Dir(), "t", "stale"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.Dir(), "t", "stale", "junk"), make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if n := dirBytes(t, c.Dir()); n != 0 {
		t.Fatalf("working directory holds %d bytes after start", n)
	}
	var peaks []int64
	c.afterCompact = func(dir string) { peaks = append(peaks, dirBytes(t, c.Dir())) }
	if err := c.CompactTenant(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	if len(peaks) != 2 {
		t.Fatalf("%d compactions, want 2", len(peaks))
	}
	// Each plan: four 2h blocks; the result is at most their size. The
	// bound: sum of sources + result ≤ 2 × sum of sources, plus the
	// meta.json files.
	for i, p := range peaks {
		var sum int64
		for _, s := range sizes[4*i : 4*i+4] {
			sum += s
		}
		if p > 2*sum+64<<10 {
			t.Errorf("compaction %d: working directory peaked at %d bytes, bound %d", i, p, 2*sum+64<<10)
		}
		if p < sum {
			t.Errorf("compaction %d: working directory %d bytes, less than its sources (%d): measured at the wrong moment", i, p, sum)
		}
	}
	if n := dirBytes(t, c.Dir()); n != 0 {
		t.Fatalf("working directory holds %d bytes after the pass", n)
	}
}

func dirBytes(t *testing.T, dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

func writeTestBlock(t *testing.T, dir string, mint int64) string {
	w, err := tsdb.NewBlockWriter(quietLogger(), dir, 2*3_600_000)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	app := w.Appender(context.Background())
	for s := 0; s < 50; s++ {
		ls := labels.FromStrings("__name__", "DCGM_FI_DEV_GPU_TEMP", "gpu", string(rune('a'+s%26)), "node", string(rune('a'+s/26)))
		for ts := mint; ts < mint+2*3_600_000; ts += 15_000 {
			if _, err := app.Append(0, ls, ts, float64(ts%7919+int64(s))); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := app.Commit(); err != nil {
		t.Fatal(err)
	}
	id, err := w.Flush(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// The aligned range a receiver's head would cut (the block writer ends
	// the block at its last sample).
	d := filepath.Join(dir, id.String())
	b, err := os.ReadFile(filepath.Join(d, block.MetaFilename))
	if err != nil {
		t.Fatal(err)
	}
	var m tsdb.BlockMeta
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	m.MinTime, m.MaxTime = mint, mint+2*3_600_000
	b, _ = json.Marshal(m)
	if err := os.WriteFile(filepath.Join(d, block.MetaFilename), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return d
}

func uploadTestBlock(t *testing.T, bkt objstore.Bucket, dir string) int64 {
	bm, err := block.ReadLocalMeta(dir)
	if err != nil {
		t.Fatal(err)
	}
	meta := block.Meta{BlockMeta: bm, GPUStore: block.GPUStoreMeta{Version: block.MetaVersion, Tenant: "t", Labels: map[string]string{}, Source: block.SourceReceive}}
	if err := block.Upload(context.Background(), bkt, dir, meta); err != nil {
		t.Fatal(err)
	}
	files, _ := block.LocalFiles(dir)
	var n int64
	for _, f := range files {
		n += f.SizeBytes
	}
	return n
}
