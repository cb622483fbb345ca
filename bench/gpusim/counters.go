package gpusim

import "math"

// gpuCounters are a GPU's volatile counters: the driver keeps them from the
// GPU's initialisation, so a GPU reset (or the power cycle after an Xid 79)
// restarts them from 0. Remapped rows, retired pages (InfoROM) and the
// energy counter (since the driver was loaded) are not among them.
type gpuCounters struct {
	sbe, dbe, pcie                  float64
	crcFlit, crcData, replay, recov float64 // NVLink4
	nvl5Effective, nvl5Rx, nvl5Sym  float64 // NVLink5
	nvl5Recovery                    float64
	nsPowerCap, nsSWThermal         float64 // clock-event time, ns
	nsHWThermal, nsPowerBrake       float64
}

// resetKey names the counters of one GPU at one re-initialisation.
type resetKey struct {
	gpu int // node*8 + gpu
	at  float64
}

// counters returns the volatile counters of (node, gpu) at s: their values
// since the epoch minus those at the GPU's last reset. Values at a reset are
// computed once, on a copy of the GPU's event processes (which cache their
// position and would otherwise replay from the epoch).
func (c *Cluster) counters(n *node, gi int, s float64, sums *jobSums) gpuCounters {
	gp := &n.gpus[gi]
	v := c.rawCounters(n, gi, s, gp, sums.powerCap[gi]-c.unusedPowerCapSeconds(n, gi, s))
	r, ok := c.lastReset(n.idx, gi, s)
	if !ok {
		return v
	}
	k := resetKey{gpu: n.idx*8 + gi, at: r}
	base, cached := c.resetBase[k]
	if !cached {
		cp := *gp
		capSums := c.nodeCumAt(n, r)
		base = c.rawCounters(n, gi, r, &cp, capSums.powerCap[gi]-c.unusedPowerCapSeconds(n, gi, r))
		c.resetBase[k] = base
	}
	return v.minus(base)
}

// unusedPowerCapSeconds is the SW power-cap time the node's jobs would have
// given (node, gpu) up to s while an idle_allocation fault left it unused:
// nothing runs on it, so it never reaches its power cap.
func (c *Cluster) unusedPowerCapSeconds(n *node, gi int, s float64) float64 {
	g := &c.groups[n.idx/groupSize]
	total := 0.0
	for i := range c.faults {
		f := &c.faults[i]
		if f.kind != FaultIdleAllocation || !f.hitsGPU(n.idx, gi) || s <= f.start {
			continue
		}
		lo, hi := math.Max(f.start, 0), math.Min(f.end, s)
		for k := g.window(lo); lo < hi && k <= g.window(hi); k++ {
			j := c.slotOf(n.idx, k)
			if !j.idle {
				total += overlap(j.start, j.end, lo, hi) * c.powerCapShare(&n.gpus[gi], &j)
			}
		}
	}
	return total
}

// rawCounters are the counters since the epoch (plus the background
// processes' own history) at s; procs supplies the event processes.
func (c *Cluster) rawCounters(n *node, gi int, s float64, procs *gpu, powerCapSecs float64) gpuCounters {
	var v gpuCounters
	v.pcie, _ = procs.pcie.at(s)
	v.pcie += c.perMinuteEvents(FaultPCIeReplays, n.idx, gi, s)
	v.sbe, _ = procs.sbe.at(s)
	v.sbe += c.perMinuteEvents(FaultSBEStorm, n.idx, gi, s)
	v.dbe = c.dbeFaultEvents(n.idx, gi, s)
	crc, _ := procs.crc.at(s)
	if c.hw.nvlink5 {
		// FEC corrects what NVLink4 counted as CRC errors: the effective
		// (post-FEC) and symbol error counters take their place.
		v.nvl5Effective = crc + c.crcFaultErrors(n.idx, gi, s, crcBurstRate)
		v.nvl5Sym = c.crcFaultErrors(n.idx, gi, s, 4*crcBurstRate) + c.perMinuteEvents(FaultNVLink5SymbolErrors, n.idx, gi, s)
		v.nvl5Rx = c.crcFaultErrors(n.idx, gi, s, crcBurstRate/10)
		v.nvl5Recovery = c.periodicEvents(FaultNVLinkRecovery, n.idx, gi, s, 60)
	} else {
		v.crcFlit = crc + c.crcFaultErrors(n.idx, gi, s, crcBurstRate)
		v.crcData = math.Floor(crc/8) + c.crcFaultErrors(n.idx, gi, s, crcBurstRate/10)
		v.replay = c.periodicEvents(FaultNVLinkReplay, n.idx, gi, s, 10)
		v.recov = c.periodicEvents(FaultNVLinkRecovery, n.idx, gi, s, 60)
	}
	v.nsPowerCap = math.Floor(powerCapSecs * 1e9)
	v.nsSWThermal = math.Floor(c.swThermalSeconds(n, gi, s) * 1e9)
	v.nsHWThermal = math.Floor(c.faultSeconds(FaultThrottleThermal, n.idx, gi, s) * 1e9)
	v.nsPowerBrake = math.Floor(c.faultSeconds(FaultThrottle, n.idx, gi, s) * 1e9)
	return v
}

func (v gpuCounters) minus(b gpuCounters) gpuCounters {
	return gpuCounters{
		sbe: v.sbe - b.sbe, dbe: v.dbe - b.dbe, pcie: v.pcie - b.pcie,
		crcFlit: v.crcFlit - b.crcFlit, crcData: v.crcData - b.crcData, replay: v.replay - b.replay, recov: v.recov - b.recov,
		nvl5Effective: v.nvl5Effective - b.nvl5Effective, nvl5Rx: v.nvl5Rx - b.nvl5Rx, nvl5Sym: v.nvl5Sym - b.nvl5Sym,
		nvl5Recovery: v.nvl5Recovery - b.nvl5Recovery,
		nsPowerCap:   v.nsPowerCap - b.nsPowerCap, nsSWThermal: v.nsSWThermal - b.nsSWThermal,
		nsHWThermal: v.nsHWThermal - b.nsHWThermal, nsPowerBrake: v.nsPowerBrake - b.nsPowerBrake,
	}
}

// swThermal reports whether the driver's SW thermal slowdown holds (node,
// gpu) at s: the die at or above its maximum operating temperature, or the
// memory at or above its own (NVML's nvmlClocksEventReasonSwThermalSlowdown).
// It reads the temperatures without their measurement noise, so the time
// counter and the reason bit agree.
func (c *Cluster) swThermal(n *node, gi int, s float64) bool {
	die := c.gpuTemp(n, gi, s)
	return die >= c.hw.gpuMaxOpTemp || c.memTemp(n, gi, s, die) >= c.hw.memMaxOpTemp
}

// memTemp is the HBM temperature (without noise) for a die at die °C.
func (c *Cluster) memTemp(n *node, gi int, s, die float64) float64 {
	m := 0.88*die + 9 + n.gpus[gi].hbmOffset
	if w := c.hbmExcessWeight(n.idx, gi, s); w > 0 {
		m += (hbmOverheatTemp - m) * w
	}
	return m
}

// thermalSpan is a stretch of time around a GPU's thermal faults, with the
// seconds of SW thermal slowdown counted per whole second from its start.
type thermalSpan struct {
	from float64
	cum  []float64 // cum[i]: slowdown seconds in [from, from+i)
}

// swThermalSeconds is the time (node, gpu) spent in SW thermal slowdown up
// to s. Only an overheat or hbm_overheat fault gets a GPU to its limits (a
// training job holds the die near 70 °C); each one is integrated second by
// second from its start until 12 time constants after its end, once.
func (c *Cluster) swThermalSeconds(n *node, gi int, s float64) float64 {
	id := n.idx*8 + gi
	spans, ok := c.thermalMemo[id]
	if !ok {
		spans = c.thermalSpans(n, gi)
		c.thermalMemo[id] = spans
	}
	total := 0.0
	for _, sp := range spans {
		i := int(math.Floor(s - sp.from))
		switch {
		case i < 0:
		case i >= len(sp.cum):
			total += sp.cum[len(sp.cum)-1]
		default:
			total += sp.cum[i]
		}
	}
	return total
}

func (c *Cluster) thermalSpans(n *node, gi int) []thermalSpan {
	var spans []thermalSpan
	for i := range c.faults {
		f := &c.faults[i]
		if (f.kind != FaultOverheat && f.kind != FaultHBMOverheat) || !f.hitsGPU(n.idx, gi) {
			continue
		}
		from := math.Floor(f.start)
		to := math.Ceil(f.end + 12*math.Max(tauTemp, tauHBM))
		if len(spans) > 0 && from < spans[len(spans)-1].from+float64(len(spans[len(spans)-1].cum)) {
			from = spans[len(spans)-1].from + float64(len(spans[len(spans)-1].cum)) // overlapping faults: go on from the last span
		}
		sp := thermalSpan{from: from, cum: make([]float64, 1, int(to-from)+1)}
		for t := from; t < to; t++ {
			v := sp.cum[len(sp.cum)-1]
			if c.swThermal(n, gi, t+0.5) {
				v++
			}
			sp.cum = append(sp.cum, v)
		}
		spans = append(spans, sp)
	}
	return spans
}
