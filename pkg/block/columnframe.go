package block

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"math/bits"
	"sort"
	"sync"

	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
)

// ColumnFrame is one frame of a zstd-columns chunk segment made ready to
// give out its chunks one at a time.
//
// A query of one metric reads a chunk or a few of every GPU's stretch of a
// segment (series sort by Hostname and UUID before __name__), so decoding
// the frame under each read, as a plain file's pages are read, writes a few
// dozen chunks again for each one the query wants: on the 512-GPU day that
// made a 24 h view's first, cold read cost 1.7-1.9× a plain file's CPU. A
// ColumnFrame lays out the frame's entries once, by reading the columns'
// varints (a few ns a sample, where writing a chunk again costs about 14),
// and writes a chunk again only when it is read, keeping it for the next
// read. Version 1 frames, which did not store their chunks' lengths, are
// decoded whole instead.
//
// A ColumnFrame is safe for concurrent use; the chunks it gives out are
// never written again.
type ColumnFrame struct {
	start, size int64 // the frame's bytes of the TSDB's file
	form        []byte
	times, ints []byte // the streams entries point into
	floats, raw []byte
	entries     []columnEntry // by offset
	// plain holds the frame's bytes in the TSDB's file when it was decoded
	// whole (version 1): entries is then empty.
	plain []byte

	mtx sync.Mutex
	// written holds the chunks written again, one after the other; at[k]-1
	// is where entry k's data starts in it (0: not written yet). Appending
	// leaves the bytes handed out as they are (a grown buffer is a copy).
	written []byte
	at      []int32
}

// columnEntry is one entry (length, encoding, data, CRC) of the frame: an
// XOR chunk in column form, or one kept verbatim. Small and without
// pointers: a frame has hundreds, and a cold query opens a frame in every
// GPU's stretch of a segment.
type columnEntry struct {
	first int64 // a chunk's first timestamp
	off   int32 // in the frame
	// pos: where a chunk's timestamps start in times, or where a verbatim
	// entry's encoding byte lies in raw; vals: where a chunk's values
	// start in ints or floats.
	pos, vals int32
	dataLen   int32 // a chunk's XOR data; a verbatim entry's encoding byte and data
	n         uint16
	mode      byte
	chunk     bool
}

// OpenColumnFrame reads frame i of a zstd-columns chunk segment from enc,
// its bytes in the object.
func OpenColumnFrame(t *SeekTable, i int, enc []byte) (*ColumnFrame, error) {
	fr := t.Frames[i]
	form, err := zstdDecoder.DecodeAll(enc, nil)
	if err != nil {
		return nil, fmt.Errorf("frame at %d: %w", fr.Start, err)
	}
	f, err := layOutColumns(fr.Start, fr.Size, form)
	if errors.Is(err, errVersion1) { // no lengths: decoded whole
		f = &ColumnFrame{start: fr.Start, size: fr.Size}
		if f.plain, err = decodeColumnFrames(nil, t, i, i, enc); err == nil {
			f.plain, err = walkCRCs(nil, f.plain, t.crc, fr.Start, false, nil)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("frame at %d: %w", fr.Start, err)
	}
	return f, nil
}

// errVersion1: a version 1 column form, whose entries cannot be laid out
// without writing every chunk again.
var errVersion1 = errors.New("column form of version 1")

// layOutColumns opens the column form of a frame holding bytes [start,
// start+size) of a chunk segment.
func layOutColumns(start, size int64, form []byte) (*ColumnFrame, error) {
	f := &ColumnFrame{start: start, size: size, form: form}
	var d columnsDecoder
	version, stripped, err := d.split(form, int(size))
	if err != nil {
		return nil, err
	}
	if version < 2 {
		return nil, errVersion1
	}
	if err := f.layOut(&d, stripped); err != nil {
		return nil, err
	}
	return f, nil
}

// layOut finds where each entry of the frame lies, in the TSDB's file and
// in the streams, without writing any chunk again.
func (f *ColumnFrame) layOut(d *columnsDecoder, size int) error {
	s := &d.streams
	f.times, f.ints, f.floats, f.raw = s[colTimes], s[colInts], s[colFloats], s[colRaw]
	if max(len(f.form), int(f.size)) > math.MaxInt32 {
		return fmt.Errorf("%w: a frame of %d bytes", errColumns, f.size)
	}
	// A chunk's item takes three bytes at least; verbatim runs add few.
	f.entries = make([]columnEntry, 0, len(s[colItems])/3+4)
	var st struct{ times, ints, floats, raw int } // read so far
	off, stripped, first := 0, 0, int64(0)        // off: in the frame
	for items := s[colItems]; len(items) > 0; {
		it, err := readItem(&items, columnsVersion)
		if err != nil {
			return err
		}
		if !it.chunk {
			if it.n > uint64(len(f.raw)-st.raw) {
				return fmt.Errorf("%w: verbatim bytes short", errColumns)
			}
			if off, err = f.verbatimEntries(st.raw, int(it.n), off); err != nil {
				return err
			}
			st.raw += int(it.n)
			stripped += int(it.n)
			continue
		}
		df, w := binary.Varint(s[colFirsts])
		if w <= 0 {
			return fmt.Errorf("%w: first timestamp unreadable", errColumns)
		}
		s[colFirsts] = s[colFirsts][w:]
		first += df
		e := columnEntry{first: first, off: int32(off), pos: int32(st.times), dataLen: int32(it.dataLen), n: uint16(it.n), mode: it.mode, chunk: true}
		nt, ok := skipVarints(f.times[st.times:], int(it.n)-1)
		if !ok {
			return fmt.Errorf("%w: timestamps short", errColumns)
		}
		st.times += nt
		if it.mode == modeFloat {
			if 8*int(it.n) > len(f.floats)-st.floats {
				return fmt.Errorf("%w: float values short", errColumns)
			}
			e.vals, st.floats = int32(st.floats), st.floats+8*int(it.n)
		} else {
			nv, ok := skipVarints(f.ints[st.ints:], int(it.n))
			if !ok {
				return fmt.Errorf("%w: decimal values short", errColumns)
			}
			e.vals, st.ints = int32(st.ints), st.ints+nv
		}
		f.entries = append(f.entries, e)
		entry := uvarintLen(uint64(it.dataLen)) + chunks.ChunkEncodingSize + it.dataLen
		stripped += entry
		if off += entry + crc32.Size; off > int(f.size) {
			return fmt.Errorf("%w: entries past the frame's %d bytes", errColumns, f.size)
		}
	}
	if st.times != len(f.times) || st.ints != len(f.ints) || st.floats != len(f.floats) || st.raw != len(f.raw) || len(s[colFirsts]) > 0 {
		return fmt.Errorf("%w: bytes left in the streams", errColumns)
	}
	if stripped != size || off != int(f.size) {
		return fmt.Errorf("%w: entries of %d bytes (%d in the file), the frame says %d (%d)", errColumns, stripped, off, size, f.size)
	}
	return nil
}

// verbatimEntries adds the entries of the verbatim run of n bytes at
// raw[pos:] (the segment's header, chunks of other encodings), the first
// at off in the frame, and returns the offset past them.
func (f *ColumnFrame) verbatimEntries(pos, n, off int) (int, error) {
	run := f.raw[pos : pos+n]
	for i := 0; i < len(run); {
		if f.start+int64(off) < chunks.SegmentHeaderSize { // the header: no entry
			k := min(chunks.SegmentHeaderSize-int(f.start)-off, len(run)-i)
			i, off = i+k, off+k
			continue
		}
		l, w := binary.Uvarint(run[i:])
		if w <= 0 || l > uint64(len(run)-i-w-chunks.ChunkEncodingSize) {
			return off, fmt.Errorf("%w: verbatim entry at %d unreadable", errColumns, f.start+int64(off))
		}
		dataLen := chunks.ChunkEncodingSize + int(l)
		f.entries = append(f.entries, columnEntry{off: int32(off), pos: int32(pos + i + w), dataLen: int32(dataLen)})
		i += w + dataLen
		if off += w + dataLen + crc32.Size; off > int(f.size) {
			return off, fmt.Errorf("%w: entries past the frame's %d bytes", errColumns, f.size)
		}
	}
	return off, nil
}

// skipVarints returns how many bytes of b the next n varints take. Most
// are one byte (a regular scrape's delta-of-delta, a gauge's small step),
// so it counts the bytes that end one (top bit clear) eight at a time:
// laying out a frame reads every varint of its timestamps and values.
func skipVarints(b []byte, n int) (int, bool) {
	i := 0
	for n > 0 {
		if i+8 > len(b) { // the tail, byte by byte
			if i >= len(b) {
				return 0, false
			}
			if b[i] < 0x80 {
				n--
			}
			i++
			continue
		}
		ends := ^binary.LittleEndian.Uint64(b[i:]) & 0x8080808080808080
		if c := bits.OnesCount64(ends); c < n {
			i, n = i+8, n-c
			continue
		}
		for ; n > 1; n-- {
			ends &= ends - 1 // the ends before the n-th
		}
		return i + bits.TrailingZeros64(ends)/8 + 1, true
	}
	return i, true
}

// Chunk returns the chunk whose entry starts at off in the TSDB's file
// (a chunk reference's offset), and how many bytes were written again to
// give it (0 when it was read before).
func (f *ColumnFrame) Chunk(off int64) (chunkenc.Chunk, int, error) {
	if f.plain != nil {
		return f.plainChunk(off)
	}
	rel := off - f.start
	k := sort.Search(len(f.entries), func(k int) bool { return int64(f.entries[k].off) >= rel })
	if rel < 0 || k == len(f.entries) || int64(f.entries[k].off) != rel {
		return nil, 0, fmt.Errorf("no chunk at %d in the frame at %d", off, f.start)
	}
	e := &f.entries[k]
	if !e.chunk {
		data := f.raw[e.pos : e.pos+e.dataLen : e.pos+e.dataLen]
		c, err := chunkenc.FromData(chunkenc.Encoding(data[0]), data[1:])
		return c, 0, err
	}
	f.mtx.Lock()
	defer f.mtx.Unlock()
	if f.at == nil {
		f.at = make([]int32, len(f.entries))
	}
	written := 0
	if f.at[k] == 0 {
		vals := f.ints
		if e.mode == modeFloat {
			vals = f.floats
		}
		start := len(f.written)
		it := columnItem{chunk: true, n: uint64(e.n), mode: e.mode, dataLen: int(e.dataLen)}
		data, _, _, err := xorChunk(f.written, it, e.first, f.times[e.pos:], vals[e.vals:])
		if err != nil {
			return nil, 0, fmt.Errorf("chunk at %d: %w", off, err)
		}
		f.written, f.at[k], written = data, int32(start+1), len(data)-start
	}
	p := int(f.at[k] - 1)
	data := f.written[p : p+int(e.dataLen) : p+int(e.dataLen)]
	c, err := chunkenc.FromData(chunkenc.EncXOR, data)
	return c, written, err
}

// plainChunk returns the chunk at off of a frame decoded whole.
func (f *ColumnFrame) plainChunk(off int64) (chunkenc.Chunk, int, error) {
	b := f.plain[min(max(0, off-f.start), int64(len(f.plain))):]
	l, w := binary.Uvarint(b)
	if off < f.start || w <= 0 || l > uint64(len(b)-w-chunks.ChunkEncodingSize) {
		return nil, 0, fmt.Errorf("no chunk at %d in the frame at %d", off, f.start)
	}
	data := b[w : w+chunks.ChunkEncodingSize+int(l) : w+chunks.ChunkEncodingSize+int(l)]
	c, err := chunkenc.FromData(chunkenc.Encoding(data[0]), data[1:])
	return c, 0, err
}

// Bytes is the memory the frame holds before any chunk is read: each
// chunk written back adds its bytes (Chunk says how many).
func (f *ColumnFrame) Bytes() int64 {
	if f.plain != nil {
		return int64(cap(f.plain))
	}
	const entryBytes = 32 + 4 // unsafe.Sizeof(columnEntry{}) and its place in at
	return int64(cap(f.form)) + int64(cap(f.entries))*entryBytes
}

// Start and Size are the frame's bytes in the TSDB's file.
func (f *ColumnFrame) Start() int64 { return f.start }
func (f *ColumnFrame) Size() int64  { return f.size }
