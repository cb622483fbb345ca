package gpusim

import (
	"math"
	"testing"
	"time"

	"github.com/golang/snappy"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
)

var testExternal = []Label{{"cluster", "gpu-cluster-prod-01"}, {"__replica__", "p1"}}

// want returns a series' labels merged with the external labels, sorted.
func withExternal(ls []Label) labels.Labels {
	b := labels.NewScratchBuilder(len(ls) + 2)
	seen := map[string]bool{}
	for _, l := range ls {
		b.Add(l.Name, l.Value)
		seen[l.Name] = true
	}
	for _, l := range testExternal {
		if !seen[l.Name] {
			b.Add(l.Name, l.Value)
		}
	}
	b.Sort()
	return b.Labels()
}

func testBatch(t testing.TB) []Series {
	c := newTestCluster(t, Config{Nodes: 16, Seed: 8, TargetLabels: true, FaultOrigin: t0,
		Faults: []Fault{{Kind: FaultNaNLoss, At: 0, Duration: time.Hour, Node: "0"}, {Kind: FaultNaNLoss, At: 0, Duration: time.Hour, Node: "1"}}})
	return c.AppendSamples(nil, t0.Add(30*time.Minute), Replica{Name: "p1", Offset: 250 * time.Millisecond})
}

func sameFloat(a, b float64) bool {
	return math.Float64bits(a) == math.Float64bits(b) || (math.IsNaN(a) && math.IsNaN(b))
}

func TestEncodeV1Decodes(t *testing.T) {
	series := testBatch(t)
	enc := NewEncoder(testExternal)
	for _, n := range []int{1, 7, len(series)} { // reuse the encoder across sizes
		body := enc.EncodeV1(series[:n])
		raw, err := snappy.Decode(nil, body)
		if err != nil {
			t.Fatalf("snappy: %v", err)
		}
		var req prompb.WriteRequest
		if err := req.Unmarshal(raw); err != nil {
			t.Fatalf("unmarshal prompb.WriteRequest: %v", err)
		}
		if len(req.Timeseries) != n {
			t.Fatalf("%d timeseries, want %d", len(req.Timeseries), n)
		}
		b := labels.NewScratchBuilder(0)
		for i, ts := range req.Timeseries {
			got, want := ts.ToLabels(&b, nil), withExternal(series[i].Labels)
			if !labels.Equal(got, want) {
				t.Fatalf("series %d labels\n got %s\nwant %s", i, got, want)
			}
			if len(ts.Samples) != 1 || ts.Samples[0].Timestamp != series[i].T || !sameFloat(ts.Samples[0].Value, series[i].V) {
				t.Fatalf("series %d sample %+v, want %v@%d", i, ts.Samples, series[i].V, series[i].T)
			}
		}
	}
	// Metadata-only request.
	raw, err := snappy.Decode(nil, enc.EncodeV1Metadata([]*MetricDesc{&Catalogue[FamTotalEnergy], &Catalogue[FamTrainIterTime]}))
	if err != nil {
		t.Fatal(err)
	}
	var req prompb.WriteRequest
	if err := req.Unmarshal(raw); err != nil {
		t.Fatal(err)
	}
	if len(req.Metadata) != 2 || req.Metadata[0].Type != prompb.MetricMetadata_COUNTER || req.Metadata[0].MetricFamilyName != "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" ||
		req.Metadata[1].Type != prompb.MetricMetadata_HISTOGRAM || req.Metadata[1].Help != "Time per training iteration" {
		t.Errorf("metadata %+v", req.Metadata)
	}
}

func TestEncodeV2Decodes(t *testing.T) {
	series := testBatch(t)
	enc := NewEncoder(testExternal)
	for _, n := range []int{3, len(series)} {
		raw, err := snappy.Decode(nil, enc.EncodeV2(series[:n]))
		if err != nil {
			t.Fatalf("snappy: %v", err)
		}
		var req writev2.Request
		if err := req.Unmarshal(raw); err != nil {
			t.Fatalf("unmarshal writev2.Request: %v", err)
		}
		if len(req.Symbols) == 0 || req.Symbols[0] != "" {
			t.Fatalf("symbol table must start with \"\": %q", req.Symbols[:min(3, len(req.Symbols))])
		}
		if len(req.Timeseries) != n {
			t.Fatalf("%d timeseries, want %d", len(req.Timeseries), n)
		}
		b := labels.NewScratchBuilder(0)
		nan := 0
		for i, ts := range req.Timeseries {
			got, err := ts.ToLabels(&b, req.Symbols)
			if err != nil {
				t.Fatal(err)
			}
			if want := withExternal(series[i].Labels); !labels.Equal(got, want) {
				t.Fatalf("series %d labels\n got %s\nwant %s", i, got, want)
			}
			if len(ts.Samples) != 1 || ts.Samples[0].Timestamp != series[i].T || !sameFloat(ts.Samples[0].Value, series[i].V) {
				t.Fatalf("series %d sample %+v, want %v@%d", i, ts.Samples, series[i].V, series[i].T)
			}
			if math.IsNaN(ts.Samples[0].Value) {
				nan++
			}
			md, err := ts.ToMetadata(req.Symbols)
			if err != nil {
				t.Fatal(err)
			}
			if string(md.Type) != series[i].Desc.Type.String() || md.Help != series[i].Desc.Help {
				t.Fatalf("series %d (%s) metadata %+v, want %s %q", i, series[i].Name(), md, series[i].Desc.Type, series[i].Desc.Help)
			}
		}
		if n == len(series) && nan == 0 {
			t.Errorf("NaN loss did not survive encoding")
		}
	}
}

func TestEncodeSteadyStateAllocs(t *testing.T) {
	series := testBatch(t)
	series = series[:min(2000, len(series))]
	enc := NewEncoder(testExternal)
	enc.EncodeV1(series)
	enc.EncodeV2(series)
	if a := testing.AllocsPerRun(20, func() { enc.EncodeV1(series) }); a > 0 {
		t.Errorf("EncodeV1 allocates %v times per call in steady state", a)
	}
	if a := testing.AllocsPerRun(20, func() { enc.EncodeV2(series) }); a > 0 {
		t.Errorf("EncodeV2 allocates %v times per call in steady state", a)
	}
}
