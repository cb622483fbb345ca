package query

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/model/labels"
	v1 "github.com/prometheus/prometheus/web/api/v1"

	"github.com/gpustore/gpustore/pkg/tenancy"
	"github.com/gpustore/gpustore/pkg/tenantdb"
)

// /api/v1/status/tsdb (Prometheus' cardinality page) answers for the
// request's tenant: its own head stats, top metrics and label pairs, never
// another tenant's names or values (which would leak what they monitor).
func TestTSDBStatusPerTenant(t *testing.T) {
	cfg := tenantdb.DefaultConfig()
	cfg.Dir = t.TempDir()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	dbs, err := tenantdb.NewManager(cfg, logger, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dbs.Close() })
	now := time.Now().UnixMilli()
	// team-a: 8 GPUs × 2 metrics on host-a; team-b: 3 GPUs × 1 metric on host-b.
	write := func(tenant, host string, gpus int, metrics ...string) {
		db, err := dbs.Get(tenant)
		if err != nil {
			t.Fatal(err)
		}
		app := db.Appender(context.Background())
		for _, m := range metrics {
			for g := 0; g < gpus; g++ {
				if _, err := app.Append(0, labels.FromStrings("__name__", m, "Hostname", host, "gpu", fmt.Sprint(g)), now, 1); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := app.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	write("team-a", "host-a", 8, "DCGM_FI_DEV_GPU_TEMP", "team_a_only")
	write("team-b", "host-b", 3, "team_b_only")

	api, err := New(Options{
		Config: DefaultConfig(), Tenants: tenancy.DefaultConfig(), DBs: dbs, Logger: logger, Registry: prometheus.NewRegistry(),
		Ready: func() error { return nil }, ActiveQueryDir: t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	api.RegisterRoutes(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	status := func(tenant string) v1.TSDBStatus {
		t.Helper()
		code, r := call(t, srv, "GET", "/api/v1/status/tsdb", url.Values{"limit": {"100"}}, tenancy.OrgIDHeader, tenant)
		if code != http.StatusOK || r.Status != "success" {
			t.Fatalf("%s: %d %s %s", tenant, code, r.Status, r.Error)
		}
		var s v1.TSDBStatus
		if err := json.Unmarshal(r.Data, &s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	stats := func(s []v1.TSDBStat) map[string]uint64 {
		m := map[string]uint64{}
		for _, x := range s {
			m[x.Name] = x.Value
		}
		return m
	}
	for _, c := range []struct {
		tenant, host string
		series       uint64
		metrics      map[string]uint64
		foreign      []string // the other tenant's metric, label pair and value
	}{
		{"team-a", "host-a", 16, map[string]uint64{"DCGM_FI_DEV_GPU_TEMP": 8, "team_a_only": 8}, []string{"team_b_only", "__name__=team_b_only", "Hostname=host-b"}},
		{"team-b", "host-b", 3, map[string]uint64{"team_b_only": 3}, []string{"team_a_only", "DCGM_FI_DEV_GPU_TEMP", "__name__=team_a_only", "Hostname=host-a"}},
	} {
		s := status(c.tenant)
		if s.HeadStats.NumSeries != c.series {
			t.Errorf("%s: head has %d series, want %d", c.tenant, s.HeadStats.NumSeries, c.series)
		}
		if s.HeadStats.MaxTime != now {
			t.Errorf("%s: head max time %d, want %d", c.tenant, s.HeadStats.MaxTime, now)
		}
		if got := stats(s.SeriesCountByMetricName); fmt.Sprint(got) != fmt.Sprint(c.metrics) {
			t.Errorf("%s: series by metric %v, want %v", c.tenant, got, c.metrics)
		}
		pairs := stats(s.SeriesCountByLabelValuePair)
		if pairs["Hostname="+c.host] != c.series {
			t.Errorf("%s: label pair Hostname=%s has %d series, want %d (%v)", c.tenant, c.host, pairs["Hostname="+c.host], c.series, pairs)
		}
		if n := stats(s.LabelValueCountByLabelName)["Hostname"]; n != 1 {
			t.Errorf("%s: %d Hostname values, want its own 1", c.tenant, n)
		}
		for _, f := range c.foreign {
			if _, ok := stats(s.SeriesCountByMetricName)[f]; ok {
				t.Errorf("%s sees the other tenant's metric %s", c.tenant, f)
			}
			if _, ok := pairs[f]; ok {
				t.Errorf("%s sees the other tenant's label pair %s", c.tenant, f)
			}
		}
	}
	if s := status("nobody"); s.HeadStats.NumSeries != 0 || len(s.SeriesCountByMetricName) != 0 {
		t.Errorf("a tenant that never wrote sees %+v", s)
	}
}
