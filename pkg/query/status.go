package query

import (
	"errors"
	"net/http"
	"regexp"
	"strconv"

	"github.com/grafana/dskit/tenant"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/tsdb"
	v1 "github.com/prometheus/prometheus/web/api/v1"

	"github.com/gpustore/gpustore/pkg/tenantdb"
)

var errLimit = errors.New("limit must be a positive number not above 10000")

// tsdbStatus answers /api/v1/status/tsdb for the request's tenant, in
// Prometheus' shape. Prometheus' handler asks one fixed database (through an
// interface without a context), which here would show one tenant's metric
// names and label values to every other tenant.
func (a *API) tsdbStatus(w http.ResponseWriter, r *http.Request) {
	limit := 10
	if s := r.FormValue("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 10000 {
			writeError(w, http.StatusBadRequest, "bad_data", errLimit)
			return
		}
		limit = n
	}
	db, ok := a.requestDB(w, r)
	if !ok {
		return
	}
	if db == nil {
		writeJSON(w, http.StatusOK, v1.Response{Status: "success", Data: v1.TSDBStatus{}})
		return
	}
	s := db.Head().Stats(model.MetricNameLabel, limit)
	writeJSON(w, http.StatusOK, v1.Response{Status: "success", Data: v1.TSDBStatus{
		HeadStats: v1.HeadStats{
			NumSeries: s.NumSeries, MinTime: s.MinTime, MaxTime: s.MaxTime,
			NumLabelPairs: s.IndexPostingStats.NumLabelPairs,
			ChunkCount:    a.tenantGauge(db.Tenant, "prometheus_tsdb_head_chunks"),
		},
		SeriesCountByMetricName:     v1.TSDBStatsFromIndexStats(s.IndexPostingStats.CardinalityMetricsStats),
		LabelValueCountByLabelName:  v1.TSDBStatsFromIndexStats(s.IndexPostingStats.CardinalityLabelStats),
		MemoryInBytesByLabelName:    v1.TSDBStatsFromIndexStats(s.IndexPostingStats.LabelValueStats),
		SeriesCountByLabelValuePair: v1.TSDBStatsFromIndexStats(s.IndexPostingStats.LabelValuePairsStats),
	}})
}

// tsdbBlocks answers /api/v1/status/tsdb/blocks with the request tenant's
// local blocks.
func (a *API) tsdbBlocks(w http.ResponseWriter, r *http.Request) {
	db, ok := a.requestDB(w, r)
	if !ok {
		return
	}
	metas := []tsdb.BlockMeta{}
	if db != nil {
		for _, b := range db.Blocks() {
			metas = append(metas, b.Meta())
		}
	}
	writeJSON(w, http.StatusOK, v1.Response{Status: "success", Data: map[string][]tsdb.BlockMeta{"blocks": metas}})
}

// requestDB is the request tenant's database, nil when it never wrote.
func (a *API) requestDB(w http.ResponseWriter, r *http.Request) (*tenantdb.DB, bool) {
	if err := a.opts.Ready(); err != nil {
		writeError(w, http.StatusServiceUnavailable, "unavailable", err)
		return nil, false
	}
	id, err := tenant.TenantID(r.Context())
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad_data", err)
		return nil, false
	}
	return a.opts.DBs.Existing(id), true
}

// tenantGauge reads a TSDB gauge of the tenant's database (labelled tenant).
func (a *API) tenantGauge(id, name string) int64 {
	mfs, err := a.opts.Registry.Gather()
	if err != nil {
		return 0
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "tenant" && l.GetValue() == id {
					return int64(m.GetGauge().GetValue())
				}
			}
		}
	}
	return 0
}

// userinfoPassword matches the password of a URL's userinfo
// (scheme://user:password@host), wherever it is in a flag's value: one URL
// or a comma-separated list of them.
var userinfoPassword = regexp.MustCompile(`(://[^/:@\s,]*):[^/@\s]*@`)

// secretFlagName matches the names of flags whose whole value is secret.
var secretFlagName = regexp.MustCompile(`(?i)(password|secret|token|credential)`)

// redactFlags is what /api/v1/status/flags shows of the command-line flags:
// a URL's password replaced by xxxxx (as the start-up log and Prometheus'
// url.URL.Redacted show it: --alertmanager.url=http://user:pass@host was
// shown to every tenant), the value of a flag named for a secret replaced
// whole.
func redactFlags(flags map[string]string) map[string]string {
	out := make(map[string]string, len(flags))
	for name, v := range flags {
		switch {
		case secretFlagName.MatchString(name) && v != "":
			out[name] = "<secret>"
		default:
			out[name] = userinfoPassword.ReplaceAllString(v, "$1:xxxxx@")
		}
	}
	return out
}
