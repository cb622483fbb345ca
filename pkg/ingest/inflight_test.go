package ingest

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/golang/snappy"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/prompb"
	"github.com/prometheus/prometheus/storage"
)

// blockingAppendable holds every commit until release is closed, telling
// entered when one waits: requests stay in flight with their bodies decoded.
type blockingAppendable struct {
	storage.AppendableV2
	entered chan struct{}
	release chan struct{}
}

func (b blockingAppendable) AppenderV2(ctx context.Context) storage.AppenderV2 {
	return blockingAppender{b.AppendableV2.AppenderV2(ctx), b}
}

type blockingAppender struct {
	storage.AppenderV2
	b blockingAppendable
}

func (a blockingAppender) Commit() error {
	a.b.entered <- struct{}{}
	<-a.b.release
	return a.AppenderV2.Commit()
}

// bigRequest is a 1.0 request of about decoded bytes: dcgm-exporter's
// series with one sample each.
func bigRequest(t testing.TB, decoded int, ts int64) []byte {
	req := &prompb.WriteRequest{}
	for i, size := 0, 0; size < decoded; i++ {
		req.Timeseries = append(req.Timeseries, v1Series([]prompb.Sample{{Timestamp: ts, Value: float64(i)}},
			"__name__", "DCGM_FI_DEV_GPU_UTIL", "gpu", fmt.Sprint(i%8), "UUID", fmt.Sprintf("GPU-%08x-1b2c-4d5e-8f90-%012x", i, i*7919),
			"device", fmt.Sprintf("nvidia%d", i%8), "modelName", "NVIDIA H100 80GB HBM3", "Hostname", fmt.Sprintf("node-%05d", i/8),
			"pod", fmt.Sprintf("train-%d-worker-%d", i%97, i), "namespace", "research", "container", "pytorch"))
		size += req.Timeseries[i].Size() + 4 // and the field's tag and length
	}
	return encodeV1(t, req)
}

// TestInflightBytesBoundAllTenants: the bodies that requests in progress
// hold (compressed and decoded) are bounded for the whole process: past
// ingest.max_inflight_bytes a write of any tenant is answered 503 with
// Retry-After (Prometheus retries 5xx by default, 429 only with
// retry_on_http_429), and once the requests in flight are done writes pass
// again and nothing stays counted.
func TestInflightBytesBoundAllTenants(t *testing.T) {
	// Bodies of 1 MiB decoded; the bound holds two requests' buffers (a
	// body and one byte, the decoded body) and half of a third's.
	// The limits are taken from the largest of the three bodies: snappy
	// compresses each timestamp differently, so their sizes differ by tens of
	// bytes.
	now := nowMs()
	body, third, fourth := bigRequest(t, 1<<20, now), bigRequest(t, 1<<20, now+1), bigRequest(t, 1<<20, now+2)
	var maxBody, decoded int
	for _, b := range [][]byte{body, third, fourth} {
		n, err := snappy.DecodedLen(b)
		if err != nil {
			t.Fatal(err)
		}
		maxBody, decoded = max(maxBody, len(b)), max(decoded, n)
	}
	held := int64(maxBody + 1 + decoded)
	ti := newTestIngester(t, func(s *testSetup) {
		s.ingest.MaxRequestBytes, s.ingest.MaxDecodedBytes = int64(maxBody)+64, int64(decoded)+64
		s.ingest.MaxInflightBytes = 2*held + held/2
	})
	block := blockingAppendable{entered: make(chan struct{}), release: make(chan struct{})}
	for _, tenant := range []string{"a", "b"} {
		ti.wrapAppendable(t, tenant, func(a storage.AppendableV2) storage.AppendableV2 { block.AppendableV2 = a; return block })
	}
	var wg sync.WaitGroup
	for _, tenant := range []string{"a", "b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r := ti.post(t, ctV1, body, "X-Scope-OrgID", tenant); r.code != http.StatusNoContent {
				t.Errorf("tenant %s, in flight: %d %s", tenant, r.code, r.body)
			}
		}()
	}
	<-block.entered
	<-block.entered
	// Two decoded bodies are in flight: a third, of a third tenant, would pass the bound.
	r := ti.post(t, ctV1, third, "X-Scope-OrgID", "c")
	if r.code != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" || !strings.Contains(r.body, "max_inflight_bytes") {
		t.Errorf("a write past the in-flight bound: %d, Retry-After %q: %s", r.code, r.header.Get("Retry-After"), r.body)
	}
	close(block.release)
	wg.Wait()
	if r := ti.post(t, ctV1, fourth, "X-Scope-OrgID", "c"); r.code != http.StatusNoContent {
		t.Errorf("a write after the others finished: %d %s", r.code, r.body)
	}
	if n, err := testutil.GatherAndCount(ti.reg, "gpustore_ingest_inflight_bytes"); err != nil || n != 1 {
		t.Errorf("gpustore_ingest_inflight_bytes: %d series, %v", n, err)
	} else if err := testutil.GatherAndCompare(ti.reg, strings.NewReader(inflightZero), "gpustore_ingest_inflight_bytes"); err != nil {
		t.Errorf("bytes still counted after every request finished: %v", err)
	}
	if got := len(ti.stored(t, "c")); got == 0 {
		t.Error("tenant c's accepted write stored nothing")
	}
}

const inflightZero = `# HELP gpustore_ingest_inflight_bytes Bytes of remote-write bodies (compressed and decoded) held by the writes in progress.
# TYPE gpustore_ingest_inflight_bytes gauge
gpustore_ingest_inflight_bytes 0
`
