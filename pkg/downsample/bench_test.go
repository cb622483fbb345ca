package downsample

import (
	"cmp"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunkenc"

	"github.com/gpustore/gpustore/bench/gpusim"
)

// simBlock writes a raw block of the simulator's DCGM series: nodes × 8
// GPUs scraped every 15 s (as dcgm-exporter behind Prometheus, replica
// jitter 0.1 %) over [t0, t0+d], returning the block directory.
func simBlock(tb testing.TB, dir string, nodes int, d time.Duration) (*tsdb.Block, int64) {
	tb.Helper()
	c, err := gpusim.New(gpusim.Config{Name: "gpu-cluster-bench", Nodes: nodes, Seed: 1})
	if err != nil {
		tb.Fatal(err)
	}
	w, err := tsdb.NewBlockWriter(slog.New(slog.DiscardHandler), dir, 2*d.Milliseconds()+2*Res1h)
	if err != nil {
		tb.Fatal(err)
	}
	defer w.Close()
	var (
		buf     []gpusim.Series
		refs    = map[string]storage.SeriesRef{}
		b       = labels.NewScratchBuilder(0)
		samples int64
	)
	start := time.UnixMilli(t0)
	for at := start; !at.After(start.Add(d)); at = at.Add(15 * time.Second) {
		app := w.Appender(context.Background())
		buf = c.AppendSamples(buf[:0], at, gpusim.Replica{Name: "p0", Jitter: 0.001})
		for i := range buf {
			s := &buf[i]
			if s.Desc == nil || s.Desc.Source != gpusim.SourceDCGM {
				continue
			}
			b.Reset()
			for _, l := range s.Labels {
				b.Add(l.Name, l.Value)
			}
			b.Sort()
			ls := b.Labels()
			key := ls.String()
			ref, err := app.Append(refs[key], ls, s.T, s.V)
			if err != nil {
				tb.Fatal(err)
			}
			refs[key] = ref
			samples++
		}
		if err := app.Commit(); err != nil {
			tb.Fatal(err)
		}
	}
	id, err := w.Flush(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	return openBlock(tb, filepath.Join(dir, id.String())), samples
}

func dirBytes(tb testing.TB, dir string) int64 {
	var n int64
	err := filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			n += fi.Size()
		}
		return err
	})
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

// peakHeap samples the heap while f runs and returns the highest HeapInuse
// above the level before f.
func peakHeap(f func()) uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapInuse
	var peak atomic.Uint64
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		var ms runtime.MemStats
		for {
			select {
			case <-done:
				return
			case <-t.C:
				runtime.ReadMemStats(&ms)
				if ms.HeapInuse > base && ms.HeapInuse-base > peak.Load() {
					peak.Store(ms.HeapInuse - base)
				}
			}
		}
	}()
	f()
	close(done)
	return peak.Load()
}

// BenchmarkDownsampleDCGM downsamples a day of the simulator's series
// (2 nodes, 16 GPUs, 15 s scrape), with pods kept (the compactor's default)
// and with the pod fold on DCGM metrics, raw → 5m → 1h and reports
// bytes per raw sample of each block (chunks + index + meta), the size of
// the 5m and 1h blocks relative to raw, raw samples per second on one core,
// and the peak heap of the raw → 5m step.
//
//	go test ./pkg/downsample -run '^$' -bench DownsampleDCGM -benchtime 1x -cpu 1
func BenchmarkDownsampleDCGM(b *testing.B) {
	dir := b.TempDir()
	day := 24 * time.Hour
	raw, samples := simBlock(b, filepath.Join(dir, "raw"), 2, day)
	// The sample at exactly t0+24h is in the raw block too; windows (t0, t0+24h].
	rawBytes := dirBytes(b, raw.Dir())
	podFold, err := NewFold([]string{"pod"}, "DCGM_.+") // -compact.downsample.fold-labels=pod
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		fold *Fold
	}{{"pods-kept", nil}, {"pod-folded", podFold}} {
		b.Run(c.name, func(b *testing.B) {
			var st Stats
			var peak uint64
			var id5, id1 ulid.ULID
			var busy time.Duration
			for i := 0; b.Loop(); i++ {
				out := filepath.Join(dir, "out", time.Now().Format("150405.000000000"))
				peak = max(peak, peakHeap(func() {
					began := time.Now()
					defer func() { busy += time.Since(began) }()
					u, s, err := Downsample(context.Background(), []tsdb.BlockReader{raw}, Config{
						SourceResolution: ResRaw, Resolution: Res5m, Mint: t0, Maxt: t0 + day.Milliseconds(), Dir: out, Fold: c.fold,
					})
					if err != nil {
						b.Fatal(err)
					}
					st, id5 = s, u
				}))
				b5 := openBlock(b, filepath.Join(out, id5.String()))
				u, _, err := Downsample(context.Background(), []tsdb.BlockReader{b5}, Config{
					SourceResolution: Res5m, Resolution: Res1h, Mint: t0, Maxt: t0 + day.Milliseconds(), Dir: out,
				})
				if err != nil {
					b.Fatal(err)
				}
				id1 = u
				if i == 0 {
					b5Bytes := dirBytes(b, filepath.Join(out, id5.String()))
					b1Bytes := dirBytes(b, filepath.Join(out, id1.String()))
					b.ReportMetric(float64(rawBytes)/float64(samples), "raw_bytes/sample")
					b.ReportMetric(float64(b5Bytes)/float64(samples), "5m_bytes/raw_sample")
					b.ReportMetric(float64(b1Bytes)/float64(samples), "1h_bytes/raw_sample")
					b.ReportMetric(100*float64(b5Bytes)/float64(rawBytes), "5m_%_of_raw")
					b.ReportMetric(100*float64(b1Bytes)/float64(rawBytes), "1h_%_of_raw")
					b.Logf("raw %d samples, %d series, %d bytes; 5m %d series, %d bytes (%d points); 1h %d bytes",
						samples, st.InSeries, rawBytes, st.OutSeries, b5Bytes, st.OutSamples, b1Bytes)
				}
			}
			b.ReportMetric(float64(st.InSamples)*float64(b.N)/busy.Seconds(), "raw_samples/s")
			b.ReportMetric(float64(peak)/(1<<20), "peak_heap_MiB")
		})
	}
}

// BenchmarkAggregatesFloor measures how small exact aggregates can be in
// the TSDB's XOR float encoding, against the raw block's bytes (index
// included) and beside what gpustore's downsampled blocks' chunk files hold
// for the same data: the simulator's DCGM series of BenchmarkDownsampleDCGM
// (2 nodes, 15 s, GPUSTORE_BENCH_DAYS days, default 1) folded over pod as the
// compactor does with -compact.downsample.fold-labels=pod; for each window of each series, a gauge's min,
// max and sum, a counter's last value only (less than exact rate at window
// edges needs), no count. Each aggregate is XOR-encoded in its own chunks of
// 120 points and the windows' timestamps are counted once per series (the
// other streams' timestamp bits, and with them each value's control bit and
// each chunk's first value, subtracted): a floor for these aggregates stored
// as TSDB float values (XOR-encoded, as the XOR and the float-histogram
// chunks both encode floats), before any index or series header.
//
//	go test ./pkg/downsample -run '^$' -bench AggregatesFloor -benchtime 1x
func BenchmarkAggregatesFloor(b *testing.B) {
	d := 24 * time.Hour
	if v, err := strconv.Atoi(os.Getenv("GPUSTORE_BENCH_DAYS")); err == nil && v > 0 {
		d *= time.Duration(v)
	}
	dir := b.TempDir()
	raw, _ := simBlock(b, filepath.Join(dir, "raw"), 2, d)
	rawBytes := float64(dirBytes(b, raw.Dir()))
	maxt := t0 + d.Milliseconds()

	// What gpustore's blocks hold: chunk files only, as the floor has no index.
	podFold, err := NewFold([]string{"pod"}, "DCGM_.+")
	if err != nil {
		b.Fatal(err)
	}
	id5, _, err := Downsample(context.Background(), []tsdb.BlockReader{raw}, Config{
		SourceResolution: ResRaw, Resolution: Res5m, Mint: t0, Maxt: maxt, Dir: filepath.Join(dir, "out"), Fold: podFold,
	})
	if err != nil {
		b.Fatal(err)
	}
	id1, _, err := Downsample(context.Background(), []tsdb.BlockReader{openBlock(b, filepath.Join(dir, "out", id5.String()))}, Config{
		SourceResolution: Res5m, Resolution: Res1h, Mint: t0, Maxt: maxt, Dir: filepath.Join(dir, "out"),
	})
	if err != nil {
		b.Fatal(err)
	}
	chunks5 := float64(dirBytes(b, filepath.Join(dir, "out", id5.String(), "chunks")))
	chunks1 := float64(dirBytes(b, filepath.Join(dir, "out", id1.String(), "chunks")))

	// The samples of each series folded over pod: one GPU's series across
	// the pods that used it, in time order.
	type sample struct {
		t int64
		v float64
	}
	folded := map[string][]sample{}
	counters := map[string]bool{}
	q, err := tsdb.NewBlockQuerier(raw, t0, maxt)
	if err != nil {
		b.Fatal(err)
	}
	defer q.Close()
	ss := q.Select(context.Background(), false, nil, labels.MustNewMatcher(labels.MatchRegexp, "__name__", ".+"))
	var it chunkenc.Iterator
	for ss.Next() {
		ls := ss.At().Labels()
		key := labels.NewBuilder(ls).Del("pod").Labels().String()
		counters[key] = Classify(ls.Get("__name__"), false, nil) == Counter
		it = ss.At().Iterator(it)
		for it.Next() == chunkenc.ValFloat {
			t, v := it.At()
			folded[key] = append(folded[key], sample{t, v})
		}
	}
	if err := ss.Err(); err != nil {
		b.Fatal(err)
	}
	for _, smp := range folded {
		slices.SortStableFunc(smp, func(a, b sample) int { return cmp.Compare(a.t, b.t) })
	}
	for b.Loop() {
		floor := map[int64]int{Res5m: 0, Res1h: 0}
		for key, smp := range folded {
			for res := range floor {
				streams := 3 // min, max, sum
				if counters[key] {
					streams = 1 // last
				}
				var ts []int64
				vals := make([][]float64, streams)
				var agg [3]float64 // min, max, sum; or last
				flush := func() {
					for i := range vals {
						vals[i] = append(vals[i], agg[i])
					}
				}
				for i, s := range smp {
					end := (s.t + res - 1) / res * res // windows (end-res, end]
					if i > 0 && end != ts[len(ts)-1] {
						flush()
					}
					if i == 0 || end != ts[len(ts)-1] {
						ts, agg = append(ts, end), [3]float64{s.v, s.v, 0}
					}
					if counters[key] {
						agg[0] = s.v
						continue
					}
					agg[0], agg[1], agg[2] = min(agg[0], s.v), max(agg[1], s.v), agg[2]+s.v
				}
				if len(smp) > 0 {
					flush()
				}
				timestamps := xorBytes(ts, make([]float64, len(ts))) // constant values: a bit per point
				floor[res] += timestamps
				for _, v := range vals {
					floor[res] += xorBytes(ts, v) - timestamps
				}
			}
		}
		b.ReportMetric(100*float64(floor[Res5m])/rawBytes, "5m_floor_%_of_raw")
		b.ReportMetric(100*float64(floor[Res1h])/rawBytes, "1h_floor_%_of_raw")
		b.ReportMetric(100*chunks5/rawBytes, "5m_chunks_%_of_raw")
		b.ReportMetric(100*chunks1/rawBytes, "1h_chunks_%_of_raw")
	}
}

// xorBytes is the size of ts and vs in XOR chunks of 120 samples.
func xorBytes(ts []int64, vs []float64) int {
	n := 0
	for i := 0; i < len(ts); i += 120 {
		c := chunkenc.NewXORChunk()
		app, _ := c.Appender()
		for j := i; j < min(i+120, len(ts)); j++ {
			app.Append(0, ts[j], vs[j])
		}
		n += len(c.Bytes())
	}
	return n
}
