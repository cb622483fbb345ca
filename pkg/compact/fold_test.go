package compact_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/downsample"
)

// foldChecks are the questions folded data answers as raw data with pods
// does, over windows of r: the gauges' aggregations over the pods of a GPU
// (grouped by every label but pod, named without naming pod, which would
// send the query to raw data), and the counters' functions per series
// (counters are never folded, so their series keep their pods).
func foldChecks(r string) []downsampleCheck {
	const gpu = "Hostname, UUID, gpu, device, modelName, DCGM_FI_DRIVER_VERSION, namespace, container, instance, job"
	return []downsampleCheck{
		{"max by (" + gpu + ") (max_over_time(DCGM_FI_DEV_GPU_TEMP[" + r + "]))", "", 0, ""},
		{"min by (" + gpu + ") (min_over_time(DCGM_FI_DEV_GPU_UTIL[" + r + "]))", "", 0, ""},
		{"sum by (" + gpu + ") (sum_over_time(DCGM_FI_DEV_POWER_USAGE[" + r + "]))", "", 1e-9, ""},
		{"sum by (" + gpu + ") (count_over_time(DCGM_FI_DEV_GPU_UTIL[" + r + "]))", "", 0, ""},
		{"rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[" + r + "])", "", 1e-6, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"},
		{"increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[" + r + "])", "", 1e-6, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"},
		{"resets(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[" + r + "])", "", 0, ""},
	}
}

// TestFoldedDownsamplingAnswersLikeRaw: with the pod fold on (it is
// opt-in), the simulated node's 5m and 1h gauges hold one series per GPU
// instead of one per GPU and job, while its counters keep their pods; both
// answer foldChecks as the same raw data, with its pod labels, does. Queries
// that name pod read raw data while it exists; the others read the folded
// data.
func TestFoldedDownsamplingAnswersLikeRaw(t *testing.T) {
	store := startStore(t)
	bkt := openBucket(t, store)
	sl := downsampleSlice()
	sl.Metrics = []string{"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE",
		"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "node_network_transmit_bytes_total"}
	upload(t, bkt, "fold", nil, sl.write(t, t.TempDir())...)
	qa, qurl := startQuery(t, store.bucket())
	if err := qa.BucketStore.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	start, end := sl.Start.Add(time.Hour), sl.Start.Add(2*day)
	raw := map[string]seriesPoints{}
	for _, r := range []string{"5m", "1h"} {
		rawAnswers(t, qurl, "fold", raw, r, foldChecks(r), start, end, time.Hour)
	}
	const byPod = "count by (pod) (DCGM_FI_DEV_GPU_UTIL)"
	podRaw, _ := queryRange(t, qurl, "fold", byPod, start, end, 40*time.Minute, "raw")

	cfg := testConfig()
	cfg.Downsample = true
	cfg.DownsampleFoldLabels = []string{"pod"}
	c, _ := newCompactor(t, cfg, bkt, nil)
	st := compactUntilStable(t, c, bkt, "fold")
	if err := qa.BucketStore.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	blocks, _ := byResolution(st)
	for r, ms := range blocks {
		for _, m := range ms {
			if r != block.ResolutionRaw && !slices.Equal(m.GPUStore.Downsample.FoldedLabels, []string{"pod"}) {
				t.Errorf("%s block %s: folded_labels %q, want [pod]", downsample.ResolutionName(r), m.ULID, m.GPUStore.Downsample.FoldedLabels)
			}
		}
	}
	for _, r := range []string{"5m", "1h"} {
		compareChecks(t, "folded", qurl, "fold", raw, r, foldChecks(r), start, end, time.Hour, sl.Interval, r)
	}
	// gpusim starts a job on a GPU every few hours: raw holds a series per
	// GPU and job, the folded gauges one per GPU and namespace (idle or
	// not), the counters one per GPU and job still.
	for metric, folded := range map[string]bool{"DCGM_FI_DEV_GPU_UTIL": true, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": false} {
		q := "count(count_over_time(" + metric + "[2d]))"
		rawN, _ := queryRange(t, qurl, "fold", q, end, end, time.Hour, "raw")
		dsN, _ := queryRange(t, qurl, "fold", q, end, end, time.Hour, "5m")
		n := func(s seriesPoints) float64 { return s[labels.EmptyLabels().String()][end.Unix()] }
		t.Logf("%s over the first two days: raw %v series, 5m %v", metric, n(rawN), n(dsN))
		if folded && (n(dsN) == 0 || 4*n(dsN) > n(rawN)) || !folded && n(dsN) != n(rawN) {
			t.Errorf("%s: %v series at 5m, %v raw; want a quarter or less if folded (%v), as many if not", metric, n(dsN), n(rawN), folded)
		}
	}

	// A day's energy per GPU and namespace (a cost report's question). Had
	// the counters been folded, the jobs' merged series would count the
	// idle time between them: +4.4 to +5.0 % per GPU here. Unfolded, the 5m
	// answer is +1.7 %: each job's series starts and ends inside the day,
	// and increase() extrapolates those ends by half the average interval
	// of the samples it has (~75 s over 5m data's kept samples, 7.5 s over
	// raw's) — the stated tolerance for series that do not cover the range.
	const daily = "sum by (Hostname, gpu, namespace) (increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[1d]))"
	dailyRaw, _ := queryRange(t, qurl, "fold", daily, end, end, time.Hour, "raw")
	dailyDS, _ := queryRange(t, qurl, "fold", daily, end, end, time.Hour, "5m")
	compareSeries(t, daily+" at 5m", dailyRaw, dailyDS, func(string, int64) float64 { return 0.025 })

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
