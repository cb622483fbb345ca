// Package e2e runs gpustore against real servers on loopback: a real
// Prometheus that scrapes GPU metrics and remote-writes them to gpustore.
package e2e

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpustore/gpustore/internal/testbin"
	"github.com/gpustore/gpustore/pkg/app"
)

// startGpustore runs a gpustore (all roles) on a free loopback port.
func startGpustore(t *testing.T, mutate func(*app.Config)) (*app.App, string) {
	t.Helper()
	cfg := app.DefaultConfig()
	cfg.Server.ListenAddress = "127.0.0.1:0"
	cfg.TSDB.Dir = t.TempDir()
	if mutate != nil {
		mutate(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
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
	t.Cleanup(func() {
		if err := a.Stop(); err != nil {
			t.Errorf("stop gpustore: %v", err)
		}
	})
	return a, "http://" + a.Server.Addr().String()
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// freePort returns a loopback address with a port nobody listens on now and
// that no earlier call in this process returned (testbin.FreeAddr: the
// object-storage servers take theirs from the same record).
func freePort(t *testing.T) string {
	t.Helper()
	return testbin.FreeAddr(t)
}

// startPrometheus runs the real Prometheus binary with the given config and
// returns its base URL once it is ready.
func startPrometheus(t *testing.T, bin, config string, extraArgs ...string) string {
	t.Helper()
	url, _ := startPrometheusProc(t, bin, t.TempDir(), config, extraArgs...)
	return url
}

// startPrometheusProc is startPrometheus with a data dir of the caller's
// choosing (so a restart keeps it) and a stop function (idempotent; also
// run at cleanup) that shuts Prometheus down gracefully.
func startPrometheusProc(t *testing.T, bin, dir, config string, extraArgs ...string) (string, func()) {
	t.Helper()
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freePort(t)
	args := append([]string{
		"--config.file=" + cfgPath,
		"--storage.tsdb.path=" + filepath.Join(dir, "data"),
		"--web.listen-address=" + addr,
		"--log.level=warn",
	}, extraArgs...)
	stop := runProcess(t, "prometheus", bin, dir, args...)
	url := "http://" + addr
	waitFor(t, 60*time.Second, "prometheus ready", func() error {
		resp, err := http.Get(url + "/-/ready")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	})
	return url, stop
}

// runProcess starts a real server, logging to <dir>/<name>.log. The returned
// stop (idempotent, also run at cleanup) shuts it down gracefully (SIGTERM,
// then SIGKILL after 30 s) and prints its log if the test failed.
func runProcess(t *testing.T, name, bin, dir string, args ...string) func() {
	t.Helper()
	cmd := exec.Command(bin, args...)
	logf, err := os.OpenFile(filepath.Join(dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			sigterm := time.Now()
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
			if d := time.Since(sigterm); d > 5*time.Second {
				t.Logf("%s took %s to stop after SIGTERM (killed after 30 s)", name, d.Round(100*time.Millisecond))
			}
			_ = logf.Close()
			if t.Failed() {
				b, _ := os.ReadFile(logf.Name())
				t.Logf("%s log:\n%s", name, b)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// waitFor polls f until it returns nil or the timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		if err = f(); err == nil {
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s: %v", timeout, what, err)
}

var (
	gpustoreBinOnce sync.Once
	gpustoreBin     string
	gpustoreBinErr  error
)

// buildGpustore builds the real gpustore binary once per test run, for
// every test that runs it as a process (a link of the whole binary takes
// 8 s on a quiet machine, tens of seconds on a busy one). It goes to a
// directory under TMPDIR named for this checkout: another worktree's run
// never overwrites it with other code, and a later run of this one finds
// it there and is not relinked unless the sources changed (go build leaves
// an up-to-date binary as it is, and puts a new one in place as a new file,
// by rename or remove-then-write, so a process still running the old one is
// not disturbed).
func buildGpustore(t *testing.T) string {
	t.Helper()
	gpustoreBinOnce.Do(func() {
		src, err := filepath.Abs("../../cmd/gpustore")
		if err != nil {
			gpustoreBinErr = err
			return
		}
		dir := filepath.Join(os.TempDir(), fmt.Sprintf("gpustore-e2e-%x", sha256.Sum256([]byte(src)))[:len("gpustore-e2e-")+12])
		if err := os.MkdirAll(dir, 0o755); err != nil {
			gpustoreBinErr = err
			return
		}
		gpustoreBin = filepath.Join(dir, "gpustore")
		began := time.Now()
		out, err := exec.Command("go", "build", "-o", gpustoreBin, src).CombinedOutput()
		if err != nil {
			gpustoreBinErr = fmt.Errorf("build gpustore: %v\n%s", err, out)
			return
		}
		t.Logf("built %s in %s (once for every test of this run)", gpustoreBin, time.Since(began).Round(100*time.Millisecond))
	})
	if gpustoreBinErr != nil {
		t.Fatal(gpustoreBinErr)
	}
	return gpustoreBin
}

// waitBucketStoreSynced waits until the bucket store of the gpustore
// process at base has completed a listing of the bucket that began after
// this call: two successful syncs after it (syncs run one at a time, so the
// second began after the first ended). What was in the bucket when it was
// called is then what the process serves.
func waitBucketStoreSynced(t *testing.T, base string) {
	t.Helper()
	const name = "gpustore_bucketstore_last_sync_timestamp_seconds"
	last, err := ringMetric(base, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		waitFor(t, 30*time.Second, fmt.Sprintf("bucket-store sync %d of 2 of %s", i+1, base), func() error {
			v, err := ringMetric(base, name, nil)
			if err != nil {
				return err
			}
			if v <= last {
				return fmt.Errorf("last sync at %v", v)
			}
			last = v
			return nil
		})
	}
}
