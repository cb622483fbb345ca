package tools

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/thanos-io/objstore"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/compact"
	"github.com/gpustore/gpustore/pkg/storage/bucket"
	"github.com/gpustore/gpustore/pkg/storage/bucketindex"
)

// env is a FILESYSTEM bucket and its objstore config file.
type env struct {
	t   *testing.T
	cfg string
	bkt objstore.Bucket
}

func newEnv(t *testing.T) *env {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "objstore.yml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, "type: FILESYSTEM\nconfig:\n  directory: %s\n", filepath.Join(dir, "bucket")), 0o644); err != nil {
		t.Fatal(err)
	}
	bkt, err := bucket.New(bucket.Config{ConfigFile: cfg}, "", slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, cfg: cfg, bkt: bkt}
}

// run runs `gpustore tools args...` and returns stdout+stderr and the exit code.
func (e *env) run(args ...string) (string, int) {
	var out strings.Builder
	code := Main(args, &Env{Stdout: &out, Stderr: &out})
	return out.String(), code
}

// localBlock writes a 2h block of GPU temperature for gpus GPUs (the first
// with a pod label) starting at start, into a new directory.
func localBlock(t *testing.T, start time.Time, gpus int) string {
	t.Helper()
	parent := t.TempDir()
	w, err := tsdb.NewBlockWriter(slog.New(slog.DiscardHandler), parent, (2 * time.Hour).Milliseconds())
	if err != nil {
		t.Fatal(err)
	}
	app := w.Appender(context.Background())
	for g := range gpus {
		kv := []string{"__name__", "DCGM_FI_DEV_GPU_TEMP", "gpu", strconv.Itoa(g)}
		if g == 0 {
			kv = append(kv, "pod", "alice-notebook")
		}
		ls := labels.FromStrings(kv...)
		for ts := start; ts.Before(start.Add(2 * time.Hour)); ts = ts.Add(30 * time.Second) {
			if _, err := app.Append(0, ls, ts.UnixMilli(), float64(40+g)); err != nil {
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
	_ = w.Close()
	return filepath.Join(parent, id.String())
}

func editMeta(t *testing.T, dir string, f func(m map[string]any)) {
	t.Helper()
	p := filepath.Join(dir, block.MetaFilename)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	f(m)
	b, _ = json.Marshal(m)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func (e *env) blocks(tenant string) *bucketindex.Index {
	e.t.Helper()
	x, err := bucketindex.Update(context.Background(), e.bkt, tenant, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	return x
}

var t0 = time.Date(2026, 11, 2, 0, 0, 0, 0, time.UTC)

// TestUploadRefusesBadBlocks: blocks that would be read wrong are refused
// with their reason and nothing is uploaded: samples outside the block's
// range (the compactor would drop them), a Thanos-downsampled block, a
// meta.json that does not match the block, and a block overlapping a block
// of the bucket marked no-compact. --skip-invalid uploads the others; the
// same directory again uploads nothing.
func TestUploadRefusesBadBlocks(t *testing.T) {
	e := newEnv(t)
	dir := t.TempDir()
	good := localBlock(t, t0, 2)
	if err := os.Rename(good, filepath.Join(dir, filepath.Base(good))); err != nil {
		t.Fatal(err)
	}
	for name, bad := range map[string]func(d string){
		"outside the block's range": func(d string) {
			editMeta(t, d, func(m map[string]any) { m["maxTime"] = m["minTime"].(float64) + 3600_000 })
		},
		"downsampled by Thanos": func(d string) {
			editMeta(t, d, func(m map[string]any) {
				m["thanos"] = map[string]any{"downsample": map[string]any{"resolution": 300000}}
			})
		},
		"counts": func(d string) {
			editMeta(t, d, func(m map[string]any) { m["stats"].(map[string]any)["numSamples"] = 7 })
		},
	} {
		d := localBlock(t, t0.Add(4*time.Hour), 1)
		bad(d)
		sub := filepath.Join(t.TempDir(), filepath.Base(d))
		if err := os.Rename(d, sub); err != nil {
			t.Fatal(err)
		}
		out, code := e.run("bucket", "upload-blocks", "--tenant=t", "--objstore.config-file="+e.cfg, dir, filepath.Dir(sub))
		if code != 1 || !strings.Contains(out, "refused") || !strings.Contains(out, name) || !strings.Contains(out, "nothing uploaded") {
			t.Errorf("%s: exit %d:\n%s", name, code, out)
		}
		if x := e.blocks("t"); len(x.Blocks)+len(x.Partial) != 0 {
			t.Fatalf("%s: %d blocks uploaded beside a refused one", name, len(x.Blocks))
		}
	}
	out, code := e.run("bucket", "upload-blocks", "--tenant=t", "--objstore.config-file="+e.cfg, dir)
	if code != 0 || !strings.Contains(out, "uploaded 1 blocks") {
		t.Fatalf("the good block: exit %d:\n%s", code, out)
	}
	if out, code := e.run("bucket", "upload-blocks", "--tenant=t", "--objstore.config-file="+e.cfg, dir); code != 0 || !strings.Contains(out, "in the bucket already") {
		t.Fatalf("again: exit %d:\n%s", code, out)
	}
	// A block of the bucket marked no-compact: an upload over its hours is refused.
	id := e.blocks("t").Blocks[0].ULID
	if out, code := e.run("bucket", "mark", "--tenant=t", "--objstore.config-file="+e.cfg, "--block="+id.String(), "--mark=no-compact", "--details=test"); code != 0 {
		t.Fatalf("mark: %d %s", code, out)
	}
	over := localBlock(t, t0.Add(time.Hour), 1)
	out, code = e.run("bucket", "upload-blocks", "--tenant=t", "--objstore.config-file="+e.cfg, over)
	if code != 1 || !strings.Contains(out, "marked no-compact") {
		t.Fatalf("over a no-compact block: exit %d:\n%s", code, out)
	}
}

// TestMarkRespectsTheCompactorsLease: mark (and rewrite) wait for a
// compactor holding the tenant's lease and give up with a clear error; with
// the lease free they mark, and --remove takes the mark away.
func TestMarkRespectsTheCompactorsLease(t *testing.T) {
	e := newEnv(t)
	if out, code := e.run("bucket", "upload-blocks", "--tenant=t", "--objstore.config-file="+e.cfg, localBlock(t, t0, 1)); code != 0 {
		t.Fatal(out)
	}
	id := e.blocks("t").Blocks[0].ULID
	lease := compact.NewBucketLease(e.bkt, "compactor-1", time.Minute, 10*time.Millisecond)
	held, err := lease.Acquire(context.Background(), "t")
	if err != nil || held == nil {
		t.Fatalf("acquire: %v %v", held, err)
	}
	args := []string{"bucket", "mark", "--tenant=t", "--objstore.config-file=" + e.cfg, "--block=" + id.String(), "--mark=deletion", "--details=bad data", "--lease-wait=1s"}
	out, code := e.run(args...)
	if code != 1 || !strings.Contains(out, "a compactor holds tenant") {
		t.Fatalf("mark under a compactor's lease: exit %d:\n%s", code, out)
	}
	if len(e.blocks("t").DeletionMarks) != 0 {
		t.Fatal("marked while a compactor held the lease")
	}
	if err := held.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if out, code := e.run(args...); code != 0 {
		t.Fatalf("mark: exit %d:\n%s", code, out)
	}
	if m := e.blocks("t").DeletionMarkMap()[id]; m == nil || m.Details != "bad data" {
		t.Fatalf("deletion mark %+v", m)
	}
	if out, code := e.run(append(args, "--remove")...); code != 0 || len(e.blocks("t").DeletionMarks) != 0 {
		t.Fatalf("remove: exit %d:\n%s", code, out)
	}
	if _, err := e.bkt.Attributes(context.Background(), "t/"+compact.LeaseFilename); !e.bkt.IsObjNotFoundErr(err) {
		t.Fatalf("the tools left their lease behind: %v", err)
	}
}

// TestRewriteDropsSeries: rewrite writes a new block without the matching
// series, which replaces the old one (same sources, the old as parent), and
// marks the old one for deletion; ls, inspect and verify see it.
func TestRewriteDropsSeries(t *testing.T) {
	e := newEnv(t)
	if out, code := e.run("bucket", "upload-blocks", "--tenant=t", "--objstore.config-file="+e.cfg, localBlock(t, t0, 3)); code != 0 {
		t.Fatal(out)
	}
	old := e.blocks("t").Blocks[0]
	base := []string{"bucket", "rewrite", "--tenant=t", "--objstore.config-file=" + e.cfg, "--block=" + old.ULID.String(), `--drop={pod=~"alice-.*"}`}
	if out, code := e.run(append(base, "--dry-run")...); code != 0 || !strings.Contains(out, "would lose 1 of 3 series") || len(e.blocks("t").Blocks) != 1 {
		t.Fatalf("dry run: exit %d:\n%s", code, out)
	}
	out, code := e.run(base...)
	if code != 0 {
		t.Fatalf("rewrite: exit %d:\n%s", code, out)
	}
	x := e.blocks("t")
	if len(x.Blocks) != 2 || x.DeletionMarkMap()[old.ULID] == nil {
		t.Fatalf("after rewrite: %d blocks, marks %+v", len(x.Blocks), x.DeletionMarks)
	}
	var nb *block.Meta
	for _, m := range x.Blocks {
		if m.ULID != old.ULID {
			nb = m
		}
	}
	if nb.Stats.NumSeries != 2 || fmt.Sprint(nb.Compaction.Sources) != fmt.Sprint(old.Compaction.Sources) || nb.Compaction.Parents[0].ULID != old.ULID || nb.GPUStore.Source != old.GPUStore.Source {
		t.Fatalf("new block %+v", nb)
	}
	if r := bucketindex.Replaced(x.Blocks); r[old.ULID] != nb.ULID {
		t.Fatalf("readers do not take the new block for the old one: %v", r)
	}
	for _, cmd := range [][]string{{"ls"}, {"inspect"}, {"verify"}} {
		out, code := e.run(append(append([]string{"bucket"}, cmd...), "--tenant=t", "--objstore.config-file="+e.cfg)...)
		if code != 0 || !strings.Contains(out, nb.ULID.String()) {
			t.Errorf("%s: exit %d:\n%s", cmd[0], code, out)
		}
	}
	// verify finds a missing object.
	if err := e.bkt.Delete(context.Background(), block.ObjectName("t", nb.ULID, "index")); err != nil {
		t.Fatal(err)
	}
	out, code = e.run("bucket", "verify", "--tenant=t", "--objstore.config-file="+e.cfg, "--block="+nb.ULID.String())
	if code != 1 || !strings.Contains(out, "index is missing") {
		t.Fatalf("verify of a block without its index: exit %d:\n%s", code, out)
	}
	if _, code := e.run("bucket", "rewrite", "--tenant=t", "--objstore.config-file="+e.cfg, "--block="+ulid.Make().String(), "--drop=up"); code != 1 {
		t.Errorf("rewrite of a block that is not there: exit %d", code)
	}
}

// TestCheckConfig: the configuration and overrides files are checked as
// gpustore loads them; a mistake in either is exit code 1 with the error.
func TestCheckConfig(t *testing.T) {
	e := newEnv(t)
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("overrides.yml", "overrides:\n  gpu-prod:\n    compactor_retention_5m: 90d\n    compactor_retention_1h: 2y\n")
	cfg := write("gpustore.yml", "limits:\n  overrides_file: "+good+"\n")
	if out, code := e.run("check", "config", cfg); code != 0 || !strings.Contains(out, "(1 tenants)") {
		t.Fatalf("good files: exit %d:\n%s", code, out)
	}
	for file, want := range map[string]string{
		write("typo.yml", "querry:\n  timeout: 1m\n"):                                     "querry",
		write("bad-retention.yml", "compact:\n  retention_1h: 1d\n  retention_5m: 30d\n"): "shorter than",
	} {
		if out, code := e.run("check", "config", file); code != 1 || !strings.Contains(out, want) {
			t.Errorf("%s: exit %d, want 1 naming %q:\n%s", filepath.Base(file), code, want, out)
		}
	}
	bad := write("bad-overrides.yml", "overrides:\n  gpu-prod:\n    compactor_retention_5m: 90d\n    compactor_retention_1h: 30d\n")
	if out, code := e.run("check", "config", "--limits.overrides-file="+bad); code != 1 || !strings.Contains(out, "compactor_retention_1h") {
		t.Errorf("bad overrides: exit %d:\n%s", code, out)
	}
	if _, code := e.run("check", "config"); code != 2 {
		t.Errorf("nothing to check: exit %d, want 2", code)
	}
}
