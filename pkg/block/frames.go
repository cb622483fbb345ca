package block

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"sync"
)

// An encoded file is a run of independent zstd frames, each holding a part
// of the TSDB's file (frameZones: of about FrameBytes of a chunk segment,
// an index's sections), then a zstd skippable frame holding the seek table: so a reader fetches and decodes only the frames that hold the
// bytes it needs (a 1 h block of a 1024-GPU cluster's two weeks is over a
// GB decoded), and a plain zstd decoder still decodes the whole object
// (it skips skippable frames). With the CRCs left out, frames end between
// entries, so each decodes on its own.
//
// Seek table (little endian, the skippable frame's payload):
//
//	per frame: uint32 size in the TSDB's file, uint32 size encoded
//	uint64 start, int64 end, uint32 align, uint32 extra   (crcEntries; align 0: no CRCs left out)
//	uint32 frames, uint32 seekMagic
const (
	skippableMagic = 0x184D2A5E
	seekMagic      = 0x31545347 // "GST1"
)

// FrameBytes, IndexFrameBytes, SeriesFrameBytes and PostingsFrameBytes:
// the bytes of the TSDB's file a frame holds, in a chunk segment, in an
// index's symbols and tables, its series section and its postings section.
// An index's frames end at its sections' ends, so a query decodes only the
// sections it reads: opening a block reads the symbols and the postings
// offset table, a selector one postings list and the series entries it
// names (contiguous: series are sorted by labels, metric name first).
// Measured on the 30-day bench's 14-day blocks (bench/RESULTS.md): a chunk
// segment in 1 MiB frames costs 1-7 % more than in one frame; an index in
// uniform 1 MiB frames 2.1× more (likely: repeated long postings lists, e.g.
// every series of a node under several labels, lie megabytes apart) and in
// 8 MiB frames nothing (the whole index of one node's two weeks), but a
// miss then decoded the whole index. Variables for tests (small frames:
// many per file).
var (
	FrameBytes         int64 = 1 << 20
	ColumnsFrameBytes  int64 = 32 << 10
	IndexFrameBytes    int64 = 8 << 20
	SeriesFrameBytes   int64 = 256 << 10
	PostingsFrameBytes int64 = 8 << 20
)

// ColumnsFrameBytes is FrameBytes for a chunk segment in zstd-columns.
// Writing a frame's chunks again costs about 14 ns a sample where
// zstd-nocrc costs 1.5-5, and the series of one metric lie in every GPU's
// stretch of a segment (series are sorted by Hostname and UUID before
// __name__): a query of one metric reads a page or two of every stretch,
// and with 1 MiB frames decoded every frame whole. With frames about a page
// long (the bucket store's 32 KiB) it decodes the frames under the pages it
// reads. On the 512-GPU day at a 1 m scrape (stretches of 88 KB, so most
// pages are still read) that cut a 24 h view's cold CPU from 1.8-2.2 s to
// 1.5-1.8 (plain: 0.8-1.2), for 8-11 % more bytes (bench/RESULTS.md); at a
// 15 s scrape a stretch is a few times longer and the cut larger (not
// measured). The index keeps its own frames.
//
// SectionFrames false cuts an index evenly in frames of IndexFrameBytes,
// as gpustore did before an index's sections had frames of their own
// (blocks written so are read alike: the seek table says where frames
// end). For tests that read such blocks.
var SectionFrames = true

// zone is a part of a file cut into frames of about size bytes, up to end.
type zone struct{ end, size int64 }

// frameZones returns how the file rel is cut into frames: an index by its
// sections (one zone per section of its table of contents, when it has a
// plausible one), any other file in frames of segmentFrame.
func frameZones(rel string, plain []byte, segmentFrame int64) []zone {
	n := int64(len(plain))
	if rel != IndexFilename {
		return []zone{{n, segmentFrame}}
	}
	if n < indexTOCLen || !SectionFrames {
		return []zone{{n, IndexFrameBytes}}
	}
	var toc [6]int64 // symbols, series, label indices, label indices table, postings, postings table
	for i := range toc {
		toc[i] = int64(binary.BigEndian.Uint64(plain[n-indexTOCLen+8*int64(i):]))
	}
	// In the file: symbols, series, label indices, postings, label
	// indices table, postings offset table, TOC.
	ends := []zone{
		{toc[1], IndexFrameBytes},    // header and symbols
		{toc[2], SeriesFrameBytes},   // series
		{toc[4], IndexFrameBytes},    // label indices (none since Prometheus 2.x)
		{toc[3], PostingsFrameBytes}, // postings
		{n, IndexFrameBytes},         // tables and TOC
	}
	for i, z := range ends {
		if z.end <= 0 || z.end > n || (i > 0 && z.end < ends[i-1].end) {
			return []zone{{n, IndexFrameBytes}} // not a TOC we know: cut evenly
		}
	}
	return ends
}

// Frame is one zstd frame of an encoded file: bytes [Start, Start+Size) of
// the TSDB's file, stored at [EncStart, EncStart+EncSize) of the object.
type Frame struct{ Start, Size, EncStart, EncSize int64 }

// SeekTable lists an encoded file's frames.
type SeekTable struct {
	Frames []Frame
	crc    crcEntries // where decoding puts the CRCs back (align 0: nowhere)
}

// SeekTableLen is the size of the tail of f's object that holds its seek
// table (the skippable frame).
func SeekTableLen(f File) int64 { return 8 + 8*int64(f.Frames) + 32 }

// FrameAt returns the index of the frame holding byte off of the TSDB's file.
func (t *SeekTable) FrameAt(off int64) int {
	return sort.Search(len(t.Frames), func(i int) bool { return t.Frames[i].Start+t.Frames[i].Size > off })
}

// ParseSeekTable reads the seek table from the last SeekTableLen(f) bytes
// of f's object, checked against meta.json's sizes.
func ParseSeekTable(f File, tail []byte) (*SeekTable, error) {
	if int64(len(tail)) != SeekTableLen(f) || f.Frames <= 0 {
		return nil, fmt.Errorf("%w: %s: seek table of %d bytes for %d frames", ErrEncodedSize, f.RelPath, len(tail), f.Frames)
	}
	le := binary.LittleEndian
	if le.Uint32(tail) != skippableMagic || int(le.Uint32(tail[4:])) != len(tail)-8 || le.Uint32(tail[len(tail)-4:]) != seekMagic ||
		int(le.Uint32(tail[len(tail)-8:])) != f.Frames {
		return nil, fmt.Errorf("%w: %s: no seek table at the end of the object", ErrEncodedSize, f.RelPath)
	}
	t := &SeekTable{Frames: make([]Frame, f.Frames)}
	var start, enc int64
	for i := range t.Frames {
		p := tail[8+8*i:]
		t.Frames[i] = Frame{Start: start, Size: int64(le.Uint32(p)), EncStart: enc, EncSize: int64(le.Uint32(p[4:]))}
		start, enc = start+t.Frames[i].Size, enc+t.Frames[i].EncSize
	}
	if start != f.SizeBytes || enc+int64(len(tail)) != f.StoredBytes {
		return nil, fmt.Errorf("%w: %s: frames hold %d bytes in %d, meta.json says %d in %d", ErrEncodedSize, f.RelPath, start, enc+int64(len(tail)), f.SizeBytes, f.StoredBytes)
	}
	r := tail[8+8*f.Frames:]
	t.crc = crcEntries{start: int64(le.Uint64(r)), end: int64(le.Uint64(r[8:])), align: int64(le.Uint32(r[16:])), extra: int(le.Uint32(r[20:]))}
	if (f.Encoding == EncodingZstdNoCRC || f.Encoding == EncodingZstdColumns) && t.crc.align <= 0 {
		return nil, fmt.Errorf("%w: %s: %s without its CRC layout", ErrEncodedSize, f.RelPath, f.Encoding)
	}
	return t, nil
}

// DecodeFrames returns the TSDB file's bytes that frames first..last of an
// encoded file hold; enc is the object's bytes of those frames.
func DecodeFrames(f File, t *SeekTable, first, last int, enc []byte) ([]byte, error) {
	a, b := t.Frames[first], t.Frames[last]
	return AppendFrames(make([]byte, 0, b.Start+b.Size-a.Start), f, t, first, last, enc)
}

// AppendFrames is DecodeFrames appending to dst: a reader that copies the
// bytes elsewhere (the bucket store's pages) decodes into a reused buffer,
// without allocating and clearing a frame's size of memory each time.
func AppendFrames(dst []byte, f File, t *SeekTable, first, last int, enc []byte) ([]byte, error) {
	a, b := t.Frames[first], t.Frames[last]
	if int64(len(enc)) != b.EncStart+b.EncSize-a.EncStart {
		return nil, fmt.Errorf("%w: %s: frames %d-%d are %d bytes, not %d", ErrEncodedSize, f.RelPath, first, last, len(enc), b.EncStart+b.EncSize-a.EncStart)
	}
	want, n := b.Start+b.Size-a.Start, len(dst)
	dst = grown(dst, want)
	var out []byte
	var err error
	if f.Encoding == EncodingZstdColumns {
		sp := stripped.Get().(*[]byte)
		defer stripped.Put(sp)
		if *sp, err = decodeColumnFrames((*sp)[:0], t, first, last, enc); err != nil {
			return nil, fmt.Errorf("decode %s: %w", f.RelPath, err)
		}
		if out, err = walkCRCs(dst, *sp, t.crc, a.Start, false, nil); err != nil {
			return nil, fmt.Errorf("%s: put back CRCs: %w", f.RelPath, err)
		}
	} else if t.crc.align > 0 && t.crc.holds(a.Start, want) {
		// Decoded into scratch, then copied with the CRCs put back.
		sp := stripped.Get().(*[]byte)
		defer stripped.Put(sp)
		if *sp, err = zstdDecoder.DecodeAll(enc, grown((*sp)[:0], want)); err != nil {
			return nil, fmt.Errorf("decode %s: %w", f.RelPath, err)
		}
		if out, err = walkCRCs(dst, *sp, t.crc, a.Start, false, nil); err != nil {
			return nil, fmt.Errorf("%s: put back CRCs: %w", f.RelPath, err)
		}
	} else if out, err = zstdDecoder.DecodeAll(enc, dst); err != nil {
		return nil, fmt.Errorf("decode %s: %w", f.RelPath, err)
	}
	if int64(len(out)-n) != want {
		return nil, fmt.Errorf("%w: %s: frames %d-%d decode to %d bytes, not %d", ErrEncodedSize, f.RelPath, first, last, len(out)-n, want)
	}
	return out, nil
}

// grown returns b with room for n more bytes: appended in one allocation,
// not in the doublings of append (a pooled buffer may come back small
// after the pool was emptied).
func grown(b []byte, n int64) []byte {
	if int64(cap(b)-len(b)) >= n {
		return b
	}
	return append(make([]byte, 0, int64(len(b))+n), b...)
}

// stripped holds buffers for frames decoded before their CRCs are put back.
var stripped = sync.Pool{New: func() any { return new([]byte) }}

// columnFrames holds the scratch of decoding column frames: a frame's
// column form and the decoder's buffers.
type columnFrames struct {
	form []byte
	dec  columnsDecoder
}

var columnScratch = sync.Pool{New: func() any { return new(columnFrames) }}

// decodeColumnFrames appends the CRC-stripped bytes that frames
// first..last of an EncodingZstdColumns file hold to dst; enc is the
// object's bytes of those frames. Each frame is decoded on its own: its
// column form is a function of its bytes alone.
func decodeColumnFrames(dst []byte, t *SeekTable, first, last int, enc []byte) ([]byte, error) {
	s := columnScratch.Get().(*columnFrames)
	defer columnScratch.Put(s)
	base := t.Frames[first].EncStart
	for _, fr := range t.Frames[first : last+1] {
		var err error
		if s.form, err = zstdDecoder.DecodeAll(enc[fr.EncStart-base:fr.EncStart-base+fr.EncSize], s.form[:0]); err != nil {
			return nil, err
		}
		if dst, err = s.dec.decode(grown(dst, fr.Size), s.form, int(fr.Size)); err != nil {
			return nil, fmt.Errorf("frame at %d: %w", fr.Start, err)
		}
	}
	return dst, nil
}

// encodeFrames encodes the TSDB file rel (plain) as an object of frames in
// enc and returns it with the number of frames. An error: the file is not
// laid out as enc expects (its CRCs, a chunk segment for columns).
func encodeFrames(rel string, plain []byte, enc string) ([]byte, int, error) {
	stripCRC := enc == EncodingZstdNoCRC || enc == EncodingZstdColumns
	var columns *columnsEncoder
	if enc == EncodingZstdColumns {
		if !isSegment(rel) {
			return nil, 0, fmt.Errorf("%s: no column form but for chunk segments", rel)
		}
		columns = new(columnsEncoder)
	}
	content, cuts, l := plain, []int64{0}, crcEntries{}
	at := func(p int64) int64 { return p }   // a cut's offset in content
	next := func(p int64) int64 { return p } // where a frame wanting to end at p may end
	if stripCRC {
		var err error
		if l, err = crcLayout(rel, plain); err != nil {
			return nil, 0, err
		}
		var ends [][2]int64 // entry ends: offset in plain, in content
		if content, err = walkCRCs(make([]byte, 0, len(plain)), plain, l, 0, true, func(pos int64, n int) { ends = append(ends, [2]int64{pos, int64(n)}) }); err != nil {
			return nil, 0, err
		}
		removed := int64(len(plain) - len(content))
		inside := func(p int64) bool { return p > l.start && (l.end < 0 || p < l.end) }
		// A frame may end outside the entries anywhere, inside only
		// after an entry.
		next = func(p int64) int64 {
			if !inside(p) {
				return p
			}
			if i := sort.Search(len(ends), func(i int) bool { return ends[i][0] >= p }); i < len(ends) {
				return ends[i][0]
			}
			if l.end >= 0 {
				return l.end
			}
			return int64(len(plain))
		}
		at = func(p int64) int64 {
			switch {
			case p <= l.start:
				return p
			case l.end >= 0 && p >= l.end, p == int64(len(plain)):
				return p - removed
			}
			i := sort.Search(len(ends), func(i int) bool { return ends[i][0] >= p })
			return ends[i][1]
		}
	}
	segmentFrame := FrameBytes
	if columns != nil {
		segmentFrame = ColumnsFrameBytes
	}
	zones := frameZones(rel, plain, segmentFrame)
	for last, z := int64(0), 0; last < int64(len(plain)); last = cuts[len(cuts)-1] {
		for zones[z].end <= last {
			z++
		}
		cuts = append(cuts, min(int64(len(plain)), next(min(zones[z].end, last+zones[z].size))))
	}
	if len(cuts) == 1 { // an empty file: one empty frame
		cuts = append(cuts, 0)
	}
	le := binary.LittleEndian
	var obj, table, form []byte
	for i := 1; i < len(cuts); i++ {
		n, part := len(obj), content[at(cuts[i-1]):at(cuts[i])]
		if columns != nil {
			// The segment header (in the first frame) is not an entry.
			form = columns.encode(form[:0], part, int(l.start-cuts[i-1]))
			part = form
		}
		obj = zstdEncoder.EncodeAll(part, obj)
		if cuts[i]-cuts[i-1] > 1<<31 || len(obj)-n > 1<<31 {
			return nil, 0, errors.New("frame too large")
		}
		table = le.AppendUint32(le.AppendUint32(table, uint32(cuts[i]-cuts[i-1])), uint32(len(obj)-n))
	}
	table = le.AppendUint64(le.AppendUint64(table, uint64(l.start)), uint64(l.end))
	table = le.AppendUint32(le.AppendUint32(table, uint32(l.align)), uint32(l.extra))
	table = le.AppendUint32(le.AppendUint32(table, uint32(len(cuts)-1)), seekMagic)
	obj = le.AppendUint32(le.AppendUint32(obj, skippableMagic), uint32(len(table)))
	return append(obj, table...), len(cuts) - 1, nil
}
