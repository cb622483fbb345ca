package devstack

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gpustore/gpustore/internal/testbin"
)

// buildBinaries builds gpustore and gpusim as `make build` does.
func buildBinaries(t *testing.T) (string, string) {
	t.Helper()
	dir := t.TempDir()
	for _, pkg := range []string{"./cmd/gpustore", "./bench/cmd/gpusim"} {
		cmd := exec.Command("go", "build", "-o", dir+"/", pkg)
		cmd.Dir = "../.."
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	return filepath.Join(dir, "gpustore"), filepath.Join(dir, "gpusim")
}

type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// query runs an instant query against gpustore's API.
func query(base, q string) (model.Vector, error) {
	resp, err := http.Get(base + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result model.Vector `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return nil, err
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("%s: %s", q, r.Error)
	}
	return r.Data.Result, nil
}

// metric returns the sum of a metric family on a /metrics page.
func metric(base, name string) (float64, error) {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0, err
	}
	f, ok := fams[name]
	if !ok {
		return 0, fmt.Errorf("no %s", name)
	}
	sum := 0.0
	for _, m := range f.Metric {
		switch {
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Histogram != nil:
			sum += float64(m.Histogram.GetSampleCount())
		}
	}
	return sum, nil
}

func eventually(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		if err = f(); err == nil {
			t.Logf("%s: ok", what)
			return
		}
		time.Sleep(2 * time.Second)
	}
	t.Fatalf("timed out after %s waiting for %s: %v", timeout, what, err)
}

// The dev stack comes up from deploy/compose's files, the Prometheus pair's
// data reaches gpustore deduplicated, blocks reach the S3 bucket and are
// queried back from it once the local copy is gone, gpustore's alerts have
// an Alertmanager, and everything stops cleanly.
func TestDevStack(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the whole stack for a few minutes")
	}
	bins := Binaries{
		Prometheus: testbin.Need(t, "prometheus"), Alertmanager: testbin.Need(t, "alertmanager"), Versitygw: testbin.Need(t, "versitygw"),
	}
	bins.Gpustore, bins.Gpusim = buildBinaries(t)
	dir := t.TempDir()
	s, err := Start(context.Background(), Config{
		ComposeDir: "../compose", Dir: dir, Bins: bins, FreePorts: true,
		Logger: slog.New(slog.NewTextHandler(logWriter{t}, nil)),
		// Minute blocks kept locally for a minute, shipped and listed fast:
		// within the test, data is served from the bucket only.
		// The compactor's first pass runs at start (nothing to do) and the
		// next in an hour: merging and downsampling minute blocks is
		// pkg/compact's to test, and here it would rewrite the blocks the
		// test reads back while it reads them.
		GpustoreArgs: []string{"--storage.tsdb.block-duration=1m", "--storage.tsdb.retention.time=1m",
			"--shipper.interval=2s", "--bucket-store.sync-interval=2s", "--compact.interval=1h"},
	})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = s.Stop()
		}
		if t.Failed() {
			for _, n := range []string{"gpustore", "prometheus-0", "prometheus-1", "alertmanager", "versitygw", "gpusim"} {
				b, _ := os.ReadFile(filepath.Join(dir, n+".log"))
				t.Logf("%s log (tail):\n%s", n, tail(string(b), 3000))
			}
		}
	})
	gs := s.URL("gpustore")

	// Both replicas' data arrives as one cluster, without __replica__.
	eventually(t, 2*time.Minute, "128 simulated GPUs in gpustore", func() error {
		v, err := query(gs, `count(DCGM_FI_DEV_GPU_TEMP{cluster="gpu-cluster-dev"})`)
		if err != nil {
			return err
		}
		if len(v) != 1 || v[0].Value != 128 {
			return fmt.Errorf("count = %v", v)
		}
		return nil
	})
	if v, err := query(gs, `count(DCGM_FI_DEV_GPU_TEMP{__replica__!=""})`); err != nil || len(v) != 0 {
		t.Errorf("series with __replica__ stored (HA dedup off?): %v %v", v, err)
	}
	eventually(t, time.Minute, "one elected replica for the cluster", func() error {
		v, err := metric(gs, "gpustore_ha_elected_replica")
		if err != nil || v != 1 {
			return fmt.Errorf("gpustore_ha_elected_replica = %v (%v)", v, err)
		}
		return nil
	})
	// The pair scrapes gpustore itself (self-monitoring) and has the
	// self-monitoring rules loaded; gpustore found its Alertmanager.
	eventually(t, time.Minute, "gpustore's own metrics through the pair", func() error {
		v, err := query(gs, `up{job="gpustore"} == 1`)
		if err != nil || len(v) == 0 {
			return fmt.Errorf("up{job=gpustore}: %v %v", v, err)
		}
		return nil
	})
	// The GPU pack's NodeUnreachable reads up{job="node-exporter"}: the pair
	// scrapes each of the 16 simulated nodes under that job.
	eventually(t, time.Minute, "up{job=\"node-exporter\"} of every node", func() error {
		v, err := query(gs, `count(up{job="node-exporter",cluster="gpu-cluster-dev"} == 1)`)
		if err != nil || len(v) != 1 || v[0].Value != 16 {
			return fmt.Errorf("nodes up under job node-exporter: %v %v", v, err)
		}
		return nil
	})
	for _, p := range []string{"prometheus-0", "prometheus-1"} {
		resp, err := http.Get(s.URL(p) + "/api/v1/rules")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(b), "GpustoreDown") {
			t.Errorf("%s has not loaded the self-monitoring rules: %.300s", p, b)
		}
	}
	eventually(t, time.Minute, "gpustore's notifier discovered Alertmanager", func() error {
		v, err := metric(gs, "prometheus_notifications_alertmanagers_discovered")
		if err != nil || v < 1 {
			return fmt.Errorf("alertmanagers discovered = %v (%v)", v, err)
		}
		return nil
	})

	// A block reaches the bucket (versitygw's posix directory) and the
	// bucket store serves it.
	eventually(t, 6*time.Minute, "a block in the S3 bucket, synced by the bucket store", func() error {
		metas, _ := filepath.Glob(filepath.Join(s.Bucket, "*", "*", "meta.json"))
		if len(metas) == 0 {
			return fmt.Errorf("no meta.json under %s", s.Bucket)
		}
		v, err := metric(gs, "gpustore_bucketstore_blocks")
		if err != nil || v < 1 {
			return fmt.Errorf("gpustore_bucketstore_blocks = %v (%v)", v, err)
		}
		return nil
	})
	// A block past local retention is deleted locally once uploaded: its
	// time range can then only be answered from the bucket.
	tenantDir := filepath.Join(dir, "gpustore", "data", "tenants", "default")
	eventually(t, 4*time.Minute, "a bucket-only block answered from the bucket", func() error {
		id, mint, maxt, err := bucketOnlyBlock(s.Bucket, tenantDir)
		if err != nil {
			return err
		}
		before, _ := metric(gs, "gpustore_bucketstore_queried_blocks")
		at := time.UnixMilli((mint + maxt) / 2)
		// Distinct GPUs, not series: a training job that ends on a node
		// inside the 20 s gives its 8 GPUs a second series (new pod labels).
		v, err := query(gs, fmt.Sprintf(`count(count by (Hostname, gpu) (count_over_time(DCGM_FI_DEV_GPU_TEMP{cluster="gpu-cluster-dev"}[20s] @ %.3f)))`, float64(at.UnixMilli())/1000))
		if err != nil {
			return err
		}
		after, _ := metric(gs, "gpustore_bucketstore_queried_blocks")
		if len(v) != 1 || v[0].Value != 128 || after <= before {
			return fmt.Errorf("block %s at %s: count = %v, bucket selects %v -> %v", id, at.Format(time.TimeOnly), v, before, after)
		}
		return nil
	})

	stopped = true
	if err := s.Stop(); err != nil {
		t.Errorf("stop: %v", err)
	}
}

// bucketOnlyBlock returns a block that is in the bucket and no longer in the
// tenant's local TSDB directory. The oldest block is never chosen: it holds
// the stack's first minute, when the pair had not yet scraped every node.
func bucketOnlyBlock(bucket, tenantDir string) (string, int64, int64, error) {
	type block struct {
		id         string
		mint, maxt int64
	}
	var blocks []block
	metas, _ := filepath.Glob(filepath.Join(bucket, "default", "*", "meta.json"))
	for _, m := range metas {
		b, err := os.ReadFile(m)
		if err != nil {
			return "", 0, 0, err
		}
		var meta struct {
			MinTime, MaxTime int64
		}
		if err := json.Unmarshal(b, &meta); err != nil {
			return "", 0, 0, fmt.Errorf("%s: %w", m, err)
		}
		blocks = append(blocks, block{filepath.Base(filepath.Dir(m)), meta.MinTime, meta.MaxTime})
	}
	slices.SortFunc(blocks, func(a, b block) int { return cmp.Compare(a.mint, b.mint) })
	for i, b := range blocks {
		if i == 0 {
			continue
		}
		if _, err := os.Stat(filepath.Join(tenantDir, b.id)); err == nil {
			continue
		}
		return b.id, b.mint, b.maxt, nil
	}
	return "", 0, 0, fmt.Errorf("no block but the first only in the bucket yet (%d in the bucket)", len(blocks))
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
