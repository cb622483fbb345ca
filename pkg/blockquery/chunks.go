package blockquery

import (
	"context"
	"errors"
	"fmt"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/util/annotations"
)

// NewChunkQuerier returns a chunk querier of b's chunks in [mint, maxt]
// for readers that pass chunks on whole (a ring receiver's remote reads,
// SelectHints.DisableTrimming): its selects resolve through c as
// NewQuerier's do, and hand each series' stored chunks that overlap the
// range, never cut or encoded again. Other selects (trimmed chunks,
// series only, sharded), label calls, and blocks with tombstones go to
// the TSDB's own block chunk querier.
func NewChunkQuerier(b tsdb.BlockReader, c *Cache, mint, maxt int64, o Options) (storage.ChunkQuerier, error) {
	q, err := NewQuerier(b, c, mint, maxt, o)
	if err != nil {
		return nil, err
	}
	own, ok := q.(*querier)
	if !ok { // tombstones: the TSDB's
		_ = q.Close()
		return tsdb.NewBlockChunkQuerier(b, mint, maxt)
	}
	return &chunkQuerier{q: own}, nil
}

type chunkQuerier struct {
	q    *querier
	base storage.ChunkQuerier
}

func (q *chunkQuerier) baseQuerier() (storage.ChunkQuerier, error) {
	if q.base == nil {
		b, err := tsdb.NewBlockChunkQuerier(q.q.b, q.q.mint, q.q.maxt)
		if err != nil {
			return nil, err
		}
		q.base = b
	}
	return q.base, nil
}

// Select returns the series matching ms with a chunk in the hinted range,
// sorted by labels.
func (q *chunkQuerier) Select(ctx context.Context, sortSeries bool, hints *storage.SelectHints, ms ...*labels.Matcher) storage.ChunkSeriesSet {
	if hints == nil || !hints.DisableTrimming || hints.Func == "series" || hints.ShardCount > 0 {
		base, err := q.baseQuerier()
		if err != nil {
			return storage.ErrChunkSeriesSet(err)
		}
		return base.Select(ctx, sortSeries, hints, ms...)
	}
	series, err := q.q.resolve(ctx, ms)
	if err != nil {
		return storage.ErrChunkSeriesSet(err)
	}
	return &chunkSeriesSet{q: q.q, series: series, mint: hints.Start, maxt: hints.End, i: -1}
}

func (q *chunkQuerier) LabelValues(ctx context.Context, name string, hints *storage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	base, err := q.baseQuerier()
	if err != nil {
		return nil, nil, err
	}
	return base.LabelValues(ctx, name, hints, ms...)
}

func (q *chunkQuerier) LabelNames(ctx context.Context, hints *storage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	base, err := q.baseQuerier()
	if err != nil {
		return nil, nil, err
	}
	return base.LabelNames(ctx, hints, ms...)
}

func (q *chunkQuerier) Close() error {
	errs := []error{q.q.Close()}
	if q.base != nil {
		errs = append(errs, q.base.Close())
	}
	return errors.Join(errs...)
}

// chunkSeriesSet is a chunk select's series: the resolved series with a
// chunk in [mint, maxt], each with those chunks only.
type chunkSeriesSet struct {
	q          *querier
	series     []cachedSeries
	mint, maxt int64
	i          int
	cur        chunkSeries
}

func (s *chunkSeriesSet) Next() bool {
	for s.i++; s.i < len(s.series); s.i++ {
		cs := &s.series[s.i]
		if chks := inRange(cs.chunks, s.mint, s.maxt, s.q.o.Keep); len(chks) > 0 {
			s.cur = chunkSeries{lset: cs.lset, chunks: chks, cr: s.q.cr, block: s.q.o.Key}
			return true
		}
	}
	return false
}

func (s *chunkSeriesSet) At() storage.ChunkSeries           { return s.cur }
func (s *chunkSeriesSet) Err() error                        { return nil }
func (s *chunkSeriesSet) Warnings() annotations.Annotations { return nil }

type chunkSeries struct {
	lset   labels.Labels
	chunks []chunkMeta
	cr     tsdb.ChunkReader
	block  string
}

func (s chunkSeries) Labels() labels.Labels { return s.lset }

func (s chunkSeries) Iterator(it chunks.Iterator) chunks.Iterator {
	ci, ok := it.(*chunkIterator)
	if !ok {
		ci = &chunkIterator{}
	}
	*ci = chunkIterator{s: s, i: -1}
	return ci
}

// chunkIterator reads a series' chunks from the block's chunk files.
type chunkIterator struct {
	s   chunkSeries
	i   int
	cur chunks.Meta
	err error
}

func (it *chunkIterator) Next() bool {
	if it.err != nil || it.i+1 >= len(it.s.chunks) {
		return false
	}
	it.i++
	c := it.s.chunks[it.i]
	meta := chunks.Meta{Ref: chunks.ChunkRef(c.ref), MinTime: c.mint, MaxTime: c.maxt}
	chk, iterable, err := it.s.cr.ChunkOrIterable(meta)
	switch {
	case err != nil:
		it.err = fmt.Errorf("chunk %d of block %s: %w", c.ref, it.s.block, err)
		return false
	case chk == nil: // a block's chunks are stored whole
		it.err = fmt.Errorf("chunk %d of block %s: not a stored chunk (%T)", c.ref, it.s.block, iterable)
		return false
	}
	meta.Chunk = chk
	it.cur = meta
	return true
}

func (it *chunkIterator) At() chunks.Meta { return it.cur }
func (it *chunkIterator) Err() error      { return it.err }
