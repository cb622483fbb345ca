package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang/snappy"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/prompb"
)

// Shuffle sharding end to end (issue 41 item 3): six receivers at RF 3,
// each small enough (ingest.max_inflight_bytes) that a tenant flooding it
// makes it answer 503.
const (
	shuffleReceivers = 6
	shuffleLookback  = 8 * time.Second
	// Every receiver holds at most this much of the remote-write bodies in
	// progress (the least ingest allows: one largest request).
	shuffleMaxRequest = 64 << 10
	shuffleMaxDecoded = 256 << 10
	// Both tenants send requests of 1000 dcgm-exporter series (a
	// Prometheus sends up to 2000 samples a request): about 240 KiB
	// decoded, 27 KiB compressed. A receiver holds one whole such request
	// at a time, or two halves (without sharding a receiver takes about
	// RF/6 of each request's series).
	shuffleSeries = 1000
	// The quiet tenant's writes during each flood, 100 ms apart: without
	// sharding 4 to 14 of 30 failed in each of eight runs, so 50 make a
	// run without a failure (the test showing nothing) unlikely.
	shuffleQuietWrites = 50
)

// TestRingShuffleSharding: a noisy tenant floods the ring with writes (a
// dozen writers at once, as fast as the distributor answers) until its
// receivers refuse bodies past their in-flight bound with 503.
//
//   - Without shuffle sharding (ingestion_shard_size 0) every tenant is on
//     every receiver, and a quiet tenant's writes fail beside the flood.
//   - With a shard of 3 for each, on receivers the ring gives them apart
//     (which receivers hold a tenant's data is read from the receivers:
//     exactly 3 for every sharded tenant), the quiet tenant's writes are
//     all acknowledged during the flood and its queries answer exact
//     counts; the noisy tenant's reads ask only its shard's receivers
//     (their remote-read counters on /metrics).
//   - The noisy tenant's shard grows to 5 and shrinks back to 3 at run time
//     (the overrides file reloaded): what it wrote while on 5 stays readable
//     (queriers read the receivers the shrink dropped within the lookback).
func TestRingShuffleSharding(t *testing.T) {
	start := time.Now()
	overrides := filepath.Join(t.TempDir(), "overrides.yaml")
	setShards := func(sizes map[string]int) {
		t.Helper()
		var b strings.Builder
		b.WriteString("overrides:\n")
		for _, tenant := range slices.Sorted(func(yield func(string) bool) {
			for k := range sizes {
				if !yield(k) {
					return
				}
			}
		}) {
			fmt.Fprintf(&b, "  %s:\n    ingestion_shard_size: %d\n", tenant, sizes[tenant])
		}
		mustWrite(t, overrides+".tmp", b.String())
		if err := os.Rename(overrides+".tmp", overrides); err != nil {
			t.Fatal(err)
		}
	}
	setShards(nil)
	c := startRingWith(t, shuffleReceivers,
		"-limits.overrides-file="+overrides, "-limits.overrides-reload-period=100ms",
		"-ring.shuffle-sharding-lookback="+shuffleLookback.String(),
		fmt.Sprintf("receiver:-ingest.max-request-bytes=%d", shuffleMaxRequest),
		fmt.Sprintf("receiver:-ingest.max-decoded-bytes=%d", shuffleMaxDecoded),
		fmt.Sprintf("receiver:-ingest.max-inflight-bytes=%d", shuffleMaxRequest+shuffleMaxDecoded),
	)
	front := c.front.url()
	t.Logf("ring of %d receivers up in %s", shuffleReceivers, time.Since(start).Round(time.Millisecond))

	// Without shuffle sharding: the quiet tenant's writes fail beside the
	// flood.
	quiet := &shuffleWriter{url: front, tenant: "quiet-0", metric: "quiet_gpu_util", series: shuffleSeries, pause: 100 * time.Millisecond}
	stop := flood(t, front, "noisy-0")
	failedWithout := quiet.writeN(t, shuffleQuietWrites)
	floodWrites := stop()
	t.Logf("without shuffle sharding: %d of %d quiet writes failed beside %s", failedWithout, shuffleQuietWrites, floodWrites)
	if failedWithout == 0 {
		t.Errorf("without shuffle sharding every quiet write succeeded beside the flood (%s): the flood does not reach the quiet tenant's receivers, the test shows nothing", floodWrites)
	}

	// Shards of 3: pick a noisy and a quiet tenant the ring puts apart.
	candidates := []string{"team-a", "team-b", "team-c", "team-d", "team-e", "team-f", "team-g", "team-h"}
	sizes := map[string]int{}
	for _, tenant := range append(candidates, "shard-probe") {
		sizes[tenant] = 3
	}
	setShards(sizes)
	sharded := time.Now()
	waitShard(t, c, "shard-probe", 3) // the front reloaded the file
	holders := map[string][]string{}
	for _, tenant := range candidates {
		if failed := (&shuffleWriter{url: front, tenant: tenant, metric: "probe", series: 30}).writeN(t, 1); failed > 0 {
			t.Fatalf("probe write of %s failed", tenant)
		}
		// The third replica's send may finish after the answer.
		waitFor(t, 5*time.Second, tenant+" on its shard of 3", func() error {
			h, err := tenantHolders(c, tenant)
			if err != nil {
				return err
			}
			if len(h) != 3 {
				return fmt.Errorf("%s's data is on receivers %v, want 3 (its shard)", tenant, h)
			}
			holders[tenant] = h
			return nil
		})
	}
	noisy, quietT, overlap := "", "", 4
	for i, a := range candidates {
		for _, b := range candidates[i+1:] {
			n := 0
			for _, id := range holders[a] {
				if slices.Contains(holders[b], id) {
					n++
				}
			}
			if n < overlap {
				noisy, quietT, overlap = a, b, n
			}
		}
	}
	t.Logf("shards: %v; noisy %s on %v, quiet %s on %v (%d in common)", holders, noisy, holders[noisy], quietT, holders[quietT], overlap)
	if overlap > 1 {
		t.Fatalf("no two of %d tenants' shards of 3 share at most 1 of %d receivers: %v", len(candidates), shuffleReceivers, holders)
	}

	// The flood again, from the noisy tenant: the quiet one's writes all
	// succeed and its queries count every sample.
	quiet = &shuffleWriter{url: front, tenant: quietT, metric: "quiet_gpu_util", series: shuffleSeries, pause: 100 * time.Millisecond}
	stop = flood(t, front, noisy)
	failedWith := quiet.writeN(t, shuffleQuietWrites)
	floodWrites = stop()
	t.Logf("with shuffle sharding: %d of %d quiet writes failed beside %s", failedWith, shuffleQuietWrites, floodWrites)
	if failedWith > 0 {
		t.Errorf("with shuffle sharding %d of the quiet tenant's %d writes failed beside the noisy tenant's flood (%s): %q", failedWith, shuffleQuietWrites, floodWrites, quiet.failures[:min(3, len(quiet.failures))])
	}
	if !strings.Contains(floodWrites, "503") {
		t.Errorf("the noisy tenant's flood never tripped its receivers' in-flight bound (%s): the test shows nothing", floodWrites)
	}
	quiet.checkCounts(t, "quiet tenant after the flood")

	// The noisy tenant's reads ask its shard alone, once the ring and the
	// change to a shard are older than the lookback.
	noisyW := &shuffleWriter{url: front, tenant: noisy, metric: "noisy_gpu_util", series: 20}
	if failed := noisyW.writeN(t, 5); failed > 0 {
		t.Fatalf("%d of the noisy tenant's 5 writes failed once its flood stopped", failed)
	}
	if wait := time.Until(sharded.Add(shuffleLookback + time.Second)); wait > 0 {
		time.Sleep(wait)
	}
	before := receiverReads(t, c)
	noisyW.checkCounts(t, "noisy tenant")
	after := receiverReads(t, c)
	var read []string
	for id, n := range after {
		if n > before[id] {
			read = append(read, id)
		}
	}
	slices.Sort(read)
	t.Logf("the noisy tenant's queries read receivers %v", read)
	if len(read) == 0 {
		t.Error("the noisy tenant's queries read no receiver")
	}
	for _, id := range read {
		if !slices.Contains(holders[noisy], id) {
			t.Errorf("the noisy tenant's queries read receiver %s, outside its shard %v", id, holders[noisy])
		}
	}

	// Its shard grows to 5, then shrinks back to 3 at run time: what it
	// wrote on 5 receivers stays readable.
	grow := &shuffleWriter{url: front, tenant: noisy, metric: "noisy_on_five", series: 200}
	sizes[noisy] = 5
	setShards(sizes)
	waitShard(t, c, noisy, 5)
	if failed := grow.writeN(t, 5); failed > 0 {
		t.Fatalf("%d of 5 writes on the shard of 5 failed", failed)
	}
	sizes[noisy] = 3
	setShards(sizes)
	waitShard(t, c, noisy, 3)
	grow.checkCounts(t, "written on 5 receivers, read after the shard shrank to 3")
	noisyW.checkCounts(t, "written on 3, read after growing to 5 and back")
	t.Logf("took %s", time.Since(start).Round(time.Millisecond))
}

// flood writes as fast as the front answers from 12 writers at once, each
// request shuffleSeries new series of the tenant (a new job's pods), until the returned stop is called;
// stop reports the answers by status.
func flood(t *testing.T, front, tenant string) (stop func() string) {
	t.Helper()
	ts := time.Now().UnixMilli()
	var jobs atomic.Int64
	var (
		done   atomic.Bool
		wg     sync.WaitGroup
		mtx    sync.Mutex
		status = map[string]int{}
	)
	client := &http.Client{Timeout: 30 * time.Second}
	for range 12 {
		wg.Go(func() {
			for !done.Load() {
				// Every request is a new job's pods: new series, the
				// churn that costs receivers most.
				body := dcgmJobRequest(t, "DCGM_FI_DEV_FB_USED", shuffleSeries, ts, jobs.Add(1))
				code := "error"
				if resp, err := shufflePost(client, front, tenant, body); err == nil {
					code = fmt.Sprint(resp)
				}
				mtx.Lock()
				status[code]++
				mtx.Unlock()
			}
		})
	}
	time.Sleep(500 * time.Millisecond) // the receivers are full by then
	return func() string {
		done.Store(true)
		wg.Wait()
		return fmt.Sprintf("flood answers by status: %v", status)
	}
}

// dcgmRequest is a snappy-compressed remote write 1.0 request of n series
// of the metric as dcgm-exporter labels them behind a Kubernetes scrape,
// one sample each at ts.
func dcgmRequest(t *testing.T, metric string, n int, ts int64) []byte {
	return dcgmJobRequest(t, metric, n, ts, 0)
}

// dcgmJobRequest is dcgmRequest for the pods of job (each job's pods are
// new series).
func dcgmJobRequest(t *testing.T, metric string, n int, ts int64, job int64) []byte {
	t.Helper()
	req := &prompb.WriteRequest{}
	for i := range n {
		req.Timeseries = append(req.Timeseries, prompb.TimeSeries{
			Labels: []prompb.Label{
				{Name: "__name__", Value: metric}, {Name: "Hostname", Value: fmt.Sprintf("node-%04d", i/8)},
				{Name: "UUID", Value: fmt.Sprintf("GPU-%08x-0000-0000-0000-%012x", i, i*7919)}, {Name: "gpu", Value: fmt.Sprint(i % 8)},
				{Name: "modelName", Value: "NVIDIA H100 80GB HBM3"}, {Name: "pod", Value: fmt.Sprintf("train-%d-%d-worker-%d", job, i/64, i%64)},
				{Name: "namespace", Value: "gpu-jobs"}, {Name: "job", Value: "dcgm-exporter"},
			},
			Samples: []prompb.Sample{{Timestamp: ts, Value: float64(i)}},
		})
	}
	raw, err := req.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return snappy.Encode(nil, raw)
}

// shufflePost sends a snappy-compressed remote write 1.0 body as tenant and
// returns the status.
func shufflePost(client *http.Client, front, tenant string, body []byte) (int, error) {
	code, _, err := shufflePostMsg(client, front, tenant, body)
	return code, err
}

// shufflePostMsg is shufflePost with the answer's body.
func shufflePostMsg(client *http.Client, front, tenant string, body []byte) (int, string, error) {
	hreq, _ := http.NewRequest(http.MethodPost, front+"/api/v1/write", bytes.NewReader(body))
	hreq.Header.Set("Content-Type", "application/x-protobuf")
	hreq.Header.Set("Content-Encoding", "snappy")
	hreq.Header.Set("X-Prometheus-Remote-Write-Version", "0.1.0")
	hreq.Header.Set("X-Scope-OrgID", tenant)
	resp, err := client.Do(hreq)
	if err != nil {
		return 0, "", err
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	resp.Body.Close()
	return resp.StatusCode, strings.TrimSpace(string(msg)), nil
}

// shuffleWriter writes series of one metric for a tenant, one sample per
// series and request, a second apart, and remembers what was acknowledged.
type shuffleWriter struct {
	url, tenant, metric string
	series              int
	pause               time.Duration // between requests
	acked               []int64       // timestamps (ms) acknowledged
	failures            []string      // the answers of failed writes
}

// writeN sends n requests, each at the time it is sent (the heads of
// receivers take only recent samples), and returns how many failed (not
// 2xx).
func (w *shuffleWriter) writeN(t *testing.T, n int) int {
	t.Helper()
	failed := 0
	client := &http.Client{Timeout: 30 * time.Second}
	for k := range n {
		if k > 0 {
			time.Sleep(max(w.pause, time.Millisecond))
		}
		ts := time.Now().UnixMilli()
		code, msg, err := shufflePostMsg(client, w.url, w.tenant, dcgmRequest(t, w.metric, w.series, ts))
		if err != nil || code/100 != 2 {
			failed++
			w.failures = append(w.failures, fmt.Sprintf("%d %v %.300s", code, err, msg))
			continue
		}
		w.acked = append(w.acked, ts)
	}
	return failed
}

// checkCounts queries the tenant's samples of the metric, acknowledged
// or not: every series must have exactly the acknowledged samples.
func (w *shuffleWriter) checkCounts(t *testing.T, when string) {
	t.Helper()
	if len(w.acked) == 0 {
		t.Errorf("%s: nothing of %s acknowledged to check", when, w.tenant)
		return
	}
	first, last := slices.Min(w.acked), slices.Max(w.acked)
	at := time.UnixMilli(last)
	window := time.Duration(last-first)*time.Millisecond + time.Second
	expr := fmt.Sprintf("count_over_time(%s[%dms])", w.metric, window.Milliseconds())
	u := w.url + "/api/v1/query?" + url.Values{"query": {expr}, "time": {fmt.Sprintf("%.3f", float64(at.UnixMilli())/1000)}}.Encode()
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	req.Header.Set("X-Scope-OrgID", w.tenant)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", when, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result model.Vector `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &r); err != nil || r.Status != "success" {
		t.Fatalf("%s: %s: %d %.300s (%v)", when, expr, resp.StatusCode, b, err)
	}
	if len(r.Data.Result) != w.series {
		t.Errorf("%s: %s of %s answered %d series, want %d", when, expr, w.tenant, len(r.Data.Result), w.series)
	}
	for _, s := range r.Data.Result {
		if int(s.Value) != len(w.acked) {
			t.Errorf("%s: %s of %s: %v has %v samples, want the %d acknowledged", when, expr, w.tenant, s.Metric, s.Value, len(w.acked))
		}
	}
}

// waitShard waits until the front writes the tenant to a shard of size
// receivers (it reloaded the overrides file): a fresh metric's 60 series
// land on that many.
func waitShard(t *testing.T, c *ringCluster, tenant string, size int) {
	t.Helper()
	waitFor(t, 10*time.Second, fmt.Sprintf("%s written to %d receivers", tenant, size), func() error {
		metric := fmt.Sprintf("probe_%d", time.Now().UnixNano())
		if failed := (&shuffleWriter{url: c.front.url(), tenant: tenant, metric: metric, series: 60}).writeN(t, 1); failed > 0 {
			return fmt.Errorf("probe write failed")
		}
		n, err := metricHolders(c, tenant, metric)
		if err != nil {
			return err
		}
		if n != size {
			return fmt.Errorf("%s on %d receivers", metric, n)
		}
		return nil
	})
}

// tenantHolders lists the receivers that hold data of the tenant (their
// /receiver/tenants), sorted.
func tenantHolders(c *ringCluster, tenant string) ([]string, error) {
	var out []string
	for _, r := range c.receivers {
		resp, err := http.Get(r.url() + "/receiver/tenants")
		if err != nil {
			return nil, err
		}
		var a struct {
			Tenants []string `json:"tenants"`
		}
		err = json.NewDecoder(resp.Body).Decode(&a)
		resp.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("%s /receiver/tenants: %v", r.id, err)
		}
		if slices.Contains(a.Tenants, tenant) {
			out = append(out, r.id)
		}
	}
	slices.Sort(out)
	return out, nil
}

// metricHolders counts the receivers holding series of the tenant's metric
// (remote read of each receiver's /receiver/read).
func metricHolders(c *ringCluster, tenant, metric string) (int, error) {
	n := 0
	now := time.Now()
	for _, r := range c.receivers {
		q := &prompb.Query{
			StartTimestampMs: now.Add(-time.Hour).UnixMilli(), EndTimestampMs: now.Add(time.Hour).UnixMilli(),
			Matchers: []*prompb.LabelMatcher{{Type: prompb.LabelMatcher_EQ, Name: "__name__", Value: metric}},
		}
		raw, err := (&prompb.ReadRequest{Queries: []*prompb.Query{q}}).Marshal()
		if err != nil {
			return 0, err
		}
		req, _ := http.NewRequest(http.MethodPost, r.url()+"/receiver/read", bytes.NewReader(snappy.Encode(nil, raw)))
		req.Header.Set("Content-Encoding", "snappy")
		req.Header.Set("Content-Type", "application/x-protobuf")
		req.Header.Set("X-Prometheus-Remote-Read-Version", "0.1.0")
		req.Header.Set("X-Scope-OrgID", tenant)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("%s remote read: %d %.200s", r.id, resp.StatusCode, b)
		}
		dec, err := snappy.Decode(nil, b)
		if err != nil {
			return 0, err
		}
		var rr prompb.ReadResponse
		if err := rr.Unmarshal(dec); err != nil {
			return 0, err
		}
		if len(rr.Results) > 0 && len(rr.Results[0].Timeseries) > 0 {
			n++
		}
	}
	return n, nil
}

// receiverReads are the remote reads each receiver served so far (its
// read handler's gate-wait histogram counts one per read).
func receiverReads(t *testing.T, c *ringCluster) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	for _, r := range c.receivers {
		resp, err := http.Get(r.url() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		mfs, err := parser.TextToMetricFamilies(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("%s /metrics: %v", r.id, err)
		}
		const name = "gpustore_receiver_prometheus_remote_read_handler_gate_wait_duration_seconds"
		mf, ok := mfs[name]
		if !ok {
			t.Fatalf("%s /metrics has no %s", r.id, name)
		}
		for _, m := range mf.GetMetric() {
			out[r.id] += m.GetHistogram().GetSampleCount()
		}
	}
	return out
}
