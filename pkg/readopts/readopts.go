// Package readopts holds what one read asks of the read path beyond its
// matchers and hints: the request's options (deduplication, the coarsest
// resolution, whether its selects are evaluated at their steps only, the
// labels its query names) and what the query path tells each source it
// opens (what the caller serves itself).
//
// The request's options are parsed once, where the request is (the HTTP
// query API, rule evaluation), and handed to the query path in the
// request's context: that is the one way through Prometheus' PromQL engine,
// which opens queriers and selects knowing nothing but the context. The
// query path takes them out once, when it opens the tenant's querier
// (pkg/query's TenantQueryable), and passes them on as a value to every
// source it opens; nothing below it reads them from a context.
package readopts

import (
	"context"
	"math"

	"github.com/oklog/ulid/v2"
)

// AutoResolution is the MaxSourceResolution that lets each select pick its
// own from its hints (downsample.MaxResolution).
const AutoResolution int64 = -1

// NoLocalFrom is the LocalFrom of a caller that serves no raw data itself.
const NoLocalFrom int64 = math.MaxInt64

// ReadOptions are one read's options. Its zero value is not the default
// (raw only, raw data served locally from 1970): start from Default.
type ReadOptions struct {
	// The request's, set where it is parsed.

	// ReplicaLabels are the labels of a Prometheus HA pair's replicas that
	// query-time deduplication merges series over (none: off). The API sets
	// the configured labels unless the request asks dedup=false (Thanos'
	// parameter); rules always deduplicate.
	ReplicaLabels []string
	// MaxSourceResolution is the coarsest resolution (ms) a select may read
	// downsampled (0: raw only), or AutoResolution: each select picks its
	// own from its step and range. The request's max_source_resolution, or
	// the configured default.
	MaxSourceResolution int64
	// AtSteps says that the request's selects are evaluated at their hints'
	// steps only (a range query without subqueries or @: downsample.Prepare),
	// so that the bucket store may skip the chunks between the steps'
	// windows and judge how downsampled windows fit by the steps.
	AtSteps bool
	// QueryLabels are the label names the request's query uses (set only
	// for a tenant with downsampled blocks): a select whose query names a
	// label that downsampling folded away reads finer data where there is
	// any, even when the select itself does not name it.
	QueryLabels []string

	// The query path's, set per source as it opens it.

	// LocalBlocks reports the bucket blocks the caller serves itself (the
	// receiver's TSDB keeps its recent blocks after shipping them, the
	// ring's receivers answered from theirs): the source leaves them out.
	// Nil: none.
	LocalBlocks func(ulid.ULID) bool
	// LocalFrom is from when the caller serves the tenant's raw data itself
	// (its local TSDB, the ring's receivers), NoLocalFrom when it serves
	// none: the bucket store reads that range raw, never downsampled beside
	// the same samples (count_over_time would count them twice, plain
	// selectors would mix them in).
	LocalFrom int64
	// ServedBlocks, when set, is told during a select which bucket blocks
	// the source's answer covers: the ring's receivers list the blocks on
	// their disks (the ones they shipped and still answer from), and the
	// query path then opens the bucket's querier without them. Nil: nobody
	// asks.
	ServedBlocks func([]ulid.ULID)
}

// Default are the options of a read that asked for nothing: no
// deduplication, each select picks its resolution, nothing served locally.
func Default() ReadOptions {
	return ReadOptions{MaxSourceResolution: AutoResolution, LocalFrom: NoLocalFrom}
}

// Local reports whether the caller serves block id itself.
func (o ReadOptions) Local(id ulid.ULID) bool {
	return o.LocalBlocks != nil && o.LocalBlocks(id)
}

type contextKey struct{}

// NewContext returns ctx carrying the request's options o, for the query
// path to take out when it opens the tenant's querier.
func NewContext(ctx context.Context, o ReadOptions) context.Context {
	return context.WithValue(ctx, contextKey{}, o)
}

// FromContext returns the options NewContext put into ctx, Default when
// none were (a peer's read, remote read, a test). The query path's fields
// are its own to set: they are reset.
func FromContext(ctx context.Context) ReadOptions {
	o, ok := ctx.Value(contextKey{}).(ReadOptions)
	if !ok {
		return Default()
	}
	o.LocalBlocks, o.LocalFrom, o.ServedBlocks = nil, NoLocalFrom, nil
	return o
}
