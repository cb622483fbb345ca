package block

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"

	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
)

// The column form of a chunk segment's frame (EncodingZstdColumns).
//
// An XOR chunk packs each sample's timestamp and value in a few bits; zstd
// finds little to repeat in such bit streams (a 1024-GPU cluster's raw
// chunks stay at 1.3-2.2 bytes per sample zstd-nocrc). The same samples
// written as columns of byte-aligned small integers compress far better:
// timestamps as delta-of-deltas (mostly 0 at a fixed scrape interval), and
// values, where every value of a chunk is a decimal of at most 9 digits
// after the point (counters, gauges of integers or of a few decimals), as
// deltas of those decimals taken as integers. Decoding writes the samples
// as an XOR chunk again (appendXOR, which writes what the TSDB's
// deterministic XOR appender writes): a chunk is put in column form only
// when that gives back its bytes exactly; any other entry (another chunk
// encoding, a chunk the appender would write otherwise) and the bytes
// before the first entry (the segment header) are kept verbatim. A frame's column form is a function of its bytes alone, so
// each frame still decodes on its own.
//
// Layout (integers are uvarints unless said otherwise):
//
//	version byte (columnsVersion)
//	the length of the frame's CRC-stripped bytes
//	then six streams, each as its length and its bytes:
//	items:  per item, n<<1|1 for an XOR chunk of n samples followed by its
//	        value mode byte (0-9: decimals of 10^-mode, modeFloat: float
//	        bits) and the length of its XOR data, or n<<1 for n verbatim
//	        bytes
//	firsts: per chunk, its first timestamp less the previous chunk's (varint)
//	times:  per chunk, the second sample's delta, then the delta-of-deltas (varints)
//	ints:   decimal chunks' values as integers of 10^-mode, deltas from the
//	        previous value of the chunk, the first from 0 (varints)
//	floats: float chunks' value bits, each XOR the previous (8 bytes, LE)
//	raw:    the verbatim bytes
//
// Version 1 had no XOR data lengths in items: a chunk's offset in the
// TSDB's file was known only by writing every chunk before it again, so a
// read of one chunk decoded its whole frame. With the lengths a frame's
// entries are laid out by reading its columns' varints, and one chunk is
// written again alone (ColumnFrame). Version 1 frames still decode.
const (
	columnsVersion = 2
	modeFloat      = 0xff
	maxDecimalExp  = 9
	columnStreams  = 6
)

// Stream indices in the column form.
const (
	colItems = iota
	colFirsts
	colTimes
	colInts
	colFloats
	colRaw
)

// columnsEncoder rewrites frames into their column form, keeping its
// buffers from one frame to the next.
type columnsEncoder struct {
	streams [columnStreams][]byte
	ts      []int64
	vs      []float64
	ints    []int64
	tds     []int64
	xs      []uint64
	xor     []byte
}

// encode appends the column form of content, the CRC-stripped bytes of a
// chunk segment frame whose first lead bytes are not entries, to dst.
func (e *columnsEncoder) encode(dst, content []byte, lead int) []byte {
	for i := range e.streams {
		e.streams[i] = e.streams[i][:0]
	}
	lead = max(0, min(lead, len(content)))
	verbatim, prevFirst := content[:lead], int64(0) // verbatim: the run not yet written
	for p := lead; p < len(content); {
		n, w := binary.Uvarint(content[p:])
		end := p + w + chunks.ChunkEncodingSize + int(n)
		if w <= 0 || n > uint64(len(content)) || end > len(content) {
			// Not an entry: the rest of the frame is kept as it is.
			verbatim = content[p-len(verbatim):]
			break
		}
		data := content[p+w+chunks.ChunkEncodingSize : end]
		if chunkenc.Encoding(content[p+w]) != chunkenc.EncXOR || w != uvarintLen(n) || !e.samples(data) {
			verbatim = content[p-len(verbatim) : end]
			p = end
			continue
		}
		e.flushVerbatim(verbatim)
		verbatim = content[end:end]
		e.streams[colFirsts] = binary.AppendVarint(e.streams[colFirsts], e.ts[0]-prevFirst)
		prevFirst = e.ts[0]
		e.appendChunk()
		p = end
	}
	e.flushVerbatim(verbatim)
	dst = append(dst, columnsVersion)
	dst = binary.AppendUvarint(dst, uint64(len(content)))
	for _, s := range e.streams {
		dst = binary.AppendUvarint(dst, uint64(len(s)))
		dst = append(dst, s...)
	}
	return dst
}

func (e *columnsEncoder) flushVerbatim(b []byte) {
	if len(b) > 0 {
		e.streams[colItems] = binary.AppendUvarint(e.streams[colItems], uint64(len(b))<<1)
		e.streams[colRaw] = append(e.streams[colRaw], b...)
	}
}

// samples reads the XOR chunk data into e.ts and e.vs (and e.tds, e.xs)
// and reports whether appendXOR writes them back as data exactly (and there
// is a sample): only then does the column form give the chunk back.
func (e *columnsEncoder) samples(data []byte) bool {
	if len(data) < 2 { // no sample count: the iterator would panic
		return false
	}
	c, err := chunkenc.FromData(chunkenc.EncXOR, data)
	if err != nil {
		return false
	}
	e.ts, e.vs = e.ts[:0], e.vs[:0]
	it := c.Iterator(nil)
	for it.Next() == chunkenc.ValFloat {
		t, v := it.At()
		e.ts, e.vs = append(e.ts, t), append(e.vs, v)
	}
	if it.Err() != nil || len(e.ts) == 0 || len(e.ts) != c.NumSamples() {
		return false
	}
	e.xor = appendXOR(e.xor[:0], e.ts, e.vs)
	if string(e.xor) != string(data) {
		return false
	}
	e.tds, e.xs = xorDeltas(e.ts, e.vs, e.tds, e.xs)
	return true
}

// appendChunk appends the chunk that samples read (e.ts, e.vs and, as
// the XOR writer takes them, e.tds and e.xs) to the streams.
func (e *columnsEncoder) appendChunk() {
	s := &e.streams
	mode := byte(modeFloat)
	if exp, ok := decimalExp(e.vs, &e.ints); ok {
		mode = byte(exp)
	}
	s[colItems] = append(binary.AppendUvarint(s[colItems], uint64(len(e.ts))<<1|1), mode)
	s[colItems] = binary.AppendUvarint(s[colItems], uint64(len(e.xor))) // samples left it the chunk's data
	for _, td := range e.tds {
		s[colTimes] = binary.AppendVarint(s[colTimes], td)
	}
	if mode != modeFloat {
		var prev int64
		for _, n := range e.ints {
			s[colInts] = binary.AppendVarint(s[colInts], n-prev)
			prev = n
		}
		return
	}
	for _, x := range e.xs {
		s[colFloats] = binary.LittleEndian.AppendUint64(s[colFloats], x)
	}
}

// xorDeltas returns the samples ts, vs as the XOR writer takes them: tds,
// the second timestamp's delta then each delta-of-delta, and xs, each
// value's float bits XOR the previous value's (the first's XOR 0).
func xorDeltas(ts []int64, vs []float64, tds []int64, xs []uint64) ([]int64, []uint64) {
	tds, xs = tds[:0], xs[:0]
	var prevD int64
	var prev uint64
	for i, t := range ts {
		if i > 0 {
			d := t - ts[i-1]
			tds = append(tds, d-prevD)
			prevD = d
		}
		x := math.Float64bits(vs[i])
		xs = append(xs, x^prev)
		prev = x
	}
	return tds, xs
}

// decimalExp returns the smallest e ≤ maxDecimalExp such that every value
// is decimalValue(n, e) bit for bit for an integer n of less than 2^53, with
// those integers in *ints.
func decimalExp(vs []float64, ints *[]int64) (int, bool) {
	e := 0
	for _, v := range vs {
		for ; e <= maxDecimalExp; e++ {
			if _, ok := decimalInt(v, e); ok {
				break
			}
		}
		if e > maxDecimalExp {
			return 0, false
		}
	}
	// e grew along the way: every value again at the final e.
	*ints = (*ints)[:0]
	for _, v := range vs {
		n, ok := decimalInt(v, e)
		if !ok {
			return 0, false
		}
		*ints = append(*ints, n)
	}
	return e, true
}

// decimalInt returns n with decimalValue(n, e) == v bit for bit, if there
// is one of less than 2^53 (NaNs, infinities and -0 have none).
func decimalInt(v float64, e int) (int64, bool) {
	r := math.Round(v * math.Pow10(e))
	if !(math.Abs(r) < 1<<53) {
		return 0, false
	}
	n := int64(r)
	return n, math.Float64bits(decimalValue(n, e)) == math.Float64bits(v)
}

// decimalValue is the value a decimal chunk's integer n stands for.
func decimalValue(n int64, e int) float64 { return float64(n) / math.Pow10(e) }

// uvarintLen is the length of n's shortest uvarint, the one the TSDB writes.
func uvarintLen(n uint64) int { return (bits.Len64(n|1) + 6) / 7 }

// errColumns says a frame's column form is not well formed.
var errColumns = errors.New("malformed column frame")

// columnsDecoder turns column forms back into frames' bytes, keeping its
// buffers from one frame to the next.
type columnsDecoder struct {
	streams [columnStreams][]byte
	xor     []byte
}

// decode appends to dst the CRC-stripped bytes of the frame whose column
// form is src; they are at most limit bytes (the frame's size in the TSDB's
// file), or src is malformed.
func (d *columnsDecoder) decode(dst, src []byte, limit int) ([]byte, error) {
	version, size, err := d.split(src, limit)
	if err != nil {
		return dst, err
	}
	start := len(dst)
	var prevFirst int64
	for items := d.streams[colItems]; len(items) > 0; {
		it, err := readItem(&items, version)
		if err != nil {
			return dst, err
		}
		if !it.chunk {
			raw := d.streams[colRaw]
			if uint64(len(raw)) < it.n || it.n > uint64(size-(len(dst)-start)) {
				return dst, fmt.Errorf("%w: verbatim bytes short or past the frame's %d bytes", errColumns, size)
			}
			dst, d.streams[colRaw] = append(dst, raw[:it.n]...), raw[it.n:]
			continue
		}
		first, w := binary.Varint(d.streams[colFirsts])
		if w <= 0 {
			return dst, fmt.Errorf("%w: first timestamp unreadable", errColumns)
		}
		d.streams[colFirsts] = d.streams[colFirsts][w:]
		prevFirst += first
		vals := &d.streams[colInts]
		if it.mode == modeFloat {
			vals = &d.streams[colFloats]
		}
		if d.xor, d.streams[colTimes], *vals, err = xorChunk(d.xor[:0], it, prevFirst, d.streams[colTimes], *vals); err != nil {
			return dst, err
		}
		dst = binary.AppendUvarint(dst, uint64(len(d.xor)))
		dst = append(append(dst, byte(chunkenc.EncXOR)), d.xor...)
		if len(dst)-start > size {
			return dst, fmt.Errorf("%w: chunks past the frame's %d bytes", errColumns, size)
		}
	}
	for i, s := range d.streams {
		if len(s) > 0 && i != colItems {
			return dst, fmt.Errorf("%w: %d bytes left in stream %d", errColumns, len(s), i)
		}
	}
	if len(dst)-start != size {
		return dst, fmt.Errorf("%w: %d bytes, the frame says %d", errColumns, len(dst)-start, size)
	}
	return dst, nil
}

// split reads the version, the frame's size and the streams of src.
func (d *columnsDecoder) split(src []byte, limit int) (version byte, size int, err error) {
	if len(src) == 0 || (src[0] != columnsVersion && src[0] != 1) {
		return 0, 0, fmt.Errorf("%w: not version 1 or %d", errColumns, columnsVersion)
	}
	version, src = src[0], src[1:]
	n, w := binary.Uvarint(src)
	if w <= 0 || n > uint64(limit) {
		return 0, 0, fmt.Errorf("%w: frame size unreadable or over %d", errColumns, limit)
	}
	src = src[w:]
	for i := range d.streams {
		n, w := binary.Uvarint(src)
		if w <= 0 || n > uint64(len(src)-w) {
			return 0, 0, fmt.Errorf("%w: stream %d runs past the end", errColumns, i)
		}
		d.streams[i], src = src[w:w+int(n)], src[w+int(n):]
	}
	if len(src) > 0 {
		return 0, 0, fmt.Errorf("%w: %d bytes after the streams", errColumns, len(src))
	}
	return version, int(n), nil
}

// columnItem is one item of a frame's column form: n verbatim bytes, or
// an XOR chunk of n samples in value mode mode, of dataLen bytes of XOR
// data (version 2; -1 in version 1, which did not say).
type columnItem struct {
	chunk   bool
	n       uint64
	mode    byte
	dataLen int
}

// readItem reads the next item of the items stream *items.
func readItem(items *[]byte, version byte) (columnItem, error) {
	b := *items
	v, w := binary.Uvarint(b)
	if w <= 0 {
		return columnItem{}, fmt.Errorf("%w: item unreadable", errColumns)
	}
	b = b[w:]
	it := columnItem{chunk: v&1 == 1, n: v >> 1, dataLen: -1}
	if it.chunk {
		if len(b) == 0 {
			return it, fmt.Errorf("%w: chunk without its value mode", errColumns)
		}
		it.mode, b = b[0], b[1:]
		if it.n == 0 || it.n > math.MaxUint16 || (it.mode > maxDecimalExp && it.mode != modeFloat) {
			return it, fmt.Errorf("%w: chunk of %d samples, value mode %d", errColumns, it.n, it.mode)
		}
		if version >= 2 {
			l, w := binary.Uvarint(b)
			if w <= 0 || l > math.MaxInt32 {
				return it, fmt.Errorf("%w: chunk length unreadable", errColumns)
			}
			it.dataLen, b = int(l), b[w:]
		}
	}
	*items = b
	return it, nil
}

// xorChunk appends to dst the XOR data of chunk it, its first sample at
// first, reading each sample's timestamp from times and value from vals
// (the ints or floats stream, by its mode) and writing it into the XOR
// chunk in one pass; it returns the data and what is left of times and
// vals. The work is bounded by the streams' size: each sample takes at
// least a byte of the timestamp and value streams.
func xorChunk(dst []byte, it columnItem, first int64, times, vals []byte) ([]byte, []byte, []byte, error) {
	n := int(it.n)
	if it.mode == modeFloat && len(vals) < 8*n {
		return dst, times, vals, fmt.Errorf("%w: float values short", errColumns)
	}
	v := valueReader{mode: it.mode, pow: 1, b: vals}
	if it.mode != modeFloat {
		v.pow = math.Pow10(int(it.mode))
	}
	x, ok := v.next()
	if !ok {
		return dst, times, vals, fmt.Errorf("%w: decimal values short", errColumns)
	}
	start, room := len(dst), 20+n*maxXORSampleBytes
	if it.dataLen >= 0 {
		room = it.dataLen // exactly: a ColumnFrame writes in place, into a slice of this capacity
	}
	xw := startXOR(slices.Grow(dst, room), n, first, x)
	// The column form holds the timestamps as the writer takes them: the
	// second's delta, then delta-of-deltas.
	for i := 1; i < n; i++ {
		td, w := readVarint(times)
		if w <= 0 {
			return dst, times, vals, fmt.Errorf("%w: timestamps short", errColumns)
		}
		times = times[w:]
		if x, ok = v.next(); !ok {
			return dst, times, vals, fmt.Errorf("%w: decimal values short", errColumns)
		}
		if i == 1 {
			xw.second(td, x)
		} else {
			xw.next(td, x)
		}
	}
	dst = xw.finish()
	if it.dataLen >= 0 && len(dst)-start != it.dataLen {
		return dst, times, vals, fmt.Errorf("%w: a chunk of %d bytes, its item says %d", errColumns, len(dst)-start, it.dataLen)
	}
	return dst, times, v.b, nil
}

// valueReader reads a chunk's values from its stream b as the XOR writer
// takes them, each value's bits XOR the previous one's: float chunks hold
// them so (the caller checks there are enough), decimal chunks hold the
// deltas of integers of 10^-mode.
type valueReader struct {
	mode     byte
	pow      float64
	n        int64
	prevBits uint64
	b        []byte
}

func (v *valueReader) next() (uint64, bool) {
	if v.mode == modeFloat {
		x := binary.LittleEndian.Uint64(v.b)
		v.b = v.b[8:]
		return x, true
	}
	delta, w := readVarint(v.b)
	if w <= 0 {
		return 0, false
	}
	v.b = v.b[w:]
	if delta == 0 { // the value again (a gauge holding still): its bits XOR themselves, no division
		return 0, true
	}
	v.n += delta
	f := float64(v.n)
	if v.mode > 0 { // integers: dividing by 1 changes nothing
		f /= v.pow // decimalValue(n, mode)
	}
	x := math.Float64bits(f)
	x, v.prevBits = x^v.prevBits, x
	return x, true
}

// readVarint is binary.Varint with the one-byte case (most delta-of-deltas
// and many value deltas) inline: decoding a frame reads one or two a sample.
func readVarint(b []byte) (int64, int) {
	if len(b) > 0 && b[0] < 0x80 {
		return int64(b[0]>>1) ^ -int64(b[0]&1), 1
	}
	return binary.Varint(b)
}
