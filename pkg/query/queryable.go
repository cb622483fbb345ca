package query

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/grafana/dskit/tenant"
	"github.com/prometheus/prometheus/model/exemplar"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/util/annotations"

	"github.com/gpustore/gpustore/pkg/tenantdb"
)

// TenantQueryable is a storage.SampleAndChunkQueryable whose data depends on
// the tenant in the context of each call: PromQL's engine and Prometheus' API
// know nothing of tenants, but every Select and label call carries the
// request's context. A tenant that has never written has no data and gets
// empty results (nothing is created for it).
//
// Later sources (bucket blocks, other receivers) join here, behind the
// per-tenant querier, merged with storage.NewMergeQuerier.
type TenantQueryable struct {
	DBs *tenantdb.Manager
	// Sources are merged with the head and local blocks (see sources.go):
	// the bucket's blocks when the bucket store runs.
	Sources []Source
}

// Querier implements storage.Queryable.
func (q TenantQueryable) Querier(mint, maxt int64) (storage.Querier, error) {
	return &tenantQuerier{dbs: q.DBs, sources: q.Sources, mint: mint, maxt: maxt}, nil
}

// ChunkQuerier implements storage.ChunkQueryable (used by remote read).
func (q TenantQueryable) ChunkQuerier(mint, maxt int64) (storage.ChunkQuerier, error) {
	return &tenantChunkQuerier{dbs: q.DBs, sources: q.Sources, mint: mint, maxt: maxt}, nil
}

// ExemplarQuerier implements storage.ExemplarQueryable.
func (q TenantQueryable) ExemplarQuerier(ctx context.Context) (storage.ExemplarQuerier, error) {
	id, err := tenant.TenantID(ctx)
	if err != nil {
		return nil, err
	}
	db := q.DBs.Existing(id)
	if db == nil {
		return emptyExemplarQuerier{}, nil
	}
	return db.ExemplarQuerier(ctx)
}

// tenantQuerier opens the tenant's querier on first use: the tenant is only
// known once a call with a context arrives.
type tenantQuerier struct {
	dbs        *tenantdb.Manager
	sources    []Source
	mint, maxt int64

	mtx    sync.Mutex // the engine may select from several goroutines
	q      storage.Querier
	tenant string
}

func (t *tenantQuerier) resolve(ctx context.Context) (storage.Querier, error) {
	id, err := tenant.TenantID(ctx)
	if err != nil {
		return nil, err
	}
	t.mtx.Lock()
	defer t.mtx.Unlock()
	if t.q != nil {
		if id != t.tenant {
			return nil, fmt.Errorf("querier of tenant %q used for tenant %q", t.tenant, id)
		}
		return t.q, nil
	}
	q, err := openQuerier(t.dbs, t.sources, id, t.mint, t.maxt)
	if err != nil {
		return nil, err
	}
	t.q, t.tenant = q, id
	return q, nil
}

func (t *tenantQuerier) Select(ctx context.Context, sortSeries bool, hints *storage.SelectHints, matchers ...*labels.Matcher) storage.SeriesSet {
	q, err := t.resolve(ctx)
	if err != nil {
		return storage.ErrSeriesSet(err)
	}
	if replicaLabels := dedupLabels(ctx); len(replicaLabels) > 0 {
		return timeoutSeriesSet{dedupSeriesSet(q.Select(ctx, true, hints, matchers...), replicaLabels, hints)}
	}
	return timeoutSeriesSet{q.Select(ctx, sortSeries, hints, matchers...)}
}

// asTimeout turns a deadline met inside storage into PromQL's query timeout,
// which the API answers with 503 like a timeout the engine notices itself
// (otherwise it would be an execution error, 422, depending on where the
// deadline struck).
func asTimeout(err error) error {
	if err != nil && errors.Is(err, context.DeadlineExceeded) {
		return promql.ErrQueryTimeout(err.Error())
	}
	return err
}

type timeoutSeriesSet struct{ storage.SeriesSet }

func (s timeoutSeriesSet) Err() error { return asTimeout(s.SeriesSet.Err()) }

func (t *tenantQuerier) LabelValues(ctx context.Context, name string, hints *storage.LabelHints, matchers ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	q, err := t.resolve(ctx)
	if err != nil {
		return nil, nil, err
	}
	vals, ann, err := q.LabelValues(ctx, name, hints, matchers...)
	return vals, ann, asTimeout(err)
}

func (t *tenantQuerier) LabelNames(ctx context.Context, hints *storage.LabelHints, matchers ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	q, err := t.resolve(ctx)
	if err != nil {
		return nil, nil, err
	}
	names, ann, err := q.LabelNames(ctx, hints, matchers...)
	return names, ann, asTimeout(err)
}

func (t *tenantQuerier) Close() error {
	t.mtx.Lock()
	defer t.mtx.Unlock()
	if t.q == nil {
		return nil
	}
	return t.q.Close()
}

type tenantChunkQuerier struct {
	dbs        *tenantdb.Manager
	sources    []Source
	mint, maxt int64

	mtx    sync.Mutex
	q      storage.ChunkQuerier
	tenant string
}

func (t *tenantChunkQuerier) resolve(ctx context.Context) (storage.ChunkQuerier, error) {
	id, err := tenant.TenantID(ctx)
	if err != nil {
		return nil, err
	}
	t.mtx.Lock()
	defer t.mtx.Unlock()
	if t.q != nil {
		if id != t.tenant {
			return nil, fmt.Errorf("querier of tenant %q used for tenant %q", t.tenant, id)
		}
		return t.q, nil
	}
	q, err := openChunkQuerier(t.dbs, t.sources, id, t.mint, t.maxt)
	if err != nil {
		return nil, err
	}
	t.q, t.tenant = q, id
	return q, nil
}

func (t *tenantChunkQuerier) Select(ctx context.Context, sortSeries bool, hints *storage.SelectHints, matchers ...*labels.Matcher) storage.ChunkSeriesSet {
	q, err := t.resolve(ctx)
	if err != nil {
		return storage.ErrChunkSeriesSet(err)
	}
	return q.Select(ctx, sortSeries, hints, matchers...)
}

func (t *tenantChunkQuerier) LabelValues(ctx context.Context, name string, hints *storage.LabelHints, matchers ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	q, err := t.resolve(ctx)
	if err != nil {
		return nil, nil, err
	}
	return q.LabelValues(ctx, name, hints, matchers...)
}

func (t *tenantChunkQuerier) LabelNames(ctx context.Context, hints *storage.LabelHints, matchers ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	q, err := t.resolve(ctx)
	if err != nil {
		return nil, nil, err
	}
	return q.LabelNames(ctx, hints, matchers...)
}

func (t *tenantChunkQuerier) Close() error {
	t.mtx.Lock()
	defer t.mtx.Unlock()
	if t.q == nil {
		return nil
	}
	return t.q.Close()
}

type emptyExemplarQuerier struct{}

func (emptyExemplarQuerier) Select(int64, int64, ...[]*labels.Matcher) ([]exemplar.QueryResult, error) {
	return nil, nil
}
