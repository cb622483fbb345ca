package downsample

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/value"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunkenc"

	"github.com/gpustore/gpustore/pkg/block"
)

// podPieces cuts each series into pieces labelled with the pod that "used
// the GPU" then, as dcgm-exporter labels a GPU's series: the same samples,
// spread over several series. Some pieces are also written under a second
// pod with the same samples (two pods sharing the GPU), and some pieces end
// with a staleness marker (the pod ended) at the time the next piece's first
// sample has.
func podPieces(rng *rand.Rand, series []rawSeries) []rawSeries {
	var out []rawSeries
	for si, s := range series {
		pod := 0
		for i := 0; i < len(s.ts); {
			n := 1 + rng.IntN(len(s.ts)/3+1)
			end := min(i+n, len(s.ts))
			lset := labels.NewBuilder(s.lset).Set("pod", "job-"+strconv.Itoa(si)+"-"+strconv.Itoa(pod)).Labels()
			piece := rawSeries{lset: lset, counter: s.counter, ts: slices.Clone(s.ts[i:end]), vs: slices.Clone(s.vs[i:end])}
			if end < len(s.ts) && rng.IntN(2) == 0 {
				piece.ts = append(piece.ts, s.ts[end])
				piece.vs = append(piece.vs, math.Float64frombits(value.StaleNaN))
			}
			out = append(out, piece)
			if rng.IntN(4) == 0 {
				shared := piece
				shared.lset = labels.NewBuilder(s.lset).Set("pod", "shared-"+strconv.Itoa(si)+"-"+strconv.Itoa(pod)).Labels()
				out = append(out, shared)
			}
			i, pod = end, pod+1
		}
	}
	return out
}

// blockContents lists every series of b with its points (packed points and
// histograms by their text form).
func blockContents(t *testing.T, b tsdb.BlockReader) map[string][]string {
	t.Helper()
	q, err := tsdb.NewBlockQuerier(b, math.MinInt64, math.MaxInt64)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	out := map[string][]string{}
	ss := q.Select(context.Background(), true, nil, labels.MustNewMatcher(labels.MatchRegexp, model.MetricNameLabel, ".+"))
	var it chunkenc.Iterator
	for ss.Next() {
		s := ss.At()
		var pts []string
		it = s.Iterator(it)
		for vt := it.Next(); vt != chunkenc.ValNone; vt = it.Next() {
			switch vt {
			case chunkenc.ValFloat:
				ts, v := it.At()
				pts = append(pts, fmt.Sprintf("%d:%x", ts, math.Float64bits(v)))
			default:
				ts, fh := it.AtFloatHistogram(nil)
				pts = append(pts, fmt.Sprintf("%d:%s", ts, fh.String()))
			}
		}
		out[s.Labels().String()] = pts
	}
	if err := ss.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestFoldedPodsDownsampleAsOneSeries: the series of one GPU cut by pods
// (some pods sharing the GPU, some ending with a staleness marker) and
// downsampled with pod folded give exactly the blocks the uncut series give,
// at 5m and then 1h, for gauges; counters are never folded (their series
// are those of the pods, unfolded); the blocks record the folded label; a
// metric the fold does not cover keeps its pods.
func TestFoldedPodsDownsampleAsOneSeries(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, seed^0x5bd1e995))
			whole := genSeries(rng, 8)
			pieces := podPieces(rng, whole)
			dir := t.TempDir()
			split := t0 + 2*Res1h + 11*60_000 + 7
			write := func(name string, ss []rawSeries) []tsdb.BlockReader {
				return []tsdb.BlockReader{
					writeRaw(t, filepath.Join(dir, name), ss, t0-Res1h, split),
					writeRaw(t, filepath.Join(dir, name), ss, split, t0+span+Res1h),
				}
			}
			wholeBlocks, podBlocks := write("whole", whole), write("pods", pieces)

			fold, err := NewFold([]string{"pod"}, "gauge_metric|counter_.*")
			if err != nil {
				t.Fatal(err)
			}
			down := func(name string, src []tsdb.BlockReader, from int64, res int64, f *Fold, folded []string) *tsdb.Block {
				id, _, err := Downsample(context.Background(), src, Config{
					SourceResolution: from, Resolution: res, Mint: t0, Maxt: t0 + span,
					Dir: filepath.Join(dir, name), Fold: f, Folded: folded,
				})
				if err != nil {
					t.Fatal(err)
				}
				return openBlock(t, filepath.Join(dir, name, id.String()))
			}
			want5 := down("want5m", wholeBlocks, ResRaw, Res5m, nil, nil)
			got5 := down("got5m", podBlocks, ResRaw, Res5m, fold, nil)
			want1 := down("want1h", []tsdb.BlockReader{want5}, Res5m, Res1h, nil, nil)
			got1 := down("got1h", []tsdb.BlockReader{got5}, Res5m, Res1h, nil, fold.Labels)
			pods5 := down("pods5m", podBlocks, ResRaw, Res5m, nil, nil)
			pods1 := down("pods1h", []tsdb.BlockReader{pods5}, Res5m, Res1h, nil, nil)
			// Gauges as the uncut series give them, counters as their pods' series.
			name := func(k string) string {
				ls, err := parseLabels(k)
				if err != nil {
					t.Fatal(err)
				}
				return ls.Get(model.MetricNameLabel)
			}
			want := func(whole, pods *tsdb.Block) map[string][]string {
				w := blockContents(t, whole)
				for k := range w {
					if name(k) != "gauge_metric" {
						delete(w, k)
					}
				}
				for k, v := range blockContents(t, pods) {
					if name(k) != "gauge_metric" {
						w[k] = v
					}
				}
				return w
			}
			for _, c := range []struct {
				res  string
				want map[string][]string
				got  *tsdb.Block
			}{{"5m", want(want5, pods5), got5}, {"1h", want(want1, pods1), got1}} {
				w, g := c.want, blockContents(t, c.got)
				if len(w) != len(g) {
					t.Errorf("%s: %d series folded, %d from the uncut series", c.res, len(g), len(w))
				}
				for k, wp := range w {
					if gp := g[k]; !slices.Equal(wp, gp) {
						t.Errorf("%s: %s: folded %d points, uncut %d; first difference at %d", c.res, k, len(gp), len(wp), firstDiff(wp, gp))
					}
				}
				mb, err := os.ReadFile(filepath.Join(c.got.Dir(), block.MetaFilename))
				if err != nil {
					t.Fatal(err)
				}
				var m block.Meta
				if err := json.Unmarshal(mb, &m); err != nil {
					t.Fatal(err)
				}
				if f := m.GPUStore.Downsample.FoldedLabels; !slices.Equal(f, []string{"pod"}) {
					t.Errorf("%s block: folded_labels %q, want [pod]", c.res, f)
				}
			}

			// A metric outside the fold keeps its pods, and so does a
			// counter inside it.
			for _, c := range []struct {
				metrics                string
				gaugePods, counterPods bool
			}{{"counter_.*", true, true}, {"", false, true}} {
				f, err := NewFold([]string{"pod"}, c.metrics)
				if err != nil {
					t.Fatal(err)
				}
				var gaugePods, counterPods bool
				for k := range blockContents(t, down("fold-"+c.metrics, podBlocks, ResRaw, Res5m, f, nil)) {
					ls, err := parseLabels(k)
					if err != nil {
						t.Fatal(err)
					}
					if ls.Has("pod") {
						gaugePods = gaugePods || ls.Get(model.MetricNameLabel) == "gauge_metric"
						counterPods = counterPods || ls.Get(model.MetricNameLabel) != "gauge_metric"
					}
				}
				if gaugePods != c.gaugePods || counterPods != c.counterPods {
					t.Errorf("fold of %q: gauge series with pods %v (want %v), counter series with pods %v (want %v)",
						c.metrics, gaugePods, c.gaugePods, counterPods, c.counterPods)
				}
			}
		})
	}
}

func firstDiff(a, b []string) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func TestNewFold(t *testing.T) {
	if f, err := NewFold([]string{" ", ""}, "DCGM_.+"); f != nil || err != nil {
		t.Errorf("no labels: %v %v, want folding off", f, err)
	}
	if _, err := NewFold([]string{"__name__"}, ""); err == nil {
		t.Error("folding __name__ accepted")
	}
	if _, err := NewFold([]string{"pod"}, "DCGM_("); err == nil {
		t.Error("bad metrics expression accepted")
	}
	f, err := NewFold([]string{"pod", "container", "pod"}, "DCGM_.+")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(f.Labels, []string{"container", "pod"}) || !f.folds("DCGM_FI_DEV_GPU_UTIL") || f.folds("kube_pod_info") || f.folds("xDCGM_FI") {
		t.Errorf("fold %+v", f)
	}
	if m := notIn([]string{"DCGM_FI_DEV_GPU_UTIL", "a.b"}); m.Matches("DCGM_FI_DEV_GPU_UTIL") || m.Matches("a.b") || !m.Matches("axb") || !m.Matches("up") {
		t.Errorf("notIn %s", m)
	}
}

// TestFoldNeverMergesCounters: one GPU runs a pod of namespace "train" for
// an hour, idles four hours (dcgm-exporter then labels its series with no
// pod and no namespace), and runs another pod of "train" for an hour. The
// energy each pod used, sum by (namespace) (increase(energy[6h])), is what
// the two pods' series say; folded over pod, a merged "train" series would
// jump across the idle hours and count the GPU's idle energy as train's
// (+30 % here: 4 idle hours at 60 W on 2 busy ones at 400 W). Counters are never folded: the folded 5m and 1h data answer
// as the unfolded data does, and the 5m data as raw data with its pod
// labels does within the extrapolation the kept samples allow (≤ 2 % here,
// where each pod's series ends inside the range); the gauge beside it is
// folded.
func TestFoldNeverMergesCounters(t *testing.T) {
	const (
		energy = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
		power  = "DCGM_FI_DEV_POWER_USAGE"
	)
	gpu := labels.FromStrings("gpu", "0", "Hostname", "node-1", "UUID", "GPU-1")
	podLabels := func(name, pod string) labels.Labels {
		b := labels.NewBuilder(gpu).Set(model.MetricNameLabel, name)
		if pod != "" {
			b.Set("pod", pod).Set("namespace", "train").Set("container", "pytorch")
		}
		return b.Labels()
	}
	phases := []struct {
		pod      string
		from, to int64 // (from, to]
		watts    float64
	}{{"job-a", t0 - 10*60_000, t0 + Res1h, 400}, {"", t0 + Res1h, t0 + 5*Res1h, 60}, {"job-b", t0 + 5*Res1h, t0 + span + 10*60_000, 400}}
	var series []rawSeries
	mJ := 1e9
	for _, ph := range phases {
		e := rawSeries{lset: podLabels(energy, ph.pod), counter: true}
		p := rawSeries{lset: podLabels(power, ph.pod)}
		for ts := ph.from + interval; ts <= ph.to; ts += interval {
			mJ += ph.watts * float64(interval) // W × ms = mJ
			e.ts, e.vs = append(e.ts, ts), append(e.vs, mJ)
			p.ts, p.vs = append(p.ts, ts), append(p.vs, ph.watts)
		}
		series = append(series, e, p)
	}
	dir := t.TempDir()
	raw := []tsdb.BlockReader{writeRaw(t, filepath.Join(dir, "raw"), series, t0-Res1h, t0+span+Res1h)}
	fold, err := NewFold([]string{"pod"}, "DCGM_.+")
	if err != nil {
		t.Fatal(err)
	}
	down := func(name string, src []tsdb.BlockReader, from, res int64, f *Fold) *tsdb.Block {
		id, _, err := Downsample(context.Background(), src, Config{SourceResolution: from, Resolution: res, Mint: t0, Maxt: t0 + span, Dir: filepath.Join(dir, name), Fold: f})
		if err != nil {
			t.Fatal(err)
		}
		return openBlock(t, filepath.Join(dir, name, id.String()))
	}
	folded5, plain5 := down("folded5m", raw, ResRaw, Res5m, fold), down("plain5m", raw, ResRaw, Res5m, nil)
	folded1, plain1 := down("folded1h", []tsdb.BlockReader{folded5}, Res5m, Res1h, nil), down("plain1h", []tsdb.BlockReader{plain5}, Res5m, Res1h, nil)

	rawQ := rawQueryable(raw...)
	at := t0 + span
	const perNamespace = `sum by (namespace) (increase(` + energy + `{namespace="train"}[6h]))`
	want := rangeQuery(t, rawQ, perNamespace, 5*time.Minute, at, at, Res1h)
	if got := want[`{namespace="train"}`][at]; math.Abs(got-2*400*3600*1000) > 0.01*2*400*3600*1000 {
		t.Fatalf("raw: train used %.0f mJ, want about %d (two pods, an hour each at 400 W)", got, 2*400*3600*1000)
	}
	within := func(rel float64) func(string, int64, float64, float64) bool {
		return func(_ string, _ int64, w, g float64) bool { return sameFloat(w, g, rel) }
	}
	for _, c := range []struct {
		res           string
		folded, plain *tsdb.Block
	}{{"5m", folded5, plain5}, {"1h", folded1, plain1}} {
		fq, pq := viewQueryable(resOf(c.res), c.folded), viewQueryable(resOf(c.res), c.plain)
		if c.res == "5m" {
			// At 1h the kept samples are an hour apart, and increase()
			// extrapolates a series that ends inside the range by half
			// that (the stated tolerance: the uncovered time), folded
			// or not.
			compare(t, c.res+" folded vs raw with pods: "+perNamespace, want, rangeQuery(t, fq, perNamespace, 5*time.Minute, at, at, Res1h), within(0.02))
		}
		for _, q := range []string{perNamespace, "increase(" + energy + "[1h])", "resets(" + energy + "[6h])"} {
			compare(t, c.res+" folded vs unfolded: "+q, rangeQuery(t, pq, q, time.Hour, t0+Res1h, at, Res1h), rangeQuery(t, fq, q, time.Hour, t0+Res1h, at, Res1h), exact)
		}
		// The gauge is folded: one series per GPU and namespace.
		if n := len(rangeQuery(t, fq, "max_over_time("+power+"[6h])", time.Hour, at, at, Res1h)); n != 2 {
			t.Errorf("%s: %d series of the folded gauge, want 2 (train, and idle)", c.res, n)
		}
	}
}
