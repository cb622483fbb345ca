package ingest

import (
	"bytes"
	"testing"

	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
)

// The fuzz targets check that the hand-written decoders never panic and that,
// whenever the generated protobuf code accepts a body, they see exactly the
// same labels and samples.

func seedV1(f *testing.F) {
	for _, req := range []*prompb.WriteRequest{
		{},
		{Timeseries: []prompb.TimeSeries{v1Series([]prompb.Sample{{Timestamp: 1, Value: 2}}, "__name__", "a", "gpu", "0")}},
		{Timeseries: []prompb.TimeSeries{
			v1Series([]prompb.Sample{{Timestamp: 1, Value: 2}, {Timestamp: 3, Value: 4}}, "__name__", "DCGM_FI_DEV_GPU_TEMP", "Hostname", "n1", "UUID", "GPU-abc"),
			v1Series(nil, "__name__", "b"),
		}, Metadata: []prompb.MetricMetadata{{MetricFamilyName: "a", Type: prompb.MetricMetadata_GAUGE, Help: "h"}}},
	} {
		b, _ := req.Marshal()
		f.Add(b)
	}
	f.Add([]byte{0x0a, 0xff})
}

func FuzzDecodeV1(f *testing.F) {
	seedV1(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		d := newV1Decoder()
		d.reset(body)
		var got []prompb.TimeSeries
		for d.next() {
			s := d.series()
			ts := prompb.TimeSeries{}
			for _, l := range s.labels {
				ts.Labels = append(ts.Labels, prompb.Label{Name: string(l.name), Value: string(l.value)})
			}
			for _, smp := range s.samples {
				ts.Samples = append(ts.Samples, prompb.Sample{Timestamp: smp.t, Value: smp.v})
			}
			got = append(got, ts)
		}
		var want prompb.WriteRequest
		if err := want.Unmarshal(body); err != nil {
			return // ours may accept more (unknown fields); it must only not panic
		}
		if d.err() != nil {
			// The generated code accepted what we rejected: only acceptable
			// for a malformed sub-message ours validates more strictly.
			return
		}
		if len(got) != len(want.Timeseries) {
			t.Fatalf("decoded %d series, generated code %d", len(got), len(want.Timeseries))
		}
		for i := range got {
			if !equalV1(got[i], want.Timeseries[i]) {
				t.Fatalf("series %d: %v != %v", i, got[i], want.Timeseries[i])
			}
		}
	})
}

func equalV1(a, b prompb.TimeSeries) bool {
	if len(a.Labels) != len(b.Labels) || len(a.Samples) != len(b.Samples) {
		return false
	}
	for i := range a.Labels {
		if a.Labels[i].Name != b.Labels[i].Name || a.Labels[i].Value != b.Labels[i].Value {
			return false
		}
	}
	for i := range a.Samples {
		x, y := a.Samples[i], b.Samples[i]
		if x.Timestamp != y.Timestamp || !(x.Value == y.Value || x.Value != x.Value && y.Value != y.Value) {
			return false
		}
	}
	return true
}

func FuzzDecodeV2(f *testing.F) {
	b := newV2Builder()
	b.add(writev2.TimeSeries{Samples: []writev2.Sample{{Value: 1, Timestamp: 2, StartTimestamp: 1}},
		Metadata: writev2.Metadata{Type: writev2.Metadata_METRIC_TYPE_GAUGE, HelpRef: b.ref("help")}}, "__name__", "a", "gpu", "0")
	b.add(writev2.TimeSeries{Samples: []writev2.Sample{{Value: 3, Timestamp: 4}}}, "__name__", "b")
	raw, _ := b.build().Marshal()
	f.Add(raw)
	f.Add([]byte{})
	f.Add([]byte{0x2a, 0x02, 0x0a, 0x00})
	f.Fuzz(func(t *testing.T, body []byte) {
		d := newV2Decoder()
		d.reset(body)
		var got [][]labelPair
		var samples [][]sample
		for d.next() {
			s := d.series()
			got = append(got, append([]labelPair(nil), s.labels...))
			samples = append(samples, append([]sample(nil), s.samples...))
		}
		var want writev2.Request
		if err := want.Unmarshal(body); err != nil || d.err() != nil {
			return
		}
		if len(got) != len(want.Timeseries) {
			t.Fatalf("decoded %d series, generated code %d", len(got), len(want.Timeseries))
		}
		for i, ts := range want.Timeseries {
			if len(ts.LabelsRefs) != 2*len(got[i]) {
				t.Fatalf("series %d: %d refs, %d pairs", i, len(ts.LabelsRefs), len(got[i]))
			}
			for j, p := range got[i] {
				if !bytes.Equal(p.name, []byte(want.Symbols[ts.LabelsRefs[2*j]])) || !bytes.Equal(p.value, []byte(want.Symbols[ts.LabelsRefs[2*j+1]])) {
					t.Fatalf("series %d label %d differs", i, j)
				}
			}
			if len(ts.Samples) != len(samples[i]) {
				t.Fatalf("series %d: %d samples, want %d", i, len(samples[i]), len(ts.Samples))
			}
			for j, s := range ts.Samples {
				g := samples[i][j]
				if g.t != s.Timestamp || g.st != s.StartTimestamp || !(g.v == s.Value || g.v != g.v && s.Value != s.Value) {
					t.Fatalf("series %d sample %d: %+v != %+v", i, j, g, s)
				}
			}
		}
	})
}
