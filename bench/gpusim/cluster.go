package gpusim

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Config describes a simulated cluster. Two Cluster values built from equal
// Configs produce identical series and values for any instant.
type Config struct {
	// Name is the cluster name, sent as the `cluster` external label.
	Name string
	// Nodes is the number of GPU nodes (default 128).
	Nodes int
	// GPUsPerNode is 1..8 (default 8, an HGX H100 board).
	GPUsPerNode int
	// Seed selects the cluster: jobs, GPU identities, weak GPUs, noise.
	Seed uint64
	// Epoch anchors counters and job windows (default 2026-01-01T00:00:00Z).
	// Counters count from the epoch (plus a per-device value "since boot");
	// before it the cluster's counters stay at those base values except
	// energy and CPU time, which integrate idle power/time backwards.
	Epoch time.Time
	// Faults are injected at FaultOrigin + Fault.At (default FaultOrigin: Epoch).
	Faults      []Fault
	FaultOrigin time.Time
	// TargetLabels adds `job` and `instance` to every series and emits `up`
	// per target, as the scraping Prometheus would. Use it when the simulator
	// writes remote-write directly; leave it off for /metrics pages (the real
	// Prometheus adds them).
	TargetLabels bool
	// XidsPerGPUYear is the rate of background Xid events per GPU and year
	// (default 0.02; negative disables). The Xid gauge keeps its last code
	// forever, so after months a few percent of GPUs show a stale non-zero
	// Xid, as real fleets do.
	XidsPerGPUYear float64
	// NodeCPUs is how many logical CPUs node_cpu_seconds_total reports per
	// node (8 modes each). 0: 4, a small shape that keeps tests and the
	// benchmarks of bench/RESULTS.md cheap and comparable; a real 8-GPU
	// server has HGXNodeCPUs, which the gpusim command simulates by default
	// and whose 1,792 CPU series dominate a node's series count.
	NodeCPUs int
	// GPUModel is ModelH100 (default), ModelB200 or ModelA100: model name, memory,
	// power, clocks and the NVLink generation (which NVLink error fields
	// dcgm-exporter has to export).
	GPUModel string
	// RecoveryActionField names DCGM field 1523 as the counters CSV does:
	// RecoveryActionFieldDCGM45 (default, what dcgm-exporter 4.5.3-4.8.2
	// accepts) or RecoveryActionFieldDCGM46.
	RecoveryActionField string
	// XIDCountWindow is dcgm-exporter's --xid-count-window-size, the window
	// of DCGM_EXP_XID_ERRORS_COUNT (default 5 minutes, as the exporter's).
	XIDCountWindow time.Duration
	// Counters is the exporter's counters CSV: CountersGpustore (default,
	// deploy/kubernetes/dcgm-exporter/dcgm-metrics.csv) or CountersDefault
	// (dcgm-exporter's own etc/default-counters.csv: no ECC counters, no
	// per-code Xid count, no recovery action, no clock event reasons; the
	// last-Xid gauge and the remapped-row counters are all it has of errors).
	Counters string
}

// The counters CSVs Config.Counters names.
const (
	CountersGpustore = "gpustore"
	CountersDefault  = "default"
)

// HGXNodeCPUs is the logical CPU count of an 8-GPU HGX H100 server (DGX
// H100: two 56-core Xeon Platinum 8480C with SMT).
const HGXNodeCPUs = 2 * 56 * 2

// DefaultEpoch is Config.Epoch's default.
var DefaultEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func (cfg *Config) setDefaults() error {
	if cfg.Name == "" {
		cfg.Name = "gpu-cluster-prod-01"
	}
	if cfg.Nodes == 0 {
		cfg.Nodes = 128
	}
	if cfg.GPUsPerNode == 0 {
		cfg.GPUsPerNode = 8
	}
	if cfg.Epoch.IsZero() {
		cfg.Epoch = DefaultEpoch
	}
	if cfg.FaultOrigin.IsZero() {
		cfg.FaultOrigin = cfg.Epoch
	}
	if cfg.XidsPerGPUYear == 0 {
		cfg.XidsPerGPUYear = 0.02
	}
	if cfg.NodeCPUs == 0 {
		cfg.NodeCPUs = 4
	}
	if cfg.GPUModel == "" {
		cfg.GPUModel = ModelH100
	}
	switch cfg.Counters {
	case "":
		cfg.Counters = CountersGpustore
	case CountersGpustore, CountersDefault:
	default:
		return fmt.Errorf("counters %q: want %q or %q", cfg.Counters, CountersGpustore, CountersDefault)
	}
	if cfg.RecoveryActionField == "" {
		cfg.RecoveryActionField = RecoveryActionFieldDCGM45
	}
	if cfg.XIDCountWindow == 0 {
		cfg.XIDCountWindow = 5 * time.Minute
	}
	if _, err := lookupHardware(cfg.GPUModel); err != nil {
		return err
	}
	if cfg.RecoveryActionField != RecoveryActionFieldDCGM45 && cfg.RecoveryActionField != RecoveryActionFieldDCGM46 {
		return fmt.Errorf("recovery action field %q: want %s (DCGM <= 4.5) or %s (DCGM >= 4.6)", cfg.RecoveryActionField, RecoveryActionFieldDCGM45, RecoveryActionFieldDCGM46)
	}
	if cfg.XIDCountWindow < time.Second {
		return fmt.Errorf("xid count window %s: want at least 1s", cfg.XIDCountWindow)
	}
	switch {
	case cfg.Nodes < 1 || cfg.Nodes > 100000:
		return fmt.Errorf("nodes %d out of range 1..100000", cfg.Nodes)
	case cfg.GPUsPerNode < 1 || cfg.GPUsPerNode > len(pciBusIDs):
		return fmt.Errorf("gpus per node %d out of range 1..%d", cfg.GPUsPerNode, len(pciBusIDs))
	case cfg.NodeCPUs < 1 || cfg.NodeCPUs > 1024:
		return fmt.Errorf("node cpus %d out of range 1..1024", cfg.NodeCPUs)
	}
	return nil
}

// Constants of the node model; the GPU's own are in hardware (GPUModel).
const (
	driverVersion = "570.133.20"
	tauTemp       = 50.0 // s, die temperature time constant
	overheatTemp  = 92.5
	throttleShare = 0.45 // HW power brake: power capped at this share of TDP
	// HBM: runs a few degrees hotter or cooler than 0.88 × die + 9 °C by
	// GPU (hbmOffset); an hbm_overheat fault drives it towards
	// hbmOverheatTemp with its own time constant.
	hbmOverheatTemp = 98.0
	tauHBM          = 40.0 // s
	memTotalBytes   = 2164663517184.0
)

// UpgradedDriverVersion is the driver of a node after a driver_upgrade fault.
const UpgradedDriverVersion = "580.82.07"

var pciBusIDs = [...]string{"00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0", "00000000:5D:00.0", "00000000:9A:00.0", "00000000:AB:00.0", "00000000:BA:00.0", "00000000:DB:00.0"}

// Clock throttle reason bits (NVML nvmlClocksThrottleReason*).
const (
	ThrottleGPUIdle      = 0x1
	ThrottleAppClocks    = 0x2
	ThrottleSWPowerCap   = 0x4
	ThrottleHWSlowdown   = 0x8
	ThrottleSyncBoost    = 0x10
	ThrottleSWThermal    = 0x20
	ThrottleHWThermal    = 0x40
	ThrottleHWPowerBrake = 0x80
	// The masks NVML reports for the two throttle faults: an external power
	// brake asserts HW slowdown and HW power brake (0x88), a board thermal
	// event HW slowdown and HW thermal slowdown (0x48).
	throttlePowerBrakeMask = ThrottleHWSlowdown | ThrottleHWPowerBrake
	throttleThermalMask    = ThrottleHWSlowdown | ThrottleHWThermal
)

// Cluster is the simulated cluster. It is not safe for concurrent use.
type Cluster struct {
	cfg      Config
	hw       *hardware
	famRecov int // the recovery-action family this cluster emits
	// v49 is set while a node running dcgm-exporter 4.9 emits its GPUs.
	v49 bool
	// famOff marks the DCGM families its counters CSV leaves out (indexed by
	// family ID); nil: none.
	famOff      []bool
	xidWinLabel string // window_size_in_ms of DCGM_EXP_XID_ERRORS_COUNT
	seed        uint64
	groups      []group
	nodes       []*node
	hostIndex   map[string]int
	faults      []activeFault
	jobs        map[jobKey]*jobInfo
	stepSeq     int64
	cset        seriesSet
	em          emitter
	last        time.Time
	stepped     bool
	bp          []float64 // breakpoint scratch
	// nodeScratch holds stepNode's node step now and at the start of an
	// exporter hang (kept here: on the stack they would escape).
	nodeScratch [2]nodeStep
	slotBuf     []jobSlot
	// jobEnders are the faults that end the job on their node (sorted by
	// start): see endsJob.
	jobEnders []activeFault
	// resetBase and thermalMemo memoise pure functions of time that are
	// costly to recompute: counters at a GPU reset, and the seconds a GPU
	// spent in SW thermal slowdown around its thermal faults.
	resetBase   map[resetKey]gpuCounters
	thermalMemo map[int][]thermalSpan
}

type gpu struct {
	idx                           int
	id                            uint64
	labels                        []Label // static dcgm-exporter labels
	pIdle, scale, ambient, kTherm float64
	e0, corrRows0, nvlScale       float64
	hbmOffset                     float64
	sbe, pcie, crc, xid           eventProc
}

// nodeCum caches a node's sums over the whole windows before k.
type nodeCum struct {
	valid bool
	k     int64 // windows before k are summed
	jobSums
}

// jobSums are a node's integrals over its jobs since the epoch: busy
// seconds, intensity-weighted busy seconds, multi-node busy seconds, and
// per GPU the seconds spent at the SW power cap.
type jobSums struct {
	busy, inten, multi float64
	powerCap           [8]float64
}

type node struct {
	idx         int
	hostname    string
	instDCGM    string // the exporter's address now (changes when its pod is replaced)
	instDCGM0   string // its first address
	restarts    int    // exporter restarts so far
	instNode    string
	instKubelet string
	instTrain   []string // per local rank: the training process' metrics port
	uptime0     float64  // seconds the node had been up at the epoch
	gpus        []gpu
	xidCode     []int        // per GPU, the last Xid at the last step
	gone        []bool       // per GPU, fallen off the bus or in reset at the last step
	mig         []bool       // per GPU, in MIG mode at the last step
	xidWin      [][]xidCount // per GPU, the Xids within the count window
	upgraded    bool         // dcgm-exporter names the host label `hostname`
	newDriver   bool         // the node runs UpgradedDriverVersion
	v49         bool         // the node runs dcgm-exporter 4.9 (its names and units)
	cum         nodeCum
	set         seriesSet
	rootPhase   float64
	raidBase    float64
	overlayMnt  string
	sysPods     [2]string
	hostIP      string
	nodeInfo    [10]Label       // kube_node_info's labels
	netDrop     [2][2]eventProc // [device][rx, tx]
	cpuFactor   []float64
}

// New builds a cluster.
func New(cfg Config) (*Cluster, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("gpusim config: %w", err)
	}
	c := &Cluster{cfg: cfg, seed: mix(cfg.Seed ^ 0x67707573696d), hostIndex: map[string]int{}, jobs: map[jobKey]*jobInfo{},
		resetBase: map[resetKey]gpuCounters{}, thermalMemo: map[int][]thermalSpan{}}
	c.hw, _ = lookupHardware(cfg.GPUModel) // checked by setDefaults
	c.famRecov = FamGetGPURecoveryAction
	if cfg.RecoveryActionField == RecoveryActionFieldDCGM46 {
		c.famRecov = FamGPURecoveryAction
	}
	if cfg.Counters == CountersDefault {
		c.famOff = defaultCountersOff()
	}
	c.xidWinLabel = strconv.FormatInt(cfg.XIDCountWindow.Milliseconds(), 10)
	c.em.target = cfg.TargetLabels
	c.initGroups()
	for i := 0; i < cfg.Nodes; i++ {
		c.nodes = append(c.nodes, c.newNode(i))
		c.hostIndex[c.nodes[i].hostname] = i
	}
	if err := c.resolveFaults(cfg.Faults); err != nil {
		return nil, fmt.Errorf("gpusim faults: %w", err)
	}
	return c, nil
}

func (c *Cluster) newNode(i int) *node {
	hn := fmt.Sprintf("gpu-node-%03d", i+1)
	nh := h3(c.seed, saltNode, uint64(i))
	r := func(k uint64) float64 { return unit(h2(nh, k)) }
	n := &node{
		idx: i, hostname: hn,
		instDCGM: hn + ":9400", instDCGM0: hn + ":9400", instNode: hn + ":9100", instKubelet: hn + ":10250",
		uptime0:    (20 + 180*r(1)) * 86400,
		rootPhase:  r(2),
		raidBase:   0.7 + 0.15*r(3),
		overlayMnt: fmt.Sprintf("/run/containerd/io.containerd.runtime.v2.task/k8s.io/%016x/rootfs", h2(nh, 4)),
		sysPods:    [2]string{"nvidia-dcgm-exporter-" + podSuffix(h2(nh, 5)), "node-exporter-" + podSuffix(h2(nh, 6))},
		hostIP:     fmt.Sprintf("10.0.%d.%d", 1+i/250, 1+i%250),
	}
	n.nodeInfo = c.nodeInfoLabels(n)
	for g := 0; g < c.cfg.GPUsPerNode; g++ {
		n.instTrain = append(n.instTrain, fmt.Sprintf("%s:%d", hn, 9090+g))
	}
	for cpu := 0; cpu < c.cfg.NodeCPUs; cpu++ {
		n.cpuFactor = append(n.cpuFactor, 0.8+0.5*unit(h3(nh, 7, uint64(cpu))))
	}
	// A few nodes have a flaky RoCE port or a busy management NIC.
	for d := 0; d < 2; d++ {
		for dir := 0; dir < 2; dir++ {
			mean := 0.0
			if u := unit(h4(nh, 8, uint64(d), uint64(dir))); (d == 1 && u < 0.10) || (d == 0 && u < 0.05) {
				mean = 3600 * (1 + 5*unit(h4(nh, 9, uint64(d), uint64(dir))))
			}
			n.netDrop[d][dir] = newEventProc(h4(nh, 10, uint64(d), uint64(dir)), mean, 40, nil)
		}
	}
	xidMean := 0.0
	if c.cfg.XidsPerGPUYear > 0 {
		xidMean = 365 * 86400 / c.cfg.XidsPerGPUYear
	}
	for g := 0; g < c.cfg.GPUsPerNode; g++ {
		id := h3(c.seed, saltGPU, uint64(i*8+g))
		gr := func(k uint64) float64 { return unit(h2(id, k)) }
		u := h2(id, 100)
		uuid := fmt.Sprintf("GPU-%08x-%04x-%04x-%04x-%012x", uint32(u), uint16(u>>32), uint16(u>>48), uint16(id), h2(id, 101)&0xffffffffffff)
		gp := gpu{
			idx: g, id: id,
			labels: []Label{
				{"gpu", itoa(g)}, {"UUID", uuid}, {"pci_bus_id", pciBusIDs[g]}, {"device", "nvidia" + itoa(g)},
				{"modelName", c.hw.name}, {"Hostname", hn}, {"DCGM_FI_DRIVER_VERSION", driverVersion},
			},
			pIdle:     62 + 16*gr(1),
			scale:     0.96 + 0.08*gr(2),
			ambient:   24 + 5*gr(3) + 0.6*float64(g%4), // GPUs further down the airflow run warmer
			kTherm:    0.056 + 0.01*gr(4),
			nvlScale:  0.97 + 0.06*gr(5),
			hbmOffset: -2 + 5*gr(17),
		}
		gp.e0 = n.uptime0 * (250 + 150*gr(6)) * 1000
		if gr(8) < 0.05 {
			gp.corrRows0 = float64(1 + h2(id, 9)%3)
		}
		// Weak GPUs: a few percent show correctable ECC errors, PCIe replays or
		// NVLink CRC errors now and then; most never do.
		sbeMean, pcieMean, crcMean := 0.0, 0.0, 0.0
		if gr(10) < 0.03 {
			sbeMean = 3 * 3600
		}
		if gr(11) < 0.08 {
			pcieMean = 8 * 3600
		}
		if gr(12) < 0.05 {
			crcMean = 4 * 3600
		}
		gp.sbe = newEventProc(h2(id, 13), sbeMean, 4, nil)
		gp.pcie = newEventProc(h2(id, 14), pcieMean, 3, nil)
		gp.crc = newEventProc(h2(id, 15), crcMean, 30, nil)
		gp.xid = newEventProc(h2(id, 16), xidMean, 1, backgroundXids)
		n.gpus = append(n.gpus, gp)
	}
	n.xidCode = make([]int, len(n.gpus))
	n.gone = make([]bool, len(n.gpus))
	n.mig = make([]bool, len(n.gpus))
	n.xidWin = make([][]xidCount, len(n.gpus))
	return n
}

// Name returns the cluster name.
func (c *Cluster) Name() string { return c.cfg.Name }

// Config returns the effective configuration (defaults applied).
func (c *Cluster) Config() Config { return c.cfg }

// Hostnames returns the node hostnames in index order.
func (c *Cluster) Hostnames() []string {
	out := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = n.hostname
	}
	return out
}

// NodeDown reports whether node i is down (node_down fault) at t.
func (c *Cluster) NodeDown(i int, t time.Time) bool { return c.nodeDownAt(i, c.secs(t)) }

func (c *Cluster) secs(t time.Time) float64 { return t.Sub(c.cfg.Epoch).Seconds() }

// ErrUnknownNode is returned for a node that does not exist.
var ErrUnknownNode = errors.New("unknown node")

// Step computes the state of every node and the cluster scope at t. Calling
// it again with the same t is free.
func (c *Cluster) Step(t time.Time) {
	if c.stepped && t.Equal(c.last) {
		return
	}
	c.stepSeq++
	s, tms := c.secs(t), t.UnixMilli()
	for _, n := range c.nodes {
		c.stepNode(n, s, tms)
	}
	c.stepClusterScope(s)
	c.pruneJobs()
	c.last, c.stepped = t, true
}

// StepNode computes one node's state at t (for per-node pages). The next
// Step recomputes everything.
func (c *Cluster) StepNode(i int, t time.Time) error {
	if i < 0 || i >= len(c.nodes) {
		return fmt.Errorf("step node %d: %w", i, ErrUnknownNode)
	}
	c.stepSeq++
	c.stepNode(c.nodes[i], c.secs(t), t.UnixMilli())
	c.pruneJobs()
	c.stepped = false
	return nil
}

// StepClusterScope computes the cluster-scope series (kube-state-metrics, up) at t.
func (c *Cluster) StepClusterScope(t time.Time) {
	c.stepSeq++
	c.stepClusterScope(c.secs(t))
	c.stepped = false
}

// SeriesCount returns the number of series of the last step.
func (c *Cluster) SeriesCount() int {
	n := c.cset.count()
	for _, nd := range c.nodes {
		n += nd.set.count()
	}
	return n
}

// AppendSamples steps to t and appends one sample per active series, as
// replica r would scrape them: timestamps are t+r.Offset, continuous gauges
// get r's jitter, everything else is identical across replicas.
func (c *Cluster) AppendSamples(buf []Series, t time.Time, r Replica) []Series {
	c.Step(t)
	ts := t.Add(r.Offset).UnixMilli()
	seed := h2(strHash(r.Name), uint64(t.UnixMilli()))
	for _, n := range c.nodes {
		buf = appendSet(buf, &n.set, ts, r.Jitter, seed)
	}
	return appendSet(buf, &c.cset, ts, r.Jitter, seed)
}

func appendSet(buf []Series, set *seriesSet, ts int64, jitter float64, seed uint64) []Series {
	for f := range set.fams {
		fs := &set.fams[f]
		d := &Catalogue[f]
		jit := jitter > 0 && d.Jitter
		for i := range fs.vals {
			v := fs.vals[i]
			if jit {
				v *= 1 + jitter*sym(h2(seed, fs.slots[i].id))
			}
			buf = append(buf, Series{Labels: fs.slots[i].labels, Desc: d, T: ts, V: v})
		}
	}
	return buf
}

// ---- node model ----

// Phases of a GPU within the training step cycle.
type phase uint8

const (
	phIdle phase = iota
	phCompute
	phComm
	phCheckpoint
	phStall // a hung collective: kernels spin at 100 %
	phLoad  // waiting on data or a checkpoint load: GPUs idle, the job's memory held
)

// nodeStep is what every GPU of a node shares at one instant.
type nodeStep struct {
	job      *jobInfo
	local    int // node's index within the job
	phase    phase
	stalled  bool
	nanLoss  bool
	count    float64
	sum      float64
	cycles   float64
	stepIdx  int
	jobSums  // the node's job integrals up to now
	sinceJob float64
}

// exporterAddress sets the node's dcgm-exporter address at s: a new one
// after each restart (the replacement pod's).
func (c *Cluster) exporterAddress(n *node, s float64) {
	if r := c.exporterRestartsBefore(n.idx, s); r != n.restarts {
		n.restarts = r
		n.instDCGM = n.instDCGM0
		if r > 0 {
			n.instDCGM = strings.TrimSuffix(n.instDCGM0, ":9400") + "-" + strconv.Itoa(r) + ":9400"
		}
	}
}

func (c *Cluster) stepNode(n *node, s float64, tms int64) {
	down := c.nodeDownAt(n.idx, s) || c.nodeRemovedAt(n.idx, s)
	var key uint64
	st := &c.nodeScratch[0]
	*st = nodeStep{}
	if down {
		key = 2
	} else {
		key = c.nodeJobAt(n, st, s)
	}
	// What dcgm-exporter shows: the node's GPUs now, none while it has
	// crashed, or their state at the start of a host-engine hang.
	dcgm := dcgmView{st: st, s: s, tms: tms}
	c.exporterAddress(n, s)
	key = h2(key, uint64(16+n.restarts))
	if _, crashed := c.nodeFaultAt(FaultExporterCrash, n.idx, s); crashed {
		dcgm.st = nil
		key = h2(key, 6)
	} else if _, restarting := c.nodeFaultAt(FaultExporterRestart, n.idx, s); restarting {
		dcgm.st = nil
		key = h2(key, 9)
	} else if f, hung := c.nodeFaultAt(FaultExporterHung, n.idx, s); hung && !down {
		dcgm.s = f.start
		dcgm.tms = c.cfg.Epoch.UnixMilli() + int64(math.Round(f.start*1000))
		dcgm.st = &c.nodeScratch[1]
		*dcgm.st = nodeStep{}
		key = h3(key, 7, c.nodeJobAt(n, dcgm.st, dcgm.s))
	}
	if !down && dcgm.st != nil {
		// Label sets also change with each GPU's Xid (err_code/err_msg), a
		// GPU that fell off the bus, an exporter and a driver upgrade.
		n.upgraded = c.upgradedAt(n.idx, dcgm.s)
		if n.upgraded {
			key = h2(key, 4)
		}
		n.newDriver = c.driverUpgradedAt(n.idx, dcgm.s)
		if n.newDriver {
			key = h2(key, 5)
		}
		n.v49 = c.upgraded49At(n.idx, dcgm.s)
		if n.v49 {
			key = h2(key, 8)
		}
		for gi := range n.gpus {
			key = h3(key, uint64(gi), c.gpuLabelState(n, gi, dcgm.s))
		}
	}
	e := &c.em
	e.begin(&n.set, key)
	if !down {
		st.jobSums = c.nodeCumAt(n, s)
		if st.job != nil {
			c.jobProgress(st, s)
		}
		if dcgm.st != nil && dcgm.st != st {
			dcgm.st.jobSums = c.nodeCumAt(n, dcgm.s)
			if dcgm.st.job != nil {
				c.jobProgress(dcgm.st, dcgm.s)
			}
		}
		c.emitNode(e, n, st, dcgm, s, tms)
	}
	e.end()
}

// dcgmView is the instant dcgm-exporter reports a node's GPUs at: st and s
// (tms in ms) are the node's step now, or at the start of a host-engine
// hang; st is nil while the exporter is down.
type dcgmView struct {
	st  *nodeStep
	s   float64
	tms int64
}

// nodeJobAt sets st's job (the one running on node n at s, if any) and
// returns the part of the node's series key it decides.
func (c *Cluster) nodeJobAt(n *node, st *nodeStep, s float64) uint64 {
	j := c.slotOf(n.idx, c.groups[n.idx/groupSize].window(s))
	if !j.running(s) {
		return 1
	}
	st.job = c.jobInfo(&j)
	st.local = n.idx - j.firstNode
	return h2(j.id, 3)
}

// jobProgress places the node's job in its step cycle at s.
func (c *Cluster) jobProgress(st *nodeStep, s float64) {
	ji := st.job
	st.sinceJob = s - ji.start
	st.stalled = c.jobStalledAt(&ji.jobSlot, s)
	st.nanLoss = c.jobFaultActive(FaultNaNLoss, &ji.jobSlot, s)
	eff := st.sinceJob - c.stalledTime(&ji.jobSlot, ji.start, s)
	st.count, st.sum, st.cycles, st.stepIdx = ji.iterations(eff)
	if st.stalled {
		// What the GPUs do while no step completes depends on why: only
		// a hung collective spins them at 100 %; a job loading its data or
		// a checkpoint (a slow start) leaves them idle; a checkpoint or
		// evaluation pause of a running job writes its state to the host.
		switch c.jobStallCause(&ji.jobSlot, s) {
		case FaultTrainingSlowStart:
			st.phase = phLoad
		case FaultTrainingPause:
			st.phase = phCheckpoint
		default:
			st.phase = phStall
		}
		return
	}
	off := eff - st.cycles*ji.cycle - ji.prefix[st.stepIdx] // time into the current step
	d := ji.dur[st.stepIdx]
	switch {
	case st.stepIdx == cycleLen-1 && off >= ji.stepT:
		st.phase = phCheckpoint
	case off < ji.computeFrac*math.Min(d, ji.stepT):
		st.phase = phCompute
	default:
		st.phase = phComm
	}
}

// nodeCumAt returns the node's job integrals since the epoch (jobSums),
// summing whole windows once (cached) and the current window's part on each
// call.
func (c *Cluster) nodeCumAt(n *node, s float64) jobSums {
	if s <= 0 {
		return jobSums{}
	}
	g := &c.groups[n.idx/groupSize]
	ks := g.window(s)
	cc := &n.cum
	if !cc.valid || cc.k > ks {
		*cc = nodeCum{valid: true, k: g.window(0)}
	}
	for cc.k < ks {
		j := c.slotOf(n.idx, cc.k)
		c.addJob(&cc.jobSums, n, &j, math.Inf(1))
		cc.k++
	}
	j := c.slotOf(n.idx, ks)
	sums := cc.jobSums
	c.addJob(&sums, n, &j, s)
	return sums
}

// addJob adds job j's part up to upto to the node's sums.
func (c *Cluster) addJob(sums *jobSums, n *node, j *jobSlot, upto float64) {
	if j.idle {
		return
	}
	lo, hi := math.Max(j.start, 0), math.Min(j.end, upto)
	d := hi - lo
	if d <= 0 {
		return
	}
	sums.busy += d
	sums.inten += j.intensity * d
	if j.size > 1 {
		sums.multi += d
	}
	for gi := range n.gpus {
		sums.powerCap[gi] += c.powerCapShare(&n.gpus[gi], j) * d
	}
}

// computePower is the GPU's power in the compute phase of job j, and
// whether that is at the SW power cap (NVML's SW power cap reason): the
// phase average is j's mean power with the comm phase at commRatio of it.
func (c *Cluster) computePower(g *gpu, j *jobSlot) (pc, pa float64, capped bool) {
	const commRatio = 0.55
	mean := c.busyMean(g, j)
	pc = mean / (j.computeFrac + commRatio*(1-j.computeFrac))
	pa = commRatio * pc
	if pc > c.hw.pMax {
		pc = c.hw.pMax
		pa = (mean - j.computeFrac*c.hw.pMax) / (1 - j.computeFrac)
	}
	return pc, pa, pc >= 0.97*c.hw.pMax
}

// powerCapShare is the share of job j's running time GPU g spends at its
// power cap: its compute phases when they reach it (checkpoints and
// stalls, a few percent of the time, are not taken out).
func (c *Cluster) powerCapShare(g *gpu, j *jobSlot) float64 {
	if _, _, capped := c.computePower(g, j); capped {
		return j.computeFrac
	}
	return 0
}

func (c *Cluster) busyMean(g *gpu, j *jobSlot) float64 {
	return g.pIdle + j.intensity*g.scale*(c.hw.pMax-g.pIdle)
}
func (g *gpu) stallPower() float64 { return g.pIdle + 115 }

// migPower is a GPU's power in MIG mode: its instances serve inference at
// about a third of the TDP headroom.
func (c *Cluster) migPower(g *gpu) float64 { return g.pIdle + 0.3*(c.hw.pMax-g.pIdle) }

// meanPower returns the GPU's step-cycle-averaged power at x with faults
// (act) and without (base).
func (c *Cluster) meanPower(n *node, gi int, x float64) (act, base float64) {
	gp := &n.gpus[gi]
	j := c.slotOf(n.idx, c.groups[n.idx/groupSize].window(x))
	base = gp.pIdle
	act = base
	if j.running(x) {
		base = c.busyMean(gp, &j)
		act = base
		if c.jobStalledAt(&j, x) {
			act = gp.stallPower()
		}
		if c.gpuFaultActive(FaultIdleAllocation, n.idx, gi, x) {
			act = gp.pIdle // nothing runs on it, not even a hung collective
		}
	}
	if c.gpuFaultActive(FaultMIG, n.idx, gi, x) {
		act = c.migPower(gp)
	}
	if c.gpuFaultActive(FaultThrottle, n.idx, gi, x) {
		act = math.Min(act, throttleShare*c.hw.pMax)
	}
	return act, base
}

func (c *Cluster) powerFault(f *activeFault, node, gi int) bool {
	switch f.kind {
	case FaultThrottle, FaultThrottleThermal, FaultMIG, FaultIdleAllocation:
		return f.hitsGPU(node, gi)
	case FaultTrainingStall, FaultNodeDown, FaultTrainingSlowStart:
		return f.node/groupSize == node/groupSize
	}
	return false
}

func (c *Cluster) tempTarget(n *node, gi int, x float64) float64 {
	if f, ok := c.gpuFaultAt(FaultOverheat, n.idx, gi, x); ok {
		return f.value
	}
	act, _ := c.meanPower(n, gi, x)
	gp := &n.gpus[gi]
	return gp.ambient + gp.kTherm*act
}

// gpuTemp runs a first-order lag (time constant tauTemp) over the
// piecewise-constant temperature target of the last 12 time constants: the
// target changes only at job and fault boundaries, so the filter has a
// closed form per segment, and history older than e^-12 does not matter.
func (c *Cluster) gpuTemp(n *node, gi int, s float64) float64 {
	a := s - 12*tauTemp
	bp := c.bp[:0]
	g := &c.groups[n.idx/groupSize]
	for k := g.window(a); k <= g.window(s); k++ {
		j := c.slotOf(n.idx, k)
		if !j.idle {
			bp = appendIn(bp, j.start, a, s)
			bp = appendIn(bp, j.end, a, s)
		}
	}
	for i := range c.faults {
		f := &c.faults[i]
		if c.powerFault(f, n.idx, gi) || (f.kind == FaultOverheat && f.hitsGPU(n.idx, gi)) {
			bp = appendIn(bp, f.start, a, s)
			bp = appendIn(bp, f.end, a, s)
		}
	}
	bp = append(bp, s)
	sortFloats(bp)
	c.bp = bp
	temp := c.tempTarget(n, gi, a)
	prev := a
	for _, b := range bp {
		if b <= prev {
			continue
		}
		x := c.tempTarget(n, gi, (prev+b)/2)
		temp = x + (temp-x)*math.Exp(-(b-prev)/tauTemp)
		prev = b
	}
	return temp
}

// energyCorr integrates (actual - base) power over the fault intervals that
// change this GPU's power, up to s: the closed-form energy covers the
// fault-free model, this term the faults.
func (c *Cluster) energyCorr(n *node, gi int, s float64) float64 {
	bp := c.bp[:0]
	g := &c.groups[n.idx/groupSize]
	for i := range c.faults {
		f := &c.faults[i]
		if !c.powerFault(f, n.idx, gi) {
			continue
		}
		lo, hi := math.Max(f.start, 0), math.Min(f.end, s)
		if hi <= lo {
			continue
		}
		bp = append(bp, lo, hi)
		for k := g.window(lo); k <= g.window(hi); k++ {
			j := c.slotOf(n.idx, k)
			if !j.idle {
				bp = appendIn(bp, j.start, lo, hi)
				bp = appendIn(bp, j.end, lo, hi)
			}
		}
	}
	if len(bp) == 0 {
		return 0
	}
	sortFloats(bp)
	c.bp = bp
	total := 0.0
	for i := 1; i < len(bp); i++ {
		if bp[i] <= bp[i-1] {
			continue
		}
		act, base := c.meanPower(n, gi, (bp[i-1]+bp[i])/2)
		total += (act - base) * (bp[i] - bp[i-1])
	}
	return total
}

func appendIn(bp []float64, x, a, b float64) []float64 {
	if x > a && x < b {
		return append(bp, x)
	}
	return bp
}

func sortFloats(v []float64) { // insertion sort: a handful of elements
	for i := 1; i < len(v); i++ {
		for k := i; k > 0 && v[k] < v[k-1]; k-- {
			v[k], v[k-1] = v[k-1], v[k]
		}
	}
}

var cpuModes = [...]struct {
	name string
	a, b float64 // share of wall time when idle; change of share when a job runs
}{
	{"idle", 0.962, -0.60}, {"iowait", 0.004, 0.03}, {"irq", 0.001, 0.01}, {"nice", 0.0005, 0},
	{"softirq", 0.0025, 0.03}, {"steal", 0, 0}, {"system", 0.01, 0.09}, {"user", 0.02, 0.44},
}

var netDevices = [...]string{"eth0", "ens9f0np0"} // management NIC, RoCE NIC

func (c *Cluster) emitNode(e *emitter, n *node, st *nodeStep, dcgm dcgmView, s float64, tms int64) {
	for gi := range n.gpus {
		if dcgm.st != nil && !n.gone[gi] {
			c.emitGPU(e, n, gi, dcgm.st, dcgm.s, dcgm.tms)
		}
	}

	// node-exporter. Exporters other than dcgm-exporter name no node in
	// their labels; like kube-prometheus' relabelling (node from the pod's
	// __meta_kubernetes_pod_node_name) we add `node`, which also keeps the
	// whole-cluster page free of duplicate series.
	e.base = append(e.base[:0], Label{"node", n.hostname})
	e.setTarget("node-exporter", n.instNode)
	up := s + n.uptime0
	for cpu := 0; cpu < c.cfg.NodeCPUs; cpu++ {
		f := n.cpuFactor[cpu]
		for _, m := range cpuModes {
			e.add(FamNodeCPUSeconds, round2(m.a*up+m.b*f*st.busy), Label{"cpu", itoa(cpu)}, Label{"mode", m.name})
		}
	}
	nz := func(i uint64) float64 { return sym(h4(c.seed, saltNoise, uint64(n.idx)<<8|0xff, uint64(tms)*64+i)) }
	hostUsed := 38.0 * (1 << 30)
	if st.job != nil {
		hostUsed += st.job.hostMem * memTotalBytes * (1 - math.Exp(-st.sinceJob/120))
	}
	e.add(FamNodeMemAvailable, blocks(memTotalBytes-hostUsed+(1<<28)*nz(1)))
	e.add(FamNodeMemTotal, memTotalBytes)
	rootSize := 1.88e12
	rootAvail := rootSize * (0.65 - 0.2*frac(up/(14*86400)+n.rootPhase)) // logs grow, rotated fortnightly
	raidSize := 30.7e12
	raidAvail := raidSize * n.raidBase
	if st.job != nil {
		raidAvail -= raidSize * 0.3 * math.Min(1, st.sinceJob/(st.job.end-st.job.start)) // checkpoints pile up
	}
	runSize := 0.1 * memTotalBytes
	fs := [...]struct {
		dev, typ, mnt string
		size, avail   float64
	}{
		{"/dev/nvme0n1p2", "ext4", "/", rootSize, rootAvail},
		{"/dev/md0", "ext4", "/raid", raidSize, raidAvail},
		{"tmpfs", "tmpfs", "/run", runSize, runSize - 27*(1<<20)},
		{"overlay", "overlay", n.overlayMnt, rootSize, rootAvail},
	}
	for _, f := range fs {
		l := [...]Label{{"device", f.dev}, {"fstype", f.typ}, {"mountpoint", f.mnt}}
		e.add(FamNodeFSAvail, blocks(f.avail), l[:]...)
		e.add(FamNodeFSSize, blocks(f.size), l[:]...)
	}
	// eth0 streams the dataset; the RoCE NIC carries inter-node collectives.
	rx := [2]float64{2e6*up + 1.8e8*st.busy, 1e4*up + 1.2e10*st.multi}
	tx := [2]float64{8e5*up + 2.5e7*st.busy, 1e4*up + 1.18e10*st.multi}
	for d, dev := range netDevices {
		l := Label{"device", dev}
		rxd, _ := n.netDrop[d][0].at(s)
		txd, _ := n.netDrop[d][1].at(s)
		e.add(FamNodeNetRxBytes, math.Floor(rx[d]), l)
		e.add(FamNodeNetTxBytes, math.Floor(tx[d]), l)
		e.add(FamNodeNetRxDrop, rxd, l)
		e.add(FamNodeNetTxDrop, txd, l)
	}

	// cAdvisor
	e.setTarget("kubelet", n.instKubelet)
	sys := [...]struct {
		ns, pod, ctr, img string
		cores, mem        float64
	}{
		{"gpu-operator", n.sysPods[0], "nvidia-dcgm-exporter", "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04", 0.08, 380 << 20},
		{"monitoring", n.sysPods[1], "node-exporter", "quay.io/prometheus/node-exporter:v1.8.2", 0.015, 28 << 20},
	}
	for i, p := range sys {
		l := [...]Label{{"container", p.ctr}, {"image", p.img}, {"namespace", p.ns}, {"pod", p.pod}}
		e.add(FamContainerCPU, round2(p.cores*up), l[:]...)
		e.add(FamContainerMemWorkingSet, blocks(p.mem*(1+0.05*nz(uint64(10+i)))), l[:]...)
		e.add(FamContainerOOMEvents, 0, l[:]...)
	}
	if st.job != nil {
		ji := st.job
		l := [...]Label{{"container", "pytorch"}, {"image", "nvcr.io/nvidia/pytorch:24.12-py3"}, {"namespace", "training"}, {"pod", ji.pods[st.local]}}
		e.add(FamContainerCPU, round2(ji.cpuCores*st.sinceJob), l[:]...)
		e.add(FamContainerMemWorkingSet, blocks(ji.hostMem*memTotalBytes*(1-math.Exp(-st.sinceJob/120))*(1+0.01*nz(20))), l[:]...)
		e.add(FamContainerOOMEvents, 0, l[:]...)
		c.emitTraining(e, n, st)
	}
}

// emitTraining emits the §6 training metrics of the node's ranks.
func (c *Cluster) emitTraining(e *emitter, n *node, st *nodeStep) {
	ji := st.job
	m := &models[ji.model]
	e.base = e.base[:0]
	steps := ji.stepOff + st.count
	// The last completed step sets the gauges; they freeze while stalled
	// because no step completes (the Python process blocks in a collective).
	lastIdx := (st.stepIdx + cycleLen - 1) % cycleLen
	lastDur := ji.dur[lastIdx]
	stepNoise := func(k uint64) float64 { return sym(h4(ji.id, saltStep, uint64(steps), k)) }
	loss := m.lossF + (m.loss0-m.lossF)*math.Pow(1+steps/300, -0.5)
	loss *= 1 + 0.015*stepNoise(1)
	gnorm := (0.18 + 1.6*math.Pow(1+steps/500, -0.5)) * (1 + 0.08*stepNoise(2))
	if unit(h4(ji.id, saltStep, uint64(steps), 3)) < 0.01 {
		gnorm *= 3 // loss spike
	}
	warm := math.Min(1, (steps+1)/1000)
	lr := m.peakLR * warm * (0.1 + 0.9*0.5*(1+math.Cos(math.Pi*math.Min(1, steps/ji.planned))))
	tps := m.tokensPerGPUStep / lastDur
	load := lastDur * (0.03 + 0.02*unit(h4(ji.id, saltStep, uint64(steps), 4)))
	if unit(h4(ji.id, saltStep, uint64(steps), 5)) < 0.02 {
		load *= 8 // a slow shard from the object store
	}
	if st.count == 0 {
		tps, load = 0, 0
	}
	for g := 0; g < c.cfg.GPUsPerNode; g++ {
		rank := st.local*c.cfg.GPUsPerNode + g
		if e.build {
			// pod and container are what the PodMonitor that scrapes the
			// ranks adds; the script itself labels job_name and rank.
			e.base = append(e.base[:0], Label{"job_name", ji.name}, Label{"namespace", "training"}, Label{"rank", ji.rankStrs[rank]}, Label{"Hostname", n.hostname},
				Label{"pod", ji.pods[st.local]}, Label{"container", "pytorch"})
		}
		e.setTarget("training", n.instTrain[g])
		rn := func(k uint64) float64 { return sym(h4(ji.id, saltRank, uint64(rank), uint64(steps)*8+k)) }
		for b := range leValues {
			e.addNamed(FamTrainIterTime, "training_iteration_time_seconds_bucket", st.cycles*float64(ji.le[cycleLen][b])+float64(ji.le[st.stepIdx][b]), Label{"le", leValues[b]})
		}
		e.addNamed(FamTrainIterTime, "training_iteration_time_seconds_sum", st.sum*(1+0.002*float64(rank%8)/8)+c.stragglerExtra(ji, st))
		e.addNamed(FamTrainIterTime, "training_iteration_time_seconds_count", st.count)
		rtps := tps * (1 + 0.004*rn(1))
		e.add(FamTrainTokensPerSecond, rtps)
		l, gn := loss*(1+0.01*rn(2)), gnorm
		if st.nanLoss {
			l, gn = math.NaN(), math.NaN()
		}
		e.add(FamTrainLoss, l)
		e.add(FamTrainGradNorm, gn)
		e.add(FamTrainLearningRate, lr)
		e.add(FamTrainMFU, rtps*6*m.params/peakFLOPS*100)
		e.add(FamTrainDataLoadTime, load*(1+0.05*rn(3)))
	}
}

// stepClusterScope emits kube-state-metrics, the nccl-tests results in the
// Pushgateway and, with TargetLabels, `up`.
func (c *Cluster) stepClusterScope(s float64) {
	// The key covers every pod and job that exists at s: phases change
	// values, not label sets.
	key := uint64(7)
	slots := c.slotBuf[:0]
	for gi := range c.groups {
		k := c.groups[gi].window(s)
		slots = c.appendSlots(c.appendSlots(slots, gi, k-1), gi, k)
	}
	c.slotBuf = slots
	for i := range slots {
		if slots[i].exists(s) {
			key = h2(key, slots[i].id)
		}
	}
	for i := range c.faults { // so do nodes that left the cluster, and exporters being replaced
		switch f := &c.faults[i]; {
		case f.kind == FaultNodeRemoved && s >= f.start:
			key = h3(key, 8, uint64(f.node))
		case f.kind == FaultExporterRestart && s >= f.start:
			key = h3(key, 9, uint64(f.node))
			if f.activeAt(s) {
				key = h2(key, 10)
			}
		}
	}
	e := &c.em
	e.begin(&c.cset, key)
	e.base = e.base[:0]
	e.setTarget("kube-state-metrics", "kube-state-metrics:8080")
	statuses := [...]string{"true", "false", "unknown"}
	for _, n := range c.nodes {
		if c.nodeRemovedAt(n.idx, s) {
			continue
		}
		c.emitNodeInfo(e, n)
		vals := [3]float64{1, 0, 0}
		if c.nodeDownAt(n.idx, s) {
			vals = [3]float64{0, 0, 1} // kubelet stopped posting status
		}
		for i, st := range statuses {
			e.add(FamKubeNodeCondition, vals[i], Label{"condition", "Ready"}, Label{"node", n.hostname}, Label{"status", st})
		}
		cordoned := 0.0
		if c.nodeCordonedAt(n.idx, s) {
			cordoned = 1
		}
		e.add(FamKubeNodeUnschedulable, cordoned, Label{"node", n.hostname})
	}
	phases := [...]string{"Pending", "Running", "Succeeded", "Failed", "Unknown"}
	for i := range slots {
		j := &slots[i]
		if !j.exists(s) {
			continue
		}
		ji := c.jobInfo(j)
		for p := 0; p < j.size; p++ {
			ph := 0
			switch {
			case s < j.start:
				ph = 0
			case s < j.end:
				ph = 1
				if c.nodeDownAt(j.firstNode+p, s) {
					ph = 4
				}
			case j.failed:
				ph = 3
			default:
				ph = 2
			}
			for pi, name := range phases {
				v := 0.0
				if pi == ph {
					v = 1
				}
				e.add(FamKubePodPhase, v, Label{"namespace", "training"}, Label{"phase", name}, Label{"pod", ji.pods[p]})
			}
			c.emitPodObject(e, ji, p)
		}
		// Only a batch Job has kube_job_status_active (= its active pods);
		// the other owners' objects are custom resources.
		if j.kind == ownerBatchJob {
			active := 0.0
			if s < j.end {
				active = float64(j.size)
			}
			e.add(FamKubeJobActive, active, Label{"job_name", ji.name}, Label{"namespace", "training"})
		}
	}
	// Pushed series keep the pushing job's grouping key as their job and
	// instance, one group per block: the Pushgateway exposes them as labels
	// (and its scrape uses honor_labels), target labels or not.
	for gi := range c.groups {
		g := &c.groups[gi]
		e.setTarget("nccl-tests", c.nodes[g.first].hostname)
		nodes, test := Label{"nodes", strconv.Itoa(g.size)}, Label{"test", "all_reduce_perf"}
		if e.target {
			e.add(FamNCCLBandwidth, c.ncclBandwidth(gi, s), nodes, test)
		} else {
			e.add(FamNCCLBandwidth, c.ncclBandwidth(gi, s), nodes, test, Label{"job", "nccl-tests"}, Label{"instance", c.nodes[g.first].hostname})
		}
	}
	if c.cfg.TargetLabels {
		for _, n := range c.nodes {
			if c.nodeRemovedAt(n.idx, s) {
				continue // its targets left service discovery
			}
			v := 1.0
			if c.nodeDownAt(n.idx, s) {
				v = 0
			}
			dcgmUp := v
			if _, crashed := c.nodeFaultAt(FaultExporterCrash, n.idx, s); crashed {
				dcgmUp = 0
			}
			// A restarting exporter has no target (its pod is replaced).
			if _, restarting := c.nodeFaultAt(FaultExporterRestart, n.idx, s); !restarting {
				c.exporterAddress(n, s)
				e.setTarget("dcgm-exporter", n.instDCGM)
				e.add(FamUp, dcgmUp)
			}
			e.setTarget("kubelet", n.instKubelet)
			e.add(FamUp, v)
			// node-exporter's target carries the relabelled `node` (see
			// the node scope), and Prometheus puts a target's labels on
			// its `up` too: NodeUnreachable names the node from it.
			e.setTarget("node-exporter", n.instNode)
			e.add(FamUp, v, Label{"node", n.hostname})
		}
		e.setTarget("kube-state-metrics", "kube-state-metrics:8080")
		e.add(FamUp, 1)
	}
	e.end()
}

// emitNodeInfo writes kube-state-metrics' kube_node_info of node n, with
// the labels kube-state-metrics 2.x gives it.
func (c *Cluster) emitNodeInfo(e *emitter, n *node) {
	e.add(FamKubeNodeInfo, 1, n.nodeInfo[:]...)
}

// nodeInfoLabels are kube_node_info's labels for node n.
func (c *Cluster) nodeInfoLabels(n *node) [10]Label {
	return [10]Label{{"container_runtime_version", "containerd://1.7.27"}, {"internal_ip", n.hostIP},
		{"kernel_version", "5.15.0-139-generic"}, {"kubelet_version", "v1.31.9"}, {"kubeproxy_version", "deprecated"},
		{"node", n.hostname}, {"os_image", "Ubuntu 22.04.5 LTS"}, {"pod_cidr", fmt.Sprintf("10.244.%d.0/24", n.idx%256)},
		{"provider_id", "metal://" + n.hostname}, {"system_uuid", fmt.Sprintf("%08x-0000-4000-8000-%012x", uint32(h2(c.seed, uint64(n.idx))), uint64(n.idx))}}
}

// emitPodObject writes kube-state-metrics' kube_pod_owner and kube_pod_info
// of pod p of job ji: its controller, and the node it is bound to.
func (c *Cluster) emitPodObject(e *emitter, ji *jobInfo, p int) {
	ns, pod, uid := Label{"namespace", "training"}, Label{"pod", ji.pods[p]}, Label{"uid", ji.uids[p]}
	kind := ji.kind.String()
	e.add(FamKubePodOwner, 1, ns, pod, uid, Label{"owner_kind", kind}, Label{"owner_name", ji.name}, Label{"owner_is_controller", "true"})
	n := c.nodes[ji.firstNode+p]
	e.add(FamKubePodInfo, 1, ns, pod, uid, Label{"node", n.hostname}, Label{"host_ip", n.hostIP}, Label{"pod_ip", ji.podIPs[p]},
		Label{"created_by_kind", kind}, Label{"created_by_name", ji.name}, Label{"priority_class", "training"}, Label{"host_network", "false"})
}

func frac(x float64) float64 { return x - math.Floor(x) }

// ncclRunEvery is how often the nccl-tests job runs on every block.
const ncclRunEvery = 3600.0

// ncclBandwidth is the bus bandwidth in Gbit/s the last nccl-tests run on
// block gi pushed before s: ~2,900 across nodes (8 × 400 Gbit/s NICs per
// node, ~90 % of line rate), ~3,700 within one node (NVLink), ±3 % from run
// to run. A run with a node of the block down fails and pushes nothing: the
// Pushgateway keeps the run before it.
func (c *Cluster) ncclBandwidth(gi int, s float64) float64 {
	g := &c.groups[gi]
	base := 2900.0
	if g.size == 1 {
		base = 3700
	}
	k := int64(math.Floor(s / ncclRunEvery))
	for range 2 {
		ok := true
		for n := g.first; n < g.first+g.size; n++ {
			if c.nodeDownAt(n, float64(k)*ncclRunEvery) {
				ok = false
			}
		}
		if ok {
			break
		}
		k--
	}
	return math.Round(base * (1 + 0.03*sym(h4(c.seed, saltNoise, uint64(gi), uint64(k)))))
}

// blocks rounds a byte count down to whole 4 KiB pages, as the kernel reports.
func blocks(b float64) float64 { return math.Floor(b/4096) * 4096 }

func round2(x float64) float64 { return math.Round(x*100) / 100 }
func round6(x float64) float64 { return math.Round(x*1e6) / 1e6 }
