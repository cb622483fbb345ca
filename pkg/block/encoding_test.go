package block

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/tsdb/index"
	"github.com/thanos-io/objstore/providers/filesystem"
)

// TestEncodedUploadDownloadsAlike: a block uploaded zstd-encoded has its
// files as <rel>.zst objects (no plain object an older reader could
// misread), meta.json records each file's encoding, decoded and stored
// size, and DownloadFile gives back the TSDB's bytes exactly; a torn or
// missing encoded object is the block's fault (the compactor marks it), not
// a retryable bucket error.
func TestEncodedUploadDownloadsAlike(t *testing.T) {
	dir, meta := writeLocalBlock(t, "t")
	stored := map[string]int64{}
	for _, enc := range []string{EncodingZstd, EncodingZstdNoCRC} {
		t.Run(enc, func(t *testing.T) { stored[enc] = encodedUploadDownloadsAlike(t, dir, meta, enc) })
	}
	// Each of the block's 8 series and 8 chunks keeps 4 bytes of CRC32
	// that zstd cannot shrink.
	if saved := stored[EncodingZstd] - stored[EncodingZstdNoCRC]; saved < 16*4-8 {
		t.Errorf("zstd-nocrc stores %d bytes, zstd %d: want the CRCs' 64 bytes fewer", stored[EncodingZstdNoCRC], stored[EncodingZstd])
	}
}

func encodedUploadDownloadsAlike(t *testing.T, dir string, meta Meta, encoding string) (stored int64) {
	ctx := context.Background()
	bkt, err := filesystem.NewBucket(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := UploadEncoded(ctx, bkt, dir, &meta, Uniform(encoding)); err != nil {
		t.Fatal(err)
	}
	got, err := ReadMeta(ctx, bkt, "t", meta.ULID)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.GPUStore.Files) != 2 {
		t.Fatalf("files %+v, want a chunk segment and the index", got.GPUStore.Files)
	}
	bad := errors.New("unreadable")
	for _, f := range got.GPUStore.Files {
		plain, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(f.RelPath)))
		if err != nil {
			t.Fatal(err)
		}
		stored += f.StoredBytes
		if f.Encoding != encoding || f.SizeBytes != int64(len(plain)) || f.StoredBytes <= 0 || f.StoredBytes >= f.SizeBytes {
			t.Errorf("%s recorded as %+v, want %s, %d bytes decoded, fewer stored", f.RelPath, f, encoding, len(plain))
		}
		if ok, _ := bkt.Exists(ctx, ObjectName("t", meta.ULID, f.RelPath)); ok {
			t.Errorf("plain object %s uploaded beside the encoded one", f.RelPath)
		}
		name := ObjectName("t", meta.ULID, f.ObjectRel())
		dst := filepath.Join(t.TempDir(), "out")
		if err := DownloadFile(ctx, bkt, name, dst, f, bad); err != nil {
			t.Fatal(err)
		}
		if back, _ := os.ReadFile(dst); !bytes.Equal(back, plain) {
			t.Errorf("%s decodes to %d bytes unlike the %d the TSDB wrote", f.RelPath, len(back), len(plain))
		}

		// Torn: the object cut short.
		rc, err := bkt.Get(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		obj := new(bytes.Buffer)
		_, _ = obj.ReadFrom(rc)
		rc.Close()
		if err := bkt.Upload(ctx, name, bytes.NewReader(obj.Bytes()[:obj.Len()/2])); err != nil {
			t.Fatal(err)
		}
		if err := DownloadFile(ctx, bkt, name, dst, f, bad); !errors.Is(err, bad) {
			t.Errorf("%s torn: %v, want the block's fault", f.RelPath, err)
		}
		// Missing.
		if err := bkt.Delete(ctx, name); err != nil {
			t.Fatal(err)
		}
		if err := DownloadFile(ctx, bkt, name, dst, f, bad); !errors.Is(err, bad) || !strings.Contains(err.Error(), "missing") {
			t.Errorf("%s missing: %v, want the block's fault", f.RelPath, err)
		}
	}
	if _, err := ParseEncoding("gzip"); err == nil {
		t.Error("encoding gzip accepted")
	}
	return stored
}

// A file that is not laid out as the TSDB writes it (here a chunk segment
// with one CRC wrong) is not stripped: zstd-nocrc stores it as zstd, and it
// decodes to itself.
func TestUnexpectedLayoutKeepsItsCRCs(t *testing.T) {
	dir, meta := writeLocalBlock(t, "t")
	seg := filepath.Join(dir, "chunks", "000001")
	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-1] ^= 0xff // the last chunk's CRC
	if err := os.WriteFile(seg, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := encodeFrames("chunks/000001", b, EncodingZstdNoCRC); err == nil {
		t.Fatal("a segment with a wrong CRC stripped")
	}
	bkt, err := filesystem.NewBucket(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := UploadEncoded(context.Background(), bkt, dir, &meta, Uniform(EncodingZstdNoCRC)); err != nil {
		t.Fatal(err)
	}
	f, _ := meta.File("chunks/000001")
	if f.Encoding != EncodingZstd {
		t.Fatalf("segment stored %q, want zstd", f.Encoding)
	}
	dst := filepath.Join(t.TempDir(), "seg")
	if err := DownloadFile(context.Background(), bkt, ObjectName("t", meta.ULID, f.ObjectRel()), dst, f, errors.New("bad")); err != nil {
		t.Fatal(err)
	}
	if back, _ := os.ReadFile(dst); !bytes.Equal(back, b) {
		t.Fatal("segment does not decode to itself")
	}
}

// With frames far smaller than the files (100 bytes: entries straddle
// every cut), each frame of the index and of the chunk segment decodes on
// its own to its bytes of the TSDB's file, with and without the CRCs, and
// the seek table finds the frame of every offset.
func TestEveryFrameDecodesAlone(t *testing.T) {
	defer func(n, c, i, s, p int64) {
		FrameBytes, ColumnsFrameBytes, IndexFrameBytes, SeriesFrameBytes, PostingsFrameBytes = n, c, i, s, p
	}(FrameBytes, ColumnsFrameBytes, IndexFrameBytes, SeriesFrameBytes, PostingsFrameBytes)
	FrameBytes, ColumnsFrameBytes, IndexFrameBytes, SeriesFrameBytes, PostingsFrameBytes = 100, 100, 100, 100, 100
	dir, _ := writeLocalBlock(t, "t")
	for _, rel := range []string{IndexFilename, "chunks/000001"} {
		plain, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(rel)))
		if err != nil {
			t.Fatal(err)
		}
		for _, enc := range []string{EncodingZstd, EncodingZstdNoCRC} {
			obj, frames, err := encodeFrames(rel, plain, enc)
			if err != nil {
				t.Fatalf("%s %s: %v", rel, enc, err)
			}
			f := File{RelPath: rel, SizeBytes: int64(len(plain)), Encoding: enc, StoredBytes: int64(len(obj)), Frames: frames}
			if frames < len(plain)/200 {
				t.Fatalf("%s %s: %d frames for %d bytes", rel, enc, frames, len(plain))
			}
			st, err := ParseSeekTable(f, obj[len(obj)-int(SeekTableLen(f)):])
			if err != nil {
				t.Fatal(err)
			}
			for k, fr := range st.Frames {
				got, err := DecodeFrames(f, st, k, k, obj[fr.EncStart:fr.EncStart+fr.EncSize])
				if err != nil || !bytes.Equal(got, plain[fr.Start:fr.Start+fr.Size]) {
					t.Fatalf("%s %s frame %d [%d,+%d): %v", rel, enc, k, fr.Start, fr.Size, err)
				}
				// Appended after what a reused buffer holds.
				got, err = AppendFrames([]byte("held"), f, st, k, k, obj[fr.EncStart:fr.EncStart+fr.EncSize])
				if err != nil || string(got[:4]) != "held" || !bytes.Equal(got[4:], plain[fr.Start:fr.Start+fr.Size]) {
					t.Fatalf("%s %s frame %d appended: %v", rel, enc, k, err)
				}
				if st.FrameAt(fr.Start) != k || st.FrameAt(fr.Start+fr.Size-1) != k {
					t.Fatalf("%s %s: FrameAt does not find frame %d", rel, enc, k)
				}
			}
			if back, err := Decode(f, obj); err != nil || !bytes.Equal(back, plain) {
				t.Fatalf("%s %s whole: %v", rel, enc, err)
			}
		}
	}
}

// An index's frames end where its sections do (the series section in
// frames of about SeriesFrameBytes, each ending after a series entry:
// TestEveryFrameDecodesAlone), so a
// query decodes only the sections it reads; a frame of another section
// holds no CRCs to put back.
func TestIndexFramesEndAtSections(t *testing.T) {
	defer func(s int64) { SeriesFrameBytes = s }(SeriesFrameBytes)
	SeriesFrameBytes = 200
	dir, _ := writeLocalBlock(t, "t")
	plain, err := os.ReadFile(filepath.Join(dir, IndexFilename))
	if err != nil {
		t.Fatal(err)
	}
	obj, frames, err := encodeFrames(IndexFilename, plain, EncodingZstdNoCRC)
	if err != nil {
		t.Fatal(err)
	}
	f := File{RelPath: IndexFilename, SizeBytes: int64(len(plain)), Encoding: EncodingZstdNoCRC, StoredBytes: int64(len(obj)), Frames: frames}
	st, err := ParseSeekTable(f, obj[len(obj)-int(SeekTableLen(f)):])
	if err != nil {
		t.Fatal(err)
	}
	starts := map[int64]bool{}
	for _, fr := range st.Frames {
		starts[fr.Start] = true
	}
	toc, err := index.NewTOCFromByteSlice(realByteSlice(plain[len(plain)-indexTOCLen:]))
	if err != nil {
		t.Fatal(err)
	}
	for name, off := range map[string]uint64{"series": toc.Series, "postings": toc.Postings, "label indices table": toc.LabelIndicesTable, "postings offset table": toc.PostingsTable} {
		if !starts[int64(off)] {
			t.Errorf("no frame starts at the %s section (%d): frames %+v", name, off, st.Frames)
		}
	}
	series := 0
	for _, fr := range st.Frames {
		if fr.Start >= int64(toc.Series) && fr.Start < int64(toc.LabelIndices) {
			series++
		}
		if !st.crc.holds(fr.Start, fr.Size) != (fr.Start >= int64(toc.LabelIndices) || fr.Start+fr.Size <= int64(toc.Series)) {
			t.Errorf("frame %+v: holds CRCs %v", fr, st.crc.holds(fr.Start, fr.Size))
		}
	}
	if want := (int(toc.LabelIndices-toc.Series) + 199) / 200; series < want/2 || series > want+1 {
		t.Errorf("%d frames in a series section of %d bytes, want about %d", series, toc.LabelIndices-toc.Series, want)
	}
}

type realByteSlice []byte

func (b realByteSlice) Len() int                    { return len(b) }
func (b realByteSlice) Range(start, end int) []byte { return b[start:end] }

// TestLargeFilesStoredPlain: a file above MaxEncodedFileBytes (encoding
// holds it and its encoded form in memory several times over: a 14 d raw
// block's index or a full 512 MiB chunk segment) is stored plain, read
// a page at a time, while the block's smaller files are encoded; the block
// downloads back byte for byte.
func TestLargeFilesStoredPlain(t *testing.T) {
	dir, meta := writeLocalBlock(t, "t")
	files, err := LocalFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2 || files[0].SizeBytes == files[1].SizeBytes {
		t.Fatalf("want two files of different sizes: %+v", files)
	}
	defer func(v int64) { MaxEncodedFileBytes = v }(MaxEncodedFileBytes)
	MaxEncodedFileBytes = min(files[0].SizeBytes, files[1].SizeBytes) // the larger file is stored plain
	ctx := context.Background()
	bkt, err := filesystem.NewBucket(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := UploadEncoded(ctx, bkt, dir, &meta, Uniform(EncodingZstdNoCRC)); err != nil {
		t.Fatal(err)
	}
	got, err := ReadMeta(ctx, bkt, "t", meta.ULID)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range got.GPUStore.Files {
		want := EncodingZstdNoCRC
		if f.SizeBytes > MaxEncodedFileBytes {
			want = EncodingNone
		}
		if f.Encoding != want {
			t.Errorf("%s (%d bytes, cap %d) stored %q, want %q", f.RelPath, f.SizeBytes, MaxEncodedFileBytes, f.Encoding, want)
		}
	}
	out := filepath.Join(t.TempDir(), "b")
	if err := Download(ctx, bkt, got, out, errors.New("bad")); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		a, _ := os.ReadFile(filepath.Join(dir, filepath.FromSlash(f.RelPath)))
		b, _ := os.ReadFile(filepath.Join(out, filepath.FromSlash(f.RelPath)))
		if !bytes.Equal(a, b) {
			t.Errorf("%s downloads to %d bytes unlike the %d the TSDB wrote", f.RelPath, len(b), len(a))
		}
	}
}
