// Package querylimit counts what one query fetches from storage, against
// its tenant's limits (pkg/limits: max_fetched_series_per_query,
// max_fetched_chunk_bytes_per_query).
//
// A Limiter travels in the query's context. Every part of the read path
// that fetches reports to it: the query path counts each series it hands
// the engine once, whatever sources (head, local and bucket blocks, the
// ring's receivers) it was merged from; pkg/blockquery counts the bytes of
// each block chunk it opens, for local and bucket blocks alike,
// pkg/tenantdb those of the head's chunks, and pkg/ringread those of the
// chunks the ring's receivers send. A query
// split into slices or days shares one Limiter, so the limit is the whole
// request's. The first report past a limit returns an *Error, which the
// read path returns as its error: the query stops there, answered 422 as
// Prometheus answers a query over its max samples.
//
// The package depends on nothing of gpustore, so the lowest layers of the
// read path can report to it.
package querylimit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/prometheus/prometheus/model/labels"
)

// Limiter counts one query's fetches. A nil *Limiter counts nothing and
// never refuses: a context without one (rule evaluation, remote read)
// fetches without these limits.
type Limiter struct {
	tenant        string
	maxSeries     int
	maxChunkBytes int64

	mtx    sync.Mutex
	series map[uint64]struct{} // hashes of the series counted; nil without maxSeries

	chunkBytes atomic.Int64
}

// New returns a Limiter of tenant's query: at most maxSeries distinct
// series and maxChunkBytes bytes of chunks (0: unlimited). It returns nil
// when both are unlimited: nothing to count.
func New(tenant string, maxSeries, maxChunkBytes int) *Limiter {
	if maxSeries <= 0 && maxChunkBytes <= 0 {
		return nil
	}
	l := &Limiter{tenant: tenant, maxSeries: maxSeries, maxChunkBytes: int64(maxChunkBytes)}
	if maxSeries > 0 {
		l.series = make(map[uint64]struct{})
	}
	return l
}

// AddSeries counts lset among the query's series (once, however often it
// is reported: a selector read by several slices, or a series selected by
// two selectors of the query, is one series fetched).
func (l *Limiter) AddSeries(lset labels.Labels) error {
	if l == nil || l.maxSeries <= 0 {
		return nil
	}
	h := lset.Hash()
	l.mtx.Lock()
	l.series[h] = struct{}{}
	n := len(l.series)
	l.mtx.Unlock()
	if n > l.maxSeries {
		return &Error{Tenant: l.tenant, Limit: "max_fetched_series_per_query", Max: int64(l.maxSeries),
			what: fmt.Sprintf("more than %d series", l.maxSeries)}
	}
	return nil
}

// AddChunkBytes counts n bytes of chunks read.
func (l *Limiter) AddChunkBytes(n int) error {
	if l == nil || l.maxChunkBytes <= 0 {
		return nil
	}
	if l.chunkBytes.Add(int64(n)) > l.maxChunkBytes {
		return &Error{Tenant: l.tenant, Limit: "max_fetched_chunk_bytes_per_query", Max: l.maxChunkBytes,
			what: fmt.Sprintf("more than %d bytes of chunks", l.maxChunkBytes)}
	}
	return nil
}

// Error is a query stopped by one of its tenant's limits.
type Error struct {
	Tenant string
	Limit  string // the limit's name in the limits file
	Max    int64
	what   string
}

func (e *Error) Error() string {
	return fmt.Sprintf("the query would fetch %s, over the limit %s of tenant %q: select fewer series (more matchers) or a shorter range, or ask for a higher limit",
		e.what, e.Limit, e.Tenant)
}

// IsError reports whether err is, or wraps, a query limit's Error.
func IsError(err error) bool {
	var e *Error
	return errors.As(err, &e)
}

type ctxKey struct{}

// With returns ctx carrying l.
func With(ctx context.Context, l *Limiter) context.Context {
	if l == nil {
		return ctx
	}
	return context.WithValue(ctx, ctxKey{}, l)
}

// From returns the Limiter ctx carries, nil when none.
func From(ctx context.Context) *Limiter {
	l, _ := ctx.Value(ctxKey{}).(*Limiter)
	return l
}
