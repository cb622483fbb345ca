package gpusim

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang/snappy"
	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
)

// fakeReceiver answers with scripted status codes and records what it got.
type fakeReceiver struct {
	mu       sync.Mutex
	statuses []int // consumed in order; 204 once exhausted
	v2Ack    bool  // answer 2.0 requests with the written-samples headers
	requests atomic.Int64
	samples  atomic.Int64
	headers  http.Header
	err      string
}

func (f *fakeReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.requests.Add(1)
	body, _ := io.ReadAll(r.Body)
	raw, err := snappy.Decode(nil, body)
	n := 0
	if err == nil {
		if r.Header.Get("Content-Type") == ContentTypeV2 {
			var req writev2.Request
			err = req.Unmarshal(raw)
			n = len(req.Timeseries)
		} else {
			var req prompb.WriteRequest
			err = req.Unmarshal(raw)
			n = len(req.Timeseries)
		}
	}
	f.mu.Lock()
	if err != nil {
		f.err = err.Error()
	}
	f.headers = r.Header.Clone()
	status := http.StatusNoContent
	if len(f.statuses) > 0 {
		status, f.statuses = f.statuses[0], f.statuses[1:]
	}
	f.mu.Unlock()
	if status/100 == 2 {
		f.samples.Add(int64(n))
		if f.v2Ack {
			w.Header().Set("X-Prometheus-Remote-Write-Samples-Written", itoa(n))
			w.Header().Set("X-Prometheus-Remote-Write-Histograms-Written", "0")
			w.Header().Set("X-Prometheus-Remote-Write-Exemplars-Written", "0")
		}
	}
	w.WriteHeader(status)
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestSenderRetriesAndDrops(t *testing.T) {
	series := testBatch(t)[:5000]
	for _, tc := range []struct {
		name       string
		proto      Protocol
		statuses   []int
		retry429   bool
		v2Ack      bool
		wantOK     int64 // samples acknowledged
		wantDrop   int64 // samples dropped
		wantRetry  int64
		wantMissed int64
	}{
		{name: "v1 ok", proto: ProtocolV1, wantOK: 5000},
		{name: "5xx retried", proto: ProtocolV1, statuses: []int{500, 503}, wantOK: 5000, wantRetry: 2},
		{name: "400 dropped", proto: ProtocolV1, statuses: []int{400}, wantOK: 3000, wantDrop: 2000},
		{name: "429 dropped by default", proto: ProtocolV1, statuses: []int{429}, wantOK: 3000, wantDrop: 2000},
		{name: "429 retried when enabled", proto: ProtocolV1, statuses: []int{429}, retry429: true, wantOK: 5000, wantRetry: 1},
		{name: "v2 acknowledged", proto: ProtocolV2, v2Ack: true, wantOK: 5000},
		{name: "v2 without written headers", proto: ProtocolV2, wantDrop: 5000, wantMissed: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rcv := &fakeReceiver{statuses: tc.statuses, v2Ack: tc.v2Ack}
			srv := httptest.NewServer(rcv)
			defer srv.Close()
			s, err := NewSender(SenderConfig{URL: srv.URL, Protocol: tc.proto, Tenant: "team-a", RetryOn429: tc.retry429,
				MinBackoff: time.Millisecond, ExternalLabels: testExternal, Logger: quietLogger()})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Send(context.Background(), series); err != nil {
				t.Fatal(err)
			}
			st := s.Stats()
			if rcv.err != "" {
				t.Fatalf("receiver could not decode: %s", rcv.err)
			}
			if st.Samples != tc.wantOK || st.DroppedSamples != tc.wantDrop || st.Retries != tc.wantRetry || st.MissingWritten != tc.wantMissed {
				t.Errorf("stats %+v, want ok=%d dropped=%d retries=%d missing=%d", st, tc.wantOK, tc.wantDrop, tc.wantRetry, tc.wantMissed)
			}
			h := rcv.headers
			wantCT, wantV := ContentTypeV1, VersionHeaderV1
			if tc.proto == ProtocolV2 {
				wantCT, wantV = ContentTypeV2, VersionHeaderV2
			}
			if h.Get("Content-Type") != wantCT || h.Get("X-Prometheus-Remote-Write-Version") != wantV ||
				h.Get("Content-Encoding") != "snappy" || h.Get("X-Scope-OrgID") != "team-a" {
				t.Errorf("headers %v", h)
			}
		})
	}
}

func TestSenderShards(t *testing.T) {
	series := testBatch(t)
	rcv := &fakeReceiver{}
	srv := httptest.NewServer(rcv)
	defer srv.Close()
	s, err := NewSender(SenderConfig{URL: srv.URL, Shards: 4, MaxSamplesPerSend: 500, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(context.Background(), series); err != nil {
		t.Fatal(err)
	}
	if got := rcv.samples.Load(); got != int64(len(series)) {
		t.Errorf("receiver got %d samples, sent %d", got, len(series))
	}
	if want := int64((len(series) + 499) / 500); rcv.requests.Load() != want {
		t.Errorf("%d requests, want %d", rcv.requests.Load(), want)
	}
}
