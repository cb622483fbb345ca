package grafana

import (
	"github.com/grafana/grafana-foundation-sdk/go/bargauge"
	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/gauge"
	"github.com/grafana/grafana-foundation-sdk/go/heatmap"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/table"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// Units (Grafana's unit ids). The panel-query test checks values against
// the range each unit allows, so a panel's unit is part of its contract.
const (
	unitPercent     = "percent"     // 0–100
	unitPercentUnit = "percentunit" // 0–1
	unitCelsius     = "celsius"
	unitWatt        = "watt"  // one GPU
	unitKilowatt    = "kwatt" // sums over GPUs
	unitHertz       = "hertz"
	unitMebibytes   = "decmbytes" // DCGM reports framebuffer in MiB
	unitBytes       = "bytes"
	unitBytesPerSec = "Bps"
	unitMiBPerSec   = "MiBs"   // DCGM's NVLink throughput
	unitKWh         = "kwatth" // energy: DCGM counts mJ
	unitGbitsPerSec = "Gbits"  // nccl-tests' bus bandwidth
	unitSeconds     = "s"
	unitPerSecond   = "cps"   // events per second
	unitReqPerSec   = "reqps" // requests per second
	unitCount       = "none"
)

// gpuLevel reduces DCGM series to one per GPU, as the rule pack does
// (`max without (instance, pod, namespace, container)`: a GPU shared by
// pods is exported once per pod, the exporter's address changes when it
// restarts) and MIG-safe: a GPU in MIG mode is exported once per GPU
// instance (GPU_I_PROFILE, GPU_I_ID) with the GPU's own temperature, power,
// clocks and counters, which must count once.
func gpuLevel(expr string) string {
	return "max without (instance, pod, namespace, container, GPU_I_ID, GPU_I_PROFILE) (" + expr + ")"
}

// gpuOnce reduces DCGM series to one per GPU for cluster-wide counts and
// sums, as the rule pack's cluster:* records do: gpuLevel, and also without
// Hostname/hostname (the UUID tells GPUs apart), so that a GPU whose old
// series is still in the lookback after an exporter upgrade renamed the
// label counts once. Not for panels that group by Hostname.
func gpuOnce(expr string) string {
	return "max without (instance, pod, namespace, container, GPU_I_ID, GPU_I_PROFILE, Hostname, hostname) (" + expr + ")"
}

// instanceLevel reduces DCGM series to one per GPU or MIG instance: for
// the fields an instance has of its own (framebuffer, profiling).
func instanceLevel(expr string) string {
	return "max without (instance, pod, namespace, container) (" + expr + ")"
}

// link is a drill-down from a panel's series to another dashboard, with
// the time range and the named variables set from the series' labels
// (vars: variable=label value expression, e.g. "Hostname=${__field.labels.Hostname}").
func link(title, uid string, vars ...string) cog.Builder[dashboard.DashboardLink] {
	url := "/d/" + uid + "?${__url_time_range}&var-cluster=${cluster}"
	for _, v := range vars {
		url += "&var-" + v
	}
	return dashboard.NewDashboardLinkBuilder(title).Type(dashboard.DashboardLinkTypeLink).Url(url)
}

// ds is the data source every panel and variable uses: the dashboard's
// ${datasource} variable, provisioned as gpustore.
var ds = common.DataSourceRef{Type: cog.ToPtr("prometheus"), Uid: cog.ToPtr("${datasource}")}

// q is one PromQL target.
func q(expr, legend string) *prometheus.DataqueryBuilder {
	b := prometheus.NewDataqueryBuilder().Datasource(ds).Expr(expr).Range()
	if legend != "" {
		b = b.LegendFormat(legend)
	}
	return b
}

func thresholds(steps ...dashboard.Threshold) *dashboard.ThresholdsConfigBuilder {
	return dashboard.NewThresholdsConfigBuilder().Mode(dashboard.ThresholdsModeAbsolute).Steps(steps)
}

func step(v *float64, color string) dashboard.Threshold {
	return dashboard.Threshold{Value: v, Color: color}
}

// tempThresholds are the source document's colours: blue from 30 °C, green
// from 60, orange from 75, red from 85.
func tempThresholds() *dashboard.ThresholdsConfigBuilder {
	return thresholds(step(nil, "blue"), step(cog.ToPtr(60.0), "green"), step(cog.ToPtr(75.0), "orange"), step(cog.ToPtr(85.0), "red"))
}

func timeSeries(title, desc, unit string, targets ...*prometheus.DataqueryBuilder) *timeseries.PanelBuilder {
	p := timeseries.NewPanelBuilder().Title(title).Description(desc).Unit(unit).
		Datasource(ds).Span(12).Height(8).LineWidth(1).FillOpacity(10).
		Legend(common.NewVizLegendOptionsBuilder().DisplayMode(common.LegendDisplayModeList).Placement(common.LegendPlacementBottom).ShowLegend(true))
	for i, t := range targets {
		p = p.WithTarget(t.RefId(string(rune('A' + i))))
	}
	return p
}

// tablePanel lists the series of an instant query with their labels.
func tablePanel(title, desc, unit string, t *prometheus.DataqueryBuilder) *table.PanelBuilder {
	return table.NewPanelBuilder().Title(title).Description(desc).Unit(unit).Datasource(ds).
		Span(12).Height(8).
		Footer(common.NewTableFooterOptionsBuilder().Show(false).Reducer([]string{"sum"})).
		WithTarget(t.Instant().Format(prometheus.PromQueryFormatTable).RefId("A"))
}

func statPanel(title, desc, unit string, t *prometheus.DataqueryBuilder) *stat.PanelBuilder {
	return stat.NewPanelBuilder().Title(title).Description(desc).Unit(unit).Datasource(ds).
		Span(4).Height(5).GraphMode(common.BigValueGraphModeArea).
		ReduceOptions(common.NewReduceDataOptionsBuilder().Calcs([]string{"lastNotNull"})).
		WithTarget(t.RefId("A"))
}

// gaugePanel shows one value on a dial from min to max; max <= min leaves
// the range to Grafana (from the data), for totals that grow with the
// selection.
func gaugePanel(title, desc, unit string, min, max float64, t *prometheus.DataqueryBuilder) *gauge.PanelBuilder {
	p := gauge.NewPanelBuilder().Title(title).Description(desc).Unit(unit).Datasource(ds).
		Span(4).Height(5).Min(min).ShowThresholdMarkers(true).
		ReduceOptions(common.NewReduceDataOptionsBuilder().Calcs([]string{"lastNotNull"})).
		WithTarget(t.RefId("A"))
	if max > min {
		p = p.Max(max)
	}
	return p
}

// barGauge shows one bar per series from min to max (max <= min: from the
// data).
func barGauge(title, desc, unit string, min, max float64, t *prometheus.DataqueryBuilder) *bargauge.PanelBuilder {
	p := bargauge.NewPanelBuilder().Title(title).Description(desc).Unit(unit).Datasource(ds).
		Span(12).Height(8).Min(min).DisplayMode(common.BarGaugeDisplayModeGradient).
		Orientation(common.VizOrientationHorizontal).
		ReduceOptions(common.NewReduceDataOptionsBuilder().Calcs([]string{"lastNotNull"})).
		WithTarget(t.RefId("A"))
	if max > min {
		p = p.Max(max)
	}
	return p
}

// rowsHeatmap shows one row per series (for example the 8 GPUs of a node)
// over time, coloured by value: the data is not bucketed again.
func rowsHeatmap(title, desc, unit string, min, max float32, t *prometheus.DataqueryBuilder) *heatmap.PanelBuilder {
	return heatmap.NewPanelBuilder().Title(title).Description(desc).Unit(unit).Datasource(ds).
		Span(12).Height(8).Calculate(false).
		Color(heatmap.NewHeatmapColorOptionsBuilder().Mode(heatmap.HeatmapColorModeScheme).
			Scheme("Spectral").Reverse(true).Min(min).Max(max).Steps(64)).
		CellValues(heatmap.NewCellValuesBuilder().Unit(unit)).
		WithTarget(t.RefId("A"))
}
