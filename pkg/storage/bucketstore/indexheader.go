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
	"github.com/prometheus/prometheus/tsdb/encoding"
	"github.com/prometheus/prometheus/tsdb/index"
)

// Why not index.NewReader over a range-reading index.ByteSlice: the TSDB's
// reader looks symbols up with ByteSlice.Range(0, Len()) (the whole file as
// one slice) and walks the whole postings offset table the same way, and a
// ByteSlice cannot return an error. So this package reads the same format
// (v2, the only one Prometheus writes), the header here and the rest in the
// lazy reader (indexreader.go), with the TSDB's exported pieces
// (index.NewTOCFromByteSlice, index.Decoder for series entries, the block's
// postings decoder, index.Merge and friends) over ranges that fail
// cleanly:
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

// indexHeaderReader is what a block's index header answers: what the TSDB's
// index reader would answer from the sections it keeps in memory (the
// version, the label names, the symbol table, the postings offset table),
// as Thanos' indexheader.Reader does. The header keeps only a sample of
// those sections (every symbolFactor-th entry) and reads the rest through
// rd, the query's reader (indexReader), so one header serves every query,
// each with its own read windows.
type indexHeaderReader interface {
	// IndexVersion is the index format: index.FormatV2 or index.FormatV3.
	IndexVersion() int
	// LabelNames are the block's label names, sorted (not to be modified).
	LabelNames() []string
	// LookupSymbol returns the symbol of reference o.
	LookupSymbol(rd indexRanges, o uint32) (string, error)
	// LabelValues calls f with each value of name, in order, and the offset
	// of its postings list, until f returns false.
	LabelValues(ctx context.Context, rd indexRanges, name string, f func(value []byte, postingsOff int64) (bool, error)) error
	// PostingsOffsets calls f with the index in values (sorted) of each value
	// name has in the block, and the offset of its postings list, in order.
	PostingsOffsets(ctx context.Context, rd indexRanges, name string, values []string, f func(i int, postingsOff int64) error) error
	// SymbolTable is where the symbol table's entries are, and how many.
	SymbolTable() (start, end int64, count int)
	// LabelSymbols is the block's table of the label strings its series
	// share in memory (labels.ScratchBuilder.SetSymbolTable).
	LabelSymbols() *labels.SymbolTable
	// Size is an estimate of the header's memory, in bytes.
	Size() int64
}

// indexRanges reads the parts of a block's index its header does not hold.
// Its errors are returned as they are.
type indexRanges interface {
	// read returns [start, end) of the index.
	read(start, end int64) ([]byte, error)
	// readSymbols returns [start, end) of the symbol table.
	readSymbols(start, end int64) ([]byte, error)
	// corrupt is the error for an index that does not decode.
	corrupt(format string, args ...any) error
	// pageSize is how much a sequential read fetches at least.
	pageSize() int64
}

var _ indexHeaderReader = (*indexHeader)(nil)

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

	st *labels.SymbolTable

	// bytes is an estimate of the header's memory.
	bytes int64
}

func (h *indexHeader) IndexVersion() int { return h.version }

func (h *indexHeader) LabelNames() []string { return h.names }

func (h *indexHeader) SymbolTable() (start, end int64, count int) {
	return h.symStart, h.symEnd, h.symCount
}

func (h *indexHeader) LabelSymbols() *labels.SymbolTable { return h.st }

func (h *indexHeader) Size() int64 { return h.bytes }

func (h *indexHeader) LookupSymbol(rd indexRanges, o uint32) (string, error) {
	if s, ok := h.nameSymbols[o]; ok {
		return s, nil
	}
	if int(o) >= h.symCount {
		return "", rd.corrupt("unknown symbol offset %d", o)
	}
	g := int(o / symbolFactor)
	start, end := h.symOffsets[g], h.symEnd
	if g+1 < len(h.symOffsets) {
		end = h.symOffsets[g+1]
	}
	b, err := rd.readSymbols(start, end)
	if err != nil {
		return "", err
	}
	d := encoding.Decbuf{B: b}
	for i := o % symbolFactor; i > 0; i-- {
		d.UvarintBytes()
	}
	sym := d.UvarintBytes()
	if d.Err() != nil {
		return "", rd.corrupt("symbol %d: %v", o, d.Err())
	}
	return string(sym), nil
}

func (h *indexHeader) LabelValues(ctx context.Context, rd indexRanges, name string, f func(value []byte, postingsOff int64) (bool, error)) error {
	e := h.postings[name]
	if len(e) == 0 {
		return nil
	}
	lastVal := e[len(e)-1].value
	return h.walk(ctx, rd, e[0].off, func(v []byte, po int64) (bool, error) {
		more, err := f(v, po)
		return more && string(v) != lastVal, err
	})
}

func (h *indexHeader) PostingsOffsets(ctx context.Context, rd indexRanges, name string, values []string, f func(i int, postingsOff int64) error) error {
	e := h.postings[name]
	if len(e) == 0 || len(values) == 0 {
		return nil
	}
	vi := 0
	for vi < len(values) && values[vi] < e[0].value {
		vi++
	}
	for vi < len(values) {
		value := values[vi]
		// Walk from the sampled entry at or before value, as long as the
		// values asked for come before the next sampled entry.
		i := sort.Search(len(e), func(i int) bool { return e[i].value >= value })
		if i == len(e) {
			break
		}
		if i > 0 && e[i].value != value {
			i--
		}
		err := h.walk(ctx, rd, e[i].off, func(vb []byte, po int64) (bool, error) {
			v := string(vb)
			for v >= value {
				if v == value {
					if err := f(vi, po); err != nil {
						return false, err
					}
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
			return err
		}
	}
	return nil
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
func loadIndexHeader(ctx context.Context, c *PageCache, o object) (*indexHeader, error) {
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
	h := &indexHeader{toc: *toc, st: labels.NewSymbolTable()}
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
			curName, haveName, valueCount = string(nb), true, 0
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

// cursor reads a region of the index sequentially through the page cache.
type cursor struct {
	rd       indexRanges
	pos, end int64
	buf      []byte
	bufStart int64
}

func (c *cursor) ensure(n int64) error {
	if c.pos+n > c.end {
		return c.rd.corrupt("read past the end of a section")
	}
	if c.pos >= c.bufStart && c.pos+n <= c.bufStart+int64(len(c.buf)) {
		return nil
	}
	ps := c.rd.pageSize()
	to := min(c.end, max(c.pos+n, (c.pos/ps+1)*ps)) // to the end of the page, at least n
	b, err := c.rd.read(c.pos, to)
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
		return 0, c.rd.corrupt("invalid uvarint")
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

// walk walks the postings offset table from the entry at off, calling cb
// with each value and the offset of its postings list until cb returns false.
func (h *indexHeader) walk(ctx context.Context, rd indexRanges, off int64, cb func(value []byte, postingsOff int64) (bool, error)) error {
	c := cursor{rd: rd, pos: off, end: h.postingsEnd}
	for i := 0; c.pos < c.end; i++ {
		if i%128 == 0 {
			if err := ctx.Err(); err != nil {
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
