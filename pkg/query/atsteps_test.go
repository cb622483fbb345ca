package query

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"testing"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"

	"github.com/gpustore/gpustore/pkg/downsample"
)

// selectRecorder is a Source whose selects note whether their context says
// they are evaluated at the request's steps only.
type selectRecorder struct {
	mtx     sync.Mutex
	atSteps []bool
}

func (r *selectRecorder) Querier(string, int64, int64, func(ulid.ULID) bool) storage.Querier {
	return recordingQuerier{Querier: storage.NoopQuerier(), r: r}
}

func (r *selectRecorder) ChunkQuerier(string, int64, int64, func(ulid.ULID) bool) storage.ChunkQuerier {
	return storage.NoopChunkedQuerier()
}

func (r *selectRecorder) take() []bool {
	r.mtx.Lock()
	defer r.mtx.Unlock()
	out := r.atSteps
	r.atSteps = nil
	return out
}

type recordingQuerier struct {
	storage.Querier
	r *selectRecorder
}

func (q recordingQuerier) Select(ctx context.Context, sorted bool, h *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
	q.r.mtx.Lock()
	q.r.atSteps = append(q.r.atSteps, downsample.SelectsAtSteps(ctx))
	q.r.mtx.Unlock()
	return q.Querier.Select(ctx, sorted, h, ms...)
}

// The bucket store may read only the chunks of a range query's step windows
// when no selector is evaluated elsewhere: the API says so for range queries
// without subqueries or @, of every tenant, and never for instant queries.
func TestRangeQueriesMarkSelectsAtSteps(t *testing.T) {
	rec := &selectRecorder{}
	srv, now := newTestAPIWith(t, func(o *Options) { o.Sources = append(o.Sources, rec) })
	end := strconv.FormatInt(now/1000, 10)
	start := strconv.FormatInt(now/1000-3600, 10)
	for _, c := range []struct {
		path, query string
		want        bool
	}{
		{"/api/v1/query_range", `rate(DCGM_FI_DEV_GPU_TEMP[5m])`, true},
		{"/api/v1/query_range", `max_over_time(rate(DCGM_FI_DEV_GPU_TEMP[5m])[30m:1m])`, false},
		{"/api/v1/query_range", `rate(DCGM_FI_DEV_GPU_TEMP[5m] @ end())`, false},
		{"/api/v1/query", `rate(DCGM_FI_DEV_GPU_TEMP[5m])`, false},
	} {
		params := url.Values{"query": {c.query}, "start": {start}, "end": {end}, "step": {"600"}, "time": {end}}
		if code, r := call(t, srv, http.MethodPost, c.path, params); code != http.StatusOK {
			t.Fatalf("%s %s: %d %+v", c.path, c.query, code, r)
		}
		got := rec.take()
		if len(got) == 0 {
			t.Fatalf("%s %s: the source saw no select", c.path, c.query)
		}
		for _, g := range got {
			if g != c.want {
				t.Errorf("%s %s: select marked at steps %v, want %v", c.path, c.query, g, c.want)
			}
		}
	}
}
