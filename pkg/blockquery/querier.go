package blockquery

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/util/annotations"
)

// Options say how a querier reads its block.
type Options struct {
	// Key names the block in the cache (its ULID): a selector is resolved
	// once per key. Without a key nothing is cached.
	Key string
	// Keep, when set, says which of a series' chunks in the select's range
	// are read (the bucket store reads only the chunks its step windows
	// need); the others are left out.
	Keep func(mint, maxt int64) bool
}

// NewQuerier returns a querier of b's samples in [mint, maxt] whose selects
// go through c (nil: no cache). b must not change while it is cached under
// o.Key. A block with tombstones gets the TSDB's own block querier.
func NewQuerier(b tsdb.BlockReader, c *Cache, mint, maxt int64, o Options) (storage.Querier, error) {
	tr, err := b.Tombstones()
	if err != nil {
		return nil, fmt.Errorf("tombstones of block %s: %w", o.Key, err)
	}
	deleted := tr.Total() > 0
	if err := tr.Close(); err != nil {
		return nil, err
	}
	if deleted {
		return tsdb.NewBlockQuerier(b, mint, maxt)
	}
	ix, err := b.Index()
	if err != nil {
		return nil, fmt.Errorf("index of block %s: %w", o.Key, err)
	}
	cr, err := b.Chunks()
	if err != nil {
		_ = ix.Close()
		return nil, fmt.Errorf("chunks of block %s: %w", o.Key, err)
	}
	q := &querier{b: b, c: c, ix: ix, cr: cr, mint: mint, maxt: maxt, o: o}
	if o.Key == "" {
		q.c = nil
	}
	return q, nil
}

type querier struct {
	b          tsdb.BlockReader
	c          *Cache
	ix         tsdb.IndexReader
	cr         tsdb.ChunkReader
	mint, maxt int64
	o          Options
	// base is the TSDB's querier of the block, opened for what this
	// package leaves to it: label names and values, metadata-only and
	// sharded selects.
	base storage.Querier
}

func (q *querier) baseQuerier() (storage.Querier, error) {
	if q.base == nil {
		b, err := tsdb.NewBlockQuerier(q.b, q.mint, q.maxt)
		if err != nil {
			return nil, err
		}
		q.base = b
	}
	return q.base, nil
}

// Select returns the series matching ms with a sample in the hinted range
// (the querier's without hints), as the TSDB's block querier does, sorted
// by labels whether asked or not (a block's series are).
func (q *querier) Select(ctx context.Context, sortSeries bool, hints *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
	mint, maxt := q.mint, q.maxt
	if hints != nil {
		if hints.Func == "series" || hints.ShardCount > 0 || hints.DisableTrimming {
			base, err := q.baseQuerier()
			if err != nil {
				return storage.ErrSeriesSet(err)
			}
			return base.Select(ctx, sortSeries, hints, ms...)
		}
		mint, maxt = hints.Start, hints.End
	}
	series, err := q.resolve(ctx, ms)
	if err != nil {
		return storage.ErrSeriesSet(err)
	}
	return &seriesSet{q: q, series: series, mint: mint, maxt: maxt, i: -1}
}

// resolve returns the block's series that ms match, with all their chunks,
// from the cache or the index.
func (q *querier) resolve(ctx context.Context, ms []*labels.Matcher) ([]cachedSeries, error) {
	var key string
	if q.c != nil {
		key = cacheKey(q.o.Key, ms)
		if s := q.c.get(key); s != nil {
			return s, nil
		}
	}
	p, err := tsdb.PostingsForMatchers(ctx, q.ix, ms...)
	if err != nil {
		return nil, err
	}
	var (
		out     []cachedSeries
		builder labels.ScratchBuilder
		chks    []chunks.Meta
		rehome  labels.ScratchBuilder // into the cache's symbol table
	)
	if q.c != nil {
		rehome = labels.NewScratchBuilderWithSymbolTable(q.c.symbols(), 16)
	}
	for n := 0; p.Next(); n++ {
		if n%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
		if err := q.ix.Series(p.At(), &builder, &chks); err != nil {
			if errors.Is(err, storage.ErrNotFound) {
				continue // postings may be stale
			}
			return nil, fmt.Errorf("series %d of block %s: %w", p.At(), q.o.Key, err)
		}
		if len(chks) == 0 {
			continue
		}
		lset := builder.Labels()
		if q.c != nil {
			rehome.Reset()
			lset.Range(func(l labels.Label) { rehome.Add(l.Name, l.Value) })
			lset = rehome.Labels()
		}
		cs := cachedSeries{lset: lset, chunks: make([]chunkMeta, len(chks))}
		for i, c := range chks {
			cs.chunks[i] = chunkMeta{ref: uint64(c.Ref), mint: c.MinTime, maxt: c.MaxTime}
		}
		out = append(out, cs)
	}
	if err := p.Err(); err != nil {
		return nil, err
	}
	if out == nil {
		out = []cachedSeries{} // cached as "none", not as a miss
	}
	if q.c != nil {
		q.c.put(key, out)
	}
	return out, nil
}

// cacheKey names a selector on a block: the block, then its matchers in a
// fixed order (the same selector written in another order is the same).
func cacheKey(block string, ms []*labels.Matcher) string {
	strs := make([]string, len(ms))
	for i, m := range ms {
		strs[i] = m.String()
	}
	slices.Sort(strs)
	return block + "\xff" + strings.Join(strs, "\xff")
}

func (q *querier) LabelValues(ctx context.Context, name string, hints *storage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	base, err := q.baseQuerier()
	if err != nil {
		return nil, nil, err
	}
	return base.LabelValues(ctx, name, hints, ms...)
}

func (q *querier) LabelNames(ctx context.Context, hints *storage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	base, err := q.baseQuerier()
	if err != nil {
		return nil, nil, err
	}
	return base.LabelNames(ctx, hints, ms...)
}

func (q *querier) Close() error {
	errs := []error{q.ix.Close(), q.cr.Close()}
	if q.base != nil {
		errs = append(errs, q.base.Close())
	}
	return errors.Join(errs...)
}

// seriesSet is a select's series: the resolved series with a chunk in
// [mint, maxt], each with those chunks only.
type seriesSet struct {
	q          *querier
	series     []cachedSeries
	mint, maxt int64
	i          int
	cur        *flatSeries
}

func (s *seriesSet) Next() bool {
	for s.i++; s.i < len(s.series); s.i++ {
		cs := &s.series[s.i]
		chks := inRange(cs.chunks, s.mint, s.maxt, s.q.o.Keep)
		if len(chks) == 0 {
			continue
		}
		s.cur = &flatSeries{lset: cs.lset, chunks: chks, cr: s.q.cr, mint: s.mint, maxt: s.maxt}
		return true
	}
	return false
}

// inRange returns the chunks of chks (in time order) that overlap [mint,
// maxt] and that keep keeps: a sub-slice of chks, or a copy when keep
// leaves some out in between.
func inRange(chks []chunkMeta, mint, maxt int64, keep func(int64, int64) bool) []chunkMeta {
	lo := 0
	for lo < len(chks) && chks[lo].maxt < mint {
		lo++
	}
	hi := lo
	for hi < len(chks) && chks[hi].mint <= maxt {
		hi++
	}
	chks = chks[lo:hi:hi]
	if keep == nil {
		return chks
	}
	for i, c := range chks {
		if !keep(c.mint, c.maxt) {
			out := slices.Clone(chks[:i])
			for _, c := range chks[i+1:] {
				if keep(c.mint, c.maxt) {
					out = append(out, c)
				}
			}
			return out
		}
	}
	return chks
}

func (s *seriesSet) At() storage.Series                { return s.cur }
func (s *seriesSet) Err() error                        { return nil }
func (s *seriesSet) Warnings() annotations.Annotations { return nil }
