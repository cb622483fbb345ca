package block

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
)

// An encoded file is a run of independent zstd frames, each holding about
// FrameBytes (IndexFrameBytes) of the TSDB's file, then a zstd skippable frame holding the
// seek table: so a reader fetches and decodes only the frames that hold the
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

// FrameBytes and IndexFrameBytes: the bytes of the TSDB's file a frame of
// a chunk segment and of an index holds. Measured on the 30-day bench's
// 14-day blocks (bench/RESULTS.md): a chunk segment in 1 MiB frames costs
// 1-7 % more than in one frame, an index 2.1× more (likely: repeated long
// postings lists, e.g. every series of a node under several labels, lie
// megabytes apart), 1.3× in 4 MiB frames, nothing in 8 MiB (the whole index of one
// node's two weeks). A miss decodes at most a frame's run: a few ms for
// 8 MiB. Variables for tests (small frames: many per file).
var (
	FrameBytes      int64 = 1 << 20
	IndexFrameBytes int64 = 8 << 20
)

// frameBytes is the frame size of the file rel.
func frameBytes(rel string) int64 {
	if rel == IndexFilename {
		return IndexFrameBytes
	}
	return FrameBytes
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
	if f.Encoding == EncodingZstdNoCRC && t.crc.align <= 0 {
		return nil, fmt.Errorf("%w: %s: zstd-nocrc without its CRC layout", ErrEncodedSize, f.RelPath)
	}
	return t, nil
}

// DecodeFrames returns the TSDB file's bytes that frames first..last of an
// encoded file hold; enc is the object's bytes of those frames.
func DecodeFrames(f File, t *SeekTable, first, last int, enc []byte) ([]byte, error) {
	a, b := t.Frames[first], t.Frames[last]
	if int64(len(enc)) != b.EncStart+b.EncSize-a.EncStart {
		return nil, fmt.Errorf("%w: %s: frames %d-%d are %d bytes, not %d", ErrEncodedSize, f.RelPath, first, last, len(enc), b.EncStart+b.EncSize-a.EncStart)
	}
	out, err := zstdDecoder.DecodeAll(enc, nil)
	if err != nil {
		return nil, fmt.Errorf("decode %s: %w", f.RelPath, err)
	}
	if t.crc.align > 0 {
		if out, err = walkCRCs(out, t.crc, a.Start, false, nil); err != nil {
			return nil, fmt.Errorf("%s: put back CRCs: %w", f.RelPath, err)
		}
	}
	if want := b.Start + b.Size - a.Start; int64(len(out)) != want {
		return nil, fmt.Errorf("%w: %s: frames %d-%d decode to %d bytes, not %d", ErrEncodedSize, f.RelPath, first, last, len(out), want)
	}
	return out, nil
}

// encodeFrames encodes the TSDB file rel (plain) as an object of frames and
// returns it with the number of frames. stripCRC leaves out the entries'
// CRCs (an error: the file is not laid out as expected).
func encodeFrames(rel string, plain []byte, stripCRC bool) ([]byte, int, error) {
	content, cuts, l, size := plain, []int64{0}, crcEntries{}, frameBytes(rel)
	at := func(p int64) int64 { return p } // a cut's offset in content
	if stripCRC {
		var err error
		if l, err = crcLayout(rel, plain); err != nil {
			return nil, 0, err
		}
		var ends [][2]int64 // entry ends: offset in plain, in content
		if content, err = walkCRCs(plain, l, 0, true, func(pos int64, n int) { ends = append(ends, [2]int64{pos, int64(n)}) }); err != nil {
			return nil, 0, err
		}
		removed := int64(len(plain) - len(content))
		inside := func(p int64) bool { return p > l.start && (l.end < 0 || p < l.end) }
		// A frame may end outside the entries anywhere, inside only
		// after an entry.
		next := func(p int64) int64 {
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
		for last := int64(0); last < int64(len(plain)); last = cuts[len(cuts)-1] {
			cuts = append(cuts, min(int64(len(plain)), next(last+size)))
		}
	} else {
		for last := int64(0); last < int64(len(plain)); last = cuts[len(cuts)-1] {
			cuts = append(cuts, min(int64(len(plain)), last+size))
		}
	}
	if len(cuts) == 1 { // an empty file: one empty frame
		cuts = append(cuts, 0)
	}
	le := binary.LittleEndian
	var obj, table []byte
	for i := 1; i < len(cuts); i++ {
		n := len(obj)
		obj = zstdEncoder.EncodeAll(content[at(cuts[i-1]):at(cuts[i])], obj)
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
