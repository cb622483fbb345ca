package grafana

import (
	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
)

// The source document's dashboards (§3), with its PromQL fixed where it was
// wrong. Series come from dcgm-exporter (Hostname, gpu), node-exporter and
// cAdvisor (node), kube-state-metrics and the training job's own metrics
// (job_name); `cluster` is the external label of the Prometheus pair.
//
// Every DCGM query reduces to one series per GPU the way the rule pack does
// (gpuLevel, instanceLevel), so the dashboards count what the alerts count:
// a GPU held by a pod, restarted exporters and MIG instances count once.

const cl = `cluster="$cluster"`

// Drill-downs: overview → node → GPU (the node dashboard with one GPU
// selected) → the job holding it.
var (
	toNode = link("Node ${__field.labels.Hostname}", "gpu-node-detail", "Hostname=${__field.labels.Hostname}")
	toGPU  = link("GPU ${__field.labels.gpu} of this node", "gpu-node-detail", "Hostname=${Hostname}", "gpu=${__field.labels.gpu}")
	toJob  = link("Job ${__data.fields.owner_name}", "training-performance", "job=${__data.fields.owner_name}")
)

func links(l ...cog.Builder[dashboard.DashboardLink]) []cog.Builder[dashboard.DashboardLink] {
	return l
}

func clusterOverview() *dashboard.DashboardBuilder {
	return newDashboard("gpu-cluster-overview", "GPU cluster overview",
		"Health, power, utilisation and temperature of the whole GPU cluster (source document §3.1). Counts and sums reduce to one series per GPU as the rule pack does (a GPU held by several pods, or split into MIG instances, counts once).", "overview").
		WithVariable(clusterVar()).
		// GPU_TEMP rather than GPU_UTIL: NVML has no utilisation for a GPU
		// in MIG mode, so a MIG GPU would not be counted.
		WithPanel(statPanel("GPUs", "GPUs reporting to dcgm-exporter, each once (MIG GPUs included).", unitCount,
			q(`count by (cluster) (`+gpuOnce(`DCGM_FI_DEV_GPU_TEMP{`+cl+`}`)+`)`, ""))).
		// The rule pack's count: reporting GPUs that have no row-remap
		// failure, no pending recovery action and no P0 Xid in the last
		// hour. The document subtracted count(XID_ERRORS > 0), but the Xid
		// gauge never resets, so that counted every GPU that ever had an Xid.
		WithPanel(statPanel("GPUs available", "GPUs available for work, as the recording rule cluster:gpu_available:count of the rule pack counts them (no row-remap failure, no recovery action pending, no P0 Xid in the last hour).", unitCount,
			q(`cluster:gpu_available:count{`+cl+`}`, "")).
			Thresholds(thresholds(step(nil, "red"), step(cog.ToPtr(1.0), "green")))).
		WithPanel(statPanel("Total power", "Power drawn by all GPUs of the cluster, each GPU once.", unitKilowatt,
			q(`sum(`+gpuOnce(`DCGM_FI_DEV_POWER_USAGE{`+cl+`}`)+`) / 1000`, ""))).
		WithPanel(gaugePanel("Average GPU utilisation", "Mean DCGM_FI_DEV_GPU_UTIL over the GPUs not in MIG mode (NVML reports no utilisation for those).", unitPercent, 0, 100,
			q(`avg(`+gpuOnce(`DCGM_FI_DEV_GPU_UTIL{`+cl+`}`)+`)`, "")).
			Thresholds(thresholds(step(nil, "red"), step(cog.ToPtr(30.0), "orange"), step(cog.ToPtr(70.0), "green")))).
		WithPanel(statPanel("Hottest GPU", "Highest GPU temperature in the cluster.", unitCelsius,
			q(`max(DCGM_FI_DEV_GPU_TEMP{`+cl+`})`, "")).Thresholds(tempThresholds())).
		// kube_job_status_active exists for batch Jobs only; PyTorchJob,
		// MPIJob, Volcano and Ray own their pods directly.
		WithPanel(statPanel("Active training jobs", "Training jobs (any owner: Job, PyTorchJob, MPIJob, Volcano, Ray) with at least one running pod.", unitCount,
			q(`count(count by (owner_kind, owner_name) (kube_pod_owner{`+cl+`, namespace="training"} * on (namespace, pod) group_left () (kube_pod_status_phase{`+cl+`, namespace="training", phase="Running"} == 1))) or vector(0)`, ""))).
		WithPanel(tablePanel("Firing alerts", "The rule pack's alerts firing now, by priority (ALERTS, as gpustore's ruler records them).", unitCount,
			q(`max by (alertname, priority, severity, node, gpu, xid, reason, namespace, pod) (ALERTS{`+cl+`, alertstate="firing"})`, ""))).
		WithPanel(tablePanel("GPUs with an Xid, by code", "How many GPUs reported each Xid code in the range, with its meaning and NVIDIA's action from the Xid catalogue (gpu:xid_catalog:info); the events are gpu:xid_errors:recent, the series GPUXidError pages on.", unitCount,
			q(`(count by (xid) (max by (xid, UUID) (max_over_time(gpu:xid_errors:recent{`+cl+`}[$__range]))) * on (xid) group_left (mnemonic, meaning, action, priority) topk by (xid) (1, gpu:xid_catalog:info))`+
				` or count by (xid) (max by (xid, UUID) (max_over_time(gpu:xid_errors:recent{`+cl+`}[$__range])))`, ""))).
		WithPanel(timeSeries("GPU utilisation by node", "Mean GPU utilisation of each node's GPUs. Click a line for the node.", unitPercent,
			q(`avg by (Hostname) (`+gpuLevel(`DCGM_FI_DEV_GPU_UTIL{`+cl+`}`)+`)`, "{{Hostname}}")).Min(0).Max(100).DataLinks(links(toNode))).
		WithPanel(timeSeries("Power by node", "Power drawn by each node's GPUs.", unitKilowatt,
			q(`sum by (Hostname) (`+gpuLevel(`DCGM_FI_DEV_POWER_USAGE{`+cl+`}`)+`) / 1000`, "{{Hostname}}")).Min(0).DataLinks(links(toNode))).
		WithPanel(timeSeries("Hottest GPU by node", "Highest GPU temperature of each node.", unitCelsius,
			q(`max by (Hostname) (DCGM_FI_DEV_GPU_TEMP{`+cl+`})`, "{{Hostname}}")).Thresholds(tempThresholds()).DataLinks(links(toNode))).
		// The document plotted rate() of every GPU's counter; summed per node
		// it stays readable on a large cluster.
		WithPanel(timeSeries("ECC single-bit errors", "Correctable (single-bit) volatile ECC errors per second, per node: early sign of a degrading GPU.", unitPerSecond,
			q(`sum by (Hostname) (`+gpuLevel(`rate(DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{`+cl+`}[$__rate_interval])`)+`)`, "{{Hostname}}")).Min(0).DataLinks(links(toNode))).
		// Energy comes from the pack's chargeback records (deploy/rules/
		// gpu-chargeback.yml): each pod's share of its GPU's energy, a GPU
		// time-sliced by n pods counted once (1/n each, where DCGM's counter
		// repeats the whole GPU on each pod's series and charged it n
		// times), a MIG instance by its compute slices. Each 5-minute sample
		// holds the 5 minutes before it, so sum_over_time over the range is
		// the range's energy, exact also on downsampled data. 1 kWh = 3.6e6 J.
		WithPanel(barGauge("Energy by namespace", "GPU energy used by each namespace's pods over the range, in kWh: the chargeback records (namespace:gpu_energy_joules:sum5m), each GPU shared among the pods that hold it.", unitKWh, 0, 0,
			q(`sum by (namespace) (sum_over_time(namespace:gpu_energy_joules:sum5m{`+cl+`}[$__range])) / 3.6e6`, "{{namespace}}"))).
		WithPanel(barGauge("Energy by job", "GPU energy used by each job's pods (any owner kind) over the range, in kWh: the chargeback records (namespace_job:gpu_energy_joules:sum5m), each GPU shared among the pods that hold it.", unitKWh, 0, 0,
			q(`sum by (job_name) (sum_over_time(namespace_job:gpu_energy_joules:sum5m{`+cl+`}[$__range])) / 3.6e6`, "{{job_name}}")))
}

func nodeDetail() *dashboard.DashboardBuilder {
	node := cl + `, Hostname="$Hostname"`
	gpus := node + `, gpu=~"$gpu"`
	perGPU := func(metric string) string { return `max by (gpu) (` + metric + `{` + gpus + `})` }
	throttle := `{__name__=~"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS|DCGM_FI_DEV_CLOCKS_EVENT_REASONS", ` + gpus + `}`
	reason := func(field, name string) *prometheus.DataqueryBuilder {
		return q(`max by (gpu) (rate(DCGM_FI_DEV_CLOCKS_EVENT_REASON_`+field+`_NS{`+gpus+`}[$__rate_interval])) / 1e9`, "GPU {{gpu}} "+name)
	}
	return newDashboard("gpu-node-detail", "GPU node detail",
		"One node's GPUs: temperature heat map, power, utilisation, memory, clocks and why they drop, Xids, memory errors, NVLink and PCIe, and the jobs on them (source document §3.2). Select one GPU for the GPU's view; a job links to its training dashboard.", "node").
		WithVariable(clusterVar()).
		WithVariable(labelVar("Hostname", "Hostname", "DCGM_FI_DEV_GPU_TEMP", cl, false)).
		WithVariable(labelVar("gpu", "gpu", "DCGM_FI_DEV_GPU_TEMP", cl+`, Hostname="$Hostname"`, true)).
		WithPanel(rowsHeatmap("GPU temperature (8-GPU heat map)", "One row per GPU of the node, coloured from blue (30 °C) to red (90 °C).", unitCelsius, 30, 90,
			q(`max by (gpu) (DCGM_FI_DEV_GPU_TEMP{`+node+`})`, "GPU {{gpu}}"))).
		// DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL is DCGM's throughput in MiB/s,
		// not a counter: it is read as it is.
		WithPanel(rowsHeatmap("NVLink throughput (GPU × time)", "NVLink traffic (TX+RX, MiB/s) of each GPU of the node. dcgm-exporter reports NVLink throughput per GPU, not per GPU pair, so this is the node's GPU-by-time matrix.", unitMiBPerSec, 0, 800000,
			q(`max by (gpu) (DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{`+node+`})`, "GPU {{gpu}}"))).
		WithPanel(timeSeries("Temperature", "GPU temperature. Click a line for that GPU alone.", unitCelsius,
			q(perGPU("DCGM_FI_DEV_GPU_TEMP"), "GPU {{gpu}}")).Thresholds(tempThresholds()).DataLinks(links(toGPU))).
		WithPanel(timeSeries("HBM temperature", "Memory (HBM) temperature of each GPU, and the model's maximum operating temperature for memory, where the driver starts slowing the GPU down.", unitCelsius,
			q(perGPU("DCGM_FI_DEV_MEMORY_TEMP"), "GPU {{gpu}}"),
			q(`max(DCGM_FI_DEV_MEM_MAX_OP_TEMP{`+node+`})`, "memory limit")).Thresholds(tempThresholds()).DataLinks(links(toGPU))).
		WithPanel(timeSeries("Power", "Power drawn by each GPU.", unitWatt,
			q(perGPU("DCGM_FI_DEV_POWER_USAGE"), "GPU {{gpu}}")).Min(0).DataLinks(links(toGPU))).
		WithPanel(timeSeries("GPU utilisation", "DCGM_FI_DEV_GPU_UTIL of each GPU (none for a GPU in MIG mode). NVML counts any running kernel, NCCL's included: a hung collective reads 100 %.", unitPercent,
			q(perGPU("DCGM_FI_DEV_GPU_UTIL"), "GPU {{gpu}}")).Min(0).Max(100).DataLinks(links(toGPU))).
		WithPanel(timeSeries("SM clock", "SM clock of each GPU: it drops when a throttle reason holds.", unitHertz,
			q(perGPU("DCGM_FI_DEV_SM_CLOCK")+` * 1e6`, "GPU {{gpu}}")).Min(0).DataLinks(links(toGPU))).
		// DCGM fields 1420-1424 count the time each reason holds (ns), as
		// the rule pack's GPUThrottling reads them; HW slowdown (0x8) has no
		// time counter and comes from the reasons bitmask.
		WithPanel(timeSeries("Clock slowdown by reason", "Share of the time each GPU's clocks were held down, by reason (DCGM clock-event time counters; HW slowdown from the reasons bitmask). SW power cap is a busy GPU at its limit by design; thermal reasons and HW slowdown/power brake mean trouble.", unitPercentUnit,
			reason("SW_POWER_CAP", "SW power cap"),
			reason("SW_THERM_SLOWDOWN", "SW thermal"),
			reason("HW_THERM_SLOWDOWN", "HW thermal"),
			reason("HW_POWER_BRAKE_SLOWDOWN", "HW power brake"),
			q(`max by (gpu) (floor(`+throttle+` / 8) % 2)`, "GPU {{gpu}} HW slowdown")).Min(0).Max(1).DataLinks(links(toGPU))).
		WithPanel(timeSeries("Xid errors", "Xids of each GPU while the rule pack considers them recent (gpu:xid_errors:recent, what GPUXidError pages on): the value is the number of events in dcgm-exporter's window.", unitCount,
			q(`max by (gpu, xid) (gpu:xid_errors:recent{`+cl+`, node="$Hostname", gpu=~"$gpu"})`, "GPU {{gpu}} Xid {{xid}}")).Min(0).DataLinks(links(toGPU))).
		WithPanel(timeSeries("Memory errors and remapped rows", "Uncorrectable (double-bit) volatile ECC errors since the GPU's last reset, rows remapped for uncorrectable and correctable errors, and retired pages (older GPUs retire pages instead of remapping rows).", unitCount,
			q(perGPU("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"), "GPU {{gpu}} uncorrectable ECC"),
			q(perGPU("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"), "GPU {{gpu}} rows remapped (uncorrectable)"),
			q(perGPU("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"), "GPU {{gpu}} rows remapped (correctable)"),
			q(`max by (gpu) (DCGM_FI_DEV_RETIRED_SBE{`+gpus+`} + DCGM_FI_DEV_RETIRED_DBE{`+gpus+`})`, "GPU {{gpu}} retired pages")).Min(0).DataLinks(links(toGPU))).
		// The recovery action's field is DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION
		// up to DCGM 4.5 and DCGM_FI_DEV_GPU_RECOVERY_ACTION after: both.
		WithPanel(timeSeries("Repair state", "1 while a row remap is pending (applied at the next GPU reset) or row remapping has failed (RMA); the driver's recovery action (1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset).", unitCount,
			q(perGPU("DCGM_FI_DEV_ROW_REMAP_PENDING"), "GPU {{gpu}} row remap pending"),
			q(perGPU("DCGM_FI_DEV_ROW_REMAP_FAILURE"), "GPU {{gpu}} row remap failed"),
			q(`max by (gpu) ({__name__=~"DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION|DCGM_FI_DEV_GPU_RECOVERY_ACTION", `+gpus+`})`, "GPU {{gpu}} recovery action")).Min(0).DataLinks(links(toGPU))).
		// FB_USED / (FB_USED + FB_FREE): dcgm-exporter's default field list
		// has no FB_TOTAL. A MIG GPU's instances are added up.
		WithPanel(barGauge("Framebuffer used", "Framebuffer memory used, as a share of the GPU's memory (all its MIG instances together).", unitPercent, 0, 100,
			q(`100 * sum by (gpu) (`+instanceLevel(`DCGM_FI_DEV_FB_USED{`+gpus+`}`)+`) / sum by (gpu) (`+instanceLevel(`DCGM_FI_DEV_FB_USED{`+gpus+`} + DCGM_FI_DEV_FB_FREE{`+gpus+`}`)+`)`, "GPU {{gpu}}")).
			Thresholds(thresholds(step(nil, "green"), step(cog.ToPtr(80.0), "orange"), step(cog.ToPtr(95.0), "red")))).
		WithPanel(timeSeries("PCIe throughput", "PCIe bytes per second each GPU sends (tx) and receives (rx).", unitBytesPerSec,
			q(`sum by (gpu) (`+instanceLevel(`DCGM_FI_PROF_PCIE_TX_BYTES{`+gpus+`}`)+`)`, "GPU {{gpu}} tx"),
			q(`sum by (gpu) (`+instanceLevel(`DCGM_FI_PROF_PCIE_RX_BYTES{`+gpus+`}`)+`)`, "GPU {{gpu}} rx")).Min(0).DataLinks(links(toGPU))).
		WithPanel(tablePanel("Jobs on this node's GPUs", "The pods holding the selected GPUs, their owner (Job, PyTorchJob, MPIJob, Volcano Job, RayCluster) and how many GPUs each holds. Click a job for its training dashboard.", unitCount,
			q(`count by (owner_kind, owner_name, namespace, pod) (max without (instance, container) (DCGM_FI_DEV_GPU_TEMP{`+gpus+`, pod!=""}) * on (namespace, pod) group_left (owner_kind, owner_name) max by (namespace, pod, owner_kind, owner_name) (kube_pod_owner{`+cl+`}))`, "")).
			DataLinks(links(toJob)))
}

func trainingPerformance() *dashboard.DashboardBuilder {
	job := cl + `, job_name="$job"`
	iter := `sum(rate(training_iteration_time_seconds_sum{` + job + `}[$__rate_interval])) / (sum(rate(training_iteration_time_seconds_count{` + job + `}[$__rate_interval])) > 0)`
	// The job's GPUs: dcgm-exporter labels a GPU with the pod holding it,
	// kube-state-metrics names the pod's owner.
	jobGPUs := func(metric string) string {
		return `max by (Hostname, gpu) (` + metric + `{` + cl + `, pod!=""} * on (namespace, pod) group_left () max by (namespace, pod) (kube_pod_owner{` + cl + `, owner_name="$job"}))`
	}
	return newDashboard("training-performance", "Training performance",
		"Throughput, efficiency and convergence of one training job (source document §3.3), and its ranks and GPUs side by side to find a straggler.", "training").
		WithVariable(clusterVar()).
		WithVariable(labelVar("job", "job_name", "training_tokens_per_second", cl, false)).
		WithPanel(statPanel("Tokens / GPU / s", "Mean tokens per second per GPU (TGS) over the job's ranks.", unitCount,
			q(`avg(training_tokens_per_second{`+job+`})`, ""))).
		WithPanel(gaugePanel("MFU", "Model FLOPs utilisation: achieved FLOPs over the GPUs' BF16 peak.", unitPercent, 0, 100,
			q(`avg(training_mfu_percent{`+job+`})`, "")).
			Thresholds(thresholds(step(nil, "red"), step(cog.ToPtr(30.0), "orange"), step(cog.ToPtr(45.0), "green")))).
		// The document divided the data-loading gauge by the iteration
		// histogram's name, which is not a series; the mean iteration time
		// is sum/count of its rates.
		WithPanel(gaugePanel("Data loading share", "Time spent waiting for data, as a share of the mean iteration time.", unitPercent, 0, 100,
			q(`100 * avg(training_data_load_time_seconds{`+job+`}) / (`+iter+`)`, "")).
			Thresholds(thresholds(step(nil, "green"), step(cog.ToPtr(10.0), "orange"), step(cog.ToPtr(25.0), "red")))).
		WithPanel(timeSeries("Tokens / GPU / s over time", "Tokens per second per GPU, mean and slowest rank.", unitCount,
			q(`avg(training_tokens_per_second{`+job+`})`, "mean"),
			q(`min(training_tokens_per_second{`+job+`})`, "slowest rank")).Min(0)).
		WithPanel(timeSeries("Iteration time", "Mean and p99 time of one training step, from the ranks' histogram.", unitSeconds,
			q(iter, "mean"),
			q(quantile(0.99, "training_iteration_time_seconds", job), "p99")).Min(0)).
		WithPanel(timeSeries("Loss", "Training loss (log scale).", unitCount,
			q(`avg(training_loss{`+job+`})`, "loss")).
			ScaleDistribution(common.NewScaleDistributionConfigBuilder().Type(common.ScaleDistributionLog).Log(10))).
		WithPanel(timeSeries("Gradient norm", "Global gradient norm: spikes precede divergence.", unitCount,
			q(`max(training_gradient_norm{`+job+`})`, "gradient norm")).Min(0)).
		WithPanel(timeSeries("MFU over time", "Model FLOPs utilisation over time.", unitPercent,
			q(`avg(training_mfu_percent{`+job+`})`, "MFU")).Min(0).Max(100)).
		// Straggler view: a synchronous job runs at the pace of its slowest
		// rank. The GPU panels follow the job's pods to their GPUs.
		WithPanel(timeSeries("Step time by rank", "Mean time of one step of each rank: a rank above the others is the straggler (the others wait for it in the all-reduce).", unitSeconds,
			q(`sum by (rank) (rate(training_iteration_time_seconds_sum{`+job+`}[$__rate_interval])) / (sum by (rank) (rate(training_iteration_time_seconds_count{`+job+`}[$__rate_interval])) > 0)`, "rank {{rank}}")).Min(0)).
		WithPanel(timeSeries("SM clock of the job's GPUs", "SM clock of each GPU the job holds: a throttled GPU slows its rank.", unitHertz,
			q(jobGPUs("DCGM_FI_DEV_SM_CLOCK")+` * 1e6`, "{{Hostname}} GPU {{gpu}}")).Min(0).DataLinks(links(toNode))).
		WithPanel(timeSeries("Tensor activity of the job's GPUs", "Share of cycles the tensor pipes of each of the job's GPUs were busy.", unitPercentUnit,
			q(jobGPUs("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"), "{{Hostname}} GPU {{gpu}}")).Min(0).Max(1).DataLinks(links(toNode))).
		WithPanel(timeSeries("NCCL traffic over NVLink of the job's GPUs", "NVLink throughput (MiB/s, TX+RX) of each of the job's GPUs: the collectives' traffic; a GPU moving less than its peers holds the all-reduce up.", unitMiBPerSec,
			q(jobGPUs("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"), "{{Hostname}} GPU {{gpu}}")).Min(0).DataLinks(links(toNode)))
}

func ncclNVLink() *dashboard.DashboardBuilder {
	nodes := cl + `, Hostname=~"$Hostname"`
	perGPU := func(expr string) string { return `max by (Hostname, gpu, counter) (` + expr + `)` }
	counter := func(expr, name string) string {
		return `label_replace(` + expr + `, "counter", "` + name + `", "", "")`
	}
	return newDashboard("nccl-nvlink", "NCCL / NVLink communication",
		"Inter-GPU and inter-node communication health: nccl-tests bus bandwidth, NVLink throughput and errors (NVLink4 and NVLink5 counters), PCIe replays, NIC drops (source document §3.4).", "nccl").
		WithVariable(clusterVar()).
		WithVariable(labelVar("Hostname", "Hostname", "DCGM_FI_DEV_GPU_TEMP", cl, true)).
		// Pushed by the nccl-tests job, grouped by its first node (instance).
		WithPanel(timeSeries("NCCL bus bandwidth (nccl-tests)", "all_reduce_perf bus bandwidth of the last nccl-tests run on each block of nodes, as pushed to the Pushgateway: a drop points at a NIC, switch port or NVLink of that block.", unitGbitsPerSec,
			q(`max by (instance, nodes) (nccl_bandwidth_gbps{`+cl+`})`, "{{instance}} ({{nodes}} nodes)")).Min(0)).
		WithPanel(timeSeries("NVLink throughput by node", "NVLink traffic (TX+RX) of all GPUs of each node: DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL is DCGM's throughput in MiB/s, summed per node.", unitMiBPerSec,
			q(`sum by (Hostname) (`+gpuLevel(`DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{`+nodes+`}`)+`)`, "{{Hostname}}")).Min(0).DataLinks(links(toNode))).
		// NVLink4 counts CRC errors, NVLink5 (B200) FEC-corrected
		// "effective" errors; DCGM's health check fails a link at 100 CRC
		// errors/s.
		WithPanel(timeSeries("NVLink CRC errors", "NVLink CRC errors per second, per GPU (flit and data on NVLink4, effective errors on NVLink5): a failing link or bridge. DCGM's health check fails a link from 100/s.", unitPerSecond,
			q(perGPU(counter(`rate(DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{`+nodes+`}[$__rate_interval])`, "flit")+
				` or `+counter(`rate(DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL{`+nodes+`}[$__rate_interval])`, "data")+
				` or `+counter(`rate(DCGM_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS{`+nodes+`}[$__rate_interval])`, "effective")), "{{Hostname}} GPU {{gpu}} {{counter}}")).Min(0).DataLinks(links(toNode))).
		WithPanel(timeSeries("NVLink replay and recovery errors", "NVLink replays and link recoveries per GPU in each interval (NVLink4 replay/recovery counters, NVLink5 failed link recoveries): DCGM's health check fails a link on any.", unitCount,
			q(perGPU(counter(`increase(DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL{`+nodes+`}[$__rate_interval])`, "replay")+
				` or `+counter(`increase(DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL{`+nodes+`}[$__rate_interval])`, "recovery")+
				` or `+counter(`increase(DCGM_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS{`+nodes+`}[$__rate_interval])`, "recovery failed")), "{{Hostname}} GPU {{gpu}} {{counter}}")).Min(0).DataLinks(links(toNode))).
		WithPanel(timeSeries("PCIe replays", "PCIe replays per second, per GPU: a marginal PCIe link.", unitPerSecond,
			q(`max by (Hostname, gpu) (rate(DCGM_FI_DEV_PCIE_REPLAY_COUNTER{`+nodes+`}[$__rate_interval]))`, "{{Hostname}} GPU {{gpu}}")).Min(0).DataLinks(links(toNode))).
		// node-exporter's series carry node, not Hostname.
		WithPanel(timeSeries("NIC transmit drops", "Packets dropped on transmit, per node: a RoCE/InfiniBand fabric problem shows here first.", unitPerSecond,
			q(`sum by (node) (rate(node_network_transmit_drop_total{`+cl+`, node=~"$Hostname"}[$__rate_interval]))`, "{{node}}")).Min(0)).
		WithPanel(timeSeries("NIC receive drops", "Packets dropped on receive, per node.", unitPerSecond,
			q(`sum by (node) (rate(node_network_receive_drop_total{`+cl+`, node=~"$Hostname"}[$__rate_interval]))`, "{{node}}")).Min(0))
}

// dcgmExporter has every panel of NVIDIA's dcgm-exporter dashboard (grafana.com
// 12239) under the same titles and variables, so its users find them here.
// Unlike it, each GPU is one line: a GPU's pods and MIG instances are folded
// (the instances' own framebuffer added up, their engine activity averaged).
func dcgmExporter() *dashboard.DashboardBuilder {
	sel := `Hostname=~"$Hostname", gpu=~"$gpu"`
	perGPU := func(metric string) string { return `max by (Hostname, gpu) (` + metric + `{` + sel + `})` }
	return newDashboard("dcgm-exporter", "NVIDIA DCGM Exporter",
		"The panels of NVIDIA's DCGM Exporter dashboard (grafana.com 12239), one line per GPU (MIG instances folded into their GPU).", "dcgm").
		WithVariable(labelVar("Hostname", "Hostname", "DCGM_FI_DEV_FB_FREE", "", true)).
		WithVariable(labelVar("gpu", "gpu", "DCGM_FI_DEV_FB_FREE", `Hostname=~"$Hostname"`, true)).
		WithPanel(timeSeries("GPU Temperature", "", unitCelsius,
			q(perGPU("DCGM_FI_DEV_GPU_TEMP"), "GPU {{gpu}} {{Hostname}}")).Span(18)).
		WithPanel(gaugePanel("GPU Avg. Temp", "", unitCelsius, 0, 100,
			q(`avg(`+perGPU("DCGM_FI_DEV_GPU_TEMP")+`)`, "")).Span(6).Height(8).Thresholds(tempThresholds())).
		WithPanel(timeSeries("GPU Power Usage", "", unitWatt,
			q(perGPU("DCGM_FI_DEV_POWER_USAGE"), "GPU {{gpu}} {{Hostname}}")).Span(18)).
		// No fixed maximum: with every node selected (the default) the
		// total is the cluster's, far above one node's 6 kW.
		WithPanel(gaugePanel("GPU Power Total", "", unitKilowatt, 0, 0,
			q(`sum(`+perGPU("DCGM_FI_DEV_POWER_USAGE")+`) / 1000`, "")).Span(6).Height(8)).
		WithPanel(timeSeries("GPU SM Clocks", "", unitHertz,
			q(perGPU("DCGM_FI_DEV_SM_CLOCK")+` * 1000000`, "GPU {{gpu}} {{Hostname}}"))).
		WithPanel(timeSeries("GPU Utilization", "Share of time the graphics engine was active (DCGM_FI_PROF_GR_ENGINE_ACTIVE; a MIG GPU's instances averaged).", unitPercentUnit,
			q(`avg by (Hostname, gpu) (`+instanceLevel(`DCGM_FI_PROF_GR_ENGINE_ACTIVE{`+sel+`}`)+`)`, "GPU {{gpu}} {{Hostname}}")).Min(0).Max(1)).
		WithPanel(timeSeries("Tensor Core Utilization", "Share of cycles the tensor pipes were active (a MIG GPU's instances averaged).", unitPercentUnit,
			q(`avg by (Hostname, gpu) (`+instanceLevel(`DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{`+sel+`}`)+`)`, "GPU {{gpu}} {{Hostname}}")).Min(0).Max(1)).
		WithPanel(timeSeries("GPU Framebuffer Mem Used", "Framebuffer used (a MIG GPU's instances added up).", unitMebibytes,
			q(`sum by (Hostname, gpu) (`+instanceLevel(`DCGM_FI_DEV_FB_USED{`+sel+`}`)+`)`, "GPU {{gpu}} {{Hostname}}")).Min(0))
}
