package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/thanos-io/objstore"
	"gopkg.in/yaml.v3"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/storage/bucket"
)

// TestCompactorRunsAlone: the gpustore binary with -target=compact, pointed
// at a real S3 bucket of 2h blocks, compacts them into 8h blocks, deletes
// the sources after the delay, serves its metrics, and a kill -9 in the
// middle of its work followed by a restart leaves the same bucket.
func TestCompactorRunsAlone(t *testing.T) {
	s3 := startS3(t)
	bin := buildGpustore(t)
	dir := t.TempDir()
	bkt, err := bucket.New(s3.bucketConfig(), dir, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	start := int64(1_767_225_600_000) // 2026-01-01, a 2d boundary
	var total uint64
	for i := int64(0); i < 9; i++ { // [0,18h): two whole 8h ranges and the newest 2h block
		d := writeCompactBlock(t, filepath.Join(dir, "blocks"), start+i*7_200_000)
		bm, err := block.ReadLocalMeta(d)
		if err != nil {
			t.Fatal(err)
		}
		total += bm.Stats.NumSamples
		if err := block.Upload(ctx, bkt, d, block.Meta{BlockMeta: bm, GPUStore: block.GPUStoreMeta{
			Version: block.MetaVersion, Tenant: "default", Labels: map[string]string{}, Source: block.SourceReceive}}); err != nil {
			t.Fatal(err)
		}
	}
	cfgFile := filepath.Join(dir, "objstore.yml")
	raw, _ := yaml.Marshal(map[string]any{"type": "S3", "config": s3.bucketConfig().Config})
	if err := os.WriteFile(cfgFile, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	run := func() (*exec.Cmd, string, *bytes.Buffer) {
		addr := freePort(t)
		var log bytes.Buffer
		cmd := exec.Command(bin, "-target=compact", "-objstore.config-file="+cfgFile, "-storage.tsdb.path="+filepath.Join(dir, "data"),
			"-web.listen-address="+addr, "-compact.interval=1s", "-compact.delete-delay=3s", "-compact.lease-ttl=3s", "-compact.lease-settle=200ms", "-compact.partial-delete-delay=2s", "-compact.retention.raw=0", "-compact.downsample=false", "-log.level=info")
		cmd.Stdout, cmd.Stderr = &log, &log
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if cmd.ProcessState == nil {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			}
			if t.Failed() {
				t.Logf("gpustore -target=compact log:\n%s", log.String())
			}
		})
		return cmd, "http://" + addr, &log
	}
	// layout: complete blocks (duration), marked and partial directories.
	layout := func() (live []string, marked, partial int, samples uint64) {
		files := map[string]map[string]bool{}
		_ = bkt.Iter(ctx, "default/", func(name string) error {
			parts := strings.SplitN(strings.TrimPrefix(name, "default/"), "/", 2)
			if len(parts) == 2 {
				if files[parts[0]] == nil {
					files[parts[0]] = map[string]bool{}
				}
				files[parts[0]][parts[1]] = true
			}
			return nil
		}, objstore.WithRecursiveIter())
		for id, fs := range files {
			switch {
			case !fs[block.MetaFilename]:
				partial++
			case fs[block.DeletionMarkFilename]:
				marked++
			default:
				m, err := block.ReadMeta(ctx, bkt, "default", ulid.MustParse(id))
				if err != nil {
					t.Fatal(err)
				}
				live = append(live, (time.Duration(m.MaxTime-m.MinTime) * time.Millisecond).String())
				samples += m.Stats.NumSamples
			}
		}
		return
	}

	// First run: killed (SIGKILL) as soon as it has compacted something.
	cmd, _, _ := run()
	waitFor(t, 60*time.Second, "a first compaction", func() error {
		if live, marked, _, _ := layout(); marked == 0 {
			return fmt.Errorf("blocks %v", live)
		}
		return nil
	})
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()

	// Second run: finishes the work.
	cmd, url, _ := run()
	waitFor(t, 60*time.Second, "compacted into two 8h blocks and the newest 2h block, sources deleted", func() error {
		live, marked, partial, samples := layout()
		if len(live) != 3 || marked != 0 || partial != 0 {
			return fmt.Errorf("blocks %v, %d marked, %d partial", live, marked, partial)
		}
		if samples != total {
			return fmt.Errorf("%d samples in the bucket, %d shipped", samples, total)
		}
		return nil
	})
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, m := range []string{"gpustore_compact_last_success_timestamp_seconds{tenant=\"default\"}", "gpustore_compact_deleted_blocks_total"} {
		if !strings.Contains(string(body), m) {
			t.Errorf("/metrics lacks %s", m)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
}

func writeCompactBlock(t *testing.T, dir string, mint int64) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	w, err := tsdb.NewBlockWriter(slog.New(slog.DiscardHandler), dir, 7_200_000)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	app := w.Appender(context.Background())
	for g := 0; g < 8; g++ {
		ls := labels.FromStrings("__name__", "DCGM_FI_DEV_GPU_TEMP", "gpu", fmt.Sprint(g), "Hostname", "node-0")
		for ts := mint; ts < mint+7_200_000; ts += 30_000 {
			if _, err := app.Append(0, ls, ts, float64(40+g)+float64(ts/30_000%10)); err != nil {
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
	// The aligned range a receiver's head cuts (the block writer ends the
	// block at its last sample).
	d := filepath.Join(dir, id.String())
	b, err := os.ReadFile(filepath.Join(d, block.MetaFilename))
	if err != nil {
		t.Fatal(err)
	}
	var m tsdb.BlockMeta
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	m.MinTime, m.MaxTime = mint, mint+7_200_000
	b, _ = json.Marshal(m)
	if err := os.WriteFile(filepath.Join(d, block.MetaFilename), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return d
}
