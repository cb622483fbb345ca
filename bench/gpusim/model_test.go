package gpusim

import (
	"math"
	"strconv"
	"testing"
	"time"

	promvalue "github.com/prometheus/prometheus/model/value"
)

// Two clusters from the same config agree at any instant, however they got
// there: one walks forward step by step, the other jumps straight to each
// probe time, and a third goes back in time (cache reset).
func TestDeterministic(t *testing.T) {
	cfg := Config{Nodes: 16, Seed: 42, FaultOrigin: t0, XidsPerGPUYear: 50, Faults: []Fault{
		{Kind: FaultTrainingStall, At: 20 * time.Minute, Duration: 10 * time.Minute, Node: "3"},
		{Kind: FaultThrottle, At: 30 * time.Minute, Duration: 5 * time.Minute, Node: "gpu-node-002", GPU: -1},
	}}
	walker, jumper, rewinder, pager := newTestCluster(t, cfg), newTestCluster(t, cfg), newTestCluster(t, cfg), newTestCluster(t, cfg)
	probes := map[int]bool{7: true, 80: true, 160: true, 239: true}
	rewinder.Step(t0.Add(48 * time.Hour))
	for i := 0; i < 240; i++ {
		at := t0.Add(time.Duration(i) * 15 * time.Second)
		walker.Step(at)
		if !probes[i] {
			continue
		}
		a := walker.AppendSamples(nil, at, Replica{})
		// Per-node pages step one node at a time; they must agree too.
		var paged []Series
		for n := range pager.nodes {
			if err := pager.StepNode(n, at); err != nil {
				t.Fatal(err)
			}
			paged = pager.AppendNodeSamples(paged, n, at, Replica{})
		}
		for k := range paged {
			if key(a[k].Labels) != key(paged[k].Labels) || !sameValue(a[k].V, paged[k].V) {
				t.Fatalf("step %d: per-node stepping differs:\n walker %s\n pager  %s", i, a[k].String(), paged[k].String())
			}
		}
		for name, other := range map[string]*Cluster{"jumper": jumper, "rewinder": rewinder} {
			b := other.AppendSamples(nil, at, Replica{})
			if len(a) != len(b) {
				t.Fatalf("step %d: %s has %d series, walker %d", i, name, len(b), len(a))
			}
			for k := range a {
				if key(a[k].Labels) != key(b[k].Labels) || !sameValue(a[k].V, b[k].V) || a[k].T != b[k].T {
					t.Fatalf("step %d: %s differs:\n walker %s\n %s %s", i, name, a[k].String(), name, b[k].String())
				}
			}
		}
	}
	other := newTestCluster(t, Config{Nodes: 16, Seed: 43, XidsPerGPUYear: 50})
	if key(walker.AppendSamples(nil, t0, Replica{})[0].Labels) == key(other.AppendSamples(nil, t0, Replica{})[0].Labels) {
		t.Errorf("a different seed gives the same GPU identities")
	}
}

// notMonotonic are families dcgm-exporter types counter whose values are
// not: DCGM computes NVLINK_BANDWIDTH_TOTAL as a throughput (MiB/s), and
// the Xid count is the number of events within a sliding window.
var notMonotonic = map[string]bool{"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": true, "DCGM_EXP_XID_ERRORS_COUNT": true}

// Counters (and histogram buckets, sums, counts) never decrease while jobs
// start and end and faults that change power come and go.
func TestCountersMonotonic(t *testing.T) {
	cfg := Config{Nodes: 16, Seed: 7, FaultOrigin: t0, XidsPerGPUYear: 200, Faults: []Fault{
		{Kind: FaultTrainingStall, At: time.Hour, Duration: 20 * time.Minute, Node: "0"},
		{Kind: FaultThrottle, At: 2 * time.Hour, Duration: 30 * time.Minute, Node: "9", GPU: 3},
		{Kind: FaultNodeDown, At: 3 * time.Hour, Duration: 15 * time.Minute, Node: "12"},
		{Kind: FaultECCDBE, At: 4 * time.Hour, Duration: 3 * time.Minute, Node: "5", GPU: 1},
		{Kind: FaultNVLinkCRCBurst, At: 5 * time.Hour, Duration: 2 * time.Minute, Node: "5", GPU: 2},
	}}
	c := newTestCluster(t, cfg)
	last := map[string]float64{}
	increased := map[string]bool{}
	keys := map[*Label]string{} // label slices are shared until a series is rebuilt
	churn := 0
	prevSeries := 0
	for i := 0; i <= 12*60*2; i++ { // 12 h at 30 s
		at := t0.Add(time.Duration(i) * 30 * time.Second)
		series := c.AppendSamples(nil, at, Replica{})
		if len(series) != prevSeries {
			churn++
			prevSeries = len(series)
		}
		for _, s := range series {
			name := s.Name()
			if s.Desc.Type == Gauge || notMonotonic[name] {
				continue
			}
			k, ok := keys[&s.Labels[0]]
			if !ok {
				k = key(s.Labels)
				keys[&s.Labels[0]] = k
			}
			if prev, ok := last[k]; ok {
				if s.V < prev {
					t.Fatalf("%s decreased at %s: %v -> %v", s.String(), at, prev, s.V)
				}
				if s.V > prev {
					increased[name] = true
				}
			}
			last[k] = s.V
		}
	}
	for _, name := range []string{
		"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP_NS",
		"DCGM_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN_NS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
		"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "node_cpu_seconds_total", "node_network_receive_bytes_total",
		"container_cpu_usage_seconds_total", "training_iteration_time_seconds_count", "training_iteration_time_seconds_bucket",
	} {
		if !increased[name] {
			t.Errorf("%s never increased in 12 h", name)
		}
	}
	if churn < 3 {
		t.Errorf("series count changed %d times in 12 h; jobs should churn", churn)
	}
}

// Energy integrates power: over an hour, the counter's increase divided by
// the elapsed time is the average of the power gauge.
func TestEnergyIntegratesPower(t *testing.T) {
	c := newTestCluster(t, Config{Nodes: 8, Seed: 11})
	const step = 5 * time.Second
	sumP := map[string]float64{}
	e0 := map[string]float64{}
	var n float64
	for at := t0; at.Before(t0.Add(time.Hour)); at = at.Add(step) {
		for _, s := range c.AppendSamples(nil, at, Replica{}) {
			switch s.Name() {
			case "DCGM_FI_DEV_POWER_USAGE":
				sumP[s.Get("UUID")] += s.V
			case "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION":
				if _, ok := e0[s.Get("UUID")]; !ok {
					e0[s.Get("UUID")] = s.V
				}
			}
		}
		n++
	}
	for _, s := range find(c.AppendSamples(nil, t0.Add(time.Hour), Replica{}), "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") {
		u := s.Get("UUID")
		avgFromEnergy := (s.V - e0[u]) / 1000 / 3600
		avgGauge := sumP[u] / n
		if math.Abs(avgFromEnergy-avgGauge) > 0.12*avgGauge {
			t.Errorf("GPU %s: energy says %.0f W average, power gauge %.0f W", u, avgFromEnergy, avgGauge)
		}
	}
}

// Temperature follows power through a lag: when a job starts, power jumps at
// once, temperature rises over tens of seconds.
func TestTemperatureLagsPower(t *testing.T) {
	c := newTestCluster(t, Config{Nodes: 32, Seed: 5})
	// Find a job start preceded by at least 15 idle minutes.
	var node int
	var start float64
	found := false
	for n := 0; n < len(c.nodes) && !found; n++ {
		g := &c.groups[n/groupSize]
		for k := g.window(c.secs(t0)); k < g.window(c.secs(t0.Add(48*time.Hour))) && !found; k++ {
			j := c.slotOf(n, k)
			prev := c.slotOf(n, k-1)
			if j.idle || !(prev.idle || j.start-prev.end > 900) {
				continue
			}
			node, start, found = n, j.start, true
		}
	}
	if !found {
		t.Fatal("no job start after an idle period in 48 h")
	}
	at := func(ds float64) time.Time {
		return c.cfg.Epoch.Add(time.Duration((start + ds) * float64(time.Second)))
	}
	host := c.nodes[node].hostname
	p := func(ds float64) float64 {
		return value(t, c, at(ds), "DCGM_FI_DEV_POWER_USAGE", "Hostname", host, "gpu", "0")
	}
	temp := func(ds float64) float64 {
		return value(t, c, at(ds), "DCGM_FI_DEV_GPU_TEMP", "Hostname", host, "gpu", "0")
	}
	pBefore, pAfter := p(-2), math.Max(p(3), p(4))
	tBefore, tSoon, tLater := temp(-2), temp(3), temp(6*tauTemp)
	if pAfter-pBefore < 150 {
		t.Fatalf("power did not jump at job start: %.0f -> %.0f W", pBefore, pAfter)
	}
	if tSoon-tBefore > 3 {
		t.Errorf("temperature jumped with power: %.0f -> %.0f °C within 3 s", tBefore, tSoon)
	}
	if tLater-tBefore < 10 {
		t.Errorf("temperature did not follow power: %.0f -> %.0f °C after %v s", tBefore, tLater, 6*tauTemp)
	}
	if tLater > 85 {
		t.Errorf("steady training temperature %.0f °C is implausibly high", tLater)
	}
}

// The HA pair: replica p1 has the same series, later timestamps, identical
// counters and integer gauges, and slightly different continuous gauges.
func TestReplicasAgreeOnCounters(t *testing.T) {
	c := newTestCluster(t, Config{Nodes: 8, Seed: 9})
	at := t0.Add(time.Hour)
	p0 := c.AppendSamples(nil, at, Replica{Name: "p0", Jitter: 0.001})
	p1 := c.AppendSamples(nil, at, Replica{Name: "p1", Offset: 300 * time.Millisecond, Jitter: 0.001})
	if len(p0) != len(p1) {
		t.Fatalf("replicas see %d and %d series", len(p0), len(p1))
	}
	differ := 0
	for i := range p0 {
		a, b := p0[i], p1[i]
		if b.T-a.T != 300 {
			t.Fatalf("timestamp offset %d ms, want 300", b.T-a.T)
		}
		if !a.Desc.Jitter {
			if !sameValue(a.V, b.V) {
				t.Errorf("%s: replicas disagree on a non-jittered value: %v vs %v", a.Name(), a.V, b.V)
			}
			continue
		}
		if a.V != b.V {
			differ++
		}
		if math.Abs(a.V-b.V) > 0.0021*math.Abs(a.V) {
			t.Errorf("%s: jitter too large: %v vs %v", a.Name(), a.V, b.V)
		}
	}
	if differ == 0 {
		t.Error("no continuous gauge differs between replicas")
	}
}

// The iteration histogram is a valid classic histogram: cumulative buckets,
// +Inf equal to the count, sum consistent with the job's step time.
func TestIterationHistogram(t *testing.T) {
	c := newTestCluster(t, Config{Nodes: 16, Seed: 21})
	at := t0.Add(3 * time.Hour)
	series := c.AppendSamples(nil, at, Replica{})
	counts := find(series, "training_iteration_time_seconds_count")
	if len(counts) == 0 {
		t.Fatal("no training ranks at t0+3h")
	}
	for _, cnt := range counts {
		job, rank := cnt.Get("job_name"), cnt.Get("rank")
		prev := -1.0
		for _, le := range leValues {
			b := find(series, "training_iteration_time_seconds_bucket", "job_name", job, "rank", rank, "le", le)
			if len(b) != 1 {
				t.Fatalf("%s rank %s: %d buckets le=%s", job, rank, len(b), le)
			}
			if b[0].V < prev {
				t.Errorf("%s rank %s: bucket le=%s %v below previous %v", job, rank, le, b[0].V, prev)
			}
			prev = b[0].V
		}
		if prev != cnt.V {
			t.Errorf("%s rank %s: +Inf bucket %v != count %v", job, rank, prev, cnt.V)
		}
		sum := find(series, "training_iteration_time_seconds_sum", "job_name", job, "rank", rank)[0].V
		if cnt.V > 0 {
			mean := sum / cnt.V
			if mean < 0.1 || mean > 10 {
				t.Errorf("%s: mean step %v s out of the bucket range", job, mean)
			}
		}
		if r, err := strconv.Atoi(rank); err != nil || r < 0 {
			t.Errorf("bad rank %q", rank)
		}
	}
}

// Jobs start and end: the pod labels on a GPU change across a day, and
// kube_job_status_active counts a job's pods.
func TestJobChurn(t *testing.T) {
	c := newTestCluster(t, Config{Nodes: 8, Seed: 4})
	pods := map[string]bool{}
	jobs := map[string]bool{}
	for at := t0; at.Before(t0.Add(24 * time.Hour)); at = at.Add(10 * time.Minute) {
		series := c.AppendSamples(nil, at, Replica{})
		for _, s := range find(series, "DCGM_FI_DEV_GPU_UTIL", "Hostname", "gpu-node-001", "gpu", "0") {
			pods[s.Get("pod")] = true
		}
		for _, s := range find(series, "kube_job_status_active") {
			jobs[s.Get("job_name")] = true
			if s.V != 0 && s.V != 1 && s.V != 2 && s.V != 4 && s.V != 8 {
				t.Errorf("job %s active %v: not a job size", s.Get("job_name"), s.V)
			}
		}
	}
	if len(pods) < 4 || !pods[""] {
		t.Errorf("GPU 0 of gpu-node-001 saw pods %v in a day; want several jobs and idle gaps", sortedNames(pods))
	}
	if len(jobs) < 5 {
		t.Errorf("only %d jobs in a day on 8 nodes", len(jobs))
	}
}

// Between job changes a step allocates nothing: values are written into the
// existing series in place.
func TestStepSteadyStateAllocs(t *testing.T) {
	c := newTestCluster(t, Config{Nodes: 8, Seed: 3, TargetLabels: true})
	at := t0.Add(3 * time.Hour)
	c.Step(at)
	// Only count steps whose label sets do not change.
	if c.SeriesCount() == 0 {
		t.Fatal("no series")
	}
	allocs := testing.AllocsPerRun(30, func() {
		at = at.Add(time.Second)
		c.Step(at)
	})
	if allocs > 0 {
		t.Errorf("Step allocates %v times in steady state", allocs)
	}
}

// Staleness markers, as the Prometheus the simulator plays would write
// them: when a job ends on a node, each of its GPUs' pod-labelled series
// gets one StaleNaN sample at the step it vanished, and only then; a node
// that goes down marks all its series.
func TestStaleMarkers(t *testing.T) {
	fc := newFaultCase(t, Fault{Kind: FaultECCDBE, GPU: 0})
	c := fc.faulty
	ji := c.jobInfo(&fc.job)
	marked := func(at time.Time) []Series {
		c.AppendSamples(nil, at, Replica{})
		return c.AppendStaleMarkers(nil, at, Replica{})
	}
	end := fc.start.Add(jobCrashDelay * time.Second)
	if got := marked(end.Add(-time.Second)); len(got) != 0 {
		t.Errorf("%d staleness markers while nothing vanished", len(got))
	}
	got := marked(end)
	pods := 0
	for _, s := range got {
		if !promvalue.IsStaleNaN(s.V) || s.T != end.UnixMilli() {
			t.Fatalf("marker %s is not a StaleNaN at the step", s.String())
		}
		if s.Name() == "DCGM_FI_DEV_GPU_TEMP" && s.Get("pod") == ji.pods[fc.node-fc.job.firstNode] {
			pods++
		}
	}
	if pods != 8 {
		t.Errorf("%d GPU temperature series of the ended job's pod marked stale, want 8 (markers %d)", pods, len(got))
	}
	// Every marked series is absent from the step's samples.
	live := map[string]bool{}
	for _, s := range c.AppendSamples(nil, end, Replica{}) {
		live[key(s.Labels)] = true
	}
	for _, s := range got {
		if live[key(s.Labels)] {
			t.Errorf("%s marked stale but still exported", s.String())
		}
	}
	// Both replicas of the pair see the markers of the step.
	if again := c.AppendStaleMarkers(nil, end, Replica{Name: "p1", Offset: 300 * time.Millisecond}); len(again) != len(got) || again[0].T != end.UnixMilli()+300 {
		t.Errorf("second replica got %d markers, want %d at +300ms", len(again), len(got))
	}
	if got := marked(end.Add(15 * time.Second)); len(got) != 0 {
		t.Errorf("%d markers a step later, want none", len(got))
	}
}
