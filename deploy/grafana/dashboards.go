// Package grafana builds gpustore's Grafana dashboards in Go with
// grafana-foundation-sdk; `go generate ./deploy/grafana` (or make dashboards)
// writes them as JSON into dashboards/, which Grafana provisions (see
// deploy/compose). The tests check that the JSON is current and run every
// panel's query against gpustore loaded with simulated GPU-cluster data.
package grafana

//go:generate go run ./gen -out dashboards -png ../../docs/img/dashboards

import (
	"encoding/json"
	"fmt"

	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

// Dashboard is one generated dashboard and the file it is written to.
type Dashboard struct {
	File  string
	Board dashboard.Dashboard
}

// Dashboards builds every dashboard.
func Dashboards() ([]Dashboard, error) {
	builders := []struct {
		file string
		b    *dashboard.DashboardBuilder
	}{
		{"gpu-cluster-overview.json", clusterOverview()},
		{"gpu-node-detail.json", nodeDetail()},
		{"training-performance.json", trainingPerformance()},
		{"nccl-nvlink.json", ncclNVLink()},
		{"dcgm-exporter.json", dcgmExporter()},
		{"gpustore-operations.json", gpustoreOperations()},
	}
	out := make([]Dashboard, 0, len(builders))
	for _, d := range builders {
		board, err := d.b.Build()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", d.file, err)
		}
		out = append(out, Dashboard{File: d.file, Board: board})
	}
	return out, nil
}

// JSON renders a dashboard as committed: indented, with a final newline.
func JSON(d dashboard.Dashboard) ([]byte, error) {
	b, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

func newDashboard(uid, title, desc string, tags ...string) *dashboard.DashboardBuilder {
	return dashboard.NewDashboardBuilder(title).Uid(uid).Description(desc).
		Tags(append([]string{"gpustore", "gpu"}, tags...)).
		Editable().Timezone(common.TimeZoneBrowser).Time("now-1h", "now").Refresh("30s").
		Tooltip(dashboard.DashboardCursorSyncCrosshair).
		WithVariable(dashboard.NewDatasourceVariableBuilder("datasource").Label("Data source").Type("prometheus").
			Current(dashboard.VariableOption{Text: str("gpustore"), Value: str("gpustore")}))
}

func str(s string) dashboard.StringOrArrayOfString {
	return dashboard.StringOrArrayOfString{String: &s}
}

// labelVar is a variable filled from label_values(metric{filter}, label).
func labelVar(name, label, metric, filter string, multi bool) *dashboard.QueryVariableBuilder {
	sel := metric
	if filter != "" {
		sel += "{" + filter + "}"
	}
	query := fmt.Sprintf("label_values(%s, %s)", sel, label)
	v := dashboard.NewQueryVariableBuilder(name).Label(name).
		Query(dashboard.StringOrMap{Map: map[string]any{"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery", "qryType": 1}}).
		Definition(query).Datasource(ds).
		Refresh(dashboard.VariableRefreshOnTimeRangeChanged).Sort(dashboard.VariableSortNaturalAsc)
	if multi {
		v = v.Multi(true).IncludeAll(true).AllValue(".*")
	}
	return v
}

func clusterVar() *dashboard.QueryVariableBuilder {
	return labelVar("cluster", "cluster", "DCGM_FI_DEV_GPU_TEMP", "", false)
}
