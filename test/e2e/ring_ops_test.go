package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunkenc"

	"github.com/gpustore/gpustore/bench/gpusim"
	"github.com/gpustore/gpustore/internal/testbin"
)

// Operations on the ring (issue 15), with the harness of ring_test.go: scale
// out and in, a rolling restart, an HA pair of Prometheus servers writing
// through two distributors. Receivers are stopped gracefully (SIGTERM): a
// stopping receiver turns LEAVING (distributors write elsewhere), flushes
// its heads into blocks, ships them and leaves the ring.

// TestRingScaleOutAndIn: 3 receivers (RF 3) under a continuous load (64
// series, a sample each every 100 ms, every acknowledgement recorded); two
// receivers join (ACTIVE) and take series; then both stop gracefully at
// once while the writes go on (a series may have had both of them in its
// replica set, so some samples were acknowledged by them alone: they reach
// the bucket by the leaving receivers' flush). Every write is acknowledged
// (a refused one is retried; any refusal is reported), and at the end the
// query process returns every acknowledged sample by value exactly once:
// none lost, none doubled, none invented.
func TestRingScaleOutAndIn(t *testing.T) {
	c := startRing(t, 3)
	w := &ringWriter{t: t, url: c.front.url(), series: gpuSeries(), client: http.Client{Timeout: 30 * time.Second}}
	start := time.Now().UnixMilli()/100*100 + 100
	load := startRingLoad(t, w, 100*time.Millisecond)

	time.Sleep(3 * time.Second) // load: samples only the first three receivers hold
	var added []*ringProc
	for _, id := range []string{"r3", "r4"} {
		p := c.add("receiver-"+id, id, "ingest")
		p.start()
		added = append(added, p)
	}
	for _, p := range added {
		p.waitReady()
	}
	all := []string{"r0", "r1", "r2", "r3", "r4"}
	waitRingActive(t, c.front.url(), all, 30*time.Second)
	t.Logf("r3 and r4 ACTIVE at %s", time.Now().Format(time.TimeOnly))

	// The new receivers take their share of the series.
	waitFor(t, 15*time.Second, "head series on r3 and r4", func() error {
		var heads []string
		empty := false
		for _, p := range append(slices.Clone(c.receivers), added...) {
			v, err := ringMetric(p.url(), "gpustore_tsdb_head_series", map[string]string{"tenant": "default"})
			if err != nil {
				return err
			}
			heads = append(heads, fmt.Sprintf("%s=%v", p.id, v))
			if v == 0 && slices.Contains(added, p) {
				empty = true
			}
		}
		if empty {
			return fmt.Errorf("head series %v", heads)
		}
		t.Logf("head series after scale-out: %v", heads)
		return nil
	})
	time.Sleep(4 * time.Second) // load: seconds of samples r3 and r4 hold, which they must flush when they leave

	// Everything acknowledged so far reads back with five receivers. (The
	// writer's newest timestamp can be up to a period ahead of the clock.)
	q := time.Now().Add(200 * time.Millisecond)
	acked := w.ackedSnapshot()
	v, ws, err := ringQuery(c.front.url(), ringRawExpr(start, q.UnixMilli()), q)
	if err != nil {
		t.Fatalf("query with 5 receivers: %v", err)
	}
	if len(ws) > 0 {
		t.Errorf("query with 5 receivers up: warnings %v", ws)
	}
	w.checkContains(v.(model.Matrix), acked, "with 5 receivers")

	// What the new receivers hold now must reach the bucket when they
	// leave: their replicas may hold it too, so reading the query process
	// alone would not tell whether they flushed it.
	held := map[string]map[string][]int64{} // receiver -> series -> timestamps
	for _, p := range added {
		got, err := ringRemoteRead(p.url(), start, time.Now().UnixMilli())
		if err != nil {
			t.Fatalf("remote read %s: %v", p.name, err)
		}
		held[p.id] = map[string][]int64{}
		n := 0
		for k, ss := range got {
			for _, smp := range ss {
				held[p.id][k] = append(held[p.id][k], smp.Timestamp)
			}
			n += len(ss)
		}
		t.Logf("%s holds %d series, %d samples before scale-in", p.name, len(got), n)
	}

	// Scale in: both new receivers stop gracefully, at once. The ring is
	// watched meanwhile (do they turn LEAVING before they go?).
	watch := watchRing(c.front.url(), "r3", "r4")
	var wg sync.WaitGroup
	stopped := time.Now()
	for _, p := range added {
		wg.Go(func() {
			d, code := p.stop(90 * time.Second)
			t.Logf("%s exited %d after %s", p.name, code, d.Round(time.Millisecond))
			if code != 0 {
				t.Errorf("%s exited %d on SIGTERM, want 0", p.name, code)
			}
		})
	}
	wg.Wait()
	// A leaving receiver turns LEAVING (read, not written to) before it
	// flushes and ships its heads; then it goes. (How long the front sees
	// it LEAVING depends on gossip: logged, not asserted.)
	seen := watch()
	for _, id := range []string{"r3", "r4"} {
		d, states := leavingFor(seen[id])
		t.Logf("%s in the front's ring after SIGTERM: %s (LEAVING for %s)", id, states, d.Round(time.Millisecond))
		if !slices.ContainsFunc(seen[id], func(s ringState) bool { return s.state == "LEAVING" }) {
			t.Errorf("%s never turned LEAVING in the front's ring before it went (%s)", id, states)
		}
	}
	waitRingActive(t, c.front.url(), all[:3], 15*time.Second)
	t.Logf("scale-in done %s after SIGTERM", time.Since(stopped).Round(time.Millisecond))
	time.Sleep(3 * time.Second) // load: writes acknowledged by three receivers again
	load.finish()
	end := w.lastSent()
	load.report()

	// Exactly the acknowledged samples, once, by value; the leaving
	// receivers' samples come from the bucket once the query process has
	// loaded their blocks (-bucket-store.sync-interval=1s).
	checkAt := time.Now()
	var last string
	waitFor(t, 20*time.Second, "every acknowledged sample exactly once after scale-in", func() error {
		v, ws, err := ringQuery(c.front.url(), ringRawExpr(start, end), time.UnixMilli(end))
		switch {
		case err != nil:
			last = err.Error()
		case len(ws) > 0:
			last = fmt.Sprintf("warnings %v", ws)
		default:
			last = w.exactDiff(v.(model.Matrix), start, end)
		}
		if last != "" {
			return fmt.Errorf("%s", last)
		}
		return nil
	})
	t.Logf("exact %s after the end of writes", time.Since(checkAt).Round(time.Millisecond))
	w.checkCount(c.front.url(), start, end)

	// The bucket itself (versitygw's files, read as TSDB blocks) has every
	// sample the removed receivers held.
	inBucket, blocks := bucketSamples(t, filepath.Join(c.s3.dir, "data", s3Bucket, "default"))
	for id, series := range held {
		missing, total := 0, 0
		var example string
		for k, tss := range series {
			for _, ts := range tss {
				total++
				if _, ok := inBucket[k][ts]; !ok {
					if missing == 0 {
						example = fmt.Sprintf("%s@%d", k, ts)
					}
					missing++
				}
			}
		}
		if missing > 0 {
			t.Errorf("%d of the %d samples %s held before it left are not in the bucket (%d blocks), e.g. %s", missing, total, id, blocks, example)
		} else {
			t.Logf("all %d samples %s held are in the bucket (%d blocks)", total, id, blocks)
		}
	}
}

// bucketSamples reads every complete block (with its meta.json) of a
// tenant's folder in versitygw's data directory: series -> timestamps.
func bucketSamples(t *testing.T, dir string) (map[string]map[int64]struct{}, int) {
	t.Helper()
	metas, _ := filepath.Glob(filepath.Join(dir, "*", "meta.json"))
	out := map[string]map[int64]struct{}{}
	for _, m := range metas {
		b, err := tsdb.OpenBlock(nil, filepath.Dir(m), nil, nil)
		if err != nil {
			t.Fatalf("open block %s: %v", filepath.Dir(m), err)
		}
		q, err := tsdb.NewBlockQuerier(b, math.MinInt64, math.MaxInt64)
		if err != nil {
			t.Fatal(err)
		}
		ss := q.Select(context.Background(), false, nil, labels.MustNewMatcher(labels.MatchRegexp, "__name__", ".+"))
		for ss.Next() {
			s := ss.At()
			mm := model.Metric{}
			s.Labels().Range(func(l labels.Label) { mm[model.LabelName(l.Name)] = model.LabelValue(l.Value) })
			k := mm.String()
			if out[k] == nil {
				out[k] = map[int64]struct{}{}
			}
			it := s.Iterator(nil)
			for it.Next() != chunkenc.ValNone {
				ts, _ := it.At()
				out[k][ts] = struct{}{}
			}
			if err := it.Err(); err != nil {
				t.Fatal(err)
			}
		}
		if err := ss.Err(); err != nil {
			t.Fatal(err)
		}
		q.Close()
		b.Close()
	}
	return out, len(metas)
}

// TestRingRollingRestart: 3 receivers (RF 3) under a continuous load; each
// receiver in turn is stopped gracefully (SIGTERM, exit), started again
// with the same data dir and instance ID and waited for ACTIVE, while a
// loop queries the last 20 s. No acknowledged sample is lost (all read back
// by value, exactly, at the end); every query succeeds, complete for every
// sample acknowledged before it started, with no warning but the
// documented one (a receiver unavailable).
func TestRingRollingRestart(t *testing.T) {
	c := startRing(t, 3)
	w := &ringWriter{t: t, url: c.front.url(), series: gpuSeries(), client: http.Client{Timeout: 30 * time.Second}}
	start := time.Now().UnixMilli()/100*100 + 100
	load := startRingLoad(t, w, 100*time.Millisecond)
	ql := startRingQueryLoop(t, c.front.url(), w, start, 20*time.Second)

	ids := []string{"r0", "r1", "r2"}
	for _, r := range c.receivers {
		time.Sleep(2 * time.Second) // load (and queries) with every receiver up between restarts
		sigterm := time.Now()
		watch := watchRing(c.front.url(), r.id)
		d, code := r.stop(90 * time.Second)
		_, states := leavingFor(watch()[r.id])
		t.Logf("%s in the front's ring after SIGTERM until it exited: %s", r.id, states)
		if code != 0 {
			t.Errorf("%s exited %d on SIGTERM, want 0", r.name, code)
		}
		r.start()
		r.waitReady()
		waitRingActive(t, c.front.url(), ids, 30*time.Second)
		waitFor(t, 10*time.Second, r.name+" taking writes again", func() error {
			v, err := ringMetric(r.url(), "gpustore_tsdb_head_series", map[string]string{"tenant": "default"})
			if err != nil || v != float64(len(w.series)) {
				return fmt.Errorf("head series %v (%v)", v, err)
			}
			return nil
		})
		t.Logf("%s: exited %s after SIGTERM, ACTIVE again after %s", r.name, d.Round(time.Millisecond), time.Since(sigterm).Round(time.Millisecond))
	}
	time.Sleep(2 * time.Second) // load and queries after the last restart
	ql.finish()
	load.finish()
	end := w.lastSent()
	load.report()
	ql.report()

	v, ws, err := ringQuery(c.front.url(), ringRawExpr(start, end), time.UnixMilli(end))
	if err != nil {
		t.Fatalf("query after the restarts: %v", err)
	}
	if len(ws) > 0 {
		t.Errorf("warnings with every receiver up: %v", ws)
	}
	if d := w.exactDiff(v.(model.Matrix), start, end); d != "" {
		t.Errorf("after the rolling restart, the query process does not return exactly the acknowledged samples: %s", d)
	}
	w.checkCount(c.front.url(), start, end)
}

// TestRingHAPair: two real Prometheus servers (external labels
// cluster=gpu-a, __replica__=p0|p1) scrape the same simulated DCGM pages,
// each remote-writing to a different distributor; the HA election lives in
// the memberlist that also carries the ring, so both distributors keep the
// same replica. Every series is stored once (no replica label, one series
// per GPU, one sample per scrape), both query fronts answer alike, and the
// stored samples are exactly the elected Prometheus' own (by its query
// API). When the elected Prometheus stops, the other takes over within the
// failover timeout, on both distributors, and its samples are stored once.
func TestRingHAPair(t *testing.T) {
	promBin := testbin.Need(t, "prometheus")
	const failover = 6 * time.Second
	c := startRingWith(t, 3, "-ha-tracker.store=memberlist", "-ha-tracker.failover-timeout="+failover.String(),
		"-ha-tracker.update-timeout=2s", "-ha-tracker.gap-fill-after=3s")
	front2 := c.add("distributor-query-2", "", "distributor,query")
	front2.start()
	front2.waitReady()
	waitRingActive(t, front2.url(), []string{"r0", "r1", "r2"}, 30*time.Second)
	fronts := []*ringProc{c.front, front2}

	sim, err := gpusim.New(gpusim.Config{Name: "gpu-a", Nodes: 2, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	page := httptest.NewServer(gpusim.NewHandler(sim, gpusim.HandlerOptions{Pages: gpusim.PagesNode}))
	t.Cleanup(page.Close)
	config := func(replica, target string) string {
		var b strings.Builder
		fmt.Fprintf(&b, "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  external_labels:\n    cluster: gpu-a\n    __replica__: %s\n", replica)
		b.WriteString("scrape_configs:\n")
		for _, h := range sim.Hostnames() {
			fmt.Fprintf(&b, "  - job_name: %s\n    metrics_path: /node/%s/metrics\n    static_configs:\n      - targets: [%q]\n", h, h, strings.TrimPrefix(page.URL, "http://"))
			b.WriteString("    metric_relabel_configs:\n      - source_labels: [__name__]\n        regex: DCGM_.*\n        action: keep\n      - regex: pod|namespace|container\n        action: labeldrop\n")
		}
		fmt.Fprintf(&b, "remote_write:\n  - url: %s/api/v1/write\n    queue_config:\n      batch_send_deadline: 500ms\n      max_samples_per_send: 2000\n      min_backoff: 100ms\n      max_backoff: 1s\n", target)
		return b.String()
	}
	// Both replicas start together (as an HA pair's two pods do), so their
	// first writes reach the two distributors at about the same time: the
	// election must still come out the same on both. Memberlist converges,
	// it does not lock: until the two distributors' elections have met
	// (a gossip round), each stores its own replica; then the first
	// election keeps the cluster (the same term: the earlier one wins).
	proms := map[string]string{}
	stops := map[string]func(){}
	for i, r := range []string{"p0", "p1"} {
		dir := t.TempDir()
		cfgPath := filepath.Join(dir, "prometheus.yml")
		if err := os.WriteFile(cfgPath, []byte(config(r, fronts[i].url())), 0o644); err != nil {
			t.Fatal(err)
		}
		addr := freePort(t)
		stops[r] = runProcess(t, "prometheus-"+r, promBin, dir, "--config.file="+cfgPath,
			"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+addr, "--log.level=warn")
		proms[r] = "http://" + addr
	}
	began := time.Now()
	for _, r := range []string{"p0", "p1"} {
		waitFor(t, 60*time.Second, r+" scraping for 22 s", func() error {
			v, _, err := ringQuery(proms[r], `min(count_over_time(up[25s]))`, time.Now())
			if err != nil {
				return err
			}
			if vec, ok := v.(model.Vector); !ok || len(vec) != 1 || vec[0].Value < 22 {
				return fmt.Errorf("min(count_over_time(up[25s])) = %v", v)
			}
			return nil
		})
	}

	// One election, the same on both distributors.
	var (
		leader string
		agreed time.Time // when both were first seen agreeing
	)
	waitFor(t, 10*time.Second, "both distributors electing the same replica", func() error {
		var got []string
		for _, f := range fronts {
			r, err := haElected(f.url())
			if err != nil {
				return err
			}
			got = append(got, r)
		}
		if got[0] == "" || got[0] != got[1] {
			return fmt.Errorf("elected %v", got)
		}
		leader, agreed = got[0], time.Now()
		return nil
	})
	other := map[string]string{"p0": "p1", "p1": "p0"}[leader]
	t.Logf("elected %s", leader)

	// The window starts after the agreement was seen (plus a second for
	// batches in flight): before it, a distributor whose own election had
	// not met the other's yet stored its replica, as it should (CI once saw
	// that take 5 s under load, and a window reaching back into it).
	const window = 15 * time.Second
	t1 := agreed.Add(time.Second + window).Truncate(time.Second).Add(time.Second)
	time.Sleep(time.Until(t1.Add(2 * time.Second)))
	checkStoredOnce(t, fronts, proms[leader], proms[other], t1, window, "before failover")

	// The whole run so far: stored twice at most while the election was
	// being agreed on, a few scrapes of the other replica, never after.
	whole := time.Since(began).Truncate(time.Second) - 2*time.Second
	now := time.Now().Add(-2 * time.Second)
	gsAll := haSumCount(t, c.front.url(), whole, now, true)
	leadAll := haSumCount(t, proms[leader], whole, now, false)
	otherAll := haSumCount(t, proms[other], whole, now, false)
	t.Logf("samples of DCGM_FI_DEV_GPU_TEMP over the whole run (%s): gpustore %v, elected %s %v, other %s %v", whole, gsAll, leader, leadAll, other, otherAll)
	const convergence = 16 * 3 // 16 GPUs, 3 scrapes at 1 s: gossip rounds of 200 ms and retries
	if gsAll > leadAll+convergence {
		t.Errorf("over the whole run gpustore stored %v samples of DCGM_FI_DEV_GPU_TEMP, more than the elected replica scraped (%v; the other %v) plus %d while the election converged: stored twice after the distributors agreed", gsAll, leadAll, otherAll, convergence)
	}

	// Failover: the elected Prometheus stops; the other takes over on both
	// distributors within the failover timeout, and is stored once.
	stops[leader]()
	stoppedAt := time.Now()
	t.Logf("stopped %s at %s", leader, stoppedAt.Format(time.TimeOnly))
	for _, f := range fronts {
		waitFor(t, failover+15*time.Second, other+"'s samples through "+f.name, func() error {
			v, err := haQuery(f.url(), `timestamp(DCGM_FI_DEV_GPU_TEMP{Hostname="gpu-node-001",gpu="0"})`, time.Now())
			if err != nil {
				return err
			}
			vec := v.(model.Vector)
			if len(vec) != 1 {
				return fmt.Errorf("%v", vec)
			}
			if ts := time.Unix(int64(vec[0].Value), 0); !ts.After(stoppedAt.Add(2 * time.Second)) {
				return fmt.Errorf("newest sample at %s", ts.Format(time.TimeOnly))
			}
			return nil
		})
		waitFor(t, failover+10*time.Second, other+" elected on "+f.name, func() error {
			r, err := haElected(f.url())
			if err != nil {
				return err
			}
			if r != other {
				return fmt.Errorf("elected %s", r)
			}
			return nil
		})
	}
	t.Logf("%s took over %s after %s stopped", other, time.Since(stoppedAt).Round(time.Millisecond), leader)
	waitFor(t, 30*time.Second, "12 s of the new replica's samples", func() error {
		if time.Since(stoppedAt) < failover+12*time.Second {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	t2 := time.Now().Add(-2 * time.Second).Truncate(time.Second)
	checkStoredOnce(t, fronts, proms[other], "", t2, 10*time.Second, "after failover")
	for _, f := range fronts {
		v, err := haQuery(f.url(), `resets(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[2m]) > 0`, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if vec := v.(model.Vector); len(vec) != 0 {
			t.Errorf("%s: counter resets across the failover: %v", f.name, vec)
		}
	}
}

// checkStoredOnce compares what gpustore stored in (t1-window, t1], through
// every front (dedup off), with the raw samples the elected Prometheus has
// in its own TSDB (plus the cluster label, an external label): the same
// series, the same samples, one per scrape. otherURL, when set, is the
// replica that is not elected: its samples are logged to show the check can
// tell the replicas apart.
func checkStoredOnce(t *testing.T, fronts []*ringProc, electedURL, otherURL string, t1 time.Time, window time.Duration, when string) {
	t.Helper()
	raw := fmt.Sprintf(`{__name__=~".+"}[%ds]`, int(window.Seconds()))
	pv, ws, err := ringQuery(electedURL, raw, t1)
	if err != nil || len(ws) > 0 {
		t.Fatalf("prometheus %s: %v %v", raw, err, ws)
	}
	want := pv.(model.Matrix)
	if len(want) == 0 {
		t.Fatalf("%s: the elected Prometheus has nothing in %s", when, raw)
	}
	var wantSamples int
	for _, s := range want {
		s.Metric["cluster"] = "gpu-a"
		wantSamples += len(s.Values)
	}
	if otherURL != "" {
		ov, _, err := ringQuery(otherURL, raw, t1)
		if err == nil {
			om := ov.(model.Matrix)
			for _, s := range om {
				s.Metric["cluster"] = "gpu-a"
			}
			if diffMatrix(want, om) == "" {
				t.Logf("%s: both replicas have the same samples in the window: the comparison cannot tell them apart", when)
			}
		}
	}
	var got []model.Matrix
	for _, f := range fronts {
		var last string
		deadline := time.Now().Add(20 * time.Second)
		for {
			v, err := haQuery(f.url(), raw, t1)
			if err == nil {
				if last = diffMatrix(want, v.(model.Matrix)); last == "" {
					got = append(got, v.(model.Matrix))
					break
				}
			} else {
				last = err.Error()
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: raw samples of (%s, %s] through %s differ from the elected Prometheus' own after 20 s: %s",
					when, t1.Add(-window).Format(time.TimeOnly), t1.Format(time.TimeOnly), f.name, last)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	if d := diffMatrix(got[0], got[1]); d != "" {
		t.Errorf("%s: the two fronts answer differently: %s", when, d)
	}
	t.Logf("%s: %d series, %d samples in (%s, %s], stored once, as the elected Prometheus has them, through both fronts",
		when, len(want), wantSamples, t1.Add(-window).Format(time.TimeOnly), t1.Format(time.TimeOnly))

	for _, f := range fronts {
		if v, err := haQuery(f.url(), `{__replica__!=""}`, t1); err != nil {
			t.Fatal(err)
		} else if n := len(v.(model.Vector)); n != 0 {
			t.Errorf("%s: %s: %d series stored with the replica label", when, f.name, n)
		}
		if v, err := haQuery(f.url(), `count(DCGM_FI_DEV_GPU_TEMP)`, t1); err != nil {
			t.Fatal(err)
		} else if vec := v.(model.Vector); len(vec) != 1 || vec[0].Value != 16 {
			t.Errorf("%s: %s: count(DCGM_FI_DEV_GPU_TEMP) = %v, want 16 GPUs", when, f.name, vec)
		}
		series, err := ringSeries(f.url(), t1.Add(-window), t1)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range series {
			if strings.Contains(s, "__replica__") || !strings.Contains(s, `cluster="gpu-a"`) {
				t.Errorf("%s: %s: series %s", when, f.name, s)
				break
			}
		}
	}
	// count_over_time: one replica's samples, not two.
	expr := fmt.Sprintf(`sum(count_over_time(DCGM_FI_DEV_GPU_TEMP[%ds]))`, int(window.Seconds()))
	pc, _, err := ringQuery(electedURL, expr, t1)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fronts {
		gc, err := haQuery(f.url(), expr, t1)
		if err != nil {
			t.Fatal(err)
		}
		if canonical(gc) != canonical(pc) {
			t.Errorf("%s: %s: %s = %s, the elected Prometheus has %s", when, f.name, expr, canonical(gc), canonical(pc))
		}
	}
}

// haSumCount is sum(count_over_time(DCGM_FI_DEV_GPU_TEMP[window])) at ts
// (dedup off for gpustore).
func haSumCount(t *testing.T, base string, window time.Duration, ts time.Time, gpustore bool) float64 {
	t.Helper()
	expr := fmt.Sprintf(`sum(count_over_time(DCGM_FI_DEV_GPU_TEMP[%dms]))`, window.Milliseconds())
	var v model.Value
	var err error
	if gpustore {
		v, err = haQuery(base, expr, ts)
	} else {
		v, _, err = ringQuery(base, expr, ts)
	}
	if err != nil {
		t.Fatal(err)
	}
	vec := v.(model.Vector)
	if len(vec) != 1 {
		t.Fatalf("%s at %s: %v", expr, base, vec)
	}
	return float64(vec[0].Value)
}

// haQuery is ringQuery with query-time deduplication off (what is checked
// is what ingest stored), failing on any warning (every receiver is up).
func haQuery(base, expr string, ts time.Time) (model.Value, error) {
	q := url.Values{"dedup": {"false"}, "query": {expr}, "time": {fmt.Sprintf("%.3f", float64(ts.UnixMilli())/1000)}}
	v, ws, err := ringAPI(base + "/api/v1/query?" + q.Encode())
	if err != nil {
		return nil, err
	}
	if len(ws) > 0 {
		return nil, fmt.Errorf("%s: warnings %v", expr, ws)
	}
	return v, nil
}

// haElected is the replica a distributor's HA tracker has elected for
// cluster gpu-a ("" when none).
func haElected(base string) (string, error) {
	resp, err := http.Get(base + "/ha-tracker")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var st struct {
		Elections []struct {
			Cluster string `json:"cluster"`
			Replica string `json:"elected_replica"`
		} `json:"elections"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return "", fmt.Errorf("%s/ha-tracker: %v", base, err)
	}
	for _, e := range st.Elections {
		if e.Cluster == "gpu-a" {
			return e.Replica, nil
		}
	}
	return "", nil
}

// ---- helpers ----

// stop ends the process gracefully (SIGTERM) and waits for it to exit
// (SIGKILL and a test error after timeout): how long it took, exit code.
func (p *ringProc) stop(timeout time.Duration) (time.Duration, int) {
	p.t.Helper()
	if p.cmd == nil {
		return 0, 0
	}
	began := time.Now()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(timeout):
		p.t.Errorf("%s did not exit within %s of SIGTERM: killed", p.name, timeout)
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.exited
	}
	code := p.cmd.ProcessState.ExitCode()
	_ = p.logf.Close()
	p.cmd = nil
	return time.Since(began), code
}

// waitRingActive waits until the ring, as base sees it, is exactly ids,
// all ACTIVE.
func waitRingActive(t *testing.T, base string, ids []string, timeout time.Duration) {
	t.Helper()
	waitFor(t, timeout, fmt.Sprintf("exactly %v ACTIVE in %s's ring", ids, base), func() error {
		st, err := ringStates(base)
		if err != nil {
			return err
		}
		// A departed receiver whose removal gossip was lost (dskit's ring
		// merges by whole-second timestamps: a removal in the second of the
		// last heartbeat can be dropped) stays UNHEALTHY until auto-forget:
		// written to by nobody, skipped by reads. Anything else must be gone.
		for id, state := range st {
			if !slices.Contains(ids, id) && state != "UNHEALTHY" {
				return fmt.Errorf("ring: %v", st)
			}
		}
		for _, id := range ids {
			if st[id] != "ACTIVE" {
				return fmt.Errorf("ring: %v", st)
			}
		}
		return nil
	})
}

// ringState is an instance's state in a ring ("gone": not in it) from a
// time on.
type ringState struct {
	state string
	since time.Time
}

// watchRing polls base's ring every 50 ms and records the successive
// states of the given instances until the returned function is called.
func watchRing(base string, ids ...string) func() map[string][]ringState {
	seen := map[string][]ringState{}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if st, err := ringStates(base); err == nil {
				now := time.Now()
				for _, id := range ids {
					s, ok := st[id]
					if !ok {
						s = "gone"
					}
					if n := len(seen[id]); n == 0 || seen[id][n-1].state != s {
						seen[id] = append(seen[id], ringState{s, now})
					}
				}
			}
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return func() map[string][]ringState {
		close(stop)
		<-done
		return seen
	}
}

// leavingFor is how long states show the instance LEAVING before it went
// (0 when never seen LEAVING), and the states as text.
func leavingFor(states []ringState) (time.Duration, string) {
	var d time.Duration
	var parts []string
	for i, s := range states {
		if i > 0 {
			parts = append(parts, fmt.Sprintf("%s after %s", s.state, s.since.Sub(states[i-1].since).Round(time.Millisecond)))
		} else {
			parts = append(parts, s.state)
		}
		if s.state == "LEAVING" && i+1 < len(states) {
			d += states[i+1].since.Sub(s.since)
		}
	}
	return d, strings.Join(parts, ", ")
}

// ringLoad writes one sample per series every period (timestamps on the
// wall clock, on the period's grid) through w until finish. A refused
// write is retried with the same timestamps (as Prometheus would) for about
// 3 s (ringLoadTries); refusals are logged, samples never acknowledged fail
// the test.
const ringLoadTries = 10

type ringLoad struct {
	t    *testing.T
	w    *ringWriter
	stop chan struct{}
	done chan struct{}

	once sync.Once

	mtx     sync.Mutex
	writes  int
	retried []int64 // timestamps refused at least once, then acknowledged
	unacked []int64 // timestamps never acknowledged
	slowest time.Duration
}

func startRingLoad(t *testing.T, w *ringWriter, period time.Duration) *ringLoad {
	l := &ringLoad{t: t, w: w, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		tick := time.NewTicker(period)
		defer tick.Stop()
		step := period.Milliseconds()
		var last int64
		for {
			select {
			case <-l.stop:
				return
			case <-tick.C:
			}
			ts := max(last+step, time.Now().UnixMilli()/step*step)
			last = ts
			l.write(ts)
		}
	}()
	t.Cleanup(l.finish)
	return l
}

func (l *ringLoad) write(ts int64) {
	began := time.Now()
	ok, refused := false, false
	for try := 0; try < ringLoadTries && !ok; try++ {
		if try > 0 {
			refused = true
			time.Sleep(300 * time.Millisecond)
		}
		n := len(l.w.failures())
		l.w.send([]int64{ts})
		ok = len(l.w.failures()) == n
	}
	l.mtx.Lock()
	defer l.mtx.Unlock()
	l.writes++
	l.slowest = max(l.slowest, time.Since(began))
	switch {
	case !ok:
		l.unacked = append(l.unacked, ts)
	case refused:
		l.retried = append(l.retried, ts)
	}
}

func (l *ringLoad) finish() {
	l.once.Do(func() { close(l.stop) })
	<-l.done
}

// report logs the writes and fails the test on any sample never
// acknowledged; writes refused then acknowledged on retry are logged.
func (l *ringLoad) report() {
	l.t.Helper()
	l.mtx.Lock()
	defer l.mtx.Unlock()
	f := l.w.failures()
	l.t.Logf("%d writes of %d series, slowest (with retries) %s; %d refusals, %d writes acknowledged only on retry, %d never",
		l.writes, len(l.w.series), l.slowest.Round(time.Millisecond), len(f), len(l.retried), len(l.unacked))
	if len(f) > 0 {
		l.t.Logf("refused writes (first 10): %s", strings.Join(f[:min(10, len(f))], "\n  "))
	}
	if len(l.unacked) > 0 {
		l.t.Errorf("%d writes never acknowledged after %d tries: %v", len(l.unacked), ringLoadTries, l.unacked[:min(10, len(l.unacked))])
	}
}

// exactDiff: m holds exactly the acknowledged samples of [from, to], each
// once, by value ("" when it does). Samples refused and then acknowledged
// on retry count as acknowledged.
func (w *ringWriter) exactDiff(m model.Matrix, from, to int64) string {
	acked := w.ackedSnapshot()
	slices.Sort(acked)
	acked = slices.Compact(acked)
	// A sample sent but never acknowledged may or may not be stored.
	w.mtx.Lock()
	var unacked []int64
	for _, ts := range w.sent {
		if _, ok := slices.BinarySearch(acked, ts); !ok {
			unacked = append(unacked, ts)
		}
	}
	w.mtx.Unlock()
	if len(unacked) > 0 {
		var kept model.Matrix
		for _, s := range m {
			c := &model.SampleStream{Metric: s.Metric}
			for _, p := range s.Values {
				if !slices.Contains(unacked, int64(p.Timestamp)) {
					c.Values = append(c.Values, p)
				}
			}
			kept = append(kept, c)
		}
		m = kept
	}
	want := w.expected(acked, from, to)
	return diffMatrix(want, m)
}

// checkCount: PromQL counts every acknowledged sample once over [from, to].
func (w *ringWriter) checkCount(base string, from, to int64) {
	w.t.Helper()
	acked := w.ackedSnapshot()
	slices.Sort(acked)
	acked = slices.Compact(acked)
	n := 0
	for _, ts := range acked {
		if ts >= from && ts <= to {
			n++
		}
	}
	// Sent, never acknowledged: may or may not be stored.
	w.mtx.Lock()
	sent := slices.Compact(slices.Clone(w.sent))
	w.mtx.Unlock()
	maybe := 0
	for _, ts := range sent {
		if _, ok := slices.BinarySearch(acked, ts); !ok && ts >= from && ts <= to {
			maybe++
		}
	}
	expr := fmt.Sprintf(`sum(count_over_time(DCGM_FI_DEV_GPU_TEMP[%[1]dms])) + sum(count_over_time(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[%[1]dms]))`, to-from+1)
	v, _, err := ringQuery(base, expr, time.UnixMilli(to))
	if err != nil {
		w.t.Fatal(err)
	}
	if vec := v.(model.Vector); len(vec) != 1 || int(vec[0].Value) < n*len(w.series) || int(vec[0].Value) > (n+maybe)*len(w.series) {
		w.t.Errorf("sum(count_over_time) = %v, want %d (%d series × %d acknowledged timestamps, + up to %d sent but never acknowledged)", vec, n*len(w.series), len(w.series), n, maybe)
	} else {
		w.t.Logf("%d acknowledged samples read back exactly once over %s", n*len(w.series), time.Duration(to-from)*time.Millisecond)
	}
}

// ringQueryLoop queries the raw samples of the last span (from start at
// the earliest) through base in a loop, and checks every answer: success,
// complete for what was acknowledged before the query started, no warning
// but a receiver unavailable.
type ringQueryLoop struct {
	t    *testing.T
	stop chan struct{}
	done chan struct{}
	once sync.Once

	mtx        sync.Mutex
	queries    int
	warned     int
	warnings   map[string]int // by receiver
	failures   []string       // error answers
	badWarns   []string       // warnings not of the documented kind
	incomplete []string       // answers missing acknowledged samples
}

var unavailableWarning = regexp.MustCompile(`^receiver (\S+) \(\S+\) unavailable: `)

func startRingQueryLoop(t *testing.T, base string, w *ringWriter, start int64, span time.Duration) *ringQueryLoop {
	l := &ringQueryLoop{t: t, stop: make(chan struct{}), done: make(chan struct{}), warnings: map[string]int{}}
	go func() {
		defer close(l.done)
		for {
			select {
			case <-l.stop:
				return
			case <-time.After(400 * time.Millisecond):
			}
			acked := w.ackedSnapshot()
			q := time.Now()
			from := max(start, q.Add(-span).UnixMilli())
			v, ws, err := ringQuery(base, ringRawExpr(from, q.UnixMilli()), q)
			l.mtx.Lock()
			l.queries++
			at := q.Format("15:04:05.000")
			if err != nil {
				l.failures = append(l.failures, fmt.Sprintf("%s: %v (warnings %v)", at, err, ws))
				l.mtx.Unlock()
				continue
			}
			if len(ws) > 0 {
				l.warned++
			}
			for _, wn := range ws {
				if m := unavailableWarning.FindStringSubmatch(wn); m != nil {
					l.warnings[m[1]]++
				} else {
					l.badWarns = append(l.badWarns, at+": "+wn)
				}
			}
			if d := missingAcked(w, v.(model.Matrix), acked, from, q); d != "" {
				l.incomplete = append(l.incomplete, fmt.Sprintf("%s (warnings %v): %s", at, ws, d))
			}
			l.mtx.Unlock()
		}
	}()
	t.Cleanup(l.finish)
	return l
}

func (l *ringQueryLoop) finish() {
	l.once.Do(func() { close(l.stop) })
	<-l.done
}

func (l *ringQueryLoop) report() {
	l.t.Helper()
	l.mtx.Lock()
	defer l.mtx.Unlock()
	l.t.Logf("%d queries during the restarts: %d with warnings (receiver unavailable: %v), %d errors, %d other warnings, %d incomplete",
		l.queries, l.warned, l.warnings, len(l.failures), len(l.badWarns), len(l.incomplete))
	if len(l.failures) > 0 {
		l.t.Errorf("%d queries failed during the rolling restart, e.g.\n  %s", len(l.failures), strings.Join(l.failures[:min(5, len(l.failures))], "\n  "))
	}
	if len(l.badWarns) > 0 {
		l.t.Errorf("%d warnings other than a receiver unavailable, e.g.\n  %s", len(l.badWarns), strings.Join(l.badWarns[:min(5, len(l.badWarns))], "\n  "))
	}
	if len(l.incomplete) > 0 {
		l.t.Errorf("%d answers missed acknowledged samples, e.g.\n  %s", len(l.incomplete), strings.Join(l.incomplete[:min(5, len(l.incomplete))], "\n  "))
	}
	if l.queries < 10 {
		l.t.Errorf("only %d queries ran during the restarts", l.queries)
	}
}

// missingAcked describes the samples acknowledged with timestamps in
// [from, q] that m lacks or has with another value, and the samples m has
// that were never sent ("" when none).
func missingAcked(w *ringWriter, m model.Matrix, acked []int64, from int64, q time.Time) string {
	got := map[string]map[model.Time]model.SampleValue{}
	var invented []string
	for _, s := range m {
		pts := map[model.Time]model.SampleValue{}
		for _, p := range s.Values {
			if !w.wasSent(int64(p.Timestamp)) && len(invented) < 3 {
				invented = append(invented, fmt.Sprintf("%s@%d", s.Metric, p.Timestamp))
			}
			pts[p.Timestamp] = p.Value
		}
		got[s.Metric.String()] = pts
	}
	var missing int
	var ages []string
	for i, s := range w.series {
		k := ringMetricKey(s.Labels)
		for _, ts := range acked {
			if ts < from || ts > q.UnixMilli() {
				continue
			}
			if v, ok := got[k][model.Time(ts)]; !ok || float64(v) != gpuValue(i, ts) {
				missing++
				if len(ages) < 5 {
					ages = append(ages, fmt.Sprintf("%s@%d (%s old, present %v)", k, ts, q.Sub(time.UnixMilli(ts)).Round(time.Millisecond), ok))
				}
			}
		}
	}
	if missing == 0 && len(invented) == 0 {
		return ""
	}
	sort.Strings(ages)
	return fmt.Sprintf("%d acknowledged samples missing or wrong, e.g. %v; never sent: %v", missing, ages, invented)
}
