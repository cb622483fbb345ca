package gpusim

import (
	"math"
	"strings"
	"testing"
	"time"
)

// hasDCGMLabels fails unless s carries every label dcgm-exporter 4.8.2 puts
// on a GPU series.
func hasDCGMLabels(t *testing.T, s Series) {
	t.Helper()
	for _, l := range DCGMLabelNames {
		if s.Get(l) == "" {
			t.Errorf("%s lacks label %s", s.String(), l)
		}
	}
}

// An overheat with a target below the GPU's maximum operating temperature
// (86 °C on an H100 whose limit is 87 °C): the die settles at 86 °C, above
// GPUTemperatureHigh's 85 °C for minutes, and the driver never engages its
// SW thermal slowdown (no 0x20 bit, no SW thermal time).
func TestFaultOverheatTarget(t *testing.T) {
	fc := newFaultCase(t, Fault{Kind: FaultOverheat, GPU: 2, Value: 86})
	_, nsBefore := fc.both(t, fc.start.Add(-time.Second), "DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN_NS", "gpu", "2")
	hot, last := 0, 0.0
	for at := fc.start; at.Before(fc.end); at = at.Add(15 * time.Second) {
		s := fc.gpuSeries(at, "DCGM_FI_DEV_GPU_TEMP", "2")
		if len(s) != 1 {
			t.Fatalf("at %s: %d temperature series", at.Sub(t0), len(s))
		}
		hasDCGMLabels(t, s[0])
		if s[0].V > 86 {
			t.Errorf("at %s: %v °C, above the fault's 86 °C target", at.Sub(t0), s[0].V)
		}
		if s[0].V > 85 {
			hot++
		}
		last = s[0].V
		if r := int(fc.gpuSeries(at, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "2")[0].V); r&ThrottleSWThermal != 0 {
			t.Errorf("at %s: SW thermal slowdown (%#x) below the maximum operating temperature", at.Sub(t0), r)
		}
	}
	// τ = 50 s: from ~70 °C the die passes 85.5 °C about 3.5 minutes in
	// and stays there.
	if hot < 6 || last != 86 {
		t.Errorf("above 85 °C in %d scrapes of 15 s (want 6 of the last 1.5 minutes), last %v °C (want 86)", hot, last)
	}
	_, nsAfter := fc.both(t, fc.end.Add(10*time.Minute), "DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN_NS", "gpu", "2")
	if nsAfter != nsBefore {
		t.Errorf("SW thermal slowdown time grew by %v ns at 86 °C", nsAfter-nsBefore)
	}
	if c, f := fc.both(t, fc.end.Add(-time.Second), "DCGM_FI_DEV_GPU_TEMP", "gpu", "3"); c != f {
		t.Errorf("overheat leaked to GPU 3: %v vs %v", f, c)
	}
}

// A P-state change: the HW-slowdown bit (0x8) in one scrape of 15 s, and
// nothing else: clocks, the other bits and the time counters as without it.
func TestFaultPStateChange(t *testing.T) {
	fc := newFaultCase(t, Fault{Kind: FaultPStateChange, GPU: 1, Duration: defaultDuration(FaultPStateChange)})
	const reasons = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
	seen := 0
	for at := fc.start.Add(-time.Minute); at.Before(fc.end.Add(time.Minute)); at = at.Add(15 * time.Second) {
		c, f := fc.both(t, at, reasons, "gpu", "1")
		if int(f)&ThrottleHWSlowdown != 0 {
			seen++
		}
		if int(f)&^ThrottleHWSlowdown != int(c)&^ThrottleHWSlowdown {
			t.Errorf("at %s: reasons %#x vs clean %#x beyond the 0x8 bit", at.Sub(t0), int(f), int(c))
		}
		if c, f := fc.both(t, at, "DCGM_FI_DEV_SM_CLOCK", "gpu", "1"); c != f {
			t.Errorf("at %s: SM clock %v vs clean %v", at.Sub(t0), f, c)
		}
	}
	if seen != 1 {
		t.Errorf("HW slowdown in %d scrapes of 15 s, want 1", seen)
	}
	hasDCGMLabels(t, fc.gpuSeries(fc.start, reasons, "1")[0])
	for _, n := range []string{"DCGM_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN_NS", "DCGM_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN_NS"} {
		if c, f := fc.both(t, fc.end.Add(time.Minute), n, "gpu", "1"); c != f {
			t.Errorf("%s: %v vs clean %v", n, f, c)
		}
	}
	if _, f := fc.both(t, fc.start, reasons, "gpu", "2"); int(f)&ThrottleHWSlowdown != 0 {
		t.Errorf("P-state change leaked to GPU 2: %#x", int(f))
	}
}

// An SBE storm: DCGM_FI_DEV_ECC_SBE_VOL_TOTAL grows by `value` a minute
// while it lasts (12 a minute: 60 in its 5 minutes), then stays.
func TestFaultSBEStorm(t *testing.T) {
	fc := newFaultCase(t, Fault{Kind: FaultSBEStorm, GPU: 3, Value: 12})
	const sbe = "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"
	grew := func(at time.Time) float64 {
		c0, f0 := fc.both(t, fc.start.Add(-time.Second), sbe, "gpu", "3")
		c, f := fc.both(t, at, sbe, "gpu", "3")
		return (f - f0) - (c - c0)
	}
	for _, tc := range []struct {
		after time.Duration
		want  float64
	}{{0, 1}, {time.Minute, 13}, {faultDur - time.Second, 60}, {faultDur + time.Hour, 60}} {
		if got := grew(fc.start.Add(tc.after)); got != tc.want {
			t.Errorf("%s into the storm: %v more corrected errors than without it, want %v", tc.after, got, tc.want)
		}
	}
	s := fc.gpuSeries(fc.end, sbe, "3")
	if len(s) != 1 {
		t.Fatalf("%d %s series", len(s), sbe)
	}
	hasDCGMLabels(t, s[0])
	if c, f := fc.both(t, fc.end, sbe, "gpu", "2"); c != f {
		t.Errorf("SBE storm leaked to GPU 2: %v vs %v", f, c)
	}
	// The default rate: 2 a minute.
	d := newFaultCase(t, Fault{Kind: FaultSBEStorm, GPU: 3})
	c0, f0 := d.both(t, d.start.Add(-time.Second), sbe, "gpu", "3")
	c, f := d.both(t, d.end, sbe, "gpu", "3")
	if got := (f - f0) - (c - c0); math.Abs(got-2*faultDur.Minutes()) > 0 {
		t.Errorf("default storm: %v errors in %s, want %v", got, faultDur, 2*faultDur.Minutes())
	}
}

// Value is refused where it means nothing or is out of range, and parsed
// where it applies.
func TestFaultValue(t *testing.T) {
	for _, bad := range []string{"kind=xid,code=13,node=1,value=3", "kind=overheat,node=1,value=-1", "kind=overheat,node=1,value=300", "kind=sbe_storm,node=1,value=x"} {
		if _, err := ParseFaultSpec(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	f, err := ParseFaultSpec("kind=overheat,node=1,gpu=0,value=86")
	if err != nil || f.Value != 86 {
		t.Errorf("overheat value: %+v %v", f, err)
	}
	fs, err := ParseFaultsYAML([]byte("faults:\n  - {kind: sbe_storm, node: 2, gpu: 1, value: 5}\n  - {kind: pstate_change, node: 2, gpu: 1}\n"))
	if err != nil || len(fs) != 2 || fs[0].Value != 5 || fs[1].Duration != 15*time.Second {
		t.Errorf("yaml: %+v %v", fs, err)
	}
}

// trainingValue returns the training series named name of the rank on GPU gpu of the
// fault's node, failing unless there is exactly one.
func (fc *faultCase) trainingValue(t *testing.T, c *Cluster, at time.Time, name, gpu string) Series {
	t.Helper()
	s := find(c.AppendSamples(nil, at, Replica{}), name, "Hostname", fc.host, "rank", rankOf(fc, gpu))
	if len(s) != 1 {
		t.Fatalf("%s of rank on GPU %s at %s: %d series", name, gpu, at.Sub(t0), len(s))
	}
	return s[0]
}

func rankOf(fc *faultCase, gpu string) string {
	var g int
	for _, r := range gpu {
		g = g*10 + int(r-'0')
	}
	return itoa((fc.node-fc.job.firstNode)*8 + g)
}

// A straggler: the rank on GPU 2 computes slower while the fault lasts, so
// the job's steps take 1.5 times as long on every rank (each rank times the
// same synchronous step: its _sum grows 1.5 times as fast as without the
// fault, the same as its neighbour's), and the straggler's GPU is busy while
// the others wait: its tensor activity over the fault is well above its
// neighbour's. _count is the job's.
func TestFaultStraggler(t *testing.T) {
	fc := newFaultCase(t, Fault{Kind: FaultStraggler, GPU: 2})
	const sum, count = "training_iteration_time_seconds_sum", "training_iteration_time_seconds_count"
	before := fc.start.Add(-time.Second)
	if c, f := fc.trainingValue(t, fc.clean, before, sum, "2"), fc.trainingValue(t, fc.faulty, before, sum, "2"); c.V != f.V {
		t.Errorf("before: _sum %v vs clean %v", f.V, c.V)
	}
	grow := func(c *Cluster, gpu string) float64 {
		return fc.trainingValue(t, c, fc.end, sum, gpu).V - fc.trainingValue(t, c, before, sum, gpu).V
	}
	slow, peer, clean := grow(fc.faulty, "2"), grow(fc.faulty, "3"), grow(fc.clean, "3")
	if math.Abs(slow/peer-1) > 0.01 || math.Abs(peer/clean-1.5) > 0.01 {
		t.Errorf("during: _sum grew %v on the straggler's rank, %v on its neighbour's, %v without the fault: want the same on both, 1.5 times", slow, peer, clean)
	}
	for _, gpu := range []string{"2", "3"} {
		if c, f := fc.trainingValue(t, fc.clean, fc.end, count, gpu), fc.trainingValue(t, fc.faulty, fc.end, count, gpu); c.V != f.V {
			t.Errorf("rank on GPU %s: _count %v vs clean %v", gpu, f.V, c.V)
		}
	}
	// Tensor activity averaged over the fault, every 15 s.
	tensor := func(gpu string) float64 {
		total, n := 0.0, 0
		for at := fc.start; at.Before(fc.end); at = at.Add(15 * time.Second) {
			_, v := fc.both(t, at, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gpu", gpu)
			total, n = total+v, n+1
		}
		return total / float64(n)
	}
	if st, nb := tensor("2"), tensor("3"); st < 1.2*nb || st-nb < 0.05 {
		t.Errorf("tensor activity over the fault: straggler %.3f, neighbour %.3f; want the straggler's well above", st, nb)
	}
}

// A slow start: a job starting on the node while the fault lasts exports
// its iteration count at 0 until the fault ends, then trains.
func TestFaultTrainingSlowStart(t *testing.T) {
	base := Config{Nodes: 16, Seed: 13, FaultOrigin: t0}
	clean := newTestCluster(t, base)
	// A node whose job starts between t0+5m and t0+24h and runs 30 minutes.
	node, start := -1, 0.0
	for n := range clean.nodes {
		g := &clean.groups[n/groupSize]
		for k := g.window(clean.secs(t0)); k <= g.window(clean.secs(t0.Add(24*time.Hour))); k++ {
			j := clean.slotOf(n, k)
			if !j.idle && j.start >= clean.secs(t0.Add(5*time.Minute)) && j.start < clean.secs(t0.Add(24*time.Hour)) && j.end > j.start+1800 {
				node, start = n, j.start
				break
			}
		}
		if node >= 0 {
			break
		}
	}
	if node < 0 {
		t.Fatal("no job starts within the day")
	}
	at := time.Duration(start-clean.secs(t0))*time.Second - time.Minute
	base.Faults = []Fault{{Kind: FaultTrainingSlowStart, At: at, Duration: 21 * time.Minute, Node: itoa(node)}}
	c := newTestCluster(t, base)
	host := clean.nodes[node].hostname
	jobStart := t0.Add(at + time.Minute)
	count := func(at time.Time) []Series {
		return find(c.AppendSamples(nil, at, Replica{}), "training_iteration_time_seconds_count", "Hostname", host)
	}
	for _, d := range []time.Duration{time.Second, 10 * time.Minute, 20*time.Minute - time.Second} {
		got := count(jobStart.Add(d))
		if len(got) == 0 {
			t.Fatalf("%s after the job's start: no iteration count", d)
		}
		for _, s := range got {
			if s.V != 0 {
				t.Errorf("%s after the job's start: rank %s at %v iterations, want 0 while loading", d, s.Get("rank"), s.V)
			}
		}
	}
	got := count(jobStart.Add(25 * time.Minute))
	if len(got) == 0 || got[0].V == 0 {
		t.Errorf("5 minutes after loading: %v, want iterations", got)
	}
	// Loading, the GPUs sit idle (only a hung collective spins at 100 %).
	if u := find(c.AppendSamples(nil, jobStart.Add(10*time.Minute), Replica{}), "DCGM_FI_DEV_GPU_UTIL", "Hostname", host, "gpu", "0"); len(u) != 1 || u[0].V != 0 || u[0].Get("pod") == "" {
		t.Errorf("GPU 0 while its job loads: %v, want 0 %% with the pod's allocation", u)
	}
	// A job already running when the fault starts is not held.
	fc := newFaultCase(t, Fault{Kind: FaultTrainingSlowStart})
	if c, f := fc.both(t, fc.end, "DCGM_FI_DEV_GPU_UTIL", "gpu", "0"); c != f {
		t.Errorf("running job: GPU util %v vs clean %v", f, c)
	}
}

// PCIe replays at 20 a minute: DCGM_FI_DEV_PCIE_REPLAY_COUNTER grows by 20
// a minute more than without the fault, on its GPU only.
func TestFaultPCIeReplays(t *testing.T) {
	fc := newFaultCase(t, Fault{Kind: FaultPCIeReplays, GPU: 4})
	const name = "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"
	c0, f0 := fc.both(t, fc.start.Add(-time.Second), name, "gpu", "4")
	if c0 != f0 {
		t.Errorf("before: %v vs clean %v", f0, c0)
	}
	for _, tc := range []struct {
		after time.Duration
		want  float64
	}{{0, 1}, {time.Minute, 21}, {faultDur + time.Hour, 100}} {
		c, f := fc.both(t, fc.start.Add(tc.after), name, "gpu", "4")
		if got := (f - f0) - (c - c0); got != tc.want {
			t.Errorf("%s in: %v more replays than without the fault, want %v", tc.after, got, tc.want)
		}
	}
	hasDCGMLabels(t, fc.gpuSeries(fc.end, name, "4")[0])
	if c, f := fc.both(t, fc.end, name, "gpu", "5"); c != f {
		t.Errorf("replays leaked to GPU 5: %v vs %v", f, c)
	}
}

// An A100 cluster: dcgm-exporter's modelName for an A100 SXM4 80GB, the
// NVLink3 CRC/replay/recovery counters (no NVLink5 fields), 400 W TDP.
func TestModelA100(t *testing.T) {
	c := newTestCluster(t, Config{Nodes: 2, Seed: 5, GPUModel: ModelA100})
	got := c.AppendSamples(nil, t0, Replica{})
	temps := find(got, "DCGM_FI_DEV_GPU_TEMP")
	if len(temps) != 16 {
		t.Fatalf("%d GPU temperatures, want 16", len(temps))
	}
	for _, s := range temps {
		hasDCGMLabels(t, s)
		if s.Get("modelName") != "NVIDIA A100-SXM4-80GB" {
			t.Errorf("modelName %q", s.Get("modelName"))
		}
	}
	if len(find(got, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL")) != 16 || len(find(got, "DCGM_FI_DEV_NVLINK_COUNT_RX_SYMBOL_ERRORS")) != 0 {
		t.Error("an A100 exports the NVLink CRC counters and no NVLink5 fields")
	}
	for _, s := range find(got, "DCGM_FI_DEV_POWER_USAGE") {
		if s.V > 400 {
			t.Errorf("A100 at %v W, above its 400 W TDP", s.V)
		}
	}
}

// NVLink5 symbol errors on a B200: DCGM_FI_DEV_NVLINK_COUNT_RX_SYMBOL_ERRORS
// grows by 6 a minute and no other NVLink5 field moves; an H100 refuses it.
func TestFaultNVLink5SymbolErrors(t *testing.T) {
	base := Config{Nodes: 2, Seed: 13, FaultOrigin: t0, GPUModel: ModelB200}
	clean := newTestCluster(t, base)
	base.Faults = []Fault{{Kind: FaultNVLink5SymbolErrors, At: faultAt, Duration: faultDur, Node: "1", GPU: 3}}
	c := newTestCluster(t, base)
	host := c.Hostnames()[1]
	start, end := t0.Add(faultAt), t0.Add(faultAt+faultDur)
	for _, d := range c.DCGMFamilies() {
		if !strings.HasPrefix(d.Name, "DCGM_FI_DEV_NVLINK") {
			continue
		}
		for _, at := range []time.Time{start.Add(-time.Second), start.Add(time.Minute), end.Add(time.Hour)} {
			cv, fv := value(t, clean, at, d.Name, "Hostname", host, "gpu", "3"), value(t, c, at, d.Name, "Hostname", host, "gpu", "3")
			want := 0.0
			if d.Name == "DCGM_FI_DEV_NVLINK_COUNT_RX_SYMBOL_ERRORS" && !at.Before(start) {
				want = min(float64(1+6*int(at.Sub(start).Minutes())), 6*faultDur.Minutes())
			}
			if d.Name == "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL" {
				continue // traffic, not errors
			}
			if fv-cv != want {
				t.Errorf("%s at %s: %v more than without the fault, want %v", d.Name, at.Sub(t0), fv-cv, want)
			}
		}
	}
	hasDCGMLabels(t, find(c.AppendSamples(nil, end, Replica{}), "DCGM_FI_DEV_NVLINK_COUNT_RX_SYMBOL_ERRORS", "Hostname", host, "gpu", "3")[0])
	if _, err := New(Config{Nodes: 2, Faults: []Fault{{Kind: FaultNVLink5SymbolErrors, Node: "1", GPU: 3}}}); err == nil || !strings.Contains(err.Error(), "NVLink5") {
		t.Errorf("nvlink5_symbol_errors on an H100: %v, want an error", err)
	}
}

// An idle allocation: the job's pod keeps GPU 3 (its pod, namespace and
// container labels, as dcgm-exporter 4.8.2 maps them from the kubelet's
// pod-resources API) while nothing runs on it: utilisation 0, no memory
// in use, power at the GPU's idle level, and its energy counter grows at
// that power. The node's other GPUs and the job's training series are as
// without the fault, and GPU 3 is itself again after it.
func TestFaultIdleAllocation(t *testing.T) {
	fc := newFaultCase(t, Fault{Kind: FaultIdleAllocation, GPU: 3})
	gp := &fc.faulty.nodes[fc.node].gpus[3]
	for at := fc.start; at.Before(fc.end); at = at.Add(15 * time.Second) {
		s := fc.gpuSeries(at, "DCGM_FI_DEV_GPU_UTIL", "3")
		if len(s) != 1 {
			t.Fatalf("at %s: %d utilisation series of GPU 3", at.Sub(t0), len(s))
		}
		hasDCGMLabels(t, s[0])
		clean := nodeSeries(fc.clean, fc.node, at, "DCGM_FI_DEV_GPU_UTIL", "gpu", "3")[0]
		for _, l := range []string{"pod", "namespace", "container"} {
			if s[0].Get(l) == "" || s[0].Get(l) != clean.Get(l) {
				t.Errorf("at %s: %s=%q, want the allocation's %q", at.Sub(t0), l, s[0].Get(l), clean.Get(l))
			}
		}
		if s[0].V != 0 {
			t.Errorf("at %s: utilisation %v%% of an unused GPU, want 0", at.Sub(t0), s[0].V)
		}
		if fb := fc.gpuSeries(at, "DCGM_FI_DEV_FB_USED", "3")[0].V; fb != 0 {
			t.Errorf("at %s: %v MiB in use on an unused GPU", at.Sub(t0), fb)
		}
		if p := fc.gpuSeries(at, "DCGM_FI_DEV_POWER_USAGE", "3")[0].V; math.Abs(p-gp.pIdle) > 0.05*gp.pIdle {
			t.Errorf("at %s: %v W, want the idle %v W", at.Sub(t0), p, gp.pIdle)
		}
		if c, f := fc.both(t, at, "DCGM_FI_DEV_GPU_UTIL", "gpu", "2"); c != f {
			t.Errorf("at %s: GPU 2 utilisation %v vs clean %v", at.Sub(t0), f, c)
		}
		if c, f := fc.trainingValue(t, fc.clean, at, "training_iteration_time_seconds_count", "3"), fc.trainingValue(t, fc.faulty, at, "training_iteration_time_seconds_count", "3"); c.V != f.V {
			t.Errorf("at %s: the job's steps %v vs clean %v", at.Sub(t0), f.V, c.V)
		}
	}
	// Energy: the fault's 5 minutes at idle power (mJ), within a rounding.
	e0 := fc.gpuSeries(fc.start, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "3")[0].V
	e1 := fc.gpuSeries(fc.end, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "3")[0].V
	if want := 1000 * gp.pIdle * faultDur.Seconds(); math.Abs(e1-e0-want) > 0.01*want {
		t.Errorf("energy during the fault %v mJ, want %v (idle power)", e1-e0, want)
	}
	after := fc.end.Add(time.Minute)
	if c, f := fc.both(t, after, "DCGM_FI_DEV_GPU_UTIL", "gpu", "3"); c != f || f < 50 {
		t.Errorf("after: utilisation %v vs clean %v", f, c)
	}
}

// An unused GPU never reaches its power cap: on a GPU whose job runs at its
// cap, the SW power-cap time stands still while an idle_allocation holds it,
// and goes on after it, as the clock-event bitmask (idle, no cap bit) says.
func TestFaultIdleAllocationPowerCapTime(t *testing.T) {
	base := Config{Nodes: 16, Seed: 13, FaultOrigin: t0}
	clean := newTestCluster(t, base)
	from, to := clean.secs(t0), clean.secs(t0.Add(40*time.Minute))
	node, gi := -1, 0
search:
	for n := range clean.nodes {
		g := &clean.groups[n/groupSize]
		j := clean.slotOf(n, g.window(from))
		for gi = range clean.nodes[n].gpus {
			if j.running(from) && j.running(to) && clean.powerCapShare(&clean.nodes[n].gpus[gi], &j) > 0 {
				node = n
				break search
			}
		}
	}
	if node < 0 {
		t.Fatal("no node runs a power-capped job through the fault")
	}
	host := clean.nodes[node].hostname
	base.Faults = []Fault{{Kind: FaultIdleAllocation, At: faultAt, Duration: faultDur, Node: host, GPU: gi}}
	faulty := newTestCluster(t, base)
	const capNS = "DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP_NS"
	at := func(c *Cluster, d time.Duration) float64 {
		return value(t, c, t0.Add(d), capNS, "Hostname", host, "gpu", itoa(gi))
	}
	if c, f := at(clean, faultAt+faultDur)-at(clean, faultAt), at(faulty, faultAt+faultDur)-at(faulty, faultAt); c <= 0 || f != 0 {
		t.Errorf("SW power-cap time during the fault: +%v ns (clean +%v ns); want none", f, c)
	}
	later := faultAt + faultDur + 10*time.Minute
	if c, f := at(clean, later)-at(clean, faultAt+faultDur), at(faulty, later)-at(faulty, faultAt+faultDur); c != f {
		t.Errorf("SW power-cap time after the fault: +%v ns, clean +%v ns", f, c)
	}
	if r := int(value(t, faulty, t0.Add(faultAt+time.Minute), "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "Hostname", host, "gpu", itoa(gi))); r&ThrottleSWPowerCap != 0 {
		t.Errorf("unused GPU's reasons %#x carry the SW power cap bit", r)
	}
}

// An exporter restart (its pod replaced) takes the node's DCGM series and
// its scrape target away for the fault's 45 s; they come back under a new
// instance with the GPUs' counters gone on as if nothing happened.
func TestFaultExporterRestart(t *testing.T) {
	c := newTestCluster(t, Config{Nodes: 2, Seed: 13, TargetLabels: true, FaultOrigin: t0,
		Faults: []Fault{{Kind: FaultExporterRestart, At: time.Hour, Node: "1", GPU: -1}}})
	host := c.Hostnames()[1]
	at := func(d time.Duration) (instances map[string]bool, energy float64, up int) {
		instances = map[string]bool{}
		for _, s := range c.AppendSamples(nil, t0.Add(d), Replica{}) {
			switch {
			case s.Name() == "up" && s.Get("job") == "dcgm-exporter" && strings.HasPrefix(s.Get("instance"), host):
				up++
			case s.Name() == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" && s.Get("Hostname") == host && s.Get("gpu") == "0":
				instances[s.Get("instance")] = true
				energy = s.V
			}
		}
		return instances, energy, up
	}
	before, e0, up0 := at(time.Hour - 15*time.Second)
	during, _, upDuring := at(time.Hour + 30*time.Second)
	after, e1, up1 := at(time.Hour + 45*time.Second)
	if len(before) != 1 || len(during) != 0 || len(after) != 1 || up0 != 1 || upDuring != 0 || up1 != 1 {
		t.Fatalf("instances %v / %v / %v, up targets %d / %d / %d: want the series and target gone for the restart only", before, during, after, up0, upDuring, up1)
	}
	for i := range after {
		if before[i] {
			t.Errorf("the restarted exporter kept its instance %s", i)
		}
	}
	// An idle or busy GPU draws at least ~60 W: a minute adds > 3.6e6 mJ.
	if e1-e0 < 3.6e6 {
		t.Errorf("energy counter %v -> %v across the restart: want it to go on", e0, e1)
	}
}

// A checkpoint or evaluation pause holds the job's steps while its GPUs show
// the checkpoint phase (not the 100 % of a hung collective), then the job
// trains on from where it was.
func TestFaultTrainingPause(t *testing.T) {
	fc := newFaultCase(t, Fault{Kind: FaultTrainingPause, Duration: 18 * time.Minute})
	_, c0 := fc.both(t, fc.start.Add(time.Minute), "training_iteration_time_seconds_count", "rank", "0")
	_, c1 := fc.both(t, fc.end.Add(-time.Second), "training_iteration_time_seconds_count", "rank", "0")
	_, c2 := fc.both(t, fc.end.Add(5*time.Minute), "training_iteration_time_seconds_count", "rank", "0")
	if c1 != c0 || c2 <= c1 {
		t.Errorf("iterations %v, %v, %v during and after the pause: want them held, then going on", c0, c1, c2)
	}
	if _, u := fc.both(t, fc.start.Add(10*time.Minute), "DCGM_FI_DEV_GPU_UTIL", "gpu", "0"); u > 25 {
		t.Errorf("GPU 0 during the pause at %v %%, want the checkpoint phase's < 25 %%", u)
	}
	stall := newFaultCase(t, Fault{Kind: FaultTrainingStall})
	if _, u := stall.both(t, stall.start.Add(time.Minute), "DCGM_FI_DEV_GPU_UTIL", "gpu", "0"); u != 100 {
		t.Errorf("GPU 0 in a hung collective at %v %%, want 100", u)
	}
}
