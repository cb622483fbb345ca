package query

import (
	"context"
	"sync"

	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"

	"github.com/gpustore/gpustore/pkg/limits"
	"github.com/gpustore/gpustore/pkg/limits/querylimit"
)

// TenantLimits are the per-tenant limits of queries (limits.Overrides,
// reloaded at run time: each request reads them as it is admitted).
type TenantLimits interface {
	QueryLimits(tenant string) limits.QueryLimits
}

// tenantSlots bounds the queries of each tenant that run at once
// (max_concurrent_queries), beside the process-wide query.max_concurrency:
// a tenant at its bound waits for one of its own slots before it takes one
// of the process's, so the process's slots stay free for the others.
type tenantSlots struct {
	mtx      sync.Mutex
	byTenant map[string]*slotGroup
}

// slotGroup is a tenant's slots at one bound. When a reload changes the
// bound, new queries take slots of a new group of the new size, and those
// running give theirs back to the old one: for as long as they run, the
// tenant may run up to both bounds together.
type slotGroup struct {
	slots chan struct{}
	users int // queries holding or waiting for a slot; the group is dropped at 0
}

func newTenantSlots() *tenantSlots { return &tenantSlots{byTenant: map[string]*slotGroup{}} }

// acquire waits for one of tenant's limit slots (limit <= 0: none to wait
// for) until ctx ends. release gives it back.
func (t *tenantSlots) acquire(ctx context.Context, tenant string, limit int) (release func(), err error) {
	if limit <= 0 {
		return func() {}, nil
	}
	t.mtx.Lock()
	g := t.byTenant[tenant]
	if g == nil || cap(g.slots) != limit {
		g = &slotGroup{slots: make(chan struct{}, limit)}
		t.byTenant[tenant] = g
	}
	g.users++
	t.mtx.Unlock()
	leave := func() {
		t.mtx.Lock()
		if g.users--; g.users == 0 && t.byTenant[tenant] == g {
			delete(t.byTenant, tenant)
		}
		t.mtx.Unlock()
	}
	select {
	case g.slots <- struct{}{}:
		return func() { <-g.slots; leave() }, nil
	case <-ctx.Done():
		leave()
		return nil, ctx.Err()
	}
}

// countedSeriesSet reports each series it yields to the query's limiter
// (querylimit): the series of every source, merged, each once.
type countedSeriesSet struct {
	storage.SeriesSet
	limiter *querylimit.Limiter
	err     error
}

func countSeries(ctx context.Context, ss storage.SeriesSet) storage.SeriesSet {
	if l := querylimit.From(ctx); l != nil {
		return &countedSeriesSet{SeriesSet: ss, limiter: l}
	}
	return ss
}

func (s *countedSeriesSet) Next() bool {
	if s.err != nil || !s.SeriesSet.Next() {
		return false
	}
	if err := s.limiter.AddSeries(s.SeriesSet.At().Labels()); err != nil {
		s.err = err
		return false
	}
	return true
}

func (s *countedSeriesSet) Err() error {
	if s.err != nil {
		return s.err
	}
	return s.SeriesSet.Err()
}

// countedChunkSeriesSet is countedSeriesSet for chunk queries.
type countedChunkSeriesSet struct {
	storage.ChunkSeriesSet
	limiter *querylimit.Limiter
	err     error
}

func countChunkSeries(ctx context.Context, ss storage.ChunkSeriesSet) storage.ChunkSeriesSet {
	if l := querylimit.From(ctx); l != nil {
		return &countedChunkSeriesSet{ChunkSeriesSet: ss, limiter: l}
	}
	return ss
}

func (s *countedChunkSeriesSet) Next() bool {
	if s.err != nil || !s.ChunkSeriesSet.Next() {
		return false
	}
	if err := s.limiter.AddSeries(s.ChunkSeriesSet.At().Labels()); err != nil {
		s.err = err
		return false
	}
	return true
}

func (s *countedChunkSeriesSet) Err() error {
	if s.err != nil {
		return s.err
	}
	return s.ChunkSeriesSet.Err()
}

// maxSamplesKey carries a tenant's max_samples_per_query.
type maxSamplesKey struct{}

func withMaxSamples(ctx context.Context, n int) context.Context {
	if n <= 0 {
		return ctx
	}
	return context.WithValue(ctx, maxSamplesKey{}, n)
}

// enginesBySamples hands out a PromQL engine per bound of the samples a
// query may hold: Prometheus' engine takes the bound when it is made, not
// per query. Engines beyond the configured one are made on first use of
// their bound, with the same options and no metrics of their own (the
// process's engine registers them; a second engine could not).
type enginesBySamples struct {
	opts promql.EngineOpts // the configured engine's, Reg nil
	def  *promql.Engine

	mtx    sync.Mutex
	others map[int]*promql.Engine
}

func newEnginesBySamples(def *promql.Engine, opts promql.EngineOpts) *enginesBySamples {
	opts.Reg = nil
	return &enginesBySamples{opts: opts, def: def, others: map[int]*promql.Engine{}}
}

// forContext is the engine of the request's tenant's bound, and the bound.
func (e *enginesBySamples) forContext(ctx context.Context) (*promql.Engine, int) {
	n, ok := ctx.Value(maxSamplesKey{}).(int)
	if !ok || n == e.opts.MaxSamples {
		return e.def, e.opts.MaxSamples
	}
	e.mtx.Lock()
	defer e.mtx.Unlock()
	ng := e.others[n]
	if ng == nil {
		o := e.opts
		o.MaxSamples = n
		ng = promql.NewEngine(o)
		e.others[n] = ng
	}
	return ng, n
}
