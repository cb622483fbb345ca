package gpusim

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/common/model"
	"gopkg.in/yaml.v3"
)

// FaultKind names an injected failure.
type FaultKind string

// Fault kinds. Their effects are described in README.md.
const (
	// FaultOverheat drives the GPU temperature towards Value °C (default
	// ~92 °C: a cooling failure); the SW thermal slowdown bit is set from the
	// GPU's maximum operating temperature (87 °C on an H100), so a Value
	// below it (86) is a hot GPU that has not slowed down yet.
	FaultOverheat FaultKind = "overheat"
	// FaultXid records an Xid event: DCGM_FI_DEV_XID_ERRORS takes the code
	// and keeps it after the fault, as the real gauge does. Xid 79 (fallen
	// off the bus) also makes the GPU's series disappear from 30 s after the
	// event (one exporter collection showed the code) until the fault ends,
	// as a node power cycle brings the GPU back.
	FaultXid FaultKind = "xid"
	// FaultECCDBE raises the DBE volatile counter (once at the start, then once
	// a minute while it lasts), with uncorrectable remapped rows following,
	// and logs the Xid burst NVIDIA's catalogue describes for it: 48 (the
	// DBE), 63 (row remap recorded), 94 (contained error), 45 (teardown of
	// the contexts) and 154 (recovery action changed), a second apart, so
	// the last-Xid gauge ends on 154; the recovery action is a GPU reset (1)
	// from the 154 until the fault ends.
	FaultECCDBE FaultKind = "ecc_dbe"
	// FaultRowRemapFailure sets DCGM_FI_DEV_ROW_REMAP_FAILURE to 1.
	FaultRowRemapFailure FaultKind = "row_remap_failure"
	// FaultNVLinkCRCBurst makes the NVLink CRC flit error counter jump.
	FaultNVLinkCRCBurst FaultKind = "nvlink_crc_burst"
	// FaultThrottle is an external power brake: throttle reasons 0x88 (HW
	// slowdown + HW power brake); SM clocks and power drop.
	FaultThrottle FaultKind = "throttle"
	// FaultThrottleThermal is a HW thermal slowdown: throttle reasons 0x48
	// (HW slowdown + HW thermal slowdown); SM clocks drop.
	FaultThrottleThermal FaultKind = "throttle_thermal"
	// FaultHBMOverheat drives the memory (HBM) temperature towards ~98 °C with
	// its own lag while the die stays as it was (a memory cooling fault).
	FaultHBMOverheat FaultKind = "hbm_overheat"
	// FaultExporterUpgrade upgrades the node's dcgm-exporter at `at` to a
	// build that names the host label `hostname` instead of `Hostname` (the
	// rename on dcgm-exporter's main branch). Permanent: duration is ignored.
	FaultExporterUpgrade FaultKind = "exporter_upgrade"
	// FaultExporterUpgrade49 upgrades the node's dcgm-exporter at `at` to
	// 4.9 (DCGM 4.7) with its own default counters: the host label is
	// `hostname`, the default fields carry DCGM 4.7's names and units
	// (Exporter49Names: clocks in Hz, energy in J, utilisation as a ratio,
	// memory in bytes) and the driver label is DCGM_FI_SYSTEM_DRIVER_VERSION.
	// Permanent: duration is ignored.
	FaultExporterUpgrade49 FaultKind = "exporter_upgrade_4_9"
	// FaultDriverUpgrade upgrades the node's GPU driver at `at`: from then on
	// its DCGM series carry DCGM_FI_DRIVER_VERSION=UpgradedDriverVersion, so
	// every GPU series of the node changes identity (counters go on, as
	// after a driver update without a reset). Permanent: duration is ignored.
	FaultDriverUpgrade FaultKind = "driver_upgrade"
	// FaultTrainingStall hangs the job using the node (as a stuck NCCL
	// collective does): its iteration histogram stops counting, GPUs spin at
	// 100% utilisation with low power.
	FaultTrainingStall FaultKind = "training_stall"
	// FaultNaNLoss makes training_loss (and training_gradient_norm) NaN for the
	// job using the node.
	FaultNaNLoss FaultKind = "nan_loss"
	// FaultNodeDown removes all the node's series (its exporters are
	// unreachable), marks it not Ready (status="unknown") in
	// kube-state-metrics and stalls the job it was part of.
	FaultNodeDown FaultKind = "node_down"
	// FaultGPUReset resets the GPU (nvidia-smi -r) at `at`: the job on its
	// node ends, the GPU is gone from the exporter for `duration` (default
	// 30 s), and comes back with its volatile counters (ECC, PCIe replay,
	// NVLink errors, clock-event time) restarted from 0 and a pending row
	// remap applied.
	FaultGPUReset FaultKind = "gpu_reset"
	// FaultRecoveryAction: the driver asks for recovery action `code`
	// (nvmlDeviceGpuRecoveryAction_t: 1 GPU reset (default), 2 node reboot,
	// 3 drain P2P, 4 drain and reset) while the fault lasts, and logs Xid 154
	// (GPU Recovery Action Changed) at `at`.
	FaultRecoveryAction FaultKind = "recovery_action"
	// FaultMIG switches the GPU to MIG mode for `duration`: its node's job
	// ends (the node is drained first), and dcgm-exporter exports one series
	// per GPU instance (GPU_I_PROFILE, GPU_I_ID) and no utilisation.
	FaultMIG FaultKind = "mig"
	// FaultNVLinkReplay: NVLink replay errors, one every 10 s (H100 only:
	// NVLink5 has no replay counter).
	FaultNVLinkReplay FaultKind = "nvlink_replay"
	// FaultNVLinkRecovery: an NVLink link recovery at `at` and every minute
	// while it lasts (H100: the recovery error counter; B200: the link
	// recovery and failed-recovery event counters).
	FaultNVLinkRecovery FaultKind = "nvlink_recovery"
	// FaultExporterCrash: the node's dcgm-exporter exits while the fault
	// lasts (crash-looping, e.g. on a counters CSV naming a field its DCGM
	// does not know): no DCGM series, and its scrape target's `up` is 0.
	// The node, its other exporters and its jobs go on.
	FaultExporterCrash FaultKind = "exporter_crash"
	// FaultExporterRestart: the node's dcgm-exporter pod is replaced (a
	// DaemonSet rolling update, an OOM kill) at `at`: for the fault's
	// duration (default 45 s) the old pod is gone and the new one not
	// ready, so the target leaves service discovery (no `up`, no DCGM
	// series); the new pod has a new address, so the DCGM series come back
	// with another `instance`. The GPUs, their counters and the node's jobs
	// go on.
	FaultExporterRestart FaultKind = "exporter_restart"
	// FaultExporterHung: DCGM's host engine hangs while the fault lasts; the
	// exporter still answers every scrape, with the values and label sets
	// of the hang's start (energy counters stop moving, `up` stays 1).
	FaultExporterHung FaultKind = "exporter_hung"
	// FaultNodeRemoved: the cluster autoscaler removes the node at `at`,
	// for good: its targets leave service discovery (no series, no `up`),
	// kube-state-metrics drops its kube_node_info and conditions. The
	// autoscaler removes only empty nodes, so job slots on the node whose
	// pods would still exist at `at` stay empty. Duration is ignored.
	FaultNodeRemoved FaultKind = "node_removed"
	// FaultMaintenanceReboot: planned maintenance of the node: it is
	// cordoned and drained at `at` (kube_node_spec_unschedulable 1, its job
	// ends), reboots a minute later (down: no node-exporter, no DCGM
	// series, kubelet NotReady) until a minute before the fault ends, and is
	// uncordoned when it ends.
	FaultMaintenanceReboot FaultKind = "maintenance_reboot"
	// FaultPStateChange sets the HW-slowdown bit (0x8) of the clock-event
	// reasons while it lasts (default 15 s: one scrape), as NVML reports it
	// during a P-state or clock change; nothing is slowed down.
	FaultPStateChange FaultKind = "pstate_change"
	// FaultSBEStorm: corrected (single-bit) ECC errors at Value per minute
	// (default 2) while it lasts, on top of the GPU's background rate.
	FaultSBEStorm FaultKind = "sbe_storm"
	// FaultStraggler makes the rank on GPU `gpu` of the node (every rank of
	// the node with -1) a straggler while it lasts: its compute takes longer
	// (a degraded or throttled GPU), so the job's steps take Value times as
	// long (default 1.5) on every rank (synchronous training waits for it:
	// every rank's training_iteration_time_seconds_sum grows that much
	// faster), and the straggler's GPU stays in its compute phase while the
	// others wait in the collective (higher tensor activity and power).
	FaultStraggler FaultKind = "straggler"
	// FaultTrainingSlowStart: a job that starts on the node while the fault
	// lasts makes its first step only when the fault ends (a long data or
	// checkpoint load, or a start that hangs); its count stays at 0 until
	// then, then it trains. Its GPUs sit at ~0 % utilisation and idle power
	// meanwhile, holding the job's memory.
	FaultTrainingSlowStart FaultKind = "training_slow_start"
	// FaultTrainingPause: the job running on the node pauses training while
	// the fault lasts (a long checkpoint save or an evaluation pass): no
	// step completes, its GPUs show the checkpoint phase (low utilisation,
	// the state copied to the host over PCIe), then it trains on. Not a
	// hang: TrainingJobStalled must wait.
	FaultTrainingPause FaultKind = "training_pause"
	// FaultPCIeReplays: PCIe replays at Value per minute (default 20) while
	// it lasts, on top of the GPU's background rate: above DCGM's limit for
	// an A100's Gen4 x16 link (16), below an H100's Gen5 x16 (31).
	FaultPCIeReplays FaultKind = "pcie_replays"
	// FaultNVLink5SymbolErrors (NVLink5 only): RX symbol errors at Value per
	// minute (default 6) while it lasts, no other NVLink5 counter or BER
	// moving: the least DCGM's NVLink5 health check fails a link on.
	FaultNVLink5SymbolErrors FaultKind = "nvlink5_symbol_errors"
	// FaultIdleAllocation: the pod of the job running on the node holds the
	// GPU but runs nothing on it while the fault lasts (its launcher started
	// fewer processes than the GPUs it requested, or a notebook sits idle):
	// utilisation, engine activity, clocks and power as an idle GPU's (no
	// SW power-cap time either), no framebuffer in use, the pod/namespace/container labels of its
	// allocation kept. The job's training series go on. No effect while no
	// job runs on the node (no pod holds the GPU).
	FaultIdleAllocation FaultKind = "idle_allocation"
)

// FaultKinds lists every kind, for flag help and validation.
var FaultKinds = []FaultKind{FaultOverheat, FaultXid, FaultECCDBE, FaultRowRemapFailure, FaultNVLinkCRCBurst, FaultThrottle, FaultThrottleThermal, FaultHBMOverheat, FaultExporterUpgrade, FaultExporterUpgrade49, FaultDriverUpgrade, FaultTrainingStall, FaultNaNLoss, FaultNodeDown,
	FaultGPUReset, FaultRecoveryAction, FaultMIG, FaultNVLinkReplay, FaultNVLinkRecovery, FaultExporterCrash, FaultExporterRestart, FaultExporterHung, FaultNodeRemoved, FaultMaintenanceReboot,
	FaultPStateChange, FaultSBEStorm, FaultStraggler, FaultTrainingSlowStart, FaultTrainingPause, FaultPCIeReplays, FaultNVLink5SymbolErrors, FaultIdleAllocation}

// DefaultFaultDuration applies when a fault gives none (gpu_reset: 30 s,
// pstate_change: 15 s, exporter_restart: 45 s).
const DefaultFaultDuration = 5 * time.Minute

// defaultDuration is the duration of a fault of kind that gives none.
func defaultDuration(kind FaultKind) time.Duration {
	switch kind {
	case FaultGPUReset:
		return 30 * time.Second
	case FaultPStateChange:
		return 15 * time.Second
	case FaultExporterRestart:
		return 45 * time.Second
	}
	return DefaultFaultDuration
}

// defaultSBEStormRate is an sbe_storm's corrected errors per minute when it
// gives no Value.
const defaultSBEStormRate = 2.0

// defaultPCIeReplayRate is a pcie_replays fault's replays per minute when
// it gives no Value.
const defaultPCIeReplayRate = 20.0

// defaultNVLink5SymbolErrorRate is an nvlink5_symbol_errors fault's errors
// per minute when it gives no Value.
const defaultNVLink5SymbolErrorRate = 6.0

// defaultStragglerFactor is how much slower a straggler's iterations are
// when its fault gives no Value.
const defaultStragglerFactor = 1.5

// Fault is one scheduled failure. At is an offset from Config.FaultOrigin.
type Fault struct {
	Kind     FaultKind
	At       time.Duration
	Duration time.Duration
	// Node is a hostname ("gpu-node-003") or a node index ("3").
	Node string
	// GPU is the GPU index; -1 means every GPU of the node. Ignored by the
	// node- and job-level kinds.
	GPU int
	// Code is the Xid code of an xid fault (79, 48, 94, ...) or the action
	// of a recovery_action fault.
	Code int
	// Every repeats an xid fault's event at this interval while it lasts
	// (0: once): the same code again, which the last-Xid gauge cannot show.
	Every time.Duration
	// Value is the level of the kinds that take one (0: their default):
	// overheat's target temperature (°C), sbe_storm's,
	// nvlink5_symbol_errors' errors and pcie_replays' replays per minute,
	// straggler's iteration-time factor.
	Value float64
}

// faultFile is the YAML schema: a top-level `faults:` list.
type faultFile struct {
	Faults []faultYAML `yaml:"faults"`
}

type faultYAML struct {
	At       string    `yaml:"at"`
	Duration string    `yaml:"duration"`
	Kind     FaultKind `yaml:"kind"`
	Node     string    `yaml:"node"`
	GPU      *int      `yaml:"gpu"`
	Code     int       `yaml:"code"`
	Every    string    `yaml:"every"`
	Value    float64   `yaml:"value"`
}

// ParseFaultsYAML reads a fault schedule:
//
//	faults:
//	  - {at: 10m, duration: 5m, kind: overheat, node: gpu-node-003, gpu: 2}
//	  - {at: 30m, kind: xid, code: 79, node: 5, gpu: 0}
func ParseFaultsYAML(data []byte) ([]Fault, error) {
	var f faultFile
	if err := yaml.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("parse fault file: %w", err)
	}
	out := make([]Fault, 0, len(f.Faults))
	for i, y := range f.Faults {
		gpu := -1
		if y.GPU != nil {
			gpu = *y.GPU
		}
		ft, err := newFault(y.Kind, y.At, y.Duration, y.Every, y.Node, gpu, y.Code, y.Value)
		if err != nil {
			return nil, fmt.Errorf("fault %d: %w", i, err)
		}
		out = append(out, ft)
	}
	return out, nil
}

// ParseFaultSpec reads the flag form of one fault:
// "kind=xid,at=10m,duration=1m,node=gpu-node-003,gpu=2,code=79[,every=1m]"
// ("kind=overheat,...,value=86" for the kinds that take a Value).
func ParseFaultSpec(spec string) (Fault, error) {
	var kind, at, dur, every, node string
	gpu, code, value := -1, 0, 0.0
	for _, kv := range strings.Split(spec, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return Fault{}, fmt.Errorf("fault %q: %q is not key=value", spec, kv)
		}
		var err error
		switch k {
		case "kind":
			kind = v
		case "at":
			at = v
		case "duration":
			dur = v
		case "every":
			every = v
		case "node":
			node = v
		case "gpu":
			gpu, err = strconv.Atoi(v)
		case "code":
			code, err = strconv.Atoi(v)
		case "value":
			value, err = strconv.ParseFloat(v, 64)
		default:
			return Fault{}, fmt.Errorf("fault %q: unknown key %q", spec, k)
		}
		if err != nil {
			return Fault{}, fmt.Errorf("fault %q: %s: %w", spec, k, err)
		}
	}
	f, err := newFault(FaultKind(kind), at, dur, every, node, gpu, code, value)
	if err != nil {
		return Fault{}, fmt.Errorf("fault %q: %w", spec, err)
	}
	return f, nil
}

func parseDur(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := model.ParseDuration(s)
	if err != nil {
		return 0, err
	}
	return time.Duration(d), nil
}

func newFault(kind FaultKind, at, dur, every, node string, gpu, code int, value float64) (Fault, error) {
	f := Fault{Kind: kind, Node: node, GPU: gpu, Code: code, Value: value}
	if !validKind(kind) {
		return f, fmt.Errorf("unknown kind %q (want one of %v)", kind, FaultKinds)
	}
	var err error
	if f.At, err = parseDur(at); err != nil {
		return f, fmt.Errorf("at: %w", err)
	}
	if f.Duration, err = parseDur(dur); err != nil {
		return f, fmt.Errorf("duration: %w", err)
	}
	if f.Every, err = parseDur(every); err != nil {
		return f, fmt.Errorf("every: %w", err)
	}
	if f.Duration == 0 {
		f.Duration = defaultDuration(kind)
	}
	if node == "" {
		return f, fmt.Errorf("node is required")
	}
	return f, checkFault(f)
}

// checkFault checks what a fault's kind requires of its fields.
func checkFault(f Fault) error {
	switch {
	case f.Kind == FaultXid && f.Code <= 0:
		return fmt.Errorf("xid fault needs a positive code")
	case f.Kind == FaultRecoveryAction && (f.Code < 0 || f.Code > 7):
		return fmt.Errorf("recovery_action code %d: want 1 (GPU reset), 2 (node reboot), 3 (drain P2P), 4 (drain and reset) or up to 7", f.Code)
	case f.Every < 0 || (f.Every > 0 && f.Every < time.Second):
		return fmt.Errorf("every %s: want at least 1s", f.Every)
	case f.Every > 0 && f.Kind != FaultXid:
		return fmt.Errorf("every applies to xid faults only, not %s", f.Kind)
	case f.Value < 0 || math.IsNaN(f.Value) || math.IsInf(f.Value, 0):
		return fmt.Errorf("value %g: want a positive number", f.Value)
	case f.Value > 0 && !slices.Contains(valueKinds, f.Kind):
		return fmt.Errorf("value applies to %v only, not %s", valueKinds, f.Kind)
	case f.Kind == FaultOverheat && f.Value > 0 && (f.Value < 30 || f.Value > 120):
		return fmt.Errorf("overheat value %g °C: want 30..120", f.Value)
	}
	return nil
}

func validKind(k FaultKind) bool {
	for _, x := range FaultKinds {
		if x == k {
			return true
		}
	}
	return false
}

// activeFault is a Fault resolved against a cluster: absolute times in
// seconds since Config.Epoch and a node index.
type activeFault struct {
	kind       FaultKind
	start, end float64
	node       int
	gpu        int // -1: all GPUs
	code       int
	every      float64 // xid: repeat interval in seconds, 0: once
	value      float64 // Fault.Value, its kind's default filled in
}

func (f *activeFault) activeAt(s float64) bool { return s >= f.start && s < f.end }

func (f *activeFault) hitsGPU(node, gpu int) bool {
	return f.node == node && (f.gpu < 0 || f.gpu == gpu)
}

// overlap returns the length of [f.start, f.end) ∩ [a, b).
func overlap(fa, fb, a, b float64) float64 {
	lo, hi := max(fa, a), min(fb, b)
	if hi > lo {
		return hi - lo
	}
	return 0
}

func (c *Cluster) resolveFaults(faults []Fault) error {
	origin := c.secs(c.cfg.FaultOrigin)
	for i, f := range faults {
		if !validKind(f.Kind) {
			return fmt.Errorf("fault %d: unknown kind %q", i, f.Kind)
		}
		n, ok := c.nodeIndex(f.Node)
		if !ok {
			return fmt.Errorf("fault %d (%s): unknown node %q (hostname like %q or index 0..%d)", i, f.Kind, f.Node, c.nodes[0].hostname, len(c.nodes)-1)
		}
		if f.GPU >= c.cfg.GPUsPerNode {
			return fmt.Errorf("fault %d (%s): gpu %d out of range 0..%d", i, f.Kind, f.GPU, c.cfg.GPUsPerNode-1)
		}
		if err := checkFault(f); err != nil {
			return fmt.Errorf("fault %d (%s): %w", i, f.Kind, err)
		}
		if f.Kind == FaultNVLinkReplay && c.hw.nvlink5 {
			return fmt.Errorf("fault %d (%s): NVLink5 (%s) has no replay counter; use nvlink_crc_burst or nvlink_recovery", i, f.Kind, c.cfg.GPUModel)
		}
		if f.Kind == FaultNVLink5SymbolErrors && !c.hw.nvlink5 {
			return fmt.Errorf("fault %d (%s): %s has no NVLink5 symbol error counter; use a B200 or nvlink_crc_burst", i, f.Kind, c.cfg.GPUModel)
		}
		d := f.Duration
		if d <= 0 {
			d = defaultDuration(f.Kind)
		}
		gpu := f.GPU
		if gpu < 0 {
			gpu = -1
		}
		start := origin + f.At.Seconds()
		end := start + d.Seconds()
		if f.Kind == FaultExporterUpgrade || f.Kind == FaultExporterUpgrade49 || f.Kind == FaultDriverUpgrade || f.Kind == FaultNodeRemoved {
			end = math.Inf(1)
		}
		code := f.Code
		if f.Kind == FaultRecoveryAction && code == 0 {
			code = 1 // GPU reset
		}
		c.faults = append(c.faults, activeFault{kind: f.Kind, start: start, end: end, node: n, gpu: gpu, code: code, every: f.Every.Seconds(), value: faultValue(f)})
	}
	sort.SliceStable(c.faults, func(i, j int) bool { return c.faults[i].start < c.faults[j].start })
	for _, f := range c.faults {
		if f.endsJob() {
			c.jobEnders = append(c.jobEnders, f)
		}
	}
	return nil
}

// valueKinds are the kinds that take a Value.
var valueKinds = []FaultKind{FaultOverheat, FaultSBEStorm, FaultStraggler, FaultPCIeReplays, FaultNVLink5SymbolErrors}

// faultValue is f's Value or its kind's default.
func faultValue(f Fault) float64 {
	switch {
	case f.Value > 0:
		return f.Value
	case f.Kind == FaultOverheat:
		return overheatTemp
	case f.Kind == FaultSBEStorm:
		return defaultSBEStormRate
	case f.Kind == FaultStraggler:
		return defaultStragglerFactor
	case f.Kind == FaultPCIeReplays:
		return defaultPCIeReplayRate
	case f.Kind == FaultNVLink5SymbolErrors:
		return defaultNVLink5SymbolErrorRate
	}
	return 0
}

// jobCrashDelay is how long after a fatal GPU event its job's pods fail:
// the CUDA error reaches the process, NCCL aborts, the container exits.
const jobCrashDelay = 5.0

// endsJob reports whether the fault ends the job on its node: an
// uncorrectable ECC error or an Xid that kills the CUDA contexts (48 DBE,
// 79 fallen off the bus, 94/95 contained/uncontained ECC), a GPU reset
// (needs the GPU idle) and a switch to MIG mode (the node is drained).
func (f *activeFault) endsJob() bool {
	switch f.kind {
	case FaultECCDBE, FaultGPUReset, FaultMIG, FaultNodeRemoved, FaultMaintenanceReboot:
		return true
	case FaultXid:
		return f.code == 79 || f.code == 48 || f.code == 94 || f.code == 95
	}
	return false
}

func (c *Cluster) nodeIndex(s string) (int, bool) {
	if i, ok := c.hostIndex[s]; ok {
		return i, true
	}
	if i, err := strconv.Atoi(s); err == nil && i >= 0 && i < len(c.nodes) {
		return i, true
	}
	return 0, false
}

// gpuFaultActive reports whether a fault of kind hits (node, gpu) at s.
func (c *Cluster) gpuFaultActive(kind FaultKind, node, gpu int, s float64) bool {
	_, ok := c.gpuFaultAt(kind, node, gpu, s)
	return ok
}

// gpuFaultAt returns the first fault of kind that hits (node, gpu) at s.
func (c *Cluster) gpuFaultAt(kind FaultKind, node, gpu int, s float64) (*activeFault, bool) {
	for i := range c.faults {
		f := &c.faults[i]
		if f.kind == kind && f.hitsGPU(node, gpu) && f.activeAt(s) {
			return f, true
		}
	}
	return nil, false
}

// nodeRemovedAt reports whether node has left the cluster at s.
func (c *Cluster) nodeRemovedAt(node int, s float64) bool {
	return c.permanentFaultAt(FaultNodeRemoved, node, s)
}

// nodeFaultAt returns the first fault of kind that holds node at s.
func (c *Cluster) nodeFaultAt(kind FaultKind, node int, s float64) (*activeFault, bool) {
	for i := range c.faults {
		f := &c.faults[i]
		if f.kind == kind && f.node == node && f.activeAt(s) {
			return f, true
		}
	}
	return nil, false
}

// nodeDownAt reports whether node is down at s.
func (c *Cluster) nodeDownAt(node int, s float64) bool {
	for i := range c.faults {
		f := &c.faults[i]
		switch {
		case f.kind == FaultNodeDown && f.node == node && f.activeAt(s):
			return true
		case f.kind == FaultMaintenanceReboot && f.node == node && s >= f.start+maintenanceDrain && s < f.end-maintenanceDrain:
			return true
		}
	}
	return false
}

// maintenanceDrain is how long a maintenance reboot's node is cordoned
// before it goes down, and up again before it is uncordoned.
const maintenanceDrain = 60.0

// nodeCordonedAt reports whether node is cordoned (unschedulable) at s.
func (c *Cluster) nodeCordonedAt(node int, s float64) bool {
	for i := range c.faults {
		if f := &c.faults[i]; f.kind == FaultMaintenanceReboot && f.node == node && f.activeAt(s) {
			return true
		}
	}
	return false
}

// jobFaultActive reports whether a job-level fault of kind is active at s on
// any node of the job.
func (c *Cluster) jobFaultActive(kind FaultKind, j *jobSlot, s float64) bool {
	for i := range c.faults {
		f := &c.faults[i]
		if f.kind == kind && f.node >= j.firstNode && f.node < j.firstNode+j.size && f.activeAt(s) {
			return true
		}
	}
	return false
}

// jobStalledAt: a job stops iterating while any of its nodes has a
// training_stall fault or is down (the collective waits for the lost rank),
// or a slow start holds its first step.
func (c *Cluster) jobStalledAt(j *jobSlot, s float64) bool {
	for i := range c.faults {
		if f := &c.faults[i]; f.holdsJob(j) && f.activeAt(s) {
			return true
		}
	}
	return false
}

// holdsJob reports whether fault f stops job j's iterations while it
// lasts: a training_stall or node_down on one of its nodes, or a
// training_slow_start on one of its nodes that j started in.
func (f *activeFault) holdsJob(j *jobSlot) bool {
	if f.node < j.firstNode || f.node >= j.firstNode+j.size {
		return false
	}
	switch f.kind {
	case FaultTrainingStall, FaultNodeDown:
		return true
	case FaultTrainingSlowStart:
		return j.start >= f.start && j.start < f.end
	case FaultTrainingPause:
		return j.start < f.start
	}
	return false
}

// jobStallCause returns the kind of the first fault that holds job j at s
// (jobStalledAt must be true).
func (c *Cluster) jobStallCause(j *jobSlot, s float64) FaultKind {
	for i := range c.faults {
		if f := &c.faults[i]; f.holdsJob(j) && f.activeAt(s) {
			return f.kind
		}
	}
	return ""
}

// stalledTime returns how long job j was stalled within [a, b).
func (c *Cluster) stalledTime(j *jobSlot, a, b float64) float64 {
	if b <= a || len(c.faults) == 0 {
		return 0
	}
	var buf [16][2]float64
	iv := buf[:0]
	for i := range c.faults {
		f := &c.faults[i]
		if !f.holdsJob(j) {
			continue
		}
		lo, hi := max(f.start, a), min(f.end, b)
		if hi > lo {
			iv = append(iv, [2]float64{lo, hi})
		}
	}
	return unionLength(iv)
}

// unionLength sums the length of the union of intervals (sorted in place).
func unionLength(iv [][2]float64) float64 {
	if len(iv) == 0 {
		return 0
	}
	sort.Slice(iv, func(i, k int) bool { return iv[i][0] < iv[k][0] })
	total := 0.0
	cs, ce := iv[0][0], iv[0][1]
	for _, x := range iv[1:] {
		if x[0] > ce {
			total += ce - cs
			cs, ce = x[0], x[1]
		} else if x[1] > ce {
			ce = x[1]
		}
	}
	return total + ce - cs
}

// upgradedAt reports whether the node's dcgm-exporter names the host label
// `hostname` at s (4.9 does too).
func (c *Cluster) upgradedAt(node int, s float64) bool {
	return c.permanentFaultAt(FaultExporterUpgrade, node, s) || c.permanentFaultAt(FaultExporterUpgrade49, node, s)
}

// upgraded49At reports whether the node runs dcgm-exporter 4.9 at s.
func (c *Cluster) upgraded49At(node int, s float64) bool {
	return c.permanentFaultAt(FaultExporterUpgrade49, node, s)
}

// driverUpgradedAt reports whether the node runs UpgradedDriverVersion at s.
func (c *Cluster) driverUpgradedAt(node int, s float64) bool {
	return c.permanentFaultAt(FaultDriverUpgrade, node, s)
}

func (c *Cluster) permanentFaultAt(kind FaultKind, node int, s float64) bool {
	for i := range c.faults {
		f := &c.faults[i]
		if f.kind == kind && f.node == node && s >= f.start {
			return true
		}
	}
	return false
}

// hbmExcessWeight is how far (0..1) the memory temperature of (node, gpu)
// has moved towards hbmOverheatTemp at s: a first-order lag with time
// constant tauHBM while an hbm_overheat fault lasts, relaxing after it.
func (c *Cluster) hbmExcessWeight(node, gpu int, s float64) float64 {
	w := 0.0
	for i := range c.faults {
		f := &c.faults[i]
		if f.kind != FaultHBMOverheat || !f.hitsGPU(node, gpu) || s < f.start {
			continue
		}
		on := math.Min(s, f.end) - f.start
		x := 1 - math.Exp(-on/tauHBM)
		if s > f.end {
			x *= math.Exp(-(s - f.end) / tauHBM)
		}
		w = math.Max(w, x)
	}
	return w
}

// exporterRestartsBefore counts the node's exporter restarts that ended
// by s (each gives the exporter pod a new address).
func (c *Cluster) exporterRestartsBefore(node int, s float64) int {
	n := 0
	for i := range c.faults {
		if f := &c.faults[i]; f.kind == FaultExporterRestart && f.node == node && s >= f.end {
			n++
		}
	}
	return n
}
