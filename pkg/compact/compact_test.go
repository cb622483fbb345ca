package compact_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/grafana/dskit/services"
	"github.com/oklog/ulid/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunks"

	"github.com/gpustore/gpustore/bench/gpusim"
	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/compact"
	"github.com/gpustore/gpustore/pkg/limits"
	"github.com/gpustore/gpustore/pkg/storage/bucketindex"
)

const day = 24 * time.Hour

// weekSlice is the slice of the simulated cluster the week test uses: 2
// nodes (16 GPUs, 774 series) × 7 days at 1m = 7.8M samples in 84 two-hour
// blocks. It starts 4 days before a 14-day boundary, so the week crosses one:
// the 4 days before it end up as one 14d-level block, the next 2 days as a 2d
// block, the newest day (which may still receive blocks) as 8h blocks.
func weekSlice() simSlice {
	ms := (14 * day).Milliseconds()
	b := time.UnixMilli((gpusim.DefaultEpoch.Add(4*day).UnixMilli() + ms - 1) / ms * ms).UTC()
	return simSlice{Nodes: 2, Start: b.Add(-4 * day), Duration: 7 * day, Interval: time.Minute, Block: 2 * time.Hour}
}

// TestWeekCompactedQueriesUnchanged: a week of the simulated cluster shipped
// as 2h blocks to a real S3 server is compacted to 14d-, 2d- and 8h-level
// blocks; every panel of the bench dashboards answers exactly as before,
// over 7 days and over the last 24 hours, through gpustore's query path.
func TestWeekCompactedQueriesUnchanged(t *testing.T) {
	store := startStore(t)
	bkt := openBucket(t, store)
	sl := weekSlice()
	if raceEnabled { // the same layout from a quarter of the samples
		sl.Nodes, sl.Interval = 1, 2*time.Minute
	}
	t0 := time.Now()
	dirs := sl.write(t, t.TempDir())
	metas := upload(t, bkt, "week", nil, dirs...)
	var total uint64
	for _, m := range metas {
		total += m.Stats.NumSamples
	}
	t.Logf("slice: %d nodes × %s at %s: %d blocks, %d samples (written and uploaded in %s)",
		sl.Nodes, sl.Duration, sl.Interval, len(metas), total, time.Since(t0).Round(time.Millisecond))

	qa, qurl := startQuery(t, store.bucket())
	node := "gpu-node-001"
	end := sl.Start.Add(sl.Duration)
	week := answers(t, qa, qurl, "week", sl.Start, end, node)
	lastDay := answers(t, qa, qurl, "week", end.Add(-day), end, node)

	c, reg := newCompactor(t, testConfig(), bkt, nil)
	t0 = time.Now()
	st := compactUntilStable(t, c, bkt, "week")
	t.Logf("compacted in %s: %s", time.Since(t0).Round(time.Millisecond), st.spans())

	if st.samples() != total {
		t.Fatalf("compacted blocks hold %d samples, the shipped ones %d", st.samples(), total)
	}
	if len(st.marked) > 0 || len(st.partial) > 0 {
		t.Fatalf("left in the bucket: %d marked, %d partial", len(st.marked), len(st.partial))
	}
	shipped := map[ulid.ULID]block.SourceRange{}
	for _, m := range metas {
		shipped[m.ULID] = block.SourceRange{ULID: m.ULID, MinTime: m.MinTime, MaxTime: m.MaxTime}
	}
	var got []string
	for _, m := range st.live {
		got = append(got, fmt.Sprintf("%s/L%d", time.Duration(m.MaxTime-m.MinTime)*time.Millisecond, m.Compaction.Level))
		// Every level records its sources' time ranges (the bucket store
		// reads around the ones a receiver still holds).
		srcs := m.Sources()
		if len(srcs) != len(m.Compaction.Sources) {
			t.Errorf("block %s records %d source ranges for %d sources", m.ULID, len(srcs), len(m.Compaction.Sources))
		}
		for _, r := range srcs {
			if r != shipped[r.ULID] {
				t.Errorf("block %s: source range %+v, shipped as %+v", m.ULID, r, shipped[r.ULID])
			}
		}
		if m.GPUStore.Source != block.SourceCompactor || m.GPUStore.Tenant != "week" || len(m.Compaction.Parents) < 2 {
			t.Errorf("meta.json of %s: %+v, parents %d", m.ULID, m.GPUStore, len(m.Compaction.Parents))
		}
	}
	want := []string{"96h0m0s/L4", "48h0m0s/L3", "8h0m0s/L2", "8h0m0s/L2", "8h0m0s/L2"}
	if !slices.Equal(got, want) {
		t.Fatalf("blocks after compaction %v, want %v (14d level over the 4 days before the boundary, a 2d block, the newest day in 8h blocks)", got, want)
	}
	if n := counter(t, reg, "gpustore_compact_blocks_compacted_total"); n == 0 {
		t.Fatal("no compaction counted")
	}

	// The compactor's bucket index lists exactly the compacted blocks, and
	// the bucket store syncs from it instead of listing the tenant.
	x, err := bucketindex.Read(context.Background(), bkt, "week")
	if err != nil {
		t.Fatalf("bucket index after compaction: %v", err)
	}
	var indexed, live []string
	for _, m := range x.Blocks {
		indexed = append(indexed, m.ULID.String())
	}
	for _, m := range st.live {
		live = append(live, m.ULID.String())
	}
	slices.Sort(indexed)
	slices.Sort(live)
	if !slices.Equal(indexed, live) || len(x.DeletionMarks) != 0 {
		t.Fatalf("bucket index lists %v (%d deletion marks), the bucket holds %v", indexed, len(x.DeletionMarks), live)
	}

	compareAnswers(t, "7 days", week, answers(t, qa, qurl, "week", sl.Start, end, node))
	compareAnswers(t, "24 hours", lastDay, answers(t, qa, qurl, "week", end.Add(-day), end, node))
	if n := sourceGauge(t, qa.Registry, "week", "index"); n != 1 {
		t.Fatalf("the bucket store's last sync of the tenant did not use the bucket index (gpustore_bucketstore_sync_source{source=\"index\"} = %v)", n)
	}
}

// sourceGauge returns gpustore_bucketstore_sync_source for a tenant and source.
func sourceGauge(t testing.TB, reg *prometheus.Registry, tenant, source string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "gpustore_bucketstore_sync_source" {
			continue
		}
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			if got["tenant"] == tenant && got["source"] == source {
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}

// TestOverlappingBlocksMerged: two receivers that both hold the same series
// (partly the same samples, partly their own), an out-of-order block, and a
// block uploaded twice under two ULIDs: merged into one block that holds
// every distinct sample exactly once.
func TestOverlappingBlocksMerged(t *testing.T) {
	store := startStore(t)
	bkt := openBucket(t, store)
	dir := t.TempDir()
	const (
		hr   = int64(3_600_000)
		base = int64(1_767_225_600_000) // 2026-01-01, 2h-aligned
	)
	series := []labels.Labels{
		labels.FromStrings("__name__", "DCGM_FI_DEV_GPU_TEMP", "gpu", "0"),
		labels.FromStrings("__name__", "DCGM_FI_DEV_GPU_TEMP", "gpu", "1"),
		labels.FromStrings("__name__", "DCGM_FI_DEV_POWER_USAGE", "gpu", "0"),
	}
	val := func(i int, ts int64) float64 { return float64(i*1000) + float64(ts/1000%997) }
	want := map[string]map[int64]float64{}
	writeBlock := func(tss []int64) string {
		slices.Sort(tss) // one appender drops samples older than its series' newest
		w, err := tsdb.NewBlockWriter(quiet(), dir, 2*hr)
		if err != nil {
			t.Fatal(err)
		}
		app := w.Appender(context.Background())
		for i, ls := range series {
			for _, ts := range tss {
				if _, err := app.Append(0, ls, ts, val(i, ts)); err != nil {
					t.Fatal(err)
				}
				if want[ls.String()] == nil {
					want[ls.String()] = map[int64]float64{}
				}
				want[ls.String()][ts] = val(i, ts)
			}
		}
		if err := app.Commit(); err != nil {
			t.Fatal(err)
		}
		id, err := w.Flush(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		w.Close()
		return filepath.Join(dir, id.String())
	}
	every := func(from, to, step int64) []int64 {
		var out []int64
		for ts := from; ts < to; ts += step {
			out = append(out, ts)
		}
		return out
	}
	a := writeBlock(every(base, base+2*hr, 30_000))                                                         // receiver A
	b := writeBlock(append(every(base+hr, base+2*hr, 30_000), every(base+hr+15_000, base+3*hr, 30_000)...)) // receiver B: half the same, half its own, past A's end
	ooo := writeBlock(every(base+90*60_000+5_000, base+100*60_000, 60_000))                                 // out-of-order samples
	upload(t, bkt, "ov", nil, a, b, ooo)
	// A's block uploaded a second time under a new ULID.
	am, err := block.ReadLocalMeta(a)
	if err != nil {
		t.Fatal(err)
	}
	am.ULID = ulid.MustNew(ulid.Now(), nil)
	am.Compaction.Sources = []ulid.ULID{am.ULID}
	if err := block.Upload(context.Background(), bkt, a, block.Meta{BlockMeta: am, GPUStore: block.GPUStoreMeta{
		Version: block.MetaVersion, Tenant: "ov", Labels: map[string]string{}, Source: block.SourceReceive}}); err != nil {
		t.Fatal(err)
	}
	// A block after them, so their ranges count as finished.
	upload(t, bkt, "ov", nil, writeBlock(every(base+8*hr, base+9*hr, 60_000)))

	c, _ := newCompactor(t, testConfig(), bkt, nil)
	st := compactUntilStable(t, c, bkt, "ov")
	var wantN uint64
	for _, s := range want {
		wantN += uint64(len(s))
	}
	if st.samples() != wantN {
		t.Fatalf("bucket holds %d samples, want %d distinct ones (%s)", st.samples(), wantN, st.spans())
	}
	if len(st.live) != 2 {
		t.Fatalf("want the overlapping blocks merged into one (plus the later block): %s", st.spans())
	}

	qa, qurl := startQuery(t, store.bucket())
	if err := qa.BucketStore.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := rawQuery(t, qurl, "ov", `{__name__=~"DCGM.*"}[9h]`, time.UnixMilli(base+9*hr-1))
	for s, pts := range want {
		g := got[s]
		if len(g) != len(pts) {
			t.Errorf("%s: %d samples read back, want %d", s, len(g), len(pts))
			continue
		}
		for ts, v := range pts {
			if g[ts] != v {
				t.Errorf("%s@%d: %v, want %v", s, ts, g[ts], v)
				break
			}
		}
	}
}

// rawQuery returns the raw samples of a range-vector instant query.
func rawQuery(t *testing.T, base, tenant, q string, at time.Time) map[string]map[int64]float64 {
	t.Helper()
	form := url.Values{"query": {q}, "time": {fmt.Sprintf("%.3f", float64(at.UnixMilli())/1000)}, "dedup": {"false"}}
	req, _ := http.NewRequest(http.MethodPost, base+"/api/v1/query", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("X-Scope-OrgID", tenant)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("%s: %d %s", q, resp.StatusCode, body)
	}
	var r struct {
		Data struct {
			Result model.Matrix `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatal(err)
	}
	out := map[string]map[int64]float64{}
	for _, s := range r.Data.Result {
		ls := labels.New()
		b := labels.NewBuilder(ls)
		for k, v := range s.Metric {
			b.Set(string(k), string(v))
		}
		m := map[int64]float64{}
		for _, p := range s.Values {
			m[int64(p.Timestamp)] = float64(p.Value)
		}
		out[b.Labels().String()] = m
	}
	return out
}

// smallBlocks writes n 2h blocks of a few series starting at start.
func smallBlocks(t *testing.T, dir string, start time.Time, n int, metrics ...string) []string {
	t.Helper()
	if len(metrics) == 0 {
		metrics = []string{"a_metric", "b_metric"}
	}
	return twoHourBlocks(t, dir, start, n, func(app storage.Appender, from int64) {
		for _, m := range metrics {
			for g := 0; g < 4; g++ {
				ls := labels.FromStrings("__name__", m, "gpu", strconv.Itoa(g))
				for ts := from; ts < from+2*3_600_000; ts += 60_000 {
					if _, err := app.Append(0, ls, ts, float64(g)+math.Sin(float64(ts)/1e7)); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
	})
}

// twoHourBlocks writes n 2h blocks from start, aligned as a receiver cuts
// them, each holding what add appends for the block starting at from, and
// returns their directories.
func twoHourBlocks(t *testing.T, dir string, start time.Time, n int, add func(app storage.Appender, from int64)) []string {
	t.Helper()
	var dirs []string
	for i := 0; i < n; i++ {
		from := start.Add(time.Duration(i) * 2 * time.Hour).UnixMilli()
		w, err := tsdb.NewBlockWriter(quiet(), dir, 2*3_600_000)
		if err != nil {
			t.Fatal(err)
		}
		app := w.Appender(context.Background())
		add(app, from)
		if err := app.Commit(); err != nil {
			t.Fatal(err)
		}
		id, err := w.Flush(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		w.Close()
		setBlockRange(t, filepath.Join(dir, id.String()), from, from+2*3_600_000)
		dirs = append(dirs, filepath.Join(dir, id.String()))
	}
	return dirs
}

// TestRetention: raw blocks wholly past the retention are marked for
// deletion and deleted only after the delete delay; a tenant's override in
// the limits overrides file applies to that tenant only.
func TestRetention(t *testing.T) {
	store := startStore(t)
	bkt := openBucket(t, store)
	dir := t.TempDir()
	now := time.Now().Truncate(2 * time.Hour)
	ages := []time.Duration{40 * day, 31 * day, 29 * day, 12 * day, day}
	for _, tenant := range []string{"default-ret", "short-ret"} {
		for _, age := range ages {
			upload(t, bkt, tenant, nil, smallBlocks(t, dir, now.Add(-age), 1)...)
		}
	}
	overrides := filepath.Join(t.TempDir(), "overrides.yaml")
	if err := os.WriteFile(overrides, []byte("overrides:\n  short-ret:\n    compactor_retention_raw: 10d\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	lcfg := limits.DefaultConfig()
	lcfg.OverridesFile = overrides
	lim, err := limits.New(lcfg, quiet(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := services.StartAndAwaitRunning(context.Background(), lim); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = services.StopAndAwaitTerminated(context.Background(), lim) }()

	cfg := testConfig()
	cfg.RetentionRaw = model.Duration(30 * day)
	cfg.DeleteDelay = model.Duration(3 * time.Second)
	cfg.BlockRanges = compact.DurationList{model.Duration(2 * time.Hour), model.Duration(8 * time.Hour)} // retention only
	c, reg := newCompactor(t, cfg, bkt, lim)
	ctx := context.Background()
	if err := c.CompactAll(ctx); err != nil {
		t.Fatal(err)
	}
	ageOf := func(m *block.Meta) time.Duration { return now.Sub(time.UnixMilli(m.MinTime)).Round(day) }
	liveAges := func(tenant string) []time.Duration {
		var out []time.Duration
		for _, m := range readBucket(t, bkt, tenant).live {
			out = append(out, ageOf(m))
		}
		return out
	}
	if got, want := liveAges("default-ret"), []time.Duration{29 * day, 12 * day, day}; !slices.Equal(got, want) {
		t.Fatalf("default tenant: blocks left %v, want %v", got, want)
	}
	if got, want := liveAges("short-ret"), []time.Duration{day}; !slices.Equal(got, want) {
		t.Fatalf("tenant with a 10d override: blocks left %v, want %v", got, want)
	}
	if st := readBucket(t, bkt, "default-ret"); len(st.marked) != 2 {
		t.Fatalf("default tenant: %d blocks marked, want 2 (and not yet deleted)", len(st.marked))
	}
	if n := counter(t, reg, "gpustore_compact_deleted_blocks_total"); n != 0 {
		t.Fatalf("%v blocks deleted before the delete delay", n)
	}
	time.Sleep(3500 * time.Millisecond)
	if err := c.CompactAll(ctx); err != nil {
		t.Fatal(err)
	}
	for tenant, n := range map[string]int{"default-ret": 3, "short-ret": 1} {
		st := readBucket(t, bkt, tenant)
		if len(st.marked) != 0 || len(st.partial) != 0 || len(st.live) != n {
			t.Fatalf("%s after the delay: %d live, %d marked, %d partial; want %d live only", tenant, len(st.live), len(st.marked), len(st.partial), n)
		}
	}
	if n := counter(t, reg, "gpustore_compact_deleted_blocks_total"); n != 6 {
		t.Fatalf("%v blocks deleted, want 6", n)
	}
}

// TestCorruptBlockMarkedNoCompact: a block whose chunk fails to decode is
// marked no-compact with the reason, the rest of its group compacts, and
// queries of the other series still answer.
func TestCorruptBlockMarkedNoCompact(t *testing.T) {
	store := startStore(t)
	bkt := openBucket(t, store)
	start := time.UnixMilli(1_767_225_600_000)
	dirs := smallBlocks(t, t.TempDir(), start, 5) // [0,8h) and a later block
	corruptFirstChunk(t, dirs[1], "a_metric")
	upload(t, bkt, "bad", nil, dirs...)

	c, reg := newCompactor(t, testConfig(), bkt, nil)
	st := compactUntilStable(t, c, bkt, "bad")
	bad := mustULID(t, dirs[1])
	if len(st.nocomp) != 1 || st.nocomp[0] != bad {
		t.Fatalf("no-compact marks on %v, want %s", st.nocomp, bad)
	}
	nc, err := block.ReadNoCompactMark(context.Background(), bkt, "bad", bad)
	if err != nil || nc == nil || nc.Reason != "block-read-failure" || !strings.Contains(nc.Details, "a_metric") {
		t.Fatalf("no-compact mark %+v err %v", nc, err)
	}
	if n := counter(t, reg, "gpustore_compact_no_compact_blocks"); n != 1 {
		t.Fatalf("gpustore_compact_no_compact_blocks %v", n)
	}
	// The three good blocks of [0,8h) compacted; the bad and the later one stay.
	if len(st.live) != 3 || st.live[0].Compaction.Level != 2 || len(st.live[0].Compaction.Sources) != 3 {
		t.Fatalf("after compaction: %s", st.spans())
	}
	qa, qurl := startQuery(t, store.bucket())
	if err := qa.BucketStore.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := rawQuery(t, qurl, "bad", `b_metric[10h]`, start.Add(10*time.Hour-time.Millisecond))
	if len(got) != 4 {
		t.Fatalf("%d series of b_metric", len(got))
	}
	for s, pts := range got {
		if len(pts) != 600 {
			t.Fatalf("%s: %d samples, want 600 (5 blocks × 2h at 1m)", s, len(pts))
		}
	}
}

func mustULID(t *testing.T, dir string) ulid.ULID {
	t.Helper()
	id, err := ulid.Parse(filepath.Base(dir))
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// corruptFirstChunk overwrites the encoding byte of the first chunk of the
// first series of metric in a local block.
func corruptFirstChunk(t *testing.T, dir, metric string) {
	t.Helper()
	b, err := tsdb.OpenBlock(nil, dir, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ir, err := b.Index()
	if err != nil {
		t.Fatal(err)
	}
	ps, err := ir.Postings(context.Background(), "__name__", metric)
	if err != nil || !ps.Next() {
		t.Fatalf("no series of %s: %v", metric, err)
	}
	sb := labels.NewScratchBuilder(0)
	var chks []chunks.Meta
	if err := ir.Series(ps.At(), &sb, &chks); err != nil {
		t.Fatal(err)
	}
	ir.Close()
	b.Close()
	seg, off := chunks.BlockChunkRef(chks[0].Ref).Unpack()
	path := filepath.Join(dir, block.ChunksDirname, fmt.Sprintf("%06d", seg+1))
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, n := binary.Uvarint(data[off:])
	data[off+n] = 0xEE // no such encoding
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestTwoCompactorsOneBucket: two compactors over one bucket and several
// tenants, running passes at the same time: each plan is compacted once,
// nothing is doubled or lost.
func TestTwoCompactorsOneBucket(t *testing.T) {
	store := startStore(t)
	bkt := openBucket(t, store)
	start := time.UnixMilli(1_767_225_600_000) // a 2d boundary
	tenants := []string{"t1", "t2", "t3"}
	var total uint64
	for _, tenant := range tenants {
		for _, m := range upload(t, bkt, tenant, nil, smallBlocks(t, t.TempDir(), start, 16)...) {
			total += m.Stats.NumSamples
		}
	}
	cfg := testConfig()
	cfg.LeaseSettle = model.Duration(300 * time.Millisecond)
	c1, reg1 := newCompactor(t, cfg, openBucket(t, store), nil)
	c2, reg2 := newCompactor(t, cfg, openBucket(t, store), nil)
	var wg sync.WaitGroup
	for _, c := range []*compact.Compactor{c1, c2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 4; i++ {
				if err := c.CompactAll(context.Background()); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	var sum uint64
	for _, tenant := range tenants {
		st := compactUntilStable(t, c1, bkt, tenant)
		sum += st.samples()
		seen := map[ulid.ULID]ulid.ULID{}
		for _, m := range st.live {
			for _, s := range m.Compaction.Sources {
				if o, ok := seen[s]; ok {
					t.Fatalf("tenant %s: blocks %s and %s both hold source %s", tenant, o, m.ULID, s)
				}
				seen[s] = m.ULID
			}
		}
		if len(st.live) != 4 {
			t.Fatalf("tenant %s: %s, want four 8h blocks", tenant, st.spans())
		}
	}
	if sum != total {
		t.Fatalf("%d samples after compaction, %d before", sum, total)
	}
	n1, n2 := counter(t, reg1, "gpustore_compact_compactions_total"), counter(t, reg2, "gpustore_compact_compactions_total")
	busy := counter(t, reg1, "gpustore_compact_lease_busy_total") + counter(t, reg2, "gpustore_compact_lease_busy_total")
	t.Logf("compactions: %v + %v; passes skipped on a held lease: %v", n1, n2, busy)
	if n1+n2 != 12 {
		t.Fatalf("%v compactions for 12 plans (3 tenants × four 8h ranges): some plan was compacted twice", n1+n2)
	}
}
