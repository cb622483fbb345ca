package query

import (
	"context"
	"io"
	"log/slog"
	"math"
	"testing"
	"time"

	"github.com/grafana/dskit/user"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"

	"github.com/gpustore/gpustore/pkg/tenantdb"
)

// Two replicas of an HA pair stored without ingest dedup: p0 has a
// 3-minute hole, p1 scrapes 300 ms later and its counter reads a little low
// (as a replica with a lagging exporter cache might), which a naive switch
// would turn into counter resets.
func TestQueryTimeDedup(t *testing.T) {
	cfg := tenantdb.DefaultConfig()
	cfg.Dir = t.TempDir()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	dbs, err := tenantdb.NewManager(cfg, logger, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer dbs.Close()
	db, err := dbs.Get("t")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now().Add(-time.Hour).Truncate(time.Minute).UnixMilli()
	const step = 15000
	app := db.Appender(context.Background())
	for i := int64(0); i <= 80; i++ {
		ts := start + i*step
		for _, r := range []struct {
			name   string
			lag    int64
			offset float64
		}{{"p0", 0, 0}, {"p1", 300, -50}} {
			if r.name == "p0" && i >= 30 && i < 42 {
				continue // p0 down for 3 minutes
			}
			t := ts + r.lag
			for _, s := range []struct {
				lset labels.Labels
				v    float64
			}{
				{labels.FromStrings("__name__", "energy_total", "gpu", "0", "cluster", "a", "__replica__", r.name), 1e6 + 10*float64(t)/1000 + r.offset},
				{labels.FromStrings("__name__", "gpu_temp", "gpu", "0", "cluster", "a", "__replica__", r.name), 70},
			} {
				if _, err := app.Append(0, s.lset, t, s.v); err != nil {
					panic(err)
				}
			}
		}
	}
	if err := app.Commit(); err != nil {
		t.Fatal(err)
	}

	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 1e7, Timeout: time.Minute, LookbackDelta: 5 * time.Minute})
	q := TenantQueryable{DBs: dbs}
	run := func(ctx context.Context, expr string) promql.Matrix {
		t.Helper()
		qry, err := engine.NewRangeQuery(ctx, q, nil, expr, time.UnixMilli(start+5*60000), time.UnixMilli(start+80*step), 15*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		res := qry.Exec(ctx)
		if res.Err != nil {
			t.Fatal(res.Err)
		}
		m, err := res.Matrix()
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	plain := user.InjectOrgID(context.Background(), "t")
	dedup := WithDedup(plain, []string{"__replica__"})

	if m := run(plain, `sum(gpu_temp)`); m[0].Floats[0].F != 140 {
		t.Fatalf("without dedup both replicas count: %v", m[0].Floats[0].F)
	}
	if m := run(dedup, `sum(gpu_temp)`); m[0].Floats[0].F != 70 {
		t.Fatalf("with dedup one replica counts: %v", m[0].Floats[0].F)
	}
	m := run(dedup, `energy_total`)
	if len(m) != 1 || m[0].Metric.Has("__replica__") {
		t.Fatalf("dedup result %v", m)
	}
	// The replicas disagree by 50 (5 s worth of increase); a switch may cost
	// at most one scrape interval's worth (150) of a window's increase.
	for _, c := range []struct {
		expr   string
		window float64
	}{{`rate(energy_total[1m])`, 60}, {`rate(energy_total[5m])`, 300}} {
		expr := c.expr
		m := run(dedup, expr)
		if len(m) != 1 {
			t.Fatalf("%s: %d series", expr, len(m))
		}
		for _, p := range m[0].Floats {
			if math.Abs(p.F-10) > 150/c.window {
				t.Errorf("%s at %s = %g, want 10 (no fake reset, no hole)", expr, time.UnixMilli(p.T).Format(time.TimeOnly), p.F)
			}
		}
	}
	if m := run(dedup, `resets(energy_total[20m])`); m[len(m)-1].Floats[len(m[0].Floats)-1].F != 0 {
		t.Fatalf("resets across the replica switch: %v", m)
	}
}
