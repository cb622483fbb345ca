package gpusim

import (
	"testing"
	"time"
)

// dcgmDefaultCounters is dcgm-exporter's default counter list
// (etc/default-counters.csv) as recorded in shared/reference/facts.md. It is
// held here, independently of Catalogue, so a change to the catalogue that
// drifts from the exporter fails this test.
var dcgmDefaultCounters = map[string]string{
	"DCGM_FI_DEV_SM_CLOCK":                    "gauge",
	"DCGM_FI_DEV_MEM_CLOCK":                   "gauge",
	"DCGM_FI_DEV_MEMORY_TEMP":                 "gauge",
	"DCGM_FI_DEV_GPU_TEMP":                    "gauge",
	"DCGM_FI_DEV_POWER_USAGE":                 "gauge",
	"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION":    "counter",
	"DCGM_FI_DEV_PCIE_REPLAY_COUNTER":         "counter",
	"DCGM_FI_DEV_GPU_UTIL":                    "gauge",
	"DCGM_FI_DEV_MEM_COPY_UTIL":               "gauge",
	"DCGM_FI_DEV_ENC_UTIL":                    "gauge",
	"DCGM_FI_DEV_DEC_UTIL":                    "gauge",
	"DCGM_FI_DEV_XID_ERRORS":                  "gauge",
	"DCGM_FI_DEV_FB_FREE":                     "gauge",
	"DCGM_FI_DEV_FB_USED":                     "gauge",
	"DCGM_FI_DEV_FB_RESERVED":                 "gauge",
	"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL":      "counter",
	"DCGM_FI_DEV_VGPU_LICENSE_STATUS":         "gauge",
	"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "counter",
	"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS":   "counter",
	"DCGM_FI_DEV_ROW_REMAP_FAILURE":           "gauge",
	"DCGM_FI_PROF_GR_ENGINE_ACTIVE":           "gauge",
	"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE":         "gauge",
	"DCGM_FI_PROF_DRAM_ACTIVE":                "gauge",
	"DCGM_FI_PROF_PCIE_TX_BYTES":              "gauge",
	"DCGM_FI_PROF_PCIE_RX_BYTES":              "gauge",
}

// dcgmExtraFields are the commented-out fields the source document uses.
var dcgmExtraFields = map[string]string{
	"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL":                 "counter",
	"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL":                 "counter",
	"DCGM_FI_DEV_RETIRED_SBE":                       "counter",
	"DCGM_FI_DEV_RETIRED_DBE":                       "counter",
	"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "counter",
	"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS":            "gauge",
	"DCGM_FI_DEV_FB_TOTAL":                          "gauge",
	"DCGM_FI_DEV_GPU_MAX_OP_TEMP":                   "gauge",
	"DCGM_FI_DEV_MEM_MAX_OP_TEMP":                   "gauge",
}

func TestCatalogueMatchesDCGMExporter(t *testing.T) {
	if len(dcgmDefaultCounters) != 25 {
		t.Fatalf("held list has %d entries, want 25", len(dcgmDefaultCounters))
	}
	defaults := 0
	for _, d := range Catalogue {
		if d.DCGMDefault {
			defaults++
			if _, ok := dcgmDefaultCounters[d.Name]; !ok {
				t.Errorf("%s is marked DCGMDefault but is not in dcgm-exporter's default list", d.Name)
			}
		}
		if d.Help == "" {
			t.Errorf("%s has no HELP", d.Name)
		}
	}
	if defaults != 25 {
		t.Errorf("catalogue marks %d families DCGMDefault, want 25", defaults)
	}
	for _, held := range []map[string]string{dcgmDefaultCounters, dcgmExtraFields} {
		for name, typ := range held {
			d, ok := LookupMetric(name)
			if !ok {
				t.Errorf("%s missing from the catalogue", name)
				continue
			}
			if d.Type.String() != typ {
				t.Errorf("%s: catalogue type %s, dcgm-exporter %s", name, d.Type, typ)
			}
		}
	}
	if d, ok := LookupMetric("training_iteration_time_seconds_bucket"); !ok || d.Type != Histogram {
		t.Errorf("histogram series do not resolve to their family")
	}
}

// TestSimulatorEmitsDCGMDefaults checks every GPU emits each held DCGM field
// once with the held type and dcgm-exporter's labels, with pod/namespace/
// container exactly when a job holds the GPU.
func TestSimulatorEmitsDCGMDefaults(t *testing.T) {
	c := newTestCluster(t, Config{Nodes: 16, Seed: 3})
	at := t0.Add(90 * time.Minute)
	series := c.AppendSamples(nil, at, Replica{})
	perGPU := map[string]map[string]int{} // UUID -> name -> count
	podHeld := map[string]bool{}
	for _, s := range series {
		if s.Desc.Source != SourceDCGM {
			continue
		}
		want, ok := dcgmDefaultCounters[s.Name()]
		if !ok {
			want, ok = dcgmExtraFields[s.Name()]
		}
		if !ok {
			t.Fatalf("unexpected DCGM series %s", s.Name())
		}
		if s.Desc.Type.String() != want {
			t.Errorf("%s emitted as %s, want %s", s.Name(), s.Desc.Type, want)
		}
		for _, l := range DCGMLabelNames {
			if s.Get(l) == "" {
				t.Fatalf("%s lacks label %s", s.String(), l)
			}
		}
		if s.Get("device") != "nvidia"+s.Get("gpu") {
			t.Errorf("device %q does not match gpu %q", s.Get("device"), s.Get("gpu"))
		}
		pods := 0
		for _, l := range PodLabelNames {
			if s.Get(l) != "" {
				pods++
			}
		}
		if pods != 0 && pods != 3 {
			t.Errorf("%s has %d of the 3 pod labels", s.String(), pods)
		}
		uuid := s.Get("UUID")
		if perGPU[uuid] == nil {
			perGPU[uuid] = map[string]int{}
		}
		perGPU[uuid][s.Name()]++
		if pods == 3 {
			podHeld[uuid] = true
		}
		if len(s.Labels) > 30 {
			t.Errorf("%s has %d labels (Mimir's default limit is 30)", s.Name(), len(s.Labels))
		}
	}
	if len(perGPU) != 16*8 {
		t.Fatalf("%d GPUs emitted, want 128", len(perGPU))
	}
	for uuid, names := range perGPU {
		if len(names) != len(dcgmDefaultCounters)+len(dcgmExtraFields) {
			t.Errorf("GPU %s emits %d DCGM fields, want %d", uuid, len(names), len(dcgmDefaultCounters)+len(dcgmExtraFields))
		}
		for n, k := range names {
			if k != 1 {
				t.Errorf("GPU %s emits %s %d times", uuid, n, k)
			}
		}
	}
	// Jobs hold some GPUs and leave others idle (12% of slots idle, gaps
	// between jobs): both must occur in a 128-GPU cluster.
	if len(podHeld) == 0 || len(podHeld) == len(perGPU) {
		t.Errorf("%d of %d GPUs held by pods; want some but not all", len(podHeld), len(perGPU))
	}
	// Idle GPUs carry the GPU-idle throttle bit and draw idle power.
	for _, s := range find(series, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS") {
		if !podHeld[s.Get("UUID")] && int(s.V)&ThrottleGPUIdle == 0 {
			t.Errorf("idle GPU %s: throttle reasons %#x lack GPU idle", s.Get("UUID"), int(s.V))
		}
	}
}
