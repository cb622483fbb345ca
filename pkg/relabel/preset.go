package relabel

import (
	"fmt"
	"strings"

	"github.com/prometheus/prometheus/model/relabel"
)

// PresetDCGM is the dcgm-exporter preset (ingest_preset: dcgm).
const PresetDCGM = "dcgm"

// The dcgm preset's driver info series: the ingester writes
// DriverInfoMetric{UUID, <host label>, driver_version} 1 for each GPU whose
// metrics carry DriverVersionLabel, which the preset's rules drop.
const (
	DriverVersionLabel = "DCGM_FI_DRIVER_VERSION"
	// DriverVersionLabel49 is the driver label's name from dcgm-exporter
	// 4.9 on (DCGM 4.6's name for field 1); the preset treats it alike.
	DriverVersionLabel49 = "DCGM_FI_SYSTEM_DRIVER_VERSION"
	DriverInfoMetric     = "dcgm_gpu_driver_info"
	DriverInfoVersion    = "driver_version"
	UUIDLabel            = "UUID"
)

// Host label names of dcgm-exporter: "Hostname" up to the 4.x releases,
// "hostname" in newer ones.
const (
	HostnameOld = "Hostname"
	HostnameNew = "hostname"
)

func dcgmHostLabel(s string) (string, error) {
	switch s {
	case "", HostnameOld:
		return HostnameOld, nil
	case HostnameNew:
		return HostnameNew, nil
	}
	return "", fmt.Errorf("dcgm_hostname_label %q: want %q or %q", s, HostnameOld, HostnameNew)
}

// dcgmPresetYAML is the preset as the metric_relabel_configs a user would
// write; {{keep}} and {{rename}} are the host label names. The rules only
// touch series named DCGM_* (dcgm-exporter's), except the last one, whose
// label only dcgm-exporter writes.
const dcgmPresetYAML = `# gpustore's dcgm ingest preset (ingest_preset: dcgm), as ordinary
# metric_relabel_configs: copy them into a tenant's metric_relabel_configs
# (or a Prometheus scrape config) to change them. Host label kept: {{keep}}.
#
# 1. dcgm-exporter renamed its host label (Hostname up to 4.x, hostname
#    after): one name for both, so a GPU's series keep their identity, and
#    rate() and dashboards stay continuous across an exporter upgrade.
- source_labels: [__name__, {{rename}}]
  regex: 'DCGM_.+;(.+)'
  target_label: {{keep}}
  replacement: '$1'
- source_labels: [__name__, {{rename}}]
  regex: 'DCGM_.+;.+'
  target_label: {{rename}}
  replacement: ''
# 2. Scraped through a Service, the workload's pod labels arrive as
#    exported_pod, exported_namespace and exported_container (the target's
#    own pod labels win). Where pod, namespace or container is empty, the
#    exported_ label's value moves there: __tmp_dcgm_<label> marks a move,
#    the exported_ label is removed, the mark is dropped at the end.
- source_labels: [__name__, pod, exported_pod]
  regex: 'DCGM_.+;;(.+)'
  target_label: __tmp_dcgm_pod
  replacement: '$1'
- source_labels: [__name__, namespace, exported_namespace]
  regex: 'DCGM_.+;;(.+)'
  target_label: __tmp_dcgm_namespace
  replacement: '$1'
- source_labels: [__name__, container, exported_container]
  regex: 'DCGM_.+;;(.+)'
  target_label: __tmp_dcgm_container
  replacement: '$1'
- source_labels: [__tmp_dcgm_pod]
  regex: '(.+)'
  target_label: pod
  replacement: '$1'
- source_labels: [__tmp_dcgm_namespace]
  regex: '(.+)'
  target_label: namespace
  replacement: '$1'
- source_labels: [__tmp_dcgm_container]
  regex: '(.+)'
  target_label: container
  replacement: '$1'
- source_labels: [__tmp_dcgm_pod]
  regex: '.+'
  target_label: exported_pod
  replacement: ''
- source_labels: [__tmp_dcgm_namespace]
  regex: '.+'
  target_label: exported_namespace
  replacement: ''
- source_labels: [__tmp_dcgm_container]
  regex: '.+'
  target_label: exported_container
  replacement: ''
- action: labeldrop
  regex: '__tmp_dcgm_.+'
# 3. The driver version is a label on every metric: a driver upgrade would
#    re-create every series of every GPU. It is dropped here (under both its
#    names: DCGM_FI_SYSTEM_DRIVER_VERSION from dcgm-exporter 4.9 on);
#    gpustore keeps it once per GPU as
#    dcgm_gpu_driver_info{UUID, {{keep}}, driver_version} 1 (written by the
#    ingester with the preset on: no relabel rule can make a new series).
- action: labeldrop
  regex: DCGM_FI_DRIVER_VERSION|DCGM_FI_SYSTEM_DRIVER_VERSION
# 4. dcgm-exporter 4.9 (DCGM 4.7) renamed its default metrics: each is
#    stored under the name earlier exporters gave it, so rules, dashboards
#    and history read one series per GPU across the upgrade. Where 4.9 also
#    changed the unit, gpustore's ingester converts the value back (MHz,
#    mJ, percent, MiB, MiB/s) with the preset on; these rules alone rename
#    only (a Prometheus using them would store 4.9's values).
{{renames}}`

// Metric49 is one of dcgm-exporter 4.9's renamed default metrics: the
// name earlier exporters gave it (the canonical name the preset stores),
// and how to convert 4.9's unit to the canonical one: value * Mul / Div
// (1 and 1: same unit). A factor and a divisor rather than one factor: a
// clock of 1980000000 Hz is 1980 MHz exactly when divided by 1e6, not when
// multiplied by 1e-6.
type Metric49 struct {
	Name, Canonical string
	Mul, Div        float64
}

// Metrics49 are dcgm-exporter 4.9's renamed default and profiling-preset
// metrics, by their 4.9 names. Sources: the release notes of 4.9.0 (23
// fields renamed to DCGM 4.7 names; clocks MHz→Hz, energy mJ→J,
// utilisation %→ratio, GPU memory MiB→bytes, NVLink throughput MB/s→bytes/s;
// DCGM_FI_DEV_FB_CAPACITY_BYTES) and, for the names, DCGM's own tables:
// DCGM 4.6.0's dcgm_fields.h (its deprecated aliases: *_CELSIUS,
// BOARD_POWER_WATTS, PCIE_REPLAY_TOTAL, GPU_UTIL_RATIO, XID_ERROR, the
// ROW_REMAP_* and PROF_*_RATIO names, NVLINK_THROUGHPUT_TOTAL) and go-dcgm
// 1.4611's field table (DCGM 4.6.1: SM_CLOCK_HERTZ, MEMORY_CLOCK_HERTZ,
// GPU_ENERGY_JOULES_TOTAL, each "Deprecated: Use ..." for the old field).
// The framebuffer *_BYTES and the copy/encoder/decoder *_UTIL_RATIO names
// follow DCGM's field naming standard (dcgm_field_naming.py, v4.6.0) and
// the release notes; 4.9's own source could not be read to confirm them.
// NVLink "MB/s" is taken as MiB/s, DCGM's ReadAndCacheNvLinkBandwidth unit.
var Metrics49 = []Metric49{
	{"DCGM_FI_DEV_SM_CLOCK_HERTZ", "DCGM_FI_DEV_SM_CLOCK", 1, 1e6},
	{"DCGM_FI_DEV_MEMORY_CLOCK_HERTZ", "DCGM_FI_DEV_MEM_CLOCK", 1, 1e6},
	{"DCGM_FI_DEV_MEMORY_TEMP_CELSIUS", "DCGM_FI_DEV_MEMORY_TEMP", 1, 1},
	{"DCGM_FI_DEV_GPU_TEMP_CELSIUS", "DCGM_FI_DEV_GPU_TEMP", 1, 1},
	{"DCGM_FI_DEV_BOARD_POWER_WATTS", "DCGM_FI_DEV_POWER_USAGE", 1, 1},
	{"DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1e3, 1},
	{"DCGM_FI_DEV_PCIE_REPLAY_TOTAL", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 1, 1},
	{"DCGM_FI_DEV_GPU_UTIL_RATIO", "DCGM_FI_DEV_GPU_UTIL", 100, 1},
	{"DCGM_FI_DEV_MEMORY_COPY_UTIL_RATIO", "DCGM_FI_DEV_MEM_COPY_UTIL", 100, 1},
	{"DCGM_FI_DEV_ENC_UTIL_RATIO", "DCGM_FI_DEV_ENC_UTIL", 100, 1},
	{"DCGM_FI_DEV_DEC_UTIL_RATIO", "DCGM_FI_DEV_DEC_UTIL", 100, 1},
	{"DCGM_FI_DEV_XID_ERROR", "DCGM_FI_DEV_XID_ERRORS", 1, 1},
	{"DCGM_FI_DEV_FB_FREE_BYTES", "DCGM_FI_DEV_FB_FREE", 1, 1 << 20},
	{"DCGM_FI_DEV_FB_USED_BYTES", "DCGM_FI_DEV_FB_USED", 1, 1 << 20},
	{"DCGM_FI_DEV_FB_RESERVED_BYTES", "DCGM_FI_DEV_FB_RESERVED", 1, 1 << 20},
	{"DCGM_FI_DEV_FB_CAPACITY_BYTES", "DCGM_FI_DEV_FB_TOTAL", 1, 1 << 20},
	{"DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", 1, 1 << 20},
	{"DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", 1, 1},
	{"DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", 1, 1},
	{"DCGM_FI_DEV_ROW_REMAP_FAILED", "DCGM_FI_DEV_ROW_REMAP_FAILURE", 1, 1},
	{"DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", 1, 1},
	{"DCGM_FI_PROF_TENSOR_UTIL_RATIO", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 1, 1},
	{"DCGM_FI_PROF_DRAM_UTIL_RATIO", "DCGM_FI_PROF_DRAM_ACTIVE", 1, 1},
	{"DCGM_FI_PROF_SM_UTIL_RATIO", "DCGM_FI_PROF_SM_ACTIVE", 1, 1},
	{"DCGM_FI_PROF_SM_OCCUPANCY_RATIO", "DCGM_FI_PROF_SM_OCCUPANCY", 1, 1},
}

// unit49 is Metrics49's conversions by 4.9 name, for the ones that change
// unit.
var unit49 = func() map[string][2]float64 {
	m := map[string][2]float64{}
	for _, r := range Metrics49 {
		if r.Mul != 1 || r.Div != 1 {
			m[r.Name] = [2]float64{r.Mul, r.Div}
		}
	}
	return m
}()

// DCGMUnitScale returns how to convert a sample of the series named name,
// as dcgm-exporter sent it, to the unit the dcgm preset stores it in:
// value * mul / div; ok false: the value is kept. Only names dcgm-exporter
// 4.9 gave a new unit have one.
func DCGMUnitScale(name string) (mul, div float64, ok bool) {
	u, ok := unit49[name]
	return u[0], u[1], ok
}

// DCGMPresetYAML returns the dcgm preset's rules as YAML, for the host label
// hostLabel ("Hostname" or "hostname").
func DCGMPresetYAML(hostLabel string) string {
	rename := HostnameNew
	if hostLabel == HostnameNew {
		rename = HostnameOld
	}
	var renames strings.Builder
	for _, r := range Metrics49 {
		fmt.Fprintf(&renames, "- source_labels: [__name__]\n  regex: %s\n  target_label: __name__\n  replacement: %s\n", r.Name, r.Canonical)
	}
	return strings.NewReplacer("{{keep}}", hostLabel, "{{rename}}", rename, "{{renames}}", renames.String()).Replace(dcgmPresetYAML)
}

// DCGMPreset returns the dcgm preset's rules for the host label hostLabel
// ("Hostname" or "hostname"); they are ordinary relabel rules, parsed from
// DCGMPresetYAML.
func DCGMPreset(hostLabel string) []*relabel.Config {
	cfgs, err := ParseConfigs(DCGMPresetYAML(hostLabel))
	if err != nil {
		panic(fmt.Sprintf("dcgm preset does not parse: %v", err)) // a test parses both variants
	}
	return cfgs
}
