package query

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/grafana/dskit/tenant"
	"github.com/prometheus/prometheus/model/exemplar"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/util/annotations"

	"github.com/gpustore/gpustore/pkg/seriesset"
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
	// Receivers are the ring's receivers (scale-out; nil without it): their
	// heads and local blocks are raw data like the local TSDB's; they keep
	// about the last ReceiversLookback, which the bucket then reads raw.
	Receivers         Source
	ReceiversLookback time.Duration
}

// Querier implements storage.Queryable.
func (q TenantQueryable) Querier(mint, maxt int64) (storage.Querier, error) {
	return &tenantQuerier[storage.SeriesSet, storage.Querier]{
		open: func(id string) (storage.Querier, error) { return q.openQuerier(id, mint, maxt) },
		sel:  selectSamples,
		fail: storage.ErrSeriesSet,
	}, nil
}

// ChunkQuerier implements storage.ChunkQueryable (used by remote read).
func (q TenantQueryable) ChunkQuerier(mint, maxt int64) (storage.ChunkQuerier, error) {
	return &tenantQuerier[storage.ChunkSeriesSet, storage.ChunkQuerier]{
		open: func(id string) (storage.ChunkQuerier, error) {
			return q.openChunkQuerier(id, mint, maxt)
		},
		sel:  selectChunks,
		fail: storage.ErrChunkSeriesSet,
	}, nil
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

// querier is storage.Querier (S: storage.SeriesSet) or storage.ChunkQuerier
// (S: storage.ChunkSeriesSet).
type querier[S any] interface {
	storage.LabelQuerier
	Select(ctx context.Context, sortSeries bool, hints *storage.SelectHints, matchers ...*labels.Matcher) S
}

// tenantQuerier opens the tenant's querier on first use: the tenant is only
// known once a call with a context arrives.
type tenantQuerier[S any, Q querier[S]] struct {
	open func(tenant string) (Q, error)
	sel  func(ctx context.Context, q Q, sortSeries bool, hints *storage.SelectHints, matchers ...*labels.Matcher) S
	fail func(error) S

	mtx    sync.Mutex // the engine may select from several goroutines
	q      Q
	opened bool
	tenant string
}

func (t *tenantQuerier[S, Q]) resolve(ctx context.Context) (Q, error) {
	var none Q
	id, err := tenant.TenantID(ctx)
	if err != nil {
		return none, err
	}
	t.mtx.Lock()
	defer t.mtx.Unlock()
	if t.opened {
		if id != t.tenant {
			return none, fmt.Errorf("querier of tenant %q used for tenant %q", t.tenant, id)
		}
		return t.q, nil
	}
	q, err := t.open(id)
	if err != nil {
		return none, err
	}
	t.q, t.tenant, t.opened = q, id, true
	return q, nil
}

func (t *tenantQuerier[S, Q]) Select(ctx context.Context, sortSeries bool, hints *storage.SelectHints, matchers ...*labels.Matcher) S {
	q, err := t.resolve(ctx)
	if err != nil {
		return t.fail(err)
	}
	return t.sel(ctx, q, sortSeries, hints, matchers...)
}

// selectSamples selects from the tenant's querier and, unless the request
// turned it off, merges the replicas of an HA pair (dedup.go). The series
// are selected in label order whether the caller asks or not (the engine
// does not): the engine ranks ties (topk, bottomk) in the order it is
// handed series, and Prometheus hands them in label order whenever a query
// reads a block; a head alone would give them in the order remote write
// created them, which two systems never share.
func selectSamples(ctx context.Context, q storage.Querier, _ bool, hints *storage.SelectHints, matchers ...*labels.Matcher) storage.SeriesSet {
	ss := q.Select(ctx, true, hints, matchers...)
	if replicaLabels := dedupLabels(ctx); len(replicaLabels) > 0 {
		ss = dedupSeriesSet(ss, replicaLabels, hints)
	}
	return timeoutSeriesSet{seriesset.Decoded(ss)}
}

// selectChunks is selectSamples for chunk queries (remote read): merging
// replicas needs their samples, so the merged series are encoded again.
func selectChunks(ctx context.Context, q storage.ChunkQuerier, sortSeries bool, hints *storage.SelectHints, matchers ...*labels.Matcher) storage.ChunkSeriesSet {
	if replicaLabels := dedupLabels(ctx); len(replicaLabels) > 0 {
		ss := storage.NewSeriesSetFromChunkSeriesSet(q.Select(ctx, sortSeries, hints, matchers...))
		return storage.NewSeriesSetToChunkSet(timeoutSeriesSet{dedupSeriesSet(ss, replicaLabels, hints)})
	}
	return q.Select(ctx, sortSeries, hints, matchers...)
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

func (t *tenantQuerier[S, Q]) LabelValues(ctx context.Context, name string, hints *storage.LabelHints, matchers ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	q, err := t.resolve(ctx)
	if err != nil {
		return nil, nil, err
	}
	vals, ann, err := q.LabelValues(ctx, name, hints, matchers...)
	return vals, ann, asTimeout(err)
}

func (t *tenantQuerier[S, Q]) LabelNames(ctx context.Context, hints *storage.LabelHints, matchers ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	q, err := t.resolve(ctx)
	if err != nil {
		return nil, nil, err
	}
	names, ann, err := q.LabelNames(ctx, hints, matchers...)
	return names, ann, asTimeout(err)
}

func (t *tenantQuerier[S, Q]) Close() error {
	t.mtx.Lock()
	defer t.mtx.Unlock()
	if !t.opened {
		return nil
	}
	return t.q.Close()
}

type emptyExemplarQuerier struct{}

func (emptyExemplarQuerier) Select(int64, int64, ...[]*labels.Matcher) ([]exemplar.QueryResult, error) {
	return nil, nil
}
