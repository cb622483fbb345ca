package bucketstore

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"slices"
	"sort"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/tsdb/encoding"
	"github.com/prometheus/prometheus/tsdb/index"
)

// Why not index.NewReader over a range-reading index.ByteSlice: the TSDB's
// reader looks symbols up with ByteSlice.Range(0, Len()) (the whole file as
// one slice) and walks the whole postings offset table the same way, and a
// ByteSlice cannot return an error. So this file reads the same format (v2,
// the only one Prometheus writes) with the TSDB's exported pieces
// (index.NewTOCFromByteSlice, index.Decoder for series entries, the block's
// postings decoder, index.Merge and friends) over ranges that fail cleanly:
//
//   - At first use of a block its "index header" is built by streaming two
//     sections once: the postings offset table (every 32nd value of each label
//     name is kept, as the TSDB's reader does) and the symbol table (the
//     offset of every 32nd symbol). That is the only per-block memory outside
//     the page cache.
//   - Everything else (symbol lookups, postings offset entries, postings
//     lists, series entries) is read on demand through the PageCache.

const (
	indexTOCLen  = 6*8 + 4
	symbolFactor = 32
	seriesAlign  = 16
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

type postingOffset struct {
	value string
	off   int64 // absolute offset of the entry in the postings offset table
}

// indexHeader is what a block keeps in memory to read its index lazily.
type indexHeader struct {
	version int
	toc     index.TOC

	symOffsets  []int64 // absolute offset of every symbolFactor-th symbol
	symCount    int
	symStart    int64 // first symbol
	symEnd      int64 // end of the symbol data (its CRC follows)
	nameSymbols map[uint32]string

	postings    map[string][]postingOffset
	postingsEnd int64
	names       []string // label names, sorted, without the all-postings key

	st             *labels.SymbolTable
	decodePostings index.PostingsDecoder

	// bytes is an estimate of the header's memory.
	bytes int64
}

type byteSlice []byte

func (b byteSlice) Len() int                    { return len(b) }
func (b byteSlice) Range(start, end int) []byte { return b[start:end] }

// headerReadAhead bounds what a header load reads in one request: the
// index's tail (1/16 of the index, at least 32 KiB: the TOC and, usually, the
// postings offset table before it), and the symbol table at the start when it
// is no larger. So a block opens with two range requests, and the pages read
// also go to the cache (queries walk the postings offset table and look
// symbols up there). Larger sections are streamed, never held whole.
const headerReadAhead = 256 << 10

// loadIndexHeader reads the TOC, the symbol table and the postings offset
// table of the block's index. Sections larger than headerReadAhead are
// streamed, never held whole.
func loadIndexHeader(ctx context.Context, c *PageCache, o object, decoder index.PostingsDecoder) (*indexHeader, error) {
	if o.size < index.HeaderLen+indexTOCLen {
		return nil, fmt.Errorf("index %s: %w", o.name, encoding.ErrInvalidSize)
	}
	tailStart := max(0, o.size-min(headerReadAhead, max(32<<10, o.size/16)))
	tail, err := c.readHeaderRange(ctx, o, tailStart, o.size-tailStart)
	if err != nil {
		return nil, err
	}
	c.offer(o, tailStart, tail)
	toc, err := index.NewTOCFromByteSlice(byteSlice(tail[len(tail)-indexTOCLen:]))
	if err != nil {
		return nil, fmt.Errorf("index %s: %w", o.name, err)
	}
	h := &indexHeader{toc: *toc, st: labels.NewSymbolTable(), decodePostings: decoder}
	if h.toc.Symbols < index.HeaderLen || h.toc.Series < h.toc.Symbols || h.toc.PostingsTable < h.toc.Series || int64(h.toc.PostingsTable) > o.size-indexTOCLen {
		return nil, fmt.Errorf("index %s: implausible table of contents %+v", o.name, h.toc)
	}
	// section returns [from, to) positioned at off, from memory when the
	// speculative reads hold it.
	var head []byte
	section := func(from, to, off int64) (*section, error) {
		switch {
		case from >= tailStart:
			return newSection(c, o, io.NopCloser(bytes.NewReader(tail[from-tailStart:to-tailStart])), from, to, off, false)
		case to <= int64(len(head)):
			return newSection(c, o, io.NopCloser(bytes.NewReader(head[from:to])), from, to, off, false)
		}
		if o.encoded() {
			b, err := c.Range(ctx, o, from, to)
			if err != nil {
				return nil, err
			}
			return newSection(c, o, io.NopCloser(bytes.NewReader(b)), from, to, off, false)
		}
		rc, err := o.bkt.GetRange(ctx, o.name, from, to-from)
		c.requests.Add(1)
		if err != nil {
			return nil, fmt.Errorf("get range of %s: %w", o.name, err)
		}
		return newSection(c, o, rc, from, to, off, true)
	}
	if symEnd := int64(h.toc.Series); symEnd <= headerReadAhead && symEnd <= tailStart {
		head, err = c.readHeaderRange(ctx, o, 0, symEnd)
		if err != nil {
			return nil, err
		}
		c.offer(o, 0, head)
	}
	// The file header and the symbol table.
	s, err := section(0, int64(h.toc.Series), int64(h.toc.Symbols))
	if err != nil {
		return nil, fmt.Errorf("index %s: read symbols: %w", o.name, err)
	}
	if m := binary.BigEndian.Uint32(s.head[:4]); m != index.MagicIndex {
		s.close()
		return nil, fmt.Errorf("index %s: invalid magic number %x", o.name, m)
	}
	h.version = int(s.head[4])
	if h.version != index.FormatV2 && h.version != index.FormatV3 {
		s.close()
		return nil, fmt.Errorf("index %s: unsupported index format version %d", o.name, h.version)
	}
	// The label names are needed while reading symbols: postings table first.
	ps, err := section(int64(h.toc.PostingsTable), o.size-indexTOCLen, int64(h.toc.PostingsTable))
	if err != nil {
		s.close()
		return nil, fmt.Errorf("index %s: read postings offset table: %w", o.name, err)
	}
	if err := h.readPostingsTable(ctx, ps); err != nil {
		s.close()
		return nil, fmt.Errorf("index %s: read postings offset table: %w", o.name, err)
	}
	if err := h.readSymbols(ctx, s); err != nil {
		return nil, fmt.Errorf("index %s: read symbols: %w", o.name, err)
	}
	h.bytes = int64(len(h.symOffsets))*8 + int64(len(h.nameSymbols))*32
	for name, e := range h.postings {
		h.bytes += int64(len(name)) + 48
		for _, p := range e {
			h.bytes += int64(len(p.value)) + 24
		}
	}
	return h, nil
}

// section streams one length-prefixed, CRC-suffixed section of the index.
type section struct {
	br   *bufio.Reader
	rc   io.ReadCloser
	crc  hashWriter
	pos  int64 // absolute offset of the next byte
	end  int64 // absolute end of the content
	buf  []byte
	head []byte // bytes before the section in the request
}

type hashWriter interface {
	io.Writer
	Sum32() uint32
}

// newSection reads [from, to) of o from rc and positions the stream on the
// section at off (from <= off): the bytes before it are kept in head.
// fetched counts the section's bytes as read from the bucket.
func newSection(c *PageCache, o object, rc io.ReadCloser, from, to, off int64, fetched bool) (*section, error) {
	if off+8 > to {
		rc.Close()
		return nil, encoding.ErrInvalidSize
	}
	head := make([]byte, off-from+4)
	if _, err := io.ReadFull(rc, head); err != nil {
		rc.Close()
		return nil, fmt.Errorf("read %s: %w", o.name, err)
	}
	l := int64(binary.BigEndian.Uint32(head[len(head)-4:]))
	if off+4+l+4 > to {
		rc.Close()
		return nil, encoding.ErrInvalidSize
	}
	if fetched {
		c.fetchedBytes.Add(off - from + 4 + l + 4)
	}
	h := crc32.New(castagnoli)
	s := &section{rc: rc, crc: h, pos: off + 4, end: off + 4 + l, head: head[:len(head)-4]}
	s.br = bufio.NewReaderSize(io.TeeReader(io.LimitReader(rc, l), h), 64<<10)
	return s, nil
}

func (s *section) ReadByte() (byte, error) {
	b, err := s.br.ReadByte()
	if err == nil {
		s.pos++
	}
	return b, err
}

func (s *section) uvarint() (uint64, error) { return binary.ReadUvarint(s) }

func (s *section) next(n int) ([]byte, error) {
	if int64(n) > s.end-s.pos {
		return nil, encoding.ErrInvalidSize
	}
	if cap(s.buf) < n {
		s.buf = make([]byte, n)
	}
	b := s.buf[:n]
	if _, err := io.ReadFull(s.br, b); err != nil {
		return nil, err
	}
	s.pos += int64(n)
	return b, nil
}

func (s *section) be32() (uint32, error) {
	b, err := s.next(4)
	if err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint32(b), nil
}

func (s *section) uvarintBytes() ([]byte, error) {
	n, err := s.uvarint()
	if err != nil {
		return nil, err
	}
	return s.next(int(n))
}

// finish reads the rest of the content and checks the CRC.
func (s *section) finish() error {
	defer s.rc.Close()
	if _, err := io.Copy(io.Discard, s.br); err != nil {
		return err
	}
	var sum [4]byte
	if _, err := io.ReadFull(s.rc, sum[:]); err != nil {
		return err
	}
	if binary.BigEndian.Uint32(sum[:]) != s.crc.Sum32() {
		return encoding.ErrInvalidChecksum
	}
	return nil
}

func (s *section) close() { _ = s.rc.Close() }

func (h *indexHeader) readPostingsTable(ctx context.Context, s *section) error {
	defer s.close()
	h.postingsEnd = s.end
	cnt, err := s.be32()
	if err != nil {
		return err
	}
	h.postings = map[string][]postingOffset{}
	var (
		curName    string
		haveName   bool
		lastValue  string
		lastOff    int64
		haveLast   bool
		valueCount int
	)
	for ; cnt > 0; cnt-- {
		if err := ctx.Err(); err != nil {
			return err
		}
		entry := s.pos
		kc, err := s.uvarint()
		if err != nil {
			return err
		}
		if kc != 2 {
			return fmt.Errorf("unexpected number of keys for postings offset table %d", kc)
		}
		nb, err := s.uvarintBytes()
		if err != nil {
			return err
		}
		if !haveName || string(nb) != curName {
			if haveLast {
				// Always keep the last value of each label name.
				h.postings[curName] = append(h.postings[curName], postingOffset{value: lastValue, off: lastOff})
			}
			curName, haveName, haveLast, valueCount = string(nb), true, false, 0
			h.postings[curName] = []postingOffset{}
		}
		vb, err := s.uvarintBytes()
		if err != nil {
			return err
		}
		if valueCount%symbolFactor == 0 {
			h.postings[curName] = append(h.postings[curName], postingOffset{value: string(vb), off: entry})
			haveLast = false
		} else {
			lastValue, lastOff, haveLast = string(vb), entry, true
		}
		valueCount++
		if _, err := s.uvarint(); err != nil { // the postings list's offset
			return err
		}
	}
	if haveLast {
		h.postings[curName] = append(h.postings[curName], postingOffset{value: lastValue, off: lastOff})
	}
	for name, e := range h.postings {
		h.postings[name] = slices.Clip(e)
		if name != "" {
			h.names = append(h.names, name)
		}
	}
	sort.Strings(h.names)
	return s.finish()
}

func (h *indexHeader) readSymbols(ctx context.Context, s *section) error {
	defer s.close()
	h.symEnd = s.end
	cnt, err := s.be32()
	if err != nil {
		return err
	}
	h.symStart = s.pos
	h.symCount = int(cnt)
	h.symOffsets = make([]int64, 0, 1+h.symCount/symbolFactor)
	h.nameSymbols = make(map[uint32]string, len(h.names))
	for i := 0; i < h.symCount; i++ {
		if i%(1<<16) == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		if i%symbolFactor == 0 {
			h.symOffsets = append(h.symOffsets, s.pos)
		}
		b, err := s.uvarintBytes()
		if err != nil {
			return err
		}
		if _, ok := h.postings[string(b)]; ok && len(b) > 0 {
			h.nameSymbols[uint32(i)] = string(b)
		}
	}
	return s.finish()
}

// indexReader is a tsdb.IndexReader over one bucket block for one query.
type indexReader struct {
	view
	h   *indexHeader
	dec *index.Decoder
}

var _ tsdb.IndexReader = (*indexReader)(nil)

func newIndexReader(v view, h *indexHeader) *indexReader {
	r := &indexReader{view: v, h: h}
	r.dec = &index.Decoder{LookupSymbol: r.lookupSymbol, DecodePostings: h.decodePostings}
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

func (r *indexReader) lookupSymbol(_ context.Context, o uint32) (string, error) {
	if s, ok := r.h.nameSymbols[o]; ok {
		return s, nil
	}
	if int(o) >= r.h.symCount {
		return "", r.corrupt("unknown symbol offset %d", o)
	}
	r.st.symMtx.Lock()
	defer r.st.symMtx.Unlock()
	if s, ok := r.st.syms[o]; ok {
		return s, nil
	}
	g := int(o / symbolFactor)
	start, end := r.h.symOffsets[g], r.h.symEnd
	if g+1 < len(r.h.symOffsets) {
		end = r.h.symOffsets[g+1]
	}
	var (
		b   []byte
		err error
	)
	if tableLen := r.h.symEnd - r.h.symStart; tableLen <= r.b.readahead*r.b.cache.pageSize {
		// A small table: the window holds all of it after the first lookup.
		if err = r.st.symbols.load(r.ctx, r.h.symStart, r.h.symEnd); err == nil {
			b, err = r.st.symbols.read(r.ctx, start, end)
		}
	} else {
		b, err = r.st.symbols.read(r.ctx, start, end)
	}
	if err != nil {
		return "", r.b.storageErr(r.ctx, err)
	}
	d := encoding.Decbuf{B: b}
	for i := o % symbolFactor; i > 0; i-- {
		d.UvarintBytes()
	}
	sym := d.UvarintBytes()
	if d.Err() != nil {
		return "", r.corrupt("symbol %d: %v", o, d.Err())
	}
	str := string(sym)
	r.st.syms[o] = str
	return str, nil
}

// cursor reads a region of the index sequentially through the page cache.
type cursor struct {
	r        *indexReader
	pos, end int64
	buf      []byte
	bufStart int64
}

func (c *cursor) ensure(n int64) error {
	if c.pos+n > c.end {
		return c.r.corrupt("read past the end of a section")
	}
	if c.pos >= c.bufStart && c.pos+n <= c.bufStart+int64(len(c.buf)) {
		return nil
	}
	ps := c.r.b.cache.pageSize
	to := min(c.end, max(c.pos+n, (c.pos/ps+1)*ps)) // to the end of the page, at least n
	b, err := c.r.read(c.pos, to)
	if err != nil {
		return err
	}
	c.buf, c.bufStart = b, c.pos
	return nil
}

func (c *cursor) uvarint() (uint64, error) {
	if err := c.ensure(min(binary.MaxVarintLen64, c.end-c.pos)); err != nil {
		return 0, err
	}
	v, n := binary.Uvarint(c.buf[c.pos-c.bufStart:])
	if n <= 0 {
		return 0, c.r.corrupt("invalid uvarint")
	}
	c.pos += int64(n)
	return v, nil
}

func (c *cursor) bytes(n int64) ([]byte, error) {
	if err := c.ensure(n); err != nil {
		return nil, err
	}
	o := c.pos - c.bufStart
	c.pos += n
	return c.buf[o : o+n : o+n], nil
}

// traverse walks the postings offset table from the entry at off, calling cb
// with each value and the offset of its postings list until cb returns false.
func (r *indexReader) traverse(off int64, cb func(value []byte, postingsOff int64) (bool, error)) error {
	c := cursor{r: r, pos: off, end: r.h.postingsEnd}
	for i := 0; c.pos < c.end; i++ {
		if i%128 == 0 {
			if err := r.ctx.Err(); err != nil {
				return err
			}
		}
		if _, err := c.uvarint(); err != nil { // key count
			return err
		}
		nl, err := c.uvarint()
		if err != nil {
			return err
		}
		if _, err := c.bytes(int64(nl)); err != nil {
			return err
		}
		vl, err := c.uvarint()
		if err != nil {
			return err
		}
		v, err := c.bytes(int64(vl))
		if err != nil {
			return err
		}
		po, err := c.uvarint()
		if err != nil {
			return err
		}
		if ok, err := cb(v, int64(po)); err != nil || !ok {
			return err
		}
	}
	return nil
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
	_, p, err := r.h.decodePostings(encoding.Decbuf{B: b[:l:l]})
	if err != nil {
		return nil, r.corrupt("decode postings at %d: %v", off, err)
	}
	return p, nil
}

// Symbols iterates over the block's symbol table.
func (r *indexReader) Symbols() index.StringIter {
	return &symbolsIter{c: cursor{r: r, pos: r.h.symStart, end: r.h.symEnd}, left: r.h.symCount}
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
	e := r.h.postings[name]
	if len(e) == 0 {
		return nil, nil
	}
	lastVal := e[len(e)-1].value
	var values []string
	err := r.traverse(e[0].off, func(v []byte, _ int64) (bool, error) {
		if hints != nil && hints.Limit > 0 && len(values) >= hints.Limit {
			return false, nil
		}
		values = append(values, string(v))
		return string(v) != lastVal, nil
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
	e := r.h.postings[name]
	if len(e) == 0 {
		return out, nil
	}
	lastVal := e[len(e)-1].value
	i := 0
	err := r.traverse(e[0].off, func(v []byte, po int64) (bool, error) {
		for i < len(values) && values[i] < string(v) {
			i++
		}
		if i == len(values) {
			return false, nil
		}
		if values[i] == string(v) {
			p, err := r.postingsAt(po)
			if err != nil {
				return false, err
			}
			out[i] = p
			i++
		}
		return string(v) != lastVal && i < len(values), nil
	})
	return out, err
}

// Postings returns the postings of the series with name set to one of values.
func (r *indexReader) Postings(ctx context.Context, name string, values ...string) (index.Postings, error) {
	e := r.h.postings[name]
	if len(e) == 0 || len(values) == 0 {
		return index.EmptyPostings(), nil
	}
	values = slices.Clone(values)
	slices.Sort(values)
	res := make([]index.Postings, 0, len(values))
	vi := 0
	for vi < len(values) && values[vi] < e[0].value {
		vi++
	}
	for vi < len(values) {
		value := values[vi]
		i := sort.Search(len(e), func(i int) bool { return e[i].value >= value })
		if i == len(e) {
			break
		}
		if i > 0 && e[i].value != value {
			i--
		}
		err := r.traverse(e[i].off, func(vb []byte, po int64) (bool, error) {
			v := string(vb)
			for v >= value {
				if v == value {
					p, err := r.postingsAt(po)
					if err != nil {
						return false, err
					}
					res = append(res, p)
				}
				vi++
				if vi == len(values) {
					break
				}
				value = values[vi]
			}
			if i+1 == len(e) || value >= e[i+1].value || vi == len(values) {
				return false, nil
			}
			return true, nil
		})
		if err != nil {
			return nil, err
		}
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
	e := r.h.postings[name]
	if len(e) == 0 {
		return index.EmptyPostings()
	}
	lastVal := e[len(e)-1].value
	var offs []int64
	if err := r.traverse(e[0].off, func(v []byte, po int64) (bool, error) {
		s := string(v)
		if match == nil || match(s) {
			offs = append(offs, po)
		}
		return s != lastVal, nil
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
// on the select's own goroutine (storage.NewMergeQuerier selects every block
// at once): so it reads the first series entry and its first chunk in the
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
	builder.SetSymbolTable(r.h.st)
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
		return slices.Clone(r.h.names), nil
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
