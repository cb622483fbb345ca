package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/golang/snappy"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/prompb"

	"github.com/gpustore/gpustore/pkg/app"
)

// mountTmpfs mounts a tmpfs of size bytes. It needs root (CI runs as root):
// without the capability the test fails under CI=true and is skipped
// elsewhere.
func mountTmpfs(t *testing.T, size int64) string {
	t.Helper()
	dir := t.TempDir()
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", size), "tmpfs", dir).CombinedOutput()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("mount tmpfs (the disk-full test needs root): %v %s", err, out)
		}
		t.Skipf("cannot mount a tmpfs (%v %s); run as root, as CI does", err, bytes.TrimSpace(out))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", dir).CombinedOutput(); err != nil {
			t.Logf("umount %s: %v %s", dir, err, out)
		}
	})
	return dir
}

// fill writes a ballast file until the file system is full.
func fill(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				break
			}
			t.Fatal(err)
		}
	}
	// The last partial block too.
	for _, n := range []int{4096, 512, 1} {
		for {
			if _, err := f.Write(buf[:n]); err != nil {
				break
			}
		}
	}
}

// diskFullWriter writes one sample per request of one series, value = its
// timestamp in seconds, and remembers what was acknowledged and what was sent.
type diskFullWriter struct {
	t        *testing.T
	url      string
	next     int64
	acked    map[int64]bool
	sent     map[int64]bool
	statuses map[int]int
}

func (w *diskFullWriter) write(n int) (acked int) {
	w.t.Helper()
	for range n {
		ts := w.next
		req := &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{{
			Labels:  []prompb.Label{{Name: "__name__", Value: "DCGM_FI_DEV_GPU_TEMP"}, {Name: "gpu", Value: "0"}, {Name: "padding", Value: string(bytes.Repeat([]byte("x"), 200))}},
			Samples: []prompb.Sample{{Timestamp: ts, Value: float64(ts / 1000)}},
		}}}
		raw, _ := req.Marshal()
		hreq, _ := http.NewRequest(http.MethodPost, w.url+"/api/v1/write", bytes.NewReader(snappy.Encode(nil, raw)))
		hreq.Header.Set("Content-Type", "application/x-protobuf")
		hreq.Header.Set("Content-Encoding", "snappy")
		resp, err := http.DefaultClient.Do(hreq)
		if err != nil {
			w.t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		w.statuses[resp.StatusCode]++
		w.sent[ts] = true
		switch {
		case resp.StatusCode/100 == 2:
			w.acked[ts] = true
			acked++
			w.next += 1000
		case resp.StatusCode >= 500:
			// Retried, as Prometheus does: the same timestamp again.
			time.Sleep(20 * time.Millisecond)
		default:
			w.t.Fatalf("write %d answered %d (%s): a full disk must be 5xx so the sender retries", ts, resp.StatusCode, body)
		}
	}
	return acked
}

// check queries every sample and compares with what was acknowledged: each
// acknowledged sample with its value, nothing that was never sent.
func (w *diskFullWriter) check(url string, from int64) {
	w.t.Helper()
	got := rawSamples(w.t, url, `DCGM_FI_DEV_GPU_TEMP`, from, w.next)
	seen := map[int64]bool{}
	for _, vals := range got {
		for _, p := range vals {
			ts := int64(p.Timestamp)
			if !w.sent[ts] {
				w.t.Errorf("sample at %d was never sent", ts)
			}
			if p.Value != model.SampleValue(ts/1000) {
				w.t.Errorf("sample at %d has value %v, sent %d", ts, p.Value, ts/1000)
			}
			seen[ts] = true
		}
	}
	lost := 0
	for ts := range w.acked {
		if !seen[ts] {
			lost++
		}
	}
	if lost > 0 {
		w.t.Errorf("%d of %d acknowledged samples lost", lost, len(w.acked))
	}
}

// TestDiskFull: the data directory is a small tmpfs that fills up. Writes are
// answered 5xx (retried by Prometheus), never 2xx for what was not stored and
// never 4xx; queries keep answering; once space is freed, ingest resumes by
// itself; every acknowledged sample is there with its value, also after a
// restart (the WAL is not corrupted).
func TestDiskFull(t *testing.T) {
	mnt := mountTmpfs(t, 48<<20)
	dataDir := filepath.Join(mnt, "data")
	cfgFn := func(c *app.Config) {
		c.TSDB.Dir = dataDir
		c.Shipper.Enabled = false
		c.Rules.GPUPack = false
	}
	a, url := startGpustore(t, cfgFn)
	start := time.Now().Add(-30*time.Minute).UnixMilli() / 1000 * 1000
	w := &diskFullWriter{t: t, url: url, next: start, acked: map[int64]bool{}, sent: map[int64]bool{}, statuses: map[int]int{}}
	w.write(200)

	fill(t, filepath.Join(mnt, "ballast"))
	ackedBefore := len(w.acked)
	// Keep writing into the full disk for a while.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		w.write(10)
	}
	if w.statuses[http.StatusInternalServerError]+w.statuses[http.StatusServiceUnavailable] == 0 {
		t.Fatalf("no write was refused with 5xx on a full disk: %v", w.statuses)
	}
	t.Logf("on a full disk: %d more acknowledged, answers %v", len(w.acked)-ackedBefore, w.statuses)
	// Queries keep working.
	w.check(url, start)

	// Free the space: ingest resumes without a restart.
	if err := os.Remove(filepath.Join(mnt, "ballast")); err != nil {
		t.Fatal(err)
	}
	resumed := false
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); {
		if w.write(1) == 1 {
			resumed = true
			break
		}
	}
	if !resumed {
		t.Fatalf("writes did not resume after space was freed: %v", w.statuses)
	}
	w.write(100)
	w.check(url, start)

	// And all of it survives a restart: the WAL replays cleanly.
	if err := a.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	_, url2 := startGpustoreAt(t, cfgFn)
	w.check(url2, start)
	t.Logf("acknowledged %d samples, %d write answers: %v", len(w.acked), len(w.sent), w.statuses)
}

// startGpustoreAt is startGpustore on a directory set by mutate (a restart).
func startGpustoreAt(t *testing.T, mutate func(*app.Config)) (*app.App, string) {
	t.Helper()
	cfg := app.DefaultConfig()
	cfg.Server.ListenAddress = "127.0.0.1:0"
	mutate(&cfg)
	logger := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	a, err := app.New(cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Stop() })
	return a, "http://" + a.Server.Addr().String()
}
