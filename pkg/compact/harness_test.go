package compact_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/thanos-io/objstore"

	"github.com/gpustore/gpustore/bench/gpusim"
	"github.com/gpustore/gpustore/bench/load"
	"github.com/gpustore/gpustore/internal/testbin"
	"github.com/gpustore/gpustore/pkg/app"
	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/compact"
	"github.com/gpustore/gpustore/pkg/storage/bucket"
)

const (
	s3Access = "gpustore-test"
	s3Secret = "gpustore-test-secret"
	s3Bucket = "gpustore"
)

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// testStore is the object store a compact test runs against: a real S3
// server (versitygw) on loopback when its binary is installed, else a folder
// bucket (the embedded default, FILESYSTEM), so that a plain
// `go test ./pkg/compact` runs every test on a developer's machine. Under
// CI=true a missing versitygw fails the test instead: CI runs them on S3.
// GPUSTORE_TEST_BUCKET=filesystem picks the folder bucket even when
// versitygw is installed.
type testStore struct {
	s3Addr string // versitygw's address; "" for a folder bucket
	dir    string // the folder bucket's directory
}

func (s testStore) bucket() bucket.Config {
	if s.s3Addr == "" {
		return bucket.Config{Type: bucket.Filesystem, Config: map[string]any{"directory": s.dir}}
	}
	return bucket.Config{Type: bucket.S3, Config: map[string]any{
		"bucket": s3Bucket, "endpoint": s.s3Addr, "access_key": s3Access, "secret_key": s3Secret,
		"insecure": true, "max_retries": 1,
	}}
}

// env is the store as the crash test passes it to its compactor process
// (storeFromEnv reads it back).
func (s testStore) env() string {
	if s.s3Addr == "" {
		return "filesystem:" + s.dir
	}
	return "s3:" + s.s3Addr
}

func storeFromEnv(v string) testStore {
	if dir, ok := strings.CutPrefix(v, "filesystem:"); ok {
		return testStore{dir: dir}
	}
	return testStore{s3Addr: strings.TrimPrefix(v, "s3:")}
}

// startStore starts the test's object store (see testStore).
func startStore(t testing.TB) testStore {
	t.Helper()
	return pickStore(t, testbin.Lookup("versitygw"), os.Getenv("GPUSTORE_TEST_BUCKET"), os.Getenv("CI") == "true")
}

// pickStore decides which store a test gets: versitygw at bin (when not
// ""), else a folder bucket, unless under CI, where S3 is required.
func pickStore(t testing.TB, bin, want string, ci bool) testStore {
	t.Helper()
	switch {
	case strings.EqualFold(want, bucket.Filesystem):
		return testStore{dir: t.TempDir()}
	case bin != "":
		return testStore{s3Addr: startS3(t, bin)}
	case ci:
		t.Fatalf("versitygw is not installed: .ci/run must install it (see Makefile target tools)")
	}
	t.Logf("versitygw is not installed (make tools): running against a folder bucket; CI runs this test against S3")
	return testStore{dir: t.TempDir()}
}

// startS3 runs a real S3 server (versitygw at bin, posix backend) on
// loopback with one bucket, until the test ends, and returns its address.
func startS3(t testing.TB, bin string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "data", s3Bucket), 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	logf, err := os.Create(filepath.Join(dir, "versitygw.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--access", s3Access, "--secret", s3Secret, "--port", addr, "posix", filepath.Join(dir, "data"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start versitygw: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
		_ = logf.Close()
	})
	waitFor(t, 30*time.Second, "versitygw listening", func() error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return err
		}
		return c.Close()
	})
	return addr
}

func openBucket(t testing.TB, s testStore) objstore.Bucket {
	t.Helper()
	bkt, err := bucket.New(s.bucket(), t.TempDir(), quiet(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return bkt
}

func waitFor(t testing.TB, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		if err = f(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s: %v", timeout, what, err)
}

// testConfig is the compactor's default configuration with no waiting:
// marked blocks are deleted at the next pass, partial ones after a second.
func testConfig() compact.Config {
	cfg := compact.DefaultConfig()
	cfg.DeleteDelay = 0
	cfg.PartialDeleteDelay = model.Duration(time.Second)
	cfg.LeaseSettle = model.Duration(50 * time.Millisecond)
	cfg.LeaseTTL = model.Duration(10 * time.Second)
	// No retention: the slices are written at fixed dates that fall out of
	// any retention as the calendar moves on (365 days for downsampled
	// data would empty the 2026 slices' 5m and 1h blocks in 2027).
	cfg.RetentionRaw, cfg.Retention5m, cfg.Retention1h = 0, 0, 0
	// Raw blocks as the TSDB writes them: the encodings have their own
	// tests (encoding_test.go), and encoding every compacted block of every
	// test would add minutes.
	cfg.RawEncoding = block.EncodingNone
	// The compaction tests count blocks and samples of one resolution;
	// downsampling has its own tests (downsample_test.go).
	cfg.Downsample = false
	return cfg
}

func newCompactor(t testing.TB, cfg compact.Config, bkt objstore.Bucket, limits compact.Limits) (*compact.Compactor, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	c, err := compact.New(cfg, bkt, t.TempDir(), limits, quiet(), reg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return c, reg
}

// simSlice is a slice of the simulated GPU cluster written straight into
// TSDB blocks, as receivers would cut them.
type simSlice struct {
	Nodes    int
	Start    time.Time
	Duration time.Duration
	Interval time.Duration
	Block    time.Duration
	// GPUs per node (0: gpusim's default, 8) and Metrics, the metric names
	// kept (nil: all), thin a slice that must span months.
	GPUs    int
	Metrics []string
	// Epoch anchors gpusim's counters and jobs (zero: gpusim's default);
	// a slice that starts before it should start at it.
	Epoch time.Time
}

// write writes the slice's blocks into dir and returns their directories.
func (s simSlice) write(t testing.TB, dir string) []string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	c, err := gpusim.New(gpusim.Config{Nodes: s.Nodes, GPUsPerNode: s.GPUs, Epoch: s.Epoch, TargetLabels: true})
	if err != nil {
		t.Fatal(err)
	}
	var (
		buf   []gpusim.Series
		sb    = labels.NewScratchBuilder(0)
		key   []byte
		dirs  []string
		lsets = map[string]labels.Labels{}
	)
	for blk := s.Start; blk.Before(s.Start.Add(s.Duration)); blk = blk.Add(s.Block) {
		w, err := tsdb.NewBlockWriter(quiet(), dir, s.Block.Milliseconds())
		if err != nil {
			t.Fatal(err)
		}
		for ts := blk; ts.Before(blk.Add(s.Block)); ts = ts.Add(s.Interval) {
			buf = c.AppendSamples(buf[:0], ts, gpusim.Replica{})
			if s.Metrics != nil {
				buf = slices.DeleteFunc(buf, func(sr gpusim.Series) bool { return !slices.Contains(s.Metrics, sr.Name()) })
			}
			app := w.Appender(context.Background())
			for i := range buf {
				sr := &buf[i]
				key = key[:0]
				for _, l := range sr.Labels {
					key = append(append(append(key, l.Name...), 0xff), l.Value...)
				}
				ls, ok := lsets[string(key)]
				if !ok {
					sb.Reset()
					for _, l := range sr.Labels {
						sb.Add(l.Name, l.Value)
					}
					sb.Sort()
					ls = sb.Labels()
					lsets[string(key)] = ls
				}
				if _, err := app.Append(0, ls, sr.T, sr.V); err != nil {
					t.Fatal(err)
				}
			}
			if err := app.Commit(); err != nil {
				t.Fatal(err)
			}
		}
		id, err := w.Flush(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		_ = w.Close()
		setBlockRange(t, filepath.Join(dir, id.String()), blk.UnixMilli(), blk.Add(s.Block).UnixMilli())
		dirs = append(dirs, filepath.Join(dir, id.String()))
	}
	return dirs
}

// setBlockRange gives a block the aligned range a receiver's head would cut
// ([k·2h, (k+1)·2h)); the TSDB's block writer ends it at the last sample.
func setBlockRange(t testing.TB, dir string, mint, maxt int64) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, block.MetaFilename))
	if err != nil {
		t.Fatal(err)
	}
	var m tsdb.BlockMeta
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	m.MinTime, m.MaxTime = mint, maxt
	if b, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, block.MetaFilename), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// upload ships local blocks for tenant as a receiver's shipper does.
func upload(t testing.TB, bkt objstore.Bucket, tenant string, labels map[string]string, dirs ...string) []block.Meta {
	t.Helper()
	var out []block.Meta
	for _, d := range dirs {
		bm, err := block.ReadLocalMeta(d)
		if err != nil {
			t.Fatal(err)
		}
		if labels == nil {
			labels = map[string]string{}
		}
		meta := block.Meta{BlockMeta: bm, GPUStore: block.GPUStoreMeta{
			Version: block.MetaVersion, Tenant: tenant, Labels: labels, Source: block.SourceReceive,
		}}
		if err := block.Upload(context.Background(), bkt, d, meta); err != nil {
			t.Fatal(err)
		}
		out = append(out, meta)
	}
	return out
}

// bucketState is what a tenant's directory in the bucket holds.
type bucketState struct {
	live    []*block.Meta // complete, not marked for deletion
	marked  []ulid.ULID
	partial []ulid.ULID // directories without meta.json
	nocomp  []ulid.ULID
	corrupt []ulid.ULID // meta.json does not parse
}

func readBucket(t testing.TB, bkt objstore.Bucket, tenant string) bucketState {
	t.Helper()
	ctx := context.Background()
	files := map[ulid.ULID]map[string]bool{}
	err := bkt.Iter(ctx, tenant+"/", func(name string) error {
		parts := strings.SplitN(strings.TrimPrefix(name, tenant+"/"), "/", 2)
		id, err := ulid.ParseStrict(parts[0])
		if err != nil || len(parts) < 2 {
			return nil
		}
		if files[id] == nil {
			files[id] = map[string]bool{}
		}
		files[id][parts[1]] = true
		return nil
	}, objstore.WithRecursiveIter())
	if err != nil {
		t.Fatal(err)
	}
	var st bucketState
	for id, fs := range files {
		if fs[block.NoCompactMarkFilename] {
			st.nocomp = append(st.nocomp, id)
		}
		switch {
		case !fs[block.MetaFilename]:
			st.partial = append(st.partial, id)
		case fs[block.DeletionMarkFilename]:
			st.marked = append(st.marked, id)
		default:
			m, err := block.ReadMeta(ctx, bkt, tenant, id)
			if errors.Is(err, block.ErrBadMeta) {
				st.corrupt = append(st.corrupt, id)
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			st.live = append(st.live, m)
		}
	}
	sort.Slice(st.live, func(i, j int) bool { return st.live[i].MinTime < st.live[j].MinTime })
	return st
}

func (s bucketState) samples() uint64 {
	var n uint64
	for _, m := range s.live {
		n += m.Stats.NumSamples
	}
	return n
}

func (s bucketState) spans() string {
	var out []string
	for _, m := range s.live {
		out = append(out, fmt.Sprintf("%s+%s(L%d)", time.UnixMilli(m.MinTime).UTC().Format("01-02T15"),
			time.Duration(m.MaxTime-m.MinTime)*time.Millisecond, m.Compaction.Level))
	}
	return strings.Join(out, " ")
}

// compactUntilStable runs passes until one changes nothing in the bucket.
func compactUntilStable(t testing.TB, c *compact.Compactor, bkt objstore.Bucket, tenant string) bucketState {
	t.Helper()
	prev := ""
	for i := 0; i < 20; i++ {
		if err := c.CompactTenant(context.Background(), tenant); err != nil {
			t.Fatalf("pass %d: %v", i, err)
		}
		st := readBucket(t, bkt, tenant)
		cur := fmt.Sprint(st.spans(), st.marked, st.partial)
		if cur == prev {
			return st
		}
		prev = cur
	}
	t.Fatal("compaction did not settle in 20 passes")
	return bucketState{}
}

// startQuery runs gpustore's query role (in process) over the bucket: the
// real query path (PromQL engine, tenant queryable, bucket store). The query
// role runs beside an ingest role with an empty TSDB, as it must (see
// app.checkRoles): every answer comes from the bucket.
func startQuery(t testing.TB, bc bucket.Config) (*app.App, string) {
	t.Helper()
	cfg := app.DefaultConfig()
	cfg.Target = app.Ingest + "," + app.Query
	cfg.Server.ListenAddress = "127.0.0.1:0"
	cfg.TSDB.Dir = t.TempDir()
	cfg.Bucket = bc
	cfg.BucketStore.SyncInterval = model.Duration(time.Hour) // synced by the test
	cfg.Query.MaxSamples = 200_000_000
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	a, err := app.New(cfg, quiet())
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

// answers runs the bench dashboard query set (bench/load) as range queries
// over [start, end] with Grafana's step and returns each answer's JSON.
func answers(t testing.TB, a *app.App, base, tenant string, start, end time.Time, node string) map[string]string {
	t.Helper()
	if err := a.BucketStore.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	step := load.GrafanaStep(end.Sub(start), time.Minute)
	out := map[string]string{}
	for _, q := range load.DashboardQueries(node) {
		form := url.Values{
			"query": {q.Expr}, "start": {strconv.FormatInt(start.Unix(), 10)},
			"end": {strconv.FormatInt(end.Unix(), 10)}, "step": {strconv.FormatFloat(step.Seconds(), 'f', -1, 64)},
		}
		req, _ := http.NewRequest(http.MethodPost, base+"/api/v1/query_range", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("X-Scope-OrgID", tenant)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", q.Expr, resp.StatusCode, body)
		}
		var r struct {
			Data struct {
				Result []json.RawMessage `json:"result"`
			} `json:"data"`
		}
		if err := json.Unmarshal(body, &r); err != nil {
			t.Fatal(err)
		}
		res := make([]string, len(r.Data.Result))
		for i, s := range r.Data.Result {
			res[i] = string(s)
		}
		sort.Strings(res)
		out[q.Panel] = strings.Join(res, "\n")
	}
	return out
}

func compareAnswers(t testing.TB, what string, want, got map[string]string) {
	t.Helper()
	nonEmpty := 0
	for panel, w := range want {
		if w != "" {
			nonEmpty++
		}
		if got[panel] != w {
			t.Errorf("%s: panel %q answers differently\nwant %.600s\ngot  %.600s", what, panel, w, got[panel])
		}
	}
	if nonEmpty < len(want)/2 {
		t.Fatalf("%s: only %d of %d panels have data: the comparison proves little", what, nonEmpty, len(want))
	}
}

func counter(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return sum
}
