package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/golang/snappy"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/prompb"

	"github.com/gpustore/gpustore/internal/testbin"
	"github.com/gpustore/gpustore/pkg/app"
	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/storage/bucket"
)

// s3Bucket is the bucket every objectStore serves (versitygw's posix
// backend keeps it as the directory dir/data/s3Bucket).
const s3Bucket = testbin.BucketName

// objectStore is a real object-storage server on loopback: versitygw (S3),
// fake-gcs-server (GCS) or Azurite (AZURE), from testbin.
type objectStore struct {
	*testbin.ObjectStore
	dir string // the server's directory
}

// startObjectStore starts provider's server until the test ends.
func startObjectStore(t *testing.T, provider string) *objectStore {
	t.Helper()
	s := testbin.StartObjectStore(t, provider)
	return &objectStore{ObjectStore: s, dir: s.Dir}
}

// startS3 starts versitygw with one bucket, s3Bucket.
func startS3(t *testing.T) *objectStore { return startObjectStore(t, testbin.S3) }

// forEachStore runs test once per object-storage provider gpustore builds
// (S3, GCS, AZURE), each against its own real server: a behaviour of the
// shipper or the bucket store is checked on every cloud's client.
func forEachStore(t *testing.T, test func(t *testing.T, store *objectStore)) {
	for _, provider := range testbin.ObjectStoreProviders {
		t.Run(provider, func(t *testing.T) { test(t, startObjectStore(t, provider)) })
	}
}

// start brings the server back on its address, with the objects it had.
func (s *objectStore) start() { s.Start() }

// stop kills the server (an outage, not a clean shutdown).
func (s *objectStore) stop() { s.Stop() }

func (s *objectStore) bucketConfig() bucket.Config {
	return bucket.Config{Type: s.Type(), Config: s.Config()}
}

// withBucket configures gpustore for minute blocks shipped to s (any provider),
// one minute of local retention, and fast shipping and listing.
func withBucket(s *objectStore) func(*app.Config) {
	return func(c *app.Config) {
		c.TSDB.BlockDuration = model.Duration(time.Minute)
		c.TSDB.Retention = model.Duration(time.Minute)
		c.Bucket = s.bucketConfig()
		c.Shipper.Interval = model.Duration(500 * time.Millisecond)
		c.Shipper.MinBackoff = model.Duration(200 * time.Millisecond)
		c.Shipper.MaxBackoff = model.Duration(time.Second)
		c.BucketStore.SyncInterval = model.Duration(time.Second)
		c.BucketStore.PageSize = 4 << 10
		c.BucketStore.CacheSize = 256 << 10
	}
}

// gpuSeries are the label sets the tests write: 4 nodes × 8 GPUs, a gauge and a counter.
func gpuSeries() []prompb.TimeSeries {
	var out []prompb.TimeSeries
	for n := 0; n < 4; n++ {
		for g := 0; g < 8; g++ {
			for _, m := range []string{"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"} {
				out = append(out, prompb.TimeSeries{Labels: []prompb.Label{
					{Name: "__name__", Value: m},
					{Name: "Hostname", Value: fmt.Sprintf("node-%d", n)},
					{Name: "UUID", Value: fmt.Sprintf("GPU-%d-%d", n, g)},
					{Name: "gpu", Value: fmt.Sprint(g)},
				}})
			}
		}
	}
	return out
}

func gpuValue(i int, ts int64) float64 {
	if i%2 == 1 { // the energy counter
		return float64(ts/1000) * float64(300+i)
	}
	return float64(40 + (int64(i)*7+ts/15000)%45)
}

// writer remote-writes gpuSeries every 15s of sample time.
type writer struct {
	t      *testing.T
	url    string
	next   int64 // next sample timestamp
	series []prompb.TimeSeries
}

func newWriter(t *testing.T, url string, start int64) *writer {
	return &writer{t: t, url: url, next: start, series: gpuSeries()}
}

// write sends samples up to (not including) until, one request per minute of samples.
func (w *writer) write(until int64) {
	w.t.Helper()
	for w.next < until {
		end := min(until, w.next+60_000)
		req := &prompb.WriteRequest{}
		for i, s := range w.series {
			ts := prompb.TimeSeries{Labels: s.Labels}
			for t := w.next; t < end; t += 15_000 {
				ts.Samples = append(ts.Samples, prompb.Sample{Timestamp: t, Value: gpuValue(i, t)})
			}
			req.Timeseries = append(req.Timeseries, ts)
		}
		raw, err := req.Marshal()
		if err != nil {
			w.t.Fatal(err)
		}
		hreq, _ := http.NewRequest(http.MethodPost, w.url+"/api/v1/write", bytes.NewReader(snappy.Encode(nil, raw)))
		hreq.Header.Set("Content-Type", "application/x-protobuf")
		hreq.Header.Set("Content-Encoding", "snappy")
		hreq.Header.Set("X-Prometheus-Remote-Write-Version", "0.1.0")
		resp, err := http.DefaultClient.Do(hreq)
		if err != nil {
			w.t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			w.t.Fatalf("remote write [%d,%d): %d %s", w.next, end, resp.StatusCode, body)
		}
		w.next = ((end + 14_999) / 15_000) * 15_000
	}
}

// rawSamples returns every sample of metric in [from, to] via the query API.
func rawSamples(t *testing.T, url, metric string, from, to int64) map[string][]model.SamplePair {
	t.Helper()
	api := promClient(t, url)
	rng := time.Duration(to-from+1) * time.Millisecond
	q := fmt.Sprintf("%s[%dms]", metric, rng.Milliseconds())
	v, _, _, err := api.Query(context.Background(), q, time.UnixMilli(to))
	if err != nil {
		t.Fatalf("query %s: %v", q, err)
	}
	out := map[string][]model.SamplePair{}
	for _, s := range v.(model.Matrix) {
		out[s.Metric.String()] = s.Values
	}
	return out
}

func localBlocks(a *app.App, tenant string) int {
	db := a.DBs.Existing(tenant)
	if db == nil {
		return 0
	}
	return len(db.Blocks())
}

// TestBlocksRoundTripThroughTheBucket: samples ingested over half an hour
// are cut into minute blocks, uploaded to a real object store (S3, GCS and
// Azure emulators) and removed from local disk once past the local
// retention; every query then answers exactly as a gpustore that kept
// everything on local disk and was fed the same samples.
func TestBlocksRoundTripThroughTheBucket(t *testing.T) {
	forEachStore(t, testBlocksRoundTrip)
}

func testBlocksRoundTrip(t *testing.T, store *objectStore) {
	a, url := startGpustore(t, withBucket(store))
	_, refURL := startGpustore(t, func(c *app.Config) { // the reference: everything local
		c.TSDB.BlockDuration = model.Duration(time.Minute)
		c.Shipper.Enabled = false
	})
	now := time.Now().UnixMilli() / 60_000 * 60_000
	start := now - 30*60_000
	newWriter(t, url, start).write(now)
	newWriter(t, refURL, start).write(now)

	// Cut into minute blocks, uploaded, then gone from local disk (past the
	// one-minute retention).
	waitFor(t, 90*time.Second, "blocks shipped and removed locally", func() error {
		if n := len(a.BucketStore.Blocks("default")); n < 25 {
			return fmt.Errorf("%d blocks in the bucket", n)
		}
		if p := a.Shipper.Pending("default"); len(p) > 0 {
			return fmt.Errorf("%d blocks pending upload", len(p))
		}
		if n := localBlocks(a, "default"); n > 3 {
			return fmt.Errorf("%d local blocks left", n)
		}
		return nil
	})
	ctx := context.Background()
	metas := a.BucketStore.Blocks("default")
	dirs := 0
	if err := a.Bucket.Iter(ctx, "default/", func(string) error { dirs++; return nil }); err != nil {
		t.Fatal(err)
	}
	if dirs < len(metas) {
		t.Fatalf("%s lists %d block directories for %d blocks", store.Provider, dirs, len(metas))
	}
	if m := metas[0]; m.GPUStore.Tenant != "default" || m.GPUStore.Source != block.SourceReceive || m.GPUStore.Downsample.Resolution != 0 {
		t.Fatalf("meta.json: %+v", m.GPUStore)
	}

	queries := []string{
		`DCGM_FI_DEV_GPU_TEMP`,
		`sum by (Hostname) (rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[2m]))`,
		`max_over_time(DCGM_FI_DEV_GPU_TEMP{gpu=~"[0-3]"}[5m])`,
		`count(DCGM_FI_DEV_GPU_TEMP) by (gpu)`,
		`avg(DCGM_FI_DEV_GPU_TEMP{Hostname!="node-1"})`,
	}
	api, ref := promClient(t, url), promClient(t, refURL)
	fetchedBefore := a.BucketStore.CacheStats().FetchedBytes
	for _, q := range queries {
		want, _, _, err := ref.QueryRange(ctx, q, promv1Range(start, now))
		if err != nil {
			t.Fatalf("reference %s: %v", q, err)
		}
		got, _, _, err := api.QueryRange(ctx, q, promv1Range(start, now))
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		if !strings.Contains(canonical(want), ":") {
			t.Fatalf("%s: empty reference answer", q)
		}
		if canonical(got) != canonical(want) {
			t.Errorf("%s: the answer from the bucket differs from the local one\nwant:\n%.1500s\ngot:\n%.1500s", q, canonical(want), canonical(got))
		}
	}
	end := now - 1
	if got, want := rawSamples(t, url, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", start, end), rawSamples(t, refURL, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", start, end); fmt.Sprint(got) != fmt.Sprint(want) || len(got) != 32 {
		t.Errorf("raw samples from the bucket differ from the local ones (%d and %d series)", len(got), len(want))
	}
	for _, ep := range []string{"/api/v1/labels", "/api/v1/label/Hostname/values", "/api/v1/series?match[]=DCGM_FI_DEV_GPU_TEMP"} {
		if got, want := getBody(t, url+ep+"&start="+fmt.Sprint(start/1000)), getBody(t, refURL+ep+"&start="+fmt.Sprint(start/1000)); got != want {
			t.Errorf("%s: from the bucket %.300s, locally %.300s", ep, got, want)
		}
	}
	st := a.BucketStore.CacheStats()
	if st.FetchedBytes == fetchedBefore {
		t.Fatal("the queries read nothing from the bucket")
	}
	if st.Bytes > st.MaxBytes {
		t.Fatalf("cache holds %d bytes over its bound %d", st.Bytes, st.MaxBytes)
	}
	t.Logf("%d blocks in %s, %d local; queries fetched %d bytes in %d range requests; cache %d/%d bytes",
		len(metas), store.Provider, localBlocks(a, "default"), st.FetchedBytes-fetchedBefore, st.Requests, st.Bytes, st.MaxBytes)
}

func getBody(t *testing.T, u string) string {
	t.Helper()
	if !strings.Contains(u, "?") {
		u = strings.Replace(u, "&", "?", 1)
	}
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %s", u, resp.StatusCode, b)
	}
	return string(b)
}

// TestBucketOutageLosesNothing: the object store (S3, GCS, Azure) dies
// while samples keep arriving over several block periods. Ingestion goes on,
// blocks wait on local disk (past their retention), and once the store is
// back every block is uploaded: every sample is in the bucket exactly once.
func TestBucketOutageLosesNothing(t *testing.T) {
	forEachStore(t, testOutageLosesNothing)
}

func testOutageLosesNothing(t *testing.T, s3 *objectStore) {
	a, url := startGpustore(t, withBucket(s3))
	now := time.Now().UnixMilli() / 60_000 * 60_000
	start := now - 40*60_000
	w := newWriter(t, url, start)
	w.write(start + 10*60_000)
	waitFor(t, 60*time.Second, "first blocks shipped", func() error {
		if n := len(a.BucketStore.Blocks("default")); n < 5 {
			return fmt.Errorf("%d blocks in the bucket", n)
		}
		return nil
	})

	s3.stop()
	// Twenty more minutes of samples: about twenty blocks cut during the outage.
	for m := int64(11); m <= 30; m++ {
		w.write(start + m*60_000)
		time.Sleep(100 * time.Millisecond)
	}
	waitFor(t, 60*time.Second, "blocks cut and failing to upload", func() error {
		if p := len(a.Shipper.Pending("default")); p < 15 {
			return fmt.Errorf("%d blocks pending", p)
		}
		return nil
	})
	failures := metricSum(t, a, "gpustore_shipper_upload_failures_total")
	if failures == 0 {
		t.Fatal("no upload failure counted during the outage")
	}
	time.Sleep(3 * time.Second) // several reloads: retention must not delete unshipped blocks
	pending := len(a.Shipper.Pending("default"))
	if n := localBlocks(a, "default"); n < pending {
		t.Fatalf("%d local blocks but %d pending", n, pending)
	}

	s3.start()
	w.write(start + 35*60_000)
	waitFor(t, 90*time.Second, "every block uploaded after the outage", func() error {
		if p := a.Shipper.Pending("default"); len(p) > 0 {
			return fmt.Errorf("%d pending", len(p))
		}
		if err := a.BucketStore.Sync(context.Background()); err != nil {
			return err
		}
		return nil
	})

	// The bucket's blocks do not overlap, and hold every sample before the
	// last block's end exactly once.
	metas := a.BucketStore.Blocks("default")
	sort.Slice(metas, func(i, j int) bool { return metas[i].MinTime < metas[j].MinTime })
	var inBucket uint64
	for i, m := range metas {
		if i > 0 && m.MinTime < metas[i-1].MaxTime {
			t.Fatalf("blocks %s and %s overlap", metas[i-1].ULID, m.ULID)
		}
		inBucket += m.Stats.NumSamples
	}
	last := metas[len(metas)-1].MaxTime
	want := uint64((last-start+14_999)/15_000) * uint64(len(w.series))
	if inBucket != want {
		t.Fatalf("bucket holds %d samples up to %d, want %d (missing or duplicated)", inBucket, last, want)
	}
	// And queries see every sample written, once.
	raw := rawSamples(t, url, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", start, w.next-1)
	if len(raw) != 32 {
		t.Fatalf("%d series", len(raw))
	}
	for s, pts := range raw {
		if int64(len(pts)) != (w.next-start)/15_000 {
			t.Fatalf("%s: %d samples, want %d", s, len(pts), (w.next-start)/15_000)
		}
		for i := 1; i < len(pts); i++ {
			if pts[i].Timestamp.Sub(pts[i-1].Timestamp) != 15*time.Second {
				t.Fatalf("%s: gap or duplicate at %v", s, pts[i].Timestamp)
			}
		}
	}
	t.Logf("%d blocks, %d samples in %s after an outage with %d blocks pending and %v upload failures", len(metas), inBucket, s3.Provider, pending, failures)
}

func promv1Range(from, to int64) promv1.Range {
	return promv1.Range{Start: time.UnixMilli(from), End: time.UnixMilli(to), Step: 15 * time.Second}
}

// metricSum adds up every series of a counter or gauge in gpustore's registry.
func metricSum(t *testing.T, a *app.App, name string) float64 {
	t.Helper()
	mfs, err := a.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

// TestCrashBetweenChunksAndMetaJSON: a process that dies while uploading a
// block leaves its chunks and index in the bucket without meta.json (torn,
// even). The partial block is never read, and the next gpustore over the
// same data directory uploads it whole, against each real object store (S3,
// GCS, Azure).
func TestCrashBetweenChunksAndMetaJSON(t *testing.T) {
	forEachStore(t, testCrashBetweenChunksAndMetaJSON)
}

func testCrashBetweenChunksAndMetaJSON(t *testing.T, s3 *objectStore) {
	s3.stop() // the first gpustore cuts blocks it cannot ship
	dir := t.TempDir()
	withDir := func(c *app.Config) { withBucket(s3)(c); c.TSDB.Dir = dir }
	a1, url1 := startGpustore(t, withDir)
	now := time.Now().UnixMilli() / 60_000 * 60_000
	start := now - 20*60_000
	w := newWriter(t, url1, start)
	w.write(start + 10*60_000)
	waitFor(t, 60*time.Second, "blocks cut locally", func() error {
		if n := len(a1.Shipper.Pending("default")); n < 5 {
			return fmt.Errorf("%d blocks pending", n)
		}
		return nil
	})
	pending := a1.Shipper.Pending("default")
	if err := a1.Stop(); err != nil {
		t.Fatal(err)
	}

	// What the crash left: the first pending block's chunks and index, torn, no meta.json.
	s3.start()
	bkt, err := bucket.New(s3.bucketConfig(), dir, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	torn := pending[0]
	local, err := os.Stat(filepath.Join(dir, "tenants", "default", torn.String(), block.IndexFilename))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, rel := range []string{block.ChunksDirname + "/000001", block.IndexFilename} {
		if err := bkt.Upload(ctx, block.ObjectName("default", torn, rel), strings.NewReader("torn")); err != nil {
			t.Fatal(err)
		}
	}

	a2, url2 := startGpustore(t, withDir)
	// Until its meta.json is there, the partial block is not a block.
	if err := a2.BucketStore.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	for _, m := range a2.BucketStore.Blocks("default") {
		if m.ULID == torn && !a2.Shipper.Shipped("default", torn) {
			t.Fatalf("partial block %s visible to queries", torn)
		}
	}
	waitFor(t, 90*time.Second, "every block uploaded after the restart", func() error {
		if p := a2.Shipper.Pending("default"); len(p) > 0 {
			return fmt.Errorf("%d pending", len(p))
		}
		return a2.BucketStore.Sync(ctx)
	})
	// The torn block was uploaded whole: its index in the bucket is the local one.
	attrs, err := bkt.Attributes(ctx, block.ObjectName("default", torn, block.IndexFilename))
	if err != nil {
		t.Fatal(err)
	}
	if attrs.Size != local.Size() {
		t.Fatalf("index in %s is %d bytes, the block's is %d", s3.Provider, attrs.Size, local.Size())
	}
	if ok, err := bkt.Exists(ctx, block.ObjectName("default", torn, block.MetaFilename)); err != nil || !ok {
		t.Fatalf("meta.json of %s not uploaded: %v", torn, err)
	}
	// Every sample written is read back once, across the restart.
	raw := rawSamples(t, url2, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", start, w.next-1)
	if len(raw) != 32 {
		t.Fatalf("%d series", len(raw))
	}
	for s, pts := range raw {
		if int64(len(pts)) != (w.next-start)/15_000 {
			t.Fatalf("%s: %d samples, want %d", s, len(pts), (w.next-start)/15_000)
		}
	}
}
