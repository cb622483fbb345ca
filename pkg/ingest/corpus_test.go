package ingest

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/golang/snappy"
	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
)

// corpusDir holds bad remote-write bodies as a sender would send them
// (snappy-compressed; .v1 or .v2 says the protocol) and expect.txt, one line
// per file: file, status, a text the answer must contain, and "nothing" or
// "rest" for what a request with other, valid series would keep. The files
// are written by TestBadInputCorpus with GPUSTORE_UPDATE_CORPUS=1 from
// badCorpus below; without it the test reads them, so a change of the
// decoder is checked against the same bytes.
const corpusDir = "testdata/bad-requests"

type corpusEntry struct {
	file   string
	status int
	says   string
	stored string // nothing | rest
	body   func(t *testing.T) []byte
}

// year2100 is far in the future of any run; -1 ms is before any head.
const year2100 = int64(4_102_444_800_000)

func badCorpus() []corpusEntry {
	sample := []prompb.Sample{{Timestamp: year2100 - 100*365*24*3600_000, Value: 1}} // 2000: too old once the head started
	valid := func(t *testing.T) []byte {
		b, err := (&prompb.WriteRequest{Timeseries: []prompb.TimeSeries{v1Series(sample, "__name__", "DCGM_FI_DEV_GPU_TEMP", "gpu", "0")}}).Marshal()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	v1 := func(ts ...prompb.TimeSeries) func(t *testing.T) []byte {
		return func(t *testing.T) []byte { return encodeV1(t, &prompb.WriteRequest{Timeseries: ts}) }
	}
	manyLabels := []string{"__name__", "DCGM_FI_DEV_GPU_TEMP"}
	for i := range 1000 {
		manyLabels = append(manyLabels, fmt.Sprintf("label_%04d", i), "v")
	}
	return []corpusEntry{
		{"truncated-protobuf.v1", 400, "malformed protobuf", "nothing", func(t *testing.T) []byte {
			b := valid(t)
			return snappy.Encode(nil, b[:len(b)-3])
		}},
		{"truncated-snappy.v1", 400, "corrupt snappy", "nothing", func(t *testing.T) []byte {
			b := snappy.Encode(nil, valid(t))
			return b[:len(b)/2]
		}},
		{"not-snappy.v1", 400, "corrupt snappy", "nothing", func(t *testing.T) []byte { return valid(t) }},
		{"oversized-decoded-length.v1", 413, "exceeds the limit", "nothing", func(t *testing.T) []byte {
			// A snappy header that claims 1 GiB after decoding: refused
			// before anything is allocated.
			b := binary.AppendUvarint(nil, 1<<30)
			return append(b, snappy.Encode(nil, valid(t))[1:]...)
		}},
		{"invalid-utf8-label-value.v1", 400, "not valid UTF-8", "rest", v1(v1Series(sample, "__name__", "DCGM_FI_DEV_GPU_TEMP", "gpu", "\xff\xfe"))},
		{"invalid-utf8-metric-name.v1", 400, "not valid UTF-8", "rest", v1(v1Series(sample, "__name__", "DCGM\xc3\x28", "gpu", "0"))},
		{"huge-label-count.v1", 400, "too_many_labels", "rest", v1(v1Series(sample, manyLabels...))},
		{"label-value-too-long.v1", 400, "label_value_too_long", "rest", v1(v1Series(sample, "__name__", "DCGM_FI_DEV_GPU_TEMP", "gpu", strings.Repeat("x", 5000)))},
		{"negative-timestamp.v1", 400, "too_old: 1", "rest", v1(v1Series([]prompb.Sample{{Timestamp: -1, Value: 1}}, "__name__", "DCGM_FI_DEV_GPU_TEMP", "gpu", "0"))},
		{"future-timestamp.v1", 400, "too_far_in_future: 1", "rest", v1(v1Series([]prompb.Sample{{Timestamp: year2100, Value: 1}}, "__name__", "DCGM_FI_DEV_GPU_TEMP", "gpu", "0"))},
		{"v2-symbol-out-of-range.v2", 400, "out of range", "nothing", func(t *testing.T) []byte {
			return encodeV2(t, &writev2.Request{Symbols: []string{"", "__name__", "x"}, Timeseries: []writev2.TimeSeries{{LabelsRefs: []uint32{1, 7}, Samples: []writev2.Sample{{Value: 1, Timestamp: 1}}}}})
		}},
		{"v2-odd-label-refs.v2", 400, "odd number", "nothing", func(t *testing.T) []byte {
			return encodeV2(t, &writev2.Request{Symbols: []string{"", "__name__", "x"}, Timeseries: []writev2.TimeSeries{{LabelsRefs: []uint32{1, 2, 1}, Samples: []writev2.Sample{{Value: 1, Timestamp: 1}}}}})
		}},
		// The two versions' messages share no field numbers (2.0 reserves
		// 1.0's), so a body decoded as the other version used to be an empty
		// request: 204 and nothing stored.
		{"v1-body-sent-as-v2.v2", 400, "remote write 1.0 body sent with the 2.0 Content-Type", "nothing", func(t *testing.T) []byte { return snappy.Encode(nil, valid(t)) }},
		{"v1-metadata-only-sent-as-v2.v2", 400, "remote write 1.0 body sent with the 2.0 Content-Type", "nothing", func(t *testing.T) []byte {
			return encodeV1(t, &prompb.WriteRequest{Metadata: []prompb.MetricMetadata{{MetricFamilyName: "DCGM_FI_DEV_GPU_TEMP", Type: prompb.MetricMetadata_GAUGE, Help: "GPU temperature (in C)."}}})
		}},
		{"v2-body-sent-as-v1.v1", 400, "remote write 2.0 body sent with the 1.0 Content-Type", "nothing", func(t *testing.T) []byte {
			return encodeV2(t, &writev2.Request{Symbols: []string{"", "__name__", "DCGM_FI_DEV_GPU_TEMP", "gpu", "0"}, Timeseries: []writev2.TimeSeries{{LabelsRefs: []uint32{1, 2, 3, 4}, Samples: []writev2.Sample{{Value: 1, Timestamp: 1}}}}})
		}},
		{"v2-truncated.v2", 400, "malformed protobuf", "nothing", func(t *testing.T) []byte {
			b, err := (&writev2.Request{Symbols: []string{"", "__name__", "x"}, Timeseries: []writev2.TimeSeries{{LabelsRefs: []uint32{1, 2}, Samples: []writev2.Sample{{Value: 1, Timestamp: 1}}}}}).Marshal()
			if err != nil {
				t.Fatal(err)
			}
			return snappy.Encode(nil, b[:len(b)-2])
		}},
	}
}

// TestBadInputCorpus: each bad body of the corpus is answered as docs/ingest.md's
// bad-input table says, and stores nothing of its own.
func TestBadInputCorpus(t *testing.T) {
	entries := badCorpus()
	if os.Getenv("GPUSTORE_UPDATE_CORPUS") == "1" {
		if err := os.MkdirAll(corpusDir, 0o755); err != nil {
			t.Fatal(err)
		}
		var idx strings.Builder
		idx.WriteString("# file status says stored (written by TestBadInputCorpus with GPUSTORE_UPDATE_CORPUS=1)\n")
		for _, e := range entries {
			if err := os.WriteFile(filepath.Join(corpusDir, e.file), e.body(t), 0o644); err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&idx, "%s %d %q %s\n", e.file, e.status, e.says, e.stored)
		}
		if err := os.WriteFile(filepath.Join(corpusDir, "expect.txt"), []byte(idx.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Open(filepath.Join(corpusDir, "expect.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	for sc := bufio.NewScanner(f); sc.Scan(); {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		var e corpusEntry
		var says string
		if _, err := fmt.Sscanf(line, "%s %d %q %s", &e.file, &e.status, &says, &e.stored); err != nil {
			t.Fatalf("expect.txt: %q: %v", line, err)
		}
		n++
		t.Run(e.file, func(t *testing.T) {
			body, err := os.ReadFile(filepath.Join(corpusDir, e.file))
			if err != nil {
				t.Fatal(err)
			}
			ti := newTestIngester(t)
			// A first sample at the current time starts the head, so "too old" is old.
			now := nowMs()
			if r := ti.post(t, ctV1, encodeV1(t, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{
				v1Series([]prompb.Sample{{Timestamp: now, Value: 1}}, "__name__", "up")}})); r.code != http.StatusNoContent {
				t.Fatalf("first write: %d %s", r.code, r.body)
			}
			ct := ctV1
			if strings.HasSuffix(e.file, ".v2") {
				ct = ctV2
			}
			r := ti.post(t, ct, body)
			if r.code != e.status {
				t.Fatalf("status %d, want %d: %s", r.code, e.status, r.body)
			}
			if !strings.Contains(r.body, says) {
				t.Errorf("answer %q does not say %q", r.body, says)
			}
			if e.stored == "rest" && !strings.Contains(r.body, "the rest of the request was stored") {
				t.Errorf("answer %q does not say the rest was stored", r.body)
			}
			if got := ti.stored(t, "default"); len(got) != 1 {
				t.Errorf("stored %v, want only the first write", got)
			}
		})
	}
	if n != len(entries) {
		t.Errorf("expect.txt lists %d files, the corpus has %d: run with GPUSTORE_UPDATE_CORPUS=1", n, len(entries))
	}
}
