package gpusim

import "fmt"

// MetricType is the Prometheus metric type of a family, as it appears in the
// text format's "# TYPE" line and in remote-write metadata.
type MetricType uint8

// Metric types the simulator emits.
const (
	Counter MetricType = iota + 1
	Gauge
	Histogram
)

func (t MetricType) String() string {
	switch t {
	case Counter:
		return "counter"
	case Gauge:
		return "gauge"
	case Histogram:
		return "histogram"
	}
	return "unknown"
}

// Source says which exporter would expose a family in a real cluster.
type Source uint8

// Sources of the simulated families.
const (
	SourceDCGM Source = iota + 1
	SourceNodeExporter
	SourceCAdvisor
	SourceTraining
	SourceKubeStateMetrics
	// SourcePrometheus marks series that Prometheus itself makes while
	// scraping (only `up`); emitted only when the simulator plays the
	// scraping Prometheus (Config.TargetLabels).
	SourcePrometheus
	// SourcePushgateway: a batch job's results pushed to a Pushgateway
	// (the source document's nccl-tests script), served with the cluster
	// scope's page.
	SourcePushgateway
)

func (s Source) String() string {
	switch s {
	case SourceDCGM:
		return "dcgm-exporter"
	case SourceNodeExporter:
		return "node-exporter"
	case SourceCAdvisor:
		return "cadvisor"
	case SourceTraining:
		return "training"
	case SourceKubeStateMetrics:
		return "kube-state-metrics"
	case SourcePrometheus:
		return "prometheus"
	case SourcePushgateway:
		return "pushgateway"
	}
	return "unknown"
}

// MetricDesc describes one metric family.
type MetricDesc struct {
	ID     int // position in Catalogue
	Name   string
	Type   MetricType
	Help   string
	Unit   string // informative only: the text format has no unit, so none is sent
	Source Source
	// DCGMDefault marks the 25 fields of dcgm-exporter's etc/default-counters.csv.
	DCGMDefault bool
	// Jitter marks continuous gauges whose value two scrapes of the same
	// target a few hundred ms apart may see slightly differently. Codes,
	// bitmasks, states, integer readings and counters never get jitter.
	Jitter bool
}

// Family IDs, in Catalogue order. The text page lists families in this order.
const (
	FamSMClock = iota
	FamMemClock
	FamMemoryTemp
	FamGPUTemp
	FamPowerUsage
	FamTotalEnergy
	FamPCIeReplay
	FamGPUUtil
	FamMemCopyUtil
	FamEncUtil
	FamDecUtil
	FamXIDErrors
	FamFBFree
	FamFBUsed
	FamFBReserved
	FamNVLinkBandwidth
	FamVGPULicense
	FamUncorrectableRemappedRows
	FamCorrectableRemappedRows
	FamRowRemapFailure
	FamProfGREngineActive
	FamProfPipeTensorActive
	FamProfDRAMActive
	FamProfPCIeTxBytes
	FamProfPCIeRxBytes
	FamECCSBEVolTotal
	FamECCDBEVolTotal
	FamRetiredSBE
	FamRetiredDBE
	FamNVLinkCRCFlitErrors
	FamClockThrottleReasons
	FamFBTotal
	FamGPUMaxOpTemp
	FamMemMaxOpTemp
	FamXIDErrorsCount
	FamGetGPURecoveryAction
	FamGPURecoveryAction
	FamRowRemapPending
	FamClockEventSWPowerCapNS
	FamClockEventSyncBoostNS
	FamClockEventSWThermalNS
	FamClockEventHWThermalNS
	FamClockEventHWPowerBrakeNS
	FamNVLinkCRCDataErrors
	FamNVLinkReplayErrors
	FamNVLinkRecoveryErrors
	FamNVL5RxErrors
	FamNVL5RxSymbolErrors
	FamNVL5RxMalformedPacketErrors
	FamNVL5RxBufferOverrunErrors
	FamNVL5RxRemoteErrors
	FamNVL5RxGeneralErrors
	FamNVL5LocalLinkIntegrityErrors
	FamNVL5EffectiveErrors
	FamNVL5SymbolBER
	FamNVL5EffectiveBER
	FamNVL5LinkRecoveryEvents
	FamNVL5LinkRecoverySuccessful
	FamNVL5LinkRecoveryFailed
	FamNVLinkECCDataErrors

	FamNodeCPUSeconds
	FamNodeMemAvailable
	FamNodeMemTotal
	FamNodeFSAvail
	FamNodeFSSize
	FamNodeNetRxBytes
	FamNodeNetTxBytes
	FamNodeNetRxDrop
	FamNodeNetTxDrop

	FamContainerCPU
	FamContainerMemWorkingSet
	FamContainerOOMEvents

	FamTrainIterTime
	FamTrainTokensPerSecond
	FamTrainLoss
	FamTrainGradNorm
	FamTrainLearningRate
	FamTrainMFU
	FamTrainDataLoadTime

	FamKubeNodeCondition
	FamKubeNodeInfo
	FamKubePodPhase
	FamKubeJobActive
	FamKubePodOwner
	FamKubePodInfo
	FamKubeNodeUnschedulable

	FamNCCLBandwidth

	FamUp

	numFamilies
)

// Catalogue is every family the simulator can emit. DCGM help strings are the
// ones dcgm-exporter prints (its counters CSV); node-exporter, cAdvisor and
// kube-state-metrics help strings are theirs; training ones follow the
// prometheus_client example of the source document (§6).
var Catalogue = []MetricDesc{
	// dcgm-exporter default counters (etc/default-counters.csv): 25 fields.
	{ID: FamSMClock, Name: "DCGM_FI_DEV_SM_CLOCK", Type: Gauge, Help: "SM clock frequency (in MHz).", Unit: "MHz", Source: SourceDCGM, DCGMDefault: true},
	{ID: FamMemClock, Name: "DCGM_FI_DEV_MEM_CLOCK", Type: Gauge, Help: "Memory clock frequency (in MHz).", Unit: "MHz", Source: SourceDCGM, DCGMDefault: true},
	{ID: FamMemoryTemp, Name: "DCGM_FI_DEV_MEMORY_TEMP", Type: Gauge, Help: "Memory temperature (in C).", Unit: "celsius", Source: SourceDCGM, DCGMDefault: true},
	{ID: FamGPUTemp, Name: "DCGM_FI_DEV_GPU_TEMP", Type: Gauge, Help: "GPU temperature (in C).", Unit: "celsius", Source: SourceDCGM, DCGMDefault: true},
	{ID: FamPowerUsage, Name: "DCGM_FI_DEV_POWER_USAGE", Type: Gauge, Help: "Power draw (in W).", Unit: "watts", Source: SourceDCGM, DCGMDefault: true, Jitter: true},
	{ID: FamTotalEnergy, Name: "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", Type: Counter, Help: "Total energy consumption since boot (in mJ).", Unit: "millijoules", Source: SourceDCGM, DCGMDefault: true},
	{ID: FamPCIeReplay, Name: "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", Type: Counter, Help: "Total number of PCIe retries.", Source: SourceDCGM, DCGMDefault: true},
	{ID: FamGPUUtil, Name: "DCGM_FI_DEV_GPU_UTIL", Type: Gauge, Help: "GPU utilization (in %).", Unit: "percent", Source: SourceDCGM, DCGMDefault: true},
	{ID: FamMemCopyUtil, Name: "DCGM_FI_DEV_MEM_COPY_UTIL", Type: Gauge, Help: "Memory utilization (in %).", Unit: "percent", Source: SourceDCGM, DCGMDefault: true},
	{ID: FamEncUtil, Name: "DCGM_FI_DEV_ENC_UTIL", Type: Gauge, Help: "Encoder utilization (in %).", Unit: "percent", Source: SourceDCGM, DCGMDefault: true},
	{ID: FamDecUtil, Name: "DCGM_FI_DEV_DEC_UTIL", Type: Gauge, Help: "Decoder utilization (in %).", Unit: "percent", Source: SourceDCGM, DCGMDefault: true},
	{ID: FamXIDErrors, Name: "DCGM_FI_DEV_XID_ERRORS", Type: Gauge, Help: "Value of the last XID error encountered.", Source: SourceDCGM, DCGMDefault: true},
	{ID: FamFBFree, Name: "DCGM_FI_DEV_FB_FREE", Type: Gauge, Help: "Framebuffer memory free (in MiB).", Unit: "MiB", Source: SourceDCGM, DCGMDefault: true},
	{ID: FamFBUsed, Name: "DCGM_FI_DEV_FB_USED", Type: Gauge, Help: "Framebuffer memory used (in MiB).", Unit: "MiB", Source: SourceDCGM, DCGMDefault: true},
	{ID: FamFBReserved, Name: "DCGM_FI_DEV_FB_RESERVED", Type: Gauge, Help: "Framebuffer memory reserved (in MiB).", Unit: "MiB", Source: SourceDCGM, DCGMDefault: true},
	// facts.md types NVLINK_BANDWIDTH_TOTAL as a counter (older CSVs); newer
	// CSVs call it a gauge. We follow the project's checked list.
	{ID: FamNVLinkBandwidth, Name: "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", Type: Counter, Help: "Total number of NVLink bandwidth counters for all lanes.", Source: SourceDCGM, DCGMDefault: true},
	{ID: FamVGPULicense, Name: "DCGM_FI_DEV_VGPU_LICENSE_STATUS", Type: Gauge, Help: "vGPU License status", Source: SourceDCGM, DCGMDefault: true},
	{ID: FamUncorrectableRemappedRows, Name: "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", Type: Counter, Help: "Number of remapped rows for uncorrectable errors", Source: SourceDCGM, DCGMDefault: true},
	{ID: FamCorrectableRemappedRows, Name: "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", Type: Counter, Help: "Number of remapped rows for correctable errors", Source: SourceDCGM, DCGMDefault: true},
	{ID: FamRowRemapFailure, Name: "DCGM_FI_DEV_ROW_REMAP_FAILURE", Type: Gauge, Help: "Whether remapping of rows has failed", Source: SourceDCGM, DCGMDefault: true},
	{ID: FamProfGREngineActive, Name: "DCGM_FI_PROF_GR_ENGINE_ACTIVE", Type: Gauge, Help: "Ratio of time the graphics engine is active.", Unit: "ratio", Source: SourceDCGM, DCGMDefault: true, Jitter: true},
	{ID: FamProfPipeTensorActive, Name: "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", Type: Gauge, Help: "Ratio of cycles the tensor (HMMA) pipe is active.", Unit: "ratio", Source: SourceDCGM, DCGMDefault: true, Jitter: true},
	{ID: FamProfDRAMActive, Name: "DCGM_FI_PROF_DRAM_ACTIVE", Type: Gauge, Help: "Ratio of cycles the device memory interface is active sending or receiving data.", Unit: "ratio", Source: SourceDCGM, DCGMDefault: true, Jitter: true},
	{ID: FamProfPCIeTxBytes, Name: "DCGM_FI_PROF_PCIE_TX_BYTES", Type: Gauge, Help: "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.", Unit: "bytes_per_second", Source: SourceDCGM, DCGMDefault: true, Jitter: true},
	{ID: FamProfPCIeRxBytes, Name: "DCGM_FI_PROF_PCIE_RX_BYTES", Type: Gauge, Help: "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.", Unit: "bytes_per_second", Source: SourceDCGM, DCGMDefault: true, Jitter: true},

	// Fields commented out in the default CSV that the source document's
	// dashboards and rules use; enabled here as in its dcgm-metrics.csv. The
	// retired-page fields are typed counter, as dcgm-exporter's
	// etc/default-counters.csv types them; an H100 never retires pages (it
	// remaps rows), so they stay 0.
	{ID: FamECCSBEVolTotal, Name: "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", Type: Counter, Help: "Total number of single-bit volatile ECC errors.", Source: SourceDCGM},
	{ID: FamECCDBEVolTotal, Name: "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", Type: Counter, Help: "Total number of double-bit volatile ECC errors.", Source: SourceDCGM},
	{ID: FamRetiredSBE, Name: "DCGM_FI_DEV_RETIRED_SBE", Type: Counter, Help: "Total number of retired pages due to single-bit errors.", Source: SourceDCGM},
	{ID: FamRetiredDBE, Name: "DCGM_FI_DEV_RETIRED_DBE", Type: Counter, Help: "Total number of retired pages due to double-bit errors.", Source: SourceDCGM},
	{ID: FamNVLinkCRCFlitErrors, Name: "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", Type: Counter, Help: "Total number of NVLink flow-control CRC errors.", Source: SourceDCGM},
	{ID: FamClockThrottleReasons, Name: "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", Type: Gauge, Help: "Current clock throttle reasons.", Source: SourceDCGM},
	{ID: FamFBTotal, Name: "DCGM_FI_DEV_FB_TOTAL", Type: Gauge, Help: "Framebuffer memory total (in MiB).", Unit: "MiB", Source: SourceDCGM},
	// Not in any dcgm-exporter CSV: the model's temperature limits, which the
	// rule pack's GPUTemperatureOverOperatingLimit and
	// GPUMemoryTemperatureOverOperatingLimit compare with (deploy/rules
	// README lists the CSV lines to add).
	{ID: FamGPUMaxOpTemp, Name: "DCGM_FI_DEV_GPU_MAX_OP_TEMP", Type: Gauge, Help: "Maximum operating temperature of the GPU (in C).", Unit: "celsius", Source: SourceDCGM},
	{ID: FamMemMaxOpTemp, Name: "DCGM_FI_DEV_MEM_MAX_OP_TEMP", Type: Gauge, Help: "Maximum operating temperature of the memory (in C).", Unit: "celsius", Source: SourceDCGM},

	// dcgm-exporter's own per-code Xid count (xid_collector.go, commented
	// out in its CSVs): per GPU, one series per Xid code seen within the
	// window (label xid, value the number of events), or one series without
	// xid at 0 when there was none; every series carries window_size_in_ms.
	{ID: FamXIDErrorsCount, Name: "DCGM_EXP_XID_ERRORS_COUNT", Type: Counter, Help: "Count of XID Errors within user-specified time window (see xid-count-window-size param).", Source: SourceDCGM},
	// DCGM field 1523 under its two names: DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION
	// up to DCGM 4.5 (the DCGM dcgm-exporter 4.5.3-4.8.2 links, whose CSV
	// parser knows no other name) and DCGM_FI_DEV_GPU_RECOVERY_ACTION from
	// DCGM 4.6 (which still accepts the old name). A cluster emits one of
	// them (Config.RecoveryActionField). Values: nvmlDeviceGpuRecoveryAction_t.
	{ID: FamGetGPURecoveryAction, Name: RecoveryActionFieldDCGM45, Type: Gauge, Help: "GPU Recovery Action (see nvmlDeviceGpuRecoveryAction_t for return values)", Source: SourceDCGM},
	{ID: FamGPURecoveryAction, Name: RecoveryActionFieldDCGM46, Type: Gauge, Help: "GPU Recovery Action (see nvmlDeviceGpuRecoveryAction_t for return values)", Source: SourceDCGM},
	{ID: FamRowRemapPending, Name: "DCGM_FI_DEV_ROW_REMAP_PENDING", Type: Gauge, Help: "Whether remapping of rows is pending", Source: SourceDCGM},
	// Time spent in each clock-event reason (DCGM fields 1420-1424), in
	// nanoseconds: the exact form of the CLOCK_THROTTLE_REASONS bits.
	{ID: FamClockEventSWPowerCapNS, Name: "DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP_NS", Type: Counter, Help: "Throttling to not exceed currently set power limits in ns", Unit: "nanoseconds", Source: SourceDCGM},
	{ID: FamClockEventSyncBoostNS, Name: "DCGM_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST_NS", Type: Counter, Help: "Throttling to match minimum possible clock across Sync Boost Group in ns", Unit: "nanoseconds", Source: SourceDCGM},
	{ID: FamClockEventSWThermalNS, Name: "DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN_NS", Type: Counter, Help: "Throttling to ensure ((GPU temp < GPU Max Operating Temp) && (Memory Temp < Memory Max Operating Temp)) in ns", Unit: "nanoseconds", Source: SourceDCGM},
	{ID: FamClockEventHWThermalNS, Name: "DCGM_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN_NS", Type: Counter, Help: "Throttling due to temperature being too high (reducing core clocks by a factor of 2 or more) in ns", Unit: "nanoseconds", Source: SourceDCGM},
	{ID: FamClockEventHWPowerBrakeNS, Name: "DCGM_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN_NS", Type: Counter, Help: "Throttling due to external power brake assertion trigger (reducing core clocks by a factor of 2 or more) in ns", Unit: "nanoseconds", Source: SourceDCGM},
	// NVLink4 (H100) error counters, summed over links, as in the CSV's
	// commented NVLink block.
	{ID: FamNVLinkCRCDataErrors, Name: "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", Type: Counter, Help: "Total number of NVLink data CRC errors.", Source: SourceDCGM},
	{ID: FamNVLinkReplayErrors, Name: "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", Type: Counter, Help: "Total number of NVLink retries.", Source: SourceDCGM},
	{ID: FamNVLinkRecoveryErrors, Name: "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", Type: Counter, Help: "Total number of NVLink recovery errors.", Source: SourceDCGM},
	// NVLink5 (B200) counters, aggregated over links (DCGM fields 1204-1220;
	// "Not supported on NVLink4 and earlier", so an H100 does not export
	// them): the ones DCGM's NVLink health watch reads. The BER fields are
	// NVML's encoding (mantissa << 8 | exponent); 0xFFF is the healthy floor.
	{ID: FamNVL5RxErrors, Name: "DCGM_FI_DEV_NVLINK_COUNT_RX_ERRORS", Type: Counter, Help: "Total number of packets with errors Rx on a link", Source: SourceDCGM},
	{ID: FamNVL5RxSymbolErrors, Name: "DCGM_FI_DEV_NVLINK_COUNT_RX_SYMBOL_ERRORS", Type: Counter, Help: "Number of errors in rx symbols", Source: SourceDCGM},
	{ID: FamNVL5RxMalformedPacketErrors, Name: "DCGM_FI_DEV_NVLINK_COUNT_RX_MALFORMED_PACKET_ERRORS", Type: Counter, Help: "Number of packets Rx on a link where packets are malformed", Source: SourceDCGM},
	{ID: FamNVL5RxBufferOverrunErrors, Name: "DCGM_FI_DEV_NVLINK_COUNT_RX_BUFFER_OVERRUN_ERRORS", Type: Counter, Help: "Number of packets that were discarded on Rx due to buffer overrun", Source: SourceDCGM},
	{ID: FamNVL5RxRemoteErrors, Name: "DCGM_FI_DEV_NVLINK_COUNT_RX_REMOTE_ERRORS", Type: Counter, Help: "Total number of packets Rx - stomp/EBP marker", Source: SourceDCGM},
	{ID: FamNVL5RxGeneralErrors, Name: "DCGM_FI_DEV_NVLINK_COUNT_RX_GENERAL_ERRORS", Type: Counter, Help: "Total number of packets Rx with header mismatch", Source: SourceDCGM},
	{ID: FamNVL5LocalLinkIntegrityErrors, Name: "DCGM_FI_DEV_NVLINK_COUNT_LOCAL_LINK_INTEGRITY_ERRORS", Type: Counter, Help: "Total number of times that the count of local errors exceeded a threshold", Source: SourceDCGM},
	{ID: FamNVL5EffectiveErrors, Name: "DCGM_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS", Type: Counter, Help: "Sum of the number of errors in each Nvlink packet", Source: SourceDCGM},
	{ID: FamNVL5SymbolBER, Name: "DCGM_FI_DEV_NVLINK_COUNT_SYMBOL_BER", Type: Gauge, Help: "BER for symbol errors - raw value", Source: SourceDCGM},
	{ID: FamNVL5EffectiveBER, Name: "DCGM_FI_DEV_NVLINK_COUNT_EFFECTIVE_BER", Type: Gauge, Help: "Effective BER for effective errors - raw value", Source: SourceDCGM},
	{ID: FamNVL5LinkRecoveryEvents, Name: "DCGM_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS", Type: Counter, Help: "Number of times link went from Up to recovery, irrespective of the result", Source: SourceDCGM},
	{ID: FamNVL5LinkRecoverySuccessful, Name: "DCGM_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS", Type: Counter, Help: "Number of times link went from Up to recovery, succeeded and link came back up", Source: SourceDCGM},
	{ID: FamNVL5LinkRecoveryFailed, Name: "DCGM_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS", Type: Counter, Help: "Number of times link went from Up to recovery, failed and link was declared down", Source: SourceDCGM},
	{ID: FamNVLinkECCDataErrors, Name: "DCGM_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_TOTAL", Type: Counter, Help: "NVLink ECC Data Error Counter total for all Links", Source: SourceDCGM},

	// node-exporter.
	{ID: FamNodeCPUSeconds, Name: "node_cpu_seconds_total", Type: Counter, Help: "Seconds the CPUs spent in each mode.", Unit: "seconds", Source: SourceNodeExporter},
	{ID: FamNodeMemAvailable, Name: "node_memory_MemAvailable_bytes", Type: Gauge, Help: "Memory information field MemAvailable_bytes.", Unit: "bytes", Source: SourceNodeExporter, Jitter: true},
	{ID: FamNodeMemTotal, Name: "node_memory_MemTotal_bytes", Type: Gauge, Help: "Memory information field MemTotal_bytes.", Unit: "bytes", Source: SourceNodeExporter},
	{ID: FamNodeFSAvail, Name: "node_filesystem_avail_bytes", Type: Gauge, Help: "Filesystem space available to non-root users in bytes.", Unit: "bytes", Source: SourceNodeExporter},
	{ID: FamNodeFSSize, Name: "node_filesystem_size_bytes", Type: Gauge, Help: "Filesystem size in bytes.", Unit: "bytes", Source: SourceNodeExporter},
	{ID: FamNodeNetRxBytes, Name: "node_network_receive_bytes_total", Type: Counter, Help: "Network device statistic receive_bytes.", Unit: "bytes", Source: SourceNodeExporter},
	{ID: FamNodeNetTxBytes, Name: "node_network_transmit_bytes_total", Type: Counter, Help: "Network device statistic transmit_bytes.", Unit: "bytes", Source: SourceNodeExporter},
	{ID: FamNodeNetRxDrop, Name: "node_network_receive_drop_total", Type: Counter, Help: "Network device statistic receive_drop.", Source: SourceNodeExporter},
	{ID: FamNodeNetTxDrop, Name: "node_network_transmit_drop_total", Type: Counter, Help: "Network device statistic transmit_drop.", Source: SourceNodeExporter},

	// cAdvisor (kubelet /metrics/cadvisor).
	{ID: FamContainerCPU, Name: "container_cpu_usage_seconds_total", Type: Counter, Help: "Cumulative cpu time consumed in seconds.", Unit: "seconds", Source: SourceCAdvisor},
	{ID: FamContainerMemWorkingSet, Name: "container_memory_working_set_bytes", Type: Gauge, Help: "Current working set in bytes.", Unit: "bytes", Source: SourceCAdvisor, Jitter: true},
	{ID: FamContainerOOMEvents, Name: "container_oom_events_total", Type: Counter, Help: "Count of out of memory events observed for the container", Source: SourceCAdvisor},

	// Training job metrics (source document §6), one set per rank.
	{ID: FamTrainIterTime, Name: "training_iteration_time_seconds", Type: Histogram, Help: "Time per training iteration", Unit: "seconds", Source: SourceTraining},
	{ID: FamTrainTokensPerSecond, Name: "training_tokens_per_second", Type: Gauge, Help: "Tokens processed per GPU per second", Source: SourceTraining},
	{ID: FamTrainLoss, Name: "training_loss", Type: Gauge, Help: "Current training loss", Source: SourceTraining},
	{ID: FamTrainGradNorm, Name: "training_gradient_norm", Type: Gauge, Help: "Gradient norm", Source: SourceTraining},
	{ID: FamTrainLearningRate, Name: "training_learning_rate", Type: Gauge, Help: "Current learning rate", Source: SourceTraining},
	{ID: FamTrainMFU, Name: "training_mfu_percent", Type: Gauge, Help: "Model FLOPs Utilization", Unit: "percent", Source: SourceTraining},
	{ID: FamTrainDataLoadTime, Name: "training_data_load_time_seconds", Type: Gauge, Help: "Data loading time per step", Unit: "seconds", Source: SourceTraining},

	// kube-state-metrics (cluster scope).
	{ID: FamKubeNodeCondition, Name: "kube_node_status_condition", Type: Gauge, Help: "The condition of a cluster node.", Source: SourceKubeStateMetrics},
	{ID: FamKubeNodeInfo, Name: "kube_node_info", Type: Gauge, Help: "Information about a cluster node.", Source: SourceKubeStateMetrics},
	{ID: FamKubePodPhase, Name: "kube_pod_status_phase", Type: Gauge, Help: "The pods current phase.", Source: SourceKubeStateMetrics},
	{ID: FamKubeJobActive, Name: "kube_job_status_active", Type: Gauge, Help: "The number of actively running pods.", Source: SourceKubeStateMetrics},
	{ID: FamKubePodOwner, Name: "kube_pod_owner", Type: Gauge, Help: "Information about the Pod's owner.", Source: SourceKubeStateMetrics},
	{ID: FamKubePodInfo, Name: "kube_pod_info", Type: Gauge, Help: "Information about pod.", Source: SourceKubeStateMetrics},
	{ID: FamKubeNodeUnschedulable, Name: "kube_node_spec_unschedulable", Type: Gauge, Help: "Whether a node can schedule new pods.", Source: SourceKubeStateMetrics},

	// The source document's NCCL dashboard (§3.4): an nccl-tests job runs
	// all_reduce_perf across each block of nodes every hour and pushes the
	// bus bandwidth to a Pushgateway, which keeps the last value.
	{ID: FamNCCLBandwidth, Name: "nccl_bandwidth_gbps", Type: Gauge, Help: "Bus bandwidth of the last nccl-tests all_reduce_perf run across the block of nodes, in Gbit/s.", Unit: "gigabits per second", Source: SourcePushgateway},

	// Made by the scraping Prometheus, never by an exporter.
	{ID: FamUp, Name: "up", Type: Gauge, Help: "Whether the target could be scraped (1) or not (0).", Source: SourcePrometheus},
}

// IterationTimeBuckets are the upper bounds of training_iteration_time_seconds,
// as in the source document's prometheus_client Histogram.
var IterationTimeBuckets = []float64{0.1, 0.25, 0.5, 1, 2, 5, 10}

// leValues are the `le` label values as prometheus_client prints them (and
// as Prometheus 3 normalises classic-histogram `le` on ingestion).
var leValues = []string{"0.1", "0.25", "0.5", "1.0", "2.0", "5.0", "10.0", "+Inf"}

var catalogueByName = func() map[string]*MetricDesc {
	if len(Catalogue) != numFamilies {
		panic(fmt.Sprintf("gpusim: catalogue has %d entries, want %d", len(Catalogue), numFamilies))
	}
	m := make(map[string]*MetricDesc, len(Catalogue))
	for i := range Catalogue {
		if Catalogue[i].ID != i {
			panic(fmt.Sprintf("gpusim: catalogue entry %s has ID %d at position %d", Catalogue[i].Name, Catalogue[i].ID, i))
		}
		m[Catalogue[i].Name] = &Catalogue[i]
	}
	return m
}()

// DCGMLabelNames are the labels dcgm-exporter puts on every GPU series;
// PodLabelNames are added when Kubernetes mapping finds a pod holding the GPU.
var (
	DCGMLabelNames = []string{"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"}
	PodLabelNames  = []string{"pod", "namespace", "container"}
)

// Names of DCGM field 1523 (Config.RecoveryActionField).
const (
	// RecoveryActionFieldDCGM45 is the only name DCGM <= 4.5 knows, the DCGM
	// dcgm-exporter 4.5.3-4.8.2 is built with (an unknown name in the
	// counters CSV stops the exporter); later DCGMs accept it as an alias.
	RecoveryActionFieldDCGM45 = "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION"
	// RecoveryActionFieldDCGM46 is the name from DCGM 4.6 on.
	RecoveryActionFieldDCGM46 = "DCGM_FI_DEV_GPU_RECOVERY_ACTION"
)

// xidMessages are the err_msg values dcgm-exporter (internal/pkg/collector/
// xid_errors.go) prints for the codes the simulator produces or that fault
// schedules commonly name.
var xidMessages = map[int]string{
	0:   "No Error",
	13:  "Graphics Engine Exception",
	31:  "GPU memory page fault",
	43:  "GPU stopped processing",
	45:  "Preemptive cleanup, due to previous errors -- Most likely to see when running multiple cuda",
	48:  "Double Bit ECC Error",
	61:  "Internal micro-controller breakpoint/warning",
	62:  "Internal micro-controller halt",
	63:  "ECC page retirement or row remapping recording event",
	64:  "ECC page retirement or row remapper recording failure",
	74:  "NVLINK Error",
	79:  "GPU has fallen off the bus",
	92:  "High single-bit ECC error rate",
	94:  "Contained ECC error",
	95:  "Uncontained ECC error",
	109: "Context Switch Timeout Error",
	119: "GSP RPC Timeout",
	120: "GSP Error",
	140: "Unrecovered ECC Error",
	144: "NVLINK: Saw Error",
	145: "NVLINK: RLW Error",
	149: "NVLINK: NETIR Error",
	150: "NVLINK: MSE Error",
	154: "GPU Recovery Action Changed",
	155: "NVLINK: SW Defined Error",
}

// xidMessage returns the err_msg label of an Xid code. dcgm-exporter's table
// ends at 172 and names any later code "Unknown Error".
func xidMessage(code int) string {
	if m, ok := xidMessages[code]; ok {
		return m
	}
	if code > 172 {
		return "Unknown Error"
	}
	return "Xid " + itoa(code)
}
