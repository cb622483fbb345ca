package compact_test

import (
	"context"
	"io/fs"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/gpustore/gpustore/bench/load"
	rulepack "github.com/gpustore/gpustore/deploy/rules"
	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/compact"
	"github.com/gpustore/gpustore/pkg/downsample"
)

// yearSlice is one GPU of one node for 394 days at 1m: the metrics the
// cluster-overview dashboard and the GPU recording rules read, with
// gpusim's job churn (pod labels), in 2d blocks (a year of 2h blocks would
// be 4,380 uploads; the compactor takes 2d blocks at their level). 394 days
// are 28 whole 14d ranges and one 2d block: the newest 14 days at 5m have
// no 1h data yet (their 5m block is the newest), so 1h data covers 378
// days, a year and then some. It ends months before this test was written,
// so raw retention (30 days) has expired for all of it.
func yearSlice() simSlice {
	ms := (14 * day).Milliseconds()
	from := time.Date(2025, 8, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	start := time.UnixMilli((from + ms - 1) / ms * ms).UTC()
	return simSlice{
		Nodes: 1, GPUs: 1, Start: start, Epoch: start, Duration: 394 * day, Interval: time.Minute, Block: 2 * day,
		Metrics: []string{
			"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_FB_USED",
			"DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
			"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "node_network_transmit_bytes_total",
			"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "kube_job_status_active",
		},
	}
}

// overWindows is expr with every plain selector (one not under a range
// function) replaced by avg_over_time(selector[r]): the raw query whose
// answer a plain selector over r data gives at steps aligned to r (the
// downsampled view answers a plain selector with the window's average).
func overWindows(t *testing.T, expr string, r time.Duration) string {
	t.Helper()
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		t.Fatalf("%s: %v", expr, err)
	}
	var wrap func(parser.Expr) parser.Expr
	wrap = func(e parser.Expr) parser.Expr {
		switch n := e.(type) {
		case *parser.VectorSelector:
			return &parser.Call{Func: parser.Functions["avg_over_time"], Args: parser.Expressions{
				&parser.MatrixSelector{VectorSelector: n, Range: r},
			}}
		case *parser.AggregateExpr:
			n.Expr = wrap(n.Expr)
		case *parser.BinaryExpr:
			n.LHS, n.RHS = wrap(n.LHS), wrap(n.RHS)
		case *parser.ParenExpr:
			n.Expr = wrap(n.Expr)
		case *parser.UnaryExpr:
			n.Expr = wrap(n.Expr)
		case *parser.Call:
			for i := range n.Args {
				n.Args[i] = wrap(n.Args[i])
			}
		}
		return e // matrix selectors, subqueries and literals as they are
	}
	return wrap(e).String()
}

// yearPlainChecks are the seed's cluster-overview panels and GPU recording
// rules (deploy/rules/gpu-recording.yml) that use plain selectors, as checks
// at resolution r, each against its raw equivalent (overWindows).
func yearPlainChecks(t *testing.T, r string) []downsampleCheck {
	t.Helper()
	var out []downsampleCheck
	add := func(q string) {
		if strings.Contains(q, "[") {
			return // range functions over fixed windows: yearRangeChecks
		}
		out = append(out, downsampleCheck{q: q, rawEquivalent: overWindows(t, q, mustDuration(t, r)), tol: 1e-9})
	}
	for _, dq := range load.DashboardQueries("gpu-node-001") {
		if dq.Dashboard == "cluster overview" {
			add(dq.Expr)
		}
	}
	b, err := fs.ReadFile(rulepack.FS, "gpu-recording.yml")
	if err != nil {
		t.Fatal(err)
	}
	groups, errs := rulefmt.Parse(b, false, model.UTF8Validation, parser.NewParser(parser.Options{}), quiet())
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	for _, g := range groups.Groups {
		for _, rl := range g.Rules {
			add(rl.Expr)
		}
	}
	return out
}

// yearRangeChecks are range functions over windows of r.
func yearRangeChecks(r string) []downsampleCheck {
	return []downsampleCheck{
		{"rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[" + r + "])", "", 1e-6, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"},
		{"increase(node_network_transmit_bytes_total[" + r + "])", "", 1e-6, "node_network_transmit_bytes_total"},
		{"max_over_time(DCGM_FI_DEV_GPU_TEMP[" + r + "])", "", 0, ""},
		{"avg_over_time(DCGM_FI_DEV_POWER_USAGE[" + r + "])", "", 1e-9, ""},
	}
}

// TestYearOfDownsampledData is issue 11's long-range end-to-end test: a
// year of the simulated cluster's slice (yearSlice) shipped to the real S3
// server (a folder bucket without versitygw), compacted and downsampled by
// the compactor with its defaults (every label kept), raw retention (30
// days) expired; then Grafana's requests (auto resolution) for the
// cluster-overview panels and the GPU recording rules over 30 days (a 3h
// step: 1h data for plain selectors, 5m for range functions over 5m) and the
// whole year (a 1d step: 1h data) answer, from downsampled data, what the
// same raw data answered before it was deleted.
func TestYearOfDownsampledData(t *testing.T) {
	if testing.Short() {
		t.Skip("a year of data: not in -short")
	}
	store := startStore(t)
	bkt := openBucket(t, store)
	sl := yearSlice()
	t0 := time.Now()
	dirs := sl.write(t, t.TempDir())
	upload(t, bkt, "year", nil, dirs...)
	t.Logf("a year of one GPU at 1m: %d blocks written and shipped in %s", len(dirs), time.Since(t0).Round(time.Millisecond))
	_, rawBytes := byResolution(readBucket(t, bkt, "year"))
	qa, qurl := startQuery(t, store.bucket())
	if err := qa.BucketStore.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}

	// Windows that end before the newest (raw) 2d block, where auto
	// resolution rightly reads raw data.
	end5m := sl.Start.Add(28 * 14 * day)
	// The newest 5m block (the 14 days before end5m) has no 1h data yet:
	// the compactor downsamples a block once a newer one follows it.
	end1h := end5m.Add(-14 * day)
	windows := []struct {
		name       string
		start, end time.Time
		step       time.Duration
		// What auto resolution picks at this step for plain selectors
		// and for range functions over windows of ranged.
		plain, ranged string
	}{
		{"30 days", end1h.Add(-31 * day), end1h.Add(-day), 3 * time.Hour, "1h", "5m"},
		{"365 days", sl.Start.Add(day), sl.Start.Add(366 * day), day, "1h", "1h"},
	}
	raw := map[string]map[string]seriesPoints{} // per window
	t0 = time.Now()
	for _, w := range windows {
		raw[w.name] = map[string]seriesPoints{}
		rawAnswers(t, qurl, "year", raw[w.name], w.plain, yearPlainChecks(t, w.plain), w.start, w.end, w.step)
		rawAnswers(t, qurl, "year", raw[w.name], w.ranged, yearRangeChecks(w.ranged), w.start, w.end, w.step)
	}
	t.Logf("raw answers in %s", time.Since(t0).Round(time.Millisecond))

	cfg := testConfig()
	cfg.Downsample = true
	cfg.DownsampleFoldLabels = compact.DefaultConfig().DownsampleFoldLabels // none
	cfg.RetentionRaw = model.Duration(30 * day)
	// The downsampled data's 365 days, counted from the slice's start
	// rather than from today (the slice is at fixed dates).
	cfg.Retention5m = model.Duration(time.Since(sl.Start) + 30*day)
	cfg.Retention1h = cfg.Retention5m
	c, _ := newCompactor(t, cfg, bkt, nil)
	t0 = time.Now()
	st := compactUntilStable(t, c, bkt, "year")
	blocks, bytes := byResolution(st)
	t.Logf("compacted, downsampled and raw retention applied in %s: %s", time.Since(t0).Round(time.Millisecond), st.spans())
	t.Logf("bytes: raw %d before retention (%d after), 5m %d (%.1f %%), 1h %d (%.1f %%)", rawBytes[block.ResolutionRaw], bytes[block.ResolutionRaw],
		bytes[downsample.Res5m], 100*float64(bytes[downsample.Res5m])/float64(rawBytes[block.ResolutionRaw]),
		bytes[downsample.Res1h], 100*float64(bytes[downsample.Res1h])/float64(rawBytes[block.ResolutionRaw]))
	for _, r := range []int64{downsample.Res5m, downsample.Res1h} {
		for _, m := range blocks[r] {
			if f := m.GPUStore.Downsample.FoldedLabels; len(f) != 0 {
				t.Fatalf("%s block %s: folded_labels %q, want none (the default)", downsample.ResolutionName(r), m.ULID, f)
			}
		}
	}
	for _, m := range blocks[block.ResolutionRaw] {
		if m.MinTime < end5m.UnixMilli() {
			t.Fatalf("raw block %s+%s survived 30 days' retention", time.UnixMilli(m.MinTime).UTC(),
				time.Duration(m.MaxTime-m.MinTime)*time.Millisecond)
		}
	}
	for _, r := range []int64{downsample.Res5m, downsample.Res1h} {
		if len(blocks[r]) == 0 {
			t.Fatalf("no %s blocks: %s", downsample.ResolutionName(r), st.spans())
		}
	}
	if err := qa.BucketStore.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}

	for _, w := range windows {
		// A query with no raw answer proves nothing (the overview's
		// "healthy GPUs" subtracts nothing when no GPU has an Xid).
		answered := func(r string, checks []downsampleCheck) []downsampleCheck {
			return slices.DeleteFunc(checks, func(ch downsampleCheck) bool {
				if len(raw[w.name][r+ch.rawQuery()]) == 0 {
					t.Logf("%s: %s has no raw answer: not compared", w.name, ch.rawQuery())
					return true
				}
				return false
			})
		}
		plain, ranged := answered(w.plain, yearPlainChecks(t, w.plain)), answered(w.ranged, yearRangeChecks(w.ranged))
		if len(plain) < 8 || len(ranged) < 4 {
			t.Fatalf("%s: only %d plain and %d range queries have a raw answer", w.name, len(plain), len(ranged))
		}
		t.Logf("%s: %d plain and %d range queries compared with their raw answers", w.name, len(plain), len(ranged))
		compareChecks(t, w.name+", raw deleted, auto", qurl, "year", raw[w.name], w.plain, plain, w.start, w.end, w.step, sl.Interval, "")
		compareChecks(t, w.name+", raw deleted, auto", qurl, "year", raw[w.name], w.ranged, ranged, w.start, w.end, w.step, sl.Interval, "")
		// The panels' own rate over 5m windows answers at the same step
		// from finer data (5m) rather than nothing.
		got, infos := queryRange(t, qurl, "year", "rate(DCGM_FI_DEV_ECC_SBE_VOL_TOTAL[5m])", w.start, w.end, w.step, "")
		if n, steps := points(got), int(w.end.Sub(w.start)/w.step)+1; n < steps/2 {
			t.Errorf("%s: rate(DCGM_FI_DEV_ECC_SBE_VOL_TOTAL[5m]) has %d points over %d steps (infos %q)", w.name, n, steps, infos)
		}
		if !slices.ContainsFunc(infos, func(s string) bool { return strings.Contains(s, "5m data for") }) {
			t.Errorf("%s: rate(x[5m]) did not read 5m data: infos %q", w.name, infos)
		}
		// A query by pod where only downsampled data is left answers per
		// pod: the default keeps the label.
		got, _ = queryRange(t, qurl, "year", "max by (pod, gpu) (DCGM_FI_DEV_GPU_UTIL)", w.start, w.end, w.step, "")
		if !slices.ContainsFunc(slices.Collect(maps.Keys(got)), func(k string) bool { return strings.Contains(k, "pod=") }) {
			t.Errorf("%s: max by (pod, gpu) over downsampled data has no series with a pod (%d series)", w.name, len(got))
		}
	}
}

func points(s seriesPoints) int {
	n := 0
	for _, p := range s {
		n += len(p)
	}
	return n
}
