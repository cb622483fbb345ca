package bucketstore

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"slices"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/tsdb/encoding"
	"github.com/prometheus/prometheus/tsdb/index"
)

// indexReader is a tsdb.IndexReader over one bucket block for one query:
// the lazy index reader. What the block keeps in memory it asks of the
// block's index header (indexHeaderReader, indexheader.go); the rest
// (postings lists, series entries, and the header's own reads of the symbol
// and postings offset tables) it reads through the page cache, with the
// query's read windows.
type indexReader struct {
	view
	h              indexHeaderReader
	dec            *index.Decoder
	decodePostings index.PostingsDecoder
}

var _ tsdb.IndexReader = (*indexReader)(nil)

func newIndexReader(v view, h indexHeaderReader) *indexReader {
	r := &indexReader{view: v, h: h, decodePostings: tsdb.DefaultPostingsDecoderFactory(&v.b.meta.BlockMeta)}
	r.dec = &index.Decoder{LookupSymbol: r.lookupSymbol, DecodePostings: r.decodePostings}
	return r
}

func (r *indexReader) read(start, end int64) ([]byte, error) {
	if end > r.b.index.size {
		return nil, r.b.storageErr(r.ctx, fmt.Errorf("index: read past the end (%d > %d)", end, r.b.index.size))
	}
	b, err := r.b.cache.Range(r.ctx, r.b.index, start, end)
	if err != nil {
		return nil, r.b.storageErr(r.ctx, err)
	}
	return b, nil
}

func (r *indexReader) corrupt(format string, args ...any) error {
	return r.b.storageErr(r.ctx, fmt.Errorf("index: "+format, args...))
}

func (r *indexReader) pageSize() int64 { return r.b.cache.pageSize }

// lookupSymbol resolves a symbol reference through the header, once per
// query and block (label values repeat across series).
func (r *indexReader) lookupSymbol(_ context.Context, o uint32) (string, error) {
	r.st.symMtx.Lock()
	defer r.st.symMtx.Unlock()
	if s, ok := r.st.syms[o]; ok {
		return s, nil
	}
	s, err := r.h.LookupSymbol(r, o)
	if err != nil {
		return "", err
	}
	r.st.syms[o] = s
	return s, nil
}

// readSymbols reads [start, end) of the symbol table through the query's
// window on it (all of a small table at the first lookup).
func (r *indexReader) readSymbols(start, end int64) ([]byte, error) {
	symStart, symEnd, _ := r.h.SymbolTable()
	var (
		b   []byte
		err error
	)
	if tableLen := symEnd - symStart; tableLen <= r.b.readahead*r.b.cache.pageSize {
		// A small table: the window holds all of it after the first lookup.
		if err = r.st.symbols.load(r.ctx, symStart, symEnd); err == nil {
			b, err = r.st.symbols.read(r.ctx, start, end)
		}
	} else {
		b, err = r.st.symbols.read(r.ctx, start, end)
	}
	if err != nil {
		return nil, r.b.storageErr(r.ctx, err)
	}
	return b, nil
}

// postingsAt reads and decodes the postings list at off.
func (r *indexReader) postingsAt(off int64) (index.Postings, error) {
	lb, err := r.read(off, off+4)
	if err != nil {
		return nil, err
	}
	l := int64(binary.BigEndian.Uint32(lb))
	b, err := r.read(off+4, off+4+l+4)
	if err != nil {
		return nil, err
	}
	if crc32.Checksum(b[:l], castagnoli) != binary.BigEndian.Uint32(b[l:]) {
		return nil, r.corrupt("postings at %d: %v", off, encoding.ErrInvalidChecksum)
	}
	_, p, err := r.decodePostings(encoding.Decbuf{B: b[:l:l]})
	if err != nil {
		return nil, r.corrupt("decode postings at %d: %v", off, err)
	}
	return p, nil
}

// Symbols iterates over the block's symbol table.
func (r *indexReader) Symbols() index.StringIter {
	start, end, count := r.h.SymbolTable()
	return &symbolsIter{c: cursor{rd: r, pos: start, end: end}, left: count}
}

type symbolsIter struct {
	c    cursor
	left int
	cur  string
	err  error
}

func (s *symbolsIter) Next() bool {
	if s.left == 0 || s.err != nil {
		return false
	}
	n, err := s.c.uvarint()
	if err == nil {
		var b []byte
		if b, err = s.c.bytes(int64(n)); err == nil {
			s.cur = string(b)
		}
	}
	if err != nil {
		s.err = err
		return false
	}
	s.left--
	return true
}
func (s *symbolsIter) At() string { return s.cur }
func (s *symbolsIter) Err() error { return s.err }

// SortedLabelValues returns the values of the label name, sorted.
func (r *indexReader) SortedLabelValues(ctx context.Context, name string, hints *storage.LabelHints, matchers ...*labels.Matcher) ([]string, error) {
	vals, err := r.LabelValues(ctx, name, hints, matchers...)
	if err == nil && len(matchers) > 0 {
		slices.Sort(vals)
	}
	return vals, err
}

// LabelValues returns the values of the label name (sorted when there are
// no matchers), restricted to series matching matchers.
func (r *indexReader) LabelValues(ctx context.Context, name string, hints *storage.LabelHints, matchers ...*labels.Matcher) ([]string, error) {
	if len(matchers) > 0 {
		return r.labelValuesWithMatchers(ctx, name, hints, matchers...)
	}
	var values []string
	err := r.h.LabelValues(r.ctx, r, name, func(v []byte, _ int64) (bool, error) {
		if hints != nil && hints.Limit > 0 && len(values) >= hints.Limit {
			return false, nil
		}
		values = append(values, string(v))
		return true, nil
	})
	return values, err
}

// labelValuesWithMatchers follows the TSDB's own algorithm: candidate values
// filtered by matchers on the label itself, then kept when their postings
// intersect those of the matchers.
func (r *indexReader) labelValuesWithMatchers(ctx context.Context, name string, hints *storage.LabelHints, matchers ...*labels.Matcher) ([]string, error) {
	all, err := r.LabelValues(ctx, name, nil)
	if err != nil {
		return nil, err
	}
	others := false
	for _, m := range matchers {
		if m.Name != name {
			others = true
			continue
		}
		all = slices.DeleteFunc(all, func(v string) bool { return !m.Matches(v) })
	}
	if len(all) == 0 {
		return nil, nil
	}
	if !others {
		all, _ = hints.ApplyLimit(all)
		return all, nil
	}
	p, err := tsdb.PostingsForMatchers(ctx, r, matchers...)
	if err != nil {
		return nil, err
	}
	perValue, err := r.postingsPerValue(name, all)
	if err != nil {
		return nil, err
	}
	idx, err := index.FindIntersectingPostings(p, perValue)
	if err != nil {
		return nil, err
	}
	vals := make([]string, 0, len(idx))
	for _, i := range idx {
		vals = append(vals, all[i])
	}
	slices.Sort(vals)
	vals, _ = hints.ApplyLimit(vals)
	return vals, nil
}

// postingsPerValue returns the postings of each of the sorted values of name.
func (r *indexReader) postingsPerValue(name string, values []string) ([]index.Postings, error) {
	out := make([]index.Postings, len(values))
	for i := range out {
		out[i] = index.EmptyPostings()
	}
	err := r.h.PostingsOffsets(r.ctx, r, name, values, func(i int, po int64) error {
		p, err := r.postingsAt(po)
		if err != nil {
			return err
		}
		out[i] = p
		return nil
	})
	return out, err
}

// Postings returns the postings of the series with name set to one of values.
func (r *indexReader) Postings(ctx context.Context, name string, values ...string) (index.Postings, error) {
	if len(values) == 0 {
		return index.EmptyPostings(), nil
	}
	values = slices.Clone(values)
	slices.Sort(values)
	var res []index.Postings
	err := r.h.PostingsOffsets(r.ctx, r, name, values, func(_ int, po int64) error {
		p, err := r.postingsAt(po)
		if err != nil {
			return err
		}
		res = append(res, p)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(res) == 0 {
		return index.EmptyPostings(), nil
	}
	return index.Merge(ctx, res...), nil
}

// PostingsForLabelMatching returns the postings of series whose name label matches.
func (r *indexReader) PostingsForLabelMatching(ctx context.Context, name string, match func(string) bool) index.Postings {
	return r.postingsForLabelMatching(ctx, name, match)
}

// PostingsForAllLabelValues returns the postings of every series with the label.
func (r *indexReader) PostingsForAllLabelValues(ctx context.Context, name string) index.Postings {
	return r.postingsForLabelMatching(ctx, name, nil)
}

func (r *indexReader) postingsForLabelMatching(ctx context.Context, name string, match func(string) bool) index.Postings {
	var offs []int64
	if err := r.h.LabelValues(r.ctx, r, name, func(v []byte, po int64) (bool, error) {
		if match == nil || match(string(v)) {
			offs = append(offs, po)
		}
		return true, nil
	}); err != nil {
		return index.ErrPostings(err)
	}
	its := make([]index.Postings, 0, len(offs))
	for _, po := range offs {
		p, err := r.postingsAt(po)
		if err != nil {
			return index.ErrPostings(err)
		}
		its = append(its, p)
	}
	return index.Merge(ctx, its...)
}

// SortedPostings returns p (series references of a block are in label
// order). It is where a select learns which series it will read, and it runs
// while the select is made, before the merge reads any series
// (seriesset.NewMergeQuerier selects every block first): so it reads the
// first series entry and its first chunk in the
// query's range here, so that the serial iteration across blocks that
// follows starts with every block's windows filled (and their next runs on
// the way).
func (r *indexReader) SortedPostings(p index.Postings) index.Postings {
	refs, err := index.ExpandPostings(p)
	if err != nil {
		return index.ErrPostings(err)
	}
	if len(refs) > 0 {
		// Entries are short: nothing a page past the last one is read ahead.
		r.st.smtx.Lock()
		r.st.series.limit = int64(refs[len(refs)-1])*seriesAlign + r.b.cache.pageSize
		r.st.smtx.Unlock()
		var (
			b    labels.ScratchBuilder
			chks []chunks.Meta
		)
		if err := r.Series(refs[0], &b, &chks); err != nil {
			return index.ErrPostings(err)
		}
		for _, c := range chks {
			if c.MaxTime >= r.st.mint && c.MinTime <= r.st.maxt {
				if _, err := r.readChunk(c); err != nil {
					return index.ErrPostings(err)
				}
				break
			}
		}
	}
	return index.NewListPostings(refs)
}

// ShardedPostings keeps the series of p whose label hash falls in the shard.
func (r *indexReader) ShardedPostings(p index.Postings, shardIndex, shardCount uint64) index.Postings {
	var (
		out []storage.SeriesRef
		b   labels.ScratchBuilder
	)
	for p.Next() {
		if err := r.Series(p.At(), &b, nil); err != nil {
			return index.ErrPostings(err)
		}
		if labels.StableHash(b.Labels())%shardCount == shardIndex {
			out = append(out, p.At())
		}
	}
	if err := p.Err(); err != nil {
		return index.ErrPostings(err)
	}
	return index.NewListPostings(out)
}

// seriesEntry returns the bytes of the series entry ref (without length and CRC).
func (r *indexReader) seriesEntry(ref storage.SeriesRef) ([]byte, error) {
	off := int64(ref) * seriesAlign
	if off <= 0 || off >= r.b.index.size {
		return nil, storage.ErrNotFound
	}
	r.st.smtx.Lock()
	defer r.st.smtx.Unlock()
	hb, err := r.st.series.read(r.ctx, off, min(r.b.index.size, off+binary.MaxVarintLen32))
	if err != nil {
		return nil, r.b.storageErr(r.ctx, err)
	}
	l, n := binary.Uvarint(hb)
	if n <= 0 {
		return nil, r.corrupt("series %d: invalid length", ref)
	}
	start := off + int64(n)
	if start+int64(l)+4 > r.b.index.size {
		return nil, r.corrupt("series %d: past the end", ref)
	}
	b, err := r.st.series.read(r.ctx, start, start+int64(l)+4)
	if err != nil {
		return nil, r.b.storageErr(r.ctx, err)
	}
	if crc32.Checksum(b[:l], castagnoli) != binary.BigEndian.Uint32(b[l:]) {
		return nil, r.corrupt("series %d: %v", ref, encoding.ErrInvalidChecksum)
	}
	return b[:l:l], nil
}

// Series reads the labels and chunk metas of the series ref.
func (r *indexReader) Series(ref storage.SeriesRef, builder *labels.ScratchBuilder, chks *[]chunks.Meta) error {
	b, err := r.seriesEntry(ref)
	if err != nil {
		return err
	}
	builder.SetSymbolTable(r.h.LabelSymbols())
	builder.Reset()
	if chks != nil && !r.inRange(b) {
		// No chunk in the view's range: returned without labels or chunks,
		// which the TSDB's block querier skips as it skips a series whose
		// chunks all lie outside its range. In a long block most series of a
		// churning workload (each training job's pods) lie outside a short
		// query; their labels are not looked up.
		*chks = (*chks)[:0]
		return nil
	}
	if err := r.dec.Series(b, builder, chks); err != nil {
		if isStorageErr(err) {
			return err
		}
		return r.corrupt("read series %d: %v", ref, err)
	}
	if need := r.st.need; need != nil && chks != nil {
		// A downsampled chunk of counter pairs holds samples up to a window
		// less a millisecond before its first point's time (downsample's
		// pairs.go).
		early := max(r.b.meta.GPUStore.Downsample.Resolution-1, 0)
		*chks = slices.DeleteFunc(*chks, func(c chunks.Meta) bool { return !need.overlaps(c.MinTime-early, c.MaxTime) })
	}
	return nil
}

// inRange reports whether a series entry (index format v2: labels as
// symbol references, then chunk metas delta-encoded in time order) has a
// chunk overlapping the view's range. It reads the chunk metas only; an
// entry it cannot read is left to the decoder to report.
func (r *indexReader) inRange(b []byte) bool {
	d := encoding.Decbuf{B: b}
	for k := d.Uvarint(); k > 0 && d.Err() == nil; k-- {
		d.Uvarint()
		d.Uvarint()
	}
	k := d.Uvarint()
	if k == 0 || d.Err() != nil {
		return d.Err() != nil
	}
	mint := d.Varint64()
	maxt := int64(d.Uvarint64()) + mint
	d.Uvarint64()
	for i := 1; i < k; i++ {
		if maxt >= r.st.mint {
			break // the chunks are in time order: this one ends in the range or after it
		}
		mint = int64(d.Uvarint64()) + maxt
		maxt = int64(d.Uvarint64()) + mint
		d.Varint64()
	}
	if d.Err() != nil {
		return true
	}
	return maxt >= r.st.mint && mint <= r.st.maxt
}

// LabelNames returns the label names of the block, or of the series matching matchers.
func (r *indexReader) LabelNames(ctx context.Context, matchers ...*labels.Matcher) ([]string, error) {
	if len(matchers) == 0 {
		return slices.Clone(r.h.LabelNames()), nil
	}
	p, err := tsdb.PostingsForMatchers(ctx, r, matchers...)
	if err != nil {
		return nil, err
	}
	return r.LabelNamesFor(ctx, p)
}

// LabelNamesFor returns the sorted label names of the series in postings.
func (r *indexReader) LabelNamesFor(ctx context.Context, postings index.Postings) ([]string, error) {
	offs := map[uint32]struct{}{}
	for i := 0; postings.Next(); i++ {
		if i%128 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
		b, err := r.seriesEntry(postings.At())
		if err != nil {
			return nil, err
		}
		o, err := r.dec.LabelNamesOffsetsFor(b)
		if err != nil {
			return nil, r.corrupt("label names of series %d: %v", postings.At(), err)
		}
		for _, x := range o {
			offs[x] = struct{}{}
		}
	}
	if err := postings.Err(); err != nil {
		return nil, err
	}
	names := make([]string, 0, len(offs))
	for o := range offs {
		n, err := r.lookupSymbol(ctx, o)
		if err != nil {
			return nil, err
		}
		names = append(names, n)
	}
	slices.Sort(names)
	return names, nil
}

// Close releases nothing: the reader holds no resources of its own.
func (r *indexReader) Close() error { return nil }
