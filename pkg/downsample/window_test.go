package downsample

import (
	"math"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/value"
	"github.com/prometheus/prometheus/promql/parser"
)

func TestWindowEnd(t *testing.T) {
	for _, c := range []struct{ t, want int64 }{
		{1, Res5m}, {Res5m, Res5m}, {Res5m + 1, 2 * Res5m}, {0, 0}, {-1, 0}, {-Res5m, -Res5m}, {-Res5m + 1, 0},
	} {
		if got := windowEnd(c.t, Res5m); got != c.want {
			t.Errorf("windowEnd(%d) = %d, want %d", c.t, got, c.want)
		}
	}
}

type pt struct {
	t int64
	v float64
}

func collectCounter(res int64, in []pt) []pt {
	var out []pt
	c := &counterSelector{res: res, emit: func(s *sample) { out = append(out, pt{s.t, s.f}) }}
	for _, p := range in {
		c.add(sample{t: p.t, f: p.v})
	}
	c.finish()
	return out
}

func samePts(a, b []pt) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].t != b[i].t || !(a[i].v == b[i].v || math.IsNaN(a[i].v) && math.IsNaN(b[i].v)) {
			return false
		}
	}
	return true
}

func TestCounterSelectorKeepsEdgesResetsAndNaN(t *testing.T) {
	const r = 100
	stale := math.Float64frombits(value.StaleNaN)
	in := []pt{
		{10, 1}, {20, 2}, {30, 3}, {100, 4}, // window (0,100]: first 10, last 100 (t=100 is in it)
		{110, 5}, {120, 1}, {130, 2}, {140, 3}, // reset 5→1 at 120 inside (100,200]
		{150, math.NaN()}, {160, 4}, {170, 5}, // NaN and its neighbours
		{180, stale}, {190, 6}, {200, 7}, // stale marker keeps the pending point
		{210, 8}, {250, 9}, {300, 10},
	}
	want := []pt{
		{10, 1}, {100, 4},
		{110, 5}, {120, 1}, {140, 3}, {150, math.NaN()}, {160, 4}, {170, 5}, {180, stale}, {200, 7},
		{210, 8}, {300, 10},
	}
	if got := collectCounter(r, in); !samePts(got, want) {
		t.Fatalf("kept\n%v\nwant\n%v", got, want)
	}
}

func TestReducerAggregatesAndStaleness(t *testing.T) {
	stale := math.Float64frombits(value.StaleNaN)
	in := []pt{{10, 3}, {50, math.NaN()}, {100, 1}, {110, 4}, {150, 6}, {160, stale}, {250, math.NaN()}}
	run := func(field func(aggr) float64) []pt {
		var out []pt
		r := &reducer{res: 100,
			emit:      func(t int64, a aggr) { out = append(out, pt{t, field(a)}) },
			emitStale: func(t int64) { out = append(out, pt{t, stale}) }}
		for _, p := range in {
			if value.IsStaleNaN(p.v) {
				r.addStale(p.t)
			} else {
				r.add(p.t, rawAggr(p.v))
			}
		}
		r.flush()
		return out
	}
	nan := math.NaN()
	for name, c := range map[string]struct {
		field func(aggr) float64
		want  []pt
	}{
		// Window (0,100] at 99; (100,200] ends stale: aggregate at the last
		// real sample 150-1, marker at 160-1; (200,300] holds only NaN.
		"count": {func(a aggr) float64 { return a.count }, []pt{{99, 3}, {149, 2}, {159, stale}, {299, 1}}},
		"sum":   {func(a aggr) float64 { return a.sum }, []pt{{99, nan}, {149, 10}, {159, stale}, {299, nan}}},
		"min":   {func(a aggr) float64 { return a.min }, []pt{{99, 1}, {149, 4}, {159, stale}, {299, nan}}},
		"max":   {func(a aggr) float64 { return a.max }, []pt{{99, 3}, {149, 6}, {159, stale}, {299, nan}}},
	} {
		got := run(c.field)
		// StaleNaN is a NaN: compare markers by bits.
		for i := range got {
			if i < len(c.want) && value.IsStaleNaN(c.want[i].v) != value.IsStaleNaN(got[i].v) {
				t.Errorf("%s: point %d staleness differs: %v", name, i, got)
			}
		}
		if !samePts(got, c.want) {
			t.Errorf("%s: got %v, want %v", name, got, c.want)
		}
	}
}

func TestClassify(t *testing.T) {
	meta := map[string]model.MetricType{
		"training_iteration_time_seconds": model.MetricTypeHistogram,
		"rpc_latency":                     model.MetricTypeSummary,
		"weird_total":                     model.MetricTypeGauge,
		"my_counter":                      model.MetricTypeCounter,
		"DCGM_FI_DEV_PCIE_TX_THROUGHPUT":  model.MetricTypeCounter,
	}
	lookup := func(f string) (model.MetricType, bool) { m, ok := meta[f]; return m, ok }
	for _, c := range []struct {
		name     string
		quantile bool
		want     Kind
	}{
		{"DCGM_FI_DEV_GPU_UTIL", false, Gauge},
		{"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", false, Counter},
		{"DCGM_FI_DEV_PCIE_REPLAY_COUNTER", false, Counter},
		{"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", false, Gauge}, // typed counter, valued in MiB/s
		{"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", false, Counter},
		{"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", false, Counter},
		{"DCGM_FI_DEV_FB_TOTAL", false, Gauge},
		{"DCGM_FI_DEV_XID_ERRORS", false, Gauge},
		// dcgm-exporter's counters.csv types the throttling durations as
		// counters; DCGM's clock-event fields (_NS) are the same kind.
		{"DCGM_FI_DEV_POWER_VIOLATION", false, Counter},
		{"DCGM_FI_DEV_THERMAL_VIOLATION", false, Counter},
		{"DCGM_FI_DEV_SYNC_BOOST_VIOLATION", false, Counter},
		{"DCGM_FI_DEV_BOARD_LIMIT_VIOLATION", false, Counter},
		{"DCGM_FI_DEV_LOW_UTIL_VIOLATION", false, Counter},
		{"DCGM_FI_DEV_RELIABILITY_VIOLATION", false, Counter},
		{"DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP_NS", false, Counter},
		{"DCGM_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST_NS", false, Counter},
		{"DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN_NS", false, Counter},
		{"DCGM_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN_NS", false, Counter},
		{"DCGM_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN_NS", false, Counter},
		{"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", false, Gauge}, // a bitmask
		// Metadata decides where it exists, whatever the name says.
		{"DCGM_FI_DEV_PCIE_TX_THROUGHPUT", false, Counter},
		{"node_cpu_seconds_total", false, Counter},
		{"training_iteration_time_seconds_bucket", false, Counter},
		{"training_iteration_time_seconds_sum", false, Counter},
		{"rpc_latency", true, Gauge},
		{"rpc_latency_count", false, Counter},
		{"weird_total", false, Gauge}, // metadata beats the name
		{"my_counter", false, Counter},
		{"anything_count", false, Counter},
	} {
		if got := Classify(c.name, c.quantile, lookup); got != c.want {
			t.Errorf("Classify(%s) = %v, want %v", c.name, got, c.want)
		}
	}
	gauge := func(string) (model.MetricType, bool) { return model.MetricTypeGauge, true }
	if Classify("DCGM_FI_DEV_POWER_VIOLATION", false, gauge) != Gauge {
		t.Error("a DCGM counter field sent with metadata type gauge is not a gauge")
	}
	// dcgm-exporter's CSV types the NVLink bandwidth as a counter; its
	// values are MiB/s, so it is a gauge whatever its metadata says.
	counter := func(string) (model.MetricType, bool) { return model.MetricTypeCounter, true }
	if Classify("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", false, counter) != Gauge {
		t.Error("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL sent with metadata type counter is not a gauge")
	}
}

func TestRewrite(t *testing.T) {
	for in, want := range map[string]string{
		`count_over_time(up{job="a"}[1h])`:              `sum_over_time(up{__gpustore_aggr__="count",job="a"}[1h])`,
		`avg(avg_over_time(x[5m] offset 1h))`:           `avg((sum_over_time(x{__gpustore_aggr__="sum"}[5m] offset 1h) / sum_over_time(x{__gpustore_aggr__="count"}[5m] offset 1h)))`,
		`count_over_time(x[1h:5m])`:                     `count_over_time(x[1h:5m])`,
		`max_over_time(x[1h]) > count_over_time(y[1h])`: `max_over_time(x[1h]) > sum_over_time(y{__gpustore_aggr__="count"}[1h])`,
	} {
		got, _, err := rewriteQuery(in)
		if err != nil {
			t.Fatal(err)
		}
		// Compare canonical forms.
		we, err := parser.NewParser(parser.Options{}).ParseExpr(want)
		if err != nil {
			t.Fatal(err)
		}
		if got != we.String() {
			t.Errorf("rewriteQuery(%s) = %s, want %s", in, got, we.String())
		}
	}
}
