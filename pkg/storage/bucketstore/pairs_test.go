package bucketstore

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/thanos-io/objstore"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/downsample"
	"github.com/gpustore/gpustore/pkg/readopts"
)

// A downsampled counter's kept samples are stored two per point, at the
// second's time (downsample's pairs.go). A range that ends between the two
// samples, a segment's end, or a step window that holds a chunk's first
// sample but not its first point still reads the first sample: a counter
// function answers at a step the same whether the query ends there or goes
// on, and sparse reads answer as whole ones.
func TestDownsampledCounterPairsAtRangeEnds(t *testing.T) {
	const hour = int64(time.Hour / time.Millisecond)
	dir := t.TempDir()
	w, err := tsdb.NewBlockWriter(slog.New(slog.DiscardHandler), dir, 12*hour)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	app := w.Appender(ctx)
	for i := range 8 {
		ls := labels.FromStrings("__name__", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "gpu", fmt.Sprint(i))
		v := 0.0
		for ts := int64(i)*1_777 + 1; ts < 12*hour; ts += 15_000 {
			v += float64((ts/1000+int64(i)*31)%97) + 0.25
			if (ts/15_000)%(311+int64(i)) == 0 {
				v = 1 // a reset
			}
			if _, err := app.Append(0, ls, ts, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := app.Commit(); err != nil {
		t.Fatal(err)
	}
	id, err := w.Flush(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	raw, err := tsdb.OpenBlock(nil, filepath.Join(dir, id.String()), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	id5, _, err := downsample.Downsample(ctx, []tsdb.BlockReader{raw}, downsample.Config{SourceResolution: downsample.ResRaw,
		Resolution: downsample.Res5m, Mint: 0, Maxt: 12 * hour, Dir: filepath.Join(dir, "5m")})
	if err != nil {
		t.Fatal(err)
	}
	d5 := filepath.Join(dir, "5m", id5.String())
	bm, err := block.ReadLocalMeta(d5)
	if err != nil {
		t.Fatal(err)
	}
	bkt := objstore.NewInMemBucket()
	if err := block.Upload(ctx, bkt, d5, block.Meta{BlockMeta: bm, GPUStore: block.GPUStoreMeta{Version: block.MetaVersion,
		Tenant: "team-a", Source: downsample.Source, Downsample: block.Downsample{Resolution: downsample.Res5m}}}); err != nil {
		t.Fatal(err)
	}
	// Where gpu 0's second chunk of pairs starts: the window of its first point.
	b5, err := tsdb.OpenBlock(nil, d5, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b5.Close()
	ir, err := b5.Index()
	if err != nil {
		t.Fatal(err)
	}
	defer ir.Close()
	p, err := tsdb.PostingsForMatchers(ctx, ir, labels.MustNewMatcher(labels.MatchEqual, "gpu", "0"),
		labels.MustNewMatcher(labels.MatchEqual, downsample.AggrLabel, downsample.AggrPairs))
	if err != nil || !p.Next() {
		t.Fatalf("no pairs series for gpu 0: %v", err)
	}
	var sb labels.ScratchBuilder
	var chks []chunks.Meta
	if err := ir.Series(p.At(), &sb, &chks); err != nil || len(chks) < 2 {
		t.Fatalf("pairs of gpu 0: %d chunks, %v", len(chks), err)
	}
	second := chks[1].MinTime / downsample.Res5m * downsample.Res5m
	s := newTestStore(t, bkt, 4<<10, 64<<20)
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 10_000_000, Timeout: time.Minute})
	run := func(ctx context.Context, q string, start, end, step int64) map[int64]string {
		out := map[int64]string{} // per step, every series' value
		for _, sr := range rangeMatrix(t, engine, s, ctx, q, start, end, step) {
			for _, p := range sr.Floats {
				out[p.T] += fmt.Sprintf("%s=%x ", sr.Metric, math.Float64bits(p.F))
			}
		}
		return out
	}
	o := readopts.Default()
	o.MaxSourceResolution = downsample.Res5m
	at5m := readopts.NewContext(ctx, o)
	o.AtSteps = true
	sparse := readopts.NewContext(ctx, o)
	for _, c := range []struct {
		q          string
		start, end int64
		step       int64
	}{
		{"increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5m])", 30 * 60_000, 11 * hour, 7*60_000 + 13_000},
		{"resets(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[10m])", 30 * 60_000, 11 * hour, 13*60_000 + 7_000},
		// Each 1-minute window holds the first sample of a 5m window's pair
		// and not its point; one is where gpu 0's second chunk starts, which
		// no other window meets: a sparse read must still read the chunk.
		{"max_over_time(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[1m])", second + 30_000 - 3*hour, 12 * hour, 3 * hour},
		{"max_over_time(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[1m])", 30_000, 11 * hour, 5 * 60_000},
	} {
		long := run(at5m, c.q, c.start, c.end, c.step)
		if len(long) == 0 {
			t.Fatalf("%s: no answer", c.q)
		}
		if got := run(sparse, c.q, c.start, c.end, c.step); fmt.Sprint(got) != fmt.Sprint(long) {
			t.Errorf("%s: sparse reads answer differently", c.q)
		}
		for end := c.start; end < c.end; end += 3 * c.step { // on the steps' grid: the last step is the range's end
			short := run(at5m, c.q, c.start, end, c.step)
			for ts, want := range long {
				if ts <= end && short[ts] != want {
					t.Errorf("%s ending at %s: at %s\n got %s\nwant %s", c.q, time.UnixMilli(end).UTC().Format(time.TimeOnly),
						time.UnixMilli(ts).UTC().Format(time.TimeOnly), strings.TrimSpace(short[ts]), strings.TrimSpace(want))
				}
			}
		}
	}
}
