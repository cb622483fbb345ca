package block

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
)

// segmentEntry is a chunk of a segment file as the TSDB wrote it.
type segmentEntry struct {
	off  int64
	enc  chunkenc.Encoding
	data []byte
}

// segmentEntries lists the chunks of the TSDB's segment file plain.
func segmentEntries(t testing.TB, plain []byte) []segmentEntry {
	t.Helper()
	var out []segmentEntry
	for p := chunks.SegmentHeaderSize; p < len(plain); {
		l, w := binary.Uvarint(plain[p:])
		if w <= 0 || p+w+1+int(l)+crc32.Size > len(plain) {
			t.Fatalf("segment entry at %d unreadable", p)
		}
		out = append(out, segmentEntry{int64(p), chunkenc.Encoding(plain[p+w]), plain[p+w+1 : p+w+1+int(l)]})
		p += w + 1 + int(l) + crc32.Size
	}
	return out
}

// TestColumnFrameGivesEachChunkAlone: every chunk of real segments (XOR
// chunks in columns, histogram chunks kept verbatim), read by its offset
// from the frame holding it in any order, is the TSDB's chunk byte for
// byte; reading one chunk writes that chunk again and no other (a query of
// one metric reads one chunk or a few of each GPU's stretch of a segment),
// and reading it again writes nothing.
func TestColumnFrameGivesEachChunkAlone(t *testing.T) {
	defer func(n int64) { ColumnsFrameBytes = n }(ColumnsFrameBytes)
	for seed := range uint64(2) {
		dir, _ := writeGPUBlock(t, seed)
		plain, err := os.ReadFile(filepath.Join(dir, "chunks", "000001"))
		if err != nil {
			t.Fatal(err)
		}
		entries := segmentEntries(t, plain)
		for _, fb := range []int64{4 << 10, 32 << 10, 1 << 20} {
			ColumnsFrameBytes = fb
			obj, _, st := encodeSegment(t, plain, EncodingZstdColumns)
			frames := map[int]*ColumnFrame{}
			open := func(off int64) *ColumnFrame {
				i := st.FrameAt(off)
				if frames[i] == nil {
					fr := st.Frames[i]
					f, err := OpenColumnFrame(st, i, obj[fr.EncStart:fr.EncStart+fr.EncSize])
					if err != nil {
						t.Fatalf("seed %d, %d-byte frames: frame %d: %v", seed, fb, i, err)
					}
					frames[i] = f
				}
				return frames[i]
			}
			hist := 0
			for _, e := range slices.Backward(entries) {
				f := open(e.off)
				for round := range 2 {
					c, written, err := f.Chunk(e.off)
					if err != nil || c.Encoding() != e.enc || !bytes.Equal(c.Bytes(), e.data) {
						t.Fatalf("seed %d, %d-byte frames: chunk at %d (%s): %v", seed, fb, e.off, e.enc, err)
					}
					want := len(e.data)
					if round > 0 || e.enc != chunkenc.EncXOR {
						want = 0
					}
					if written != want {
						t.Fatalf("seed %d, %d-byte frames: reading the chunk at %d (round %d) wrote %d bytes, want %d", seed, fb, e.off, round, written, want)
					}
				}
				if e.enc != chunkenc.EncXOR {
					hist++
				}
				if _, _, err := f.Chunk(e.off + 1); err == nil {
					t.Fatalf("a chunk at %d, one byte into an entry", e.off+1)
				}
			}
			if hist == 0 || len(frames) != len(st.Frames) {
				t.Fatalf("seed %d: %d histogram chunks, %d frames read of %d", seed, hist, len(frames), len(st.Frames))
			}
		}
	}
}

// TestColumnFrameReadsVersion1: a frame written before the column form
// stored its chunks' lengths is decoded whole and gives the same chunks.
func TestColumnFrameReadsVersion1(t *testing.T) {
	dir, _ := writeGPUBlock(t, 5)
	plain, err := os.ReadFile(filepath.Join(dir, "chunks", "000001"))
	if err != nil {
		t.Fatal(err)
	}
	var e columnsEncoder
	v1 := columnsVersion1(t, e.encode(nil, stripCRCs(t, plain), chunks.SegmentHeaderSize))
	enc := zstdEncoder.EncodeAll(v1, nil)
	l, err := crcLayout("chunks/000001", plain)
	if err != nil {
		t.Fatal(err)
	}
	st := &SeekTable{Frames: []Frame{{Start: 0, Size: int64(len(plain)), EncSize: int64(len(enc))}}, crc: l}
	f, err := OpenColumnFrame(st, 0, enc)
	if err != nil || f.plain == nil {
		t.Fatalf("version 1 frame: %v (decoded whole: %t)", err, f != nil && f.plain != nil)
	}
	for _, e := range segmentEntries(t, plain) {
		c, _, err := f.Chunk(e.off)
		if err != nil || c.Encoding() != e.enc || !bytes.Equal(c.Bytes(), e.data) {
			t.Fatalf("chunk at %d: %v", e.off, err)
		}
	}
}

// columnsVersion1 rewrites a column form as version 1 wrote it: items
// without their chunks' lengths.
func columnsVersion1(t testing.TB, form []byte) []byte {
	t.Helper()
	var d columnsDecoder
	version, size, err := d.split(form, math.MaxInt32)
	if err != nil || version != columnsVersion {
		t.Fatalf("version %d: %v", version, err)
	}
	var items []byte
	for in := d.streams[colItems]; len(in) > 0; {
		it, err := readItem(&in, version)
		if err != nil {
			t.Fatal(err)
		}
		if !it.chunk {
			items = binary.AppendUvarint(items, it.n<<1)
			continue
		}
		items = append(binary.AppendUvarint(items, it.n<<1|1), it.mode)
	}
	d.streams[colItems] = items
	out := binary.AppendUvarint([]byte{1}, uint64(size))
	for _, s := range d.streams {
		out = append(binary.AppendUvarint(out, uint64(len(s))), s...)
	}
	return out
}

// TestColumnFrameSharedByQueries: queries reading a frame's chunks at once
// (in different orders) each get the TSDB's chunks; run under the race
// detector (make test-race).
func TestColumnFrameSharedByQueries(t *testing.T) {
	dir, _ := writeGPUBlock(t, 2)
	plain, err := os.ReadFile(filepath.Join(dir, "chunks", "000001"))
	if err != nil {
		t.Fatal(err)
	}
	obj, _, st := encodeSegment(t, plain, EncodingZstdColumns)
	fr := st.Frames[len(st.Frames)/2]
	f, err := OpenColumnFrame(st, len(st.Frames)/2, obj[fr.EncStart:fr.EncStart+fr.EncSize])
	if err != nil {
		t.Fatal(err)
	}
	var mine []segmentEntry
	for _, e := range segmentEntries(t, plain) {
		if e.off >= fr.Start && e.off < fr.Start+fr.Size {
			mine = append(mine, e)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			for k := range mine {
				e := mine[(k*(g+1)+g)%len(mine)]
				c, _, err := f.Chunk(e.off)
				if err == nil && !bytes.Equal(c.Bytes(), e.data) {
					err = errColumns
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// FuzzColumnFrame: any column form opens, lays out and gives chunks or
// fails, without panicking; a form the whole-frame decoder accepts gives,
// chunk by chunk, what that decoder writes.
func FuzzColumnFrame(f *testing.F) {
	content := fuzzSegment(true)
	var e columnsEncoder
	f.Add(e.encode(nil, content, 8))
	f.Add(e.encode(nil, []byte{1, 2, 3}, 8))
	f.Fuzz(func(t *testing.T, form []byte) {
		const limit = 1 << 16
		var d columnsDecoder
		stripped, err := d.decode(nil, form, limit)
		var plain []byte
		if err == nil {
			l := crcEntries{start: chunks.SegmentHeaderSize, end: -1, align: 1, extra: chunks.ChunkEncodingSize}
			plain, err = walkCRCs(nil, stripped, l, 0, false, nil)
		}
		size := int64(limit)
		if err == nil {
			size = int64(len(plain))
		}
		cf, ferr := layOutColumns(0, size, form)
		if err != nil || len(plain) < chunks.SegmentHeaderSize {
			if cf != nil {
				for _, e := range cf.entries {
					_, _, _ = cf.Chunk(cf.start + int64(e.off)) // no panic is all a malformed form owes
				}
			}
			return
		}
		if ferr != nil {
			if form[0] == columnsVersion {
				t.Fatalf("the frame decodes whole but does not lay out: %v", ferr)
			}
			return
		}
		for _, e := range segmentEntries(t, plain) {
			c, _, err := cf.Chunk(e.off)
			if err != nil || c.Encoding() != e.enc || !bytes.Equal(c.Bytes(), e.data) {
				t.Fatalf("chunk at %d: %v", e.off, err)
			}
		}
	})
}

// TestSkipVarints: skipVarints finds where the n-th varint ends, for
// varints of every length at every alignment.
func TestSkipVarints(t *testing.T) {
	var b []byte
	var ends []int
	for i := range 300 {
		v := int64(i * i * i * 7919 % 1_000_003)
		if i%3 == 0 {
			v = int64(i % 5)
		}
		if i%17 == 0 {
			v = -1 << (i % 63)
		}
		b = binary.AppendVarint(b, v)
		ends = append(ends, len(b))
	}
	for start := range 20 {
		base := 0
		if start > 0 {
			base = ends[start-1]
		}
		for n := 0; start+n <= len(ends); n++ {
			want := 0
			if n > 0 {
				want = ends[start+n-1] - base
			}
			got, ok := skipVarints(b[base:], n)
			if !ok || got != want {
				t.Fatalf("from varint %d, %d varints: %d bytes (%t), want %d", start, n, got, ok, want)
			}
		}
		if _, ok := skipVarints(b[base:], len(ends)-start+1); ok {
			t.Fatalf("from varint %d: skipped past the end", start)
		}
	}
}

// BenchmarkOpenColumnFrame: what a cold read pays to open a frame (zstd,
// then laying out its entries) and to write one chunk of it again, on a
// real segment's frames (BENCH_SEGMENT, as BenchmarkDecodeFrame).
func BenchmarkOpenColumnFrame(b *testing.B) {
	var plain []byte
	if p := os.Getenv("BENCH_SEGMENT"); p != "" {
		var err error
		if plain, err = os.ReadFile(p); err != nil {
			b.Fatal(err)
		}
	} else {
		dir, _ := writeGPUBlock(b, 1)
		var err error
		if plain, err = os.ReadFile(filepath.Join(dir, "chunks", "000001")); err != nil {
			b.Fatal(err)
		}
	}
	obj, _, st := encodeSegment(b, plain, EncodingZstdColumns)
	b.SetBytes(int64(len(plain)))
	for b.Loop() {
		for k, fr := range st.Frames {
			f, err := OpenColumnFrame(st, k, obj[fr.EncStart:fr.EncStart+fr.EncSize])
			if err != nil {
				b.Fatal(err)
			}
			if _, _, err := f.Chunk(f.start + int64(f.entries[len(f.entries)/2].off)); err != nil {
				b.Fatal(err)
			}
		}
	}
}
