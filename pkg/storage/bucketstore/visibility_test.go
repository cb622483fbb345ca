package bucketstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/thanos-io/objstore"
	"github.com/thanos-io/objstore/providers/filesystem"
	"github.com/thanos-io/objstore/providers/s3"
	"gopkg.in/yaml.v3"

	"github.com/gpustore/gpustore/internal/logging"
	"github.com/gpustore/gpustore/internal/testbin"
	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/storage/bucketindex"
)

// compactBlocks compacts local block directories into one block under dir
// with the TSDB's own compactor (as pkg/compact does) and returns its
// directory. Its meta.json lists the sources' sources and its parents.
func compactBlocks(t *testing.T, dir string, dirs ...string) string {
	t.Helper()
	c, err := tsdb.NewLeveledCompactor(context.Background(), nil, quietLogger(), []int64{1000 * minute}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := c.Compact(dir, dirs, nil)
	if err != nil || len(ids) != 1 {
		t.Fatalf("compact: %v %v", ids, err)
	}
	return filepath.Join(dir, ids[0].String())
}

// startS3 serves a bucket from a real S3 server (versitygw) on loopback for
// the test. Skipped when versitygw is not installed, failed under CI=true.
func startS3(t *testing.T) objstore.Bucket {
	t.Helper()
	bin := testbin.Need(t, "versitygw")
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "test"), 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	logf, err := os.Create(filepath.Join(t.TempDir(), "versitygw.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--access", "test", "--secret", "test-secret", "--port", addr, "posix", root)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); _ = logf.Close() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("versitygw not listening on %s: %v", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	raw, _ := yaml.Marshal(map[string]any{"bucket": "test", "endpoint": addr, "access_key": "test", "secret_key": "test-secret", "insecure": true})
	bkt, err := s3.NewBucket(logging.GoKit(quietLogger()), raw, "test", nil)
	if err != nil {
		t.Fatal(err)
	}
	return bkt
}

// eachBucket runs f against an in-memory bucket, a filesystem bucket and a
// real S3 server.
func eachBucket(t *testing.T, f func(t *testing.T, bkt objstore.Bucket)) {
	t.Run("inmem", func(t *testing.T) { f(t, objstore.NewInMemBucket()) })
	t.Run("filesystem", func(t *testing.T) {
		bkt, err := filesystem.NewBucket(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		f(t, bkt)
	})
	t.Run("s3", func(t *testing.T) { f(t, startS3(t)) })
}

func storeWith(t *testing.T, bkt objstore.Bucket, reg prometheus.Registerer, mod func(*Config)) *Store {
	t.Helper()
	cfg := DefaultConfig()
	cfg.DeletionMarkDelay = 0
	cfg.BucketIndexEnabled = false
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg, bkt, quietLogger(), reg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

func blockIDs(s *Store, tenant string) []ulid.ULID {
	var ids []ulid.ULID
	for _, m := range s.Blocks(tenant) {
		ids = append(ids, m.ULID)
	}
	slices.SortFunc(ids, func(a, b ulid.ULID) int { return a.Compare(b) })
	return ids
}

func sortedIDs(ids ...ulid.ULID) []ulid.ULID {
	ids = slices.Clone(ids)
	slices.SortFunc(ids, func(a, b ulid.ULID) int { return a.Compare(b) })
	return ids
}

// countOverTime is sum(count_over_time({__name__=~".+"}[3h])) at 179m
// through PromQL: every sample of the three hours once.
func countOverTime(t *testing.T, s *Store, tenant string) (float64, int) {
	t.Helper()
	var read int
	q := storage.QueryableFunc(func(mint, maxt int64) (storage.Querier, error) {
		q := mustQuerier(t, s, tenant, mint, maxt, nil)
		if bq, ok := q.(*querier); ok {
			read = len(bq.blocks)
		}
		return q, nil
	})
	// Names kept until the end: the test series differ in nothing else.
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 10_000_000, Timeout: time.Minute, EnableDelayedNameRemoval: true})
	qry, err := engine.NewInstantQuery(context.Background(), q, nil, `sum(count_over_time({__name__=~".+"}[3h]))`, time.UnixMilli(179*minute))
	if err != nil {
		t.Fatal(err)
	}
	defer qry.Close()
	r := qry.Exec(context.Background())
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	v, err := r.Vector()
	if err != nil || len(v) != 1 {
		t.Fatalf("result %v: %v", r.Value, err)
	}
	return v[0].F, read
}

// A compacted block and its sources in the bucket at once (a compactor that
// crashed between upload and deletion marks): the sources are hidden, every
// sample is counted once; deletion marks hide; a sync from the bucket index
// sees the same blocks as a listing, and blocks uploaded since the index.
func TestCompactedBlockHidesItsSources(t *testing.T) {
	eachBucket(t, func(t *testing.T, bkt objstore.Bucket) {
		ctx := context.Background()
		dir := t.TempDir()
		series := testSeries(1)
		var srcDirs []string
		var srcIDs []ulid.ULID
		for i := int64(0); i < 3; i++ {
			d := writeBlock(t, filepath.Join(dir, "src"), series, i*60*minute, (i+1)*60*minute, minute)
			srcDirs = append(srcDirs, d)
			srcIDs = append(srcIDs, uploadBlock(t, bkt, "t", d).ULID)
		}
		compacted := uploadBlock(t, bkt, "t", compactBlocks(t, filepath.Join(dir, "out"), srcDirs...))
		if len(compacted.Compaction.Sources) != 3 {
			t.Fatalf("compacted sources %v", compacted.Compaction.Sources)
		}
		want := float64(len(series) * 180)

		reg := prometheus.NewRegistry()
		s := storeWith(t, bkt, reg, nil)
		if got := blockIDs(s, "t"); !slices.Equal(got, []ulid.ULID{compacted.ULID}) {
			t.Fatalf("visible %v, want only the compacted block %s", got, compacted.ULID)
		}
		if n, read := countOverTime(t, s, "t"); n != want || read != 1 {
			t.Fatalf("count_over_time %v from %d blocks, want %v from 1", n, read, want)
		}
		expectMetric(t, reg, `gpustore_bucketstore_hidden_blocks{reason="replaced",tenant="t"} 3`)

		// A bucket index sees the same, and so does a store syncing from it.
		x, err := bucketindex.Update(ctx, bkt, "t", nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := bucketindex.Write(ctx, bkt, x); err != nil {
			t.Fatal(err)
		}
		ireg := prometheus.NewRegistry()
		si := storeWith(t, bkt, ireg, func(c *Config) { c.BucketIndexEnabled = true })
		if got := blockIDs(si, "t"); !slices.Equal(got, blockIDs(s, "t")) {
			t.Fatalf("index sync sees %v, listing %v", got, blockIDs(s, "t"))
		}
		expectMetric(t, ireg, `gpustore_bucketstore_sync_source{source="index",tenant="t"} 1`)
		if n, _ := countOverTime(t, si, "t"); n != want {
			t.Fatalf("count_over_time from the index sync %v, want %v", n, want)
		}

		// A block uploaded after the index was written is seen by the next sync.
		late := uploadBlock(t, bkt, "t", writeBlock(t, filepath.Join(dir, "late"), series, 180*minute, 240*minute, minute))
		if err := si.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		if got := blockIDs(si, "t"); !slices.Equal(got, sortedIDs(compacted.ULID, late.ULID)) {
			t.Fatalf("after a late upload the index sync sees %v", got)
		}
		expectMetric(t, ireg, `gpustore_bucketstore_sync_source{source="index",tenant="t"} 1`)

		// The compactor marks the sources: still only the compacted block.
		for _, id := range srcIDs {
			if err := block.WriteDeletionMark(ctx, bkt, "t", id, "compacted into "+compacted.ULID.String(), time.Now()); err != nil {
				t.Fatal(err)
			}
		}
		for _, st := range []*Store{s, si} {
			if err := st.Sync(ctx); err != nil {
				t.Fatal(err)
			}
			if got := blockIDs(st, "t"); !slices.Equal(got, sortedIDs(compacted.ULID, late.ULID)) {
				t.Fatalf("after the sources' marks %v", got)
			}
		}
		expectMetric(t, reg, `gpustore_bucketstore_hidden_blocks{reason="deletion-mark",tenant="t"} 3`)

		// Retention marks the compacted block too: it is hidden at once
		// (delay 0), and after the delay with a delay.
		if err := block.WriteDeletionMark(ctx, bkt, "t", compacted.ULID, "retention", time.Now()); err != nil {
			t.Fatal(err)
		}
		delayed := storeWith(t, bkt, nil, func(c *Config) { c.DeletionMarkDelay = 0 })
		if got := blockIDs(delayed, "t"); !slices.Equal(got, []ulid.ULID{late.ULID}) {
			t.Fatalf("with every old block marked %v", got)
		}
		delayed = storeWith(t, bkt, nil, func(c *Config) { c.DeletionMarkDelay = model.Duration(time.Hour) })
		if got := blockIDs(delayed, "t"); !slices.Equal(got, sortedIDs(compacted.ULID, late.ULID)) {
			t.Fatalf("within the deletion mark delay %v", got)
		}

		// A stale index is not used: the store lists.
		x.UpdatedAt = time.Now().Add(-2 * time.Hour).Unix()
		if err := bucketindex.Write(ctx, bkt, x); err != nil {
			t.Fatal(err)
		}
		sreg := prometheus.NewRegistry()
		stale := storeWith(t, bkt, sreg, func(c *Config) { c.BucketIndexEnabled = true })
		expectMetric(t, sreg, `gpustore_bucketstore_sync_source{source="listing",tenant="t"} 1`)
		if got := blockIDs(stale, "t"); !slices.Equal(got, []ulid.ULID{late.ULID}) {
			t.Fatalf("stale-index store sees %v", got)
		}
	})
}

// expectMetric checks one sample in the exposition form `name{a="x",b="y"} v`
// (labels sorted by name, as Gather returns them).
func expectMetric(t *testing.T, reg *prometheus.Registry, line string) {
	t.Helper()
	name := line[:strings.IndexAny(line, "{ ")]
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+`="`+l.GetValue()+`"`)
			}
			s := fmt.Sprintf("%s{%s} %g", name, strings.Join(ls, ","), m.GetGauge().GetValue())
			if s == line {
				return
			}
			got = append(got, s)
		}
	}
	t.Fatalf("no %s; got %v", line, got)
}

// A block deleted from the bucket under a running query fails that query
// with a storage error (HTTP 500), never a panic or a silent partial answer.
func TestBlockDeletedUnderQueryFailsIt(t *testing.T) {
	ctx := context.Background()
	bkt := objstore.NewInMemBucket()
	meta := uploadBlock(t, bkt, "t", writeBlock(t, t.TempDir(), testSeries(2), 0, 120*minute, minute))
	s := newTestStore(t, bkt, 4096, 1<<20)
	deleteBlock := func(files ...string) {
		for _, f := range files {
			if err := bkt.Delete(ctx, block.ObjectName("t", meta.ULID, f)); err != nil {
				t.Fatal(err)
			}
		}
	}
	matcher := labels.MustNewMatcher(labels.MatchEqual, "__name__", "DCGM_FI_DEV_GPU_TEMP")

	// The index header is loaded (label names), then the chunks go.
	q := mustQuerier(t, s, "t", 0, 120*minute, nil)
	if names, _, err := q.LabelNames(ctx, nil); err != nil || len(names) == 0 {
		t.Fatalf("label names %v %v", names, err)
	}
	deleteBlock(meta.ChunkSegments()...)
	_, err := samples(q.Select(ctx, true, nil, matcher))
	var se promql.ErrStorage
	if !errors.As(err, &se) {
		t.Fatalf("query over deleted chunks: %v, want a storage error", err)
	}
	q.Close()

	// A querier opened before the block went: everything is gone.
	q2 := mustQuerier(t, storeWith(t, bkt, nil, nil), "t", 0, 120*minute, nil)
	if q2 == nil {
		t.Fatal("no querier")
	}
	defer q2.Close()
	deleteBlock(block.IndexFilename, block.MetaFilename)
	if _, err := samples(q2.Select(ctx, true, nil, matcher)); !errors.As(err, &se) {
		t.Fatalf("query over a deleted block: %v, want a storage error", err)
	}
}
