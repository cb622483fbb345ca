package block

import (
	"bytes"
	"context"
	"encoding/binary"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/value"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/thanos-io/objstore/providers/filesystem"
)

// writeGPUBlock cuts a TSDB block of 6 h of gpusim-like series into a new
// directory: counters of decimals, gauges of integers and of a few
// decimals, floats of full precision, NaNs and stale markers, values no
// decimal holds (infinities, -0, 2^60), scrapes at random offsets and
// jittered steps, series of one sample and series of 1 s steps (chunks of
// more than 120 samples), and a native histogram series (chunks that are
// not XOR). It returns the block's directory and meta.
func writeGPUBlock(t testing.TB, seed uint64) (string, Meta) {
	t.Helper()
	parent := t.TempDir()
	const span = 6 * time.Hour
	w, err := tsdb.NewBlockWriter(slog.New(slog.DiscardHandler), parent, int64(span/time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, 1))
	app := w.Appender(context.Background())
	base := int64(1_796_627_100_000) + rng.Int64N(15_000)
	add := func(ls labels.Labels, step int64, jitter int64, v func(i int) float64) {
		at := base + rng.Int64N(step)
		for i := 0; at < base+int64(span/time.Millisecond)-step; i++ {
			if _, err := app.Append(0, ls, at, v(i)); err != nil {
				t.Fatal(err)
			}
			at += step
			if jitter > 0 {
				at += rng.Int64N(2*jitter+1) - jitter
			}
		}
	}
	for gpu := range 4 {
		g := strconv.Itoa(gpu)
		cpu := 0.0
		add(labels.FromStrings("__name__", "node_cpu_seconds_total", "cpu", g, "mode", "idle"), 15_000, 40, func(int) float64 {
			cpu += float64(rng.IntN(1500)) / 100
			return math.Round(cpu*100) / 100
		})
		add(labels.FromStrings("__name__", "DCGM_FI_DEV_GPU_UTIL", "gpu", g), 15_000, 0, func(int) float64 { return float64(rng.IntN(101)) })
		add(labels.FromStrings("__name__", "DCGM_FI_DEV_POWER_USAGE", "gpu", g), 15_000, 5, func(int) float64 { return float64(20000+rng.IntN(50000)) / 1000 })
		add(labels.FromStrings("__name__", "node_load1", "gpu", g), 15_000, 0, func(int) float64 { return rng.Float64() * 64 })
		add(labels.FromStrings("__name__", "DCGM_FI_DEV_GPU_TEMP", "gpu", g), 1_000, 0, func(i int) float64 { return float64(40 + i/500%9) })
		add(labels.FromStrings("__name__", "gpu_job_info", "gpu", g), 15_000, 0, func(i int) float64 {
			switch i % 97 {
			case 0:
				return math.Float64frombits(value.StaleNaN)
			case 1:
				return math.NaN()
			case 2:
				return math.Inf(1)
			case 3:
				return math.Copysign(0, -1)
			case 4:
				return 1 << 60
			}
			return 1
		})
	}
	for i := range 20 { // series of one sample
		ls := labels.FromStrings("__name__", "DCGM_FI_DEV_XID_ERRORS", "xid", strconv.Itoa(i))
		if _, err := app.Append(0, ls, base+rng.Int64N(int64(span/time.Millisecond)), float64(i)*0.5); err != nil {
			t.Fatal(err)
		}
	}
	h := labels.FromStrings("__name__", "request_duration_seconds")
	for i := range 200 {
		hist := &histogram.Histogram{Count: uint64(10 + i), Sum: float64(i) * 1.5, Schema: 0, ZeroThreshold: 1e-128,
			PositiveSpans: []histogram.Span{{Offset: 0, Length: 2}}, PositiveBuckets: []int64{int64(5 + i/2), int64(i % 2)}}
		hist.Count = uint64(hist.PositiveBuckets[0]*2 + hist.PositiveBuckets[1])
		if _, err := app.AppendHistogram(0, h, base+int64(i)*60_000, hist, nil); err != nil {
			t.Fatal(err)
		}
	}
	return flushLocalBlock(t, w, app, parent, "t")
}

// columnItems counts the chunks a column form holds as columns and the
// runs it keeps verbatim.
func columnItems(t testing.TB, form []byte) (chunks, runs int) {
	t.Helper()
	var d columnsDecoder
	version, _, err := d.split(form, math.MaxInt32)
	if err != nil {
		t.Fatal(err)
	}
	for items := d.streams[colItems]; len(items) > 0; {
		it, err := readItem(&items, version)
		if err != nil {
			t.Fatal(err)
		}
		if it.chunk {
			chunks++
		} else {
			runs++
		}
	}
	return chunks, runs
}

// TestColumnsRoundTripRealBlocks: a TSDB block's chunk segment stored
// zstd-columns decodes to the TSDB's file byte for byte, whole and in
// frames of 1 MiB and of 4 KiB (many frames, each beginning at an entry);
// every XOR chunk is in column form (the histograms' chunks are kept
// verbatim), and the segment takes fewer bytes than zstd-nocrc.
func TestColumnsRoundTripRealBlocks(t *testing.T) {
	defer func(n, c int64) { FrameBytes, ColumnsFrameBytes = n, c }(FrameBytes, ColumnsFrameBytes)
	for seed := range uint64(3) {
		dir, _ := writeGPUBlock(t, seed)
		plain, err := os.ReadFile(filepath.Join(dir, "chunks", "000001"))
		if err != nil {
			t.Fatal(err)
		}
		for _, fb := range []int64{1 << 20, 4 << 10} {
			FrameBytes, ColumnsFrameBytes = fb, fb
			stored := map[string]int{}
			for _, enc := range []string{EncodingZstdNoCRC, EncodingZstdColumns} {
				obj, frames, err := encodeFrames("chunks/000001", plain, enc)
				if err != nil {
					t.Fatalf("seed %d, %s: %v", seed, enc, err)
				}
				f := File{RelPath: "chunks/000001", SizeBytes: int64(len(plain)), Encoding: enc, StoredBytes: int64(len(obj)), Frames: frames}
				if back, err := Decode(f, obj); err != nil || !bytes.Equal(back, plain) {
					t.Fatalf("seed %d, %s in %d-byte frames: does not decode to the TSDB's file (%v)", seed, enc, fb, err)
				}
				stored[enc] = len(obj)
			}
			t.Logf("seed %d, %d-byte frames: %d bytes plain, zstd-nocrc %d, zstd-columns %d", seed, fb, len(plain), stored[EncodingZstdNoCRC], stored[EncodingZstdColumns])
			if stored[EncodingZstdColumns] >= stored[EncodingZstdNoCRC] {
				t.Errorf("seed %d: zstd-columns takes %d bytes, zstd-nocrc %d", seed, stored[EncodingZstdColumns], stored[EncodingZstdNoCRC])
			}
		}
		// One frame of the whole segment: its XOR chunks in columns.
		var e columnsEncoder
		form := e.encode(nil, stripCRCs(t, plain), chunks.SegmentHeaderSize)
		cs, runs := columnItems(t, form)
		xor, other := countChunks(t, dir)
		if cs != xor || runs == 0 || runs > other+1 {
			t.Errorf("seed %d: %d chunks in columns and %d runs verbatim; the block has %d XOR chunks and %d others", seed, cs, runs, xor, other)
		}
	}
}

func stripCRCs(t testing.TB, plain []byte) []byte {
	t.Helper()
	l, err := crcLayout("chunks/000001", plain)
	if err != nil {
		t.Fatal(err)
	}
	content, err := walkCRCs(nil, plain, l, 0, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	return content
}

// countChunks counts the block's XOR chunks and its other chunks.
func countChunks(t testing.TB, dir string) (xor, other int) {
	t.Helper()
	b, err := tsdb.OpenBlock(nil, dir, chunkenc.NewPool(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ir, _ := b.Index()
	defer ir.Close()
	cr, _ := b.Chunks()
	defer cr.Close()
	p, err := ir.Postings(context.Background(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	var sb labels.ScratchBuilder
	var metas []chunks.Meta
	for p.Next() {
		if err := ir.Series(p.At(), &sb, &metas); err != nil {
			t.Fatal(err)
		}
		for _, m := range metas {
			c, _, err := cr.ChunkOrIterable(m)
			if err != nil {
				t.Fatal(err)
			}
			if c.Encoding() == chunkenc.EncXOR {
				xor++
			} else {
				other++
			}
		}
	}
	return xor, other
}

// TestColumnFramesDecodeAlone: each frame of a zstd-columns segment
// (frames of 2 KiB) decodes on its own to its bytes of the TSDB's file,
// appended after what a reused buffer holds, and so do runs of frames.
func TestColumnFramesDecodeAlone(t *testing.T) {
	defer func(n int64) { ColumnsFrameBytes = n }(ColumnsFrameBytes)
	ColumnsFrameBytes = 2 << 10
	dir, _ := writeGPUBlock(t, 7)
	plain, err := os.ReadFile(filepath.Join(dir, "chunks", "000001"))
	if err != nil {
		t.Fatal(err)
	}
	obj, f, st := encodeSegment(t, plain, EncodingZstdColumns)
	if len(st.Frames) < len(plain)/4096 {
		t.Fatalf("%d frames for %d bytes", len(st.Frames), len(plain))
	}
	for k, fr := range st.Frames {
		got, err := AppendFrames([]byte("held"), f, st, k, k, obj[fr.EncStart:fr.EncStart+fr.EncSize])
		if err != nil || string(got[:4]) != "held" || !bytes.Equal(got[4:], plain[fr.Start:fr.Start+fr.Size]) {
			t.Fatalf("frame %d [%d,+%d): %v", k, fr.Start, fr.Size, err)
		}
		if k+3 < len(st.Frames) {
			l := st.Frames[k+3]
			got, err := DecodeFrames(f, st, k, k+3, obj[fr.EncStart:l.EncStart+l.EncSize])
			if err != nil || !bytes.Equal(got, plain[fr.Start:l.Start+l.Size]) {
				t.Fatalf("frames %d-%d: %v", k, k+3, err)
			}
		}
	}
}

// TestColumnsKeepWhatTheyCannotRewrite: entries that are not XOR chunks
// the appender writes alike (another encoding, an XOR chunk with stray
// padding bits, one of no samples, one too short for its sample count
// (the TSDB's iterator panics on it), a length written in more bytes than
// needed) and bytes that are no whole entry are kept verbatim, and the
// frame decodes to itself.
func TestColumnsKeepWhatTheyCannotRewrite(t *testing.T) {
	xc := chunkenc.NewXORChunk()
	app, _ := xc.Appender()
	for i := range 10 {
		app.Append(0, int64(i)*15_000, float64(i)*1.25)
	}
	good := append([]byte(nil), xc.Bytes()...)
	entry := func(enc chunkenc.Encoding, data []byte) []byte {
		return append(append(binary.AppendUvarint(nil, uint64(len(data))), byte(enc)), data...)
	}
	stray := append([]byte(nil), good...)
	stray[len(stray)-1] |= 1 // a padding bit the appender leaves 0
	padded := append([]byte{byte(len(good)) | 0x80, 0, byte(chunkenc.EncXOR)}, good...)
	var content []byte
	content = append(content, "\x01\x30\xbc\x91\x01\x00\x00\x00"...) // a segment header
	content = append(content, entry(chunkenc.EncXOR, good)...)
	content = append(content, entry(chunkenc.EncHistogram, []byte{0, 1, 2, 3})...)
	content = append(content, entry(chunkenc.EncXOR, stray)...)
	content = append(content, entry(chunkenc.EncXOR, []byte{0, 0})...)
	content = append(content, entry(chunkenc.EncXOR, []byte{0})...)
	content = append(content, padded...)
	content = append(content, entry(chunkenc.EncXOR, good)...)
	content = append(content, 0x7f, 1, 2) // an entry cut short
	var e columnsEncoder
	form := e.encode(nil, content, 8)
	if cs, runs := columnItems(t, form); cs != 2 || runs != 3 {
		t.Errorf("%d chunks in columns, %d runs verbatim: want 2 and 3 (header, then the four unrewritable entries, then the cut one)", cs, runs)
	}
	var d columnsDecoder
	back, err := d.decode(nil, form, len(content))
	if err != nil || !bytes.Equal(back, content) {
		t.Fatalf("decodes to %x (%v), want %x", back, err, content)
	}
	if _, err := d.decode(nil, form, len(content)-1); err == nil {
		t.Error("decoded past its limit")
	}
}

// TestCorruptColumnsFailNotPanic: a column form cut short anywhere fails to
// decode, and one with any byte changed fails or decodes to something,
// without panicking; through AppendFrames the error names the file.
func TestCorruptColumnsFailNotPanic(t *testing.T) {
	dir, _ := writeGPUBlock(t, 3)
	plain, err := os.ReadFile(filepath.Join(dir, "chunks", "000001"))
	if err != nil {
		t.Fatal(err)
	}
	content := stripCRCs(t, plain)[:800]
	var e columnsEncoder
	form := e.encode(nil, content, chunks.SegmentHeaderSize)
	var d columnsDecoder
	for n := range len(form) {
		if _, err := d.decode(nil, form[:n], len(content)); err == nil {
			t.Fatalf("cut to %d of %d bytes: decoded", n, len(form))
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	bad := append([]byte(nil), form...)
	for i := range bad {
		x := byte(1 + rng.IntN(255))
		bad[i] ^= x
		_, _ = d.decode(nil, bad, len(content))
		bad[i] ^= x
	}

	// A frame whose column form is cut short, in a well-formed zstd frame
	// (zstd's checksum guards the form in the bucket: this is a form the
	// encoder got wrong, which uploading checks it does not).
	obj, f, st := encodeSegment(t, plain, EncodingZstdColumns)
	fr := st.Frames[0]
	form, err = zstdDecoder.DecodeAll(obj[:fr.EncSize], nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := AppendFrames(nil, f, st, 0, 0, zstdEncoder.EncodeAll(form[:len(form)-1], nil)); err == nil {
		t.Error("a wrong column form decoded")
	} else if !bytes.Contains([]byte(err.Error()), []byte("chunks/000001")) {
		t.Errorf("error %q does not name the file", err)
	}
}

// TestColumnsUploadFallsBack: asked of a block, zstd-columns stores the
// index zstd-nocrc and the segment zstd-columns, and DownloadFile gives
// the TSDB's files back; a segment whose CRCs are wrong is stored zstd.
func TestColumnsUploadFallsBack(t *testing.T) {
	dir, meta := writeGPUBlock(t, 5)
	bkt, err := filesystem.NewBucket(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := UploadEncoded(ctx, bkt, dir, &meta, Uniform(EncodingZstdColumns)); err != nil {
		t.Fatal(err)
	}
	for _, f := range meta.GPUStore.Files {
		want := EncodingZstdColumns
		if f.RelPath == IndexFilename {
			want = EncodingZstdNoCRC
		}
		if f.Encoding != want {
			t.Errorf("%s stored %q, want %q", f.RelPath, f.Encoding, want)
		}
		plain, _ := os.ReadFile(filepath.Join(dir, filepath.FromSlash(f.RelPath)))
		dst := filepath.Join(t.TempDir(), "out")
		if err := DownloadFile(ctx, bkt, ObjectName("t", meta.ULID, f.ObjectRel()), dst, f, os.ErrInvalid); err != nil {
			t.Fatal(err)
		}
		if back, _ := os.ReadFile(dst); !bytes.Equal(back, plain) {
			t.Errorf("%s does not download as the TSDB wrote it", f.RelPath)
		}
	}
	seg := filepath.Join(dir, "chunks", "000001")
	b, _ := os.ReadFile(seg)
	b[len(b)-1] ^= 0xff // the last chunk's CRC
	if err := os.WriteFile(seg, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := UploadEncoded(ctx, bkt, dir, &meta, Uniform(EncodingZstdColumns)); err != nil {
		t.Fatal(err)
	}
	if f, _ := meta.File("chunks/000001"); f.Encoding != EncodingZstd {
		t.Errorf("segment with a wrong CRC stored %q, want zstd", f.Encoding)
	}
}

// FuzzColumnsDecode: decoding any bytes as a column form fails or gives at
// most the limit's bytes, without panicking; what it gives encodes to a
// column form that decodes back to it.
func FuzzColumnsDecode(f *testing.F) {
	content := fuzzSegment(false)
	var e columnsEncoder
	f.Add(e.encode(nil, content, 8))
	f.Add(e.encode(nil, content[8:], 0))
	f.Add(e.encode(nil, []byte{1, 2, 3}, 0))
	f.Add([]byte{columnsVersion, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, form []byte) {
		const limit = 1 << 16
		var d columnsDecoder
		out, err := d.decode(nil, form, limit)
		if err != nil {
			return
		}
		if len(out) > limit {
			t.Fatalf("%d bytes decoded, limit %d", len(out), limit)
		}
		var e columnsEncoder
		again, err := d.decode(nil, e.encode(nil, out, 0), limit)
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("%x: re-encoded, decodes to %x (%v)", out, again, err)
		}
	})
}

// fuzzSegment is the fuzz targets' seed: a segment's header and three XOR
// chunks of 130 samples, a histogram chunk's entry after the second with
// other.
func fuzzSegment(other bool) []byte {
	xc := chunkenc.NewXORChunk()
	app, _ := xc.Appender()
	for i := range 130 {
		app.Append(0, 1_796_627_100_000+int64(i)*15_000+int64(i%3), float64(i%11)*0.25)
	}
	var content []byte
	content = append(content, "\x01\x30\xbc\x91\x01\x00\x00\x00"...)
	for k := range 3 {
		content = append(append(binary.AppendUvarint(content, uint64(len(xc.Bytes()))), byte(chunkenc.EncXOR)), xc.Bytes()...)
		if k == 1 && other {
			content = append(content, 4, byte(chunkenc.EncHistogram), 0, 1, 2, 3)
		}
	}
	return content
}

// BenchmarkDecodeFrame: the CPU a cold query pays to decode one 1 MiB
// frame of a chunk segment, zstd-nocrc against zstd-columns (ns per
// sample and MB/s of the TSDB's file). BENCH_SEGMENT names a real segment
// (e.g. a cluster-day bucket's); by default a writeGPUBlock block's.
func BenchmarkDecodeFrame(b *testing.B) {
	var plain []byte
	samples := 0
	if p := os.Getenv("BENCH_SEGMENT"); p != "" {
		var err error
		if plain, err = os.ReadFile(p); err != nil {
			b.Fatal(err)
		}
		samples = countSegmentSamples(b, plain)
	} else {
		dir, meta := writeGPUBlock(b, 1)
		var err error
		if plain, err = os.ReadFile(filepath.Join(dir, "chunks", "000001")); err != nil {
			b.Fatal(err)
		}
		samples = int(meta.Stats.NumSamples)
	}
	for _, enc := range []string{EncodingZstdNoCRC, EncodingZstdColumns} {
		obj, f, st := encodeSegment(b, plain, enc)
		b.Run(enc, func(b *testing.B) {
			var buf []byte
			var err error
			b.SetBytes(int64(len(plain)))
			for b.Loop() {
				for k, fr := range st.Frames {
					if buf, err = AppendFrames(buf[:0], f, st, k, k, obj[fr.EncStart:fr.EncStart+fr.EncSize]); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(samples), "ns/sample")
			b.ReportMetric(float64(len(obj))/float64(samples), "stored-B/sample")
		})
	}
}

// countSegmentSamples counts the samples of a segment's XOR chunks.
func countSegmentSamples(t testing.TB, plain []byte) int {
	n := 0
	content := stripCRCs(t, plain)
	for p := chunks.SegmentHeaderSize; p < len(content); {
		l, w := binary.Uvarint(content[p:])
		if chunkenc.Encoding(content[p+w]) == chunkenc.EncXOR {
			n += int(binary.BigEndian.Uint16(content[p+w+1:]))
		}
		p += w + 1 + int(l)
	}
	return n
}

// TestAppendXORWritesWhatTheAppenderWrites: appendXOR gives the bytes of
// chunkenc's XOR appender for samples of every timestamp delta-of-delta
// size (0, 14, 17, 20 and 64 bits, at their edges) and every kind of value
// XOR (equal, within the previous leading and trailing zeros, not, 64
// significant bits), from one sample to 240.
func TestAppendXORWritesWhatTheAppenderWrites(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 5))
	steps := []int64{0, 1, -1, 8191, 8192, -8191, -8192, 65535, 65536, -65535, 524288, 524289, -524288, 1 << 40, -(1 << 40)}
	vals := []float64{0, 1, -1, 0.5, 1e300, math.Inf(-1), math.NaN(), math.Float64frombits(value.StaleNaN), math.Copysign(0, -1), 12345.678}
	for n := 1; n <= 240; n++ {
		ts, vs := make([]int64, n), make([]float64, n)
		step := int64(15_000)
		for i := range ts {
			if i > 0 {
				step += steps[rng.IntN(len(steps))]
				ts[i] = ts[i-1] + step
			} else {
				ts[i] = rng.Int64() >> rng.IntN(64)
			}
			switch rng.IntN(3) {
			case 0:
				vs[i] = vals[rng.IntN(len(vals))]
			case 1:
				vs[i] = rng.NormFloat64() * math.Pow10(rng.IntN(20)-10)
			default:
				if i > 0 {
					vs[i] = vs[i-1]
				}
			}
		}
		c := chunkenc.NewXORChunk()
		app, _ := c.Appender()
		for i := range ts {
			app.Append(0, ts[i], vs[i])
		}
		if got := appendXOR([]byte("x"), ts, vs); string(got[1:]) != string(c.Bytes()) || got[0] != 'x' {
			t.Fatalf("%d samples: appendXOR writes %x, the appender %x", n, got[1:], c.Bytes())
		}
	}
}

// encodeSegment encodes the chunk segment plain in enc and returns the
// object, its file entry and its seek table.
func encodeSegment(t testing.TB, plain []byte, enc string) ([]byte, File, *SeekTable) {
	t.Helper()
	obj, frames, err := encodeFrames("chunks/000001", plain, enc)
	if err != nil {
		t.Fatal(err)
	}
	f := File{RelPath: "chunks/000001", SizeBytes: int64(len(plain)), Encoding: enc, StoredBytes: int64(len(obj)), Frames: frames}
	st, err := ParseSeekTable(f, obj[len(obj)-int(SeekTableLen(f)):])
	if err != nil {
		t.Fatal(err)
	}
	return obj, f, st
}

// TestColumnFramesArePageSized: by default a zstd-columns segment is cut in
// frames of about ColumnsFrameBytes, a bucket store page, not in the 1 MiB
// frames of zstd-nocrc: a query of one metric reads a page of every GPU's
// stretch of a segment, and each frame it touches is decoded whole.
func TestColumnFramesArePageSized(t *testing.T) {
	dir, _ := writeGPUBlock(t, 3)
	plain, err := os.ReadFile(filepath.Join(dir, "chunks", "000001"))
	if err != nil {
		t.Fatal(err)
	}
	if len(plain) < 4*int(ColumnsFrameBytes) || len(plain) > int(FrameBytes) {
		t.Fatalf("segment of %d bytes: frame sizes cannot be told apart", len(plain))
	}
	if _, f, _ := encodeSegment(t, plain, EncodingZstdNoCRC); f.Frames != 1 {
		t.Fatalf("zstd-nocrc: %d frames for %d bytes, want 1", f.Frames, len(plain))
	}
	_, f, st := encodeSegment(t, plain, EncodingZstdColumns)
	for i, fr := range st.Frames[:len(st.Frames)-1] {
		if fr.Size > ColumnsFrameBytes*9/8 || fr.Size < ColumnsFrameBytes/2 { // sizes count the CRCs (4 bytes an entry)
			t.Fatalf("zstd-columns: frame %d of %d holds %d bytes of the segment, want about %d", i, f.Frames, fr.Size, ColumnsFrameBytes)
		}
	}
}
