package load

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

	"github.com/gpustore/gpustore/bench/gpusim"
)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// fakeSource hands out synthetic requests without encoding anything.
type fakeSource struct {
	reqs [][]Request
	next []int
}

func newFakeSource(shards, perShard, samples int) *fakeSource {
	s := &fakeSource{reqs: make([][]Request, shards), next: make([]int, shards)}
	for sh := range s.reqs {
		for i := 0; i < perShard; i++ {
			t := int64(i * 15000)
			s.reqs[sh] = append(s.reqs[sh], Request{Body: []byte{byte(sh), byte(i)}, Samples: samples, MinT: t, MaxT: t})
		}
	}
	return s
}

func (s *fakeSource) NumShards() int { return len(s.reqs) }
func (s *fakeSource) Total() int64 {
	var n int64
	for _, r := range s.reqs {
		for _, q := range r {
			n += int64(q.Samples)
		}
	}
	return n
}
func (s *fakeSource) Next(_ context.Context, sh int) (Request, bool) {
	if s.next[sh] >= len(s.reqs[sh]) {
		return Request{}, false
	}
	s.next[sh]++
	return s.reqs[sh][s.next[sh]-1], true
}

func TestRunCountsAnswers(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Content-Encoding") != "snappy" || r.Header.Get("Content-Type") != gpusim.ContentTypeV1 ||
			r.Header.Get("X-Prometheus-Remote-Write-Version") != gpusim.VersionHeaderV1 {
			http.Error(w, "bad headers", http.StatusUnsupportedMediaType)
			return
		}
		body, _ := io.ReadAll(r.Body)
		switch n := calls.Add(1); {
		case body[1] == 3: // request 3 of every shard is invalid data
			http.Error(w, "out of order sample", http.StatusBadRequest)
		case n == 2: // one transient failure, retried
			http.Error(w, "try again", http.StatusServiceUnavailable)
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	}))
	defer srv.Close()
	src := newFakeSource(2, 5, 100)
	res, err := Run(context.Background(), DriverConfig{URL: srv.URL, Logger: quietLogger(), MinBackoff: time.Millisecond, Progress: -1}, src)
	if err != nil {
		t.Fatal(err)
	}
	// 10 requests: 2 rejected (400), 8 accepted, one of them after a retry.
	if res.Samples != 800 || res.Rejected != 200 || res.Failed != 0 {
		t.Fatalf("samples %d, rejected %d, failed %d; want 800, 200, 0", res.Samples, res.Rejected, res.Failed)
	}
	if res.Requests != 11 || res.Retries != 1 {
		t.Fatalf("requests %d, retries %d; want 11, 1", res.Requests, res.Retries)
	}
	if res.Codes[204] != 8 || res.Codes[400] != 2 || res.Codes[503] != 1 {
		t.Fatalf("codes %v", res.Codes)
	}
	if res.Latency.N != 11 || res.FirstError == "" {
		t.Fatalf("latency n=%d, first error %q", res.Latency.N, res.FirstError)
	}
}

func TestRunV2WrittenHeader(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if body[1] == 0 { // the first request of each shard: no written header
			w.WriteHeader(http.StatusNoContent)
			return
		}
		w.Header().Set("X-Prometheus-Remote-Write-Samples-Written", "90")
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	res, err := Run(context.Background(), DriverConfig{URL: srv.URL, Protocol: gpusim.ProtocolV2, Logger: quietLogger(), Progress: -1},
		newFakeSource(1, 3, 100))
	if err != nil {
		t.Fatal(err)
	}
	if res.Samples != 180 || res.Rejected != 120 {
		t.Fatalf("samples %d, rejected %d; want 180 (2×90), 120", res.Samples, res.Rejected)
	}
}

func TestRunGivesUpAfterRetries(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "0")
		http.Error(w, "down", http.StatusInternalServerError)
	}))
	defer srv.Close()
	res, err := Run(context.Background(), DriverConfig{URL: srv.URL, MaxRetries: 2, MinBackoff: time.Millisecond, Logger: quietLogger(), Progress: -1},
		newFakeSource(1, 2, 10))
	if err != nil {
		t.Fatal(err)
	}
	if res.Failed != 20 || res.Samples != 0 || res.Requests != 6 || res.Codes[500] != 6 {
		t.Fatalf("failed %d, samples %d, requests %d, codes %v", res.Failed, res.Samples, res.Requests, res.Codes)
	}
}

// No shard may run more than MaxSkew (in sample time) ahead of the slowest.
func TestRunBoundsSkew(t *testing.T) {
	var mu sync.Mutex
	newest := map[byte]int64{}
	var worst int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		sh, i := body[0], int64(body[1])
		if sh == 0 {
			time.Sleep(2 * time.Millisecond) // shard 0 is slow
		}
		mu.Lock()
		newest[sh] = i * 15000
		if len(newest) == 2 {
			worst = max(worst, newest[1]-newest[0])
		}
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	res, err := Run(context.Background(), DriverConfig{URL: srv.URL, MaxSkew: time.Minute, Logger: quietLogger(), Progress: -1},
		newFakeSource(2, 40, 1))
	if err != nil || res.Samples != 80 {
		t.Fatalf("samples %d, err %v", res.Samples, err)
	}
	// Shard 1 may send a request whose time is ≤ 60s past shard 0's
	// position; shard 0's position is its in-flight request, one tick
	// (15s) past its last answered one.
	if worst > 75000 {
		t.Fatalf("shard 1 ran %dms ahead of shard 0; bound is 60s (+ one tick in flight)", worst)
	}
}

func TestRunCancelled(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, DriverConfig{URL: srv.URL, Rate: 1, Logger: quietLogger(), Progress: -1}, newFakeSource(2, 5, 10)); err == nil {
		t.Fatal("want the context's error")
	}
}
