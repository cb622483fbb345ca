package query

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/grafana/dskit/user"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/tsdb"

	"github.com/gpustore/gpustore/pkg/tenantdb"
)

// TestTopKTiesAsPrometheus: GPUs tied on a value (idle GPUs at 0 %
// utilisation, a fleet at one clock) are ranked by topk and bottomk in the
// order the engine is handed their series. Prometheus hands it series in
// label order whenever a query reads a block; gpustore does so always, so
// that a Grafana top-N panel shows the GPUs Prometheus shows, whatever
// order remote write created the series in (here: not label order), with
// the query-time replica merge on or off.
func TestTopKTiesAsPrometheus(t *testing.T) {
	ctx := context.Background()
	const t0 = int64(1_700_002_800_000)
	// Series created in an order that is not their labels' (a remote
	// write's shards arrive in any order).
	var series []labels.Labels
	for _, g := range []int{7, 3, 11, 0, 9, 14, 1, 5} {
		series = append(series, labels.FromStrings("__name__", "DCGM_FI_DEV_GPU_UTIL", "Hostname", fmt.Sprintf("node-%d", g%2), "gpu", fmt.Sprint(g)))
	}
	value := func(ts int64, i int) float64 {
		if i%3 == 0 {
			return 50 // a three-way tie at the top
		}
		return 0 // and a five-way tie at the bottom
	}
	// Prometheus: the same samples, its older hours in a block.
	prom, err := tsdb.Open(t.TempDir(), nil, nil, tsdb.DefaultOptions(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer prom.Close()
	// gpustore: the last hour in a tenant's head.
	cfg := tenantdb.DefaultConfig()
	cfg.Dir = t.TempDir()
	cfg.BlockDuration = model.Duration(2 * time.Hour)
	dbs, err := tenantdb.NewManager(cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer dbs.Close()
	db, err := dbs.Get("t")
	if err != nil {
		t.Fatal(err)
	}
	for ts := t0; ts < t0+4*3600_000; ts += scrapeEvery {
		papp, gapp := prom.Appender(ctx), db.Appender(ctx)
		for i, ls := range series {
			if _, err := papp.Append(0, ls, ts, value(ts, i)); err != nil {
				t.Fatal(err)
			}
			if _, err := gapp.Append(0, ls, ts, value(ts, i)); err != nil {
				t.Fatal(err)
			}
		}
		if err := papp.Commit(); err != nil {
			t.Fatal(err)
		}
		if err := gapp.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	if err := prom.Compact(ctx); err != nil {
		t.Fatal(err)
	}
	if len(prom.Blocks()) == 0 {
		t.Fatal("Prometheus cut no block")
	}

	ng := promql.NewEngine(promql.EngineOpts{MaxSamples: 1e7, Timeout: time.Minute, LookbackDelta: 5 * time.Minute})
	gq := TenantQueryable{DBs: dbs}
	end := time.UnixMilli(t0 + 4*3600_000 - scrapeEvery)
	for _, dedup := range []bool{true, false} {
		gctx := user.InjectOrgID(ctx, "t")
		if dedup {
			gctx = withDedup(gctx, []string{"__replica__"})
		}
		for _, qs := range []string{
			`topk(2, DCGM_FI_DEV_GPU_UTIL)`, `bottomk(3, DCGM_FI_DEV_GPU_UTIL)`,
			`topk by (Hostname) (1, DCGM_FI_DEV_GPU_UTIL)`, `bottomk(2, max_over_time(DCGM_FI_DEV_GPU_UTIL[5m]))`,
		} {
			// The last 3 hours: Prometheus reads them from its head and
			// its last block; gpustore from its head alone.
			wq, err := ng.NewRangeQuery(ctx, prom, nil, qs, end.Add(-3*time.Hour), end, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			pq, err := ng.NewRangeQuery(gctx, gq, nil, qs, end.Add(-3*time.Hour), end, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			w, g := wq.Exec(ctx), pq.Exec(gctx)
			if w.Err != nil || g.Err != nil {
				t.Fatalf("%s: %v / %v", qs, w.Err, g.Err)
			}
			if d := diffMatrices(w.Value.(promql.Matrix), g.Value.(promql.Matrix)); d != "" {
				t.Errorf("dedup %v, %s: Prometheus %s\ngpustore %s", dedup, qs, seriesOf(w.Value.(promql.Matrix)), seriesOf(g.Value.(promql.Matrix)))
			}
		}
	}
}

func seriesOf(m promql.Matrix) []string {
	var out []string
	for _, s := range m {
		out = append(out, s.Metric.String())
	}
	return out
}
