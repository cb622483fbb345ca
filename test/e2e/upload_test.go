package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/thanos-io/objstore"
	"gopkg.in/yaml.v3"

	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"

	"github.com/gpustore/gpustore/internal/testbin"
	"github.com/gpustore/gpustore/pkg/app"
	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/compact"
	"github.com/gpustore/gpustore/pkg/downsample"
	"github.com/gpustore/gpustore/pkg/storage/bucket"
	"github.com/gpustore/gpustore/pkg/storage/bucketindex"
)

// history is 30 h of a small DCGM fleet at 30 s, ending `end`: gauges of
// four GPUs (two hosts), a MIG instance's, and an energy counter with a
// reset, written as OpenMetrics for promtool.
type history struct {
	start, end int64 // ms; end exclusive
	om         []byte
}

func makeHistory(end time.Time) history {
	// Off every block boundary: the first and last blocks hold part of
	// their range, and a day boundary falls inside one of promtool's 18h
	// blocks.
	h := history{end: end.Truncate(time.Hour).Add(-23*time.Minute - 30*time.Second).UnixMilli()}
	h.start = h.end - 30*3600_000
	r := rand.New(rand.NewPCG(7, 40))
	var b bytes.Buffer
	var gpus []string
	for i := range 4 {
		gpus = append(gpus, fmt.Sprintf(`gpu="%d",UUID="GPU-%08x",Hostname="node-%d",modelName="NVIDIA H100 80GB HBM3",pod="train-%d"`, i%2*4, r.Uint32(), i/2, i%3))
	}
	mig := `gpu="0",UUID="GPU-mig",Hostname="node-9",GPU_I_PROFILE="1g.10gb",GPU_I_ID="3",modelName="NVIDIA A100-SXM4-80GB"`
	gauge := func(name string, sets []string, f func(i int, k int) float64) {
		fmt.Fprintf(&b, "# TYPE %s gauge\n", name)
		for i, l := range sets {
			k := 0
			for t := h.start; t < h.end; t += 30_000 {
				fmt.Fprintf(&b, "%s{%s} %g %s\n", name, l, f(i, k), secs(t))
				k++
			}
		}
	}
	gauge("DCGM_FI_DEV_GPU_UTIL", append(gpus, mig), func(i, k int) float64 { return float64((k*7+i*13)%100) + math.Round(r.Float64()*10)/10 })
	gauge("DCGM_FI_DEV_GPU_TEMP", gpus, func(i, k int) float64 { return float64(40 + (k/20+i)%35) })
	fmt.Fprintf(&b, "# TYPE gpu_energy_joules counter\n")
	for i, l := range gpus {
		v := float64(i * 1000)
		for t := h.start; t < h.end; t += 30_000 {
			v += 300 + float64(r.IntN(200))
			if t == h.start+20*3600_000+int64(i)*600_000 {
				v = 17 // an exporter restart
			}
			fmt.Fprintf(&b, "gpu_energy_joules_total{%s} %g %s\n", l, v, secs(t))
		}
	}
	b.WriteString("# EOF\n")
	h.om = b.Bytes()
	return h
}

func secs(ms int64) string { return fmt.Sprintf("%d.%03d", ms/1000, ms%1000) }

// promtoolBlocks writes the history as blocks with the real promtool.
func promtoolBlocks(t *testing.T, h history, maxBlock string) string {
	t.Helper()
	dir := t.TempDir()
	in := filepath.Join(dir, "history.om")
	if err := os.WriteFile(in, h.om, 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "blocks")
	args := []string{"tsdb", "create-blocks-from", "openmetrics"}
	if maxBlock != "" {
		args = append(args, "--max-block-duration="+maxBlock)
	}
	cmd := exec.Command(testbin.Need(t, "promtool"), append(args, in, out)...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool %v: %v\n%s", args, err, b)
	}
	return out
}

// runTool runs the gpustore binary's tools and returns its output and exit code.
func runTool(t *testing.T, bin string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"tools"}, args...)...)
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), code
}

// TestUploadPrometheusHistory: a real Prometheus' blocks (a snapshot of a
// Prometheus that loaded promtool's blocks of a DCGM history and compacted
// them itself), and promtool's own 18 h blocks, go into two tenants' S3
// bucket with `gpustore tools bucket upload-blocks`, while gpustore runs.
// gpustore answers range and instant queries over them exactly as the
// Prometheus that holds them, before and after its compactor merged them
// (vertically with a receiver's block overlapping part of the history,
// whose own series stays) and downsampled them. Running the upload again
// uploads nothing; a block that does not read is refused with the reason.
func TestUploadPrometheusHistory(t *testing.T) {
	promBin := testbin.Need(t, "prometheus")
	s3 := startS3(t)
	bin := buildGpustore(t)
	h := makeHistory(time.Now().Add(-48 * time.Hour))

	// The Prometheus that wrote the blocks: it loads promtool's 2h blocks
	// and compacts them with its own planner; its snapshot is what is
	// uploaded for tenant "snap".
	pdir := t.TempDir()
	if err := os.CopyFS(filepath.Join(pdir, "data"), os.DirFS(promtoolBlocks(t, h, ""))); err != nil {
		t.Fatal(err)
	}
	// Whether it has compacted what it loaded by the snapshot or not, both
	// are its blocks: the snapshot is taken as soon as it is ready.
	promURL, stopProm := startPrometheusProc(t, promBin, pdir, "global: {}\n", "--storage.tsdb.retention.time=10y", "--web.enable-admin-api")
	resp, err := http.Post(promURL+"/api/v1/admin/tsdb/snapshot", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	var snap struct {
		Data struct{ Name string } `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&snap); err != nil || snap.Data.Name == "" {
		t.Fatalf("snapshot: %v %+v", err, snap)
	}
	resp.Body.Close()
	snapDir := filepath.Join(pdir, "data", "snapshots", snap.Data.Name)

	// The tenant "snap" already holds a receiver's block over hours 10-14 of
	// the history: the same samples of two GPUs' utilisation, and a series
	// of its own.
	bkt, err := bucket.New(s3.bucketConfig(), t.TempDir(), slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	overlapFrom, overlapTo := h.start+10*3600_000, h.start+14*3600_000
	writeReceiverBlock(t, bkt, "snap", h, overlapFrom, overlapTo)
	// Both tenants' receivers went on after the history: its last blocks
	// are finished, so the compactor downsamples them.
	later := (h.end/(24*3600_000) + 1) * 24 * 3600_000
	for _, tenant := range []string{"snap", "promtool"} {
		writeReceiverBlock(t, bkt, tenant, h, later, later+2*3600_000)
	}

	cfgFile := filepath.Join(t.TempDir(), "objstore.yml")
	raw, _ := yaml.Marshal(map[string]any{"type": "S3", "config": s3.bucketConfig().Config})
	if err := os.WriteFile(cfgFile, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	a, gsURL := startGpustore(t, func(c *app.Config) {
		withBucket(s3)(c)
		c.Query.MaxSourceResolution = "raw" // compared with Prometheus: the raw samples
		c.Compact.Interval = model.Duration(time.Hour)
		c.Compact.BlockRanges = compact.DurationList{model.Duration(2 * time.Hour), model.Duration(8 * time.Hour), model.Duration(24 * time.Hour)}
		c.Compact.LeaseSettle = model.Duration(100 * time.Millisecond)
		c.Compact.DeleteDelay = 0
	})

	// A block that does not read is refused, and nothing is uploaded.
	bad := t.TempDir()
	if err := os.CopyFS(bad, os.DirFS(promtoolBlocks(t, h, ""))); err != nil {
		t.Fatal(err)
	}
	corruptOneChunkFile(t, bad)
	out, code := runTool(t, bin, "bucket", "upload-blocks", "--tenant=bad", "--objstore.config-file="+cfgFile, bad)
	if code != 1 || !strings.Contains(out, "refused") || !strings.Contains(out, "invalid block") {
		t.Fatalf("a corrupt block: exit %d, want 1 with the refusal:\n%s", code, out)
	}
	if x, err := bucketindex.Update(ctx, bkt, "bad", nil); err != nil || len(x.Blocks)+len(x.Partial) != 0 {
		t.Fatalf("tenant bad after a refusal: %v %+v, want nothing uploaded", err, x)
	}

	// Upload: the snapshot (Prometheus' blocks), and promtool's 18h blocks
	// cut at the 1d range of this compactor.
	start := time.Now()
	out, code = runTool(t, bin, "bucket", "upload-blocks", "--tenant=snap", "--objstore.config-file="+cfgFile, "--compact.block-ranges=2h,8h,1d", snapDir)
	if code != 0 {
		t.Fatalf("upload the snapshot: exit %d:\n%s", code, out)
	}
	t.Logf("upload of the snapshot took %s:\n%s", time.Since(start), out)
	out, code = runTool(t, bin, "bucket", "upload-blocks", "--tenant=promtool", "--objstore.config-file="+cfgFile, "--compact.block-ranges=2h,8h,1d", promtoolBlocks(t, h, "18h"))
	if code != 0 || !strings.Contains(out, "uploaded") {
		t.Fatalf("upload promtool's blocks: exit %d:\n%s", code, out)
	}
	for _, l := range strings.Split(out, "\n") { // every uploaded block lies within one day
		if strings.Contains(l, ": uploaded 01") {
			var from, to string
			if _, err := fmt.Sscanf(l[strings.Index(l, "[")+1:], "%s %s", &from, &to); err == nil {
				f, _ := time.Parse(time.RFC3339, strings.TrimSuffix(from, ","))
				u, _ := time.Parse(time.RFC3339, strings.TrimSuffix(to, ")"))
				if f.Truncate(24*time.Hour) != u.Add(-time.Millisecond).Truncate(24*time.Hour) {
					t.Errorf("block %s crosses a day: %s", l, out)
				}
			}
		}
	}

	prom := promClient(t, promURL)
	check := func(stage string) {
		t.Helper()
		for _, tenant := range []string{"snap", "promtool"} {
			gs := promClientTenant(t, gsURL, tenant)
			waitFor(t, 30*time.Second, tenant+"'s blocks in the bucket store", func() error {
				v, _, _, err := gs.Query(ctx, "count(DCGM_FI_DEV_GPU_UTIL)", time.UnixMilli(h.end-1))
				if err != nil || v.String() == "" {
					return fmt.Errorf("%v %v", v, err)
				}
				return nil
			})
			compareHistory(t, stage+"/"+tenant, prom, gs, h)
		}
		// The receiver's own series is never hidden by the upload.
		v := queryTenant(t, gsURL, "snap", "count_over_time(receiver_only_metric[1h])", time.UnixMilli(overlapTo-1))
		if len(v) != 1 || v[0].Value != 120 {
			t.Errorf("%s: the receiver's own series over its last hour: %v, want 120 samples", stage, v)
		}
	}
	check("uploaded")

	// Again: everything is in the bucket already.
	out, code = runTool(t, bin, "bucket", "upload-blocks", "--tenant=snap", "--objstore.config-file="+cfgFile, "--compact.block-ranges=2h,8h,1d", snapDir)
	if code != 0 || strings.Contains(out, ": uploaded ") || !strings.Contains(out, "in the bucket already") {
		t.Fatalf("a second upload: exit %d, want every block skipped:\n%s", code, out)
	}

	// The compactor merges the uploads with the receiver's block and their
	// neighbours, and downsamples them.
	for range 3 {
		if err := a.Compactor.CompactAll(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, tenant := range []string{"snap", "promtool"} {
		x, err := bucketindex.Update(ctx, bkt, tenant, nil)
		if err != nil {
			t.Fatal(err)
		}
		del := x.DeletionMarkMap()
		perRes := map[int64]int{}
		var rawRanges [][2]int64
		for _, m := range x.Blocks {
			if t.Failed() {
				t.Logf("%s %s %s res=%d level=%d sources=%d parents=%d del=%v source=%s", tenant, m.ULID, span(m.MinTime, m.MaxTime), m.GPUStore.Downsample.Resolution, m.Compaction.Level, len(m.Compaction.Sources), len(m.Compaction.Parents), del[m.ULID] != nil, m.GPUStore.Source)
			}
			if del[m.ULID] != nil {
				continue
			}
			perRes[m.GPUStore.Downsample.Resolution]++
			if m.GPUStore.Downsample.Resolution == block.ResolutionRaw {
				rawRanges = append(rawRanges, [2]int64{m.MinTime, m.MaxTime})
			}
		}
		if perRes[downsample.Res5m] == 0 || perRes[downsample.Res1h] == 0 {
			t.Errorf("tenant %s: live blocks per resolution %v, want 5m and 1h blocks", tenant, perRes)
		}
		for i, a := range rawRanges {
			for _, b := range rawRanges[i+1:] {
				if a[0] < b[1] && b[0] < a[1] {
					t.Errorf("tenant %s: live raw blocks %v and %v still overlap after compaction", tenant, a, b)
				}
			}
		}
		if perRes[block.ResolutionRaw] > 8 {
			t.Errorf("tenant %s: %d live raw blocks for 30 h at 2h,8h,1d ranges: not compacted with their neighbours", tenant, perRes[block.ResolutionRaw])
		}
	}
	// The query side reads what the compactor left once its bucket store
	// has listed the bucket again.
	if err := a.BucketStore.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	check("compacted")
	stopProm()
}

// compareHistory asks both the same queries over the history: range
// queries at random steps and starts, instant queries at random times.
func compareHistory(t *testing.T, stage string, prom, gs promv1.API, h history) {
	t.Helper()
	ctx := context.Background()
	r := rand.New(rand.NewPCG(uint64(len(stage)), 1))
	queries := []string{
		`DCGM_FI_DEV_GPU_UTIL`,
		`avg by (Hostname) (DCGM_FI_DEV_GPU_TEMP)`,
		`rate(gpu_energy_joules_total[5m])`,
		`increase(gpu_energy_joules_total[1h])`,
		`max_over_time(DCGM_FI_DEV_GPU_UTIL{GPU_I_PROFILE!=""}[10m])`,
		`count(DCGM_FI_DEV_GPU_UTIL) by (modelName)`,
	}
	for _, q := range queries {
		step := time.Duration(15+r.IntN(600)) * time.Second
		from := h.start - 3600_000 + r.Int64N(3600_000)
		rng := promv1.Range{Start: time.UnixMilli(from), End: time.UnixMilli(h.end + 600_000), Step: step}
		pv, _, _, err := prom.QueryRange(ctx, q, rng)
		if err != nil {
			t.Fatal(err)
		}
		gv, _, _, err := gs.QueryRange(ctx, q, rng)
		if err != nil {
			t.Fatalf("%s: %s: %v", stage, q, err)
		}
		if got, want := canonical(gv), canonical(pv); got != want || want == "" {
			t.Errorf("%s: range %s step %s: gpustore and Prometheus differ:\n%.2000s\nprometheus:\n%.2000s", stage, q, step, got, want)
		}
		at := time.UnixMilli(h.start + r.Int64N(h.end-h.start))
		pi, _, _, err := prom.Query(ctx, q, at)
		if err != nil {
			t.Fatal(err)
		}
		gi, _, _, err := gs.Query(ctx, q, at)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := canonical(gi), canonical(pi); got != want {
			t.Errorf("%s: instant %s at %s: gpustore and Prometheus differ:\n%s\nprometheus:\n%s", stage, q, at.UTC(), got, want)
		}
	}
}

// writeReceiverBlock puts into the tenant's bucket a block as a receiver
// ships it, over [from, to): the history's samples of GPU 0 and 4
// utilisation there, and a series of its own.
func writeReceiverBlock(t *testing.T, bkt objstore.Bucket, tenant string, h history, from, to int64) {
	t.Helper()
	dir := t.TempDir()
	w, err := tsdb.NewBlockWriter(slog.New(slog.DiscardHandler), dir, 2*(to-from)) // the head takes samples back to half its chunk range behind the newest: each series starts at from again
	if err != nil {
		t.Fatal(err)
	}
	app := w.Appender(context.Background())
	// The history's own samples, parsed back from the OpenMetrics text.
	for _, line := range strings.Split(string(h.om), "\n") {
		if !strings.HasPrefix(line, "DCGM_FI_DEV_GPU_UTIL{gpu=\"") || strings.Contains(line, "GPU_I_PROFILE") {
			continue
		}
		i := strings.LastIndex(line, "}")
		var v, ts float64
		if _, err := fmt.Sscanf(line[i+1:], "%g %g", &v, &ts); err != nil {
			t.Fatal(err)
		}
		ms := int64(math.Round(ts * 1000))
		if ms < from || ms >= to {
			continue
		}
		b := labels.NewScratchBuilder(8)
		b.Add("__name__", "DCGM_FI_DEV_GPU_UTIL")
		for _, kv := range strings.Split(line[strings.Index(line, "{")+1:i], `",`) {
			k, val, _ := strings.Cut(kv, `="`)
			b.Add(k, strings.TrimSuffix(val, `"`))
		}
		b.Sort()
		if _, err := app.Append(0, b.Labels(), ms, v); err != nil {
			t.Fatal(err)
		}
	}
	own := labels.FromStrings("__name__", "receiver_only_metric", "job", "receiver")
	for ms := from; ms < to; ms += 30_000 {
		if _, err := app.Append(0, own, ms, 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := app.Commit(); err != nil {
		t.Fatal(err)
	}
	id, err := w.Flush(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	d := filepath.Join(dir, id.String())
	bm, err := block.ReadLocalMeta(d)
	if err != nil {
		t.Fatal(err)
	}
	if err := block.Upload(context.Background(), bkt, d, block.Meta{BlockMeta: bm, GPUStore: block.GPUStoreMeta{
		Version: block.MetaVersion, Tenant: tenant, Labels: map[string]string{}, Source: block.SourceReceive}}); err != nil {
		t.Fatal(err)
	}
}

// corruptOneChunkFile flips bytes in the middle of the first chunk segment
// of the first block in dir.
func corruptOneChunkFile(t *testing.T, dir string) {
	t.Helper()
	segs, _ := filepath.Glob(filepath.Join(dir, "*", "chunks", "000001"))
	if len(segs) == 0 {
		t.Fatal("no chunk segment to corrupt")
	}
	b, err := os.ReadFile(segs[0])
	if err != nil {
		t.Fatal(err)
	}
	for i := len(b) / 2; i < len(b)/2+64 && i < len(b); i++ {
		b[i] ^= 0xff
	}
	if err := os.WriteFile(segs[0], b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func span(mint, maxt int64) string {
	return "[" + time.UnixMilli(mint).UTC().Format(time.RFC3339) + ", " + time.UnixMilli(maxt).UTC().Format(time.RFC3339) + ")"
}
