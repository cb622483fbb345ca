package gpusim

import (
	"math"
	"strings"
	"testing"
	"time"
)

// Faults start at t0+10m and last 5 minutes (unless they say) on a node that runs one job from
// t0 to past t0+30m; each test compares with the same cluster without the
// fault, before, during and after it.
const (
	faultAt  = 10 * time.Minute
	faultDur = 5 * time.Minute
)

type faultCase struct {
	clean, faulty *Cluster
	node          int
	host          string
	job           jobSlot
	start, end    time.Time
}

func newFaultCase(t *testing.T, f Fault) *faultCase {
	t.Helper()
	base := Config{Nodes: 16, Seed: 13, FaultOrigin: t0}
	clean := newTestCluster(t, base)
	node, job := busyNode(t, clean, t0, t0.Add(40*time.Minute))
	if f.Duration == 0 {
		f.Duration = faultDur
	}
	f.At, f.Node = faultAt, clean.nodes[node].hostname
	base.Faults = []Fault{f}
	return &faultCase{
		clean: clean, faulty: newTestCluster(t, base), node: node, host: clean.nodes[node].hostname, job: job,
		start: t0.Add(faultAt), end: t0.Add(faultAt + f.Duration),
	}
}

func (fc *faultCase) both(t *testing.T, at time.Time, name string, kv ...string) (clean, faulty float64) {
	t.Helper()
	kv = append([]string{"Hostname", fc.host}, kv...)
	return value(t, fc.clean, at, name, kv...), value(t, fc.faulty, at, name, kv...)
}

func TestFaultOverheat(t *testing.T) {
	fc := newFaultCase(t, Fault{Kind: FaultOverheat, GPU: 2})
	c, f := fc.both(t, fc.start.Add(-time.Second), "DCGM_FI_DEV_GPU_TEMP", "gpu", "2")
	if c != f {
		t.Errorf("before: temp %v vs clean %v", f, c)
	}
	_, f = fc.both(t, fc.end.Add(-time.Second), "DCGM_FI_DEV_GPU_TEMP", "gpu", "2")
	if f < 90 || f > 94 {
		t.Errorf("end of overheat: %v °C, want ~92", f)
	}
	if _, r := fc.both(t, fc.end.Add(-time.Second), "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gpu", "2"); int(r)&ThrottleSWThermal == 0 {
		t.Errorf("hot GPU throttle reasons %#x lack SW thermal slowdown", int(r))
	}
	if c, f := fc.both(t, fc.end.Add(-time.Second), "DCGM_FI_DEV_GPU_TEMP", "gpu", "3"); c != f {
		t.Errorf("overheat leaked to GPU 3: %v vs %v", f, c)
	}
	// It cools with the same lag after the fault ends.
	c, f = fc.both(t, fc.end.Add(15*tauTemp*time.Second), "DCGM_FI_DEV_GPU_TEMP", "gpu", "2")
	if math.Abs(c-f) > 1 {
		t.Errorf("after cooling: %v °C vs clean %v", f, c)
	}
	if _, r := fc.both(t, fc.end.Add(15*tauTemp*time.Second), "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gpu", "2"); int(r)&ThrottleSWThermal != 0 {
		t.Errorf("SW thermal slowdown still set after cooling: %#x", int(r))
	}
}

func TestFaultXid(t *testing.T) {
	fc := newFaultCase(t, Fault{Kind: FaultXid, GPU: 0, Code: 79})
	if _, f := fc.both(t, fc.start.Add(-time.Second), "DCGM_FI_DEV_XID_ERRORS", "gpu", "0"); f != 0 {
		t.Errorf("before: Xid %v, want 0", f)
	}
	for _, at := range []time.Time{fc.start, fc.end.Add(time.Second), fc.end.Add(6 * time.Hour)} {
		if _, f := fc.both(t, at, "DCGM_FI_DEV_XID_ERRORS", "gpu", "0"); f != 79 {
			t.Errorf("at %s: Xid %v, want 79 (the gauge keeps the last code)", at.Sub(t0), f)
		}
	}
	if _, f := fc.both(t, fc.end, "DCGM_FI_DEV_XID_ERRORS", "gpu", "1"); f != 0 {
		t.Errorf("Xid leaked to GPU 1: %v", f)
	}
}

func TestFaultECCDBE(t *testing.T) {
	fc := newFaultCase(t, Fault{Kind: FaultECCDBE, GPU: 4})
	names := []string{"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"}
	for _, n := range names {
		if _, f := fc.both(t, fc.start.Add(-time.Second), n, "gpu", "4"); f != 0 {
			t.Errorf("%s before: %v", n, f)
		}
		if _, f := fc.both(t, fc.start, n, "gpu", "4"); f != 1 {
			t.Errorf("%s at start: %v, want 1", n, f)
		}
		_, atEnd := fc.both(t, fc.end.Add(-time.Second), n, "gpu", "4")
		_, after := fc.both(t, fc.end.Add(time.Hour), n, "gpu", "4")
		if atEnd != 5 || after != atEnd {
			t.Errorf("%s: %v at the end, %v an hour later; want 5 and no further change", n, atEnd, after)
		}
	}
}

// An uncorrectable ECC error logs Xid 48, then 63 (row remap), 94
// (contained), 45 (teardown) and 154 (recovery action changed) a second
// apart, as NVIDIA's catalogue describes: the last-Xid gauge ends on 154,
// and the recovery action asks for a GPU reset from then until the fault
// ends. An H100 retires no pages.
func TestFaultECCDBEXidBurst(t *testing.T) {
	fc := newFaultCase(t, Fault{Kind: FaultECCDBE, GPU: 4})
	for _, tc := range []struct {
		after time.Duration
		want  float64
	}{{-time.Second, 0}, {500 * time.Millisecond, 48}, {1500 * time.Millisecond, 63}, {2500 * time.Millisecond, 94}, {3500 * time.Millisecond, 45}, {4500 * time.Millisecond, 154}, {time.Hour, 154}} {
		if _, f := fc.both(t, fc.start.Add(tc.after), "DCGM_FI_DEV_XID_ERRORS", "gpu", "4"); f != tc.want {
			t.Errorf("start%+v: Xid %v, want %v", tc.after, f, tc.want)
		}
	}
	if _, f := fc.both(t, fc.end, "DCGM_FI_DEV_RETIRED_DBE", "gpu", "4"); f != 0 {
		t.Errorf("H100 retired %v pages; it remaps rows instead", f)
	}
	for _, tc := range []struct {
		at   time.Time
		want float64
	}{{fc.start.Add(3500 * time.Millisecond), 0}, {fc.start.Add(4500 * time.Millisecond), 1}, {fc.end.Add(-time.Second), 1}, {fc.end, 0}} {
		if _, f := fc.both(t, tc.at, RecoveryActionFieldDCGM45, "gpu", "4"); f != tc.want {
			t.Errorf("recovery action at %s: %v, want %v", tc.at, f, tc.want)
		}
	}
}

// The Xid gauge carries err_code (the value) and err_msg, as dcgm-exporter
// >= 3.3.6 does, so each code is a series of its own.
func TestXidErrCodeLabels(t *testing.T) {
	fc := newFaultCase(t, Fault{Kind: FaultXid, GPU: 3, Code: 48})
	before := find(fc.faulty.AppendSamples(nil, fc.start.Add(-time.Second), Replica{}), "DCGM_FI_DEV_XID_ERRORS", "Hostname", fc.host, "gpu", "3")
	after := find(fc.faulty.AppendSamples(nil, fc.start, Replica{}), "DCGM_FI_DEV_XID_ERRORS", "Hostname", fc.host, "gpu", "3")
	if len(before) != 1 || len(after) != 1 {
		t.Fatalf("%d series before, %d after", len(before), len(after))
	}
	if b := before[0]; b.Get("err_code") != "0" || b.Get("err_msg") != "No Error" || b.V != 0 {
		t.Errorf("before: %s", b.String())
	}
	if a := after[0]; a.Get("err_code") != "48" || a.Get("err_msg") != "Double Bit ECC Error" || a.V != 48 {
		t.Errorf("after: %s", a.String())
	}
}

// Xid 79: the code is exported for one collection interval, then the GPU's
// series disappear until the fault ends (the node is power-cycled); the
// node's other GPUs stay.
func TestFaultXid79GPUDisappears(t *testing.T) {
	fc := newFaultCase(t, Fault{Kind: FaultXid, GPU: 5, Code: 79})
	gpuSeries := func(at time.Time, gpu string) int {
		n := 0
		for _, s := range fc.faulty.AppendSamples(nil, at, Replica{}) {
			if s.Desc.Source == SourceDCGM && s.Get("Hostname") == fc.host && s.Get("gpu") == gpu {
				n++
			}
		}
		return n
	}
	perGPU := len(fc.faulty.DCGMFamilies())
	if n := gpuSeries(fc.start.Add(10*time.Second), "5"); n != perGPU {
		t.Errorf("just after the Xid: %d series of GPU 5, want %d", n, perGPU)
	}
	if _, f := fc.both(t, fc.start.Add(10*time.Second), "DCGM_FI_DEV_XID_ERRORS", "gpu", "5"); f != 79 {
		t.Errorf("Xid %v, want 79", f)
	}
	if n := gpuSeries(fc.start.Add(time.Minute), "5"); n != 0 {
		t.Errorf("a minute after Xid 79: %d series of GPU 5, want none", n)
	}
	if n := gpuSeries(fc.start.Add(time.Minute), "4"); n != perGPU {
		t.Errorf("GPU 4 lost series: %d", n)
	}
	if n := gpuSeries(fc.end, "5"); n != perGPU {
		t.Errorf("after the power cycle: %d series of GPU 5, want %d", n, perGPU)
	}
}

func TestFaultThrottleThermal(t *testing.T) {
	fc := newFaultCase(t, Fault{Kind: FaultThrottleThermal, GPU: 2})
	_, r := fc.both(t, fc.start.Add(time.Minute), "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gpu", "2")
	if got := int(r) & (ThrottleHWSlowdown | ThrottleHWThermal | ThrottleHWPowerBrake); got != 0x48 {
		t.Errorf("thermal throttle HW bits %#x, want 0x48", got)
	}
	if c, f := fc.both(t, fc.start.Add(time.Minute), "DCGM_FI_DEV_SM_CLOCK", "gpu", "2"); f > 1200 || f >= c {
		t.Errorf("throttled SM clock %v (clean %v)", f, c)
	}
	if c, f := fc.both(t, fc.start.Add(time.Minute), "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gpu", "3"); c != f {
		t.Errorf("thermal throttle leaked to GPU 3: %#x vs %#x", int(f), int(c))
	}
}

// HBM overheats on its own: memory temperature climbs towards ~98 °C while
// the die stays where it was, and relaxes after the fault.
func TestFaultHBMOverheat(t *testing.T) {
	fc := newFaultCase(t, Fault{Kind: FaultHBMOverheat, GPU: 1})
	c, f := fc.both(t, fc.start.Add(-time.Second), "DCGM_FI_DEV_MEMORY_TEMP", "gpu", "1")
	if c != f {
		t.Errorf("before: %v vs clean %v", f, c)
	}
	if _, f := fc.both(t, fc.end.Add(-time.Second), "DCGM_FI_DEV_MEMORY_TEMP", "gpu", "1"); f < 95 || f > 99 {
		t.Errorf("end of HBM overheat: %v °C, want ~98", f)
	}
	if c, f := fc.both(t, fc.end.Add(-time.Second), "DCGM_FI_DEV_GPU_TEMP", "gpu", "1"); c != f {
		t.Errorf("die temperature moved with the HBM: %v vs clean %v", f, c)
	}
	if c, f := fc.both(t, fc.end.Add(10*tauHBM*time.Second), "DCGM_FI_DEV_MEMORY_TEMP", "gpu", "1"); math.Abs(c-f) > 1 {
		t.Errorf("after the fault: %v °C vs clean %v", f, c)
	}
}

// An exporter upgrade renames Hostname to hostname on that node's DCGM
// series from `at` on, for good; series counts do not change.
func TestFaultExporterUpgrade(t *testing.T) {
	fc := newFaultCase(t, Fault{Kind: FaultExporterUpgrade})
	count := func(at time.Time, label string) int {
		n := 0
		for _, s := range fc.faulty.AppendSamples(nil, at, Replica{}) {
			if s.Desc.Source == SourceDCGM && s.Get(label) == fc.host {
				n++
			}
		}
		return n
	}
	perNode := len(fc.faulty.DCGMFamilies()) * 8
	for _, tc := range []struct {
		at           time.Time
		upper, lower int
	}{{fc.start.Add(-time.Second), perNode, 0}, {fc.start, 0, perNode}, {fc.end.Add(time.Hour), 0, perNode}} {
		if u, l := count(tc.at, "Hostname"), count(tc.at, "hostname"); u != tc.upper || l != tc.lower {
			t.Errorf("at %s: %d series with Hostname, %d with hostname; want %d, %d", tc.at.Sub(t0), u, l, tc.upper, tc.lower)
		}
	}
}

// A driver upgrade changes DCGM_FI_DRIVER_VERSION on that node's DCGM
// series from `at` on, for good; series counts and counters go on.
func TestFaultDriverUpgrade(t *testing.T) {
	fc := newFaultCase(t, Fault{Kind: FaultDriverUpgrade})
	count := func(at time.Time, driver string) int {
		n := 0
		for _, s := range fc.faulty.AppendSamples(nil, at, Replica{}) {
			if s.Desc.Source == SourceDCGM && s.Get("Hostname") == fc.host && s.Get("DCGM_FI_DRIVER_VERSION") == driver {
				n++
			}
		}
		return n
	}
	perNode := len(fc.faulty.DCGMFamilies()) * 8
	for _, tc := range []struct {
		at       time.Time
		old, new int
	}{{fc.start.Add(-time.Second), perNode, 0}, {fc.start, 0, perNode}, {fc.end.Add(time.Hour), 0, perNode}} {
		if o, n := count(tc.at, driverVersion), count(tc.at, UpgradedDriverVersion); o != tc.old || n != tc.new {
			t.Errorf("at %s: %d series with the old driver, %d with the new; want %d, %d", tc.at.Sub(t0), o, n, tc.old, tc.new)
		}
	}
	energy := func(at time.Time) float64 {
		for _, s := range fc.faulty.AppendSamples(nil, at, Replica{}) {
			if s.Name() == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" && s.Get("Hostname") == fc.host && s.Get("gpu") == "0" {
				return s.V
			}
		}
		t.Fatalf("no energy counter at %s", at)
		return 0
	}
	if before, after := energy(fc.start.Add(-time.Second)), energy(fc.start); after < before {
		t.Errorf("energy counter went from %v to %v across the driver upgrade", before, after)
	}
}

func TestFaultRowRemapFailure(t *testing.T) {
	fc := newFaultCase(t, Fault{Kind: FaultRowRemapFailure, GPU: 6})
	for _, tc := range []struct {
		at   time.Time
		want float64
	}{{fc.start.Add(-time.Second), 0}, {fc.start, 1}, {fc.end.Add(-time.Second), 1}, {fc.end, 0}} {
		if _, f := fc.both(t, tc.at, "DCGM_FI_DEV_ROW_REMAP_FAILURE", "gpu", "6"); f != tc.want {
			t.Errorf("at %s: row remap failure %v, want %v", tc.at.Sub(t0), f, tc.want)
		}
	}
}

func TestFaultNVLinkCRCBurst(t *testing.T) {
	fc := newFaultCase(t, Fault{Kind: FaultNVLinkCRCBurst, GPU: 1})
	n := "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"
	c0, f0 := fc.both(t, fc.start.Add(-time.Second), n, "gpu", "1")
	c1, f1 := fc.both(t, fc.end, n, "gpu", "1")
	c2, f2 := fc.both(t, fc.end.Add(30*time.Minute), n, "gpu", "1")
	if f0 != c0 {
		t.Errorf("before: %v vs clean %v", f0, c0)
	}
	if (f1-c1)-(f0-c0) < 1000 {
		t.Errorf("burst added only %v CRC errors", (f1-c1)-(f0-c0))
	}
	if f2-c2 != f1-c1 {
		t.Errorf("burst kept adding after its end: excess %v then %v", f1-c1, f2-c2)
	}
}

func TestFaultThrottle(t *testing.T) {
	fc := newFaultCase(t, Fault{Kind: FaultThrottle, GPU: -1})
	for g := 0; g < 8; g++ {
		gs := itoa(g)
		_, r := fc.both(t, fc.start.Add(time.Minute), "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gpu", gs)
		if got := int(r) & (ThrottleHWSlowdown | ThrottleHWThermal | ThrottleHWPowerBrake); got != 0x88 {
			t.Errorf("gpu %d: power brake HW bits %#x, want 0x88 (HW slowdown + power brake)", g, got)
		}
		c, f := fc.both(t, fc.start.Add(time.Minute), "DCGM_FI_DEV_SM_CLOCK", "gpu", gs)
		if f > 1200 || f >= c {
			t.Errorf("gpu %d: throttled SM clock %v (clean %v)", g, f, c)
		}
		if _, p := fc.both(t, fc.start.Add(time.Minute), "DCGM_FI_DEV_POWER_USAGE", "gpu", gs); p > throttleShare*fc.faulty.hw.pMax*1.03 {
			t.Errorf("gpu %d: power %v W under power brake", g, p)
		}
		c, f = fc.both(t, fc.end.Add(time.Second), "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gpu", gs)
		if c != f {
			t.Errorf("gpu %d: reasons %#x after the fault, clean %#x", g, int(f), int(c))
		}
	}
}

func TestFaultTrainingStall(t *testing.T) {
	fc := newFaultCase(t, Fault{Kind: FaultTrainingStall})
	cnt := "training_iteration_time_seconds_count"
	_, before := fc.both(t, fc.start.Add(-time.Minute), cnt, "rank", itoa((fc.node-fc.job.firstNode)*8))
	_, early := fc.both(t, fc.start.Add(time.Second), cnt, "rank", itoa((fc.node-fc.job.firstNode)*8))
	_, late := fc.both(t, fc.end.Add(-time.Second), cnt, "rank", itoa((fc.node-fc.job.firstNode)*8))
	_, after := fc.both(t, fc.end.Add(2*time.Minute), cnt, "rank", itoa((fc.node-fc.job.firstNode)*8))
	if !(before < early || before == early) || early != late || after <= late {
		t.Errorf("iteration count %v (before) %v (start) %v (end) %v (after): want flat only during the stall", before, early, late, after)
	}
	// Every node of the job stalls: the collective waits for all ranks.
	for n := fc.job.firstNode; n < fc.job.firstNode+fc.job.size; n++ {
		h := fc.clean.nodes[n].hostname
		a := value(t, fc.faulty, fc.start.Add(time.Second), cnt, "Hostname", h, "rank", itoa((n-fc.job.firstNode)*8))
		b := value(t, fc.faulty, fc.end.Add(-time.Second), cnt, "Hostname", h, "rank", itoa((n-fc.job.firstNode)*8))
		if a != b {
			t.Errorf("node %s of the job kept iterating: %v -> %v", h, a, b)
		}
	}
	if _, u := fc.both(t, fc.start.Add(time.Minute), "DCGM_FI_DEV_GPU_UTIL", "gpu", "0"); u != 100 {
		t.Errorf("stalled GPU util %v, want 100 (spinning collective)", u)
	}
	if _, tp := fc.both(t, fc.start.Add(time.Minute), "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gpu", "0"); tp != 0 {
		t.Errorf("stalled GPU tensor activity %v, want 0", tp)
	}
}

func TestFaultNaNLoss(t *testing.T) {
	fc := newFaultCase(t, Fault{Kind: FaultNaNLoss})
	loss := func(at time.Time) []Series {
		return find(fc.faulty.AppendSamples(nil, at, Replica{}), "training_loss", "job_name", fc.faulty.jobInfo(&fc.job).name)
	}
	for _, tc := range []struct {
		at  time.Time
		nan bool
	}{{fc.start.Add(-time.Second), false}, {fc.start, true}, {fc.end.Add(-time.Second), true}, {fc.end, false}} {
		ls := loss(tc.at)
		if len(ls) != fc.job.size*8 {
			t.Fatalf("%d loss series, want one per rank (%d)", len(ls), fc.job.size*8)
		}
		for _, s := range ls {
			if math.IsNaN(s.V) != tc.nan {
				t.Errorf("at %s rank %s: loss %v, want NaN=%v", tc.at.Sub(t0), s.Get("rank"), s.V, tc.nan)
			}
		}
	}
}

func TestFaultNodeDown(t *testing.T) {
	base := Config{Nodes: 16, Seed: 13, FaultOrigin: t0, TargetLabels: true}
	clean := newTestCluster(t, base)
	node, _ := busyNode(t, clean, t0, t0.Add(40*time.Minute))
	host := clean.nodes[node].hostname
	base.Faults = []Fault{{Kind: FaultNodeDown, At: faultAt, Duration: faultDur, Node: host}}
	c := newTestCluster(t, base)
	start, end := t0.Add(faultAt), t0.Add(faultAt+faultDur)
	count := func(at time.Time) int {
		n := 0
		for _, s := range c.AppendSamples(nil, at, Replica{}) {
			if s.Get("Hostname") == host || (s.Get("node") == host && s.Desc.Source != SourceKubeStateMetrics && s.Desc.Source != SourcePrometheus) {
				n++
			}
		}
		return n
	}
	if n := count(start.Add(-time.Second)); n < 8*32 {
		t.Fatalf("node has %d series before the fault", n)
	}
	if n := count(start); n != 0 {
		t.Errorf("node down but %d of its series are emitted", n)
	}
	ready := func(at time.Time, status string) float64 {
		return value(t, c, at, "kube_node_status_condition", "node", host, "condition", "Ready", "status", status)
	}
	if ready(start.Add(time.Minute), "true") != 0 || ready(start.Add(time.Minute), "unknown") != 1 {
		t.Errorf("down node still Ready")
	}
	// The target's relabelled `node` is on its `up` too (NodeUnreachable
	// names the node from it, and Alertmanager inhibits the node's alerts
	// on it).
	if v := value(t, c, start.Add(time.Minute), "up", "instance", host+":9100", "node", host); v != 0 {
		t.Errorf("up of the down node's node-exporter = %v", v)
	}
	if n := count(end); n < 8*32 {
		t.Errorf("node back but only %d series", n)
	}
	if ready(end, "true") != 1 {
		t.Errorf("node not Ready after the fault")
	}
}

func TestParseFaults(t *testing.T) {
	yml := []byte(`faults:
  - {at: 10m, duration: 5m, kind: overheat, node: gpu-node-003, gpu: 2}
  - {at: 1h, kind: xid, code: 79, node: 5, gpu: 0}
  - {at: 2d, duration: 90s, kind: node_down, node: gpu-node-001}
`)
	fs, err := ParseFaultsYAML(yml)
	if err != nil {
		t.Fatal(err)
	}
	if len(fs) != 3 || fs[0].Kind != FaultOverheat || fs[0].GPU != 2 || fs[1].Code != 79 || fs[1].Duration != DefaultFaultDuration ||
		fs[2].At != 48*time.Hour || fs[2].GPU != -1 || fs[2].Duration != 90*time.Second {
		t.Errorf("parsed %+v", fs)
	}
	f, err := ParseFaultSpec("kind=throttle,at=10m,duration=1m,node=gpu-node-003,gpu=2")
	if err != nil || f.Kind != FaultThrottle || f.At != 10*time.Minute || f.GPU != 2 || f.Node != "gpu-node-003" {
		t.Errorf("spec parsed %+v, %v", f, err)
	}
	for _, bad := range []string{"kind=melt,node=1", "kind=xid,node=1", "kind=overheat", "kind=overheat,node=1,at=soon"} {
		if _, err := ParseFaultSpec(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if _, err := New(Config{Nodes: 2, Faults: []Fault{{Kind: FaultOverheat, Node: "gpu-node-009", GPU: -1}}}); err == nil {
		t.Error("fault on a missing node accepted")
	}
}

// nodeFaultCluster returns a 16-node cluster with target labels and fault f
// (at faultAt, for faultDur) on a node that runs one job from t0 to past
// t0+40m, and that node's hostname.
func nodeFaultCluster(t *testing.T, f Fault) (*Cluster, string) {
	t.Helper()
	base := Config{Nodes: 16, Seed: 13, FaultOrigin: t0, TargetLabels: true}
	node, _ := busyNode(t, newTestCluster(t, base), t0, t0.Add(40*time.Minute))
	f.At, f.Duration, f.Node = faultAt, faultDur, itoa(node)
	base.Faults = []Fault{f}
	c := newTestCluster(t, base)
	return c, c.nodes[node].hostname
}

// A crashed dcgm-exporter: no DCGM series of the node, its target's up is
// 0, node-exporter and the job's training series go on; all back after.
func TestFaultExporterCrash(t *testing.T) {
	c, host := nodeFaultCluster(t, Fault{Kind: FaultExporterCrash})
	start, end := t0.Add(faultAt), t0.Add(faultAt+faultDur)
	dcgmUp := func(at time.Time) float64 {
		return value(t, c, at, "up", "job", "dcgm-exporter", "instance", host+":9400")
	}
	for _, at := range []time.Time{start.Add(-15 * time.Second), end} {
		if n := len(find(c.AppendSamples(nil, at, Replica{}), "DCGM_FI_DEV_GPU_TEMP", "Hostname", host)); n != 8 || dcgmUp(at) != 1 {
			t.Errorf("at %s (exporter running): %d GPU temperatures, up %v; want 8 and 1", at.Format(time.TimeOnly), n, dcgmUp(at))
		}
	}
	at := start.Add(2 * time.Minute)
	all := c.AppendSamples(nil, at, Replica{})
	for _, s := range all {
		if s.Desc.Source == SourceDCGM && s.Get("Hostname") == host {
			t.Fatalf("exporter crashed but %s is exported", s.Name())
		}
	}
	if dcgmUp(at) != 0 {
		t.Errorf("up of the crashed exporter = %v, want 0", dcgmUp(at))
	}
	if v := value(t, c, at, "up", "job", "node-exporter", "node", host); v != 1 {
		t.Errorf("node-exporter's up = %v, want 1", v)
	}
	if len(find(all, "training_iteration_time_seconds_count", "Hostname", host)) != 8 {
		t.Errorf("the node's job stopped exporting with its dcgm-exporter")
	}
}

// A hung host engine: the exporter answers with the values and label sets
// of the hang's start (the energy counter stops), up stays 1; values move
// again after.
func TestFaultExporterHung(t *testing.T) {
	c, host := nodeFaultCluster(t, Fault{Kind: FaultExporterHung})
	start, end := t0.Add(faultAt), t0.Add(faultAt+faultDur)
	dcgm := func(at time.Time) map[string]float64 {
		m := map[string]float64{}
		for _, s := range c.AppendSamples(nil, at, Replica{}) {
			if s.Desc.Source == SourceDCGM && s.Get("Hostname") == host {
				m[key(s.Labels)] = s.V
			}
		}
		return m
	}
	frozen := dcgm(start)
	if len(frozen) < 8*30 {
		t.Fatalf("%d DCGM series at the hang's start", len(frozen))
	}
	for _, at := range []time.Time{start.Add(15 * time.Second), start.Add(4 * time.Minute)} {
		got := dcgm(at)
		if len(got) != len(frozen) {
			t.Fatalf("at %s: %d series, want the %d of the hang's start", at.Format(time.TimeOnly), len(got), len(frozen))
		}
		for k, v := range frozen {
			if w, ok := got[k]; !ok || !sameValue(v, w) {
				t.Fatalf("at %s: %s = %v (present %v), want the frozen %v", at.Format(time.TimeOnly), k, w, ok, v)
			}
		}
		if v := value(t, c, at, "up", "job", "dcgm-exporter", "instance", host+":9400"); v != 1 {
			t.Errorf("up of the hung exporter = %v, want 1 (it answers)", v)
		}
	}
	e := func(at time.Time) float64 {
		return value(t, c, at, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Hostname", host, "gpu", "0")
	}
	if e(end) <= e(start) {
		t.Errorf("energy does not move after the hang: %v -> %v", e(start), e(end))
	}
}

// A removed node: before, its job slots stay empty (the autoscaler removes
// only empty nodes); from `at` on none of its series, `up` or
// kube-state-metrics objects remain, while the other nodes' do.
func TestFaultNodeRemoved(t *testing.T) {
	base := Config{Nodes: 16, Seed: 13, FaultOrigin: t0, TargetLabels: true,
		Faults: []Fault{{Kind: FaultNodeRemoved, At: faultAt, Node: "3"}}}
	c := newTestCluster(t, base)
	host := c.nodes[3].hostname
	start := t0.Add(faultAt)
	before := c.AppendSamples(nil, start.Add(-time.Minute), Replica{})
	if len(find(before, "kube_node_info", "node", host, "internal_ip", c.nodes[3].hostIP)) != 1 || len(find(before, "DCGM_FI_DEV_GPU_TEMP", "Hostname", host)) != 8 {
		t.Fatalf("node %s not in the cluster before its removal", host)
	}
	if p := find(before, "kube_pod_info", "node", host); len(p) != 0 {
		t.Errorf("the node runs pod %s a minute before the autoscaler removes it", p[0].Get("pod"))
	}
	for _, at := range []time.Time{start, start.Add(time.Hour)} {
		all := c.AppendSamples(nil, at, Replica{})
		for _, s := range all {
			if s.Get("Hostname") == host || s.Get("node") == host || strings.HasPrefix(s.Get("instance"), host+":") {
				t.Fatalf("at %s the removed node still has %s%v", at.Format(time.TimeOnly), s.Name(), s.Labels)
			}
		}
		if n := len(find(all, "kube_node_info")); n != 15 {
			t.Errorf("at %s: %d kube_node_info, want the 15 other nodes'", at.Format(time.TimeOnly), n)
		}
	}
}
