package compact_test

import (
	"context"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"

	"github.com/gpustore/gpustore/pkg/block"
)

// counterBlocks writes n 2h blocks from start of a counter of two GPUs, as
// dcgm-exporter scrapes it every 15s: cumulative, with a reset (a driver
// reload) now and then, off the 5m grid.
func counterBlocks(t *testing.T, dir, name string, start time.Time, n int) []string {
	t.Helper()
	rng := rand.New(rand.NewPCG(29, 4))
	v := []float64{1e6, 3e6}
	return twoHourBlocks(t, dir, start, n, func(app storage.Appender, from int64) {
		for g := range v {
			ls := labels.FromStrings(model.MetricNameLabel, name, "gpu", strconv.Itoa(g), "Hostname", "node-1")
			for ts := from; ts < from+2*3_600_000; ts += 15_000 {
				v[g] += 1000 * rng.ExpFloat64()
				if rng.IntN(400) == 0 {
					v[g] = 1000 * rng.Float64()
				}
				if _, err := app.Append(0, ls, ts, v[g]); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
}

// TestCountersTypedByShippedMetadata: a counter whose name does not say so
// (dcgm-exporter types DCGM_FI_DEV_PCIE_TX_THROUGHPUT a counter in its
// counters.csv) is downsampled as a counter when its blocks carry the
// tenant's metadata, as the shipper uploads it beside them; the compactor,
// which sees only the bucket, reads it there, keeps it through compaction
// (2h blocks compacted to 8h before they are downsampled), and increase,
// rate and resets over 5m data then equal raw. Without the metadata the
// name decides (a gauge).
func TestCountersTypedByShippedMetadata(t *testing.T) {
	const metric = "DCGM_FI_DEV_PCIE_TX_THROUGHPUT"
	store := startStore(t)
	bkt := openBucket(t, store)
	start := time.UnixMilli(1_767_225_600_000).UTC()
	for _, m := range upload(t, bkt, "typed", nil, counterBlocks(t, t.TempDir(), metric, start, 5)...) {
		if err := block.WriteTypes(context.Background(), bkt, "typed", m.ULID, block.Types{metric: model.MetricTypeCounter}); err != nil {
			t.Fatal(err)
		}
	}
	qa, qurl := startQuery(t, store.bucket())
	if err := qa.BucketStore.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	from, to := start.Add(time.Hour), start.Add(7*time.Hour+50*time.Minute) // within the 5m block
	checks := []downsampleCheck{
		{"increase(" + metric + "[5m])", "", 1e-6, metric},
		{"rate(" + metric + "[5m])", "", 1e-6, metric},
		{"resets(" + metric + "[5m])", "", 0, ""},
	}
	raw := map[string]seriesPoints{}
	rawAnswers(t, qurl, "typed", raw, "5m", checks, from, to, 35*time.Minute)

	cfg := testConfig()
	cfg.Downsample = true
	c, _ := newCompactor(t, cfg, bkt, nil)
	st := compactUntilStable(t, c, bkt, "typed")
	blocks, _ := byResolution(st)
	if len(blocks[5*60_000]) == 0 {
		t.Fatalf("no 5m block: %s", st.spans())
	}
	for _, m := range blocks[block.ResolutionRaw] {
		if len(m.Compaction.Sources) > 1 {
			if got, err := block.ReadTypes(context.Background(), bkt, "typed", m.ULID); err != nil || got[metric] != model.MetricTypeCounter {
				t.Errorf("compacted block %s: types %v (err %v), want its sources' (%s: counter)", m.ULID, got, err, metric)
			}
		}
	}
	if err := qa.BucketStore.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	compareChecks(t, "typed by metadata", qurl, "typed", raw, "5m", checks, from, to, 35*time.Minute, 15*time.Second, "5m")
}
