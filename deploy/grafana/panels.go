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
	unitGbitsPerSec = "Gbits" // nccl-tests' bus bandwidth
	unitSeconds     = "s"
	unitPerSecond   = "cps"   // events per second
	unitReqPerSec   = "reqps" // requests per second
	unitCount       = "none"
)

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

func legendTable() *common.VizLegendOptionsBuilder {
	return common.NewVizLegendOptionsBuilder().DisplayMode(common.LegendDisplayModeTable).
		Placement(common.LegendPlacementRight).ShowLegend(true).Calcs([]string{"mean", "max"})
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

func statPanel(title, desc, unit string, t *prometheus.DataqueryBuilder) *stat.PanelBuilder {
	return stat.NewPanelBuilder().Title(title).Description(desc).Unit(unit).Datasource(ds).
		Span(4).Height(5).GraphMode(common.BigValueGraphModeArea).
		ReduceOptions(common.NewReduceDataOptionsBuilder().Calcs([]string{"lastNotNull"})).
		WithTarget(t.RefId("A"))
}

func gaugePanel(title, desc, unit string, min, max float64, t *prometheus.DataqueryBuilder) *gauge.PanelBuilder {
	return gauge.NewPanelBuilder().Title(title).Description(desc).Unit(unit).Datasource(ds).
		Span(4).Height(5).Min(min).Max(max).ShowThresholdMarkers(true).
		ReduceOptions(common.NewReduceDataOptionsBuilder().Calcs([]string{"lastNotNull"})).
		WithTarget(t.RefId("A"))
}

func barGauge(title, desc, unit string, min, max float64, t *prometheus.DataqueryBuilder) *bargauge.PanelBuilder {
	return bargauge.NewPanelBuilder().Title(title).Description(desc).Unit(unit).Datasource(ds).
		Span(12).Height(8).Min(min).Max(max).DisplayMode(common.BarGaugeDisplayModeGradient).
		Orientation(common.VizOrientationHorizontal).
		ReduceOptions(common.NewReduceDataOptionsBuilder().Calcs([]string{"lastNotNull"})).
		WithTarget(t.RefId("A"))
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
