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

// dcgmPackFields are the fields the rule pack and dashboards read beyond
// those (deploy/rules), with the type dcgm-exporter gives them: its own
// per-code Xid count (xid_collector.go), DCGM fields 1523 (recovery action,
// under its DCGM <= 4.5 name), 396 (row remap pending), 1420-1424 (clock
// event time, ns) and the NVLink4 error counters (dcgm_fields.h, DCGM 4.5.3).
var dcgmPackFields = map[string]string{
	"DCGM_EXP_XID_ERRORS_COUNT":                                  "counter",
	"DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION":                        "gauge",
	"DCGM_FI_DEV_ROW_REMAP_PENDING":                              "gauge",
	"DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP_NS":            "counter",
	"DCGM_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST_NS":              "counter",
	"DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN_NS":       "counter",
	"DCGM_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN_NS":       "counter",
	"DCGM_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN_NS": "counter",
	"DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL":              "counter",
	"DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL":                "counter",
	"DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL":              "counter",
}

// dcgmNVLink5Fields replace the NVLink4 error counters on a B200: the
// fields DCGM's NVLink health watch reads on Blackwell (DcgmHealthWatch.cpp,
// MonitorNVLink5Fields and the recovery events).
var dcgmNVLink5Fields = map[string]string{
	"DCGM_FI_DEV_NVLINK_COUNT_RX_ERRORS":                       "counter",
	"DCGM_FI_DEV_NVLINK_COUNT_RX_SYMBOL_ERRORS":                "counter",
	"DCGM_FI_DEV_NVLINK_COUNT_RX_MALFORMED_PACKET_ERRORS":      "counter",
	"DCGM_FI_DEV_NVLINK_COUNT_RX_BUFFER_OVERRUN_ERRORS":        "counter",
	"DCGM_FI_DEV_NVLINK_COUNT_RX_REMOTE_ERRORS":                "counter",
	"DCGM_FI_DEV_NVLINK_COUNT_RX_GENERAL_ERRORS":               "counter",
	"DCGM_FI_DEV_NVLINK_COUNT_LOCAL_LINK_INTEGRITY_ERRORS":     "counter",
	"DCGM_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS":                "counter",
	"DCGM_FI_DEV_NVLINK_COUNT_SYMBOL_BER":                      "gauge",
	"DCGM_FI_DEV_NVLINK_COUNT_EFFECTIVE_BER":                   "gauge",
	"DCGM_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS":            "counter",
	"DCGM_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS": "counter",
	"DCGM_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS":     "counter",
	"DCGM_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_TOTAL":            "counter",
}

// heldType returns the held type of a DCGM field and whether it is held.
func heldType(name string) (string, bool) {
	for _, held := range []map[string]string{dcgmDefaultCounters, dcgmExtraFields, dcgmPackFields, dcgmNVLink5Fields} {
		if typ, ok := held[name]; ok {
			return typ, true
		}
	}
	return "", false
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
	for _, held := range []map[string]string{dcgmDefaultCounters, dcgmExtraFields, dcgmPackFields, dcgmNVLink5Fields} {
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
		want, ok := heldType(s.Name())
		if _, nvl5 := dcgmNVLink5Fields[s.Name()]; !ok || nvl5 {
			t.Fatalf("unexpected DCGM series %s on an H100", s.Name())
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
	wantFields := len(dcgmDefaultCounters) + len(dcgmExtraFields) + len(dcgmPackFields)
	if n := len(c.DCGMFamilies()); n != wantFields {
		t.Errorf("DCGMFamilies lists %d, want %d", n, wantFields)
	}
	for uuid, names := range perGPU {
		if len(names) != wantFields {
			t.Errorf("GPU %s emits %d DCGM fields, want %d", uuid, len(names), wantFields)
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
