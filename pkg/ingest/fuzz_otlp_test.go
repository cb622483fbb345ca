package ingest

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// FuzzOTLP posts arbitrary bytes as an OTLP export, protobuf and JSON. The
// answer is 200 (stored, perhaps in part) or a permanent 4xx, never a
// panic or a 5xx; a body that does not decode stores nothing; and every
// byte the request held of the in-flight bound is given back.
func FuzzOTLP(f *testing.F) {
	ts := time.Unix(1_700_000_000, 0)
	f.Add(otlpBody(f, gpuMetrics(ts, 60, 1000), false), false)
	f.Add(otlpBody(f, gpuMetrics(ts, 60, 1000), true), true)
	f.Add([]byte(`{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"x","gauge":{"dataPoints":[{"asDouble":1}]}}]}]}]}`), true)
	f.Add([]byte{0x0a, 0x02, 0x12, 0x00}, false)
	f.Add([]byte{}, false)
	ti := newTestIngester(f, func(s *testSetup) {
		s.ingest.MaxRequestBytes = 1 << 20
		s.ingest.MaxDecodedBytes = 4 << 20
		s.ingest.MaxInflightBytes = 8 << 20
	})
	f.Fuzz(func(t *testing.T, body []byte, asJSON bool) {
		ct := otlpProtobuf
		if asJSON {
			ct = otlpJSON
		}
		before := len(ti.stored(t, "default"))
		r := ti.postOTLP(t, ct, "", body)
		switch r.code {
		case http.StatusOK:
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
			if strings.Contains(r.body, "decode OTLP") {
				if after := len(ti.stored(t, "default")); after != before {
					t.Errorf("a body that does not decode stored %d series", after-before)
				}
			}
		default:
			t.Errorf("answered %d %q", r.code, r.body)
		}
		if b := ti.inflight.Bytes(); b != 0 {
			t.Errorf("%d bytes still held in flight", b)
		}
	})
}
