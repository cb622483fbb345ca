package compact_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"
	"github.com/thanos-io/objstore"
	"github.com/thanos-io/objstore/providers/filesystem"

	"github.com/gpustore/gpustore/bench/gpusim"
	"github.com/gpustore/gpustore/bench/load"
	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/compact"
	"github.com/gpustore/gpustore/pkg/downsample"
	"github.com/gpustore/gpustore/pkg/readopts"
	"github.com/gpustore/gpustore/pkg/storage/bucketstore"
)

// benchWeek is the week slice of TestWeekCompactedQueriesUnchanged, built
// once into $TMPDIR (blocks/, the 2h blocks as receivers cut them).
func benchWeek(b *testing.B) (simSlice, string) {
	sl := weekSlice()
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("gpustore-compact-bench-%dn-%s-%s", sl.Nodes, sl.Duration, sl.Interval))
	if _, err := os.Stat(filepath.Join(dir, "complete")); err != nil {
		_ = os.RemoveAll(dir)
		sl.write(b, filepath.Join(dir, "blocks"))
		if err := os.WriteFile(filepath.Join(dir, "complete"), nil, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	return sl, filepath.Join(dir, "blocks")
}

// freshBucket uploads the blocks to a new folder bucket, each block
// copies times under as many ULIDs (copies beyond the first are what
// other receivers of a replicated ring ship of the same data).
func freshBucket(b *testing.B, blocks string, copies int) objstore.Bucket {
	bkt, err := filesystem.NewBucket(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	ents, err := os.ReadDir(blocks)
	if err != nil {
		b.Fatal(err)
	}
	for _, e := range ents {
		dir := filepath.Join(blocks, e.Name())
		upload(b, bkt, "bench", nil, dir)
		for range copies - 1 {
			bm, err := block.ReadLocalMeta(dir)
			if err != nil {
				b.Fatal(err)
			}
			bm.ULID = ulid.Make()
			bm.Compaction.Sources = []ulid.ULID{bm.ULID}
			meta := block.Meta{BlockMeta: bm, GPUStore: block.GPUStoreMeta{
				Version: block.MetaVersion, Tenant: "bench", Labels: map[string]string{}, Source: block.SourceReceive,
			}}
			if err := block.Upload(context.Background(), bkt, dir, meta); err != nil {
				b.Fatal(err)
			}
		}
	}
	return bkt
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkCompactWeek compacts the week slice (84 two-hour blocks of 16
// GPUs at 1m) from a FILESYSTEM bucket to its final layout: every level,
// download, TSDB compaction, upload, marks and deletion. It reports
// samples/s per CPU-second and the peak Go heap while compacting.
// GPUSTORE_BENCH_REPLICAS=2 ships every block twice, as the two receivers
// of a ring with replication factor 2 do: each compaction then merges the
// copies (vertical compaction), one sample kept per timestamp.
func BenchmarkCompactWeek(b *testing.B) {
	_, blocks := benchWeek(b)
	copies := 1
	if v, err := strconv.Atoi(os.Getenv("GPUSTORE_BENCH_REPLICAS")); err == nil && v > 1 {
		copies = v
	}
	var samples, cpu float64
	var peak atomic.Uint64
	for b.Loop() {
		b.StopTimer()
		bkt := freshBucket(b, blocks, copies)
		c, reg := newCompactor(b, testConfig(), bkt, nil)
		runtime.GC()
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { // sample the heap: the compactor's peak memory
			defer wg.Done()
			var ms runtime.MemStats
			for {
				runtime.ReadMemStats(&ms)
				if ms.HeapInuse > peak.Load() {
					peak.Store(ms.HeapInuse)
				}
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
		}()
		c0 := cpuTime()
		b.StartTimer()
		compactUntilStable(b, c, bkt, "bench")
		b.StopTimer()
		cpu += (cpuTime() - c0).Seconds()
		close(stop)
		wg.Wait()
		samples += counter(b, reg, "gpustore_compact_samples_total")
		b.StartTimer()
	}
	b.ReportMetric(samples/cpu, "samples/cpu-s")
	b.ReportMetric(samples/float64(b.N), "samples-written/op")
	b.ReportMetric(float64(peak.Load())/(1<<20), "peak-heap-MiB")
}

// BenchmarkDashboardQueries runs the bench dashboard query set (bench/load)
// over the last 7 days and the last 24 hours of the week slice, with
// Grafana's step, from the bucket store (warm page cache) over the 2h
// blocks as shipped and over the compacted blocks.
func BenchmarkDashboardQueries(b *testing.B) {
	sl, blocks := benchWeek(b)
	raw := freshBucket(b, blocks, 1)
	compacted := freshBucket(b, blocks, 1)
	c, _ := newCompactor(b, testConfig(), compacted, nil)
	st := compactUntilStable(b, c, compacted, "bench")
	b.Logf("compacted: %s", st.spans())
	// The same, downsampled too: Grafana's 7-day step reads 5m data
	// (auto resolution), the 24-hour one raw.
	downsampled := freshBucket(b, blocks, 1)
	dcfg := testConfig()
	dcfg.Downsample = true
	dc, _ := newCompactor(b, dcfg, downsampled, nil)
	st = compactUntilStable(b, dc, downsampled, "bench")
	b.Logf("downsampled: %s", st.spans())
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 200_000_000, Timeout: 10 * time.Minute})
	end := sl.Start.Add(sl.Duration)
	for _, bk := range []struct {
		name string
		bkt  objstore.Bucket
	}{{"2h-blocks", raw}, {"compacted", compacted}, {"downsampled", downsampled}} {
		s, err := bucketstore.New(bucketstore.DefaultConfig(), bk.bkt, quiet(), nil)
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Sync(context.Background()); err != nil {
			b.Fatal(err)
		}
		q := storage.QueryableFunc(func(mint, maxt int64) (storage.Querier, error) {
			return s.Querier("bench", mint, maxt, readopts.Default())
		})
		for _, w := range []struct {
			name string
			rng  time.Duration
		}{{"7d", 7 * day}, {"24h", day}} {
			step := load.GrafanaStep(w.rng, time.Minute)
			start := end.Add(-w.rng)
			run := func(b *testing.B) {
				for _, dq := range load.DashboardQueries("gpu-node-001") {
					qry, err := engine.NewRangeQuery(context.Background(), q, nil, dq.Expr, start, end, step)
					if err != nil {
						b.Fatal(err)
					}
					if r := qry.Exec(context.Background()); r.Err != nil {
						b.Fatalf("%s: %v", dq.Expr, r.Err)
					}
					qry.Close()
				}
			}
			b.Run(bk.name+"/"+w.name, func(b *testing.B) {
				run(b) // warm the cache
				for b.Loop() {
					run(b)
				}
				b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N)/float64(len(load.DashboardQueries(""))), "ms/query")
				b.ReportMetric(float64(len(s.Blocks("bench"))), "blocks")
			})
		}
	}
}

// BenchmarkLongRangeOverview runs the cluster-overview panels (bench/load)
// over 30 days of one simulated node at 1m (GPUSTORE_BENCH_DAYS,
// GPUSTORE_BENCH_INTERVAL), compacted and downsampled, with Grafana's step
// (≈ 3 h for 30 days: auto resolution reads 1h data, rate(x[5m]) 5m data),
// against the same blocks read raw (max_source_resolution=raw).
// GPUSTORE_BENCH_ENCODING=none stores the downsampled blocks' files plain.
func BenchmarkLongRangeOverview(b *testing.B) {
	ms := (14 * day).Milliseconds()
	start := time.UnixMilli((gpusim.DefaultEpoch.UnixMilli() + ms - 1) / ms * ms).UTC()
	sl := simSlice{Nodes: 1, Start: start, Duration: 30 * day, Interval: time.Minute, Block: 2 * time.Hour}
	// GPUSTORE_BENCH_DAYS and GPUSTORE_BENCH_INTERVAL change the slice (e.g. 7 and 15s).
	if v, err := strconv.Atoi(os.Getenv("GPUSTORE_BENCH_DAYS")); err == nil && v > 0 {
		sl.Duration = time.Duration(v) * day
	}
	if v, err := time.ParseDuration(os.Getenv("GPUSTORE_BENCH_INTERVAL")); err == nil && v > 0 {
		sl.Interval = v
	}
	// The panels read the slice; the blocks go on for a few hours past it,
	// as a running receiver's do: the compactor downsamples only blocks that
	// newer ones follow, so without them the slice's last 2 days would stay
	// raw and its last 14 days have no 1h data, which no running store has.
	written := sl
	written.Duration += 6 * time.Hour
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("gpustore-compact-bench-%dn-%s-%s", written.Nodes, written.Duration, written.Interval))
	if _, err := os.Stat(filepath.Join(dir, "complete")); err != nil {
		_ = os.RemoveAll(dir)
		written.write(b, filepath.Join(dir, "blocks"))
		if err := os.WriteFile(filepath.Join(dir, "complete"), nil, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	bkt := freshBucket(b, filepath.Join(dir, "blocks"), 1)
	cfg := testConfig()
	cfg.Downsample = true
	cfg.LeaseTTL = compact.DefaultConfig().LeaseTTL // a niced run beside others renews late
	if os.Getenv("GPUSTORE_BENCH_FOLD") == "1" {    // pods folded in 5m and 1h gauges (opt-in)
		cfg.DownsampleFoldLabels = []string{"pod"}
	}
	if v := os.Getenv("GPUSTORE_BENCH_ENCODING"); v != "" { // none: the downsampled files stored plain
		cfg.DownsampleEncoding = v
	}
	if v := os.Getenv("GPUSTORE_BENCH_RAW_ENCODING"); v != "" { // none: the compacted raw files stored plain
		cfg.RawEncoding = v
	}
	c, _ := newCompactor(b, cfg, bkt, nil)
	t0 := time.Now()
	st := compactUntilStable(b, c, bkt, "bench")
	metas, bytes := byResolution(st)
	b.Logf("compacted and downsampled in %s: raw %d bytes, 5m %d, 1h %d", time.Since(t0).Round(time.Second),
		bytes[0], bytes[downsample.Res5m], bytes[downsample.Res1h])
	for _, r := range []int64{0, downsample.Res5m, downsample.Res1h} {
		var index, series, samples, chunks, span int64
		for _, m := range metas[r] {
			span += m.MaxTime - m.MinTime
			for _, f := range m.GPUStore.Files {
				if f.RelPath == "index" {
					index += f.BucketBytes()
				}
			}
			series, samples, chunks = series+int64(m.Stats.NumSeries), samples+int64(m.Stats.NumSamples), chunks+int64(m.Stats.NumChunks)
		}
		b.Logf("resolution %s: %d blocks over %s, %d bytes (index %.1f %%), %d series, %d chunks, %d samples, %.2f bytes/sample",
			downsample.ResolutionName(r), len(metas[r]), time.Duration(span)*time.Millisecond, bytes[r], 100*float64(index)/float64(max(bytes[r], 1)),
			series, chunks, samples, float64(bytes[r])/float64(max(samples, 1)))
	}
	// openStore opens a store over the bucket with an empty page cache,
	// read with opts (set per resolution below).
	opts := readopts.Default()
	var store *bucketstore.Store
	openStore := func(b *testing.B) storage.Queryable {
		s, err := bucketstore.New(bucketstore.DefaultConfig(), bkt, quiet(), nil)
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Sync(context.Background()); err != nil {
			b.Fatal(err)
		}
		store = s
		return storage.QueryableFunc(func(mint, maxt int64) (storage.Querier, error) {
			return s.Querier("bench", mint, maxt, opts)
		})
	}
	q := openStore(b)
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 500_000_000, Timeout: 10 * time.Minute})
	end := sl.Start.Add(sl.Duration)
	step := load.GrafanaStep(sl.Duration, sl.Interval)
	var overview []load.Query
	for _, dq := range load.DashboardQueries("gpu-node-001") {
		if dq.Dashboard == "cluster overview" {
			overview = append(overview, dq)
		}
	}
	for _, res := range []string{"raw", "auto"} {
		r, _ := downsample.ParseMaxSourceResolution(res)
		// As the query API sets them for a range query without subqueries.
		opts.MaxSourceResolution, opts.AtSteps = r, true
		ctx := context.Background()
		took := make([]time.Duration, len(overview)) // per panel, over the timed rounds
		run := func(b *testing.B, q storage.Queryable) {
			for i, dq := range overview {
				began := time.Now()
				qry, err := engine.NewRangeQuery(ctx, q, nil, dq.Expr, end.Add(-sl.Duration), end, step)
				if err != nil {
					b.Fatal(err)
				}
				if r := qry.Exec(ctx); r.Err != nil {
					b.Fatalf("%s: %v", dq.Expr, r.Err)
				}
				qry.Close()
				took[i] += time.Since(began)
			}
		}
		b.Run(res, func(b *testing.B) {
			cold := time.Now()
			run(b, q) // warm the cache
			b.Logf("cold round (every panel once, empty cache): %s", time.Since(cold).Round(time.Millisecond))
			clear(took)
			for b.Loop() {
				run(b, q)
			}
			b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N)/float64(len(overview)), "ms/query")
			for i, dq := range overview {
				b.Logf("%s: %s per query", dq.Expr, (took[i] / time.Duration(b.N)).Round(10*time.Microsecond))
			}
		})
		if res != "auto" {
			continue
		}
		// A dashboard's first view: each round opens the blocks anew (index
		// headers unread, page cache empty) and runs every panel once.
		b.Run(res+"-cold", func(b *testing.B) {
			// CPU time beside wall time: on a shared machine the wall
			// time moves with the others' load.
			var rounds, cpu []time.Duration
			for b.Loop() {
				b.StopTimer()
				q := openStore(b)
				runtime.GC()
				began, c0 := time.Now(), cpuTime()
				b.StartTimer()
				run(b, q)
				rounds, cpu = append(rounds, time.Since(began)), append(cpu, cpuTime()-c0)
				st := store.CacheStats()
				b.Logf("cold round: fetched %d bytes in %d requests, decoded %d", st.FetchedBytes, st.Requests, st.DecodedBytes)
			}
			slices.Sort(rounds)
			slices.Sort(cpu)
			b.ReportMetric(float64(rounds[len(rounds)/2].Microseconds())/1000, "ms/cold-round")
			b.ReportMetric(float64(cpu[len(cpu)/2].Microseconds())/1000, "cpu-ms/cold-round")
			b.Logf("cold rounds, sorted: %v; their CPU time: %v", rounds, cpu)
		})
	}
}
