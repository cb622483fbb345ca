package grafana

import (
	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

// The source document's dashboards (§3), with its PromQL fixed where it was
// wrong. Series come from dcgm-exporter (Hostname, gpu), node-exporter and
// cAdvisor (node), kube-state-metrics and the training job's own metrics
// (job_name); `cluster` is the external label of the Prometheus pair.

const cl = `cluster="$cluster"`

func clusterOverview() *dashboard.DashboardBuilder {
	return newDashboard("gpu-cluster-overview", "GPU cluster overview",
		"Health, power, utilisation and temperature of the whole GPU cluster (source document §3.1).", "overview").
		WithVariable(clusterVar()).
		WithPanel(statPanel("GPUs", "GPUs reporting to dcgm-exporter.", unitCount,
			q(`count(DCGM_FI_DEV_GPU_UTIL{`+cl+`})`, ""))).
		// The document subtracted count(XID > 0), which is empty (not 0)
		// when no GPU has an Xid, and so blanked the panel on a healthy
		// cluster.
		WithPanel(statPanel("GPUs available", "GPUs reporting and without a pending Xid error.", unitCount,
			q(`count(DCGM_FI_DEV_GPU_UTIL{`+cl+`}) - (count(DCGM_FI_DEV_XID_ERRORS{`+cl+`} > 0) or vector(0))`, "")).
			Thresholds(thresholds(step(nil, "red"), step(cog.ToPtr(1.0), "green")))).
		WithPanel(statPanel("Total power", "Power drawn by all GPUs of the cluster.", unitKilowatt,
			q(`sum(DCGM_FI_DEV_POWER_USAGE{`+cl+`}) / 1000`, ""))).
		WithPanel(gaugePanel("Average GPU utilisation", "Mean DCGM_FI_DEV_GPU_UTIL over all GPUs.", unitPercent, 0, 100,
			q(`avg(DCGM_FI_DEV_GPU_UTIL{`+cl+`})`, "")).
			Thresholds(thresholds(step(nil, "red"), step(cog.ToPtr(30.0), "orange"), step(cog.ToPtr(70.0), "green")))).
		WithPanel(statPanel("Hottest GPU", "Highest GPU temperature in the cluster.", unitCelsius,
			q(`max(DCGM_FI_DEV_GPU_TEMP{`+cl+`})`, "")).Thresholds(tempThresholds())).
		// count() of kube_job_status_active counted finished jobs too.
		WithPanel(statPanel("Active training jobs", "Training jobs with at least one active pod.", unitCount,
			q(`count(kube_job_status_active{`+cl+`, namespace="training"} > 0) or vector(0)`, ""))).
		WithPanel(timeSeries("GPU utilisation by node", "Mean GPU utilisation of each node's GPUs.", unitPercent,
			q(`avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL{`+cl+`})`, "{{Hostname}}")).Min(0).Max(100)).
		WithPanel(timeSeries("Power by node", "Power drawn by each node's GPUs.", unitKilowatt,
			q(`sum by (Hostname) (DCGM_FI_DEV_POWER_USAGE{`+cl+`}) / 1000`, "{{Hostname}}")).Min(0)).
		WithPanel(timeSeries("Hottest GPU by node", "Highest GPU temperature of each node.", unitCelsius,
			q(`max by (Hostname) (DCGM_FI_DEV_GPU_TEMP{`+cl+`})`, "{{Hostname}}")).Thresholds(tempThresholds())).
		// The document plotted rate() of every GPU's counter; summed per node
		// it stays readable on a large cluster.
		WithPanel(timeSeries("ECC single-bit errors", "Correctable (single-bit) volatile ECC errors per second, per node: early sign of a degrading GPU.", unitPerSecond,
			q(`sum by (Hostname) (rate(DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{`+cl+`}[$__rate_interval]))`, "{{Hostname}}")).Min(0))
}

func nodeDetail() *dashboard.DashboardBuilder {
	node := cl + `, Hostname="$Hostname"`
	gpus := node + `, gpu=~"$gpu"`
	return newDashboard("gpu-node-detail", "GPU node detail",
		"One node's 8 GPUs: temperature heat map, power, utilisation, memory, NVLink and PCIe (source document §3.2).", "node").
		WithVariable(clusterVar()).
		WithVariable(labelVar("Hostname", "Hostname", "DCGM_FI_DEV_GPU_TEMP", cl, false)).
		WithVariable(labelVar("gpu", "gpu", "DCGM_FI_DEV_GPU_TEMP", cl+`, Hostname="$Hostname"`, true)).
		WithPanel(rowsHeatmap("GPU temperature (8-GPU heat map)", "One row per GPU of the node, coloured from blue (30 °C) to red (90 °C).", unitCelsius, 30, 90,
			q(`DCGM_FI_DEV_GPU_TEMP{`+node+`}`, "GPU {{gpu}}"))).
		WithPanel(rowsHeatmap("NVLink throughput (GPU × time)", "NVLink traffic of each GPU of the node. dcgm-exporter reports NVLink throughput per GPU, not per GPU pair, so this is the node's GPU-by-time matrix.", unitBytesPerSec, 0, 3e11,
			q(`rate(DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{`+node+`}[$__rate_interval])`, "GPU {{gpu}}"))).
		WithPanel(timeSeries("Temperature", "GPU temperature.", unitCelsius,
			q(`DCGM_FI_DEV_GPU_TEMP{`+gpus+`}`, "GPU {{gpu}}")).Thresholds(tempThresholds())).
		WithPanel(timeSeries("Power", "Power drawn by each GPU.", unitWatt,
			q(`DCGM_FI_DEV_POWER_USAGE{`+gpus+`}`, "GPU {{gpu}}")).Min(0)).
		WithPanel(timeSeries("GPU utilisation", "DCGM_FI_DEV_GPU_UTIL of each GPU.", unitPercent,
			q(`DCGM_FI_DEV_GPU_UTIL{`+gpus+`}`, "GPU {{gpu}}")).Min(0).Max(100)).
		// FB_USED / (FB_USED + FB_FREE): dcgm-exporter's default field list
		// has no FB_TOTAL.
		WithPanel(barGauge("Framebuffer used", "Framebuffer memory used, as a share of the GPU's memory.", unitPercent, 0, 100,
			q(`100 * DCGM_FI_DEV_FB_USED{`+gpus+`} / (DCGM_FI_DEV_FB_USED{`+gpus+`} + DCGM_FI_DEV_FB_FREE{`+gpus+`})`, "GPU {{gpu}}")).
			Thresholds(thresholds(step(nil, "green"), step(cog.ToPtr(80.0), "orange"), step(cog.ToPtr(95.0), "red")))).
		WithPanel(timeSeries("PCIe throughput", "PCIe bytes per second each GPU sends (tx) and receives (rx).", unitBytesPerSec,
			q(`DCGM_FI_PROF_PCIE_TX_BYTES{`+gpus+`}`, "GPU {{gpu}} tx"),
			q(`DCGM_FI_PROF_PCIE_RX_BYTES{`+gpus+`}`, "GPU {{gpu}} rx")).Min(0))
}

func trainingPerformance() *dashboard.DashboardBuilder {
	job := cl + `, job_name="$job"`
	iter := `sum(rate(training_iteration_time_seconds_sum{` + job + `}[$__rate_interval])) / (sum(rate(training_iteration_time_seconds_count{` + job + `}[$__rate_interval])) > 0)`
	return newDashboard("training-performance", "Training performance",
		"Throughput, efficiency and convergence of one training job (source document §3.3).", "training").
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
			q(`avg(training_mfu_percent{`+job+`})`, "MFU")).Min(0).Max(100))
}

func ncclNVLink() *dashboard.DashboardBuilder {
	nodes := cl + `, Hostname=~"$Hostname"`
	return newDashboard("nccl-nvlink", "NCCL / NVLink communication",
		"Inter-GPU and inter-node communication health: nccl-tests bus bandwidth, NVLink throughput and errors, PCIe replays, NIC drops (source document §3.4).", "nccl").
		WithVariable(clusterVar()).
		WithVariable(labelVar("Hostname", "Hostname", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", cl, true)).
		// Pushed by the nccl-tests job, grouped by its first node (instance).
		WithPanel(timeSeries("NCCL bus bandwidth (nccl-tests)", "all_reduce_perf bus bandwidth of the last nccl-tests run on each block of nodes, as pushed to the Pushgateway: a drop points at a NIC, switch port or NVLink of that block.", unitGbitsPerSec,
			q(`nccl_bandwidth_gbps{`+cl+`}`, "{{instance}} ({{nodes}} nodes)")).Min(0)).
		WithPanel(timeSeries("NVLink throughput by node", "NVLink traffic of all GPUs of each node.", unitBytesPerSec,
			q(`sum by (Hostname) (rate(DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{`+nodes+`}[$__rate_interval]))`, "{{Hostname}}")).Min(0)).
		WithPanel(timeSeries("NVLink CRC flit errors", "NVLink CRC flit errors per second, per GPU: a failing link or bridge.", unitPerSecond,
			q(`sum by (Hostname, gpu) (rate(DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{`+nodes+`}[$__rate_interval]))`, "{{Hostname}} GPU {{gpu}}")).Min(0)).
		WithPanel(timeSeries("PCIe replays", "PCIe replays per second, per GPU: a marginal PCIe link.", unitPerSecond,
			q(`sum by (Hostname, gpu) (rate(DCGM_FI_DEV_PCIE_REPLAY_COUNTER{`+nodes+`}[$__rate_interval]))`, "{{Hostname}} GPU {{gpu}}")).Min(0)).
		// node-exporter's series carry node, not Hostname.
		WithPanel(timeSeries("NIC transmit drops", "Packets dropped on transmit, per node: a RoCE/InfiniBand fabric problem shows here first.", unitPerSecond,
			q(`sum by (node) (rate(node_network_transmit_drop_total{`+cl+`, node=~"$Hostname"}[$__rate_interval]))`, "{{node}}")).Min(0)).
		WithPanel(timeSeries("NIC receive drops", "Packets dropped on receive, per node.", unitPerSecond,
			q(`sum by (node) (rate(node_network_receive_drop_total{`+cl+`, node=~"$Hostname"}[$__rate_interval]))`, "{{node}}")).Min(0))
}

// dcgmExporter has every panel of NVIDIA's dcgm-exporter dashboard (grafana.com
// 12239) under the same titles and variables, so its users find them here.
func dcgmExporter() *dashboard.DashboardBuilder {
	sel := `Hostname=~"$Hostname", gpu=~"$gpu"`
	return newDashboard("dcgm-exporter", "NVIDIA DCGM Exporter",
		"The panels of NVIDIA's DCGM Exporter dashboard (grafana.com 12239).", "dcgm").
		WithVariable(labelVar("Hostname", "Hostname", "DCGM_FI_DEV_FB_FREE", "", true)).
		WithVariable(labelVar("gpu", "gpu", "DCGM_FI_DEV_FB_FREE", `Hostname=~"$Hostname"`, true)).
		WithPanel(timeSeries("GPU Temperature", "", unitCelsius,
			q(`DCGM_FI_DEV_GPU_TEMP{`+sel+`}`, "GPU {{gpu}} {{Hostname}}")).Span(18)).
		WithPanel(gaugePanel("GPU Avg. Temp", "", unitCelsius, 0, 100,
			q(`avg(DCGM_FI_DEV_GPU_TEMP{`+sel+`})`, "")).Span(6).Height(8).Thresholds(tempThresholds())).
		WithPanel(timeSeries("GPU Power Usage", "", unitWatt,
			q(`DCGM_FI_DEV_POWER_USAGE{`+sel+`}`, "GPU {{gpu}} {{Hostname}}")).Span(18)).
		WithPanel(gaugePanel("GPU Power Total", "", unitKilowatt, 0, 6,
			q(`sum(DCGM_FI_DEV_POWER_USAGE{`+sel+`}) / 1000`, "")).Span(6).Height(8)).
		WithPanel(timeSeries("GPU SM Clocks", "", unitHertz,
			q(`DCGM_FI_DEV_SM_CLOCK{`+sel+`} * 1000000`, "GPU {{gpu}} {{Hostname}}"))).
		WithPanel(timeSeries("GPU Utilization", "Share of time the graphics engine was active (DCGM_FI_PROF_GR_ENGINE_ACTIVE).", unitPercentUnit,
			q(`DCGM_FI_PROF_GR_ENGINE_ACTIVE{`+sel+`}`, "GPU {{gpu}} {{Hostname}}")).Min(0).Max(1)).
		WithPanel(timeSeries("Tensor Core Utilization", "Share of cycles the tensor pipes were active.", unitPercentUnit,
			q(`DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{`+sel+`}`, "GPU {{gpu}} {{Hostname}}")).Min(0).Max(1)).
		WithPanel(timeSeries("GPU Framebuffer Mem Used", "", unitMebibytes,
			q(`DCGM_FI_DEV_FB_USED{`+sel+`}`, "GPU {{gpu}} {{Hostname}}")).Min(0))
}
