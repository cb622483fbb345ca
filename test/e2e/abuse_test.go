package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang/snappy"
	"github.com/prometheus/prometheus/prompb"

	"github.com/gpustore/gpustore/internal/abuse"
)

// TestReadAbuseUnderALowFileLimit runs the gpustore binary as the black-box
// test that found issue 30 did, with 256 open files allowed, and throws the
// read side's abuse at it while a Prometheus-like writer goes on: 1,000
// remote reads abandoned by their clients (on main each held a goroutine and
// a file for good; 300 stopped writes and /-/healthy) and every parse bomb
// on every PromQL route (on main: minutes of CPU and gigabytes each). Every
// legitimate write is acknowledged, /-/healthy answers throughout, every
// bomb is refused at once, and the process's goroutines and open files are
// back to where they were within seconds.
func TestReadAbuseUnderALowFileLimit(t *testing.T) {
	bin := buildGpustore(t)
	addr := freePort(t)
	base := "http://" + addr
	var log syncBuffer
	cmd := exec.Command("sh", "-c", `ulimit -n 256 && exec "$0" "$@"`, bin,
		"-storage.tsdb.path="+t.TempDir(), "-web.listen-address="+addr, "-log.level=warn")
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("gpustore log:\n%s", log.String())
		}
	})
	waitFor(t, 60*time.Second, "gpustore ready", func() error { return statusOK(base + "/-/ready") })

	// A writer like one Prometheus shard: a sample of a GPU series every
	// 50 ms; and a prober like a kubelet's. Each request on a connection of
	// its own, so each needs a file of the server's.
	var failures atomic.Int64
	var failed sync.Map
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := int64(0); ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if err := writeSample(base, time.Now().UnixMilli(), float64(i)); err != nil {
				failures.Add(1)
				failed.Store(err.Error(), true)
			}
		}
	})
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			if err := statusOK(base + "/-/healthy"); err != nil {
				failures.Add(1)
				failed.Store("/-/healthy: "+err.Error(), true)
			}
		}
	})
	time.Sleep(time.Second) // the series exists, the baseline settles
	ctx := context.Background()
	goroutines, fds, err := abuse.ProcessGauges(ctx, base, nil)
	if err != nil {
		t.Fatal(err)
	}

	now := time.Now().UnixMilli()
	for round := range 10 { // 100 connections at once: well inside the 256 files, 1,000 in all
		if err := abuse.AbandonedReads(addr, "/api/v1/read", abuse.ReadRequest("DCGM_FI_DEV_GPU_UTIL", now-60_000, now), nil, 100); err != nil {
			t.Fatalf("abandoned reads, round %d: %v", round, err)
		}
	}
	for _, a := range abuse.SendParseBombs(ctx, base, nil, 10*time.Second) {
		if a.Err != nil || a.Status != http.StatusBadRequest || a.Took > 2*time.Second {
			t.Errorf("%s to %s: %d after %s (%v), want 400 at once: %.150s", a.Bomb, a.Route, a.Status, a.Took, a.Err, a.Body)
		}
	}
	var g, f float64
	waitFor(t, 15*time.Second, "goroutines and open files back to the baseline", func() error {
		if g, f, err = abuse.ProcessGauges(ctx, base, nil); err != nil {
			return err
		}
		if g > goroutines+20 || f > fds+20 {
			return fmt.Errorf("%v goroutines (baseline %v), %v open files (baseline %v)", g, goroutines, f, fds)
		}
		return nil
	})
	close(stop)
	wg.Wait()
	if n := failures.Load(); n > 0 {
		var msgs []string
		failed.Range(func(k, _ any) bool { msgs = append(msgs, k.(string)); return true })
		t.Errorf("%d legitimate writes or probes failed during the abuse: %s", n, strings.Join(msgs, "; "))
	}
	t.Logf("baseline %v goroutines, %v open files; after the abuse %v, %v", goroutines, fds, g, f)
}

// freshConnections opens a connection per request.
var freshConnections = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

func writeSample(base string, ts int64, v float64) error {
	raw, err := (&prompb.WriteRequest{Timeseries: []prompb.TimeSeries{{
		Labels: []prompb.Label{{Name: "__name__", Value: "DCGM_FI_DEV_GPU_UTIL"}, {Name: "Hostname", Value: "node-1"},
			{Name: "gpu", Value: "0"}, {Name: "UUID", Value: "GPU-0a1b2c3d-0000-0000-0000-000000000000"}},
		Samples: []prompb.Sample{{Timestamp: ts, Value: v}},
	}}}).Marshal()
	if err != nil {
		return err
	}
	req, _ := http.NewRequest(http.MethodPost, base+"/api/v1/write", bytes.NewReader(snappy.Encode(nil, raw)))
	req.Header.Set("Content-Type", "application/x-protobuf")
	req.Header.Set("Content-Encoding", "snappy")
	req.Header.Set("X-Prometheus-Remote-Write-Version", "0.1.0")
	resp, err := freshConnections.Do(req)
	if err != nil {
		return fmt.Errorf("write: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("write: %d", resp.StatusCode)
	}
	return nil
}

func statusOK(u string) error {
	resp, err := freshConnections.Get(u)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// syncBuffer is a bytes.Buffer safe for a process's output and the test.
type syncBuffer struct {
	mtx sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mtx.Lock()
	defer b.mtx.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mtx.Lock()
	defer b.mtx.Unlock()
	return b.buf.String()
}
