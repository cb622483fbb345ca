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
	ss := q.Select(context.Background(), true, nil, labels.MustNewMatcher(labels.MatchRegexp, labels.MetricName, ".+"))
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
// at 5m and then 1h, for gauges and counters; the blocks record the folded
// label; a metric the fold does not cover keeps its pods.
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
			for _, c := range []struct {
				res       string
				want, got *tsdb.Block
			}{{"5m", want5, got5}, {"1h", want1, got1}} {
				w, g := blockContents(t, c.want), blockContents(t, c.got)
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

			// A metric outside the fold keeps its pods.
			narrow, err := NewFold([]string{"pod"}, "counter_.*")
			if err != nil {
				t.Fatal(err)
			}
			g := blockContents(t, down("narrow", podBlocks, ResRaw, Res5m, narrow, nil))
			var gaugePods, counterPods int
			for k := range g {
				ls, err := parseLabels(k)
				if err != nil {
					t.Fatal(err)
				}
				if ls.Has("pod") {
					if ls.Get(labels.MetricName) == "gauge_metric" {
						gaugePods++
					} else {
						counterPods++
					}
				}
			}
			if gaugePods == 0 || counterPods != 0 {
				t.Errorf("fold of counter_.* only: %d gauge series with pods (want some), %d counter series (want 0)", gaugePods, counterPods)
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
	if m := f.notFolded(); m.Matches("DCGM_FI_DEV_GPU_UTIL") || !m.Matches("up") {
		t.Errorf("notFolded %s", m)
	}
}
