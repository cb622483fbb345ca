package gpusim

import (
	"fmt"
	"strings"
)

// GPU models the simulator can play (Config.GPUModel).
const (
	// ModelH100 is an HGX H100 80GB SXM board (NVLink4): the default.
	ModelH100 = "H100"
	// ModelB200 is an HGX B200 board (NVLink5): DCGM exports its NVLink
	// errors through the DCGM_FI_DEV_NVLINK_COUNT_* fields instead of the
	// per-link CRC/replay/recovery counters (DCGM's health watch reads only
	// those on Blackwell, DcgmHealthWatch.cpp).
	ModelB200 = "B200"
	// ModelA100 is an HGX A100 80GB SXM4 board (NVLink3, PCIe Gen4 x16):
	// DCGM's PCIe replay limit for its link is 16 a minute (31 at an
	// H100's Gen5), which GPUPCIeReplayRate reads from modelName when the
	// link fields are not exported.
	ModelA100 = "A100"
)

// hardware is what a GPU model fixes: the modelName label, memory, power,
// clocks, thermal limits, NVLink generation and MIG layout.
type hardware struct {
	name         string  // modelName label, as NVML reports it
	fbTotal      float64 // MiB, FB_TOTAL
	fbReserved   float64 // MiB
	pMax         float64 // W, TDP
	memClock     float64 // MHz
	idleSMClock  float64 // MHz
	boostSMClock float64 // MHz
	gpuMaxOpTemp float64 // °C, where the SW thermal slowdown starts
	memMaxOpTemp float64 // °C
	nvlinkMax    float64 // bytes/s, TX+RX over all links
	nvlink5      bool
	// mig is the layout a GPU in MIG mode is split into (mig fault).
	mig []migInstance
}

// migInstance is one GPU instance as dcgm-exporter labels it
// (GPU_I_PROFILE, GPU_I_ID) with its share of the framebuffer and of the
// compute slices (of 7).
type migInstance struct {
	profile string
	id      string
	fb      float64 // MiB
	slices  int
}

var hardwareModels = map[string]*hardware{
	ModelA100: {
		name: "NVIDIA A100-SXM4-80GB", fbTotal: 81920, fbReserved: 567, pMax: 400,
		memClock: 1593, idleSMClock: 210, boostSMClock: 1410,
		gpuMaxOpTemp: 85, memMaxOpTemp: 95,
		nvlinkMax: 600e9, // 12 NVLink3 links × 50 GB/s
		mig:       []migInstance{{"3g.40gb", "1", 40192, 3}, {"2g.20gb", "5", 19968, 2}, {"1g.10gb", "13", 9856, 1}, {"1g.10gb", "14", 9856, 1}},
	},
	ModelH100: {
		name: "NVIDIA H100 80GB HBM3", fbTotal: 81559, fbReserved: 583, pMax: 700,
		memClock: 2619, idleSMClock: 345, boostSMClock: 1980,
		// nvidia-smi -q of an H100 SXM: "GPU Max Operating Temp 87 C",
		// "Memory Max Operating Temp 95 C".
		gpuMaxOpTemp: 87, memMaxOpTemp: 95,
		nvlinkMax: 900e9, // 18 NVLink4 links × 50 GB/s
		// A 3g.40gb + 2g.20gb + 2×1g.10gb split (7 compute slices); the
		// GPU instance ids are the ones NVML assigns those placements.
		mig: []migInstance{{"3g.40gb", "1", 40192, 3}, {"2g.20gb", "5", 19968, 2}, {"1g.10gb", "13", 9856, 1}, {"1g.10gb", "14", 9856, 1}},
	},
	ModelB200: {
		name: "NVIDIA B200", fbTotal: 183359, fbReserved: 1024, pMax: 1000,
		memClock: 3996, idleSMClock: 345, boostSMClock: 1965,
		gpuMaxOpTemp: 87, memMaxOpTemp: 95,
		nvlinkMax: 1800e9, // 18 NVLink5 links × 100 GB/s
		nvlink5:   true,
		mig:       []migInstance{{"3g.90gb", "1", 90112, 3}, {"2g.45gb", "5", 45056, 2}, {"1g.23gb", "13", 22528, 1}, {"1g.23gb", "14", 22528, 1}},
	},
}

// GPUModels lists the models Config.GPUModel accepts.
func GPUModels() []string { return []string{ModelH100, ModelB200, ModelA100} }

func lookupHardware(model string) (*hardware, error) {
	if hw, ok := hardwareModels[strings.ToUpper(model)]; ok {
		return hw, nil
	}
	return nil, fmt.Errorf("gpu model %q: want one of %v", model, GPUModels())
}
