package block

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"strings"

	"github.com/prometheus/prometheus/tsdb/chunks"
)

// The TSDB puts a CRC32 after every chunk of a segment file and every series
// entry of an index. A CRC is a function of the bytes it covers, so it
// carries no information, but it is random to a compressor: in a 1h block of
// churning series (five points per series) the chunks' and series' CRCs are
// a fifth of what zstd leaves. EncodingZstdNoCRC leaves them out before
// compressing and recomputes them when decoding, so the decoded file is the
// TSDB's byte for byte; zstd's own content checksum guards the object.

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// crcEntries describes where a file's entries with a trailing CRC32 lie: in
// [start, end) of the TSDB's file (end < 0: to the end of the file), each
// at a multiple of align (zero padding before it), as a uvarint length L
// and L+extra bytes the CRC covers, then the CRC.
type crcEntries struct {
	start, end int64
	align      int64
	extra      int
}

// holds reports whether bytes [off, off+n) of the TSDB's file hold CRCs of
// l: frames outside its entries decode as they are.
func (l crcEntries) holds(off, n int64) bool {
	return off+n > l.start && (l.end < 0 || off < l.end)
}

// Index table of contents: six big-endian offsets and a CRC32 at the end of
// the file; the series section runs from the second to the third.
const indexTOCLen = 6*8 + crc32.Size

// crcLayout returns where the CRCs of the file rel lie, given its tail
// (which stripping leaves as it is).
func crcLayout(rel string, file []byte) (crcEntries, error) {
	switch {
	case isSegment(rel):
		// A segment: its header, then uvarint length, encoding byte, data, CRC.
		return crcEntries{start: chunks.SegmentHeaderSize, end: -1, align: 1, extra: chunks.ChunkEncodingSize}, nil
	case rel == IndexFilename:
		if len(file) < indexTOCLen {
			return crcEntries{}, errors.New("index shorter than its table of contents")
		}
		toc := file[len(file)-indexTOCLen:]
		series, next := int64(binary.BigEndian.Uint64(toc[8:])), int64(binary.BigEndian.Uint64(toc[16:]))
		if series <= 0 || next < series {
			return crcEntries{}, fmt.Errorf("index series section [%d,%d)", series, next)
		}
		// Series entries are 16-byte aligned (4-byte series references
		// address 64 GiB); the CRC covers the entry after its length.
		return crcEntries{start: series, end: next, align: 16}, nil
	}
	return crcEntries{}, fmt.Errorf("no CRC layout for %s", rel)
}

// isSegment reports whether the block file rel is a chunk segment.
func isSegment(rel string) bool { return strings.HasPrefix(rel, ChunksDirname+"/") }

// walkCRCs appends to out src, the bytes of the TSDB's file from offset base on (or
// their stripped form when !strip), leaving out (strip) or putting back
// (!strip) the CRC32 after each entry of l. Stripping checks each CRC it
// leaves out, so a file whose layout is not the expected one is refused
// rather than stored in a form that would not decode to it. at, when set,
// is called after each entry with the offset in the TSDB's file and in the
// output: the points where a frame of the stripped file may end.
func walkCRCs(out, src []byte, l crcEntries, base int64, strip bool, at func(pos int64, outLen int)) ([]byte, error) {
	si, pos := 0, base // pos: offset in the TSDB's file
	if pos < l.start {
		n := int(min(l.start-pos, int64(len(src))))
		out = append(out, src[:n]...)
		si, pos = n, pos+int64(n)
	}
	for si < len(src) && (l.end < 0 || pos < l.end) {
		if pad := (l.align - pos%l.align) % l.align; pad > 0 {
			if l.end >= 0 {
				pad = min(pad, l.end-pos)
			}
			if si+int(pad) > len(src) || !allZero(src[si:si+int(pad)]) {
				return nil, fmt.Errorf("entry padding at %d is not zeros", pos)
			}
			out = append(out, src[si:si+int(pad)]...)
			si, pos = si+int(pad), pos+pad
			continue
		}
		n, w := binary.Uvarint(src[si:])
		if w <= 0 || n > uint64(len(src)) {
			return nil, fmt.Errorf("entry length at %d unreadable", pos)
		}
		end := si + w + int(n) + l.extra
		if end > len(src) {
			return nil, fmt.Errorf("entry at %d runs past the end", pos)
		}
		out = append(out, src[si:end]...)
		sum := crc32.Checksum(src[si+w:end], castagnoli)
		si, pos = end, pos+int64(end-si)+crc32.Size
		if strip {
			if si+crc32.Size > len(src) || binary.BigEndian.Uint32(src[si:]) != sum {
				return nil, fmt.Errorf("entry at %d: no CRC32 of it after it", pos)
			}
			si += crc32.Size
		} else {
			out = binary.BigEndian.AppendUint32(out, sum)
		}
		if at != nil {
			at(pos, len(out))
		}
	}
	return append(out, src[si:]...), nil
}

func allZero(b []byte) bool { return len(bytes.Trim(b, "\x00")) == 0 }
