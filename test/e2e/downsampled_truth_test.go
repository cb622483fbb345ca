package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/value"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/thanos-io/objstore/providers/filesystem"

	"github.com/gpustore/gpustore/internal/testbin"
	"github.com/gpustore/gpustore/pkg/app"
	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/compact"
	"github.com/gpustore/gpustore/pkg/downsample"
	"github.com/gpustore/gpustore/pkg/storage/bucket"
)

// TestDownsampledAnswersMatchPrometheus is issue 38's comparison, black-box:
// the same GPU samples in a real Prometheus and in gpustore's bucket after
// the compactor downsampled them and raw retention (2 days) deleted the raw
// blocks older than it. Dashboard panels at a 5 m step across the edge where
// raw data begins again, and a per-namespace chargeback over jobs that start
// and stop inside its ranges, read 5 m and 1 h data: each answer is
// Prometheus' (up to float rounding) or says it is approximate. They were a
// window short at the edge (count_over_time 56 where Prometheus said 60,
// increase(x[5m]) with no point at all) and 15–19 % high for jobs.
func TestDownsampledAnswersMatchPrometheus(t *testing.T) {
	promBin := testbin.Need(t, "prometheus")
	const h = time.Hour
	// The edge: raw blocks ending at or before it are past a 2-day
	// retention, those after are not (4h-aligned, so that no block the
	// compactor merges spans it).
	edge := time.Now().Add(-48*h - time.Minute).Truncate(4 * h)
	from, to := edge.Add(-24*h), edge.Add(12*h)
	series := truthSeries(from, to)

	blocks := t.TempDir()
	var dirs []string
	for b := from; b.Before(to); b = b.Add(2 * h) {
		dirs = append(dirs, writeTruthBlock(t, blocks, series, b, b.Add(2*h)))
	}

	// Prometheus holds the same blocks in its data directory.
	promDir := t.TempDir()
	for _, d := range dirs {
		copyDir(t, d, filepath.Join(promDir, "data", filepath.Base(d)))
	}
	promURL, _ := startPrometheusProc(t, promBin, promDir, "global:\n  scrape_interval: 15s\n", "--storage.tsdb.retention.time=30d")

	// gpustore's bucket: the blocks as a receiver ships them, compacted,
	// downsampled and past raw retention as the compactor leaves them.
	bdir := t.TempDir()
	bkt, err := filesystem.NewBucket(bdir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, d := range dirs {
		bm, err := block.ReadLocalMeta(d)
		if err != nil {
			t.Fatal(err)
		}
		m := block.Meta{BlockMeta: bm, GPUStore: block.GPUStoreMeta{Version: block.MetaVersion, Tenant: "default",
			Labels: map[string]string{}, Source: block.SourceReceive}}
		if err := block.Upload(ctx, bkt, d, m); err != nil {
			t.Fatal(err)
		}
	}
	ccfg := compact.DefaultConfig()
	ccfg.BlockRanges = compact.DurationList{model.Duration(2 * h), model.Duration(4 * h)}
	ccfg.DeleteDelay, ccfg.LeaseSettle = 0, model.Duration(10*time.Millisecond)
	ccfg.RetentionRaw = model.Duration(48 * h)
	c, err := compact.New(ccfg, bkt, t.TempDir(), nil, slogFor(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if err := c.CompactTenant(ctx, "default"); err != nil {
			t.Fatal(err)
		}
	}
	a, url := startGpustore(t, func(cfg *app.Config) {
		cfg.Target = app.Ingest + "," + app.Query
		cfg.Bucket = bucket.Config{Type: bucket.Filesystem, Config: map[string]any{"directory": bdir}}
		cfg.BucketStore.SyncInterval = model.Duration(h)
	})
	if err := a.BucketStore.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	res := map[int64]int{}
	for _, m := range a.BucketStore.Blocks("default") {
		r := m.GPUStore.Downsample.Resolution
		res[r]++
		if r == block.ResolutionRaw && m.MinTime < edge.UnixMilli() {
			t.Fatalf("raw block from %s survived raw retention", time.UnixMilli(m.MinTime).UTC())
		}
	}
	if res[downsample.Res5m] == 0 || res[downsample.Res1h] == 0 || res[block.ResolutionRaw] == 0 {
		t.Fatalf("blocks by resolution %v: want raw after the edge, 5m and 1h before it", res)
	}

	for _, c := range []struct {
		q          string
		start, end time.Time
		step       time.Duration
		maxRes     string
	}{
		// Panels across the edge (Grafana aligns the start to the step).
		{`count_over_time(DCGM_FI_DEV_GPU_TEMP[1h])`, edge.Add(-3 * h), edge.Add(3 * h), 5 * time.Minute, ""},
		{`sum_over_time(DCGM_FI_DEV_GPU_TEMP[1h])`, edge.Add(-3 * h), edge.Add(3 * h), 5 * time.Minute, ""},
		{`max_over_time(DCGM_FI_DEV_GPU_TEMP[1h])`, edge.Add(-3 * h), edge.Add(3 * h), 5 * time.Minute, ""},
		{`rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[1h])`, edge.Add(-3 * h), edge.Add(3 * h), 5 * time.Minute, ""},
		{`increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5m])`, edge.Add(-3 * h), edge.Add(3 * h), 5 * time.Minute, ""},
		// Chargeback: energy per namespace, jobs starting and stopping.
		{`sum by (namespace) (increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{pod!=""}[2h]))`, from.Add(2 * h), edge, 2 * h, "1h"},
		{`sum by (namespace) (increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{pod!=""}[1h]))`, from.Add(2 * h), edge.Add(6 * h), h, ""},
		{`sum by (namespace) (rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{pod!=""}[30m]))`, from.Add(2 * h), edge.Add(6 * h), 10 * time.Minute, "5m"},
	} {
		want, _ := truthQuery(t, promURL, c.q, c.start, c.end, c.step, "")
		got, infos := truthQuery(t, url, c.q, c.start, c.end, c.step, c.maxRes)
		what := fmt.Sprintf("%s at a %s step from %s", c.q, c.step, c.start.UTC().Format(time.DateTime))
		if !slices.ContainsFunc(infos, func(s string) bool { return strings.Contains(s, "served from downsampled blocks") }) {
			t.Errorf("%s: read no downsampled data (infos %q)", what, infos)
		}
		if slices.ContainsFunc(infos, func(s string) bool { return strings.Contains(s, "approximate") }) {
			t.Errorf("%s: says it is approximate where whole windows answer exactly: %q", what, infos)
		}
		n, bad := 0, 0
		for k, w := range want {
			for ts, wv := range w {
				n++
				gv, ok := got[k][ts]
				if !ok || math.Abs(gv-wv) > 1e-9*math.Max(math.Abs(wv), 1e-9) {
					if bad++; bad <= 3 {
						t.Errorf("%s: %s at %s: Prometheus %v, gpustore %v (present %v)", what, k, time.UnixMilli(ts).UTC().Format(time.DateTime), wv, gv, ok)
					}
				}
			}
		}
		for k, g := range got {
			for ts := range g {
				if _, ok := want[k][ts]; !ok {
					if bad++; bad <= 3 {
						t.Errorf("%s: %s at %s: gpustore answers, Prometheus does not", what, k, time.UnixMilli(ts).UTC().Format(time.DateTime))
					}
				}
			}
		}
		if n == 0 {
			t.Errorf("%s: Prometheus answered nothing: the comparison proves nothing", what)
		}
		if bad > 0 {
			t.Errorf("%s: %d of %d points differ", what, bad, n)
		}
	}
}

// truthSeries are a node's GPUs as dcgm-exporter reports them every 15 s
// over [from, to): temperature, the energy counter (mJ since boot), and
// the energy counter per pod with the Kubernetes mapping on, one series per
// job, each beginning and ending (with a staleness marker) off the scrape
// grid, in two namespaces.
func truthSeries(from, to time.Time) []truthSeriesData {
	var out []truthSeriesData
	f, e := from.UnixMilli(), to.UnixMilli()
	for g := range 4 {
		gpu := fmt.Sprint(g)
		temp := truthSeriesData{lset: labels.FromStrings("__name__", "DCGM_FI_DEV_GPU_TEMP", "Hostname", "node-1", "gpu", gpu)}
		energy := truthSeriesData{lset: labels.FromStrings("__name__", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Hostname", "node-1", "gpu", gpu)}
		var pods []truthSeriesData
		var pod *truthSeriesData
		podEnd := int64(0)
		mj := 4e12 * float64(g+1)
		for ts := f + int64(g)*1_237; ts < e; ts += 15_000 {
			power := 300 + 250*math.Sin(float64(ts)/float64(17*time.Minute/time.Millisecond)+float64(g))
			mj += power * 15_000
			temp.add(ts, math.Round(40+power/10))
			energy.add(ts, math.Round(mj))
			if ts >= podEnd {
				if pod != nil {
					pod.add(ts, math.Float64frombits(value.StaleNaN))
					pods = append(pods, *pod)
				}
				n := len(pods)
				pod = &truthSeriesData{lset: labels.FromStrings("__name__", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Hostname", "node-1",
					"gpu", gpu, "namespace", fmt.Sprintf("team-%d", (g+n)%2), "pod", fmt.Sprintf("job-%d-%d", g, n))}
				// Jobs of 1 to 7 hours, and a minute or so between them.
				podEnd = ts + int64(1+(g*3+n*5)%7)*time.Hour.Milliseconds() + int64(n*17_389)
				ts += 60_000 + int64(g*7_919)
			}
			pod.add(ts, math.Round(mj))
		}
		out = append(append(out, temp, energy), pods...)
	}
	return out
}

type truthSeriesData struct {
	lset labels.Labels
	ts   []int64
	vs   []float64
}

func (s *truthSeriesData) add(t int64, v float64) { s.ts, s.vs = append(s.ts, t), append(s.vs, v) }

func slogFor(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// writeTruthBlock writes the samples in [from, to) into one block (as a
// receiver's head cuts it) and returns its directory.
func writeTruthBlock(t *testing.T, dir string, series []truthSeriesData, from, to time.Time) string {
	t.Helper()
	mint, maxt := from.UnixMilli(), to.UnixMilli()
	w, err := tsdb.NewBlockWriter(slogFor(t), dir, maxt-mint)
	if err != nil {
		t.Fatal(err)
	}
	app := w.Appender(context.Background())
	for _, s := range series {
		for i, ts := range s.ts {
			if ts >= mint && ts < maxt {
				if _, err := app.Append(0, s.lset, ts, s.vs[i]); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if err := app.Commit(); err != nil {
		t.Fatal(err)
	}
	id, err := w.Flush(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	d := filepath.Join(dir, id.String())
	// The block writer ends a block at its last sample; a receiver's span
	// their whole range.
	b, err := os.ReadFile(filepath.Join(d, block.MetaFilename))
	if err != nil {
		t.Fatal(err)
	}
	var m tsdb.BlockMeta
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	m.MinTime, m.MaxTime = mint, maxt
	if b, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, block.MetaFilename), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return d
}

func copyDir(t *testing.T, from, to string) {
	t.Helper()
	err := filepath.WalkDir(from, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(to, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(to, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// truthQuery runs a range query against a Prometheus API (gpustore's with
// max_source_resolution maxRes when set) and returns its points by series
// and time (ms), and its infos.
func truthQuery(t *testing.T, base, q string, start, end time.Time, step time.Duration, maxRes string) (map[string]map[int64]float64, []string) {
	t.Helper()
	form := url.Values{"query": {q}, "start": {strconv.FormatInt(start.Unix(), 10)}, "end": {strconv.FormatInt(end.Unix(), 10)},
		"step": {strconv.FormatFloat(step.Seconds(), 'f', -1, 64)}}
	if maxRes != "" {
		form.Set("max_source_resolution", maxRes)
	}
	resp, err := http.PostForm(base+"/api/v1/query_range", form)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s on %s: %d %s", q, base, resp.StatusCode, body)
	}
	var r struct {
		Data struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Values [][2]any          `json:"values"`
			} `json:"result"`
		} `json:"data"`
		Infos []string `json:"infos"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatal(err)
	}
	out := map[string]map[int64]float64{}
	for _, s := range r.Data.Result {
		k := labels.FromMap(s.Metric).String()
		out[k] = map[int64]float64{}
		for _, v := range s.Values {
			ts, _ := v[0].(float64)
			f, err := strconv.ParseFloat(v[1].(string), 64)
			if err != nil {
				t.Fatal(err)
			}
			out[k][int64(math.Round(ts*1000))] = f
		}
	}
	return out, r.Infos
}
