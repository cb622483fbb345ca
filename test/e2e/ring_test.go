package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/golang/snappy"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/prompb"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	"gopkg.in/yaml.v3"

	"github.com/gpustore/gpustore/bench/gpusim"
	"github.com/gpustore/gpustore/internal/testbin"
)

// Scale-out end to end (issue 15): the real gpustore binary as separate
// processes (receivers in the ring, a distributor+query process in front),
// gossiping by memberlist on loopback, shipping blocks to a real S3 server
// (versitygw). RF 3 over 4 receivers, so every series lives on 3 of them.

const (
	ringReceivers        = 4
	ringRF               = 3
	ringHeartbeatTimeout = 10 * time.Second
)

// TestRingReplicatedWrites: a real Prometheus scrapes simulated DCGM pages
// every second and remote-writes to the distributor. Every series is in the
// heads of exactly 3 of the 4 receivers (by their /metrics and by remote
// reading each one), every sample Prometheus stored is on at least a write
// quorum (2) of receivers, and the query process answers exactly what the
// scraping Prometheus answers: same series, same raw samples, same
// count_over_time and query_range results (nothing counted 3 times, nothing
// missing).
func TestRingReplicatedWrites(t *testing.T) {
	promBin := testbin.Need(t, "prometheus")
	c := startRing(t, ringReceivers)

	sim, err := gpusim.New(gpusim.Config{Name: "gpu-a", Nodes: 2, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	page := httptest.NewServer(gpusim.NewHandler(sim, gpusim.HandlerOptions{Pages: gpusim.PagesNode}))
	t.Cleanup(page.Close)
	// DCGM families only, without the pod labels that churn with jobs: the
	// series set stays fixed, so head series can be counted exactly.
	var b strings.Builder
	b.WriteString("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n")
	for _, h := range sim.Hostnames() {
		fmt.Fprintf(&b, "  - job_name: %s\n    metrics_path: /node/%s/metrics\n    static_configs:\n      - targets: [%q]\n", h, h, strings.TrimPrefix(page.URL, "http://"))
		b.WriteString("    metric_relabel_configs:\n      - source_labels: [__name__]\n        regex: DCGM_.*\n        action: keep\n      - regex: pod|namespace|container\n        action: labeldrop\n")
	}
	fmt.Fprintf(&b, "remote_write:\n  - url: %s/api/v1/write\n    queue_config:\n      batch_send_deadline: 500ms\n      max_samples_per_send: 2000\n      min_backoff: 100ms\n      max_backoff: 1s\n", c.front.url())
	b.WriteString("    metadata_config:\n      send_interval: 1s\n")
	promURL, _ := startPrometheusProc(t, promBin, t.TempDir(), b.String())
	promStarted := time.Now()

	// 20 s of scrapes, compared over a fixed past window (t0, t1] once
	// Prometheus has scraped for longer than that.
	const window = 20 * time.Second
	waitFor(t, 60*time.Second, "Prometheus scraping for 24 s", func() error {
		v, _, err := ringQuery(promURL, `min(count_over_time(up[25s]))`, time.Now())
		if err != nil {
			return err
		}
		if vec, ok := v.(model.Vector); !ok || len(vec) != 1 || vec[0].Value < 24 {
			return fmt.Errorf("min(count_over_time(up[25s])) = %v", v)
		}
		return nil
	})
	t1 := time.Now().Add(-2 * time.Second).Truncate(time.Second)
	t0 := t1.Add(-window)
	rawExpr := fmt.Sprintf(`{__name__=~".+"}[%ds]`, int(window.Seconds()))

	prom := func(expr string, ts time.Time) model.Value {
		t.Helper()
		v, ws, err := ringQuery(promURL, expr, ts)
		if err != nil {
			t.Fatalf("prometheus: %s: %v", expr, err)
		}
		if len(ws) > 0 {
			t.Fatalf("prometheus: %s: warnings %v", expr, ws)
		}
		return v
	}
	gs := func(expr string, ts time.Time) model.Value {
		t.Helper()
		v, ws, err := ringQuery(c.front.url(), expr, ts)
		if err != nil {
			t.Fatalf("gpustore: %s: %v", expr, err)
		}
		if len(ws) > 0 {
			t.Fatalf("gpustore: %s: warnings %v with every receiver up", expr, ws)
		}
		return v
	}

	// The window's raw samples: Prometheus' own is the reference. Remote
	// write lags by a batch, so wait until gpustore has caught up.
	want := prom(rawExpr, t1).(model.Matrix)
	if len(want) == 0 {
		t.Fatalf("Prometheus stored nothing in %s", rawExpr)
	}
	var wantSamples int
	for _, s := range want {
		wantSamples += len(s.Values)
		if len(s.Values) < int(window.Seconds())-1 {
			t.Fatalf("Prometheus has only %d samples of %s in %s of 1 s scrapes", len(s.Values), s.Metric, window)
		}
	}
	t.Logf("Prometheus: %d series, %d samples in (%s, %s]", len(want), wantSamples, t0.Format(time.TimeOnly), t1.Format(time.TimeOnly))
	var last string
	deadline := time.Now().Add(20 * time.Second)
	for {
		v, ws, err := ringQuery(c.front.url(), rawExpr, t1)
		if err == nil && len(ws) == 0 {
			if last = diffMatrix(want, v.(model.Matrix)); last == "" {
				break
			}
		} else {
			last = fmt.Sprintf("err %v, warnings %v", err, ws)
		}
		if time.Now().After(deadline) {
			t.Fatalf("raw samples of (%s, %s] from the query process differ from Prometheus' own after 20 s: %s",
				t0.Format(time.TimeOnly), t1.Format(time.TimeOnly), last)
		}
		time.Sleep(500 * time.Millisecond)
	}

	// (b) PromQL over the ring answers as Prometheus does.
	if p, g := prom(`count(DCGM_FI_DEV_GPU_TEMP)`, t1), gs(`count(DCGM_FI_DEV_GPU_TEMP)`, t1); canonical(p) != canonical(g) {
		t.Errorf("count(DCGM_FI_DEV_GPU_TEMP): gpustore %s, Prometheus %s", canonical(g), canonical(p))
	} else if v := p.(model.Vector); len(v) != 1 || v[0].Value != 16 {
		t.Errorf("count(DCGM_FI_DEV_GPU_TEMP) = %v, want 16 GPUs", v)
	}
	for _, expr := range []string{
		`count by (__name__) ({__name__=~".+"})`,
		fmt.Sprintf(`count_over_time(DCGM_FI_DEV_GPU_TEMP[%ds])`, int(window.Seconds())),
		fmt.Sprintf(`count_over_time(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[%ds])`, int(window.Seconds())),
		fmt.Sprintf(`count_over_time(up[%ds])`, int(window.Seconds())),
		fmt.Sprintf(`sum(count_over_time(DCGM_FI_DEV_POWER_USAGE[%ds]))`, int(window.Seconds())),
		fmt.Sprintf(`sum by (Hostname) (increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[%ds]))`, int(window.Seconds())),
	} {
		p, g := prom(expr, t1), gs(expr, t1)
		if cp, cg := canonical(p), canonical(g); cp != cg {
			t.Errorf("%s differs:\ngpustore:\n%.2000s\nPrometheus:\n%.2000s", expr, cg, cp)
		}
	}
	for _, expr := range []string{`DCGM_FI_DEV_GPU_TEMP`, `rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5s])`, `up`, `count_over_time(DCGM_FI_DEV_POWER_USAGE[5s])`} {
		p, err := ringQueryRange(promURL, expr, t0.Add(5*time.Second), t1, time.Second)
		if err != nil {
			t.Fatalf("prometheus: %v", err)
		}
		g, err := ringQueryRange(c.front.url(), expr, t0.Add(5*time.Second), t1, time.Second)
		if err != nil {
			t.Fatalf("gpustore: %v", err)
		}
		if d := diffMatrix(p, g); d != "" {
			t.Errorf("query_range %s differs from Prometheus': %s", expr, d)
		}
	}
	seriesWant, err := ringSeries(promURL, t0, t1)
	if err != nil {
		t.Fatal(err)
	}
	seriesGot, err := ringSeries(c.front.url(), t0, t1)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(seriesWant, seriesGot) {
		t.Errorf("/api/v1/series: gpustore has %d series, Prometheus %d", len(seriesGot), len(seriesWant))
	}
	// The query process holds no data: /api/v1/metadata comes from the
	// receivers, which the distributor sent Prometheus' metadata to.
	for _, fam := range []string{"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"} {
		want, err := ringMetadata(promURL, fam)
		if err != nil || want == "" {
			t.Fatalf("Prometheus' metadata of %s: %q, %v", fam, want, err)
		}
		waitFor(t, 10*time.Second, "the query process' metadata of "+fam, func() error {
			if got, err := ringMetadata(c.front.url(), fam); err != nil || got != want {
				return fmt.Errorf("%q, %v; Prometheus: %q", got, err, want)
			}
			return nil
		})
	}

	// (a) Placement: every series on exactly RF receivers, every sample on
	// at least a write quorum of them.
	holders := map[string]int{}          // series -> receivers holding it
	copies := map[string]map[int64]int{} // series -> timestamp -> receivers holding it
	for _, r := range c.receivers {
		got, err := ringRemoteRead(r.url(), t0.UnixMilli()+1, t1.UnixMilli())
		if err != nil {
			t.Fatalf("remote read %s: %v", r.name, err)
		}
		for k, ss := range got {
			holders[k]++
			if copies[k] == nil {
				copies[k] = map[int64]int{}
			}
			for _, s := range ss {
				copies[k][s.Timestamp]++
			}
		}
		t.Logf("%s holds %d series of the window", r.name, len(got))
	}
	var twoCopies int
	for _, s := range want {
		k := s.Metric.String()
		if holders[k] != ringRF {
			t.Errorf("series %s is on %d receivers, want %d", k, holders[k], ringRF)
			continue
		}
		for _, p := range s.Values {
			switch n := copies[k][int64(p.Timestamp)]; {
			case n < ringRF/2+1:
				t.Errorf("sample %s @%d is on %d receivers, less than a write quorum", k, p.Timestamp, n)
			case n < ringRF:
				twoCopies++
			}
		}
	}
	if len(holders) != len(want) {
		t.Errorf("receivers hold %d series in the window, Prometheus %d", len(holders), len(want))
	}
	t.Logf("%d of %d samples on only a quorum of receivers (the third copy is written in the background)", twoCopies, wantSamples)

	// Heads: Σ gpustore_tsdb_head_series over receivers = RF × series.
	all, err := ringSeries(promURL, promStarted.Add(-time.Minute), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var heads []float64
	waitFor(t, 10*time.Second, fmt.Sprintf("Σ head series over receivers = %d × %d series", ringRF, len(all)), func() error {
		heads = heads[:0]
		sum := 0.0
		for _, r := range c.receivers {
			v, err := ringMetric(r.url(), "gpustore_tsdb_head_series", map[string]string{"tenant": "default"})
			if err != nil {
				return err
			}
			heads = append(heads, v)
			sum += v
		}
		if sum != float64(ringRF*len(all)) {
			return fmt.Errorf("head series per receiver %v, sum %v", heads, sum)
		}
		return nil
	})
	t.Logf("head series per receiver %v for %d series", heads, len(all))

	// Prometheus never had a sample refused for good.
	if v, err := ringMetric(promURL, "prometheus_remote_storage_samples_failed_total", nil); err != nil || v != 0 {
		t.Errorf("prometheus_remote_storage_samples_failed_total = %v (%v), want 0", v, err)
	}
	retried, _ := ringMetric(promURL, "prometheus_remote_storage_samples_retried_total", nil)
	sent, _ := ringMetric(promURL, "prometheus_remote_storage_samples_total", nil)
	t.Logf("Prometheus sent %v samples, %v retried", sent, retried)

	ringOTLP(t, c)
}

// ringOTLP: the OpenTelemetry SDK's OTLP/HTTP exporter writes GPU gauges to
// the distributor, which translates them as one node does and replicates
// the series like remote write's: the query process answers them, and every
// series is on at least a write quorum of receivers.
func ringOTLP(t *testing.T, c *ringCluster) {
	t.Helper()
	res := resource.NewSchemaless(attribute.String("service.name", "dcgm-exporter"), attribute.String("service.instance.id", "node-9:9400"))
	exp := otlpExporter(t, c.front.url()+"/otlp/v1/metrics", "")
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithResource(res), sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp, sdkmetric.WithInterval(time.Hour))))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	temp, err := mp.Meter("dcgm").Float64Gauge("otlp.gpu.temperature")
	if err != nil {
		t.Fatal(err)
	}
	const gpus = 4
	ctx := context.Background()
	for gpu := range gpus {
		temp.Record(ctx, 60+float64(gpu), metric.WithAttributes(attribute.String("gpu", fmt.Sprint(gpu)), attribute.String("UUID", fmt.Sprintf("GPU-otlp-%d", gpu))))
	}
	from := time.Now().Add(-time.Second)
	if err := mp.ForceFlush(ctx); err != nil {
		t.Fatalf("OTLP export to the distributor: %v", err)
	}
	v, ws, err := ringQuery(c.front.url(), `sum(otlp_gpu_temperature{job="dcgm-exporter", instance="node-9:9400"}) and count(otlp_gpu_temperature) == 4`, time.Now())
	if err != nil || len(ws) > 0 {
		t.Fatalf("the OTLP series from the query process: %v, warnings %v", err, ws)
	}
	if vec, ok := v.(model.Vector); !ok || len(vec) != 1 || vec[0].Value != 60+61+62+63 {
		t.Fatalf("sum of the 4 OTLP gauges = %v, want %d", v, 60+61+62+63)
	}
	holders := map[string]int{}
	for _, r := range c.receivers {
		got, err := ringRemoteRead(r.url(), from.UnixMilli(), time.Now().UnixMilli()+1)
		if err != nil {
			t.Fatalf("remote read %s: %v", r.name, err)
		}
		for k := range got {
			if strings.Contains(k, "otlp_gpu_temperature") {
				holders[k]++
			}
		}
	}
	if len(holders) != gpus {
		t.Errorf("receivers hold %d OTLP series, want %d: %v", len(holders), gpus, holders)
	}
	for k, n := range holders {
		if n < ringRF/2+1 {
			t.Errorf("OTLP series %s is on %d receivers, less than a write quorum", k, n)
		}
	}
}

// TestRingReceiverKilled: a writer of its own remote-writes 64 GPU series to
// the distributor and records which samples were acknowledged. First five
// minutes of backfill, cut into minute blocks that all 4 receivers ship to
// S3: read back exactly once the query process has loaded them (each sample
// once, though 3 receivers shipped it). Then in real time (a sample per
// series every 100 ms), one receiver is killed with SIGKILL while the writes
// go on: every write is still acknowledged; a query at once returns every
// acknowledged sample, with a warning naming the dead receiver; the ring
// marks it UNHEALTHY after the heartbeat timeout, and writes and queries go
// on. Restarted with the same data dir and instance ID, it rejoins ACTIVE
// at once, its crashed head set aside (queries read around it while it
// recovers that head into blocks), then has the samples of the seconds
// before its kill again, and takes writes. At the end the query process returns exactly the
// acknowledged samples, by value, over the whole test, merged from
// receivers and bucket. With two
// receivers down (more than RF 3 over 4 receivers tolerates) a query fails
// rather than answer.
func TestRingReceiverKilled(t *testing.T) {
	c := startRing(t, ringReceivers)
	w := &ringWriter{t: t, url: c.front.url(), series: gpuSeries(), client: http.Client{Timeout: 30 * time.Second}}

	// Backfill: 1 s samples from about five minutes ago to 20 s ago.
	now := time.Now()
	start := now.Add(-5 * time.Minute).Truncate(time.Minute).UnixMilli()
	var tss []int64
	for ts := start; ts < now.Add(-20*time.Second).UnixMilli(); ts += 1000 {
		tss = append(tss, ts)
		if len(tss) == 15 {
			w.send(tss)
			tss = nil
		}
	}
	if len(tss) > 0 {
		w.send(tss)
	}
	if f := w.failures(); len(f) > 0 {
		t.Fatalf("backfill writes failed with every receiver up: %v", f)
	}
	backfillEnd := w.lastSent()

	// Acknowledged is readable at once: the backfilled samples are older
	// than the receivers' lookback (local retention + a block), which only
	// decides where the bucket is read raw; the receivers that hold them are
	// asked whatever the range.
	check := func(what string) {
		t.Helper()
		v, ws, err := ringQuery(c.front.url(), ringRawExpr(start, backfillEnd), time.UnixMilli(backfillEnd))
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if len(ws) > 0 {
			t.Errorf("%s: warnings %v", what, ws)
		}
		if err := w.diff(v.(model.Matrix), w.ackedSnapshot(), start, backfillEnd); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	check("the backfill right after it was acknowledged")
	// The receivers cut it into minute blocks and ship them; it reads back
	// the same, each sample once although 3 receivers shipped a block with
	// it, once the query process has loaded the blocks.
	bucketDir := filepath.Join(c.s3.dir, "data", s3Bucket, "default")
	waitFor(t, 60*time.Second, "minute blocks of every receiver in S3", func() error {
		metas, _ := filepath.Glob(filepath.Join(bucketDir, "*", "meta.json"))
		if len(metas) < ringReceivers*2 {
			return fmt.Errorf("%d blocks", len(metas))
		}
		return nil
	})
	waitBucketStoreSynced(t, c.front.url())
	check("the backfill once shipped")
	metas, _ := filepath.Glob(filepath.Join(bucketDir, "*", "meta.json"))
	t.Logf("backfill of %s read back; %d blocks in S3", time.Duration(backfillEnd-start)*time.Millisecond, len(metas))
	if len(metas) < ringReceivers*2 {
		t.Fatalf("only %d blocks in S3 after a backfill of several minutes by %d receivers", len(metas), ringReceivers)
	}

	// Real time: one sample per series every 100 ms until stopped.
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		var last int64
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			// Never ahead of the clock (a late tick skips a slot rather
			// than writing a future sample that a query "now" would not
			// select).
			ts := time.Now().UnixMilli() / 100 * 100
			if ts <= last {
				continue
			}
			last = ts
			w.send([]int64{ts})
		}
	}()
	stopWriter := sync.OnceFunc(func() { close(stop); <-done })
	t.Cleanup(stopWriter)

	time.Sleep(2 * time.Second) // load: the victim holds real-time samples when it dies
	victim := c.receivers[2]
	victim.kill()
	killedAt := time.Now()
	t.Logf("killed %s at %s", victim.name, killedAt.Format(time.TimeOnly))

	// At once (its heartbeat is still fresh: the ring counts it healthy):
	// the answer is complete.
	acked := w.ackedSnapshot()
	q := time.Now()
	v, ws, err := ringQuery(c.front.url(), ringRawExpr(start, q.UnixMilli()), q)
	if err != nil {
		t.Fatalf("query right after the kill: %v", err)
	}
	if d := q.Sub(killedAt); d >= ringHeartbeatTimeout-time.Second {
		t.Fatalf("the query after the kill started %s after it, too close to the heartbeat timeout %s to expect a warning", d, ringHeartbeatTimeout)
	}
	// Reads go to a read quorum of each replica set (dskit's DoUntilQuorum),
	// so the killed receiver is asked only when the quorum picked it: then
	// the answer warns about it, and never about a receiver that answered.
	for _, w := range ws {
		if strings.Contains(w, "receiver r") && !strings.Contains(w, victim.id) {
			t.Errorf("query right after %s was killed: a warning names another receiver: %s", victim.name, w)
		}
	}
	t.Logf("warnings right after the kill (%s asked: %v): %v", victim.name,
		slices.ContainsFunc(ws, func(w string) bool { return strings.Contains(w, victim.id) }), ws)
	w.checkContains(v.(model.Matrix), acked, "right after the kill")

	// The ring marks it unhealthy after the heartbeat timeout; the writes
	// keep being acknowledged meanwhile and after.
	waitFor(t, ringHeartbeatTimeout+10*time.Second, victim.name+" UNHEALTHY in the ring", func() error {
		st, err := ringStates(c.front.url())
		if err != nil {
			return err
		}
		if st[victim.id] != "UNHEALTHY" {
			return fmt.Errorf("ring: %v", st)
		}
		return nil
	})
	time.Sleep(2 * time.Second) // load: writes acknowledged while it is UNHEALTHY
	acked = w.ackedSnapshot()
	q = time.Now()
	v, ws, err = ringQuery(c.front.url(), ringRawExpr(start, q.UnixMilli()), q)
	if err != nil {
		t.Fatalf("query with %s unhealthy: %v", victim.name, err)
	}
	t.Logf("warnings with %s unhealthy: %v", victim.name, ws)
	w.checkContains(v.(model.Matrix), acked, "with the killed receiver unhealthy")
	if f := w.failures(); len(f) > 0 {
		t.Errorf("%d writes failed while one receiver of %d was down (RF %d): %v", len(f), ringReceivers, ringRF, f)
	}

	// Restart: same data dir, same instance ID. It rejoins ACTIVE and
	// takes writes again. Its crashed head is set aside whatever its size
	// (recover_wal_aside is on in a ring at RF 3) and recovered into blocks
	// in the background: meanwhile it refuses reads of the tenant, and the
	// front's queries, read around it, still return every acknowledged
	// sample.
	victim.args = append(victim.args, "-storage.tsdb.recover-aside-min-wal-bytes=1")
	victim.start()
	victim.waitReady()
	restartedAt := time.Now()
	acked = w.ackedSnapshot()
	q = time.Now()
	v, ws, err = ringQuery(c.front.url(), ringRawExpr(start, q.UnixMilli()), q)
	if err != nil {
		t.Fatalf("query right after %s restarted: %v", victim.name, err)
	}
	t.Logf("warnings right after %s restarted (recovering: %v): %v", victim.name, slices.ContainsFunc(ws, func(w string) bool { return strings.Contains(w, "recovering a crashed head") }), ws)
	w.checkContains(v.(model.Matrix), acked, "right after the restart, the killed receiver recovering")
	waitFor(t, 30*time.Second, victim.name+" ACTIVE in the ring again", func() error {
		st, err := ringStates(c.front.url())
		if err != nil {
			return err
		}
		if st[victim.id] != "ACTIVE" || len(st) != ringReceivers {
			return fmt.Errorf("ring: %v", st)
		}
		return nil
	})
	t.Logf("%s back after %s", victim.name, time.Since(killedAt).Round(time.Millisecond))
	// The receiver takes new writes: the load goes on until it holds some
	// written after its restart (it fails here if it never does).
	var after map[string][]prompb.Sample
	waitFor(t, 30*time.Second, victim.name+" taking writes after its restart", func() error {
		var err error
		if after, err = ringRemoteRead(victim.url(), restartedAt.UnixMilli(), time.Now().UnixMilli()); err != nil {
			return err
		}
		if len(after) == 0 {
			return fmt.Errorf("no series written to %s since its restart", victim.name)
		}
		return nil
	})
	stopWriter()
	end := w.lastSent()

	// The receiver kept what it had: its set-aside head, replayed into
	// blocks that its database loaded.
	var before map[string][]prompb.Sample
	waitFor(t, 90*time.Second, victim.name+" reading its samples of before the kill", func() error {
		var err error
		if before, err = ringRemoteRead(victim.url(), killedAt.Add(-3*time.Second).UnixMilli(), killedAt.UnixMilli()); err != nil {
			return err
		}
		if len(before) == 0 {
			return fmt.Errorf("%s lost the samples of the seconds before its kill", victim.name)
		}
		return nil
	})
	if n, err := ringMetric(victim.url(), "gpustore_tsdb_head_recovery_duration_seconds", nil); err != nil || n != 1 {
		t.Errorf("%s recovered %v set-aside heads (%v), want its crashed one", victim.name, n, err)
	}
	t.Logf("%s: %d series from before the kill, %d written after the restart", victim.name, len(before), len(after))
	if f := w.failures(); len(f) > 0 {
		t.Errorf("%d writes failed across the kill and restart of one receiver: %v", len(f), f)
	}

	// Everything acknowledged, exactly, by value: first the oldest two
	// minutes (past the receivers' lookback: raw from the bucket, and from
	// the receivers that still hold it), then the whole test.
	all := w.ackedSnapshot()
	oldEnd := start + 2*60_000
	v, ws, err = ringQuery(c.front.url(), ringRawExpr(start, oldEnd), time.UnixMilli(oldEnd))
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) > 0 {
		t.Errorf("warnings with every receiver up: %v", ws)
	}
	if err := w.diff(v.(model.Matrix), all, start, oldEnd); err != nil {
		t.Errorf("acknowledged samples of the oldest two minutes: %v", err)
	}
	v, ws, err = ringQuery(c.front.url(), ringRawExpr(start, end), time.UnixMilli(end))
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) > 0 {
		t.Errorf("warnings with every receiver up: %v", ws)
	}
	if err := w.diff(v.(model.Matrix), all, start, end); err != nil {
		t.Errorf("acknowledged samples over the whole test: %v", err)
	}
	cnt, _, err := ringQuery(c.front.url(), fmt.Sprintf(`sum(count_over_time(DCGM_FI_DEV_GPU_TEMP[%[1]dms])) + sum(count_over_time(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[%[1]dms]))`, end-start+1), time.UnixMilli(end))
	if err != nil {
		t.Fatal(err)
	}
	if vec := cnt.(model.Vector); len(vec) != 1 || int(vec[0].Value) != len(all)*len(w.series) {
		t.Errorf("sum(count_over_time) = %v, want %d (%d series × %d acknowledged timestamps)", vec, len(all)*len(w.series), len(w.series), len(all))
	}
	t.Logf("%d samples acknowledged and read back over %s", len(all)*len(w.series), time.Duration(end-start)*time.Millisecond)

	// More receivers down than the replication tolerates: the query fails
	// rather than answer with data it cannot know is complete.
	c.receivers[0].kill()
	c.receivers[1].kill()
	if v, ws, err := ringQuery(c.front.url(), ringRawExpr(end-60_000, end), time.UnixMilli(end)); err == nil {
		n := 0
		if m, ok := v.(model.Matrix); ok {
			n = len(m)
		}
		t.Errorf("query with 2 of %d receivers down (RF %d) answered %d series (warnings %v), want an error", ringReceivers, ringRF, n, ws)
	} else if !strings.HasPrefix(err.Error(), "503") {
		t.Errorf("query with 2 of %d receivers down: %v, want 503 (unavailable: retry), not an error of the query", ringReceivers, err)
	} else {
		t.Logf("with two receivers down the query fails: %v", err)
	}
}

// ---- topology ----

// ringProc is one gpustore process of the ring, restartable with the same
// arguments (data dir, instance ID, ports).
type ringProc struct {
	t       *testing.T
	name    string
	id      string // ring instance ID ("" for the front)
	bin     string
	addr    string
	args    []string
	logPath string

	cmd    *exec.Cmd
	logf   *os.File
	exited chan struct{}
}

func (p *ringProc) url() string { return "http://" + p.addr }

func (p *ringProc) start() {
	p.t.Helper()
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		p.t.Fatal(err)
	}
	fmt.Fprintf(logf, "=== %s: %s %s\n", time.Now().Format(time.RFC3339Nano), p.bin, strings.Join(p.args, " "))
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		p.t.Fatalf("start %s: %v", p.name, err)
	}
	p.cmd, p.logf, p.exited = cmd, logf, make(chan struct{})
	go func(cmd *exec.Cmd, exited chan struct{}) {
		_ = cmd.Wait()
		close(exited)
	}(cmd, p.exited)
}

func (p *ringProc) waitReady() {
	p.t.Helper()
	waitFor(p.t, 60*time.Second, p.name+" ready", func() error {
		select {
		case <-p.exited:
			p.t.Fatalf("%s exited at start: %v", p.name, p.cmd.ProcessState)
		default:
		}
		resp, err := http.Get(p.url() + "/-/ready")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	})
}

// kill ends the process with SIGKILL (a crash: no leaving the ring, no flush).
func (p *ringProc) kill() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
	_ = p.logf.Close()
	p.cmd = nil
}

type ringCluster struct {
	s3        *objectStore
	receivers []*ringProc
	front     *ringProc // -target=distributor,query
	// add defines (does not start) one more process of the cluster, with
	// the cluster's flags, a memberlist port of its own and a fresh data
	// dir: a receiver when id is set, else a front. Cleanup kills it too.
	add func(name, id, target string) *ringProc
}

// startRing starts n receivers (-target=ingest) and a distributor+query
// process, all in one memberlist cluster and sharing one S3 bucket, and
// waits until the front sees n ACTIVE receivers. Every process is killed at
// cleanup and its log printed if the test failed.
func startRing(t *testing.T, n int) *ringCluster {
	t.Helper()
	return startRingWith(t, n)
}

// startRingWith is startRing with extra flags for every process of the
// cluster (those added later by ringCluster.add too); a flag prefixed
// "receiver:" is given to the receivers only (later flags win: e.g.
// "receiver:-target=ingest,rules"), one prefixed with a receiver's ID
// ("r3:-ring.instance-zone=zone-b") to that receiver only.
func startRingWith(t *testing.T, n int, extra ...string) *ringCluster {
	t.Helper()
	bin := buildGpustore(t)
	c := &ringCluster{s3: startS3(t)}
	objstore := filepath.Join(t.TempDir(), "objstore.yml")
	raw, err := yaml.Marshal(map[string]any{"type": "S3", "config": c.s3.bucketConfig().Config})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(objstore, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	logDir := t.TempDir()
	var procs []*ringProc
	t.Cleanup(func() {
		for _, p := range procs {
			p.kill()
		}
		if t.Failed() {
			for _, p := range procs {
				b, _ := os.ReadFile(p.logPath)
				if len(b) > 30000 {
					b = append([]byte("...\n"), b[len(b)-30000:]...)
				}
				t.Logf("---- %s log:\n%s", p.name, b)
			}
		}
	})
	mlPorts := make([]string, n+1)
	for i := range mlPorts {
		_, mlPorts[i], _ = strings.Cut(freePort(t), ":")
	}
	common := []string{
		"-ring.enabled", fmt.Sprintf("-ring.replication-factor=%d", ringRF),
		"-ring.heartbeat-period=1s", "-ring.heartbeat-timeout=" + ringHeartbeatTimeout.String(),
		"-memberlist.bind-addr=127.0.0.1",
		"-objstore.config-file=" + objstore,
		"-storage.tsdb.block-duration=1m", "-storage.tsdb.retention.time=1m",
		"-shipper.interval=200ms", "-shipper.min-backoff=100ms", "-shipper.max-backoff=1s",
		"-bucket-store.sync-interval=1s",
		"-log.level=info",
	}
	for _, p := range mlPorts[:n] { // every receiver is a seed: any one may be down
		common = append(common, "-memberlist.join=127.0.0.1:"+p)
	}
	var receiverOnly []string
	byReceiver := map[string][]string{}
	for _, e := range extra {
		if f, ok := strings.CutPrefix(e, "receiver:"); ok {
			receiverOnly = append(receiverOnly, f)
		} else if id, f, ok := strings.Cut(e, ":"); ok && strings.HasPrefix(id, "r") && strings.HasPrefix(f, "-") {
			byReceiver[id] = append(byReceiver[id], f)
		} else {
			common = append(common, e)
		}
	}
	newProc := func(name, id, target, mlPort string) *ringProc {
		addr := freePort(t)
		args := append([]string{
			"-target=" + target, "-web.listen-address=" + addr,
			"-storage.tsdb.path=" + filepath.Join(t.TempDir(), "data"),
			"-memberlist.bind-port=" + mlPort, "-memberlist.nodename=" + name,
		}, common...)
		if id != "" {
			args = append(args, "-ring.instance-id="+id, "-ring.instance-addr="+addr)
			args = append(args, receiverOnly...)
			args = append(args, byReceiver[id]...)
		}
		p := &ringProc{t: t, name: name, id: id, bin: bin, addr: addr, args: args, logPath: filepath.Join(logDir, name+".log")}
		procs = append(procs, p)
		return p
	}
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("r%d", i)
		c.receivers = append(c.receivers, newProc("receiver-"+id, id, "ingest", mlPorts[i]))
	}
	c.front = newProc("distributor-query", "", "distributor,query", mlPorts[n])
	c.add = func(name, id, target string) *ringProc {
		_, mlPort, _ := strings.Cut(freePort(t), ":")
		return newProc(name, id, target, mlPort)
	}
	// The first seed alone, then the others together.
	c.receivers[0].start()
	c.receivers[0].waitReady()
	for _, p := range procs[1:] {
		p.start()
	}
	for _, p := range procs[1:] {
		p.waitReady()
	}
	waitFor(t, 30*time.Second, fmt.Sprintf("%d ACTIVE receivers in the front's ring", n), func() error {
		st, err := ringStates(c.front.url())
		if err != nil {
			return err
		}
		active := 0
		for _, s := range st {
			if s == "ACTIVE" {
				active++
			}
		}
		if active != n || len(st) != n {
			return fmt.Errorf("ring: %v", st)
		}
		return nil
	})
	return c
}

// ringStates reads the ring as a process sees it (/ring as JSON): instance
// ID -> state (UNHEALTHY when its heartbeat is older than the timeout).
func ringStates(base string) (map[string]string, error) {
	req, _ := http.NewRequest(http.MethodGet, base+"/ring", nil)
	req.Header.Set("Accept", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/ring: %d %.300s", resp.StatusCode, b)
	}
	var r struct {
		Shards []struct {
			ID    string `json:"id"`
			State string `json:"state"`
		} `json:"shards"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("/ring: %v in %.300s", err, b)
	}
	out := map[string]string{}
	for _, s := range r.Shards {
		out[s.ID] = s.State
	}
	return out, nil
}

// ---- reading ----

// ringQuery runs an instant query and returns the result and the
// "warnings" of the JSON answer.
func ringQuery(base, expr string, ts time.Time) (model.Value, []string, error) {
	q := url.Values{"query": {expr}, "time": {fmt.Sprintf("%.3f", float64(ts.UnixMilli())/1000)}}
	return ringAPI(base + "/api/v1/query?" + q.Encode())
}

func ringQueryRange(base, expr string, from, to time.Time, step time.Duration) (model.Matrix, error) {
	q := url.Values{"query": {expr}, "start": {fmt.Sprintf("%.3f", float64(from.UnixMilli())/1000)},
		"end": {fmt.Sprintf("%.3f", float64(to.UnixMilli())/1000)}, "step": {step.String()}}
	v, ws, err := ringAPI(base + "/api/v1/query_range?" + q.Encode())
	if err != nil {
		return nil, fmt.Errorf("query_range %s: %w", expr, err)
	}
	if len(ws) > 0 {
		return nil, fmt.Errorf("query_range %s: warnings %v", expr, ws)
	}
	return v.(model.Matrix), nil
}

func ringAPI(u string) (model.Value, []string, error) {
	resp, err := http.Get(u)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var r struct {
		Status   string   `json:"status"`
		Error    string   `json:"error"`
		Warnings []string `json:"warnings"`
		Data     struct {
			ResultType string          `json:"resultType"`
			Result     json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, nil, fmt.Errorf("%d %.300s: %v", resp.StatusCode, b, err)
	}
	if r.Status != "success" {
		return nil, r.Warnings, fmt.Errorf("%d: %s", resp.StatusCode, r.Error)
	}
	var v model.Value
	switch r.Data.ResultType {
	case "matrix":
		var m model.Matrix
		err = json.Unmarshal(r.Data.Result, &m)
		v = m
	case "vector":
		var m model.Vector
		err = json.Unmarshal(r.Data.Result, &m)
		v = m
	case "scalar":
		var s model.Scalar
		err = json.Unmarshal(r.Data.Result, &s)
		v = &s
	default:
		err = fmt.Errorf("result type %q", r.Data.ResultType)
	}
	return v, r.Warnings, err
}

// ringSeries lists the series of [from, to] (/api/v1/series), sorted.
func ringSeries(base string, from, to time.Time) ([]string, error) {
	q := url.Values{"match[]": {`{__name__=~".+"}`}, "start": {fmt.Sprint(from.Unix())}, "end": {fmt.Sprint(to.Unix())}}
	resp, err := http.Get(base + "/api/v1/series?" + q.Encode())
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var r struct {
		Status string              `json:"status"`
		Error  string              `json:"error"`
		Data   []map[string]string `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return nil, err
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("series: %s", r.Error)
	}
	out := make([]string, 0, len(r.Data))
	for _, ls := range r.Data {
		m := model.Metric{}
		for k, v := range ls {
			m[model.LabelName(k)] = model.LabelValue(v)
		}
		out = append(out, m.String())
	}
	sort.Strings(out)
	return out, nil
}

// ringRemoteRead reads every series a receiver holds in [from, to] over its
// remote-read endpoint (samples, not chunks): series -> samples.
func ringRemoteRead(base string, from, to int64) (map[string][]prompb.Sample, error) {
	req := &prompb.ReadRequest{
		Queries: []*prompb.Query{{StartTimestampMs: from, EndTimestampMs: to,
			Matchers: []*prompb.LabelMatcher{{Type: prompb.LabelMatcher_RE, Name: "__name__", Value: ".+"}}}},
		AcceptedResponseTypes: []prompb.ReadRequest_ResponseType{prompb.ReadRequest_SAMPLES},
	}
	raw, err := req.Marshal()
	if err != nil {
		return nil, err
	}
	hreq, _ := http.NewRequest(http.MethodPost, base+"/receiver/read", bytes.NewReader(snappy.Encode(nil, raw)))
	hreq.Header.Set("Content-Type", "application/x-protobuf")
	hreq.Header.Set("Content-Encoding", "snappy")
	hreq.Header.Set("X-Prometheus-Remote-Read-Version", "0.1.0")
	resp, err := http.DefaultClient.Do(hreq)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%d %.300s", resp.StatusCode, b)
	}
	dec, err := snappy.Decode(nil, b)
	if err != nil {
		return nil, err
	}
	var rr prompb.ReadResponse
	if err := rr.Unmarshal(dec); err != nil {
		return nil, err
	}
	out := map[string][]prompb.Sample{}
	for _, res := range rr.Results {
		for _, ts := range res.Timeseries {
			m := model.Metric{}
			for _, l := range ts.Labels {
				m[model.LabelName(l.Name)] = model.LabelValue(l.Value)
			}
			var ss []prompb.Sample
			for _, s := range ts.Samples {
				if !math.IsNaN(s.Value) { // staleness markers: PromQL drops them too
					ss = append(ss, s)
				}
			}
			if len(ss) > 0 {
				out[m.String()] = append(out[m.String()], ss...)
			}
		}
	}
	return out, nil
}

// ringMetric sums a metric's samples (a histogram's count) on a /metrics page, over the series
// that have the given labels.
func ringMetric(base, name string, match map[string]string) (float64, error) {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0, fmt.Errorf("%s/metrics: %v", base, err)
	}
	mf, ok := mfs[name]
	if !ok {
		return 0, fmt.Errorf("%s/metrics has no %s", base, name)
	}
	var sum float64
next:
	for _, m := range mf.GetMetric() {
		for k, v := range match {
			found := false
			for _, l := range m.GetLabel() {
				if l.GetName() == k && l.GetValue() == v {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		sum += m.GetCounter().GetValue() + m.GetGauge().GetValue() + m.GetUntyped().GetValue() + float64(m.GetHistogram().GetSampleCount())
	}
	return sum, nil
}

// diffMatrix describes how got differs from want ("" when equal), sample
// by sample.
func diffMatrix(want, got model.Matrix) string {
	idx := func(m model.Matrix) map[string][]model.SamplePair {
		out := map[string][]model.SamplePair{}
		for _, s := range m {
			out[s.Metric.String()] = s.Values
		}
		return out
	}
	w, g := idx(want), idx(got)
	var diffs []string
	nw, ng := 0, 0
	for k, ws := range w {
		nw += len(ws)
		gs, ok := g[k]
		if !ok {
			diffs = append(diffs, "missing series "+k)
			continue
		}
		if d := diffPairs(ws, gs); d != "" {
			diffs = append(diffs, k+": "+d)
		}
	}
	for k, gs := range g {
		ng += len(gs)
		if _, ok := w[k]; !ok {
			diffs = append(diffs, "extra series "+k)
		}
	}
	if len(diffs) == 0 {
		return ""
	}
	sort.Strings(diffs)
	return fmt.Sprintf("want %d series/%d samples, got %d series/%d samples; %d series differ, e.g.\n  %s",
		len(w), nw, len(g), ng, len(diffs), strings.Join(diffs[:min(5, len(diffs))], "\n  "))
}

func diffPairs(want, got []model.SamplePair) string {
	wm := map[model.Time]model.SampleValue{}
	for _, p := range want {
		wm[p.Timestamp] = p.Value
	}
	gm := map[model.Time]model.SampleValue{}
	var dups int
	for _, p := range got {
		if _, ok := gm[p.Timestamp]; ok {
			dups++
		}
		gm[p.Timestamp] = p.Value
	}
	var missing, extra, wrong []string
	for ts, v := range wm {
		gv, ok := gm[ts]
		switch {
		case !ok:
			missing = append(missing, fmt.Sprint(ts))
		case !(gv == v || (math.IsNaN(float64(gv)) && math.IsNaN(float64(v)))):
			wrong = append(wrong, fmt.Sprintf("%d: %v want %v", ts, gv, v))
		}
	}
	for ts := range gm {
		if _, ok := wm[ts]; !ok {
			extra = append(extra, fmt.Sprint(ts))
		}
	}
	if len(missing)+len(extra)+len(wrong)+dups == 0 {
		return ""
	}
	sort.Strings(missing)
	sort.Strings(extra)
	return fmt.Sprintf("%d samples want, %d got: %d missing %.5v, %d extra %.5v, %d wrong values %.3v, %d duplicate timestamps",
		len(want), len(got), len(missing), missing, len(extra), extra, len(wrong), wrong, dups)
}

// ---- writing ----

// ringWriter remote-writes gpuSeries (values gpuValue) to the distributor,
// all series at the same timestamps per request, and records which
// timestamps were acknowledged (2xx) and which were only sent.
type ringWriter struct {
	t      *testing.T
	url    string
	series []prompb.TimeSeries
	client http.Client

	mtx    sync.Mutex
	acked  []int64
	sent   []int64
	failed []string
}

func (w *ringWriter) send(tss []int64) {
	req := &prompb.WriteRequest{}
	for i, s := range w.series {
		ts := prompb.TimeSeries{Labels: s.Labels}
		for _, t := range tss {
			ts.Samples = append(ts.Samples, prompb.Sample{Timestamp: t, Value: gpuValue(i, t)})
		}
		req.Timeseries = append(req.Timeseries, ts)
	}
	raw, err := req.Marshal()
	if err != nil {
		panic(err)
	}
	w.mtx.Lock()
	w.sent = append(w.sent, tss...)
	w.mtx.Unlock()
	hreq, _ := http.NewRequest(http.MethodPost, w.url+"/api/v1/write", bytes.NewReader(snappy.Encode(nil, raw)))
	hreq.Header.Set("Content-Type", "application/x-protobuf")
	hreq.Header.Set("Content-Encoding", "snappy")
	hreq.Header.Set("X-Prometheus-Remote-Write-Version", "0.1.0")
	resp, err := w.client.Do(hreq)
	var fail string
	if err != nil {
		fail = err.Error()
	} else {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			fail = fmt.Sprintf("%d %.200s", resp.StatusCode, bytes.TrimSpace(body))
		}
	}
	w.mtx.Lock()
	defer w.mtx.Unlock()
	if fail != "" {
		w.failed = append(w.failed, fmt.Sprintf("%s [%d..%d]: %s", time.Now().Format("15:04:05.000"), tss[0], tss[len(tss)-1], fail))
		return
	}
	w.acked = append(w.acked, tss...)
}

func (w *ringWriter) ackedSnapshot() []int64 {
	w.mtx.Lock()
	defer w.mtx.Unlock()
	return slices.Clone(w.acked)
}

func (w *ringWriter) failures() []string {
	w.mtx.Lock()
	defer w.mtx.Unlock()
	return slices.Clone(w.failed)
}

func (w *ringWriter) lastSent() int64 {
	w.mtx.Lock()
	defer w.mtx.Unlock()
	return w.sent[len(w.sent)-1]
}

func (w *ringWriter) wasSent(ts int64) bool {
	w.mtx.Lock()
	defer w.mtx.Unlock()
	_, ok := slices.BinarySearch(w.sent, ts)
	return ok
}

// ringRawExpr selects every written series' raw samples in [from, to] when
// evaluated at to.
func ringRawExpr(from, to int64) string {
	return fmt.Sprintf(`{__name__=~"DCGM_.+"}[%dms]`, to-from+1)
}

// checkContains: every acknowledged sample is in m with its value, and m
// holds nothing that was not sent.
func (w *ringWriter) checkContains(m model.Matrix, acked []int64, when string) {
	w.t.Helper()
	got := map[string]map[model.Time]model.SampleValue{}
	for _, s := range m {
		pts := map[model.Time]model.SampleValue{}
		for _, p := range s.Values {
			if !w.wasSent(int64(p.Timestamp)) {
				w.t.Errorf("%s: %s has a sample at %d that was never written", when, s.Metric, p.Timestamp)
				return
			}
			pts[p.Timestamp] = p.Value
		}
		got[s.Metric.String()] = pts
	}
	var missing int
	var example string
	for i, s := range w.series {
		k := ringMetricKey(s.Labels)
		for _, ts := range acked {
			v, ok := got[k][model.Time(ts)]
			if !ok || float64(v) != gpuValue(i, ts) {
				if missing == 0 {
					example = fmt.Sprintf("%s @%d: got %v (present %v), want %v", k, ts, v, ok, gpuValue(i, ts))
				}
				missing++
			}
		}
	}
	if missing > 0 {
		w.t.Errorf("%s: %d of %d acknowledged samples missing or wrong, e.g. %s", when, missing, len(acked)*len(w.series), example)
	}
}

// expected is the writer's series with the samples at the acknowledged
// timestamps in [from, to].
func (w *ringWriter) expected(acked []int64, from, to int64) model.Matrix {
	want := model.Matrix{}
	for i, s := range w.series {
		ss := &model.SampleStream{Metric: model.Metric{}}
		for _, l := range s.Labels {
			ss.Metric[model.LabelName(l.Name)] = model.LabelValue(l.Value)
		}
		for _, ts := range acked {
			if ts >= from && ts <= to {
				ss.Values = append(ss.Values, model.SamplePair{Timestamp: model.Time(ts), Value: model.SampleValue(gpuValue(i, ts))})
			}
		}
		want = append(want, ss)
	}
	return want
}

// diff: m holds exactly the acknowledged samples of [from, to] (when no
// write failed; otherwise also possibly samples sent but not acknowledged).
func (w *ringWriter) diff(m model.Matrix, acked []int64, from, to int64) error {
	failed := len(w.failures()) > 0
	want := w.expected(acked, from, to)
	if failed {
		// Samples sent but not acknowledged may or may not be stored.
		var in []int64
		for _, ts := range acked {
			if ts >= from && ts <= to {
				in = append(in, ts)
			}
		}
		w.checkContains(m, in, fmt.Sprintf("[%d, %d]", from, to))
		return nil
	}
	if d := diffMatrix(want, m); d != "" {
		return errors.New(d)
	}
	return nil
}

func ringMetricKey(ls []prompb.Label) string {
	m := model.Metric{}
	for _, l := range ls {
		m[model.LabelName(l.Name)] = model.LabelValue(l.Value)
	}
	return m.String()
}

// ringMetadata is /api/v1/metadata's entry for metric family fam, as
// "type|unit|help" ("" when absent).
func ringMetadata(base, fam string) (string, error) {
	resp, err := http.Get(base + "/api/v1/metadata?" + url.Values{"metric": {fam}}.Encode())
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var r struct {
		Status string                                         `json:"status"`
		Data   map[string][]struct{ Type, Unit, Help string } `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || r.Status != "success" {
		return "", fmt.Errorf("%s: status %q, %v", resp.Status, r.Status, err)
	}
	if ms := r.Data[fam]; len(ms) > 0 {
		return ms[0].Type + "|" + ms[0].Unit + "|" + ms[0].Help, nil
	}
	return "", nil
}
