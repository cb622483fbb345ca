package compact_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/common/model"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/downsample"
)

// TestEncodedDownsampledBlocksAnswerAlike: the same three days compacted and
// downsampled twice in one bucket, once with the 5m and 1h files stored as
// the TSDB writes them (as every block written before the encoding was) and
// once zstd-encoded without the TSDB's CRCs (the default), answer the dashboard panels and the
// downsampling checks at 5m and 1h bit for bit alike, once raw retention has
// deleted the raw blocks (so only downsampled blocks answer); the compactor
// reads its own encoded 5m blocks back to make the 1h ones; and the encoded
// blocks take under half the plain ones' bytes (a fifth on this slice).
func TestEncodedDownsampledBlocksAnswerAlike(t *testing.T) {
	store := startStore(t)
	bkt := openBucket(t, store)
	sl := downsampleSlice()
	dirs := sl.write(t, t.TempDir())
	const plain, encoded = "plain", "zstd"
	sizes := map[string]map[int64]int64{}
	for tenant, enc := range map[string]string{plain: "none", encoded: block.EncodingZstdNoCRC} {
		upload(t, bkt, tenant, nil, dirs...)
		cfg := testConfig()
		cfg.Downsample = true
		cfg.RetentionRaw = model.Duration(day) // the slice is months old
		cfg.DownsampleEncoding = enc
		c, _ := newCompactor(t, cfg, bkt, nil)
		st := compactUntilStable(t, c, bkt, tenant)
		blocks, bytes := byResolution(st)
		sizes[tenant] = bytes
		if len(blocks[downsample.Res5m]) == 0 || len(blocks[downsample.Res1h]) == 0 {
			t.Fatalf("%s: no 5m or 1h blocks: %s", tenant, st.spans())
		}
		for _, m := range st.live {
			want := block.EncodingNone
			if tenant == encoded && m.GPUStore.Downsample.Resolution != block.ResolutionRaw {
				want = block.EncodingZstdNoCRC // not zstd: the CRCs are left out
			}
			for _, f := range m.GPUStore.Files {
				if f.Encoding != want {
					t.Errorf("%s: %s block %s file %s has encoding %q, want %q", tenant,
						downsample.ResolutionName(m.GPUStore.Downsample.Resolution), m.ULID, f.RelPath, f.Encoding, want)
				}
			}
		}
	}
	for _, r := range []int64{downsample.Res5m, downsample.Res1h} {
		p, e := sizes[plain][r], sizes[encoded][r]
		t.Logf("%s: plain %d bytes, zstd %d (%.1f %%)", downsample.ResolutionName(r), p, e, 100*float64(e)/float64(p))
		if 2*e >= p {
			t.Errorf("%s: zstd-encoded blocks take %d bytes, plain ones %d: want under half", downsample.ResolutionName(r), e, p)
		}
	}

	qa, qurl := startQuery(t, store.bucket())
	if err := qa.BucketStore.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	start, end := sl.Start.Add(time.Hour), sl.Start.Add(2*day)
	compareAnswers(t, "dashboard panels, zstd against plain", answers(t, qa, qurl, plain, start, end, "gpu-node-001"), answers(t, qa, qurl, encoded, start, end, "gpu-node-001"))
	exact := func(string, int64) float64 { return 0 }
	for _, r := range []string{"5m", "1h"} {
		for _, ch := range downsampleChecks(r) {
			want, _ := queryRange(t, qurl, plain, ch.q, start, end, time.Hour, r)
			got, _ := queryRange(t, qurl, encoded, ch.q, start, end, time.Hour, r)
			compareSeries(t, r+" "+ch.q, want, got, exact)
			if len(got) != len(want) {
				t.Errorf("%s %s: %d series from zstd blocks, %d from plain ones", r, ch.q, len(got), len(want))
			}
		}
	}
}
