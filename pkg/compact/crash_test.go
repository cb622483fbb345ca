package compact_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/thanos-io/objstore"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/compact"
	"github.com/gpustore/gpustore/pkg/downsample"
)

// Crash points: where the compactor process is killed (SIGKILL, by itself,
// at the moment it would make the named call to the bucket).
const (
	crashMidUpload   = "mid-upload"   // the result's chunks are in the bucket, its index and meta.json are not
	crashAfterUpload = "after-upload" // the result is whole, no source is marked
	crashMidMarks    = "mid-marks"    // one source is marked, the others are not
	crashAfterMarks  = "after-marks"  // every source is marked, nothing deleted yet
	crashMidDelete   = "mid-delete"   // a source's meta.json is deleted, its data is not

	// With downsampling on: killed before / after a downsampled block's
	// meta.json is uploaded (its chunks and index are in the bucket).
	crashDownsampleMidUpload   = "downsample-mid-upload"
	crashDownsampleAfterUpload = "downsample-after-upload"
)

// crashBucket kills the process at its crash point.
type crashBucket struct {
	objstore.Bucket
	at      string
	marks   atomic.Int64
	deletes atomic.Int64
}

func die() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	time.Sleep(time.Minute)
}

func (b *crashBucket) Upload(ctx context.Context, name string, r io.Reader, opts ...objstore.ObjectUploadOption) error {
	if strings.HasPrefix(b.at, "downsample-") && strings.HasSuffix(name, "/"+block.MetaFilename) {
		raw, err := io.ReadAll(r)
		if err != nil {
			return err
		}
		downsampled := strings.Contains(string(raw), `"source": "`+downsample.Source+`"`)
		if downsampled && b.at == crashDownsampleMidUpload {
			die()
		}
		if err := b.Bucket.Upload(ctx, name, bytes.NewReader(raw), opts...); err != nil {
			return err
		}
		if downsampled && b.at == crashDownsampleAfterUpload {
			die()
		}
		return nil
	}
	switch {
	case b.at == crashMidUpload && (strings.HasSuffix(name, "/"+block.IndexFilename) || strings.HasSuffix(name, "/"+block.IndexFilename+".zst")):
		die()
	case strings.HasSuffix(name, "/"+block.DeletionMarkFilename):
		n := b.marks.Add(1)
		if b.at == crashAfterUpload || (b.at == crashMidMarks && n == 2) {
			die()
		}
	}
	return b.Bucket.Upload(ctx, name, r, opts...)
}

func (b *crashBucket) Delete(ctx context.Context, name string) error {
	if !strings.HasSuffix(name, compact.LeaseFilename) {
		n := b.deletes.Add(1)
		if b.at == crashAfterMarks || (b.at == crashMidDelete && n == 2) {
			die()
		}
	}
	return b.Bucket.Delete(ctx, name)
}

// TestCompactorCrashHelper is the compactor process the crash test kills: it
// runs only when started by TestCrashAtEveryStep.
func TestCompactorCrashHelper(t *testing.T) {
	at := os.Getenv("GPUSTORE_COMPACT_CRASH_AT")
	if at == "" {
		t.Skip("started by TestCrashAtEveryStep only")
	}
	bkt := &crashBucket{Bucket: openBucket(t, storeFromEnv(os.Getenv("GPUSTORE_COMPACT_STORE"))), at: at}
	cfg := crashConfig()
	cfg.Downsample = strings.HasPrefix(at, "downsample-")
	cfg.DataDir = os.Getenv("GPUSTORE_COMPACT_DIR")
	c, err := compact.New(cfg, bkt, "", nil, quiet(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := c.CompactTenant(context.Background(), "crash"); err != nil {
			t.Fatal(err)
		}
	}
	t.Fatalf("crash point %s never reached", at)
}

func crashConfig() compact.Config {
	cfg := testConfig()
	cfg.LeaseTTL = model.Duration(3 * time.Second)
	return cfg
}

// shippedBucket empties the crash tests' tenant in the bucket and uploads
// the blocks in dirs, as the receivers shipped them.
func shippedBucket(t *testing.T, store testStore, dirs []string) objstore.Bucket {
	t.Helper()
	bkt := openBucket(t, store)
	var names []string
	if err := bkt.Iter(context.Background(), "crash/", func(name string) error {
		names = append(names, name)
		return nil
	}, objstore.WithRecursiveIter()); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if err := bkt.Delete(context.Background(), n); err != nil {
			t.Fatal(err)
		}
	}
	upload(t, bkt, "crash", nil, dirs...)
	return bkt
}

// killCompactorAt runs TestCompactorCrashHelper as a compactor process
// working in work, and checks that it died of SIGKILL at its crash point.
func killCompactorAt(t *testing.T, store testStore, at, work string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCompactorCrashHelper$", "-test.v")
	// The helper dies by SIGKILL, so its own t.TempDir()s are never removed:
	// give it a TMPDIR inside this test's, which the test removes.
	cmd.Env = append(os.Environ(), "GPUSTORE_COMPACT_CRASH_AT="+at, "GPUSTORE_COMPACT_STORE="+store.env(), "GPUSTORE_COMPACT_DIR="+work,
		"TMPDIR="+t.TempDir())
	out, err := cmd.CombinedOutput()
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("compactor was not killed at %s: %v\n%s", at, err, out)
	}
}

// TestCrashAtEveryStep kills a compactor process (SIGKILL) at each step of a
// compaction, then runs a new one on the same bucket and working directory:
// queries answer as before the compaction, and in the end the bucket holds
// exactly the blocks an uninterrupted compaction leaves: no partial upload,
// no doubled sample, no mark or block left behind.
func TestCrashAtEveryStep(t *testing.T) {
	store := startStore(t)
	sl := simSlice{Nodes: 1, Start: time.UnixMilli(1_767_225_600_000).UTC(), Duration: 18 * time.Hour, Interval: time.Minute, Block: 2 * time.Hour}
	dirs := sl.write(t, t.TempDir())
	end := sl.Start.Add(sl.Duration)
	node := "gpu-node-001"

	// The reference: the blocks as shipped, and an uninterrupted compaction.
	ref := openBucket(t, store)
	var total uint64
	for _, m := range upload(t, ref, "crash", nil, dirs...) {
		total += m.Stats.NumSamples
	}
	qa, qurl := startQuery(t, store.bucket())
	want := answers(t, qa, qurl, "crash", sl.Start, end, node)

	for _, at := range []string{crashMidUpload, crashAfterUpload, crashMidMarks, crashAfterMarks, crashMidDelete} {
		t.Run(at, func(t *testing.T) {
			bkt := shippedBucket(t, store, dirs)
			work := t.TempDir()
			if err := os.WriteFile(filepath.Join(work, "left-by-a-previous-run"), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			killCompactorAt(t, store, at, work)
			// In between, queries answer as before.
			compareAnswers(t, "after the crash", want, answers(t, qa, qurl, "crash", sl.Start, end, node))

			// Restart on the same working directory once the dead one's lease expired.
			time.Sleep(time.Duration(crashConfig().LeaseTTL))
			cfg := crashConfig()
			cfg.DataDir = work
			c, _ := newCompactor(t, cfg, bkt, nil)
			if _, err := os.Stat(filepath.Join(work, "left-by-a-previous-run")); !os.IsNotExist(err) {
				t.Fatalf("working directory not cleaned at start: %v", err)
			}
			st := compactUntilStable(t, c, bkt, "crash")
			if len(st.partial) > 0 || len(st.marked) > 0 {
				t.Fatalf("left behind: %d partial, %d marked blocks", len(st.partial), len(st.marked))
			}
			if st.samples() != total {
				t.Fatalf("%d samples in the bucket, %d shipped", st.samples(), total)
			}
			if got := st.spans(); got != wantSpans(t) {
				t.Fatalf("blocks %s, an uninterrupted compaction leaves %s", got, wantSpans(t))
			}
			compareAnswers(t, "after the restart", want, answers(t, qa, qurl, "crash", sl.Start, end, node))
		})
	}
}

// wantSpans is the crash test's layout after compaction: two 8h blocks and
// the newest 2h block.
func wantSpans(t *testing.T) string {
	return fmt.Sprintf("%s+8h0m0s(L2) %s+8h0m0s(L2) %s+2h0m0s(L1)", "01-01T00", "01-01T08", "01-01T16")
}

// TestCrashWhileDownsampling kills a compactor process with downsampling on
// just before and just after a downsampled block's meta.json is uploaded,
// restarts it, and checks that the bucket ends as an uninterrupted run
// leaves it: the same blocks at every resolution, the same number of
// downsampled samples (nothing lost, nothing doubled), no partial block.
func TestCrashWhileDownsampling(t *testing.T) {
	store := startStore(t)
	sl := simSlice{Nodes: 1, Start: time.UnixMilli(1_767_225_600_000).UTC(), Duration: 18 * time.Hour, Interval: time.Minute, Block: 2 * time.Hour}
	dirs := sl.write(t, t.TempDir())
	cfg := crashConfig()
	cfg.Downsample = true
	layout := func(st bucketState) (string, map[int64]uint64) {
		samples := map[int64]uint64{}
		for _, m := range st.live {
			samples[m.GPUStore.Downsample.Resolution] += m.Stats.NumSamples
		}
		return st.spans(), samples
	}
	ref := shippedBucket(t, store, dirs)
	c, _ := newCompactor(t, cfg, ref, nil)
	wantSpans, wantSamples := layout(compactUntilStable(t, c, ref, "crash"))
	if wantSamples[downsample.Res5m] == 0 {
		t.Fatalf("the uninterrupted run downsampled nothing: %s", wantSpans)
	}
	for _, at := range []string{crashDownsampleMidUpload, crashDownsampleAfterUpload} {
		t.Run(at, func(t *testing.T) {
			bkt := shippedBucket(t, store, dirs)
			work := t.TempDir()
			killCompactorAt(t, store, at, work)
			time.Sleep(time.Duration(cfg.LeaseTTL)) // the dead one's lease expires
			rcfg := cfg
			rcfg.DataDir = work
			c, _ := newCompactor(t, rcfg, bkt, nil)
			st := compactUntilStable(t, c, bkt, "crash")
			if len(st.partial) > 0 || len(st.marked) > 0 {
				t.Fatalf("left behind: %d partial, %d marked blocks", len(st.partial), len(st.marked))
			}
			gotSpans, gotSamples := layout(st)
			if gotSpans != wantSpans || fmt.Sprint(gotSamples) != fmt.Sprint(wantSamples) {
				t.Fatalf("after the crash and a restart: %s, samples by resolution %v; an uninterrupted run: %s, %v",
					gotSpans, gotSamples, wantSpans, wantSamples)
			}
		})
	}
}
