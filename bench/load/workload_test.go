package load

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/golang/snappy"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"

	"github.com/gpustore/gpustore/bench/gpusim"
)

var testStart = time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)

func smallWorkload() Workload {
	return Workload{
		Cluster: gpusim.Config{Name: "test", Nodes: 2, Seed: 3, TargetLabels: true},
		Start:   testStart, Ticks: 6, Interval: 15 * time.Second, MaxSamplesPerSend: 300, Shards: 3,
	}
}

func decodeV1(t testing.TB, body []byte) *prompb.WriteRequest {
	t.Helper()
	raw, err := snappy.Decode(nil, body)
	if err != nil {
		t.Fatal(err)
	}
	var wr prompb.WriteRequest
	if err := wr.Unmarshal(raw); err != nil {
		t.Fatal(err)
	}
	return &wr
}

func seriesKey(ls []prompb.Label) string {
	b := labels.NewScratchBuilder(len(ls))
	for _, l := range ls {
		b.Add(l.Name, l.Value)
	}
	b.Sort()
	return b.Labels().String()
}

func TestPlanShardsSeriesInTimeOrder(t *testing.T) {
	p, err := BuildPlan(context.Background(), smallWorkload())
	if err != nil {
		t.Fatal(err)
	}
	// What the simulator produces for those ticks.
	cl, _ := gpusim.New(p.Workload.Cluster)
	var want int64
	for i := 0; i < p.Workload.Ticks; i++ {
		want += int64(len(cl.AppendSamples(nil, testStart.Add(time.Duration(i)*15*time.Second), gpusim.Replica{Name: "p0"})))
	}
	if p.Stats.Samples != want {
		t.Fatalf("plan has %d samples; the simulator made %d", p.Stats.Samples, want)
	}
	shardOf := map[string]int{}
	last := map[string]int64{}
	var n int64
	for sh, reqs := range p.Shards {
		for _, r := range reqs {
			wr := decodeV1(t, r.Body)
			if len(wr.Timeseries) != r.Samples || r.Samples > 300 {
				t.Fatalf("request says %d samples, holds %d", r.Samples, len(wr.Timeseries))
			}
			for _, ts := range wr.Timeseries {
				k := seriesKey(ts.Labels)
				if prev, ok := shardOf[k]; ok && prev != sh {
					t.Fatalf("series %s in shards %d and %d", k, prev, sh)
				}
				shardOf[k] = sh
				for _, s := range ts.Samples {
					if s.Timestamp <= last[k] {
						t.Fatalf("series %s: sample at %d after %d", k, s.Timestamp, last[k])
					}
					if s.Timestamp < r.MinT || s.Timestamp > r.MaxT {
						t.Fatalf("sample at %d outside request bounds [%d, %d]", s.Timestamp, r.MinT, r.MaxT)
					}
					last[k] = s.Timestamp
					n++
				}
				if !bytes.Contains([]byte(k), []byte(`cluster="test"`)) {
					t.Fatalf("series %s lacks the cluster external label", k)
				}
			}
		}
	}
	if n != want || len(shardOf) != p.Stats.Series {
		t.Fatalf("decoded %d samples of %d series; plan says %d of %d", n, len(shardOf), want, p.Stats.Series)
	}
	if p.Stats.MinT != testStart.UnixMilli() || p.Stats.MaxT != p.Workload.End().UnixMilli() {
		t.Fatalf("time range [%d, %d]", p.Stats.MinT, p.Stats.MaxT)
	}
}

// Every system of a comparison must get the same bytes: equal workloads give
// equal plans, and a stream gives what a plan holds.
func TestPlanDeterministicAndStreamEqual(t *testing.T) {
	ctx := context.Background()
	a, err := BuildPlan(ctx, smallWorkload())
	if err != nil {
		t.Fatal(err)
	}
	b, err := BuildPlan(ctx, smallWorkload())
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewStream(ctx, smallWorkload())
	if err != nil {
		t.Fatal(err)
	}
	for sh := range a.Shards {
		if len(a.Shards[sh]) != len(b.Shards[sh]) {
			t.Fatalf("shard %d: %d vs %d requests", sh, len(a.Shards[sh]), len(b.Shards[sh]))
		}
		for i := range a.Shards[sh] {
			if !bytes.Equal(a.Shards[sh][i].Body, b.Shards[sh][i].Body) {
				t.Fatalf("shard %d request %d differs between two builds", sh, i)
			}
		}
	}
	// Drain the stream shard by shard concurrently (its generator blocks on
	// any full shard queue).
	got := make([][]Request, s.NumShards())
	done := make(chan int)
	for sh := 0; sh < s.NumShards(); sh++ {
		go func(sh int) {
			for {
				r, ok := s.Next(ctx, sh)
				if !ok {
					break
				}
				got[sh] = append(got[sh], r)
			}
			done <- sh
		}(sh)
	}
	for range got {
		<-done
	}
	st, err := s.Stats()
	if err != nil || st.Samples != a.Stats.Samples {
		t.Fatalf("stream stats %+v, %v; plan has %d samples", st, err, a.Stats.Samples)
	}
	for sh := range a.Shards {
		if len(got[sh]) != len(a.Shards[sh]) {
			t.Fatalf("shard %d: stream %d, plan %d requests", sh, len(got[sh]), len(a.Shards[sh]))
		}
		for i := range got[sh] {
			if !bytes.Equal(got[sh][i].Body, a.Shards[sh][i].Body) {
				t.Fatalf("shard %d request %d differs between stream and plan", sh, i)
			}
		}
	}
}

func TestWorkloadValidation(t *testing.T) {
	if _, err := BuildPlan(context.Background(), Workload{Start: testStart}); err == nil {
		t.Error("no ticks: want an error")
	}
	w := smallWorkload()
	w.Protocol = "3.0"
	if _, err := BuildPlan(context.Background(), w); err == nil {
		t.Error("protocol 3.0: want an error")
	}
}

// TestNewClusterEachTick: every sample of a churn workload is a series of
// its own, the tick's cluster label tells them apart, and Stats counts them.
func TestNewClusterEachTick(t *testing.T) {
	w := smallWorkload()
	w.NewClusterEachTick = true
	p, err := BuildPlan(context.Background(), w)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	clusters := map[string]bool{}
	for _, reqs := range p.Shards {
		for _, r := range reqs {
			for _, ts := range decodeV1(t, r.Body).Timeseries {
				k := seriesKey(ts.Labels)
				if seen[k] || len(ts.Samples) != 1 {
					t.Fatalf("series %s seen again (%d samples)", k, len(ts.Samples))
				}
				seen[k] = true
				for _, l := range ts.Labels {
					if l.Name == "cluster" {
						clusters[l.Value] = true
					}
				}
			}
		}
	}
	if int64(len(seen)) != p.Stats.Samples || p.Stats.Series != len(seen) {
		t.Errorf("%d distinct series, %d samples, Stats.Series %d: want all equal", len(seen), p.Stats.Samples, p.Stats.Series)
	}
	if len(clusters) != w.Ticks || !clusters["test-00000"] || !clusters["test-00005"] {
		t.Errorf("clusters %v, want test-00000 … test-00005", clusters)
	}
}
