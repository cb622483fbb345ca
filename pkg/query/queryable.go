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

	"github.com/gpustore/gpustore/pkg/readopts"
	"github.com/gpustore/gpustore/pkg/seriesset"
	"github.com/gpustore/gpustore/pkg/tenantdb"
)

// TenantQueryable is a storage.SampleAndChunkQueryable whose data depends on
// the tenant in the context of each call: PromQL's engine and Prometheus' API
// know nothing of tenants, but every Select and label call carries the
// request's context. A tenant that has never written has no data and gets
// empty results (nothing is created for it).
//
// The context also carries the request's read options
// (readopts.NewContext, set where the request is parsed): they are taken
// out once, when the tenant's querier is opened, and handed to every source
// as a value (openQuerier in sources.go merges the head and local blocks,
// the ring's receivers and the sources).
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
		open: func(id string, opts readopts.ReadOptions) (storage.Querier, error) {
			return q.openQuerier(id, mint, maxt, opts)
		},
		sel:  selectSamples,
		fail: storage.ErrSeriesSet,
	}, nil
}

// ChunkQuerier implements storage.ChunkQueryable (used by remote read).
func (q TenantQueryable) ChunkQuerier(mint, maxt int64) (storage.ChunkQuerier, error) {
	return &tenantQuerier[storage.ChunkSeriesSet, storage.ChunkQuerier]{
		open: func(id string, opts readopts.ReadOptions) (storage.ChunkQuerier, error) {
			return q.openChunkQuerier(id, mint, maxt, opts)
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

// tenantQuerier opens the tenant's querier on first use: the tenant and
// the read's options are only known once a call with a context arrives.
// All the calls of one querier are one query's, with one request's options.
type tenantQuerier[S any, Q querier[S]] struct {
	open func(tenant string, opts readopts.ReadOptions) (Q, error)
	sel  func(ctx context.Context, q Q, opts readopts.ReadOptions, sortSeries bool, hints *storage.SelectHints, matchers ...*labels.Matcher) S
	fail func(error) S

	mtx    sync.Mutex // the engine may select from several goroutines
	q      Q
	opened bool
	tenant string
	opts   readopts.ReadOptions
}

func (t *tenantQuerier[S, Q]) resolve(ctx context.Context) (Q, readopts.ReadOptions, error) {
	var none Q
	id, err := tenant.TenantID(ctx)
	if err != nil {
		return none, readopts.ReadOptions{}, err
	}
	t.mtx.Lock()
	defer t.mtx.Unlock()
	if t.opened {
		if id != t.tenant {
			return none, readopts.ReadOptions{}, fmt.Errorf("querier of tenant %q used for tenant %q", t.tenant, id)
		}
		return t.q, t.opts, nil
	}
	opts := readopts.FromContext(ctx)
	q, err := t.open(id, opts)
	if err != nil {
		return none, readopts.ReadOptions{}, err
	}
	t.q, t.tenant, t.opts, t.opened = q, id, opts, true
	return q, opts, nil
}

func (t *tenantQuerier[S, Q]) Select(ctx context.Context, sortSeries bool, hints *storage.SelectHints, matchers ...*labels.Matcher) S {
	q, opts, err := t.resolve(ctx)
	if err != nil {
		return t.fail(err)
	}
	return t.sel(ctx, q, opts, sortSeries, hints, matchers...)
}

// selectSamples selects from the tenant's querier and, unless the request
// turned it off (no opts.ReplicaLabels), merges the replicas of an HA pair
// (dedup.go). The merged
// series are counted against the query's max_fetched_series_per_query
// here, where every source's series meet, each once. The series
// are selected in label order whether the caller asks or not (the engine
// does not): the engine ranks ties (topk, bottomk) in the order it is
// handed series, and Prometheus hands them in label order whenever a query
// reads a block; a head alone would give them in the order remote write
// created them, which two systems never share.
func selectSamples(ctx context.Context, q storage.Querier, opts readopts.ReadOptions, _ bool, hints *storage.SelectHints, matchers ...*labels.Matcher) storage.SeriesSet {
	ss := q.Select(ctx, true, hints, matchers...)
	if len(opts.ReplicaLabels) > 0 {
		ss = dedupSeriesSet(ss, opts.ReplicaLabels, hints)
	}
	return timeoutSeriesSet{seriesset.Decoded(countSeries(ctx, ss))}
}

// selectChunks is selectSamples for chunk queries (remote read): merging
// replicas needs their samples, so the merged series are encoded again.
func selectChunks(ctx context.Context, q storage.ChunkQuerier, opts readopts.ReadOptions, sortSeries bool, hints *storage.SelectHints, matchers ...*labels.Matcher) storage.ChunkSeriesSet {
	if len(opts.ReplicaLabels) > 0 {
		ss := storage.NewSeriesSetFromChunkSeriesSet(q.Select(ctx, sortSeries, hints, matchers...))
		return storage.NewSeriesSetToChunkSet(timeoutSeriesSet{countSeries(ctx, dedupSeriesSet(ss, opts.ReplicaLabels, hints))})
	}
	return countChunkSeries(ctx, q.Select(ctx, sortSeries, hints, matchers...))
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
	q, _, err := t.resolve(ctx)
	if err != nil {
		return nil, nil, err
	}
	vals, ann, err := q.LabelValues(ctx, name, hints, matchers...)
	return vals, ann, asTimeout(err)
}

func (t *tenantQuerier[S, Q]) LabelNames(ctx context.Context, hints *storage.LabelHints, matchers ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	q, _, err := t.resolve(ctx)
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
