package tenantdb

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/tsdb/chunkenc"

	"github.com/gpustore/gpustore/pkg/limits/querylimit"
)

// gpuSeries is a dcgm-exporter series of GPU gpu on node, scraped while pod
// used it: the pod label makes every job's series new.
func gpuSeries(metric string, node, gpu int, pod string) labels.Labels {
	return labels.FromStrings("__name__", metric, "gpu", strconv.Itoa(gpu), "UUID", fmt.Sprintf("GPU-%04x-%02d", node, gpu),
		"Hostname", fmt.Sprintf("gpu-node-%03d", node), "modelName", "NVIDIA H100 80GB HBM3", "DCGM_FI_DRIVER_VERSION", "550.54.15",
		"pod", pod, "namespace", "training", "container", "trainer", "job", "dcgm-exporter")
}

// appendJob appends one sample of metric for each GPU of nodes under pod,
// and returns the first error (the TSDB refuses the rest of the batch).
func appendJob(db *DB, metric string, nodes int, pod string, ts int64) error {
	app := db.Appender(context.Background())
	for n := range nodes {
		for g := range 8 {
			if _, err := app.Append(0, gpuSeries(metric, n, g, pod), ts, 1); err != nil {
				_ = app.Rollback()
				return err
			}
		}
	}
	return app.Commit()
}

// TestMaxSeriesPerMetric: a metric whose series the pod label multiplies
// (each training job re-creates every GPU's series) stops at
// max_series_per_metric, while other metrics still get new series and the
// metric's existing series keep their samples; the series restored from
// the WAL count, and are never refused.
func TestMaxSeriesPerMetric(t *testing.T) {
	lim := &testLimits{}
	lim.perMetric.Store(64)
	dir := t.TempDir()
	open := func() *Manager {
		m := newTestManager(t, func(c *Config) { c.Dir = dir })
		m.SetLimits(lim)
		return m
	}
	m := open()
	db, err := m.Get("gpu-prod")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixMilli()
	// Two jobs on 4 nodes: 2 × 32 series of the metric, at the limit.
	for job := range 2 {
		if err := appendJob(db, "DCGM_FI_DEV_GPU_UTIL", 4, fmt.Sprintf("llm-train-%d", job), now); err != nil {
			t.Fatalf("job %d within the limit: %v", job, err)
		}
	}
	if err := appendJob(db, "DCGM_FI_DEV_GPU_UTIL", 4, "llm-train-2", now); !errors.Is(err, ErrMaxSeriesPerMetric) {
		t.Fatalf("a third job's series: %v, want ErrMaxSeriesPerMetric", err)
	}
	if err := appendJob(db, "DCGM_FI_DEV_GPU_TEMP", 4, "llm-train-2", now); err != nil {
		t.Fatalf("another metric's series: %v", err)
	}
	if err := appendJob(db, "DCGM_FI_DEV_GPU_UTIL", 4, "llm-train-1", now+15_000); err != nil {
		t.Fatalf("existing series: %v", err)
	}
	top, _ := db.TopMetrics(10)
	if len(top) != 2 || top[0] != (MetricSeries{"DCGM_FI_DEV_GPU_UTIL", 64}) || top[1] != (MetricSeries{"DCGM_FI_DEV_GPU_TEMP", 32}) {
		t.Fatalf("top metrics %v", top)
	}
	// The operations dashboard's top offenders.
	want := `
# HELP gpustore_tsdb_head_top_metric_series Series in the tenant's head of each of its 10 metric names with the most (max_series_per_metric bounds them).
# TYPE gpustore_tsdb_head_top_metric_series gauge
gpustore_tsdb_head_top_metric_series{metric="DCGM_FI_DEV_GPU_TEMP",tenant="gpu-prod"} 32
gpustore_tsdb_head_top_metric_series{metric="DCGM_FI_DEV_GPU_UTIL",tenant="gpu-prod"} 64
`
	if err := testutil.CollectAndCompare(NewCollector(m), strings.NewReader(want), "gpustore_tsdb_head_top_metric_series"); err != nil {
		t.Fatal(err)
	}
	// After a restart the WAL's series count again; the limit still holds.
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	m = open()
	if db, err = m.Get("gpu-prod"); err != nil {
		t.Fatal(err)
	}
	if top, _ := db.TopMetrics(1); len(top) != 1 || top[0].Series != 64 {
		t.Fatalf("after a restart: %v", top)
	}
	if err := appendJob(db, "DCGM_FI_DEV_GPU_UTIL", 4, "llm-train-3", now+30_000); !errors.Is(err, ErrMaxSeriesPerMetric) {
		t.Fatalf("after a restart, a new job's series: %v, want ErrMaxSeriesPerMetric", err)
	}
	// A raised limit applies at once.
	lim.perMetric.Store(96)
	if err := appendJob(db, "DCGM_FI_DEV_GPU_UTIL", 4, "llm-train-3", now+30_000); err != nil {
		t.Fatalf("after the limit was raised: %v", err)
	}
}

// TestMaxNewSeriesPerDay: the series a tenant's head creates in a UTC day
// stop at max_new_series_per_day (job churn), the existing series keep
// their samples, and the count starts again the next day.
func TestMaxNewSeriesPerDay(t *testing.T) {
	lim := &testLimits{}
	lim.perDay.Store(100)
	m := newTestManager(t, nil)
	m.SetLimits(lim)
	db, err := m.Get("gpu-prod")
	if err != nil {
		t.Fatal(err)
	}
	clock := time.Date(2026, 12, 7, 23, 0, 0, 0, time.UTC)
	db.series.now = func() time.Time { return clock }
	now := time.Now().UnixMilli()
	for job := range 3 { // 3 jobs × 32 GPUs: 96 new series
		if err := appendJob(db, "DCGM_FI_DEV_GPU_UTIL", 4, fmt.Sprintf("job-%d", job), now); err != nil {
			t.Fatalf("job %d: %v", job, err)
		}
	}
	if err := appendJob(db, "DCGM_FI_DEV_GPU_UTIL", 4, "job-3", now); !errors.Is(err, ErrMaxNewSeriesPerDay) {
		t.Fatalf("a fourth job: %v, want ErrMaxNewSeriesPerDay", err)
	}
	if err := appendJob(db, "DCGM_FI_DEV_GPU_UTIL", 4, "job-0", now+15_000); err != nil {
		t.Fatalf("existing series: %v", err)
	}
	if _, today := db.TopMetrics(0); today < 96 || today > 100 {
		t.Fatalf("series created today %d", today)
	}
	clock = clock.Add(2 * time.Hour) // the next UTC day
	if err := appendJob(db, "DCGM_FI_DEV_GPU_UTIL", 4, "job-3", now+15_000); err != nil {
		t.Fatalf("the next day: %v", err)
	}
}

// TestHeadChunkBytesCounted: the head's chunks a query reads count against
// its max_fetched_chunk_bytes_per_query, as the blocks' do.
func TestHeadChunkBytesCounted(t *testing.T) {
	m := newTestManager(t, nil)
	db, err := m.Get("gpu-prod")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixMilli()
	for i := range 40 {
		if err := appendJob(db, "DCGM_FI_DEV_GPU_UTIL", 2, "llm-train-0", now-int64(40-i)*15_000); err != nil {
			t.Fatal(err)
		}
	}
	read := func(ctx context.Context) error {
		// A query's range (an unbounded one reads the head as out-of-order
		// data, through the TSDB's own reader).
		q, err := db.Querier(now-time.Hour.Milliseconds(), now)
		if err != nil {
			t.Fatal(err)
		}
		defer q.Close()
		ss := q.Select(ctx, false, nil, labels.MustNewMatcher(labels.MatchRegexp, "__name__", "DCGM.*"))
		var it chunkenc.Iterator
		for ss.Next() {
			it = ss.At().Iterator(it)
			for it.Next() != chunkenc.ValNone {
			}
			if it.Err() != nil {
				return it.Err()
			}
		}
		return ss.Err()
	}
	if err := read(querylimit.With(context.Background(), querylimit.New("gpu-prod", 0, 200))); !querylimit.IsError(err) {
		t.Fatalf("16 series' head chunks under a 200-byte limit: %v, want the limit's error", err)
	}
	if err := read(querylimit.With(context.Background(), querylimit.New("gpu-prod", 0, 1<<20))); err != nil {
		t.Fatalf("within the limit: %v", err)
	}
	if err := read(context.Background()); err != nil {
		t.Fatalf("without a limiter: %v", err)
	}
}
