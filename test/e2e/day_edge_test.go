package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/common/model"

	"github.com/gpustore/gpustore/pkg/app"
	"github.com/gpustore/gpustore/pkg/compact"
	"github.com/gpustore/gpustore/pkg/storage/bucket"
)

// TestRangeFunctionsAcrossBlockEdges: blocks written by Prometheus' block
// writer (promtool's, a snapshot's, imported ones) end a millisecond after
// their last sample, not on the 2 h grid, and keep doing so when compacted
// into days. A 1 h window across such an edge (midnight, after compaction
// into 1-day blocks) must count each sample once: the 5m data beside the
// gap between the raw blocks holds samples the raw blocks hold too.
func TestRangeFunctionsAcrossBlockEdges(t *testing.T) {
	s3 := startS3(t)
	ctx := context.Background()
	h := makeHistory(time.Now().Add(-48 * time.Hour))
	bkt, err := bucket.New(s3.bucketConfig(), t.TempDir(), slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	const twoHours = 2 * 3600_000
	for from := h.start / twoHours * twoHours; from < h.end; from += twoHours {
		writeReceiverBlock(t, bkt, "default", h, from, from+twoHours)
	}
	a, base := startGpustore(t, func(c *app.Config) {
		withBucket(s3)(c)
		c.TSDB.BlockDuration = model.Duration(2 * time.Hour)
		c.TSDB.Retention = model.Duration(24 * time.Hour)
		c.Compact.Interval = model.Duration(time.Hour)
		c.Compact.BlockRanges = compact.DurationList{model.Duration(2 * time.Hour), model.Duration(8 * time.Hour), model.Duration(24 * time.Hour)}
		c.Compact.LeaseSettle = model.Duration(100 * time.Millisecond)
		c.Compact.DeleteDelay = 0
	})
	const gpu0 = `DCGM_FI_DEV_GPU_UTIL{Hostname="node-0", gpu="0"}`
	const day = 24 * 3600_000
	midnight := (h.start + 3600_000 + day - 1) / day * day // inside the history, an hour or more from its start
	probe := func(stage string) {
		for _, off := range []int64{-60_000, 0, 35*60_000 + 30_000, 59 * 60_000, 3600_000, 2*3600_000 + 15_000} {
			at := midnight + off
			v := queryTenant(t, base, "default", "count_over_time("+gpu0+"[1h])", time.UnixMilli(at))
			if len(v) != 1 || v[0].Value != 120 {
				t.Errorf("%s: instant query at midnight %+v: %v, want 120 samples", stage, time.Duration(off)*time.Millisecond, v)
			}
			m := rangeQuery(t, base, "count_over_time("+gpu0+"[1h])", "raw", at, at, time.Minute)
			if len(m) != 1 || len(m[0].Values) != 1 || m[0].Values[0].Value != 120 {
				t.Errorf("%s: one-step range query (raw) at midnight %+v: %v, want 120 samples", stage, time.Duration(off)*time.Millisecond, m)
			}
		}
	}
	if err := a.BucketStore.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	probe("2h blocks")
	for range 3 {
		if err := a.Compactor.CompactAll(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.BucketStore.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	probe("compacted and downsampled")
	// The first raw block begins at the first sample, inside a 5m window
	// whose 5m block begins on the grid before it: the panels of the first
	// hour answer as raw (Prometheus' answer), at a 5 m step (auto reads raw).
	for _, q := range []string{`avg(DCGM_FI_DEV_GPU_UTIL)`, `max by (gpu) (DCGM_FI_DEV_GPU_UTIL)`, gpu0} {
		from := h.start / 300_000 * 300_000
		want := rangeQuery(t, base, q, "raw", from, from+3600_000, 5*time.Minute)
		got := rangeQuery(t, base, q, "auto", from, from+3600_000, 5*time.Minute)
		if len(want) == 0 || fmt.Sprint(want) != fmt.Sprint(got) {
			t.Errorf("%s over the data's first hour: auto %v, raw %v", q, got, want)
		}
	}
}
