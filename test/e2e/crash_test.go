package e2e

import (
	"bytes"
	"fmt"
	"net/http"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/golang/snappy"
	"github.com/prometheus/prometheus/prompb"
)

type proc struct {
	cmd *exec.Cmd
	url string
	log *bytes.Buffer
}

func startBinary(t *testing.T, bin, dataDir string) *proc {
	t.Helper()
	addr := freePort(t)
	var log bytes.Buffer
	cmd := exec.Command(bin, "-storage.tsdb.path="+dataDir, "-web.listen-address="+addr, "-log.level=warn")
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, url: "http://" + addr, log: &log}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		if t.Failed() {
			t.Logf("gpustore log:\n%s", log.String())
		}
	})
	waitFor(t, 60*time.Second, "gpustore ready", func() error {
		resp, err := http.Get(p.url + "/-/ready")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	})
	return p
}

// TestAcknowledgedWritesSurviveCrashAndShutdown: every write gpustore
// acknowledged is there after kill -9 and a restart (WAL replay), and a
// SIGTERM shuts down cleanly (exit 0) without losing anything either.
func TestAcknowledgedWritesSurviveCrashAndShutdown(t *testing.T) {
	bin := buildGpustore(t)
	dir := t.TempDir()
	p := startBinary(t, bin, dir)
	start := time.Now().Add(-10 * time.Minute).UnixMilli()
	write := func(p *proc, from, n int) {
		t.Helper()
		for i := from; i < from+n; i++ {
			req := &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{{
				Labels:  []prompb.Label{{Name: "__name__", Value: "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"}, {Name: "gpu", Value: "0"}},
				Samples: []prompb.Sample{{Timestamp: start + int64(i)*1000, Value: float64(i)}},
			}}}
			raw, _ := req.Marshal()
			hreq, _ := http.NewRequest(http.MethodPost, p.url+"/api/v1/write", bytes.NewReader(snappy.Encode(nil, raw)))
			hreq.Header.Set("Content-Type", "application/x-protobuf")
			hreq.Header.Set("Content-Encoding", "snappy")
			resp, err := http.DefaultClient.Do(hreq)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusNoContent {
				t.Fatalf("write %d: status %d", i, resp.StatusCode)
			}
		}
	}
	count := func(p *proc) float64 {
		t.Helper()
		v, err := queryNoDedup(p.url, `count_over_time(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[1h])`, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if len(v) != 1 {
			return 0
		}
		return float64(v[0].Value)
	}

	write(p, 0, 200)
	// kill -9: no shutdown, no flush; only what the WAL holds survives.
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = p.cmd.Wait()
	p = startBinary(t, bin, dir)
	if n := count(p); n != 200 {
		t.Fatalf("after kill -9 and restart: %v of 200 acknowledged samples", n)
	}
	write(p, 200, 100)
	// SIGTERM: graceful, exit code 0.
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, p.log.String())
	}
	p = startBinary(t, bin, dir)
	if n := count(p); n != 300 {
		t.Fatalf("after SIGTERM and restart: %v of 300 samples", n)
	}
}
