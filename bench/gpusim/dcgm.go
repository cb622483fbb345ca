package gpusim

import "math"

// gpuValues is one GPU's state at one instant, as dcgm-exporter reports it.
type gpuValues struct {
	sm, memTemp, temp, power, energy  float64
	util, memCopy, gr, tensor, dram   float64
	pcieTx, pcieRx, fbUsed, nvlink    float64
	reasons                           int
	remapFail, remapPending, recovery float64
	corrRows, uncorrRows              float64
	ctr                               gpuCounters
	nvl5SymbolBER, nvl5EffectiveBER   float64
	fbTotal, fbReserved               float64
	noUtil                            bool // MIG mode: NVML has no utilisation
}

// NVML's encoding of a link's bit error rate (mantissa << 8 | exponent):
// 0xFFF (15e-255) is the floor a healthy link reports; a CRC burst shows a
// symbol BER of 5e-6 and an effective (post-FEC) BER of 2e-9.
const (
	berHealthy        = 15<<8 | 255
	berBurstSymbol    = 5<<8 | 6
	berBurstEffective = 2<<8 | 9
)

// gpuLabelState records what shapes a GPU's label sets at s (its last Xid,
// whether it is gone, MIG mode, the codes in the Xid count window) and
// returns a hash of it for the node's series key.
func (c *Cluster) gpuLabelState(n *node, gi int, s float64) uint64 {
	n.xidCode[gi] = c.xidAt(n, gi, s)
	n.gone[gi] = c.gpuGoneAt(n.idx, gi, s)
	n.mig[gi] = c.gpuFaultActive(FaultMIG, n.idx, gi, s)
	n.xidWin[gi] = c.xidWindow(n.xidWin[gi][:0], n, gi, s)
	h := uint64(n.xidCode[gi]) << 2
	if n.gone[gi] {
		h |= 1
	}
	if n.mig[gi] {
		h |= 2
	}
	for _, x := range n.xidWin[gi] {
		h = h2(h, uint64(x.code))
	}
	return h
}

func (c *Cluster) emitGPU(e *emitter, n *node, gi int, st *nodeStep, s float64, tms int64) {
	gp := &n.gpus[gi]
	if e.build {
		e.base = append(e.base[:0], gp.labels...)
		for i := range e.base {
			switch {
			case n.upgraded && e.base[i].Name == "Hostname":
				e.base[i].Name = "hostname"
			case n.newDriver && e.base[i].Name == "DCGM_FI_DRIVER_VERSION":
				e.base[i].Value = UpgradedDriverVersion
			}
			if n.v49 && e.base[i].Name == "DCGM_FI_DRIVER_VERSION" {
				e.base[i].Name = "DCGM_FI_SYSTEM_DRIVER_VERSION"
			}
		}
		if st.job != nil && !n.mig[gi] {
			e.base = append(e.base, Label{"pod", st.job.pods[st.local]}, Label{"namespace", "training"}, Label{"container", "pytorch"})
		}
	}
	e.setTarget("dcgm-exporter", n.instDCGM)
	c.v49 = n.v49
	v := c.gpuValuesAt(n, gi, st, s, tms)
	if !n.mig[gi] {
		c.emitDCGM(e, n, gi, &v)
		return
	}
	// MIG mode: dcgm-exporter monitors the GPU instances instead of the GPU
	// (its default --devices f), each labelled GPU_I_PROFILE and GPU_I_ID.
	// DCGM answers GPU-level fields for an instance with its GPU's value;
	// framebuffer and profiling fields are the instance's own.
	nBase := len(e.base)
	u := func(i uint64) float64 { return unit(h4(c.seed, saltNoise, gp.id, uint64(tms)*64+i)) }
	for ii, inst := range c.hw.mig {
		if e.build {
			e.base = append(e.base[:nBase], Label{"GPU_I_PROFILE", inst.profile}, Label{"GPU_I_ID", inst.id})
		}
		iv := v
		load := 0.35 + 0.3*u(uint64(40+ii))
		iv.gr, iv.tensor, iv.dram = round6(load), round6(0.4*load), round6(0.5*load)
		iv.fbTotal, iv.fbReserved = inst.fb, 0
		iv.fbUsed = math.Round(0.7 * inst.fb * (1 + 0.01*sym(h4(c.seed, saltNoise, gp.id, uint64(tms)*64+uint64(50+ii)))))
		iv.pcieTx, iv.pcieRx = math.Round(float64(inst.slices)*(1e6+2e6*u(uint64(60+ii)))), math.Round(float64(inst.slices)*(4e6+8e6*u(uint64(70+ii))))
		c.emitDCGM(e, n, gi, &iv)
	}
}

// gpuValuesAt computes GPU gi of node n at s from its phase in the job's
// step cycle, the faults that hold it and its counters.
func (c *Cluster) gpuValuesAt(n *node, gi int, st *nodeStep, s float64, tms int64) gpuValues {
	gp := &n.gpus[gi]
	hw := c.hw
	nz := func(i uint64) float64 { return sym(h4(c.seed, saltNoise, gp.id, uint64(tms)*64+i)) }
	u := func(i uint64) float64 { return unit(h4(c.seed, saltNoise, gp.id, uint64(tms)*64+i)) }
	v := gpuValues{fbTotal: hw.fbTotal, fbReserved: hw.fbReserved, noUtil: n.mig[gi]}
	unused := st.job != nil && c.gpuFaultActive(FaultIdleAllocation, n.idx, gi, s)
	if st.job != nil && (st.phase == phComm || st.phase == phCompute) {
		if f, ok := c.jobStragglerAt(&st.job.jobSlot, s); ok {
			sc := *st
			switch {
			case f.hitsGPU(n.idx, gi):
				// The straggler is still computing while the other ranks
				// wait for it in the collective: its tensor pipes and
				// power stay busy.
				sc.phase = phCompute
			case st.phase == phCompute && u(21) < (f.value-1)/f.value:
				// The others are done early and wait in the collective
				// for (factor-1)/factor of each (longer) step.
				sc.phase = phComm
			}
			st = &sc
		}
	}
	c.phaseValues(&v, gp, st, unused, nz, u)
	if n.mig[gi] {
		v.power = c.migPower(gp) * (1 + 0.02*nz(10))
		v.sm = hw.boostSMClock - 15*math.Floor(10*u(4))
		v.reasons = 0
		v.nvlink = 0 // MIG has no peer-to-peer NVLink traffic
	}
	if c.gpuFaultActive(FaultThrottle, n.idx, gi, s) {
		v.reasons |= throttlePowerBrakeMask
		v.reasons &^= ThrottleSWPowerCap
		v.sm = 1005 + 15*math.Floor(12*u(14))
		v.power = math.Min(v.power, throttleShare*hw.pMax*(1+0.02*nz(15)))
	}
	if c.gpuFaultActive(FaultThrottleThermal, n.idx, gi, s) {
		v.reasons |= throttleThermalMask
		v.sm = math.Min(v.sm, 990+15*math.Floor(12*u(14)))
	}
	if c.gpuFaultActive(FaultPStateChange, n.idx, gi, s) {
		v.reasons |= ThrottleHWSlowdown
	}
	die := c.gpuTemp(n, gi, s)
	mem := c.memTemp(n, gi, s, die)
	if die >= hw.gpuMaxOpTemp || mem >= hw.memMaxOpTemp {
		v.reasons |= ThrottleSWThermal
		v.sm = math.Min(v.sm, 1590+15*math.Floor(8*u(17)))
	}
	v.temp = math.Round(die + 0.4*nz(16))
	v.memTemp = math.Round(mem + 0.5*nz(18))
	if st.job != nil && !n.mig[gi] && !unused {
		fb := hw.fbTotal - hw.fbReserved
		v.fbUsed = math.Min(fb, math.Round(st.job.fbFrac*fb*(1-math.Exp(-st.sinceJob/40))*(1+0.002*nz(19))))
	}
	v.energy = gp.e0 + 1000*(gp.pIdle*s+gp.scale*(hw.pMax-gp.pIdle)*st.inten+c.energyCorr(n, gi, s))
	if s < 0 {
		v.energy = gp.e0 + 1000*gp.pIdle*s
	}
	sbeSinceInstall, _ := gp.sbe.at(s) // remapped rows persist across resets
	v.corrRows = gp.corrRows0 + math.Floor(sbeSinceInstall/100)
	v.uncorrRows = c.dbeFaultEvents(n.idx, gi, s)
	v.ctr = c.counters(n, gi, s, &st.jobSums)
	if c.gpuFaultActive(FaultRowRemapFailure, n.idx, gi, s) {
		v.remapFail = 1
	}
	if c.rowRemapPending(n.idx, gi, s) {
		v.remapPending = 1
	}
	v.recovery = c.recoveryAction(n.idx, gi, s)
	v.nvl5SymbolBER, v.nvl5EffectiveBER = berHealthy, berHealthy
	if c.gpuFaultActive(FaultNVLinkCRCBurst, n.idx, gi, s) {
		v.nvl5SymbolBER, v.nvl5EffectiveBER = berBurstSymbol, berBurstEffective
	}
	return v
}

// phaseValues sets the values the step cycle decides: utilisation, engine
// activity, PCIe and NVLink traffic, power, SM clock and the power-cap bit.
// An unused GPU (allocated, nothing running on it) reports as an idle one.
func (c *Cluster) phaseValues(v *gpuValues, gp *gpu, st *nodeStep, unused bool, nz, u func(uint64) float64) {
	hw := c.hw
	ph := st.phase
	if st.job == nil || unused {
		ph = phIdle
	}
	nvl := 0.0 // bytes/s over NVLink, TX+RX
	switch ph {
	case phIdle, phLoad:
		v.power = gp.pIdle * (1 + 0.02*nz(1))
		v.sm = hw.idleSMClock
		v.pcieTx, v.pcieRx = 1e4+4e4*u(2), 1e4+6e4*u(3)
		v.reasons = ThrottleGPUIdle
	case phCompute, phComm:
		j := st.job
		pc, pa, capped := c.computePower(gp, &j.jobSlot)
		v.sm = hw.boostSMClock - 15*math.Floor(4*u(4))
		rate := j.nvlRate * gp.nvlScale
		if ph == phCompute {
			v.util = 96 + math.Floor(5*u(5))
			v.memCopy = 32 + 12*u(6)
			v.gr = 0.93 + 0.06*u(7)
			v.tensor = j.tensor * (1 + 0.04*nz(8))
			v.dram = 0.32 + 0.18*u(9)
			v.power = pc * (1 + 0.015*nz(10))
			v.pcieRx, v.pcieTx = 2e8+4e8*u(11), 3e7+5e7*u(12)
			nvl = 0.6 * rate // gradient buckets overlap the backward pass
			if capped {
				v.reasons |= ThrottleSWPowerCap
				v.sm -= 120 + 60*u(13)
			}
		} else {
			// The all-reduce: NCCL's kernels keep the GPU "utilised" as
			// NVML counts it (a kernel is running) while the tensor pipes
			// idle and NVLink carries the gradients.
			v.util = 94 + math.Floor(7*u(5))
			v.memCopy = 15 + 10*u(6)
			v.gr = 0.85 + 0.1*u(7)
			v.tensor = 0.01 + 0.03*u(8)
			v.dram = 0.18 + 0.12*u(9)
			v.power = pa * (1 + 0.02*nz(10))
			v.pcieRx, v.pcieTx = 5e6+2e7*u(11), 5e6+2e7*u(12)
			nvl = math.Min(0.8*hw.nvlinkMax, 2.5*rate)
		}
	case phCheckpoint:
		v.util = 8 + math.Floor(12*u(5))
		v.memCopy = 4 + 6*u(6)
		v.gr = 0.08 + 0.1*u(7)
		v.dram = 0.05 + 0.05*u(9)
		v.power = (gp.pIdle + 60) * (1 + 0.03*nz(10))
		v.sm = hw.boostSMClock
		v.pcieTx, v.pcieRx = 1.5e9+1.5e9*u(12), 1e6+4e6*u(11) // weights and optimiser state to host
	case phStall:
		// A hung collective spins a kernel: 100% "utilisation", nothing done.
		v.util = 100
		v.gr = 0.99 + 0.01*u(7)
		v.dram = 0.01 * u(9)
		v.power = gp.stallPower() * (1 + 0.02*nz(10))
		v.sm = hw.boostSMClock
		v.pcieTx, v.pcieRx = 1e4+1e4*u(12), 1e4+1e4*u(11)
	}
	v.memCopy = math.Round(v.memCopy)
	v.gr, v.tensor, v.dram = round6(v.gr), round6(v.tensor), round6(v.dram)
	v.pcieTx, v.pcieRx = math.Round(v.pcieTx), math.Round(v.pcieRx)
	// DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL is DCGM's throughput over its last
	// two readings in MiB/s (DcgmCacheManager ReadAndCacheNvLinkBandwidth),
	// not a byte counter, whatever type the exporter's CSV gives it.
	v.nvlink = math.Round(nvl / (1 << 20) * (1 + 0.02*nz(20)))
}

// emitDCGM writes one GPU's (or GPU instance's) DCGM series, in catalogue
// order within each family.
func (c *Cluster) emitDCGM(e *emitter, n *node, gi int, v *gpuValues) {
	c.add(e, FamSMClock, v.sm)
	c.add(e, FamMemClock, c.hw.memClock)
	c.add(e, FamMemoryTemp, v.memTemp)
	c.add(e, FamGPUTemp, v.temp)
	c.add(e, FamPowerUsage, math.Round(v.power*1000)/1000)
	c.add(e, FamTotalEnergy, math.Floor(v.energy))
	c.add(e, FamPCIeReplay, v.ctr.pcie)
	if !v.noUtil {
		c.add(e, FamGPUUtil, v.util)
		c.add(e, FamMemCopyUtil, v.memCopy)
		c.add(e, FamEncUtil, 0)
		c.add(e, FamDecUtil, 0)
	}
	// dcgm-exporter >= 3.3.6 labels the gauge with the code and its text,
	// so every code is a series of its own.
	xid := n.xidCode[gi]
	c.add(e, FamXIDErrors, float64(xid), Label{"err_code", itoa(xid)}, Label{"err_msg", xidMessage(xid)})
	c.add(e, FamFBFree, v.fbTotal-v.fbUsed-v.fbReserved)
	c.add(e, FamFBUsed, v.fbUsed)
	c.add(e, FamFBReserved, v.fbReserved)
	c.add(e, FamNVLinkBandwidth, v.nvlink)
	c.add(e, FamVGPULicense, 0)
	c.add(e, FamUncorrectableRemappedRows, v.uncorrRows)
	c.add(e, FamCorrectableRemappedRows, v.corrRows)
	c.add(e, FamRowRemapFailure, v.remapFail)
	c.add(e, FamProfGREngineActive, v.gr)
	c.add(e, FamProfPipeTensorActive, v.tensor)
	c.add(e, FamProfDRAMActive, v.dram)
	c.add(e, FamProfPCIeTxBytes, v.pcieTx)
	c.add(e, FamProfPCIeRxBytes, v.pcieRx)
	c.add(e, FamECCSBEVolTotal, v.ctr.sbe)
	c.add(e, FamECCDBEVolTotal, v.ctr.dbe)
	// An H100 remaps rows instead of retiring pages: the retired-page
	// counters stay 0 (typed counter, as dcgm-exporter's CSV does).
	c.add(e, FamRetiredSBE, 0)
	c.add(e, FamRetiredDBE, 0)
	c.add(e, FamClockThrottleReasons, float64(v.reasons))
	c.add(e, FamFBTotal, v.fbTotal)
	c.add(e, FamGPUMaxOpTemp, c.hw.gpuMaxOpTemp)
	c.add(e, FamMemMaxOpTemp, c.hw.memMaxOpTemp)
	c.emitXidCount(e, n, gi)
	c.add(e, c.famRecov, v.recovery)
	c.add(e, FamRowRemapPending, v.remapPending)
	c.add(e, FamClockEventSWPowerCapNS, v.ctr.nsPowerCap)
	c.add(e, FamClockEventSyncBoostNS, 0)
	c.add(e, FamClockEventSWThermalNS, v.ctr.nsSWThermal)
	c.add(e, FamClockEventHWThermalNS, v.ctr.nsHWThermal)
	c.add(e, FamClockEventHWPowerBrakeNS, v.ctr.nsPowerBrake)
	if !c.hw.nvlink5 {
		c.add(e, FamNVLinkCRCFlitErrors, v.ctr.crcFlit)
		c.add(e, FamNVLinkCRCDataErrors, v.ctr.crcData)
		c.add(e, FamNVLinkReplayErrors, v.ctr.replay)
		c.add(e, FamNVLinkRecoveryErrors, v.ctr.recov)
		return
	}
	c.add(e, FamNVL5RxErrors, v.ctr.nvl5Rx)
	c.add(e, FamNVL5RxSymbolErrors, v.ctr.nvl5Sym)
	c.add(e, FamNVL5RxMalformedPacketErrors, 0)
	c.add(e, FamNVL5RxBufferOverrunErrors, 0)
	c.add(e, FamNVL5RxRemoteErrors, 0)
	c.add(e, FamNVL5RxGeneralErrors, 0)
	c.add(e, FamNVL5LocalLinkIntegrityErrors, 0)
	c.add(e, FamNVL5EffectiveErrors, v.ctr.nvl5Effective)
	c.add(e, FamNVL5SymbolBER, v.nvl5SymbolBER)
	c.add(e, FamNVL5EffectiveBER, v.nvl5EffectiveBER)
	c.add(e, FamNVL5LinkRecoveryEvents, v.ctr.nvl5Recovery)
	c.add(e, FamNVL5LinkRecoverySuccessful, 0)
	c.add(e, FamNVL5LinkRecoveryFailed, v.ctr.nvl5Recovery)
	c.add(e, FamNVLinkECCDataErrors, 0)
}

// emitXidCount writes DCGM_EXP_XID_ERRORS_COUNT as xid_collector.go does:
// a series per code seen in the window with its count, or, with none, one
// series without xid at 0. Every series carries window_size_in_ms.
func (c *Cluster) emitXidCount(e *emitter, n *node, gi int) {
	w := Label{"window_size_in_ms", c.xidWinLabel}
	if len(n.xidWin[gi]) == 0 {
		c.add(e, FamXIDErrorsCount, 0, w)
		return
	}
	for _, x := range n.xidWin[gi] {
		c.add(e, FamXIDErrorsCount, float64(x.n), w, Label{"xid", itoa(x.code)})
	}
}

// add emits a series of DCGM family f unless the cluster's counters CSV
// leaves the family out.
func (c *Cluster) add(e *emitter, f int, v float64, extra ...Label) {
	if c.famOff != nil && c.famOff[f] {
		return
	}
	if c.v49 {
		if r, ok := Exporter49Names[Catalogue[f].Name]; ok {
			e.addNamed(f, r.Name, v*r.Scale, extra...)
			return
		}
	}
	e.add(f, v, extra...)
}

// Exporter49Name is what dcgm-exporter 4.9 calls a default field, and the
// factor from the older exporters' unit to its.
type Exporter49Name struct {
	Name  string
	Scale float64
}

// Exporter49Names maps the names of the default fields gpusim emits, as
// dcgm-exporter up to 4.8 names them, to dcgm-exporter 4.9's (DCGM 4.7's
// names; its release notes list the unit changes: clocks MHz to Hz, energy
// mJ to J, utilisation percent to ratio, GPU memory MiB to bytes, NVLink
// throughput MB/s to bytes/s). The renames DCGM 4.6 made (dcgm_fields.h
// v4.6.0) and the clock and energy fields of DCGM 4.6.1 (go-dcgm 1.4611)
// are from their source; the framebuffer and copy/encoder/decoder
// utilisation names follow DCGM's field naming standard
// (dcgm_field_naming.py) and FB_CAPACITY_BYTES, which the release notes
// name; 4.9's own source could not be read.
var Exporter49Names = map[string]Exporter49Name{
	"DCGM_FI_DEV_SM_CLOCK":                    {"DCGM_FI_DEV_SM_CLOCK_HERTZ", 1e6},
	"DCGM_FI_DEV_MEM_CLOCK":                   {"DCGM_FI_DEV_MEMORY_CLOCK_HERTZ", 1e6},
	"DCGM_FI_DEV_MEMORY_TEMP":                 {"DCGM_FI_DEV_MEMORY_TEMP_CELSIUS", 1},
	"DCGM_FI_DEV_GPU_TEMP":                    {"DCGM_FI_DEV_GPU_TEMP_CELSIUS", 1},
	"DCGM_FI_DEV_POWER_USAGE":                 {"DCGM_FI_DEV_BOARD_POWER_WATTS", 1},
	"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION":    {"DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", 1e-3},
	"DCGM_FI_DEV_PCIE_REPLAY_COUNTER":         {"DCGM_FI_DEV_PCIE_REPLAY_TOTAL", 1},
	"DCGM_FI_DEV_GPU_UTIL":                    {"DCGM_FI_DEV_GPU_UTIL_RATIO", 0.01},
	"DCGM_FI_DEV_MEM_COPY_UTIL":               {"DCGM_FI_DEV_MEMORY_COPY_UTIL_RATIO", 0.01},
	"DCGM_FI_DEV_ENC_UTIL":                    {"DCGM_FI_DEV_ENC_UTIL_RATIO", 0.01},
	"DCGM_FI_DEV_DEC_UTIL":                    {"DCGM_FI_DEV_DEC_UTIL_RATIO", 0.01},
	"DCGM_FI_DEV_XID_ERRORS":                  {"DCGM_FI_DEV_XID_ERROR", 1},
	"DCGM_FI_DEV_FB_FREE":                     {"DCGM_FI_DEV_FB_FREE_BYTES", 1 << 20},
	"DCGM_FI_DEV_FB_USED":                     {"DCGM_FI_DEV_FB_USED_BYTES", 1 << 20},
	"DCGM_FI_DEV_FB_RESERVED":                 {"DCGM_FI_DEV_FB_RESERVED_BYTES", 1 << 20},
	"DCGM_FI_DEV_FB_TOTAL":                    {"DCGM_FI_DEV_FB_CAPACITY_BYTES", 1 << 20},
	"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL":      {"DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL", 1 << 20},
	"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": {"DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL", 1},
	"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS":   {"DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL", 1},
	"DCGM_FI_DEV_ROW_REMAP_FAILURE":           {"DCGM_FI_DEV_ROW_REMAP_FAILED", 1},
	"DCGM_FI_PROF_GR_ENGINE_ACTIVE":           {"DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", 1},
	"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE":         {"DCGM_FI_PROF_TENSOR_UTIL_RATIO", 1},
	"DCGM_FI_PROF_DRAM_ACTIVE":                {"DCGM_FI_PROF_DRAM_UTIL_RATIO", 1},
}

// defaultCountersOff marks the DCGM families dcgm-exporter's default
// counters CSV does not export.
func defaultCountersOff() []bool {
	off := make([]bool, len(Catalogue))
	for i := range Catalogue {
		if d := &Catalogue[i]; d.Source == SourceDCGM && !d.DCGMDefault {
			off[d.ID] = true
		}
	}
	return off
}
