package ingest

import (
	"bytes"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/model/exemplar"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
	"github.com/prometheus/prometheus/tsdb/tsdbutil"
)

// The fuzz targets feed one body to gpustore's decoders, together with the
// write path's own decoding of histograms, exemplars and metadata, and to
// the generated protobuf code that Prometheus' receiver uses. Both must
// accept it or both reject it, except for the input classes decode.go names
// as stricter; and what both accept must be equal: labels, samples (with
// start timestamps), histograms, exemplars and metadata.

// stricterClasses are the errors of the input classes where gpustore rejects
// what the generated code accepts (see decode.go).
var stricterClasses = []string{
	"variable length integer overflow", // non-canonical tenth varint byte
	"invalid field number",             // field number above 2^31-1
	"mismatching end group marker",     // group ends with another field's marker
	"parse error",                      // groups nested deeper than protowire's limit
	"out of range (table has",          // 2.0 symbol reference outside the table
	"odd number of labels_refs",        // 2.0 label references that do not pair up
	"runs past the field's end",        // 2.0 packed varint cut by its field's end
	"body sent with the",               // a body of the other protocol version
}

// checkAgreement fails unless both decoders accept, both reject, or gpustore
// rejects with one of the stricter classes.
func checkAgreement(t *testing.T, ours, generated error) {
	t.Helper()
	switch {
	case ours == nil && generated != nil:
		t.Fatalf("gpustore accepts what the generated code rejects: %v", generated)
	case ours != nil && generated == nil:
		for _, c := range stricterClasses {
			if strings.Contains(ours.Error(), c) {
				return
			}
		}
		t.Fatalf("gpustore rejects what the generated code accepts (a valid write would be answered 400): %v", ours)
	}
}

// fuzzSeries is one decoded series in a form both decoders can be compared in.
type fuzzSeries struct {
	labels     []string // name, value, name, value…
	samples    []sample
	histograms [][]byte // the Histogram message, re-marshalled by the generated code
	exemplars  []exemplar.Exemplar
	meta       [3]string // type, help, unit; all empty when absent
}

func (s fuzzSeries) equal(o fuzzSeries) error {
	if fmt.Sprint(s.labels) != fmt.Sprint(o.labels) {
		return fmt.Errorf("labels %q != %q", s.labels, o.labels)
	}
	if len(s.samples) != len(o.samples) {
		return fmt.Errorf("%d samples != %d", len(s.samples), len(o.samples))
	}
	for i, a := range s.samples {
		b := o.samples[i]
		if a.t != b.t || a.st != b.st || math.Float64bits(a.v) != math.Float64bits(b.v) {
			return fmt.Errorf("sample %d: %+v != %+v", i, a, b)
		}
	}
	if len(s.histograms) != len(o.histograms) {
		return fmt.Errorf("%d histograms != %d", len(s.histograms), len(o.histograms))
	}
	for i := range s.histograms {
		if !bytes.Equal(s.histograms[i], o.histograms[i]) {
			return fmt.Errorf("histogram %d differs", i)
		}
	}
	if len(s.exemplars) != len(o.exemplars) {
		return fmt.Errorf("%d exemplars != %d", len(s.exemplars), len(o.exemplars))
	}
	for i, a := range s.exemplars {
		b := o.exemplars[i]
		if !labels.Equal(a.Labels, b.Labels) || math.Float64bits(a.Value) != math.Float64bits(b.Value) || a.Ts != b.Ts || a.HasTs != b.HasTs {
			return fmt.Errorf("exemplar %d: %v != %v", i, a, b)
		}
	}
	if s.meta != o.meta {
		return fmt.Errorf("metadata %q != %q", s.meta, o.meta)
	}
	return nil
}

func compareSeries(t *testing.T, ours, generated []fuzzSeries) {
	t.Helper()
	if len(ours) != len(generated) {
		t.Fatalf("gpustore decoded %d series, the generated code %d", len(ours), len(generated))
	}
	for i := range ours {
		if err := ours[i].equal(generated[i]); err != nil {
			t.Fatalf("series %d: gpustore's != the generated code's: %v", i, err)
		}
	}
}

func marshalled(m interface{ Marshal() ([]byte, error) }) []byte {
	b, err := m.Marshal()
	if err != nil {
		panic(err)
	}
	return b
}

// oursV1 decodes a 1.0 body as the write path does.
func oursV1(body []byte) (series []fuzzSeries, metadata [][]byte, err error) {
	d := newV1Decoder()
	d.reset(body)
	ac := appendCtx{builder: labels.NewScratchBuilder(0)}
	for d.next() {
		s := d.series()
		var fs fuzzSeries
		for _, p := range s.labels {
			fs.labels = append(fs.labels, string(p.name), string(p.value))
		}
		for _, smp := range s.samples {
			if smp.st != 0 {
				return nil, nil, fmt.Errorf("start timestamp in a 1.0 sample")
			}
		}
		fs.samples = append(fs.samples, s.samples...)
		for _, raw := range s.histograms {
			if _, _, _, _, err := decodeHistogram(&ac, raw, false); err != nil {
				return nil, nil, err
			}
			fs.histograms = append(fs.histograms, marshalled(&ac.v1hist))
		}
		for _, raw := range s.exemplars {
			e, err := decodeExemplar(&ac, raw, nil)
			if err != nil {
				return nil, nil, err
			}
			fs.exemplars = append(fs.exemplars, e)
		}
		series = append(series, fs)
	}
	if err := d.err(); err != nil {
		return nil, nil, err
	}
	for _, raw := range d.metadata {
		ac.v1meta.Reset()
		if err := ac.v1meta.Unmarshal(raw); err != nil {
			return nil, nil, err
		}
		metadata = append(metadata, marshalled(&ac.v1meta))
	}
	return series, metadata, nil
}

func generatedV1(req *prompb.WriteRequest) (series []fuzzSeries, metadata [][]byte) {
	b := labels.NewScratchBuilder(0)
	for _, ts := range req.Timeseries {
		var fs fuzzSeries
		for _, l := range ts.Labels {
			fs.labels = append(fs.labels, l.Name, l.Value)
		}
		for _, s := range ts.Samples {
			fs.samples = append(fs.samples, sample{t: s.Timestamp, v: s.Value})
		}
		for i := range ts.Histograms {
			fs.histograms = append(fs.histograms, marshalled(&ts.Histograms[i]))
		}
		for _, e := range ts.Exemplars {
			fs.exemplars = append(fs.exemplars, e.ToExemplar(&b, nil))
		}
		series = append(series, fs)
	}
	for i := range req.Metadata {
		metadata = append(metadata, marshalled(&req.Metadata[i]))
	}
	return series, metadata
}

func seedV1(f *testing.F) {
	h := prompb.FromIntHistogram(1000, tsdbutil.GenerateTestHistogram(1))
	fh := prompb.FromFloatHistogram(2000, tsdbutil.GenerateTestFloatHistogram(2))
	withAll := v1Series([]prompb.Sample{{Timestamp: 1, Value: math.NaN()}}, "__name__", "training_step_seconds", "rank", "0")
	withAll.Histograms = []prompb.Histogram{h, fh}
	withAll.Exemplars = []prompb.Exemplar{{Labels: []prompb.Label{{Name: "trace_id", Value: "abc"}}, Value: 2, Timestamp: 3}}
	for _, req := range []*prompb.WriteRequest{
		{},
		{Timeseries: []prompb.TimeSeries{v1Series([]prompb.Sample{{Timestamp: 1, Value: 2}}, "__name__", "a", "gpu", "0")}},
		{Timeseries: []prompb.TimeSeries{
			v1Series([]prompb.Sample{{Timestamp: 1, Value: 2}, {Timestamp: 3, Value: 4}}, "__name__", "DCGM_FI_DEV_GPU_TEMP", "Hostname", "n1", "UUID", "GPU-abc"),
			v1Series(nil, "__name__", "b"),
			withAll,
		}, Metadata: []prompb.MetricMetadata{{MetricFamilyName: "a", Type: prompb.MetricMetadata_GAUGE, Help: "h", Unit: "u"}}},
	} {
		f.Add(marshalled(req))
	}
	f.Add([]byte{0x0a, 0xff})
	f.Add([]byte{0x0a, 0x04, 0x12, 0x02, 0x09, 0x00}) // a sample whose value has the wrong wire type
	f.Add([]byte{0x0b, 0x0c})                         // an empty group
}

func FuzzDecodeV1(f *testing.F) {
	seedV1(f)
	seedV2(f) // 2.0 bodies sent with the 1.0 type
	f.Fuzz(func(t *testing.T, body []byte) {
		series, metadata, err := oursV1(body)
		var req prompb.WriteRequest
		genErr := req.Unmarshal(body)
		checkAgreement(t, err, genErr)
		if err != nil || genErr != nil {
			return
		}
		wantSeries, wantMetadata := generatedV1(&req)
		compareSeries(t, series, wantSeries)
		if len(metadata) != len(wantMetadata) {
			t.Fatalf("%d metadata, generated code %d", len(metadata), len(wantMetadata))
		}
		for i := range metadata {
			if !bytes.Equal(metadata[i], wantMetadata[i]) {
				t.Fatalf("metadata %d differs", i)
			}
		}
	})
}

// oursV2 decodes a 2.0 body as the write path does.
func oursV2(body []byte) ([]fuzzSeries, error) {
	d := newV2Decoder()
	d.reset(body)
	ac := appendCtx{builder: labels.NewScratchBuilder(0)}
	var out []fuzzSeries
	for d.next() {
		s := d.series()
		var fs fuzzSeries
		for _, p := range s.labels {
			fs.labels = append(fs.labels, string(p.name), string(p.value))
		}
		fs.samples = append(fs.samples, s.samples...)
		for _, raw := range s.histograms {
			if _, _, _, _, err := decodeHistogram(&ac, raw, true); err != nil {
				return nil, err
			}
			fs.histograms = append(fs.histograms, marshalled(&ac.v2hist))
		}
		for _, raw := range s.exemplars {
			e, err := decodeExemplar(&ac, raw, d)
			if err != nil {
				return nil, err
			}
			fs.exemplars = append(fs.exemplars, e)
		}
		// The generated code cannot tell a metadata message of zeros from
		// none: compare those as absent.
		if m := s.meta; m.set && (m.typ != 0 || m.helpRef != 0 || m.unitRef != 0) {
			fs.meta = [3]string{fmt.Sprint(m.typ), string(m.help), string(m.unit)}
		}
		out = append(out, fs)
	}
	return out, d.err()
}

func generatedV2(req *writev2.Request) []fuzzSeries {
	sym := func(ref uint32) string {
		if ref == 0 && len(req.Symbols) == 0 {
			return ""
		}
		return req.Symbols[ref]
	}
	b := labels.NewScratchBuilder(0)
	var out []fuzzSeries
	for _, ts := range req.Timeseries {
		var fs fuzzSeries
		for _, ref := range ts.LabelsRefs {
			fs.labels = append(fs.labels, sym(ref))
		}
		for _, s := range ts.Samples {
			fs.samples = append(fs.samples, sample{t: s.Timestamp, st: s.StartTimestamp, v: s.Value})
		}
		for i := range ts.Histograms {
			fs.histograms = append(fs.histograms, marshalled(&ts.Histograms[i]))
		}
		for _, e := range ts.Exemplars {
			b.Reset()
			for i := 0; i+1 < len(e.LabelsRefs); i += 2 {
				b.Add(sym(e.LabelsRefs[i]), sym(e.LabelsRefs[i+1]))
			}
			b.Sort()
			fs.exemplars = append(fs.exemplars, exemplar.Exemplar{Labels: b.Labels(), Value: e.Value, Ts: e.Timestamp, HasTs: e.Timestamp != 0})
		}
		if m := ts.Metadata; m.Type != 0 || m.HelpRef != 0 || m.UnitRef != 0 {
			fs.meta = [3]string{fmt.Sprint(int32(m.Type)), sym(m.HelpRef), sym(m.UnitRef)}
		}
		out = append(out, fs)
	}
	return out
}

func FuzzDecodeV2(f *testing.F) {
	seedV2(f)
	seedV1(f) // 1.0 bodies sent with the 2.0 type
	f.Fuzz(func(t *testing.T, body []byte) {
		series, err := oursV2(body)
		var req writev2.Request
		genErr := req.Unmarshal(body)
		checkAgreement(t, err, genErr)
		if err != nil || genErr != nil {
			return
		}
		compareSeries(t, series, generatedV2(&req))
	})
}

func seedV2(f *testing.F) {
	b := newV2Builder()
	b.add(writev2.TimeSeries{Samples: []writev2.Sample{{Value: 1, Timestamp: 2, StartTimestamp: 1}},
		Metadata: writev2.Metadata{Type: writev2.Metadata_METRIC_TYPE_GAUGE, HelpRef: b.ref("help"), UnitRef: b.ref("celsius")}}, "__name__", "a", "gpu", "0")
	b.add(writev2.TimeSeries{Samples: []writev2.Sample{{Value: 3, Timestamp: 4}}}, "__name__", "b")
	b.add(writev2.TimeSeries{
		Histograms: []writev2.Histogram{writev2.FromIntHistogram(0, 5, tsdbutil.GenerateTestHistogram(1)), writev2.FromFloatHistogram(0, 6, tsdbutil.GenerateTestFloatHistogram(2))},
		Exemplars:  []writev2.Exemplar{{LabelsRefs: []uint32{b.ref("trace_id"), b.ref("abc")}, Value: 1, Timestamp: 5}},
		Metadata:   writev2.Metadata{Type: writev2.Metadata_METRIC_TYPE_HISTOGRAM},
	}, "__name__", "step_seconds", "rank", "1")
	f.Add(marshalled(b.build()))
	f.Add([]byte{})
	f.Add([]byte{0x2a, 0x02, 0x0a, 0x00})
	f.Add([]byte{0x22, 0x00, 0x2a, 0x02, 0x08, 0x00}) // one symbol, labels_refs unpacked
}
