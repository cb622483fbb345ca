package ingest

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/prometheus/prometheus/prompb"

	"github.com/gpustore/gpustore/pkg/hatracker"
)

// A storage fault (here the WAL file is gone) is gpustore's own fault: 500,
// which Prometheus retries, and nothing is acknowledged.
func TestStorageFaultIs500(t *testing.T) {
	ti := newTestIngester(t)
	now := nowMs()
	s := v1Series([]prompb.Sample{{Timestamp: now, Value: 1}}, "__name__", "DCGM_FI_DEV_GPU_TEMP", "gpu", "0")
	if resp := ti.post(t, ctV1, encodeV1(t, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{s}})); resp.code != http.StatusNoContent {
		t.Fatalf("status %d", resp.code)
	}
	_ = ti.dbs.Existing("default").DB.Close() // the WAL cannot be written any more
	s.Samples[0].Timestamp = now + 1000
	resp := ti.post(t, ctV1, encodeV1(t, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{s}}))
	if resp.code != http.StatusInternalServerError {
		t.Fatalf("status %d (%s), want 500", resp.code, resp.body)
	}
}

// downKV is an HA election store that cannot be reached.
type downKV struct{}

var errKVDown = errors.New("kv store unreachable")

func (downKV) List(context.Context, string) ([]string, error)   { return nil, errKVDown }
func (downKV) Get(context.Context, string) (any, error)         { return nil, errKVDown }
func (downKV) Delete(context.Context, string) error             { return errKVDown }
func (downKV) WatchKey(context.Context, string, func(any) bool) {}
func (downKV) WatchPrefix(ctx context.Context, _ string, _ func(string, any) bool) {
	<-ctx.Done()
}
func (downKV) CAS(context.Context, string, func(any) (any, bool, error)) error { return errKVDown }

// Without its election store the tracker cannot tell which replica to keep:
// 500, so the sender retries, rather than storing both or dropping both.
func TestHAStoreDownIs500(t *testing.T) {
	ti := newTestIngester(t, func(s *testSetup) {
		cfg := hatracker.DefaultConfig()
		s.ha = &cfg
		s.haKV = downKV{}
	})
	resp := ti.post(t, ctV1, encodeV1(t, replicaRequest("p0", nowMs())))
	if resp.code != http.StatusInternalServerError {
		t.Fatalf("status %d (%s), want 500", resp.code, resp.body)
	}
	if got := ti.stored(t, "default"); len(got) != 0 {
		t.Fatalf("stored %v", got)
	}
	// Series that are not part of an HA pair do not depend on the store.
	plain := &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{v1Series([]prompb.Sample{{Timestamp: nowMs(), Value: 1}}, "__name__", "up")}}
	if resp := ti.post(t, ctV1, encodeV1(t, plain)); resp.code != http.StatusNoContent {
		t.Fatalf("plain series: %d %s", resp.code, resp.body)
	}
}
