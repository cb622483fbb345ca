package bucketstore

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/thanos-io/objstore"
	"github.com/thanos-io/objstore/providers/filesystem"
	"github.com/thanos-io/objstore/providers/s3"
	"gopkg.in/yaml.v3"

	"github.com/gpustore/gpustore/bench/gpusim"
	"github.com/gpustore/gpustore/internal/logging"
	"github.com/gpustore/gpustore/internal/testbin"
	"github.com/gpustore/gpustore/pkg/block"
)

// The benchmark data: 7 days of a 2-node (16-GPU) slice of the simulated
// cluster, scraped every 30s (774 series, 15.6M samples), as 84 two-hour
// blocks. Built once into $TMPDIR/gpustore-bench-7d (reused by later runs).
const (
	benchNodes    = 2
	benchDays     = 7
	benchInterval = 30 * time.Second
	benchBlock    = 2 * time.Hour
	benchTenant   = "bench"
)

var (
	benchOnce sync.Once
	benchDir  string
	benchErr  error
)

// benchData returns the directory holding blocks/ (the TSDB blocks) and
// bucket/ (the same blocks uploaded to a FILESYSTEM bucket).
func benchData(b *testing.B) string {
	benchOnce.Do(func() {
		benchDir = filepath.Join(os.TempDir(), fmt.Sprintf("gpustore-bench-%dd-%dn-%s", benchDays, benchNodes, benchInterval))
		if _, err := os.Stat(filepath.Join(benchDir, "complete")); err == nil {
			return
		}
		_ = os.RemoveAll(benchDir)
		benchErr = buildBenchData(benchDir)
	})
	if benchErr != nil {
		b.Fatal(benchErr)
	}
	return benchDir
}

func buildBenchData(dir string) error {
	start := time.Now()
	blocks := filepath.Join(dir, "blocks")
	if err := os.MkdirAll(blocks, 0o755); err != nil {
		return err
	}
	c, err := gpusim.New(gpusim.Config{Nodes: benchNodes, TargetLabels: true})
	if err != nil {
		return err
	}
	t0 := gpusim.DefaultEpoch
	var buf []gpusim.Series
	lsets := map[string]labels.Labels{}
	sb := labels.NewScratchBuilder(0)
	key := make([]byte, 0, 512)
	for blk := time.Duration(0); blk < benchDays*24*time.Hour; blk += benchBlock {
		w, err := tsdb.NewBlockWriter(quietLogger(), blocks, benchBlock.Milliseconds())
		if err != nil {
			return err
		}
		for t := t0.Add(blk); t.Before(t0.Add(blk + benchBlock)); t = t.Add(benchInterval) {
			buf = c.AppendSamples(buf[:0], t, gpusim.Replica{})
			app := w.Appender(context.Background())
			for i := range buf {
				s := &buf[i]
				key = key[:0]
				for _, l := range s.Labels {
					key = append(append(append(key, l.Name...), 0xff), l.Value...)
				}
				ls, ok := lsets[string(key)]
				if !ok {
					sb.Reset()
					for _, l := range s.Labels {
						sb.Add(l.Name, l.Value)
					}
					sb.Sort()
					ls = sb.Labels()
					lsets[string(key)] = ls
				}
				if _, err := app.Append(0, ls, s.T, s.V); err != nil {
					return err
				}
			}
			if err := app.Commit(); err != nil {
				return err
			}
		}
		if _, err := w.Flush(context.Background()); err != nil {
			return err
		}
		_ = w.Close()
	}
	bkt, err := filesystem.NewBucket(filepath.Join(dir, "bucket"))
	if err != nil {
		return err
	}
	if err := uploadAll(context.Background(), bkt, blocks); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "built benchmark blocks in %s (%s)\n", dir, time.Since(start).Round(time.Second))
	return os.WriteFile(filepath.Join(dir, "complete"), nil, 0o644)
}

func uploadAll(ctx context.Context, bkt objstore.Bucket, blocks string) error {
	entries, err := os.ReadDir(blocks)
	if err != nil {
		return err
	}
	for _, e := range entries {
		d := filepath.Join(blocks, e.Name())
		bm, err := block.ReadLocalMeta(d)
		if err != nil {
			continue
		}
		meta := block.Meta{BlockMeta: bm, GPUStore: block.GPUStoreMeta{Version: block.MetaVersion, Tenant: benchTenant, Labels: map[string]string{}, Source: block.SourceReceive}}
		if err := block.Upload(ctx, bkt, d, meta); err != nil {
			return err
		}
	}
	return nil
}

var benchQueries = []struct{ name, q string }{
	{"avg_util_by_host", `avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)`},
	{"max_temp_1h_per_gpu", `max_over_time(DCGM_FI_DEV_GPU_TEMP[1h])`},
	{"energy_rate_one_node", `sum(rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{Hostname="gpu-node-001"}[10m]))`},
	{"temp_one_gpu", `max_over_time(DCGM_FI_DEV_GPU_TEMP{Hostname="gpu-node-002",gpu="3"}[1h])`},
}

func runRange(b *testing.B, engine *promql.Engine, q storage.Queryable, expr string) int {
	start := gpusim.DefaultEpoch
	end := start.Add(benchDays*24*time.Hour - time.Minute)
	qry, err := engine.NewRangeQuery(context.Background(), q, nil, expr, start, end, 5*time.Minute)
	if err != nil {
		b.Fatal(err)
	}
	defer qry.Close()
	r := qry.Exec(context.Background())
	if r.Err != nil {
		b.Fatal(r.Err)
	}
	m, err := r.Matrix()
	if err != nil {
		b.Fatal(err)
	}
	n := 0
	for _, s := range m {
		n += len(s.Floats)
	}
	if n == 0 {
		b.Fatalf("%s: empty result", expr)
	}
	return n
}

// BenchmarkSevenDayQuery runs dashboard range queries over 7 days (step 5m)
// against the same 84 blocks on local disk (the TSDB's own reader, mmap, OS
// page cache warm), in a FILESYSTEM bucket and, when versitygw is installed,
// in an S3 bucket on loopback — with the page cache cold (a fresh store: index
// headers and pages read from the bucket) and warm.
func BenchmarkSevenDayQuery(b *testing.B) {
	dir := benchData(b)
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 100_000_000, Timeout: 10 * time.Minute})
	cfg := DefaultConfig() // 256 MiB of 32 KiB pages; BENCH_PAGE and BENCH_RA override page size and readahead
	if v := os.Getenv("BENCH_PAGE"); v != "" {
		if _, err := fmt.Sscan(v, &cfg.PageSize); err != nil {
			b.Fatalf("BENCH_PAGE: %v", err)
		}
	}
	if v := os.Getenv("BENCH_RA"); v != "" {
		if _, err := fmt.Sscan(v, &cfg.ReadaheadPages); err != nil {
			b.Fatalf("BENCH_RA: %v", err)
		}
	}

	db, err := tsdb.OpenDBReadOnly(filepath.Join(dir, "blocks"), "", quietLogger())
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	local := storage.QueryableFunc(func(mint, maxt int64) (storage.Querier, error) { return db.Querier(mint, maxt) })

	fsb, err := filesystem.NewBucket(filepath.Join(dir, "bucket"))
	if err != nil {
		b.Fatal(err)
	}
	buckets := []struct {
		name string
		bkt  func(b *testing.B) objstore.Bucket
	}{
		{"fs", func(*testing.B) objstore.Bucket { return fsb }},
		{"s3", func(b *testing.B) objstore.Bucket { return benchS3(b, dir) }},
	}

	var total int64
	ents, _ := os.ReadDir(filepath.Join(dir, "blocks"))
	for _, e := range ents {
		if files, err := block.LocalFiles(filepath.Join(dir, "blocks", e.Name())); err == nil {
			for _, f := range files {
				total += f.SizeBytes
			}
		}
	}

	for _, bq := range benchQueries {
		b.Run(bq.name+"/local", func(b *testing.B) {
			for b.Loop() {
				runRange(b, engine, local, bq.q)
			}
		})
		for _, bk := range buckets {
			b.Run(bq.name+"/bucket-"+bk.name+"/cold", func(b *testing.B) {
				bkt := bk.bkt(b)
				var fetched, reqs int64
				for b.Loop() {
					b.StopTimer()
					s, err := New(cfg, bkt, quietLogger(), nil)
					if err != nil {
						b.Fatal(err)
					}
					if err := s.Sync(context.Background()); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
					runRange(b, engine, storeQueryable(s, benchTenant, nil), bq.q)
					st := s.CacheStats()
					fetched += st.FetchedBytes
					reqs += st.Requests
				}
				b.ReportMetric(float64(fetched)/float64(b.N), "fetched-B/op")
				b.ReportMetric(float64(reqs)/float64(b.N), "requests/op")
				b.ReportMetric(float64(total), "blocks-B")
			})
			b.Run(bq.name+"/bucket-"+bk.name+"/warm", func(b *testing.B) {
				s, err := New(cfg, bk.bkt(b), quietLogger(), nil)
				if err != nil {
					b.Fatal(err)
				}
				if err := s.Sync(context.Background()); err != nil {
					b.Fatal(err)
				}
				runRange(b, engine, storeQueryable(s, benchTenant, nil), bq.q)
				before := s.CacheStats()
				for b.Loop() {
					runRange(b, engine, storeQueryable(s, benchTenant, nil), bq.q)
				}
				st := s.CacheStats()
				b.ReportMetric(float64(st.FetchedBytes-before.FetchedBytes)/float64(b.N), "fetched-B/op")
				b.ReportMetric(float64(st.Bytes), "cache-B")
			})
		}
	}
}

var (
	s3Once sync.Once
	s3Bkt  objstore.Bucket
	s3Err  error
)

// benchS3 serves the benchmark blocks from versitygw on loopback (skipped
// when versitygw is not installed).
func benchS3(b *testing.B, dir string) objstore.Bucket {
	bin := testbin.Need(b, "versitygw")
	s3Once.Do(func() {
		root, err := os.MkdirTemp("", "gpustore-bench-s3")
		if err != nil {
			s3Err = err
			return
		}
		if err := os.MkdirAll(filepath.Join(root, "bench"), 0o755); err != nil {
			s3Err = err
			return
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			s3Err = err
			return
		}
		addr := l.Addr().String()
		l.Close()
		cmd := exec.Command(bin, "--access", "bench", "--secret", "bench-secret", "--port", addr, "posix", root)
		if err := cmd.Start(); err != nil {
			s3Err = err
			return
		}
		// Runs until the test binary exits (TestMain stops it).
		benchCleanup = append(benchCleanup, func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); _ = os.RemoveAll(root) })
		for i := 0; i < 100; i++ {
			if c, err := net.Dial("tcp", addr); err == nil {
				c.Close()
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		raw, _ := yaml.Marshal(map[string]any{"bucket": "bench", "endpoint": addr, "access_key": "bench", "secret_key": "bench-secret", "insecure": true})
		bkt, err := s3.NewBucket(logging.GoKit(quietLogger()), raw, "bench", nil)
		if err != nil {
			s3Err = err
			return
		}
		if err := uploadAll(context.Background(), bkt, filepath.Join(dir, "blocks")); err != nil {
			s3Err = err
			return
		}
		s3Bkt = bkt
	})
	if s3Err != nil {
		b.Fatal(s3Err)
	}
	return s3Bkt
}

var benchCleanup []func()

func TestMain(m *testing.M) {
	code := m.Run()
	for _, f := range benchCleanup {
		f()
	}
	os.Exit(code)
}
