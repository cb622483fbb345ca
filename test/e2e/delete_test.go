package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/thanos-io/objstore"

	"github.com/gpustore/gpustore/pkg/app"
	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/compact"
	"github.com/gpustore/gpustore/pkg/downsample"
	"github.com/gpustore/gpustore/pkg/storage/bucket"
	"github.com/gpustore/gpustore/pkg/storage/bucketindex"
)

// Prometheus' delete_series on a gpustore whose tenant holds 30 h of DCGM
// history in a real S3 bucket (versitygw), raw and downsampled to 5m and
// 1h, and recent samples in its head: the deleted node's series leave
// every answer at once (raw, 5m and 1h reads, the head, a range query the
// results cache holds), the others stay; the compactor then rewrites the
// bucket's blocks without them, the old blocks are deleted, and no block
// left in the bucket names the node; a block of the deleted hours shipped
// late is hidden and rewritten too; later passes bring nothing back.
func TestDeleteSeriesEverywhere(t *testing.T) {
	s3 := startS3(t)
	ctx := context.Background()
	const tenant = "default"
	h := makeHistory(time.Now().Add(-48 * time.Hour))
	bkt, err := bucket.New(s3.bucketConfig(), t.TempDir(), slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer bkt.Close()
	const twoHours = 2 * 3600_000
	for from := h.start / twoHours * twoHours; from < h.end; from += twoHours {
		writeReceiverBlock(t, bkt, tenant, h, from, from+twoHours)
	}

	a, base := startGpustore(t, func(c *app.Config) {
		withBucket(s3)(c)
		// The head keeps the recent samples for the whole test.
		c.TSDB.BlockDuration = model.Duration(2 * time.Hour)
		c.TSDB.Retention = model.Duration(24 * time.Hour)
		c.Query.EnableAdminAPI = true
		c.Compact.Interval = model.Duration(time.Hour) // passes run when the test says
		c.Compact.BlockRanges = compact.DurationList{model.Duration(2 * time.Hour), model.Duration(8 * time.Hour), model.Duration(24 * time.Hour)}
		c.Compact.LeaseSettle = model.Duration(100 * time.Millisecond)
		c.Compact.DeleteDelay = 0
	})
	for range 3 { // merged and downsampled to 5m and 1h
		if err := a.Compactor.CompactAll(ctx); err != nil {
			t.Fatal(err)
		}
	}
	perRes := liveBlocks(t, bkt, tenant)
	if perRes[downsample.Res5m] == 0 || perRes[downsample.Res1h] == 0 {
		t.Fatalf("live blocks per resolution %v, want 5m and 1h blocks", perRes)
	}
	now := time.Now().UnixMilli() / 15_000 * 15_000
	newWriter(t, base, now-10*60_000).write(now)
	if err := a.BucketStore.Sync(ctx); err != nil {
		t.Fatal(err)
	}

	// What the answers hold: node-1's series and node-0's, at every
	// resolution the history is read at, and in the head.
	hist := func(sel string) string { return "DCGM_FI_DEV_GPU_UTIL" + sel }
	type read struct {
		name, expr, res string
		start, end      int64
		step            time.Duration
	}
	reads := []read{
		{"raw", hist(`{Hostname="%s"}`), "raw", h.start, h.end - 1, 5 * time.Minute},
		{"5m", "max_over_time(" + hist(`{Hostname="%s"}`) + "[1h])", "5m", h.start + 3600_000, h.end - 1, time.Hour},
		{"1h", "max_over_time(" + hist(`{Hostname="%s"}`) + "[3h])", "1h", h.start + 3*3600_000, h.end - 1, 3 * time.Hour},
		{"head", `DCGM_FI_DEV_GPU_TEMP{Hostname="%s"}`, "raw", now - 10*60_000, now - 15_000, 15 * time.Second},
		// Three whole days before today: split by day and cached.
		{"cached", hist(`{Hostname="%s"}`), "", (h.end/86400_000 - 2) * 86400_000, (h.end/86400_000+1)*86400_000 - 1, 10 * time.Minute},
	}
	want := map[string]map[string]int{
		"node-0": {"raw": 2, "5m": 2, "1h": 2, "head": 8, "cached": 2},
		"node-1": {"raw": 2, "5m": 2, "1h": 2, "head": 8, "cached": 2},
	}
	check := func(stage string, want map[string]map[string]int) {
		t.Helper()
		for _, r := range reads {
			for _, node := range []string{"node-0", "node-1"} {
				m := rangeQuery(t, base, fmt.Sprintf(r.expr, node), r.res, r.start, r.end, r.step)
				if got := len(m); got != want[node][r.name] {
					t.Errorf("%s: %s read of %s: %d series, want %d: %v", stage, r.name, node, got, want[node][r.name], m)
				}
				for _, s := range m {
					if len(s.Values) == 0 {
						t.Errorf("%s: %s read of %s: series %s without samples", stage, r.name, node, s.Metric)
					}
				}
			}
		}
	}
	check("before", want)
	check("before, again (from the results cache)", want)

	// Not a deletion: refused, nothing changes.
	for _, bad := range []url.Values{{}, {"match[]": {"{"}}, {"match[]": {`{Hostname="node-1"}`}, "start": {"2"}, "end": {"1"}}} {
		if code := deleteSeries(t, base, http.MethodPost, bad); code != http.StatusBadRequest {
			t.Errorf("delete_series %v: %d, want 400", bad, code)
		}
	}
	if code := deleteSeries(t, base, http.MethodGet, url.Values{"match[]": {`{Hostname="node-1"}`}}); code != http.StatusMethodNotAllowed {
		t.Errorf("delete_series by GET: %d, want 405", code)
	}
	check("after refused deletions", want)

	if code := deleteSeries(t, base, http.MethodPost, url.Values{"match[]": {`{Hostname="node-1"}`}}); code != http.StatusNoContent {
		t.Fatalf("delete_series: %d, want 204", code)
	}
	gone := map[string]map[string]int{"node-0": want["node-0"], "node-1": {}}
	check("deleted", gone)

	// Part of a series' range: two hours of node-0's GPU 0 (both ends
	// included, as Prometheus' tombstones), RFC 3339 times, within one UTC
	// day with an hour each side (reads across a midnight of compacted
	// blocks have a bug of their own: see the report of issue 40).
	const gpu0 = `DCGM_FI_DEV_GPU_UTIL{Hostname="node-0", gpu="0"}`
	midnight := h.end / 86400_000 * 86400_000
	from := midnight + 3*3600_000
	if h.end-midnight < 9*3600_000 {
		from = midnight - 7*3600_000
	}
	from += ((h.start-from)%30_000 + 30_000) % 30_000 // on the samples' 30 s grid
	to := from + 2*3600_000
	if code := deleteSeries(t, base, http.MethodPost, url.Values{"match[]": {gpu0},
		"start": {time.UnixMilli(from).UTC().Format(time.RFC3339Nano)}, "end": {time.UnixMilli(to).UTC().Format(time.RFC3339Nano)}}); code != http.StatusNoContent {
		t.Fatalf("delete_series of a range: %d, want 204", code)
	}
	// The raw samples of the series around the range, read as a matrix
	// (no range function: what the store holds, sample by sample).
	partial := func(stage string) {
		t.Helper()
		q := url.Values{"query": {gpu0 + "[4h]"}, "time": {secs(to + 3600_000)}}
		resp, err := http.Get(base + "/api/v1/query?" + q.Encode())
		if err != nil {
			t.Fatal(err)
		}
		var r struct {
			Data struct {
				Result model.Matrix `json:"result"`
			} `json:"data"`
		}
		err = json.NewDecoder(resp.Body).Decode(&r)
		resp.Body.Close()
		if err != nil || len(r.Data.Result) != 1 {
			t.Fatalf("%s: %v %v", stage, err, r.Data.Result)
		}
		var in, before, after int
		for _, p := range r.Data.Result[0].Values {
			switch ms := int64(p.Timestamp); {
			case ms < from:
				before++
			case ms <= to:
				in++
			default:
				after++
			}
		}
		// (to-3h, to+1h]: 1h before the range, 2h in it (both ends), 1h after.
		if in != 0 || before != 119 || after != 120 {
			t.Errorf("%s: samples of node-0's GPU 0 before, in and after the deleted range: %d, %d, %d; want 119, 0, 120", stage, before, in, after)
		}
	}
	partial("range deleted")
	gpu0Matchers := []*labels.Matcher{labels.MustNewMatcher(labels.MatchEqual, "Hostname", "node-0"), labels.MustNewMatcher(labels.MatchEqual, "gpu", "0")}
	if n := storedSamples(t, bkt, tenant, from, to, gpu0Matchers...); n == 0 {
		t.Errorf("before compaction, the bucket's blocks hold no sample of node-0's GPU 0 in the deleted range: nothing to remove")
	}

	// The compactor rewrites the blocks (and deletes the old ones at its
	// next pass: no delete delay here).
	for range 2 {
		if err := a.Compactor.CompactAll(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.BucketStore.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	check("compacted", gone)
	partial("range deleted, compacted")
	if n := storedSamples(t, bkt, tenant, from, to, gpu0Matchers...); n != 0 {
		t.Errorf("after compaction, the bucket's live blocks hold %d samples of node-0's GPU 0 in the deleted range", n)
	}
	names := blocksNaming(t, bkt, tenant, "node-1")
	if len(names) > 0 {
		t.Errorf("after compaction, blocks in the bucket still name node-1: %v", names)
	}
	if others := blocksNaming(t, bkt, tenant, "node-0"); len(others) == 0 {
		t.Errorf("after compaction no block names node-0: the deletion took too much")
	}
	if perRes := liveBlocks(t, bkt, tenant); perRes[downsample.Res5m] == 0 || perRes[downsample.Res1h] == 0 {
		t.Errorf("after the rewrite: live blocks per resolution %v, want 5m and 1h blocks still", perRes)
	}

	// A receiver that did not take the request (or cut its block before
	// it) ships a block of the deleted hours after the compactor's cutoff:
	// hidden at once, removed by the next passes, which bring nothing back.
	writeReceiverBlock(t, bkt, tenant, h, h.start/twoHours*twoHours+2*twoHours, h.start/twoHours*twoHours+3*twoHours)
	if err := a.BucketStore.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	check("a late block", gone)
	for range 2 {
		if err := a.Compactor.CompactAll(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.BucketStore.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	check("compacted again", gone)
	partial("range deleted, compacted again")
	if names := blocksNaming(t, bkt, tenant, "node-1"); len(names) > 0 {
		t.Errorf("after the late block's compaction, blocks in the bucket still name node-1: %v", names)
	}
}

// deleteSeries calls delete_series and returns the status code.
func deleteSeries(t *testing.T, base, method string, form url.Values) int {
	t.Helper()
	req, _ := http.NewRequest(method, base+"/api/v1/admin/tsdb/delete_series?"+form.Encode(), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// rangeQuery runs a range query at a resolution ("": the default).
func rangeQuery(t *testing.T, base, expr, res string, start, end int64, step time.Duration) model.Matrix {
	t.Helper()
	q := url.Values{"query": {expr}, "start": {secs(start)}, "end": {secs(end)}, "step": {fmt.Sprint(step.Seconds())}}
	if res != "" {
		q.Set("max_source_resolution", res)
	}
	resp, err := http.Get(base + "/api/v1/query_range?" + q.Encode())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result model.Matrix `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatal(err)
	}
	if r.Status != "success" {
		t.Fatalf("query_range %s (%s): %s", expr, res, r.Error)
	}
	return r.Data.Result
}

// liveBlocks counts the tenant's blocks not marked for deletion, by resolution.
func liveBlocks(t *testing.T, bkt objstore.Bucket, tenant string) map[int64]int {
	t.Helper()
	x, err := bucketindex.Update(context.Background(), bkt, tenant, nil)
	if err != nil {
		t.Fatal(err)
	}
	del := x.DeletionMarkMap()
	out := map[int64]int{}
	for _, m := range x.Blocks {
		if del[m.ULID] == nil {
			out[m.GPUStore.Downsample.Resolution]++
		}
	}
	return out
}

// blocksNaming lists the blocks in the bucket (every one with a meta.json,
// marked or not) whose index holds value as a symbol: a label value of
// one of its series.
func blocksNaming(t *testing.T, bkt objstore.Bucket, tenant, value string) []string {
	t.Helper()
	ctx := context.Background()
	var ids []ulid.ULID
	err := bkt.Iter(ctx, tenant+"/", func(name string) error {
		if id, err := ulid.ParseStrict(strings.TrimSuffix(strings.TrimPrefix(name, tenant+"/"), "/")); err == nil {
			ids = append(ids, id)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, id := range ids {
		m, err := block.ReadMeta(ctx, bkt, tenant, id)
		if err != nil {
			t.Fatalf("block %s: %v", id, err)
		}
		dir := filepath.Join(t.TempDir(), id.String())
		if err := block.Download(ctx, bkt, m, dir, fmt.Errorf("unreadable")); err != nil {
			t.Fatal(err)
		}
		b, err := tsdb.OpenBlock(nil, dir, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		ir, err := b.Index()
		if err != nil {
			t.Fatal(err)
		}
		for it := ir.Symbols(); it.Next(); {
			if it.At() == value {
				out = append(out, fmt.Sprintf("%s (res %d)", id, m.GPUStore.Downsample.Resolution))
				break
			}
		}
		ir.Close()
		b.Close()
	}
	return out
}

// storedSamples counts the samples (raw or aggregates) in [from, to] of
// the series matching ms in the tenant's live blocks of every resolution.
func storedSamples(t *testing.T, bkt objstore.Bucket, tenant string, from, to int64, ms ...*labels.Matcher) int {
	t.Helper()
	ctx := context.Background()
	x, err := bucketindex.Update(ctx, bkt, tenant, nil)
	if err != nil {
		t.Fatal(err)
	}
	del := x.DeletionMarkMap()
	n := 0
	for _, m := range x.Blocks {
		if del[m.ULID] != nil || m.MaxTime <= from || m.MinTime > to {
			continue
		}
		dir := filepath.Join(t.TempDir(), m.ULID.String())
		if err := block.Download(ctx, bkt, m, dir, fmt.Errorf("unreadable")); err != nil {
			t.Fatal(err)
		}
		b, err := tsdb.OpenBlock(nil, dir, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		q, err := tsdb.NewBlockQuerier(b, from, to)
		if err != nil {
			t.Fatal(err)
		}
		ss := q.Select(ctx, false, nil, ms...)
		var it chunkenc.Iterator
		for ss.Next() {
			it = ss.At().Iterator(it)
			for it.Next() != chunkenc.ValNone {
				if ts := it.AtT(); ts >= from && ts <= to {
					n++
				}
			}
		}
		if err := ss.Err(); err != nil {
			t.Fatal(err)
		}
		q.Close()
		b.Close()
	}
	return n
}
