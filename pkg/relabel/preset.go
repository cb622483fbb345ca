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
	DriverInfoMetric   = "dcgm_gpu_driver_info"
	DriverInfoVersion  = "driver_version"
	UUIDLabel          = "UUID"
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
#    re-create every series of every GPU. It is dropped here; gpustore keeps
#    it once per GPU as dcgm_gpu_driver_info{UUID, {{keep}}, driver_version} 1
#    (written by the ingester with the preset on: no relabel rule can make
#    a new series).
- action: labeldrop
  regex: DCGM_FI_DRIVER_VERSION
`

// DCGMPresetYAML returns the dcgm preset's rules as YAML, for the host label
// hostLabel ("Hostname" or "hostname").
func DCGMPresetYAML(hostLabel string) string {
	rename := HostnameNew
	if hostLabel == HostnameNew {
		rename = HostnameOld
	}
	return strings.NewReplacer("{{keep}}", hostLabel, "{{rename}}", rename).Replace(dcgmPresetYAML)
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
