package gpusim

import "math"

// The GPU-level effects of the fault schedule: Xid events, a GPU that is
// gone, MIG mode, resets and the counters faults add to. All are pure
// functions of (schedule, time).

// dbeXidBurst is what the driver logs for an uncorrectable ECC error on an
// Ampere or newer GPU, in order (NVIDIA's Xid catalogue): the DBE itself,
// the row remap it triggers, the contained-error notice to the application,
// the teardown of the affected contexts, and Xid 154 as it sets the
// recovery action (a GPU reset: the remapped row takes effect at the next
// reset). They come a second apart, so the last-Xid gauge ends on 154: with
// dcgm-exporter's default counters that is all the Xid gauge shows.
var dbeXidBurst = [...]int{48, 63, 94, 45, xidRecoveryActionChanged}

// dbeRecoveryAction is the recovery action the driver asks for after an
// uncorrectable ECC error (nvmlDeviceGpuRecoveryAction_t 1: GPU reset),
// from the burst's Xid 154 until the fault ends.
const dbeRecoveryAction = 1

// goneGrace is how long a GPU that fell off the bus is still exported: one
// dcgm-exporter collection interval, in which the Xid 79 is seen.
const goneGrace = 30.0

// xidRecoveryActionChanged is the Xid the driver logs when it sets a new
// recovery action.
const xidRecoveryActionChanged = 154

// xidCount is one code's events within the DCGM_EXP_XID_ERRORS_COUNT window.
type xidCount struct {
	code, n int
}

// lastXid returns fault f's latest Xid event at or before s.
func (f *activeFault) lastXid(s float64) (code int, t float64, ok bool) {
	if s < f.start {
		return 0, 0, false
	}
	switch f.kind {
	case FaultXid:
		k := 0.0
		if f.every > 0 {
			k = math.Min(math.Floor((s-f.start)/f.every), f.lastRepeat())
		}
		return f.code, f.start + k*f.every, true
	case FaultECCDBE:
		k := int(math.Min(s-f.start, float64(len(dbeXidBurst)-1)))
		return dbeXidBurst[k], f.start + float64(k), true
	case FaultRecoveryAction:
		return xidRecoveryActionChanged, f.start, true
	}
	return 0, 0, false
}

// lastRepeat is the index of a repeating xid fault's last event (< end).
func (f *activeFault) lastRepeat() float64 {
	return math.Max(0, math.Ceil((f.end-f.start)/f.every)-1)
}

// xidsIn calls fn for each of fault f's Xid events in (from, to].
func (f *activeFault) xidsIn(from, to float64, fn func(code int)) {
	switch f.kind {
	case FaultXid:
		if f.every <= 0 {
			if f.start > from && f.start <= to {
				fn(f.code)
			}
			return
		}
		lo := math.Max(0, math.Floor((from-f.start)/f.every)+1)
		hi := math.Min(math.Floor((to-f.start)/f.every), f.lastRepeat())
		for k := lo; k <= hi; k++ {
			fn(f.code)
		}
	case FaultECCDBE:
		for k, cd := range dbeXidBurst {
			if t := f.start + float64(k); t > from && t <= to {
				fn(cd)
			}
		}
	case FaultRecoveryAction:
		if f.start > from && f.start <= to {
			fn(xidRecoveryActionChanged)
		}
	}
}

// xidAt returns the last Xid of (node, gpu) at s: the latest of the
// background events and the faults' events.
func (c *Cluster) xidAt(n *node, gi int, s float64) int {
	gp := &n.gpus[gi]
	code, at, ok := 0, 0.0, false
	if s >= 0 {
		_, code = gp.xid.at(s)
		at, ok = gp.xid.lastTime()
	}
	for i := range c.faults {
		f := &c.faults[i]
		if !f.hitsGPU(n.idx, gi) {
			continue
		}
		if cd, t, hit := f.lastXid(s); hit && (!ok || t >= at) {
			code, at, ok = cd, t, true
		}
	}
	return code
}

// xidWindow appends the Xid events of (node, gpu) within the count window
// (s-W, s] to buf, one entry per code, sorted by code. A background event
// counts once (two within minutes are beyond their rate). xidAt must have
// advanced the GPU's background process to s.
func (c *Cluster) xidWindow(buf []xidCount, n *node, gi int, s float64) []xidCount {
	from := s - c.cfg.XIDCountWindow.Seconds()
	add := func(code int) {
		for i := range buf {
			if buf[i].code == code {
				buf[i].n++
				return
			}
		}
		buf = append(buf, xidCount{code: code, n: 1})
		for i := len(buf) - 1; i > 0 && buf[i].code < buf[i-1].code; i-- {
			buf[i], buf[i-1] = buf[i-1], buf[i]
		}
	}
	if t, ok := n.gpus[gi].xid.lastTime(); ok && s >= 0 && t > from && t <= s {
		_, code := n.gpus[gi].xid.at(s)
		add(code)
	}
	for i := range c.faults {
		if f := &c.faults[i]; f.hitsGPU(n.idx, gi) {
			f.xidsIn(from, s, add)
		}
	}
	return buf
}

// gpuGoneAt reports whether (node, gpu) is missing from the exporter at s:
// from goneGrace after an Xid 79 until its fault ends (the node is
// power-cycled), and while a GPU reset lasts.
func (c *Cluster) gpuGoneAt(node, gpu int, s float64) bool {
	for i := range c.faults {
		f := &c.faults[i]
		if !f.hitsGPU(node, gpu) || s >= f.end {
			continue
		}
		if (f.kind == FaultXid && f.code == 79 && s >= f.start+goneGrace) || (f.kind == FaultGPUReset && s >= f.start) {
			return true
		}
	}
	return false
}

// lastReset returns the last time at or before s when (node, gpu) was
// re-initialised: a GPU reset's start, or the end of an Xid 79 (the power
// cycle that brings the GPU back). Its volatile counters count from there.
func (c *Cluster) lastReset(node, gpu int, s float64) (float64, bool) {
	r, ok := 0.0, false
	for i := range c.faults {
		f := &c.faults[i]
		if !f.hitsGPU(node, gpu) {
			continue
		}
		t := math.Inf(1)
		switch {
		case f.kind == FaultGPUReset:
			t = f.start
		case f.kind == FaultXid && f.code == 79:
			t = f.end
		}
		if t <= s && (!ok || t > r) {
			r, ok = t, true
		}
	}
	return r, ok
}

// rowRemapPending reports whether (node, gpu) has a row remap pending at s:
// from an uncorrectable ECC error until the GPU is next re-initialised.
func (c *Cluster) rowRemapPending(node, gpu int, s float64) bool {
	reset, wasReset := c.lastReset(node, gpu, s)
	for i := range c.faults {
		f := &c.faults[i]
		if f.kind == FaultECCDBE && f.hitsGPU(node, gpu) && f.start <= s && (!wasReset || f.start >= reset) {
			return true
		}
	}
	return false
}

// recoveryAction is the driver's recovery action for (node, gpu) at s: the
// code of the latest recovery_action fault in force, else 0 (none).
func (c *Cluster) recoveryAction(node, gpu int, s float64) float64 {
	code := 0
	for i := range c.faults {
		f := &c.faults[i]
		switch {
		case f.kind == FaultRecoveryAction && f.hitsGPU(node, gpu) && f.activeAt(s):
			code = f.code
		case f.kind == FaultECCDBE && f.hitsGPU(node, gpu) && s >= f.start+float64(len(dbeXidBurst)-1) && s < f.end:
			code = max(code, dbeRecoveryAction)
		}
	}
	return float64(code)
}

// dbeFaultEvents counts DBE events injected on (node, gpu) up to s: one at a
// fault's start and one per further minute while it lasts.
func (c *Cluster) dbeFaultEvents(node, gpu int, s float64) float64 {
	return c.periodicEvents(FaultECCDBE, node, gpu, s, 60)
}

// periodicEvents counts the events faults of kind put on (node, gpu) up to
// s: one at the start and one per period while the fault lasts.
func (c *Cluster) periodicEvents(kind FaultKind, node, gpu int, s, period float64) float64 {
	n := 0.0
	for i := range c.faults {
		if f := &c.faults[i]; f.kind == kind && f.hitsGPU(node, gpu) {
			n += f.eventsUpTo(s, period)
		}
	}
	return n
}

// eventsUpTo counts fault f's events up to s: one at its start and one per
// period while it lasts.
func (f *activeFault) eventsUpTo(s, period float64) float64 {
	switch {
	case s < f.start:
		return 0
	case s < f.end:
		return math.Floor((s-f.start)/period) + 1
	}
	return math.Ceil((f.end - f.start) / period)
}

// perMinuteEvents counts the events faults of kind (sbe_storm,
// pcie_replays) put on (node, gpu) up to s, each at its own rate (value per
// minute).
func (c *Cluster) perMinuteEvents(kind FaultKind, node, gpu int, s float64) float64 {
	n := 0.0
	for i := range c.faults {
		if f := &c.faults[i]; f.kind == kind && f.hitsGPU(node, gpu) {
			n += f.eventsUpTo(s, 60/f.value)
		}
	}
	return n
}

// crcBurstRate is the NVLink CRC flit errors per second of an
// nvlink_crc_burst: a marginal link retraining, above the 100/s at which
// DCGM's health check fails a link (DCGM_LIMIT_MAX_NVLINK_CRC_ERROR).
const crcBurstRate = 150

// crcFaultErrors counts CRC errors injected on (node, gpu) up to s at rate
// per second.
func (c *Cluster) crcFaultErrors(node, gpu int, s, rate float64) float64 {
	n := 0.0
	for i := range c.faults {
		f := &c.faults[i]
		if f.kind == FaultNVLinkCRCBurst && f.hitsGPU(node, gpu) && s >= f.start {
			n += 1 + float64(int64(rate*(min(s, f.end)-f.start)))
		}
	}
	return n
}

// faultSeconds is the time up to s that faults of kind held (node, gpu).
func (c *Cluster) faultSeconds(kind FaultKind, node, gpu int, s float64) float64 {
	total := 0.0
	for i := range c.faults {
		f := &c.faults[i]
		if f.kind == kind && f.hitsGPU(node, gpu) {
			total += overlap(f.start, f.end, math.Inf(-1), s)
		}
	}
	return total
}

// stragglerExtra is the iteration time the straggler faults of job ji's
// nodes add to every rank's training_iteration_time_seconds_sum by st's
// instant: (factor-1) times the job's iteration time while each fault held.
// Synchronous training waits for its slowest rank at every step, so every
// rank times the same, slower step: the straggler shows in its GPU's
// signals (it computes while the others wait), not in its step time.
func (c *Cluster) stragglerExtra(ji *jobInfo, st *nodeStep) float64 {
	s := ji.start + st.sinceJob
	extra := 0.0
	for i := range c.faults {
		f := &c.faults[i]
		if f.kind != FaultStraggler || f.node < ji.firstNode || f.node >= ji.firstNode+ji.size || s < f.start {
			continue
		}
		a, b := math.Max(f.start, ji.start), math.Min(s, f.end)
		if b > a {
			extra += (f.value - 1) * (c.iterSum(ji, b) - c.iterSum(ji, a))
		}
	}
	return extra
}

// iterSum is job ji's summed iteration time (one rank's, without noise) at s.
func (c *Cluster) iterSum(ji *jobInfo, s float64) float64 {
	_, sum, _, _ := ji.iterations(s - ji.start - c.stalledTime(&ji.jobSlot, ji.start, s))
	return sum
}

// jobStragglerAt returns the straggler fault active at s on one of job j's
// nodes, if any.
func (c *Cluster) jobStragglerAt(j *jobSlot, s float64) (*activeFault, bool) {
	for i := range c.faults {
		if f := &c.faults[i]; f.kind == FaultStraggler && f.node >= j.firstNode && f.node < j.firstNode+j.size && f.activeAt(s) {
			return f, true
		}
	}
	return nil, false
}
