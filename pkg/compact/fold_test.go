package compact_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/compact"
	"github.com/gpustore/gpustore/pkg/downsample"
)

// TestFoldedDownsamplingAnswersLikeRawWithoutPods: with the compactor's
// default fold (dcgm-exporter's pod label merged away at downsampling) the
// simulated node's 5m and 1h data hold one series per GPU instead of one per
// GPU and job, and answer the downsampling checks as raw data written without
// pod labels does (the same slice, uploaded as a second tenant). Queries that
// name pod read raw data while it exists; the others read the folded data.
func TestFoldedDownsamplingAnswersLikeRawWithoutPods(t *testing.T) {
	s3 := startS3(t)
	bkt := openBucket(t, s3)
	sl := downsampleSlice()
	sl.Metrics = []string{"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE",
		"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "node_network_transmit_bytes_total"}
	upload(t, bkt, "fold", nil, sl.write(t, t.TempDir())...)
	truth := sl
	truth.DropLabels = []string{"pod"}
	upload(t, bkt, "truth", nil, truth.write(t, t.TempDir())...)
	qa, qurl := startQuery(t, s3.bucket())
	if err := qa.BucketStore.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	start, end := sl.Start.Add(time.Hour), sl.Start.Add(2*day)
	raw := rawDownsampleAnswers(t, qurl, "truth", start, end)
	const byPod = "count by (pod) (DCGM_FI_DEV_GPU_UTIL)"
	podRaw, _ := queryRange(t, qurl, "fold", byPod, start, end, 40*time.Minute, "raw")

	cfg := testConfig()
	cfg.Downsample = true
	cfg.DownsampleFoldLabels = compact.DefaultConfig().DownsampleFoldLabels
	c, _ := newCompactor(t, cfg, bkt, nil)
	st := compactUntilStable(t, c, bkt, "fold")
	if err := qa.BucketStore.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	blocks, _ := byResolution(st)
	series := map[int64]uint64{}
	for r, ms := range blocks {
		for _, m := range ms {
			if m.MaxTime <= end.UnixMilli() {
				series[r] += m.Stats.NumSeries
			}
			if r != block.ResolutionRaw && !slices.Equal(m.GPUStore.Downsample.FoldedLabels, []string{"pod"}) {
				t.Errorf("%s block %s: folded_labels %q, want [pod]", downsample.ResolutionName(r), m.ULID, m.GPUStore.Downsample.FoldedLabels)
			}
		}
	}
	// gpusim starts a job on a GPU every few hours: raw holds a series per
	// GPU and job, the folded data one per GPU and namespace (idle or not).
	t.Logf("series in the first two days' blocks: raw %d, 5m %d, 1h %d", series[block.ResolutionRaw], series[downsample.Res5m], series[downsample.Res1h])
	if series[downsample.Res5m] == 0 || series[downsample.Res5m]*4 > series[block.ResolutionRaw] {
		t.Errorf("5m data folded over pod has %d series against raw's %d: want a quarter or less", series[downsample.Res5m], series[block.ResolutionRaw])
	}

	compareDownsampleChecks(t, "folded", qurl, "fold", raw, start, end, sl.Interval)

	// Auto resolution at a week-long panel's step: a query by pod reads raw
	// (and answers as before), one that aggregates pods away reads 5m data.
	got, infos := queryRange(t, qurl, "fold", byPod, start, end, 40*time.Minute, "")
	if slices.ContainsFunc(infos, func(s string) bool { return strings.Contains(s, " data for") }) {
		t.Errorf("%s at a 40m step read downsampled data while raw exists: infos %q", byPod, infos)
	}
	compareSeries(t, byPod+" after folding", podRaw, got, func(string, int64) float64 { return 0 })
	if _, infos := queryRange(t, qurl, "fold", "avg(DCGM_FI_DEV_GPU_UTIL)", start, end, 40*time.Minute, ""); !slices.ContainsFunc(infos, func(s string) bool { return strings.Contains(s, "5m data for") }) {
		t.Errorf("avg(DCGM_FI_DEV_GPU_UTIL) at a 40m step did not read 5m data: infos %q", infos)
	}
}
