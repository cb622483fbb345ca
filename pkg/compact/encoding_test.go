package compact_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/prometheus/common/model"
	"github.com/thanos-io/objstore"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/downsample"
)

// TestEncodedDownsampledBlocksAnswerAlike: the same three days compacted and
// downsampled twice in one bucket, once with the 5m and 1h files stored as
// the TSDB writes them (as every block written before the encoding was) and
// once zstd-encoded without the TSDB's CRCs, answer the dashboard panels and the
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
		cfg.DownsampleEncoding, cfg.RawEncoding, cfg.RawIndexEncoding = enc, enc, enc
		c, _ := newCompactor(t, cfg, bkt, nil)
		st := compactUntilStable(t, c, bkt, tenant)
		blocks, bytes := byResolution(st)
		sizes[tenant] = bytes
		if len(blocks[downsample.Res5m]) == 0 || len(blocks[downsample.Res1h]) == 0 {
			t.Fatalf("%s: no 5m or 1h blocks: %s", tenant, st.spans())
		}
		for _, m := range st.live {
			want := block.EncodingNone
			if tenant == encoded && (m.GPUStore.Downsample.Resolution != block.ResolutionRaw || m.Compaction.Level >= 2) {
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

// TestEncodedRawBlocksAnswerAlike: the same days of GPU data shipped as 2h
// blocks for two tenants and compacted, once with -compact.raw-encoding=none
// (every raw block as the TSDB writes it), once with
// zstd-nocrc and once with zstd-columns: the compacted raw blocks (8h and
// larger) are stored zstd-encoded without the TSDB's CRCs in under 60 % of
// the bytes (zstd-columns: its chunks as columns, in fewer bytes than
// zstd-nocrc's; its index as zstd-nocrc's), the shipped 2h blocks
// stay as they are, and every answer over raw data is the same bit for bit:
// the dashboard panels, every raw sample of random selectors (instant
// queries of range vectors), and range queries at random starts, ranges
// and steps. A plain zstd decoder decodes each encoded object (the seek
// table is a skippable frame) and gpustore's decoder gives back the TSDB's
// file byte for byte, as the plain tenant stores it.
func TestEncodedRawBlocksAnswerAlike(t *testing.T) {
	store := startStore(t)
	bkt := openBucket(t, store)
	sl := downsampleSlice()
	sl.Duration = 3*day + 4*time.Hour // two 2h blocks of an 8h range not yet whole stay level 1
	if raceEnabled {
		sl.Interval = time.Minute
	}
	dirs := sl.write(t, t.TempDir())
	const plain, encoded, columns = "plain", "encoded", "columns"
	live := map[string][]*block.Meta{}
	sizes := map[string]int64{}
	for tenant, enc := range map[string]string{plain: "none", encoded: block.EncodingZstdNoCRC, columns: block.EncodingZstdColumns} {
		upload(t, bkt, tenant, nil, dirs...)
		cfg := testConfig()
		cfg.RawEncoding = enc
		if enc == block.EncodingZstdNoCRC {
			cfg.RawIndexEncoding = enc // zstd-columns keeps the default: the index plain
		}
		c, _ := newCompactor(t, cfg, bkt, nil)
		st := compactUntilStable(t, c, bkt, tenant)
		live[tenant] = st.live
		levels := map[int]int{}
		for _, m := range st.live {
			levels[m.Compaction.Level]++
			for _, f := range m.GPUStore.Files {
				want := block.EncodingNone
				switch {
				case m.Compaction.Level < 2 || tenant == plain:
				case tenant == columns && f.RelPath != block.IndexFilename:
					want = block.EncodingZstdColumns
				case tenant == columns: // the index, plain
				default:
					want = block.EncodingZstdNoCRC
				}
				if f.Encoding != want {
					t.Errorf("%s: level %d block %s file %s has encoding %q, want %q", tenant, m.Compaction.Level, m.ULID, f.RelPath, f.Encoding, want)
				}
			}
			if m.Compaction.Level >= 2 {
				sizes[tenant] += m.BucketBytes()
			}
		}
		if levels[1] == 0 || len(levels) < 3 {
			t.Fatalf("%s: want shipped 2h blocks and compacted ones of two levels at least, got blocks by level %v: %s", tenant, levels, st.spans())
		}
	}
	t.Logf("compacted raw blocks: plain %d bytes, zstd-nocrc %d (%.1f %%), zstd-columns %d (%.1f %%)", sizes[plain], sizes[encoded],
		100*float64(sizes[encoded])/float64(sizes[plain]), sizes[columns], 100*float64(sizes[columns])/float64(sizes[plain]))
	if sizes[encoded]*10 >= sizes[plain]*6 {
		t.Errorf("encoded compacted raw blocks take %d bytes, plain ones %d: want under 60 %%", sizes[encoded], sizes[plain])
	}
	if sizes[columns] >= sizes[encoded] {
		t.Errorf("zstd-columns compacted raw blocks take %d bytes, zstd-nocrc ones %d: want fewer", sizes[columns], sizes[encoded])
	}
	checkDecodesToTSDBFiles(t, bkt, live[plain], live[encoded])
	checkDecodesToTSDBFiles(t, bkt, live[plain], live[columns])
	for _, tenant := range []string{encoded, columns} {
		t.Run(tenant, func(t *testing.T) { rawAnswersAlike(t, store, sl, plain, tenant) })
	}
}

// rawAnswersAlike compares the answers of the tenants plain and encoded
// holding the same data: the dashboard panels, every raw sample of random
// selectors and range queries at random starts, ranges and steps.
func rawAnswersAlike(t *testing.T, store testStore, sl simSlice, plain, encoded string) {

	qa, qurl := startQuery(t, store.bucket())
	if err := qa.BucketStore.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	start, end := sl.Start, sl.Start.Add(sl.Duration)
	compareAnswers(t, "dashboard panels, encoded against plain", answers(t, qa, qurl, plain, start.Add(time.Hour), end, "gpu-node-001"), answers(t, qa, qurl, encoded, start.Add(time.Hour), end, "gpu-node-001"))

	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	t.Logf("seed %d", seed)
	selectors := []string{
		`DCGM_FI_DEV_GPU_UTIL`, `DCGM_FI_DEV_POWER_USAGE{gpu="3"}`, `{__name__=~"DCGM_FI_DEV_.*", gpu=~"[0-3]"}`,
		`node_cpu_seconds_total{mode="idle"}`, `node_network_transmit_bytes_total`, `{__name__=~"DCGM_FI_PROF_.+|DCGM_FI_DEV_XID_ERRORS"}`,
		`DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`, `{__name__=~"node_memory_.+"}`,
	}
	funcs := []string{"%s", "rate(%s[5m])", "max_over_time(%s[17m])", "avg by (gpu) (%s)", "sum(increase(%s[1h]))", "quantile_over_time(0.9, %s[10m])"}
	span := end.Sub(start)
	points := 0
	for i := 0; i < 24; i++ {
		sel := selectors[rng.IntN(len(selectors))]
		// Every raw sample of a random window (up to 6h, crossing block edges).
		at := start.Add(time.Duration(rng.Int64N(int64(span)))).Truncate(time.Second)
		w := time.Duration(1+rng.IntN(360)) * time.Minute
		q := fmt.Sprintf("%s[%s]", sel, model.Duration(w))
		p, e := instantBody(t, qurl, plain, q, at), instantBody(t, qurl, encoded, q, at)
		if p != e {
			t.Errorf("%s at %s: encoded answer differs from plain: %s", q, at, firstDifference(p, e))
		}
		if !strings.Contains(p, `"values"`) && !strings.Contains(p, `"result":[]`) {
			t.Errorf("%s at %s: unexpected answer %.200s", q, at, p)
		}
		// A range query at a random start, range and step.
		fs := funcs
		if strings.Contains(sel, "__name__") { // functions drop the name: no duplicate label sets
			fs = []string{"%s", "count by (__name__) (%s)", "max by (__name__, gpu) (%s)"}
		}
		expr := fmt.Sprintf(fs[rng.IntN(len(fs))], sel)
		qs := start.Add(time.Duration(rng.Int64N(int64(span)))).Truncate(time.Second)
		qe := qs.Add(time.Duration(10+rng.IntN(48*60)) * time.Minute)
		step := time.Duration(15+rng.IntN(900)) * time.Second
		want, _ := queryRange(t, qurl, plain, expr, qs, qe, step, "raw")
		got, _ := queryRange(t, qurl, encoded, expr, qs, qe, step, "raw")
		if len(want) != len(got) {
			t.Errorf("%s [%s, %s] step %s: %d series from encoded blocks, %d from plain", expr, qs, qe, step, len(got), len(want))
		}
		for k, ws := range want {
			gs := got[k]
			points += len(ws)
			for ts, wv := range ws {
				if gv, ok := gs[ts]; !ok || math.Float64bits(gv) != math.Float64bits(wv) {
					t.Errorf("%s step %s: %s at %s: plain %v, encoded %v (present %v)", expr, step, k, time.Unix(ts, 0).UTC(), wv, gv, ok)
					break
				}
			}
			if len(gs) != len(ws) {
				t.Errorf("%s step %s: %s: %d points encoded, %d plain", expr, step, k, len(gs), len(ws))
			}
		}
	}
	if points == 0 {
		t.Fatal("the random range queries answered nothing: the comparison proves nothing")
	}
	t.Logf("%d points of random range queries compared", points)
}

// checkDecodesToTSDBFiles: each encoded file of the encoded tenant's
// compacted blocks decodes with a plain zstd decoder (to the TSDB's file
// without its CRCs: as long, less four bytes per entry; zstd-columns
// segments to their column form) and, through
// block.DownloadFile, to the very file the plain tenant's block of the same
// sources stores.
func checkDecodesToTSDBFiles(t *testing.T, bkt objstore.Bucket, plain, encoded []*block.Meta) {
	t.Helper()
	ctx := context.Background()
	bySpan := map[[2]int64]*block.Meta{}
	for _, m := range plain {
		bySpan[[2]int64{m.MinTime, m.MaxTime}] = m
	}
	dec, err := zstd.NewReader(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	checked := 0
	for _, m := range encoded {
		p := bySpan[[2]int64{m.MinTime, m.MaxTime}]
		if m.Compaction.Level < 2 || p == nil {
			continue
		}
		for _, f := range m.GPUStore.Files {
			obj := readObject(t, bkt, block.ObjectName(m.GPUStore.Tenant, m.ULID, f.ObjectRel()))
			want := readObject(t, bkt, block.ObjectName(p.GPUStore.Tenant, p.ULID, f.RelPath))
			if f.Encoding != block.EncodingNone { // a zstd-columns block's index is plain
				stripped, err := dec.DecodeAll(obj, nil)
				if err != nil {
					t.Fatalf("%s of %s: a plain zstd decoder fails: %v", f.RelPath, m.ULID, err)
				}
				// zstd-columns: the column form, of no length to check.
				if f.Encoding != block.EncodingZstdColumns && (len(stripped) >= len(want) || (len(want)-len(stripped))%4 != 0) {
					t.Errorf("%s of %s: plain zstd decoding gives %d bytes of the TSDB file's %d", f.RelPath, m.ULID, len(stripped), len(want))
				}
			}
			dst := filepath.Join(t.TempDir(), "file")
			if err := block.DownloadFile(ctx, bkt, block.ObjectName(m.GPUStore.Tenant, m.ULID, f.ObjectRel()), dst, f, errors.New("bad")); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(dst)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s of %s: decoded file (%d bytes) differs from the plain block's (%d)", f.RelPath, m.ULID, len(got), len(want))
			}
			checked++
		}
	}
	if checked == 0 {
		t.Fatal("no encoded file checked against its plain twin")
	}
}

func readObject(t *testing.T, bkt objstore.Bucket, name string) []byte {
	t.Helper()
	rc, err := bkt.Get(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// instantBody is the body of an instant query's answer.
func instantBody(t *testing.T, base, tenant, q string, at time.Time) string {
	t.Helper()
	form := url.Values{"query": {q}, "time": {strconv.FormatInt(at.Unix(), 10)}, "max_source_resolution": {"raw"}}
	req, _ := http.NewRequest(http.MethodPost, base+"/api/v1/query", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("X-Scope-OrgID", tenant)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %d %s", q, resp.StatusCode, body)
	}
	return string(body)
}

func firstDifference(a, b string) string {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	lo := max(i-80, 0)
	return fmt.Sprintf("at byte %d: plain …%.160s… encoded …%.160s…", i, a[lo:], b[lo:])
}
