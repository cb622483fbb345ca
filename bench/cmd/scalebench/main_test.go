package main

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/prompb"
)

// decode unmarshals a batch's body as a receiver would.
func decode(t *testing.T, b *batch) prompb.WriteRequest {
	t.Helper()
	var wr prompb.WriteRequest
	if err := wr.Unmarshal(b.body); err != nil {
		t.Fatalf("the batch is not a valid WriteRequest: %v", err)
	}
	if len(wr.Timeseries) != b.n {
		t.Fatalf("%d series decoded, want %d", len(wr.Timeseries), b.n)
	}
	return wr
}

// The hand-written protobuf must decode to sorted gpusim labels plus the
// copy's cluster label, one sample each with the patched value and time, and
// churn must give the pod-labelled series new pod values and nothing else.
func TestSeriesEncodeDecode(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 2, 0, 0, 0, time.UTC)
	o := options{nodes: 2, nodeCPUs: 4, batch: 500, interval: 15 * time.Second, churnPerHour: 240}
	set, err := buildSeries(o, 3000, t0)
	if err != nil {
		t.Fatal(err)
	}
	if len(set.series) != 3000 || set.withPod == 0 {
		t.Fatalf("%d series, %d with a pod label", len(set.series), set.withPod)
	}
	tms := t0.Add(3 * o.interval).UnixMilli()
	seen := map[string]bool{}
	for _, b := range set.batches {
		patch(b, set, tms, 3)
		wr := decode(t, b)
		for j, ts := range wr.Timeseries {
			s := set.series[b.first+j]
			names := make([]string, len(ts.Labels))
			cluster := ""
			for k, l := range ts.Labels {
				names[k] = l.Name
				if l.Name == "cluster" {
					cluster = l.Value
				}
			}
			if !slices.IsSorted(names) {
				t.Fatalf("labels not sorted: %v", names)
			}
			if len(ts.Labels) != len(set.one[s.src].Labels)+1 || !strings.HasPrefix(cluster, "scale-") {
				t.Fatalf("labels %v: want gpusim's and a cluster label", ts.Labels)
			}
			if len(ts.Samples) != 1 || ts.Samples[0].Timestamp != tms {
				t.Fatalf("samples %v, want one at %d", ts.Samples, tms)
			}
			if s.inc > 0 && ts.Samples[0].Value != s.v0+3*s.inc {
				t.Fatalf("counter value %v, want %v", ts.Samples[0].Value, s.v0+3*s.inc)
			}
			key := ts.String()
			if seen[key] {
				t.Fatalf("series %s twice", key)
			}
			seen[key] = true
		}
	}
	d := &driver{o: o, set: set, active: len(set.batches)}
	if n := d.churn(1); n == 0 {
		t.Fatal("churn replaced no series")
	}
	churned := 0
	for _, b := range set.batches {
		for j, ts := range decode(t, b).Timeseries {
			s := set.series[b.first+j]
			for _, l := range ts.Labels {
				if l.Name == "pod" && strings.HasSuffix(l.Value, "-g1") {
					churned++
					if s.gen != 1 || int(s.podIdx) < 0 {
						t.Fatalf("series %d churned without a pod label or generation", b.first+j)
					}
				}
			}
		}
	}
	if churned == 0 {
		t.Fatal("no pod label changed in the encoded batches")
	}
}
