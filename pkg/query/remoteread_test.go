package query

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/util/annotations"

	"github.com/gpustore/gpustore/internal/abuse"
	"github.com/gpustore/gpustore/pkg/downsample"
	"github.com/gpustore/gpustore/pkg/readopts"
)

// stallingSource is a Source whose selects of the metric "stall" hold
// their reader until release is closed or the query's context ends: a
// query or remote read that takes long, holding its concurrency slot.
type stallingSource struct {
	release chan struct{}
	started chan struct{} // one value per stalled select
	// ignoreCancel: the select holds on past its context's end (a select
	// that does not look at its context, holding its slot regardless).
	ignoreCancel bool
}

func newStallingSource() *stallingSource {
	return &stallingSource{release: make(chan struct{}), started: make(chan struct{}, 1000)}
}

func (s *stallingSource) Querier(string, int64, int64, readopts.ReadOptions) (downsample.Querier, error) {
	return stallingQuerier{s: s}, nil
}

func (s *stallingSource) ChunkQuerier(string, int64, int64, readopts.ReadOptions) (storage.ChunkQuerier, error) {
	return stallingChunkQuerier{stallingQuerier{s: s}}, nil
}

func (s *stallingSource) HasDownsampled(string) bool { return false }

type stallingQuerier struct {
	downsample.NoFolding
	s *stallingSource
}

func (q stallingQuerier) stall(ctx context.Context, ms []*labels.Matcher) {
	for _, m := range ms {
		if m.Name == model.MetricNameLabel && m.Matches("stall") && !m.Matches("") {
			q.s.started <- struct{}{}
			done := ctx.Done()
			if q.s.ignoreCancel {
				done = nil
			}
			select {
			case <-q.s.release:
			case <-done:
			}
			return
		}
	}
}

func (q stallingQuerier) Select(ctx context.Context, _ bool, _ *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
	q.stall(ctx, ms)
	return storage.EmptySeriesSet()
}

func (q stallingQuerier) LabelValues(context.Context, string, *storage.LabelHints, ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return nil, nil, nil
}

func (q stallingQuerier) LabelNames(context.Context, *storage.LabelHints, ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return nil, nil, nil
}

func (q stallingQuerier) Close() error { return nil }

type stallingChunkQuerier struct{ stallingQuerier }

func (q stallingChunkQuerier) Select(ctx context.Context, _ bool, _ *storage.SelectHints, ms ...*labels.Matcher) storage.ChunkSeriesSet {
	q.stall(ctx, ms)
	return storage.EmptyChunkSeriesSet()
}

// TestAbandonedRemoteReadsLeaveNothing: remote reads whose clients leave
// while they wait for a slot (remote_read_concurrent_limit, held by a
// read that runs long) end at once: a thousand of them leave no goroutine
// and no open file behind, while the running read goes on and finishes.
// Before, a read waited for its slot without reading its body, so the
// server never noticed its client had gone (and with the limit gpustore
// passed, 0, no read ever got a slot): 300 anonymous reads under a 256-file
// limit stopped writes and /-/healthy.
func TestAbandonedRemoteReadsLeaveNothing(t *testing.T) {
	src := newStallingSource()
	h, now := newTestAPIHandler(t, func(o *Options) {
		o.Config.RemoteReadConcurrentLimit = 1
		o.Sources = []Source{src}
	})
	base, addr := serveUnwaited(t, h)

	// The running read: its client stays.
	running := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, base+"/api/v1/read", bytes.NewReader(abuse.ReadRequest("stall", now-60_000, now)))
		req.Header.Set("Content-Type", "application/x-protobuf")
		req.Header.Set("Content-Encoding", "snappy")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			running <- 0
			return
		}
		defer resp.Body.Close()
		_, _ = io.ReadAll(resp.Body)
		running <- resp.StatusCode
	}()
	select {
	case <-src.started:
	case <-time.After(10 * time.Second):
		t.Fatal("the first remote read never started: no slot for it (remote_read_concurrent_limit)")
	}
	http.DefaultClient.CloseIdleConnections()
	before := measure(t)
	if err := abuse.AbandonedReads(addr, "/api/v1/read", abuse.ReadRequest("stall", now-60_000, now), nil, 1000); err != nil {
		t.Fatal(err)
	}
	if err := abuse.SettlesTo(before, 10, 5*time.Second); err != nil {
		t.Fatal(err)
	}

	close(src.release)
	select {
	case code := <-running:
		if code != http.StatusOK {
			t.Errorf("the running read: %d, want 200", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the running read did not finish once released")
	}
}

// serveUnwaited serves h on a loopback port until the test ends, without
// waiting for its requests at the end (httptest.Server.Close does): a test
// that fails because requests hang must fail, not hang.
func serveUnwaited(t *testing.T, h http.Handler) (base, addr string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + lis.Addr().String(), lis.Addr().String()
}

func measure(t *testing.T) abuse.Footprint {
	t.Helper()
	f, err := abuse.Measure()
	if err != nil {
		t.Fatal(err)
	}
	return f
}
