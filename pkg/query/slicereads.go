package query

import (
	"context"
	"sync"
)

// A sliced range query (slicedQuery) runs its slices in parallel, each an
// ordinary range query over a part of the steps, each selecting the same
// series over its part of the time. Where a select is cheap to cut but
// costly to make, as a read of the ring's receivers (a request to each of
// a read quorum, each a TSDB select on a receiver), the slices share one:
// the first slice to come reads what the whole query's select would read,
// the others wait for it, and each keeps its own part.

// Slice is one slice of a sliced range query, in the context of its
// execution (SliceOf).
type Slice struct {
	// From and To are the slice's first and last step, Start and End the
	// whole query's (Unix ms).
	From, To, Start, End int64
	shared               *sharedReads
}

type sliceKey struct{}

// SliceOf returns the slice of a sliced range query that ctx executes.
func SliceOf(ctx context.Context) (Slice, bool) {
	s, ok := ctx.Value(sliceKey{}).(Slice)
	return s, ok && s.shared != nil
}

func withSlice(ctx context.Context, s Slice) context.Context {
	return context.WithValue(ctx, sliceKey{}, s)
}

// Widen returns the range the whole query's select reads where the
// slice's reads [mint, maxt]: a step's reads depend on its time alone, so
// the slice's range moves with its first and last step.
func (s Slice) Widen(mint, maxt int64) (int64, int64) {
	return mint - (s.From - s.Start), maxt + (s.End - s.To)
}

// Share returns what read returns, reading once for all the slices of
// the query that share it with the same key: the first to come reads,
// the others wait for its result (or for their context to end).
func (s Slice) Share(ctx context.Context, key string, read func() (any, error)) (any, error) {
	return s.shared.do(ctx, key, read)
}

type sharedReads struct {
	mtx   sync.Mutex
	reads map[string]*sharedRead
}

type sharedRead struct {
	done chan struct{}
	v    any
	err  error
}

func newSharedReads() *sharedReads { return &sharedReads{reads: map[string]*sharedRead{}} }

func (r *sharedReads) do(ctx context.Context, key string, read func() (any, error)) (any, error) {
	r.mtx.Lock()
	sr, ok := r.reads[key]
	if !ok {
		sr = &sharedRead{done: make(chan struct{})}
		r.reads[key] = sr
	}
	r.mtx.Unlock()
	if !ok {
		sr.v, sr.err = read()
		close(sr.done)
		return sr.v, sr.err
	}
	select {
	case <-sr.done:
		return sr.v, sr.err
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}
