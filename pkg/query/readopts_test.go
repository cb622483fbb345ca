package query

import (
	"context"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"

	"github.com/gpustore/gpustore/pkg/downsample"
	"github.com/gpustore/gpustore/pkg/readopts"
)

// optionsRecorder is a Source that notes the read options its queriers are
// opened with, once per select (and the selects' matchers).
type optionsRecorder struct {
	downsampled bool // HasDownsampled's answer

	mtx  sync.Mutex
	seen []readopts.ReadOptions
	ms   [][]*labels.Matcher
}

func (r *optionsRecorder) Querier(_ string, _, _ int64, o readopts.ReadOptions) (downsample.Querier, error) {
	return recordingQuerier{Querier: storage.NoopQuerier(), r: r, o: o}, nil
}

func (r *optionsRecorder) ChunkQuerier(string, int64, int64, readopts.ReadOptions) (storage.ChunkQuerier, error) {
	return storage.NoopChunkedQuerier(), nil
}

func (r *optionsRecorder) HasDownsampled(string) bool { return r.downsampled }

// take returns the options of the selects since the last take.
func (r *optionsRecorder) take() []readopts.ReadOptions {
	r.mtx.Lock()
	defer r.mtx.Unlock()
	out := r.seen
	r.seen, r.ms = nil, nil
	return out
}

type recordingQuerier struct {
	storage.Querier
	downsample.NoFolding
	r *optionsRecorder
	o readopts.ReadOptions
}

func (q recordingQuerier) Select(ctx context.Context, sorted bool, h *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
	q.r.mtx.Lock()
	q.r.seen = append(q.r.seen, q.o)
	q.r.ms = append(q.r.ms, ms)
	q.r.mtx.Unlock()
	return q.Querier.Select(ctx, sorted, h, ms...)
}

// withDedup is ctx with read options that deduplicate by replicaLabels
// (as the API's default or a rule's).
func withDedup(ctx context.Context, replicaLabels []string) context.Context {
	o := readopts.FromContext(ctx)
	o.ReplicaLabels = replicaLabels
	return readopts.NewContext(ctx, o)
}

// The bucket store may read only the chunks of a range query's step windows
// when no selector is evaluated elsewhere: the API says so for range queries
// without subqueries or @, of every tenant, and never for instant queries.
func TestRangeQueriesMarkSelectsAtSteps(t *testing.T) {
	rec := &optionsRecorder{}
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
			if g.AtSteps != c.want {
				t.Errorf("%s %s: select marked at steps %v, want %v", c.path, c.query, g.AtSteps, c.want)
			}
		}
	}
}

// Every read option a request sets through the HTTP API reaches the
// sources' queriers as a value: deduplication (on by default with replica
// labels configured, off with dedup=false), max_source_resolution (the
// request's, else the configured default), the selects at steps, the
// labels a query names (for a tenant with downsampled blocks), and what
// the local TSDB serves itself (its blocks and the time its raw data
// begins at).
func TestReadOptionsReachTheSources(t *testing.T) {
	rec := &optionsRecorder{}
	srv, now := newTestAPIWith(t, func(o *Options) {
		o.Sources = append(o.Sources, rec)
		o.Config.ReplicaLabels = []string{"__replica__"}
		o.Config.MaxSourceResolution = "1h"
	})
	end := strconv.FormatInt(now/1000, 10)
	start := strconv.FormatInt(now/1000-3600, 10)
	headFrom := now - 19*15000 // newTestAPIHandler's oldest sample of tenant "default"
	rangeQ := func(q string, extra ...string) url.Values {
		v := url.Values{"query": {q}, "start": {start}, "end": {end}, "step": {"60"}}
		for i := 0; i+1 < len(extra); i += 2 {
			v.Set(extra[i], extra[i+1])
		}
		return v
	}
	for _, c := range []struct {
		name        string
		downsampled bool
		path        string
		params      url.Values
		want        readopts.ReadOptions
		// wantMatcher, when set, is a label some select must match on (a
		// rewritten query's).
		wantMatcher string
	}{
		{"defaults", false, "/api/v1/query_range", rangeQ(`rate(DCGM_FI_DEV_GPU_TEMP[5m])`),
			readopts.ReadOptions{ReplicaLabels: []string{"__replica__"}, MaxSourceResolution: downsample.Res1h, AtSteps: true}, ""},
		{"dedup=false", false, "/api/v1/query_range", rangeQ(`rate(DCGM_FI_DEV_GPU_TEMP[5m])`, "dedup", "false"),
			readopts.ReadOptions{MaxSourceResolution: downsample.Res1h, AtSteps: true}, ""},
		{"max_source_resolution=raw", false, "/api/v1/query_range", rangeQ(`DCGM_FI_DEV_GPU_TEMP`, "max_source_resolution", "raw"),
			readopts.ReadOptions{ReplicaLabels: []string{"__replica__"}, MaxSourceResolution: downsample.ResRaw, AtSteps: true}, ""},
		{"max_source_resolution=auto, an instant query", false, "/api/v1/query",
			url.Values{"query": {`DCGM_FI_DEV_GPU_TEMP`}, "time": {end}, "max_source_resolution": {"auto"}},
			readopts.ReadOptions{ReplicaLabels: []string{"__replica__"}, MaxSourceResolution: downsample.Auto}, ""},
		{"a subquery: not at steps", false, "/api/v1/query_range", rangeQ(`max_over_time(DCGM_FI_DEV_GPU_TEMP[10m:1m])`, "max_source_resolution", "5m"),
			readopts.ReadOptions{ReplicaLabels: []string{"__replica__"}, MaxSourceResolution: downsample.Res5m}, ""},
		{"the labels a query names, with downsampled blocks", true, "/api/v1/query_range", rangeQ(`max by (pod) (DCGM_FI_DEV_GPU_TEMP{Hostname="node-1"})`),
			readopts.ReadOptions{ReplicaLabels: []string{"__replica__"}, MaxSourceResolution: downsample.Res1h, AtSteps: true,
				QueryLabels: []string{"Hostname", "pod"}}, ""}, // in any order
		{"count_over_time rewritten, with downsampled blocks", true, "/api/v1/query_range", rangeQ(`sum(count_over_time(DCGM_FI_DEV_GPU_TEMP[5m]))`),
			readopts.ReadOptions{ReplicaLabels: []string{"__replica__"}, MaxSourceResolution: downsample.Res1h, AtSteps: true},
			downsample.AggrLabel},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec.downsampled = c.downsampled
			if code, r := call(t, srv, http.MethodPost, c.path, c.params); code != http.StatusOK {
				t.Fatalf("%d %+v", code, r)
			}
			rec.mtx.Lock()
			ms := rec.ms
			rec.mtx.Unlock()
			got := rec.take()
			if len(got) == 0 {
				t.Fatal("the source saw no select")
			}
			for _, g := range got {
				if !slices.Equal(g.ReplicaLabels, c.want.ReplicaLabels) || g.MaxSourceResolution != c.want.MaxSourceResolution ||
					g.AtSteps != c.want.AtSteps || !slices.Equal(slices.Sorted(slices.Values(g.QueryLabels)), c.want.QueryLabels) {
					t.Errorf("the source was opened with %+v, want %+v", g, c.want)
				}
				// The local TSDB of tenant "default" holds its head: the
				// source is told, and reads raw data from its start.
				if g.LocalFrom != headFrom {
					t.Errorf("LocalFrom %d, want the head's first sample %d", g.LocalFrom, headFrom)
				}
				if g.LocalBlocks == nil {
					t.Error("no LocalBlocks: the source cannot leave out the local TSDB's blocks")
				}
			}
			if c.wantMatcher != "" && !slices.ContainsFunc(ms, func(ms []*labels.Matcher) bool {
				return slices.ContainsFunc(ms, func(m *labels.Matcher) bool { return m.Name == c.wantMatcher })
			}) {
				t.Errorf("no select asked for %s (the rewritten query's): %v", c.wantMatcher, ms)
			}
		})
	}
	// Bad options are the request's fault: 400 before any read.
	for _, v := range []url.Values{
		rangeQ(`DCGM_FI_DEV_GPU_TEMP`, "dedup", "maybe"),
		rangeQ(`DCGM_FI_DEV_GPU_TEMP`, "max_source_resolution", "2m"),
	} {
		if code, r := call(t, srv, http.MethodPost, "/api/v1/query_range", v); code != http.StatusBadRequest || r.ErrorType != "bad_data" {
			t.Errorf("%v: %d %+v, want 400 bad_data", v, code, r)
		}
		if got := rec.take(); len(got) != 0 {
			t.Errorf("%v: the source was read", v)
		}
	}
}
