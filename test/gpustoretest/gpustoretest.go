// Package gpustoretest runs a gpustore process inside a test: pkg/app with
// every role, on a free loopback port, its data in the test's temporary
// directory. The dashboards' and self-alerts' tests check their queries
// against the metrics such a process really registers.
package gpustoretest

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpustore/gpustore/internal/testbin"
	"github.com/gpustore/gpustore/pkg/app"
)

// Start runs gpustore with the default configuration changed by mutate,
// and stops it when the test ends.
func Start(t testing.TB, mutate ...func(*app.Config)) *app.App {
	t.Helper()
	cfg := app.DefaultConfig()
	cfg.Server.ListenAddress = "127.0.0.1:0"
	cfg.TSDB.Dir = t.TempDir()
	for _, m := range mutate {
		m(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	a, err := app.New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
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
	return a
}

// Ring is the scale-out path in one process: the ring on an in-memory KV
// with a replication factor of 1, so that the distributor, receiver,
// querier and ruler rings and their metrics exist beside every other role.
func Ring(c *app.Config) {
	c.Ring.Enabled = true
	c.Ring.KVStore = "inmemory"
	c.Ring.ReplicationFactor = 1
	// Stop at once: no LEAVING wait, no flush of the heads into blocks.
	c.Ring.FlushOnShutdown = false
}

// MetricNames returns the names of every metric a's registry describes
// (vectors without a child yet included), each also with the _bucket, _sum
// and _count suffixes a histogram's or summary's series carry.
func MetricNames(a *app.App) map[string]bool {
	ch := make(chan *prometheus.Desc)
	go func() { a.Registry.Describe(ch); close(ch) }()
	names := map[string]bool{}
	for d := range ch {
		name := descName(d)
		for _, suffix := range []string{"", "_bucket", "_sum", "_count"} {
			names[name+suffix] = true
		}
	}
	return names
}

// descName reads the fully-qualified name out of a Desc, which has no
// accessor for it: its String() is `Desc{fqName: "name", ...}`.
func descName(d *prometheus.Desc) string {
	s := d.String()
	_, rest, ok := strings.Cut(s, `fqName: "`)
	if !ok {
		return ""
	}
	name, _, _ := strings.Cut(rest, `"`)
	return name
}

// StartProcess runs a real server (bin) on a free loopback port until the
// test ends: args are its arguments given that address. Its output goes to
// name.log in dir, shown when the test fails. It returns the address.
func StartProcess(t testing.TB, name, bin, dir string, args func(addr string) []string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args(addr)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("%s log:\n%.4000s", name, b)
		}
	})
	return addr
}

// StartAlertmanager runs the real Alertmanager (testbin: skipped without
// it, failed under CI=true) on loopback, without a cluster port, with a
// receiver that sends nowhere, and returns its URL; it stops with the test.
func StartAlertmanager(t testing.TB) string {
	t.Helper()
	bin := testbin.Need(t, "alertmanager")
	dir := t.TempDir()
	cfg := filepath.Join(dir, "alertmanager.yml")
	if err := os.WriteFile(cfg, []byte("route: {receiver: none}\nreceivers: [{name: none}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := StartProcess(t, "alertmanager", bin, dir, func(addr string) []string {
		return []string{"--config.file=" + cfg, "--storage.path=" + filepath.Join(dir, "data"),
			"--web.listen-address=" + addr, "--cluster.listen-address=", "--log.level=warn"}
	})
	url := "http://" + addr
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get(url + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return url
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("alertmanager not ready on %s: %v", addr, err)
		}
	}
}
