package compact_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/gpustore/gpustore/bench/gpusim"
	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/compact"
	"github.com/gpustore/gpustore/pkg/downsample"
)

// downsampleSlice: 1 node (8 GPUs) × 3 days at 15s (dcgm-exporter's usual
// scrape interval) in 2h blocks, starting at
// a 14d boundary.
func downsampleSlice() simSlice {
	ms := (14 * day).Milliseconds()
	b := time.UnixMilli((gpusim.DefaultEpoch.UnixMilli() + ms - 1) / ms * ms).UTC()
	// Not thinned under the race detector: the size check depends on the
	// number of raw samples per window.
	return simSlice{Nodes: 1, Start: b, Duration: 3 * day, Interval: 15 * time.Second, Block: 2 * time.Hour}
}

// byResolution splits live blocks by resolution and sums their bytes.
func byResolution(st bucketState) (map[int64][]*block.Meta, map[int64]int64) {
	blocks, bytes := map[int64][]*block.Meta{}, map[int64]int64{}
	for _, m := range st.live {
		r := m.GPUStore.Downsample.Resolution
		blocks[r] = append(blocks[r], m)
		bytes[r] += m.BucketBytes()
	}
	return blocks, bytes
}

func sourceSet(ms []*block.Meta) map[ulid.ULID]bool {
	out := map[ulid.ULID]bool{}
	for _, m := range ms {
		for _, s := range m.Compaction.Sources {
			out[s] = true
		}
	}
	return out
}

// TestDownsampleInThePass: a pass downsamples every finished raw block to 5m
// and every finished 5m block to 1h; the results are ordinary blocks that
// compact in their own groups; every raw sample but the newest (unfinished)
// block's is covered at 5m; downsampled data is smaller than raw; raw
// retention deletes only raw blocks whose samples are at 5m.
func TestDownsampleInThePass(t *testing.T) {
	store := startStore(t)
	bkt := openBucket(t, store)
	sl := downsampleSlice()
	dirs := sl.write(t, t.TempDir())
	shipped := upload(t, bkt, "ds", nil, dirs...)

	cfg := testConfig()
	cfg.Downsample = true
	cfg.DownsampleFoldLabels = compact.DefaultConfig().DownsampleFoldLabels // the defaults' sizes
	c, reg := newCompactor(t, cfg, bkt, nil)
	t0 := time.Now()
	st := compactUntilStable(t, c, bkt, "ds")
	t.Logf("compacted and downsampled in %s: %s", time.Since(t0).Round(time.Millisecond), st.spans())

	blocks, bytes := byResolution(st)
	for _, r := range []int64{block.ResolutionRaw, downsample.Res5m, downsample.Res1h} {
		if len(blocks[r]) == 0 {
			t.Fatalf("no %s block after the passes: %s", downsample.ResolutionName(r), st.spans())
		}
		for _, m := range blocks[r] {
			if r != block.ResolutionRaw && m.GPUStore.Source != downsample.Source && m.GPUStore.Source != block.SourceCompactor {
				t.Errorf("%s block %s has source %q", downsample.ResolutionName(r), m.ULID, m.GPUStore.Source)
			}
		}
	}
	// Coverage: every shipped block is a source at 5m but those of the
	// newest raw block (the whole newest 8h range, compacted: nothing after
	// it, so unfinished); at 1h every one the 5m blocks hold but the newest
	// 5m block's.
	var newestRaw *block.Meta
	for _, m := range blocks[block.ResolutionRaw] {
		if newestRaw == nil || m.MinTime > newestRaw.MinTime {
			newestRaw = m
		}
	}
	unfinished := sourceSet([]*block.Meta{newestRaw})
	cov5, cov1 := sourceSet(blocks[downsample.Res5m]), sourceSet(blocks[downsample.Res1h])
	for _, m := range shipped {
		if cov5[m.ULID] == unfinished[m.ULID] {
			t.Errorf("shipped block %s (%s): downsampled to 5m %v, in the unfinished newest raw block %v",
				m.ULID, time.UnixMilli(m.MinTime).UTC(), cov5[m.ULID], unfinished[m.ULID])
		}
	}
	if len(cov1) == 0 || len(cov1) >= len(cov5) {
		t.Errorf("1h blocks hold %d shipped blocks, 5m %d: want fewer but some (the newest 5m block is unfinished)", len(cov1), len(cov5))
	}
	// Downsampled blocks compacted like raw ones: 3 days make one 2d-level
	// block at least at every resolution.
	for _, r := range []int64{downsample.Res5m, downsample.Res1h} {
		longest := int64(0)
		for _, m := range blocks[r] {
			longest = max(longest, m.MaxTime-m.MinTime)
		}
		if longest < (2 * day).Milliseconds() {
			t.Errorf("%s blocks not compacted: longest %s (%s)", downsample.ResolutionName(r), time.Duration(longest)*time.Millisecond, st.spans())
		}
	}
	for _, m := range st.live {
		t.Logf("%s %s+%s: series %d samples %d chunks %d files %+v", downsample.ResolutionName(m.GPUStore.Downsample.Resolution),
			time.UnixMilli(m.MinTime).UTC().Format("01-02T15"), time.Duration(m.MaxTime-m.MinTime)*time.Millisecond,
			m.Stats.NumSeries, m.Stats.NumSamples, m.Stats.NumChunks, m.GPUStore.Files)
	}
	// The targets are shares of raw data as the TSDB writes it: the raw
	// blocks' files before -compact.raw-encoding stores them compressed.
	var rawPlain int64
	for _, m := range st.live {
		if m.GPUStore.Downsample.Resolution == block.ResolutionRaw {
			for _, f := range m.GPUStore.Files {
				rawPlain += f.SizeBytes
			}
		}
	}
	raw := float64(rawPlain)
	r5, r1 := float64(bytes[downsample.Res5m])/raw, float64(bytes[downsample.Res1h])/raw
	t.Logf("bytes: raw %d as the TSDB writes it (%d stored), 5m %d (%.1f%% of raw), 1h %d (%.2f%%); samples: raw %d; downsampled blocks written %v",
		rawPlain, bytes[block.ResolutionRaw], bytes[downsample.Res5m], 100*r5, bytes[downsample.Res1h], 100*r1, st.samples(),
		counter(t, reg, "gpustore_downsample_blocks_total"))
	// Every raw series stays one series (a gauge's aggregates packed into
	// one), so the index does not shrink with downsampling: on this slice's
	// pod churn the plain 5m files are 23 % of raw and 1h 11 %, half of it
	// index. Stored zstd-encoded without the TSDB's CRCs (the default), 5m
	// is 8.4 % and 1h 1.57 % (plain zstd: 8.8 % and 1.90 %): see
	// bench/RESULTS.md.
	if r5 >= 0.095 || r1 >= 0.018 {
		t.Errorf("downsampled data too large: 5m %.1f%% of raw (want < 9.5%%), 1h %.2f%% (want < 1.8%%)", 100*r5, 100*r1)
	}

	// Raw retention of 1 day (the data is months old): every raw block whose
	// samples are at 5m goes; the newest, not downsampled, stays.
	cfg.RetentionRaw = model.Duration(day)
	c2, _ := newCompactor(t, cfg, bkt, nil)
	st = compactUntilStable(t, c2, bkt, "ds")
	blocks, _ = byResolution(st)
	var left []string
	for _, m := range blocks[block.ResolutionRaw] {
		left = append(left, fmt.Sprint(m.Compaction.Sources))
	}
	if len(blocks[block.ResolutionRaw]) != 1 || blocks[block.ResolutionRaw][0].ULID != newestRaw.ULID {
		t.Fatalf("raw blocks left after retention: %v, want only the newest raw block %v (not downsampled yet)", left, newestRaw.Compaction.Sources)
	}
	if len(blocks[downsample.Res5m]) == 0 || len(blocks[downsample.Res1h]) == 0 {
		t.Fatalf("raw retention removed downsampled data: %s", st.spans())
	}
}

// downsampleCheck is a query whose answer over downsampled data must equal
// the raw answer of rawEquivalent (q itself when empty) within tol.
type downsampleCheck struct {
	q, rawEquivalent string
	tol              float64
	// counter: the metric, for rate and increase. They agree within tol,
	// also where a series starts or ends inside the range (the reader puts
	// back the raw samples the engine's average interval needs), unless the
	// answer says it is approximate (blocks that do not record them): then
	// raw extrapolates half a scrape interval past its first/last sample
	// and the kept samples up to the range edge, a difference bounded by
	// the uncovered share of the range.
	counter string
}

func (c downsampleCheck) rawQuery() string {
	if c.rawEquivalent != "" {
		return c.rawEquivalent
	}
	return c.q
}

// downsampleChecks are the functions with exact aggregates over windows of
// r, and plain selectors (a window's average) under aggregations.
func downsampleChecks(r string) []downsampleCheck {
	return []downsampleCheck{
		{"max_over_time(DCGM_FI_DEV_GPU_TEMP[" + r + "])", "", 0, ""},
		{"min_over_time(DCGM_FI_DEV_GPU_UTIL[" + r + "])", "", 0, ""},
		{"sum_over_time(DCGM_FI_DEV_POWER_USAGE[" + r + "])", "", 1e-9, ""},
		{"count_over_time(DCGM_FI_DEV_GPU_UTIL[" + r + "])", "", 0, ""},
		{"avg_over_time(DCGM_FI_DEV_POWER_USAGE[" + r + "])", "", 1e-9, ""},
		{"rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[" + r + "])", "", 1e-6, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"},
		{"increase(node_network_transmit_bytes_total[" + r + "])", "", 1e-6, "node_network_transmit_bytes_total"},
		{"resets(node_network_transmit_bytes_total[" + r + "])", "", 0, ""},
		{"max by (Hostname) (DCGM_FI_DEV_GPU_TEMP)", "max by (Hostname) (avg_over_time(DCGM_FI_DEV_GPU_TEMP[" + r + "]))", 1e-9, ""},
		{"avg(DCGM_FI_DEV_GPU_UTIL)", "avg(avg_over_time(DCGM_FI_DEV_GPU_UTIL[" + r + "]))", 1e-9, ""},
	}
}

// rawDownsampleAnswers records the raw answers of the 5m and 1h checks
// (downsampleChecks) over [start, end] at a 1h step.
func rawDownsampleAnswers(t *testing.T, qurl, tenant string, start, end time.Time) map[string]seriesPoints {
	t.Helper()
	raw := map[string]seriesPoints{}
	for _, r := range []string{"5m", "1h"} {
		rawAnswers(t, qurl, tenant, raw, r, downsampleChecks(r), start, end, time.Hour)
	}
	return raw
}

// compareDownsampleChecks compares the 5m and 1h checks, each read at its
// resolution, with the raw answers of rawDownsampleAnswers.
func compareDownsampleChecks(t *testing.T, when, qurl, tenant string, raw map[string]seriesPoints, start, end time.Time, interval time.Duration) {
	t.Helper()
	for _, r := range []string{"5m", "1h"} {
		compareChecks(t, when, qurl, tenant, raw, r, downsampleChecks(r), start, end, time.Hour, interval, r)
	}
}

// rawAnswers puts into raw the raw answers of checks (key r+query) and the
// sample counts their counter tolerances need (key r+"count "+metric).
func rawAnswers(t *testing.T, qurl, tenant string, raw map[string]seriesPoints, r string, checks []downsampleCheck, start, end time.Time, step time.Duration) {
	t.Helper()
	for _, c := range checks {
		raw[r+c.rawQuery()], _ = queryRange(t, qurl, tenant, c.rawQuery(), start, end, step, "raw")
		if c.counter != "" {
			raw[r+"count "+c.counter], _ = queryRange(t, qurl, tenant, "count_over_time("+c.counter+"["+r+"])", start, end, step, "raw")
		}
	}
}

// compareChecks runs checks at maxRes ("" for auto) and compares each answer
// with its raw answer in raw; each answer must say it read r data.
func compareChecks(t *testing.T, when, qurl, tenant string, raw map[string]seriesPoints, r string, checks []downsampleCheck,
	start, end time.Time, step, interval time.Duration, maxRes string) {
	t.Helper()
	for _, ch := range checks {
		got, infos := queryRange(t, qurl, tenant, ch.q, start, end, step, maxRes)
		tol := func(string, int64) float64 { return ch.tol }
		if ch.counter != "" && slices.ContainsFunc(infos, func(s string) bool { return strings.Contains(s, "approximate") }) {
			counts, rng := raw[r+"count "+ch.counter], mustDuration(t, r).Seconds()
			tol = func(k string, ts int64) float64 {
				sampled := (counts[dropName(k)][ts] - 1) * interval.Seconds()
				if sampled >= rng-interval.Seconds() {
					return ch.tol // covered
				}
				return (rng-sampled)/max(sampled, 1) + ch.tol
			}
		}
		compareSeries(t, fmt.Sprintf("%s, %s data: %s", when, r, ch.q), raw[r+ch.rawQuery()], got, tol)
		if !slices.ContainsFunc(infos, func(s string) bool { return strings.Contains(s, r+" data for") }) {
			t.Errorf("%s, %s: the answer does not say it read %s data: infos %q", when, ch.q, r, infos)
		}
	}
}

// series is one series of a range query's answer: labels → time → value.
type seriesPoints map[string]map[int64]float64

// queryRange runs a range query through gpustore's HTTP API and returns its
// series and the answer's info annotations.
func queryRange(t *testing.T, base, tenant, q string, start, end time.Time, step time.Duration, maxRes string) (seriesPoints, []string) {
	t.Helper()
	form := url.Values{"query": {q}, "start": {strconv.FormatInt(start.Unix(), 10)}, "end": {strconv.FormatInt(end.Unix(), 10)},
		"step": {strconv.FormatFloat(step.Seconds(), 'f', -1, 64)}}
	if maxRes != "" {
		form.Set("max_source_resolution", maxRes)
	}
	req, _ := http.NewRequest(http.MethodPost, base+"/api/v1/query_range", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("X-Scope-OrgID", tenant)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %d %s", q, resp.StatusCode, body)
	}
	var r struct {
		Data struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Values [][2]any          `json:"values"`
			} `json:"result"`
		} `json:"data"`
		Infos []string `json:"infos"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatal(err)
	}
	out := seriesPoints{}
	for _, s := range r.Data.Result {
		k := labels.FromMap(s.Metric).String()
		out[k] = map[int64]float64{}
		for _, v := range s.Values {
			f, _ := strconv.ParseFloat(v[1].(string), 64)
			out[k][int64(v[0].(float64))] = f
		}
	}
	return out, r.Infos
}

func mustDuration(t *testing.T, s string) time.Duration {
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// dropName is a series key without its metric name (what rate keeps).
func dropName(k string) string {
	ls, err := parser.NewParser(parser.Options{}).ParseMetric(k)
	if err != nil {
		return k
	}
	return labels.NewBuilder(ls).Del(model.MetricNameLabel).Labels().String()
}

// compareSeries checks got against want point by point within a relative
// tolerance, and that want is not empty (the comparison proves something).
func compareSeries(t *testing.T, what string, want, got seriesPoints, tol func(series string, ts int64) float64) {
	t.Helper()
	points, bad := 0, 0
	for k, w := range want {
		g := got[k]
		for ts, wv := range w {
			points++
			gv, ok := g[ts]
			if !ok || math.Abs(gv-wv) > tol(k, ts)*max(math.Abs(wv), 1e-9) {
				if bad < 3 {
					t.Errorf("%s: %s at %s: raw %v, downsampled %v (present %v)", what, k, time.Unix(ts, 0).UTC(), wv, gv, ok)
				}
				bad++
			}
		}
	}
	if points == 0 {
		t.Fatalf("%s: raw answer is empty: the comparison proves nothing", what)
	}
	if bad > 0 {
		t.Errorf("%s: %d of %d points differ", what, bad, points)
	}
}

// TestDownsampledQueriesMatchRaw: the same PromQL over the same range, on
// raw blocks and then on the 5m and 1h blocks the compactor wrote (through
// gpustore's HTTP API, the bucket store and pkg/downsample's views): the
// functions with exact aggregates answer exactly (or within rounding), rate
// and increase within 1e-6, a plain selector as the window's average; auto
// resolution picks downsampled data for a Grafana step and says so; and
// once raw retention has deleted the raw blocks, the same queries still
// answer from the downsampled ones, never empty.
func TestDownsampledQueriesMatchRaw(t *testing.T) {
	store := startStore(t)
	bkt := openBucket(t, store)
	sl := downsampleSlice()
	upload(t, bkt, "dq", nil, sl.write(t, t.TempDir())...)
	qa, qurl := startQuery(t, store.bucket())
	if err := qa.BucketStore.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Two whole days: finished, so downsampled at both resolutions.
	start, end := sl.Start.Add(time.Hour), sl.Start.Add(2*day)
	raw := rawDownsampleAnswers(t, qurl, "dq", start, end)

	cfg := testConfig()
	cfg.Downsample = true
	c, _ := newCompactor(t, cfg, bkt, nil)
	compactUntilStable(t, c, bkt, "dq")
	if err := qa.BucketStore.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	compareAll := func(when string) {
		compareDownsampleChecks(t, when, qurl, "dq", raw, start, end, sl.Interval)
	}
	compareAll("raw kept")

	// Auto: a week-long panel's step (~40 min) reads 5m data; an instant
	// query reads raw.
	_, infos := queryRange(t, qurl, "dq", "avg(DCGM_FI_DEV_GPU_UTIL)", start, end, 40*time.Minute, "")
	if !slices.ContainsFunc(infos, func(s string) bool { return strings.Contains(s, "5m data for") }) {
		t.Errorf("auto resolution at a 40m step did not read 5m data: infos %q", infos)
	}
	_, infos = queryRange(t, qurl, "dq", "avg(DCGM_FI_DEV_GPU_UTIL)", start, end, time.Minute, "")
	if len(infos) != 0 {
		t.Errorf("auto resolution at a 1m step read downsampled data: infos %q", infos)
	}

	// Raw retention (1 day; the data is months old) deletes every raw block
	// that is downsampled: the same queries answer from 5m and 1h data, and
	// a raw-only request falls back to 5m rather than answering nothing.
	cfg.RetentionRaw = model.Duration(day)
	c2, _ := newCompactor(t, cfg, bkt, nil)
	st := compactUntilStable(t, c2, bkt, "dq")
	blocks, _ := byResolution(st)
	for _, m := range blocks[block.ResolutionRaw] {
		if m.MinTime < end.UnixMilli() {
			t.Fatalf("raw block %s+%s survived retention", time.UnixMilli(m.MinTime).UTC(), time.Duration(m.MaxTime-m.MinTime)*time.Millisecond)
		}
	}
	if err := qa.BucketStore.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	compareAll("raw deleted")
	// A plain selector at steps that fall between 1h windows still sees
	// each window's value (the lookback is 5m; the view repeats it).
	off, step := start.Add(17*time.Minute), 37*time.Minute
	got, _ := queryRange(t, qurl, "dq", "avg(DCGM_FI_DEV_GPU_UTIL)", off, end, step, "1h")
	if n, want := len(got[labels.EmptyLabels().String()]), int(end.Sub(off)/step)+1; n != want {
		t.Errorf("avg(DCGM_FI_DEV_GPU_UTIL) over 1h data at a 37m step: %d points, want %d", n, want)
	}
	// A range ending inside a 1h window (a dashboard's "now", a frontend's
	// day piece) still sees the last window's value at its end.
	at := start.Add(22*time.Hour + 29*time.Minute)
	if got, _ := queryRange(t, qurl, "dq", "avg(DCGM_FI_DEV_GPU_UTIL)", at, at, time.Minute, "1h"); len(got[labels.EmptyLabels().String()]) != 1 {
		t.Errorf("avg(DCGM_FI_DEV_GPU_UTIL) at %s alone over 1h data: %v, want one point", at, got)
	}
	got, infos = queryRange(t, qurl, "dq", "max_over_time(DCGM_FI_DEV_GPU_TEMP[5m])", start, end, time.Hour, "raw")
	compareSeries(t, "raw deleted, raw asked", raw["5mmax_over_time(DCGM_FI_DEV_GPU_TEMP[5m])"], got, func(string, int64) float64 { return 0 })
	if !slices.ContainsFunc(infos, func(s string) bool { return strings.Contains(s, "5m data for") }) {
		t.Errorf("raw asked after raw retention: want the 5m fallback said, infos %q", infos)
	}
}
