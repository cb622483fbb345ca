package gpusim

import (
	"fmt"
	"math"
)

// Job scheduling as a pure function of time.
//
// Nodes are grouped in blocks of groupSize (a rail-aligned scalable unit:
// jobs never span blocks, so a job's NVLink/RoCE neighbours are its block).
// Each block's timeline is cut into windows of a block-specific length and
// phase. In every window the block is split into job slots (one 8-node job,
// two 4-node jobs, ...), each running one job that is created shortly after
// the window opens, starts after a pending phase (image pull, NCCL init) and
// ends before the window closes. Because a window's jobs depend only on
// (seed, block, window index), the job on any node at any instant is computed
// without history; only integrals over time (energy, busy seconds) are summed
// window by window from the epoch, and those sums are cached.

const (
	groupSize = 8
	// podTTL keeps finished pods (Succeeded/Failed) in kube-state-metrics,
	// like a Job's ttlSecondsAfterFinished.
	podTTL = 300.0
	// idleSlotFraction of job slots stay empty for a window (~88% allocation).
	idleSlotFraction = 0.12
	cycleLen         = 100 // steps per checkpoint cycle
)

var windowLens = [...]float64{2 * 3600, 3 * 3600, 4 * 3600, 6 * 3600, 8 * 3600}

// layouts partition a full block of 8 nodes into job sizes.
var layouts8 = [...][]int{
	{8}, {8}, {4, 4}, {4, 4}, {4, 2, 2}, {2, 2, 4}, {2, 2, 2, 2}, {1, 1, 2, 4}, {4, 1, 1, 1, 1}, {2, 2, 2, 1, 1},
}

type group struct {
	first, size int
	w, phase    float64
	layouts     [][]int // for blocks that are not 8 nodes
}

type modelSpec struct {
	name             string
	params           float64 // (active) parameters, for MFU
	tokensPerGPUStep float64
	mfu              float64 // typical model FLOPs utilisation
	intensity        float64 // busy power as a fraction of (TDP - idle)
	fbFrac           float64 // framebuffer fill
	tensor           float64 // tensor-pipe activity in the compute phase
	loss0, lossF     float64
	peakLR           float64
	pretrain         bool
}

// Step time follows from tokens/GPU/step ÷ (MFU × 989 TFLOPS ÷ 6N), as in the
// source document's MFU formula, so the training metrics agree with each other.
var models = [...]modelSpec{
	{"llama3-70b-pretrain", 70e9, 4096, 0.40, 0.90, 0.955, 0.55, 11.8, 1.75, 1.5e-4, true},
	{"llama3-8b-pretrain", 8e9, 16384, 0.42, 0.86, 0.80, 0.58, 11.8, 2.05, 3e-4, true},
	{"qwen2-72b-sft", 72e9, 4096, 0.36, 0.84, 0.93, 0.50, 1.9, 1.15, 1e-5, false},
	{"mixtral-8x7b-pretrain", 12.9e9, 8192, 0.30, 0.80, 0.88, 0.42, 11.2, 2.0, 2e-4, true},
	{"gpt-1b3-ablation", 1.3e9, 32768, 0.38, 0.70, 0.45, 0.50, 10.9, 2.6, 6e-4, true},
	{"vit-22b-pretrain", 22e9, 8192, 0.44, 0.88, 0.75, 0.60, 6.9, 1.2, 1e-4, true},
	{"bert-large-finetune", 0.34e9, 65536, 0.33, 0.62, 0.35, 0.40, 2.2, 0.45, 2e-5, false},
}

const peakFLOPS = 989e12 // H100 SXM dense BF16, as in the source document

// jobSlot is the numeric description of one job slot in one window. It is
// cheap to compute (no strings) and is recomputed freely.
type jobSlot struct {
	g                   int
	k                   int64
	slot                int
	firstNode, size     int
	idle                bool
	created, start, end float64 // seconds since epoch
	failed              bool
	model               int
	mfu, stepT          float64
	intensity           float64
	fbFrac, computeFrac float64
	tensor, nvlRate     float64
	cpuCores, hostMem   float64
	kind                ownerKind
	id                  uint64
}

// ownerKind is the controller that owns a job's pods, as kube-state-metrics'
// kube_pod_owner reports it.
type ownerKind uint8

// Owners of training pods: a plain (indexed) batch Job, Kubeflow's
// PyTorchJob and MPIJob, a Volcano Job (kind "Job" too, but no batch Job
// behind it, so no kube_job_status_active) and a KubeRay RayCluster.
const (
	ownerBatchJob ownerKind = iota
	ownerPyTorchJob
	ownerMPIJob
	ownerVolcanoJob
	ownerRayCluster
)

// ownerKinds draws a job's owner: about a third PyTorchJob, a quarter
// batch Job, the rest MPIJob, Volcano and Ray.
var ownerKinds = [...]ownerKind{ownerPyTorchJob, ownerPyTorchJob, ownerPyTorchJob, ownerPyTorchJob, ownerBatchJob, ownerBatchJob,
	ownerBatchJob, ownerMPIJob, ownerMPIJob, ownerVolcanoJob, ownerRayCluster}

// String is the owner_kind label (the object's kind, without its group).
func (k ownerKind) String() string {
	switch k {
	case ownerPyTorchJob:
		return "PyTorchJob"
	case ownerMPIJob:
		return "MPIJob"
	case ownerRayCluster:
		return "RayCluster"
	}
	return "Job"
}

// podName names pod i of a job as its controller does.
func (k ownerKind) podName(job string, i int, h uint64) string {
	switch k {
	case ownerPyTorchJob:
		if i == 0 {
			return job + "-master-0"
		}
		return job + "-worker-" + itoa(i-1)
	case ownerMPIJob, ownerVolcanoJob:
		return job + "-worker-" + itoa(i)
	case ownerRayCluster:
		if i == 0 {
			return job + "-head-" + podSuffix(h)
		}
		return job + "-gpu-group-worker-" + podSuffix(h)
	}
	return fmt.Sprintf("%s-%d-%s", job, i, podSuffix(h)) // indexed batch Job
}

type jobKey struct {
	g    int32
	slot int32
	k    int64
}

func (j *jobSlot) key() jobKey { return jobKey{int32(j.g), int32(j.slot), j.k} }

// running reports whether the job's pods run at s (GPUs held).
func (j *jobSlot) running(s float64) bool { return !j.idle && s >= j.start && s < j.end }

// exists reports whether the job's pods exist at s (pending, running or
// finished within the TTL).
func (j *jobSlot) exists(s float64) bool { return !j.idle && s >= j.created && s < j.end+podTTL }

func (c *Cluster) initGroups() {
	n := c.cfg.Nodes
	for first := 0; first < n; first += groupSize {
		size := min(groupSize, n-first)
		gi := len(c.groups)
		h := h3(c.seed, saltWindowLen, uint64(gi))
		w := windowLens[h%uint64(len(windowLens))]
		g := group{first: first, size: size, w: w, phase: unit(h3(c.seed, saltWindowPhase, uint64(gi))) * w}
		if size != groupSize {
			// A short last block: one job, two halves or single nodes.
			g.layouts = [][]int{{size}}
			if size >= 2 {
				g.layouts = append(g.layouts, []int{size / 2, size - size/2})
			}
			ones := make([]int, size)
			for i := range ones {
				ones[i] = 1
			}
			g.layouts = append(g.layouts, ones)
		}
		c.groups = append(c.groups, g)
	}
}

// window returns the index of the window of group g containing s.
func (g *group) window(s float64) int64 { return int64(math.Floor((s - g.phase) / g.w)) }

func (g *group) windowStart(k int64) float64 { return g.phase + float64(k)*g.w }

func (c *Cluster) layout(gi int, k int64) []int {
	g := &c.groups[gi]
	h := h4(c.seed, saltLayout, uint64(gi), uint64(k))
	if g.layouts != nil {
		return g.layouts[h%uint64(len(g.layouts))]
	}
	return layouts8[h%uint64(len(layouts8))]
}

// slotOf returns the job slot of window k that contains node (global index).
func (c *Cluster) slotOf(node int, k int64) jobSlot {
	gi := node / groupSize
	g := &c.groups[gi]
	off := node - g.first
	first := 0
	for si, size := range c.layout(gi, k) {
		if off < first+size {
			return c.makeSlot(gi, k, si, g.first+first, size)
		}
		first += size
	}
	panic("gpusim: layout does not cover its group")
}

// appendSlots appends every slot of window k of group gi.
func (c *Cluster) appendSlots(buf []jobSlot, gi int, k int64) []jobSlot {
	g := &c.groups[gi]
	first := 0
	for si, size := range c.layout(gi, k) {
		buf = append(buf, c.makeSlot(gi, k, si, g.first+first, size))
		first += size
	}
	return buf
}

func (c *Cluster) makeSlot(gi int, k int64, si, firstNode, size int) jobSlot {
	g := &c.groups[gi]
	base := h4(c.seed, saltSlot, uint64(gi), uint64(k)) ^ uint64(si)*golden
	r := func(i uint64) float64 { return unit(h2(base, i)) }
	ws := g.windowStart(k)
	j := jobSlot{g: gi, k: k, slot: si, firstNode: firstNode, size: size, id: mix(base)}
	if r(1) < idleSlotFraction {
		j.idle = true
		return j
	}
	j.created = ws + 5 + 25*r(2)
	j.start = j.created + 30 + 210*r(3)
	j.end = min(ws+g.w*(0.5+0.45*r(4)), ws+g.w-90)
	j.end = max(j.end, j.start+600)
	j.failed = r(5) < 0.07
	j.model = int(h2(base, 6) % uint64(len(models)))
	m := &models[j.model]
	j.mfu = m.mfu * (0.9 + 0.2*r(7))
	// Multi-node jobs spend more of each step in collectives.
	j.computeFrac = 0.9 - 0.035*math.Log2(float64(size)) - 0.05*r(8)
	j.mfu *= 0.94 + 0.06*(j.computeFrac/0.9)
	tps := j.mfu * peakFLOPS / (6 * m.params)
	j.stepT = m.tokensPerGPUStep / tps
	j.intensity = m.intensity * (0.96 + 0.08*r(9))
	j.fbFrac = min(m.fbFrac+0.04*(r(10)-0.5), 0.985)
	j.tensor = m.tensor * (0.92 + 0.12*r(11))
	j.nvlRate = (40 + 120*r(12)) * 1e9
	j.cpuCores = 24 + 48*r(13)
	j.hostMem = (0.12 + 0.2*r(14))
	j.kind = ownerKinds[h2(base, 15)%uint64(len(ownerKinds))]
	c.applyJobEnders(&j)
	return j
}

// applyJobEnders ends job j at the first fault on one of its nodes that
// kills it while it runs (activeFault.endsJob), a few seconds after the
// event, as Failed. A slot whose node is in MIG mode when its job would
// start stays idle: the scheduler does not place a training job there; so
// does every slot on a node the autoscaler removes before its pods are gone.
func (c *Cluster) applyJobEnders(j *jobSlot) {
	for i := range c.jobEnders {
		f := &c.jobEnders[i]
		if f.node < j.firstNode || f.node >= j.firstNode+j.size {
			continue
		}
		if f.kind == FaultMIG && f.activeAt(j.start) {
			j.idle = true
			return
		}
		if f.kind == FaultNodeRemoved && f.start < j.end+podTTL {
			j.idle = true // the autoscaler removes only an empty node
			return
		}
		if f.start >= j.start && f.start < j.end {
			j.end = math.Min(j.end, f.start+jobCrashDelay)
			j.failed = true
			return
		}
	}
}

// jobInfo holds what a running job needs beyond its slot: names and the
// step-time cycle used by the iteration histogram. Cached per slot.
type jobInfo struct {
	jobSlot
	name      string
	pods      []string
	uids      []string // the pods' metadata.uid
	podIPs    []string
	rankStrs  []string
	stepOff   float64 // steps done before this run (resumed from checkpoint)
	planned   float64 // total planned steps, for the LR schedule
	dur       [cycleLen]float64
	prefix    [cycleLen + 1]float64
	le        [cycleLen + 1][8]uint32 // le[i][b]: steps among the first i with duration <= bucket b
	cycle     float64
	lastTouch int64
}

func (c *Cluster) jobInfo(j *jobSlot) *jobInfo {
	key := j.key()
	if ji, ok := c.jobs[key]; ok {
		ji.lastTouch = c.stepSeq
		return ji
	}
	m := &models[j.model]
	ji := &jobInfo{jobSlot: *j, lastTouch: c.stepSeq}
	ji.name = fmt.Sprintf("%s-%06x", m.name, j.id&0xffffff)
	ji.pods = make([]string, j.size)
	ji.uids = make([]string, j.size)
	ji.podIPs = make([]string, j.size)
	for i := range ji.pods {
		h := h3(j.id, saltPod, uint64(i))
		ji.pods[i] = j.kind.podName(ji.name, i, h)
		u := h2(h, 1)
		ji.podIPs[i] = fmt.Sprintf("10.244.%d.%d", (j.firstNode+i)%256, 2+h%250)
		ji.uids[i] = fmt.Sprintf("%08x-%04x-4%03x-%04x-%012x", uint32(u), uint16(u>>32), uint16(u>>48)&0xfff, 0x8000|uint16(h2(h, 2))&0x3fff, h2(h, 3)&0xffffffffffff)
	}
	ji.rankStrs = make([]string, j.size*c.cfg.GPUsPerNode)
	for i := range ji.rankStrs {
		ji.rankStrs[i] = itoa(i)
	}
	if m.pretrain && unit(h2(j.id, 20)) < 0.7 {
		ji.stepOff = math.Floor(pick(h2(j.id, 21), 1000, 200000))
	}
	if m.pretrain {
		ji.planned = 250000
	} else {
		ji.planned = math.Max(1, (j.end-j.start)/j.stepT)
	}
	ckpt := pick(h2(j.id, 22), 3, 12) // synchronous checkpoint save
	for i := range ji.dur {
		if i == cycleLen-1 {
			ji.dur[i] = j.stepT + ckpt
		} else {
			ji.dur[i] = j.stepT * (1 + 0.07*sym(h3(j.id, saltStep, uint64(i))))
		}
		ji.prefix[i+1] = ji.prefix[i] + ji.dur[i]
		ji.le[i+1] = ji.le[i]
		for b, ub := range IterationTimeBuckets {
			if ji.dur[i] <= ub {
				ji.le[i+1][b]++
			}
		}
		ji.le[i+1][len(IterationTimeBuckets)]++ // +Inf
	}
	ji.cycle = ji.prefix[cycleLen]
	c.jobs[key] = ji
	return ji
}

// pruneJobs drops cached jobs not touched for a while, bounding memory on
// long runs and backfills.
func (c *Cluster) pruneJobs() {
	if len(c.jobs) < 4*len(c.nodes)+64 {
		return
	}
	for k, ji := range c.jobs {
		// Per-node scrapes step one node at a time: keep a job while any node
		// may still need it within a full round of scrapes.
		if c.stepSeq-ji.lastTouch > int64(2*len(c.nodes)+2) {
			delete(c.jobs, k)
		}
	}
}

// iterations returns (steps completed, sum of their durations, steps
// completed in the current checkpoint cycle) after e seconds of effective
// (non-stalled) running time.
func (ji *jobInfo) iterations(e float64) (count float64, sum float64, cycles float64, i int) {
	if e <= 0 {
		return 0, 0, 0, 0
	}
	cycles = math.Floor(e / ji.cycle)
	r := e - cycles*ji.cycle
	// binary search: largest i with prefix[i] <= r
	lo, hi := 0, cycleLen
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if ji.prefix[mid] <= r {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	i = lo
	count = cycles*cycleLen + float64(i)
	sum = cycles*ji.cycle + ji.prefix[i]
	return count, sum, cycles, i
}

const podAlphabet = "bcdfghjklmnpqrstvwxz2456789" // Kubernetes' rand.String alphabet

func podSuffix(h uint64) string {
	var b [5]byte
	for i := range b {
		b[i] = podAlphabet[h%uint64(len(podAlphabet))]
		h /= uint64(len(podAlphabet))
	}
	return string(b[:])
}

var smallInts = func() []string {
	s := make([]string, 4096)
	for i := range s {
		s[i] = fmt.Sprint(i)
	}
	return s
}()

func itoa(i int) string {
	if i >= 0 && i < len(smallInts) {
		return smallInts[i]
	}
	return fmt.Sprint(i)
}
