package downsample

import (
	"strings"

	"github.com/prometheus/common/model"

	"github.com/gpustore/gpustore/pkg/block"
)

// Kind is how a raw series is downsampled.
type Kind uint8

const (
	// Gauge series get count, sum, min and max per window.
	Gauge Kind = iota
	// Counter series get the counter aggregate (kept samples, see the package comment).
	Counter
)

// TypeLookup returns the metadata type of a metric family, as the tenant's
// metadata store (pkg/tenantdb) records it from remote write; ok is false
// when nothing was sent for the family.
type TypeLookup func(family string) (typ model.MetricType, ok bool)

// dcgmCounters are the dcgm-exporter fields that are counters although their
// names do not say so (facts.md: dcgm-exporter default-counters.csv and the
// fields named by the source document). DCGM_FI_DEV_FB_TOTAL ends in _TOTAL
// and is a gauge, so the suffix alone cannot decide.
var dcgmCounters = map[string]bool{
	"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION":          true,
	"DCGM_FI_DEV_PCIE_REPLAY_COUNTER":               true,
	"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS":       true,
	"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS":         true,
	"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL":                 true,
	"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL":                 true,
	"DCGM_FI_DEV_ECC_SBE_AGG_TOTAL":                 true,
	"DCGM_FI_DEV_ECC_DBE_AGG_TOTAL":                 true,
	"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": true,
	"DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": true,
	"DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL":   true,
	"DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": true,
	// Throttling time: dcgm-exporter's counters.csv types the violation
	// fields as counters (microseconds or nanoseconds of throttling, by
	// version), and DCGM's clock-event reason fields (dcgm_fields.h: "in
	// ns", 1420-1424) accumulate the same way.
	"DCGM_FI_DEV_POWER_VIOLATION":                                true,
	"DCGM_FI_DEV_THERMAL_VIOLATION":                              true,
	"DCGM_FI_DEV_SYNC_BOOST_VIOLATION":                           true,
	"DCGM_FI_DEV_BOARD_LIMIT_VIOLATION":                          true,
	"DCGM_FI_DEV_LOW_UTIL_VIOLATION":                             true,
	"DCGM_FI_DEV_RELIABILITY_VIOLATION":                          true,
	"DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP_NS":            true,
	"DCGM_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST_NS":              true,
	"DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN_NS":       true,
	"DCGM_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN_NS":       true,
	"DCGM_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN_NS": true,
}

// dcgmGaugeValued are dcgm-exporter fields that its CSVs type as counters
// (so their metadata says counter) whose values are gauges: NVLINK_BANDWIDTH_TOTAL
// is DCGM's throughput over its last two readings in MiB/s
// (DcgmCacheManager's NVLink bandwidth read), not a byte count, and falls
// as often as it rises. Downsampled as a counter every fall would be a
// "reset" kept with its neighbour; as a gauge its windows keep min, max and
// mean, which is what its panels read.
var dcgmGaugeValued = map[string]bool{
	"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": true,
}

// familySuffixes end the names of a histogram's, summary's or counter's
// series whose family name lacks them.
var familySuffixes = []string{"_bucket", "_count", "_sum", "_total"}

// TypesOf returns the types lookup knows of the families that series named
// names belong to, as Classify looks them up (the name itself, and the name
// without one of familySuffixes): what a block's metric-types object holds
// (pkg/block.Types).
func TypesOf(names []string, lookup TypeLookup) block.Types {
	out := block.Types{}
	add := func(fam string) {
		if typ, ok := lookup(fam); ok && typ != "" && typ != model.MetricTypeUnknown {
			out[fam] = typ
		}
	}
	for _, name := range names {
		add(name)
		for _, suffix := range familySuffixes {
			if fam, ok := strings.CutSuffix(name, suffix); ok {
				add(fam)
			}
		}
	}
	return out
}

// Classify decides how the series named name is downsampled: from its
// family's metadata first (a histogram's or summary's _bucket/_count/_sum
// series are counters, a summary's quantile series are gauges), then from
// the name. The few fields whose metadata misstates their values
// (dcgmGaugeValued) are decided by name first. hasQuantile says whether the series has a "quantile" label.
func Classify(name string, hasQuantile bool, lookup TypeLookup) Kind {
	if dcgmGaugeValued[name] {
		return Gauge
	}
	if lookup != nil {
		if typ, ok := lookup(name); ok {
			switch typ {
			case model.MetricTypeCounter:
				return Counter
			case model.MetricTypeSummary:
				if hasQuantile {
					return Gauge
				}
			case model.MetricTypeGauge, model.MetricTypeGaugeHistogram, model.MetricTypeInfo, model.MetricTypeStateset:
				return Gauge
			}
		}
		for _, suffix := range familySuffixes {
			fam, ok := strings.CutSuffix(name, suffix)
			if !ok {
				continue
			}
			if typ, ok := lookup(fam); ok {
				switch typ {
				case model.MetricTypeHistogram, model.MetricTypeSummary, model.MetricTypeCounter:
					return Counter
				case model.MetricTypeGaugeHistogram, model.MetricTypeGauge:
					return Gauge
				}
			}
		}
	}
	if dcgmCounters[name] {
		return Counter
	}
	for _, suffix := range familySuffixes {
		if strings.HasSuffix(name, suffix) {
			return Counter
		}
	}
	return Gauge
}
