package bucketstore

import (
	"context"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/grafana/dskit/user"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/value"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/downsample"
	"github.com/gpustore/gpustore/pkg/query"
	"github.com/gpustore/gpustore/pkg/tenantdb"
)

// podSeries is a GPU temperature as dcgm-exporter labels it with
// Kubernetes mapping: each GPU runs a pod after another (the series of a
// pod ends with a staleness marker), and GPU 1 is time-sliced between two
// pods for a while (both series carry the same samples).
func podSeries(host string, from, to int64) []rawData {
	var out []rawData
	for g := range 2 {
		for p := int64(0); from+p*150*minute < to; p++ {
			begin, end := from+p*150*minute, min(to, from+(p+1)*150*minute)
			pods := []string{fmt.Sprintf("job-%d-%d", g, p)}
			if g == 1 && p == 1 {
				pods = append(pods, "shared-1") // a second pod on the same GPU
			}
			for _, pod := range pods {
				s := rawData{lset: labels.FromStrings("__name__", "DCGM_FI_DEV_GPU_TEMP", "Hostname", host, "gpu", fmt.Sprint(g),
					"namespace", "training", "pod", pod)}
				for ts := begin - begin%15_000 + 15_000; ts < end; ts += 15_000 {
					s.ts = append(s.ts, ts)
					s.fs = append(s.fs, math.Round(50+20*math.Sin(float64(ts)/float64(23*minute)+float64(g))))
				}
				if end < to {
					s.ts, s.fs = append(s.ts, end+15_000-end%15_000), append(s.fs, math.Float64frombits(value.StaleNaN))
				}
				out = append(out, s)
			}
		}
	}
	return out
}

// Where raw data meets data downsampled with pods folded (5m blocks with
// gpustore.downsample.folded_labels [pod]), a query that does not name pod
// gets one series per GPU through the whole range, the raw series folded
// at read time as the compactor folded the old ones: no split series, no
// partial windows at the edge. Its answers are those of the raw data with
// its pod labels, aggregated without pod. A query that names pod over
// hours where only folded data is left says so.
func TestFoldedDataMeetsRaw(t *testing.T) {
	ctx := user.InjectOrgID(context.Background(), "team-a")
	data := podSeries("node-001", t0, t0+8*hour)
	fold, err := downsample.NewFold([]string{"pod"}, "DCGM_FI_DEV_GPU_TEMP")
	if err != nil {
		t.Fatal(err)
	}
	// The bucket: 2h raw blocks for [0h, 6h), downsampled with pods
	// folded; raw retention has deleted [0h, 4h). The receiver's local
	// TSDB holds [6h, 8h).
	d := newDSBucket(t)
	var raws []block.Meta
	for h := int64(0); h < 6; h += 2 {
		raws = append(raws, d.raw(nil, t0+h*hour, t0+(h+2)*hour, data))
	}
	for i, m := range raws {
		in := []block.Meta{m}
		if i+1 < len(raws) {
			in = append(in, raws[i+1])
		}
		d.downsample(downsample.Res5m, m.MinTime, m.MaxTime, fold, []block.Meta{m}, in...)
	}
	d.delete(raws[0])
	d.delete(raws[1])
	s := d.store()
	cfg := tenantdb.DefaultConfig()
	cfg.Dir = t.TempDir()
	dbs, err := tenantdb.NewManager(cfg, quietLogger(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer dbs.Close()
	db, err := dbs.Get(d.tenant)
	if err != nil {
		t.Fatal(err)
	}
	app := db.Appender(ctx)
	for _, sr := range data {
		for i, ts := range sr.ts {
			if ts >= t0+6*hour {
				if _, err := app.Append(0, sr.lset, ts, sr.fs[i]); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if err := app.Commit(); err != nil {
		t.Fatal(err)
	}
	qb := query.TenantQueryable{DBs: dbs, Sources: []query.Source{s}}

	// The truth: every raw block, pods kept.
	truth := newDSBucket(t)
	for h := int64(0); h < 8; h += 2 {
		truth.raw(nil, t0+h*hour, t0+(h+2)*hour, data)
	}
	ts := truth.store()
	for _, c := range []struct{ q, want string }{
		{"max_over_time(DCGM_FI_DEV_GPU_TEMP[30m])", "max without (pod) (max_over_time(DCGM_FI_DEV_GPU_TEMP[30m]))"},
		{"min by (gpu) (min_over_time(DCGM_FI_DEV_GPU_TEMP[1h]))", "min by (gpu) (min_over_time(DCGM_FI_DEV_GPU_TEMP[1h]))"},
		{"max_over_time(DCGM_FI_DEV_GPU_TEMP{namespace=\"training\"}[30m])", "max without (pod) (max_over_time(DCGM_FI_DEV_GPU_TEMP[30m]))"},
	} {
		want := truth.query(ts, block.ResolutionRaw, c.want, t0+hour, t0+8*hour, 30*minute)
		got := d.queryOn(ctx, qb, downsample.Auto, c.q, t0+hour, t0+8*hour, 30*minute)
		if bad, n := diff(want, got, 0, 5); n == 0 || len(bad) > 0 {
			t.Errorf("%s: differs from the raw data's %s (%d points; infos %q):\n%s", c.q, c.want, n, got.infos(), strings.Join(bad, "\n"))
		}
		if !got.hasInfo("5m data for") {
			t.Errorf("%s: folded data not read: %q", c.q, got.infos())
		}
	}

	// Naming pod over hours with only folded data: said.
	q := `max_over_time(DCGM_FI_DEV_GPU_TEMP{pod=~"job-.*"}[30m])`
	got := d.queryOn(ctx, qb, downsample.Auto, q, t0+hour, t0+8*hour, 30*minute)
	if !slices.ContainsFunc(got.infos(), regexp.MustCompile(`folded away.*\[pod\] in 5m data`).MatchString) {
		t.Errorf("%s over folded hours: no info saying pod is gone there: %q", q, got.infos())
	}
	for k := range got.points {
		if !strings.Contains(k, "pod=") {
			t.Errorf("%s: a series without pod %s", q, k)
		}
	}
}
