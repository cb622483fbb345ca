package bucketstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/thanos-io/objstore"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/downsample"
	"github.com/gpustore/gpustore/pkg/readopts"
)

const minute = int64(60_000)

func newTestStore(t testing.TB, bkt objstore.Bucket, pageSize, cacheSize int64) *Store {
	t.Helper()
	cfg := DefaultConfig()
	cfg.PageSize, cfg.CacheSize = pageSize, cacheSize
	s, err := New(cfg, bkt, quietLogger(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

// dump renders a series set exactly: labels and every sample's bits.
func dump(t testing.TB, ss storage.SeriesSet) string {
	t.Helper()
	var b strings.Builder
	var it chunkenc.Iterator
	for ss.Next() {
		s := ss.At()
		b.WriteString(s.Labels().String())
		b.WriteString(":")
		it = s.Iterator(it)
		for it.Next() == chunkenc.ValFloat {
			ts, v := it.At()
			fmt.Fprintf(&b, " %d=%x", ts, math.Float64bits(v))
		}
		if err := it.Err(); err != nil {
			t.Fatalf("iterate %s: %v", s.Labels(), err)
		}
		b.WriteString("\n")
	}
	if err := ss.Err(); err != nil {
		t.Fatalf("series set: %v", err)
	}
	return b.String()
}

// countSamples counts the samples of a dump.
func countSamples(out string) int {
	n := 0
	for _, line := range strings.Split(out, "\n") {
		if i := strings.LastIndex(line, "}:"); i >= 0 {
			n += strings.Count(line[i:], "=")
		}
	}
	return n
}

func dumpChunks(t testing.TB, ss storage.ChunkSeriesSet) string {
	t.Helper()
	return dump(t, storage.NewSeriesSetFromChunkSeriesSet(ss))
}

var matcherSets = [][]*labels.Matcher{
	{labels.MustNewMatcher(labels.MatchEqual, "__name__", "DCGM_FI_DEV_GPU_UTIL")},
	{labels.MustNewMatcher(labels.MatchEqual, "__name__", "DCGM_FI_DEV_GPU_TEMP"), labels.MustNewMatcher(labels.MatchEqual, "Hostname", "node-003")},
	{labels.MustNewMatcher(labels.MatchRegexp, "Hostname", "node-00[1-4]"), labels.MustNewMatcher(labels.MatchNotEqual, "gpu", "3")},
	{labels.MustNewMatcher(labels.MatchRegexp, "__name__", "DCGM_.*"), labels.MustNewMatcher(labels.MatchNotRegexp, "UUID", "GPU-0000000.*")},
	{labels.MustNewMatcher(labels.MatchEqual, "UUID", "GPU-0000002f-0047")},
	{labels.MustNewMatcher(labels.MatchEqual, "UUID", "GPU-00000000-0000")},                                                  // the first value
	{labels.MustNewMatcher(labels.MatchEqual, "Hostname", "node-005"), labels.MustNewMatcher(labels.MatchEqual, "gpu", "7")}, // the last
	{labels.MustNewMatcher(labels.MatchEqual, "UUID", "AAA")},                                                                // before the first value
	{labels.MustNewMatcher(labels.MatchEqual, "UUID", "zzz")},                                                                // after the last
	{labels.MustNewMatcher(labels.MatchEqual, "nosuchlabel", "x")},
	{labels.MustNewMatcher(labels.MatchEqual, "__name__", "up"), labels.MustNewMatcher(labels.MatchEqual, "extra", "")},
	{labels.MustNewMatcher(labels.MatchNotEqual, "job", "")},
	{labels.MustNewMatcher(labels.MatchRegexp, "job", ".+")},
	{labels.MustNewMatcher(labels.MatchRegexp, "UUID", "GPU-0000001.*|GPU-0000002a.*")},
	{labels.MustNewMatcher(labels.MatchNotRegexp, "__name__", "DCGM_FI_DEV_GPU_.*|up")},
}

// TestQueriesMatchTheLocalBlock reads the same block through the TSDB's own
// block reader (local disk) and through the bucket store (range reads over
// tiny pages and a tiny cache, so every range crosses pages and evicts) and
// requires identical answers for selects, chunk selects, label names and
// label values, with and without matchers.
func TestQueriesMatchTheLocalBlock(t *testing.T) {
	for _, enc := range []string{block.EncodingNone, block.EncodingZstd, block.EncodingZstdNoCRC, block.EncodingZstdColumns} {
		t.Run("encoding="+cmp.Or(enc, "none"), func(t *testing.T) { queriesMatchTheLocalBlock(t, enc) })
	}
	// Frames of 3000 bytes: pages and reads straddle frames.
	defer func(n, c, i, s, p int64) {
		block.FrameBytes, block.ColumnsFrameBytes, block.IndexFrameBytes, block.SeriesFrameBytes, block.PostingsFrameBytes = n, c, i, s, p
	}(block.FrameBytes, block.ColumnsFrameBytes, block.IndexFrameBytes, block.SeriesFrameBytes, block.PostingsFrameBytes)
	block.FrameBytes, block.ColumnsFrameBytes, block.IndexFrameBytes, block.SeriesFrameBytes, block.PostingsFrameBytes = 3000, 3000, 3000, 3000, 3000
	t.Run("encoding=zstd-nocrc,frames=3000", func(t *testing.T) { queriesMatchTheLocalBlock(t, block.EncodingZstdNoCRC) })
	t.Run("encoding=zstd-columns,frames=3000", func(t *testing.T) { queriesMatchTheLocalBlock(t, block.EncodingZstdColumns) })
	// An index cut evenly, not by section, as blocks written before were.
	defer func() { block.SectionFrames = true }()
	block.SectionFrames = false
	t.Run("encoding=zstd-nocrc,frames=3000,even", func(t *testing.T) { queriesMatchTheLocalBlock(t, block.EncodingZstdNoCRC) })
	block.FrameBytes, block.IndexFrameBytes = 1<<20, 8<<20
	t.Run("encoding=zstd-nocrc,frames=even-8MiB", func(t *testing.T) { queriesMatchTheLocalBlock(t, block.EncodingZstdNoCRC) })
}

// queriesMatchTheLocalBlock: the block's files stored in encoding read like
// the local block, whatever the page and cache sizes (a zstd-encoded object
// is fetched whole, its pages offered to a cache that may not hold them).
func queriesMatchTheLocalBlock(t *testing.T, encoding string) {
	ctx := context.Background()
	dir := writeBlock(t, t.TempDir(), testSeries(6), 0, 30*minute, 15_000)
	bkt := objstore.NewInMemBucket()
	m := uploadEncodedBlock(t, bkt, "team-a", dir, encoding)
	if f, _ := m.File("chunks/000001"); f.Encoding != encoding {
		t.Fatalf("segment stored %q, not %q", f.Encoding, encoding)
	}

	local, err := tsdb.OpenBlock(quietLogger(), dir, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()

	for _, tc := range []struct{ page, cache int64 }{{512, 4 << 10}, {4 << 10, 1 << 20}, {32 << 10, 64 << 20}} {
		t.Run(fmt.Sprintf("page=%d,cache=%d", tc.page, tc.cache), func(t *testing.T) {
			s := newTestStore(t, bkt, tc.page, tc.cache)
			for _, r := range [][2]int64{{0, 30 * minute}, {7 * minute, 9*minute + 1}, {-minute, 0}, {29 * minute, 40 * minute}} {
				lq, err := tsdb.NewBlockQuerier(local, r[0], r[1])
				if err != nil {
					t.Fatal(err)
				}
				bq := mustQuerier(t, s, "team-a", r[0], r[1], nil)
				if bq == downsample.NoopQuerier() {
					t.Fatalf("range %v: no bucket querier", r)
				}
				lcq, _ := tsdb.NewBlockChunkQuerier(local, r[0], r[1])
				bcq, err := s.ChunkQuerier("team-a", r[0], r[1], readopts.Default())
				if err != nil {
					t.Fatal(err)
				}
				for i, ms := range matcherSets {
					want := dump(t, lq.Select(ctx, true, nil, ms...))
					got := dump(t, bq.Select(ctx, true, nil, ms...))
					if got != want {
						t.Errorf("range %v matchers %d %v: bucket select differs\nwant:\n%.2000s\ngot:\n%.2000s", r, i, ms, want, got)
					}
					if r[0] == 0 && i < 4 && want == "" {
						t.Errorf("matchers %d select nothing: the test is too weak", i)
					}
					wantC := dumpChunks(t, lcq.Select(ctx, true, nil, ms...))
					gotC := dumpChunks(t, bcq.Select(ctx, true, nil, ms...))
					if gotC != wantC {
						t.Errorf("range %v matchers %d: bucket chunk select differs", r, i)
					}
					wn, _, err1 := lq.LabelNames(ctx, nil, ms...)
					gn, _, err2 := bq.LabelNames(ctx, nil, ms...)
					if err1 != nil || err2 != nil || fmt.Sprint(wn) != fmt.Sprint(gn) {
						t.Errorf("matchers %d: label names want %v (%v) got %v (%v)", i, wn, err1, gn, err2)
					}
					for _, name := range []string{"__name__", "UUID", "gpu", "job", "nosuchlabel"} {
						for _, hints := range []*storage.LabelHints{nil, {Limit: 3}} {
							wv, _, err1 := lq.LabelValues(ctx, name, hints, ms...)
							gv, _, err2 := bq.LabelValues(ctx, name, hints, ms...)
							if err1 != nil || err2 != nil || fmt.Sprint(wv) != fmt.Sprint(gv) {
								t.Errorf("matchers %d: values of %s (hints %v) want %v (%v) got %v (%v)", i, name, hints, wv, err1, gv, err2)
							}
						}
					}
				}
				wn, _, _ := lq.LabelNames(ctx, nil)
				gn, _, _ := bq.LabelNames(ctx, nil)
				if fmt.Sprint(wn) != fmt.Sprint(gn) {
					t.Errorf("label names want %v got %v", wn, gn)
				}
				for _, name := range []string{"__name__", "UUID", "Hostname", "extra"} {
					wv, _, _ := lq.LabelValues(ctx, name, nil)
					gv, _, _ := bq.LabelValues(ctx, name, nil)
					if fmt.Sprint(wv) != fmt.Sprint(gv) {
						t.Errorf("values of %s want %v got %v", name, wv, gv)
					}
				}
				for _, q := range []interface{ Close() error }{lq, bq, lcq, bcq} {
					if err := q.Close(); err != nil {
						t.Fatal(err)
					}
				}
			}
			st := s.CacheStats()
			if st.Bytes > st.MaxBytes {
				t.Fatalf("cache holds %d bytes, bound %d", st.Bytes, st.MaxBytes)
			}
			t.Logf("cache: %+v", st)
		})
	}
}

// TestManyBlocksQueryStaysWithinTheCache queries 7 days of 2h blocks (2 days
// under the race detector) and
// checks the cache's accounted bytes never pass the bound and that the query
// fetched less than the blocks hold.
func TestManyBlocksQueryStaysWithinTheCache(t *testing.T) {
	ctx := context.Background()
	bkt := objstore.NewInMemBucket()
	series := testSeries(8)
	var total int64
	const blockMs = 2 * 60 * minute
	nBlocks := int64(84)
	if raceEnabled {
		nBlocks = 24
	}
	for i := int64(0); i < nBlocks; i++ {
		dir := writeBlock(t, t.TempDir(), series, i*blockMs, (i+1)*blockMs, 30_000)
		total += dirSize(t, dir)
		uploadBlock(t, bkt, "team-a", dir)
	}
	const bound = 512 << 10
	s := newTestStore(t, bkt, 4<<10, bound)
	if n := int64(len(s.Blocks("team-a"))); n != nBlocks {
		t.Fatalf("store sees %d blocks, want %d", n, nBlocks)
	}
	before := s.CacheStats().FetchedBytes
	var maxSeen atomic.Int64
	done := make(chan struct{})
	go func() { // sample the accounting while the query runs
		for {
			select {
			case <-done:
				return
			default:
			}
			if b := s.CacheStats().Bytes; b > maxSeen.Load() {
				maxSeen.Store(b)
			}
			time.Sleep(100 * time.Microsecond)
		}
	}()
	q := mustQuerier(t, s, "team-a", 0, nBlocks*blockMs, nil)
	out := dump(t, q.Select(ctx, true, nil,
		labels.MustNewMatcher(labels.MatchEqual, "__name__", "DCGM_FI_DEV_GPU_TEMP"),
		labels.MustNewMatcher(labels.MatchEqual, "Hostname", "node-001")))
	close(done)
	q.Close()
	if got := strings.Count(out, "\n"); got != 8 {
		t.Fatalf("query returned %d series, want 8", got)
	}
	if got := countSamples(out); int64(got) != 8*nBlocks*240 {
		t.Fatalf("query returned %d samples, want %d", got, 8*nBlocks*240)
	}
	st := s.CacheStats()
	fetched := st.FetchedBytes - before
	t.Logf("%d blocks, %d bytes in the bucket; query fetched %d bytes in %d requests; cache %d/%d bytes (max seen %d), %d evictions",
		nBlocks, total, fetched, st.Requests, st.Bytes, st.MaxBytes, maxSeen.Load(), st.Evictions)
	if st.Bytes > bound || maxSeen.Load() > bound {
		t.Fatalf("cache accounted %d bytes (max seen %d), bound %d", st.Bytes, maxSeen.Load(), bound)
	}
	if st.Evictions == 0 {
		t.Fatal("no evictions: the bound was never tested")
	}
	if fetched*3 >= total {
		t.Fatalf("query fetched %d of %d bytes: it should read a fraction of the blocks", fetched, total)
	}
}

// failingBucket fails GetRange (and Get) while fail is set.
type failingBucket struct {
	objstore.Bucket
	fail atomic.Bool
}

var errOutage = errors.New("bucket unavailable (test)")

func (b *failingBucket) GetRange(ctx context.Context, name string, off, length int64) (io.ReadCloser, error) {
	if b.fail.Load() {
		return nil, errOutage
	}
	return b.Bucket.GetRange(ctx, name, off, length)
}

// TestBucketErrorsAreQueryErrors: a bucket that fails during a query makes a
// storage error of the query (500 through the API), never a panic, and the
// store recovers when the bucket does.
func TestBucketErrorsAreQueryErrors(t *testing.T) {
	ctx := context.Background()
	dir := writeBlock(t, t.TempDir(), testSeries(2), 0, 30*minute, 15_000)
	bkt := &failingBucket{Bucket: objstore.NewInMemBucket()}
	uploadBlock(t, bkt, "team-a", dir)
	s := newTestStore(t, bkt, 1<<10, 1<<20)
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 1e6, Timeout: time.Minute})
	queryable := storage.QueryableFunc(func(mint, maxt int64) (storage.Querier, error) {
		return s.Querier("team-a", mint, maxt, readopts.Default())
	})
	run := func() (string, error) {
		q, err := engine.NewRangeQuery(ctx, queryable, nil, `sum by (Hostname) (DCGM_FI_DEV_GPU_UTIL)`, time.UnixMilli(0), time.UnixMilli(29*minute), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		defer q.Close()
		r := q.Exec(ctx)
		if r.Err != nil {
			return "", r.Err
		}
		return r.Value.String(), nil
	}

	// Cold: the index header cannot be read.
	bkt.fail.Store(true)
	_, err := run()
	var se promql.ErrStorage
	// (promql.ErrStorage has no Unwrap: match the outage by its text.)
	if err == nil || !errors.As(err, &se) || !strings.Contains(err.Error(), errOutage.Error()) {
		t.Fatalf("cold query with the bucket down: err %v, want a promql.ErrStorage wrapping the outage", err)
	}
	// Warm header, cold pages: fails while reading series and chunks.
	bkt.fail.Store(false)
	want, err := run()
	if err != nil {
		t.Fatal(err)
	}
	s.cache.Drop(map[string]struct{}{s.tenants["team-a"][0].index.name: {}, s.tenants["team-a"][0].segments[0].name: {}})
	bkt.fail.Store(true)
	if _, err := run(); err == nil || !errors.As(err, &se) {
		t.Fatalf("warm-header query with the bucket down: err %v, want a storage error", err)
	}
	for _, ms := range matcherSets[:4] {
		q := mustQuerier(t, s, "team-a", 0, 30*minute, nil)
		ss := q.Select(ctx, true, nil, ms...)
		// The series a warm select resolved may come from the cache
		// (pkg/blockquery): then the chunks' reads fail.
		var itErr error
		for ss.Next() {
			it := ss.At().Iterator(nil)
			for it.Next() != chunkenc.ValNone {
			}
			itErr = cmp.Or(itErr, it.Err())
		}
		if ss.Err() == nil && itErr == nil {
			t.Errorf("select %v with the bucket down: no error", ms)
		}
		if _, _, err := q.LabelValues(ctx, "gpu", nil, ms...); err == nil {
			t.Errorf("label values %v with the bucket down: no error", ms)
		}
		q.Close()
	}
	bkt.fail.Store(false)
	got, err := run()
	if err != nil || got != want {
		t.Fatalf("after the outage: err %v, result differs: %v", err, got != want)
	}
}

// TestSyncSeesNewAndDeletedBlocksAndSkipsPartialOnes.
func TestSyncSeesNewAndDeletedBlocksAndSkipsPartialOnes(t *testing.T) {
	ctx := context.Background()
	bkt := objstore.NewInMemBucket()
	a := uploadBlock(t, bkt, "team-a", writeBlock(t, t.TempDir(), testSeries(1), 0, 10*minute, 15_000))
	s := newTestStore(t, bkt, 4<<10, 1<<20)
	if n := len(s.Blocks("team-a")); n != 1 {
		t.Fatalf("want 1 block, got %d", n)
	}

	// A partial upload: chunks and index, no meta.json.
	pdir := writeBlock(t, t.TempDir(), testSeries(1), 10*minute, 20*minute, 15_000)
	pid := mustULID(t, pdir)
	files, _ := block.LocalFiles(pdir)
	for _, f := range files {
		if err := bkt.Upload(ctx, block.ObjectName("team-a", pid, f.RelPath), strings.NewReader("garbage that must never be read")); err != nil {
			t.Fatal(err)
		}
	}
	b := uploadBlock(t, bkt, "team-b", writeBlock(t, t.TempDir(), testSeries(1), 0, 10*minute, 15_000))
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(s.Blocks("team-a")); n != 1 {
		t.Fatalf("partial block listed: %d blocks", n)
	}
	if s.partialBlocks("team-a") != 1 {
		t.Fatalf("partial blocks counted: %d, want 1", s.partialBlocks("team-a"))
	}
	if got := s.Blocks("team-b"); len(got) != 1 || got[0].ULID != b.ULID {
		t.Fatalf("team-b blocks: %v", got)
	}
	q := mustQuerier(t, s, "team-a", 0, 20*minute, nil)
	if out := dump(t, q.Select(ctx, true, nil, labels.MustNewMatcher(labels.MatchEqual, "__name__", "up"))); countSamples(out) != 2*40 {
		t.Fatalf("query over a partial block: %q", out)
	}
	q.Close()
	// skip leaves out blocks read elsewhere.
	if q := mustQuerier(t, s, "team-a", 0, 20*minute, func(id ulid.ULID) bool { return id == a.ULID }); q != downsample.NoopQuerier() {
		t.Fatal("querier over a skipped block")
	}

	// Deleting the block removes it from the view.
	if err := bkt.Delete(ctx, block.ObjectName("team-a", a.ULID, block.MetaFilename)); err != nil {
		t.Fatal(err)
	}
	for _, f := range a.GPUStore.Files {
		_ = bkt.Delete(ctx, block.ObjectName("team-a", a.ULID, f.RelPath))
	}
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(s.Blocks("team-a")); n != 0 {
		t.Fatalf("deleted block still listed: %d", n)
	}
}

// partialBlocks is the number of the tenant's block directories without meta.json.
func (s *Store) partialBlocks(tenantID string) int {
	s.mtx.RLock()
	defer s.mtx.RUnlock()
	if v := s.views[tenantID]; v != nil {
		return len(v.index.Partial)
	}
	return 0
}
