package compact_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/tsdb"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/downsample"
)

// writeGauge writes one 2h block of a GPU temperature series with a sample
// every 30 s from start+offset, all of value v.
func writeGauge(t *testing.T, dir string, start time.Time, offset time.Duration, v float64) string {
	t.Helper()
	w, err := tsdb.NewBlockWriter(quiet(), dir, (2 * time.Hour).Milliseconds())
	if err != nil {
		t.Fatal(err)
	}
	app := w.Appender(context.Background())
	ls := labels.FromStrings("__name__", "DCGM_FI_DEV_GPU_TEMP", "gpu", "0", "Hostname", "node-0")
	for ts := start.Add(offset); ts.Before(start.Add(2 * time.Hour)); ts = ts.Add(30 * time.Second) {
		if _, err := app.Append(0, ls, ts.UnixMilli(), v); err != nil {
			t.Fatal(err)
		}
	}
	if err := app.Commit(); err != nil {
		t.Fatal(err)
	}
	id, err := w.Flush(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	d := filepath.Join(dir, id.String())
	setBlockRange(t, d, start.UnixMilli(), start.Add(2*time.Hour).UnixMilli())
	return d
}

// TestUploadIntoDownsampledHours: a block uploaded into hours the tenant
// already holds, after those hours were compacted and downsampled to 5m
// and 1h, is merged with the raw block there (vertical compaction), and the
// merged block is downsampled again, replacing the 5m and 1h blocks of the
// raw block alone: raw, 5m and 1h answers hold every sample of both, none
// hidden and none counted twice. The 1h block was built from the new 5m
// block merged point by point with the old one, which the pass had not
// marked yet, and held the receiver's samples only.
func TestUploadIntoDownsampledHours(t *testing.T) {
	s := startStore(t)
	bkt := openBucket(t, s)
	cfg := testConfig()
	cfg.Downsample = true
	c, _ := newCompactor(t, cfg, bkt, nil)
	const tenant = "t"
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) // a 14d boundary
	dir := t.TempDir()
	// The tenant's receiver: 18 hours at 30 s, value 50.
	var own []string
	for i := range 9 {
		own = append(own, writeGauge(t, dir, t0.Add(time.Duration(i)*2*time.Hour), 0, 50))
	}
	upload(t, bkt, tenant, nil, own...)
	st := compactUntilStable(t, c, bkt, tenant)
	by, _ := byResolution(st)
	if len(by[downsample.Res5m]) == 0 || len(by[downsample.Res1h]) == 0 {
		t.Fatalf("before the upload: %s: want 5m and 1h blocks", st.spans())
	}

	// Uploaded: hours 2-4 again, samples 15 s after the receiver's, value 90.
	upload(t, bkt, tenant, nil, writeGauge(t, t.TempDir(), t0.Add(2*time.Hour), 15*time.Second, 90))
	st = compactUntilStable(t, c, bkt, tenant)
	by, _ = byResolution(st)
	for _, m := range by[block.ResolutionRaw] {
		for _, o := range by[block.ResolutionRaw] {
			if m != o && m.MinTime < o.MaxTime && o.MinTime < m.MaxTime {
				t.Fatalf("raw blocks still overlap: %s", st.spans())
			}
		}
	}

	_, base := startQuery(t, s.bucket())
	start, end := t0.Add(time.Hour), t0.Add(7*time.Hour)
	for _, res := range []string{"raw", "5m", "1h"} {
		step := 5 * time.Minute
		if res == "1h" {
			step = time.Hour
		}
		rng := step.String()
		if res == "raw" {
			rng = "5m"
		}
		maxes, _ := queryRange(t, base, tenant, "max_over_time(DCGM_FI_DEV_GPU_TEMP["+rng+"])", start, end, step, res)
		counts, _ := queryRange(t, base, tenant, "count_over_time(DCGM_FI_DEV_GPU_TEMP["+rng+"])", start, end, step, res)
		if len(maxes) != 1 || len(counts) != 1 {
			t.Fatalf("%s: %d and %d series, want 1", res, len(maxes), len(counts))
		}
		for _, pts := range maxes {
			for ts, v := range pts {
				at := time.Unix(ts, 0)
				want := 50.0
				if !at.Before(t0.Add(2*time.Hour+time.Duration(step))) && !at.After(t0.Add(4*time.Hour)) {
					want = 90
				}
				if v != want {
					t.Errorf("%s: max_over_time at %s = %v, want %v", res, at.UTC().Format("15:04"), v, want)
				}
			}
		}
		for _, pts := range counts {
			for ts, v := range pts {
				at := time.Unix(ts, 0)
				want := step.Seconds() / 30
				if !at.Before(t0.Add(2*time.Hour+time.Duration(step))) && !at.After(t0.Add(4*time.Hour)) {
					want *= 2
				}
				if v != want {
					t.Errorf("%s: count_over_time at %s = %v, want %v", res, at.UTC().Format("15:04"), v, want)
				}
			}
		}
	}
}
