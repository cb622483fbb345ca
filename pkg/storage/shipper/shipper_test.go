package shipper

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/metadata"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/thanos-io/objstore"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/readopts"
	"github.com/gpustore/gpustore/pkg/storage/bucketstore"
	"github.com/gpustore/gpustore/pkg/tenantdb"
)

const (
	tenant = "team-a"
	minute = int64(60_000)
	t0     = int64(1_700_000_040_000) // a whole minute
)

// testBucket wraps a bucket: it can be down (every call fails), fail the
// upload of meta.json (a crash between the block's files and its meta), and
// counts uploads.
type testBucket struct {
	objstore.Bucket
	down       atomic.Bool
	failMeta   atomic.Bool
	uploads    atomic.Int64
	metaWrites atomic.Int64
}

var errDown = errors.New("bucket down (test)")

func (b *testBucket) Upload(ctx context.Context, name string, r io.Reader, opts ...objstore.ObjectUploadOption) error {
	if b.down.Load() {
		return errDown
	}
	if strings.HasSuffix(name, "/"+block.MetaFilename) {
		if b.failMeta.Load() {
			return errors.New("killed before meta.json (test)")
		}
		b.metaWrites.Add(1)
	}
	b.uploads.Add(1)
	return b.Bucket.Upload(ctx, name, r, opts...)
}

func (b *testBucket) Exists(ctx context.Context, name string) (bool, error) {
	if b.down.Load() {
		return false, errDown
	}
	return b.Bucket.Exists(ctx, name)
}

func (b *testBucket) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	if b.down.Load() {
		return nil, errDown
	}
	return b.Bucket.Get(ctx, name)
}

type env struct {
	t   *testing.T
	dir string
	bkt *testBucket
	dbs *tenantdb.Manager
	sh  *Shipper
	reg *prometheus.Registry

	mtx sync.Mutex
	ts  int64 // next sample time
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// newEnv opens a tenant database with minute blocks and one minute of local
// retention, behind a shipper over bkt.
func newEnv(t *testing.T, dir string, bkt *testBucket) *env {
	t.Helper()
	cfg := tenantdb.DefaultConfig()
	cfg.Dir = dir
	cfg.BlockDuration = model.Duration(time.Minute)
	cfg.Retention = model.Duration(time.Minute)
	dbs, err := tenantdb.NewManager(cfg, quiet(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	scfg := DefaultConfig()
	scfg.MinBackoff = model.Duration(time.Millisecond)
	scfg.MaxBackoff = model.Duration(time.Millisecond)
	scfg.ExternalLabels = map[string]string{"receive_replica": "r0"}
	reg := prometheus.NewRegistry()
	sh, err := New(scfg, bkt, dbs, quiet(), reg)
	if err != nil {
		t.Fatal(err)
	}
	dbs.SetDeletionGate(sh.MayDelete)
	if err := dbs.OpenExisting(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := dbs.Get(tenant); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, dir: dir, bkt: bkt, dbs: dbs, sh: sh, reg: reg, ts: t0}
	t.Cleanup(func() { _ = dbs.Close() })
	return e
}

var testLabels = []labels.Labels{
	labels.FromStrings("__name__", "DCGM_FI_DEV_GPU_TEMP", "gpu", "0", "Hostname", "node-0"),
	labels.FromStrings("__name__", "DCGM_FI_DEV_GPU_TEMP", "gpu", "1", "Hostname", "node-0"),
	labels.FromStrings("__name__", "DCGM_FI_DEV_POWER_USAGE", "gpu", "0", "Hostname", "node-0"),
}

// ingest appends samples every 15s for the given minutes, then compacts
// what the head can cut into blocks.
func (e *env) ingest(minutes int) {
	e.t.Helper()
	e.mtx.Lock()
	defer e.mtx.Unlock()
	db := e.dbs.Existing(tenant)
	ctx := context.Background()
	end := e.ts + int64(minutes)*minute
	for ; e.ts < end; e.ts += 15_000 {
		app := db.Appender(ctx)
		for i, ls := range testLabels {
			if _, err := app.Append(0, ls, e.ts, float64(e.ts/1000%1000+int64(i))); err != nil {
				e.t.Fatal(err)
			}
		}
		if err := app.Commit(); err != nil {
			e.t.Fatal(err)
		}
	}
	if err := db.Compact(ctx); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) localBlocks() []ulid.ULID {
	var ids []ulid.ULID
	for _, b := range e.dbs.Existing(tenant).Blocks() {
		ids = append(ids, b.Meta().ULID)
	}
	return ids
}

func (e *env) sync(force bool) error {
	return e.sh.SyncTenant(context.Background(), tenant, e.dbs.Existing(tenant).DB, force)
}

// bucketBlocks reads the bucket as the query path does.
func bucketStore(t *testing.T, bkt objstore.Bucket) *bucketstore.Store {
	t.Helper()
	s, err := bucketstore.New(bucketstore.DefaultConfig(), bkt, quiet(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

// samples returns every (series, t, v) of q as a sorted string set.
func samples(t *testing.T, q storage.Querier) map[string]int {
	t.Helper()
	out := map[string]int{}
	ss := q.Select(context.Background(), true, nil, labels.MustNewMatcher(labels.MatchRegexp, "__name__", ".+"))
	for ss.Next() {
		it := ss.At().Iterator(nil)
		for it.Next() == chunkenc.ValFloat {
			ts, v := it.At()
			out[ss.At().Labels().String()+"@"+time.UnixMilli(ts).UTC().Format(time.TimeOnly)+"="+formatFloat(v)]++
		}
	}
	if err := ss.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func formatFloat(v float64) string { return model.SampleValue(v).String() }

func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			if ms := mf.GetMetric(); len(ms) > 0 {
				if ms[0].GetGauge() != nil {
					return ms[0].GetGauge().GetValue()
				}
				return ms[0].GetCounter().GetValue()
			}
		}
	}
	return 0
}

// A tenant's counters exist at 0 once the shipper has looked at it, before
// its first upload or failure: GpustoreShipperUploadFailing's increase()
// would miss the first failure of a counter born at 1.
func TestTenantCountersExistBeforeTheFirstUpload(t *testing.T) {
	e := newEnv(t, t.TempDir(), &testBucket{Bucket: objstore.NewInMemBucket()})
	if err := e.sync(false); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"gpustore_shipper_uploaded_blocks_total", "gpustore_shipper_uploaded_bytes_total", "gpustore_shipper_upload_failures_total"} {
		if n := testutil.CollectAndCount(e.reg, name); n != 1 {
			t.Errorf("%d series of %s after a look at a tenant without blocks, want 1", n, name)
		}
	}
}

// TestShipsEveryBlockAndDeletesOnlyShippedOnes: an outage delays uploads and
// keeps every block on disk past the local retention; when the bucket is
// back every block is uploaded whole (meta.json with the gpustore section),
// and only then do blocks past retention leave the disk. The bucket then
// holds every sample exactly once.
func TestShipsEveryBlockAndDeletesOnlyShippedOnes(t *testing.T) {
	bkt := &testBucket{Bucket: objstore.NewInMemBucket()}
	e := newEnv(t, t.TempDir(), bkt)

	bkt.down.Store(true)
	e.ingest(10)
	cut := e.localBlocks()
	if len(cut) < 7 {
		t.Fatalf("10 minutes of samples cut %d minute blocks", len(cut))
	}
	if err := e.sync(true); !errors.Is(err, errDown) {
		t.Fatalf("sync with the bucket down: %v", err)
	}
	e.ingest(3) // more blocks, and a reload that applies retention
	if got := e.localBlocks(); len(got) < len(cut)+2 {
		t.Fatalf("unshipped blocks were deleted during the outage: %d left of %d+", len(got), len(cut)+2)
	}
	_ = e.sync(true)
	if n := gauge(t, e.reg, "gpustore_shipper_pending_blocks"); n < float64(len(cut)+2) {
		t.Fatalf("pending blocks gauge %v", n)
	}
	if n := testutil.ToFloat64(e.sh.m.failures.WithLabelValues(tenant)); n < 2 {
		t.Fatalf("upload failures %v", n)
	}
	time.Sleep(10 * time.Millisecond)
	if age := gauge(t, e.reg, "gpustore_shipper_oldest_pending_block_age_seconds"); age <= 0 {
		t.Fatalf("oldest pending age %v", age)
	}

	bkt.down.Store(false)
	local := e.localBlocks()
	if err := e.sync(false); err != nil {
		t.Fatal(err)
	}
	if n := gauge(t, e.reg, "gpustore_shipper_pending_blocks"); n != 0 {
		t.Fatalf("pending after recovery: %v", n)
	}
	if got := testutil.ToFloat64(e.sh.m.uploaded.WithLabelValues(tenant)); int(got) != len(local) {
		t.Fatalf("uploaded %v blocks, want %d", got, len(local))
	}
	for _, id := range local {
		m, err := block.ReadMeta(context.Background(), bkt, tenant, id)
		if err != nil {
			t.Fatalf("block %s: %v", id, err)
		}
		if m.GPUStore.Source != block.SourceReceive || m.GPUStore.Downsample.Resolution != 0 || m.GPUStore.Labels["receive_replica"] != "r0" || len(m.GPUStore.Files) != 2 {
			t.Fatalf("meta.json of %s: %+v", id, m.GPUStore)
		}
	}
	st, err := os.ReadFile(filepath.Join(e.dir, "tenants", tenant, StateFilename))
	if err != nil || !bytes.Contains(st, []byte(local[0].String())) {
		t.Fatalf("shipper.json: %s %v", st, err)
	}

	// Blocks past retention leave the disk now that they are shipped.
	e.ingest(2)
	after := e.localBlocks()
	if len(after) >= len(local) {
		t.Fatalf("shipped blocks past retention were kept: %d before, %d after", len(local), len(after))
	}
	if err := e.sync(false); err != nil {
		t.Fatal(err)
	}

	// The bucket holds every sample the head cut into blocks, once.
	s := bucketStore(t, bkt)
	q, err := s.Querier(tenant, 0, 1<<62, readopts.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	got := samples(t, q)
	var maxt int64
	for _, m := range s.Blocks(tenant) {
		maxt = max(maxt, m.MaxTime)
	}
	want := (maxt - t0) / 15_000 * int64(len(testLabels))
	if int64(len(got)) != want {
		t.Fatalf("bucket holds %d distinct samples up to %d, want %d", len(got), maxt, want)
	}
	for k, n := range got {
		if n != 1 {
			t.Fatalf("sample %s in %d blocks", k, n)
		}
	}
}

// TestCrashDuringUploadIsUploadedWholeAfterRestart: the process dies after
// the block's chunks and index are in the bucket but before its meta.json.
// The partial block is never read; a fresh shipper over the same data
// directory uploads the block whole.
func TestCrashDuringUploadIsUploadedWholeAfterRestart(t *testing.T) {
	dir := t.TempDir()
	mem := objstore.NewInMemBucket()
	bkt := &testBucket{Bucket: mem}
	e := newEnv(t, dir, bkt)
	e.ingest(4)
	ids := e.localBlocks()
	if len(ids) == 0 {
		t.Fatal("no block cut")
	}
	bkt.failMeta.Store(true)
	if err := e.sync(true); err == nil {
		t.Fatal("upload without meta.json succeeded")
	}
	objs := mem.Objects()
	if _, ok := objs[block.ObjectName(tenant, ids[0], block.IndexFilename)]; !ok {
		t.Fatalf("the crash was not after the index: %v", keys(objs))
	}
	// Corrupt what the crashed upload left, to be sure it is overwritten and never read.
	for name := range objs {
		_ = mem.Upload(context.Background(), name, strings.NewReader("torn"))
	}
	s := bucketStore(t, mem)
	if n := len(s.Blocks(tenant)); n != 0 {
		t.Fatalf("partial block visible to queries: %d blocks", n)
	}
	lq := mustQuerier(t, e)
	before := samples(t, lq)
	lq.Close()
	if err := e.dbs.Close(); err != nil {
		t.Fatal(err)
	}

	// Restart: a fresh manager and shipper over the same directory.
	bkt2 := &testBucket{Bucket: mem}
	e2 := newEnv(t, dir, bkt2)
	if e2.sh.Shipped(tenant, ids[0]) {
		t.Fatal("a block whose meta.json was never written is recorded as shipped")
	}
	if err := e2.sync(true); err != nil {
		t.Fatal(err)
	}
	for _, id := range e2.localBlocks() {
		if !e2.sh.Shipped(tenant, id) {
			t.Fatalf("block %s not shipped after restart", id)
		}
	}
	s = bucketStore(t, mem)
	if n := len(s.Blocks(tenant)); n != len(e2.localBlocks()) {
		t.Fatalf("bucket has %d complete blocks, want %d", n, len(e2.localBlocks()))
	}
	q, err := s.Querier(tenant, 0, 1<<62, readopts.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	got := samples(t, q)
	for k := range got {
		if before[k] != 1 {
			t.Fatalf("bucket sample %s not in the local blocks", k)
		}
	}
	var inBlocks int
	for _, m := range s.Blocks(tenant) {
		inBlocks += int(m.Stats.NumSamples)
	}
	if len(got) != inBlocks {
		t.Fatalf("read %d samples from the bucket, the blocks' metas count %d", len(got), inBlocks)
	}

	// Another restart uploads nothing again (shipper.json), and even without
	// shipper.json only checks the bucket.
	if err := e2.dbs.Close(); err != nil {
		t.Fatal(err)
	}
	bkt3 := &testBucket{Bucket: mem}
	e3 := newEnv(t, dir, bkt3)
	if err := e3.sync(true); err != nil || bkt3.uploads.Load() != 0 {
		t.Fatalf("restart re-uploaded %d objects (err %v)", bkt3.uploads.Load(), err)
	}
	if err := e3.dbs.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "tenants", tenant, StateFilename)); err != nil {
		t.Fatal(err)
	}
	bkt4 := &testBucket{Bucket: mem}
	e4 := newEnv(t, dir, bkt4)
	if err := e4.sync(true); err != nil || bkt4.uploads.Load() != 0 {
		t.Fatalf("without shipper.json: re-uploaded %d objects (err %v)", bkt4.uploads.Load(), err)
	}
	for _, id := range e4.localBlocks() {
		if !e4.sh.Shipped(tenant, id) {
			t.Fatalf("block %s in the bucket not recorded as shipped", id)
		}
	}
}

func mustQuerier(t *testing.T, e *env) storage.Querier {
	t.Helper()
	q, err := e.dbs.Existing(tenant).Querier(0, 1<<62)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestTornMetaInTheBucketIsUploadedAgain: the process died after uploading
// a block's meta.json and before recording it in shipper.json, and the
// meta.json it left does not parse (empty after a power cut on a folder
// bucket without durable writes, or cut short). After the restart the block
// is uploaded again whole, rather than recorded as shipped and then deleted
// locally while the bucket's copy is unreadable.
func TestTornMetaInTheBucketIsUploadedAgain(t *testing.T) {
	dir := t.TempDir()
	mem := objstore.NewInMemBucket()
	e := newEnv(t, dir, &testBucket{Bucket: mem})
	e.ingest(4)
	if err := e.sync(true); err != nil {
		t.Fatal(err)
	}
	ids := e.localBlocks()
	if err := e.dbs.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "tenants", tenant, StateFilename)); err != nil {
		t.Fatal(err)
	}
	torn := map[ulid.ULID]string{ids[0]: "", ids[len(ids)-1]: `{"ulid":"01`}
	for id, content := range torn {
		if err := mem.Upload(context.Background(), block.ObjectName(tenant, id, block.MetaFilename), strings.NewReader(content)); err != nil {
			t.Fatal(err)
		}
	}

	bkt := &testBucket{Bucket: mem}
	e2 := newEnv(t, dir, bkt)
	if err := e2.sync(true); err != nil {
		t.Fatal(err)
	}
	if n := bkt.metaWrites.Load(); n != int64(len(torn)) {
		t.Errorf("%d meta.json uploaded after the restart, want %d (the torn ones)", n, len(torn))
	}
	for id := range torn {
		if _, err := block.ReadMeta(context.Background(), mem, tenant, id); err != nil {
			t.Errorf("block %s after the restart: %v", id, err)
		}
		if !e2.sh.Shipped(tenant, id) {
			t.Errorf("block %s not recorded as shipped", id)
		}
	}
}

// TestShipsTheBlocksMetricTypes: each shipped block carries the metric types
// of its families from the tenant's metadata (as remote write sent them),
// for the compactor, which may see nothing but the bucket; families the
// block does not hold are left out.
func TestShipsTheBlocksMetricTypes(t *testing.T) {
	mem := objstore.NewInMemBucket()
	e := newEnv(t, t.TempDir(), &testBucket{Bucket: mem})
	md := e.dbs.Existing(tenant).Metadata
	md.Set("DCGM_FI_DEV_GPU_TEMP", metadata.Metadata{Type: model.MetricTypeGauge, Unit: "celsius"})
	md.Set("DCGM_FI_DEV_POWER_USAGE", metadata.Metadata{Type: model.MetricTypeGauge})
	md.Set("DCGM_FI_DEV_POWER_VIOLATION", metadata.Metadata{Type: model.MetricTypeCounter}) // not in the blocks
	e.ingest(4)
	if err := e.sync(true); err != nil {
		t.Fatal(err)
	}
	ids := e.localBlocks()
	if len(ids) == 0 {
		t.Fatal("no block cut")
	}
	want := block.Types{"DCGM_FI_DEV_GPU_TEMP": model.MetricTypeGauge, "DCGM_FI_DEV_POWER_USAGE": model.MetricTypeGauge}
	for _, id := range ids {
		got, err := block.ReadTypes(context.Background(), mem, tenant, id)
		if err != nil || !maps.Equal(got, want) {
			t.Errorf("block %s: types %v (err %v), want %v", id, got, err, want)
		}
	}
}
