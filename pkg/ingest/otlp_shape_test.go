package ingest

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/gpustore/gpustore/pkg/limits"
)

// pb is a protobuf field number with its message's fields: msg(f, ...)
// builds the field's bytes.
func msg(field protowire.Number, inner ...[]byte) []byte {
	b := protowire.AppendTag(nil, field, protowire.BytesType)
	return protowire.AppendBytes(b, bytes.Join(inner, nil))
}

// times repeats b n times.
func times(n int, b []byte) []byte { return bytes.Repeat(b, n) }

// inGauge puts the fields of one gauge (its data points) in an export request.
func inGauge(points ...[]byte) []byte {
	return msg(1, msg(2, msg(2, msg(5, points...))))
}

// objectBytes is what the scan estimates pdata allocates decoding body,
// with no bound on attributes.
func objectBytes(body []byte, asJSON bool) (int64, error) {
	s, err := scanOTLP(body, asJSON, otlpBounds{})
	return s.objects, err
}

// pdataAllocates is what decoding body with pdata allocates, in bytes.
func pdataAllocates(t *testing.T, body []byte, asJSON bool) int64 {
	t.Helper()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	req := pmetricotlp.NewExportRequest()
	var err error
	if asJSON {
		err = req.UnmarshalJSON(body)
	} else {
		err = req.UnmarshalProto(body)
	}
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatalf("pdata refuses the body: %v", err)
	}
	runtime.KeepAlive(req)
	return int64(after.TotalAlloc - before.TotalAlloc)
}

// TestOTLPShapeCoversDecoding: the estimate of what pdata allocates covers
// what it does allocate, for bodies made of many empty messages of each kind
// (the most objects per byte a sender can make) and for realistic exports,
// and stays within 3x of it for a DCGM export, so the in-flight bound does
// not refuse the traffic it is meant to let through. A pdata upgrade that
// makes its objects larger fails here.
func TestOTLPShapeCoversDecoding(t *testing.T) {
	const n = 20000
	empty := func(f protowire.Number) []byte { return msg(f) }
	kv := msg(7, msg(1, []byte("k")))
	hostile := map[string][]byte{
		"resource metrics":      times(n, empty(1)),
		"scope metrics":         msg(1, times(n, empty(2))),
		"metrics":               msg(1, msg(2, times(n, empty(2)))),
		"gauges":                msg(1, msg(2, times(n, msg(2, empty(5))))),
		"histograms":            msg(1, msg(2, times(n, msg(2, empty(9))))),
		"number points":         inGauge(times(n, empty(1))),
		"histogram points":      msg(1, msg(2, msg(2, msg(9, times(n, empty(1)))))),
		"exp. histogram points": msg(1, msg(2, msg(2, msg(10, times(n, msg(1, empty(8), empty(9))))))),
		"summary points":        msg(1, msg(2, msg(2, msg(11, times(n, empty(1)))))),
		"quantiles":             msg(1, msg(2, msg(2, msg(11, msg(1, times(n, empty(6))))))),
		"exemplars":             inGauge(msg(1, times(n, empty(5)))),
		"attributes":            inGauge(msg(1, times(n, empty(7)))),
		"string attributes":     inGauge(msg(1, times(n, msg(7, msg(2, msg(1)))))),
		"attribute arrays":      inGauge(msg(1, msg(7, msg(2, msg(5, times(n, empty(1))))))),
		"attribute lists":       inGauge(msg(1, msg(7, msg(2, msg(6, times(n, empty(1))))))),
		"resource attributes":   msg(1, msg(1, times(n, empty(1)))),
		"entity refs":           msg(1, msg(1, times(n, empty(3)))),
		"entity keys":           msg(1, msg(1, msg(3, times(n, empty(3))))),
		"metric metadata":       msg(1, msg(2, msg(2, times(n, empty(12))))),
		"bucket counts":         msg(1, msg(2, msg(2, msg(10, msg(1, msg(8, msg(2, make([]byte, n)))))))),
		"explicit bounds":       msg(1, msg(2, msg(2, msg(9, msg(1, times(n, protowire.AppendFixed64(protowire.AppendTag(nil, 7, protowire.Fixed64Type), 0))))))),
		"points with attribute": inGauge(times(n, msg(1, kv))),
	}
	for name, body := range hostile {
		est, err := objectBytes(body, false)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := pdataAllocates(t, body, false); got > est {
			t.Errorf("%s: a body of %d bytes: pdata allocates %d bytes, estimated %d", name, len(body), got, est)
		} else {
			t.Logf("%s: a body of %d bytes: pdata allocates %d bytes (%.1fx), estimated %d", name, len(body), got, float64(got)/float64(len(body)), est)
		}
	}
	jsonEmpty := []byte(`{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"g","gauge":{"dataPoints":[` +
		strings.TrimSuffix(strings.Repeat(`{},`, n), ",") + `]}}]}]}]}`)
	if est, _ := objectBytes(jsonEmpty, true); pdataAllocates(t, jsonEmpty, true) > est {
		t.Errorf("JSON of empty points: pdata allocates more than the %d bytes estimated", est)
	}

	dcgm := benchBodyOTLP(benchSeries(), time.Now().UnixMilli())
	proto, err := gunzipAll(dcgm)
	if err != nil {
		t.Fatal(err)
	}
	req := pmetricotlp.NewExportRequest()
	if err := req.UnmarshalProto(proto); err != nil {
		t.Fatal(err)
	}
	json, err := req.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		body   []byte
		asJSON bool
	}{
		{"DCGM protobuf", proto, false},
		{"DCGM JSON", json, true},
		{"gauges, sums and histograms", otlpBody(t, gpuMetrics(time.Now(), 60, 1000), false), false},
	} {
		est, err := objectBytes(c.body, c.asJSON)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got := pdataAllocates(t, c.body, c.asJSON)
		if got > est || (strings.HasPrefix(c.name, "DCGM") && est > 3*got) {
			t.Errorf("%s: a body of %d bytes: pdata allocates %d bytes, estimated %d (want between 1x and 3x)", c.name, len(c.body), got, est)
		}
		t.Logf("%s: a body of %d bytes: pdata allocates %d bytes (%.1fx), estimated %d (%.2fx of it)", c.name, len(c.body), got, float64(got)/float64(len(c.body)), est, float64(est)/float64(got))
	}
}

// nestedValue is an export request whose one resource attribute's value is
// an array of an array ... levels deep, as protobuf (built from the inside
// out with the lengths computed first: appending level after level would
// copy the body once per level) or JSON.
func nestedValue(levels int, asJSON bool) []byte {
	if asJSON {
		var b strings.Builder
		b.WriteString(`{"resourceMetrics":[{"resource":{"attributes":[{"key":"k","value":`)
		b.WriteString(strings.Repeat(`{"arrayValue":{"values":[`, levels))
		b.WriteString(`{"stringValue":"x"}`)
		b.WriteString(strings.Repeat(`]}}`, levels))
		fmt.Fprintf(&b, `}]},"scopeMetrics":[{"metrics":[{"name":"up","gauge":{"dataPoints":[{"asDouble":1,"timeUnixNano":"%d"}]}}]}]}]}`, time.Now().UnixNano())
		return []byte(b.String())
	}
	inner := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "x")
	values, arrays := make([]int, levels+1), make([]int, levels+1)
	values[0] = len(inner)
	for k := 1; k <= levels; k++ {
		arrays[k] = 1 + protowire.SizeVarint(uint64(values[k-1])) + values[k-1]
		values[k] = 1 + protowire.SizeVarint(uint64(arrays[k])) + arrays[k]
	}
	v := make([]byte, 0, values[levels]+len(inner))
	for k := levels; k >= 1; k-- {
		v = protowire.AppendVarint(protowire.AppendTag(v, 5, protowire.BytesType), uint64(arrays[k]))
		v = protowire.AppendVarint(protowire.AppendTag(v, 1, protowire.BytesType), uint64(values[k-1]))
	}
	v = append(v, inner...)
	attr := msg(1, msg(1, []byte("k")), msg(2, v))
	return msg(1, msg(1, attr))
}

// TestOTLPHostileShapes: export requests within the size limits whose shape
// would take the process down are refused with a 4xx the exporter does not
// retry, and the server goes on taking writes.
//   - Attribute values nested two million deep (56 MB of JSON, 127 KB
//     gzipped): before, the translator's recursive encoding of the value
//     overflowed the goroutine stack, a fatal error for the whole process.
//   - A megabyte of empty data points decodes into ~70 MB of pdata objects:
//     before, the in-flight bound counted only the megabyte.
func TestOTLPHostileShapes(t *testing.T) {
	ti := newTestIngester(t, func(s *testSetup) {
		s.ingest.MaxRequestBytes = 4 << 20
		s.ingest.MaxDecodedBytes = 64 << 20
		s.ingest.MaxInflightBytes = 256 << 20
		// The empty points' objects, not their series, are what this
		// test sends past a bound.
		s.limits.Defaults.MaxSeriesPerRequest = 0
	})
	deepJSON := gzipped(t, nestedValue(2_000_000, true))
	if len(deepJSON) > 4<<20 {
		t.Fatalf("the nested body is %d bytes gzipped, past the request limit", len(deepJSON))
	}
	cases := []struct {
		name, ct, enc string
		body          []byte
		code          int
		says          string
	}{
		{"values nested 2M deep, JSON gzip", otlpJSON, "gzip", deepJSON, http.StatusBadRequest, "deeper than"},
		{"values nested 100 deep, JSON", otlpJSON, "", nestedValue(100, true), http.StatusBadRequest, "deeper than"},
		{"values nested 100 deep, protobuf", otlpProtobuf, "", nestedValue(100, false), http.StatusBadRequest, "deeper than"},
		{"1.5 M empty points", otlpProtobuf, "gzip", gzipped(t, inGauge(times(1_500_000, msg(1)))), http.StatusRequestEntityTooLarge, "max_inflight_bytes"},
	}
	for _, c := range cases {
		r := ti.postOTLP(t, c.ct, c.enc, c.body)
		if r.code != c.code || !strings.Contains(r.body, c.says) || r.header.Get("Retry-After") != "" {
			t.Errorf("%s: answered %d %.200q, want %d saying %q without Retry-After", c.name, r.code, r.body, c.code, c.says)
		}
	}
	// Values nested as deep as the bound allows are stored.
	if r := ti.postOTLP(t, otlpProtobuf, "", nestedValue(20, false)); r.code != http.StatusOK {
		t.Errorf("values nested 20 deep: %d %q", r.code, r.body)
	}
	if r := ti.postOTLP(t, otlpProtobuf, "gzip", gzipped(t, otlpBody(t, gpuMetrics(time.Now(), 61, 2000), false))); r.code != http.StatusOK {
		t.Errorf("a good export after the hostile ones: %d %q", r.code, r.body)
	}
	if b := ti.inflight.Bytes(); b != 0 {
		t.Errorf("%d bytes still held in flight", b)
	}
}

func gunzipAll(b []byte) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	return io.ReadAll(zr)
}

// BenchmarkOTLPShape is what judging an export's shape costs beside
// decoding it with pdata (the DCGM export of BenchmarkIngestOTLP, 2,000
// points), protobuf and JSON. Run:
//
//	go test -run XXX -bench OTLPShape ./pkg/ingest
func BenchmarkOTLPShape(b *testing.B) {
	proto, err := gunzipAll(benchBodyOTLP(benchSeries(), time.Now().UnixMilli()))
	if err != nil {
		b.Fatal(err)
	}
	req := pmetricotlp.NewExportRequest()
	if err := req.UnmarshalProto(proto); err != nil {
		b.Fatal(err)
	}
	json, err := req.MarshalJSON()
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		body   []byte
		asJSON bool
	}{{"protobuf", proto, false}, {"json", json, true}} {
		b.Run(c.name+"/shape", func(b *testing.B) {
			b.SetBytes(int64(len(c.body)))
			for b.Loop() {
				if _, err := scanOTLP(c.body, c.asJSON, otlpBoundsOf(limits.Defaults())); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/pdata", func(b *testing.B) {
			b.SetBytes(int64(len(c.body)))
			for b.Loop() {
				r := pmetricotlp.NewExportRequest()
				var err error
				if c.asJSON {
					err = r.UnmarshalJSON(c.body)
				} else {
					err = r.UnmarshalProto(c.body)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
