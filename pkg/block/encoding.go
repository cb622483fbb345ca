package block

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/klauspost/compress/zstd"
	"github.com/thanos-io/objstore"
)

// Encodings of a block's files in the bucket (File.Encoding).
const (
	// EncodingNone stores a file as the TSDB wrote it, so readers can
	// range-read it (raw blocks: large, read a few pages at a time).
	EncodingNone = ""
	// EncodingZstd stores a file zstd-compressed as the object
	// <rel_path>.zst, in frames of about FrameBytes with a seek table at
	// the end (frames.go), so readers fetch and decode only the frames they
	// need. Downsampled blocks' index and chunks shrink 4-8× (their XOR
	// streams, symbol references and postings repeat across series in ways
	// per-chunk encodings cannot see).
	EncodingZstd = "zstd"
	// EncodingZstdNoCRC is EncodingZstd of the file without the CRC32s the
	// TSDB puts after each chunk and each index series entry (crcstrip.go),
	// which decoding recomputes. A file whose layout is not the expected
	// one is stored EncodingZstd instead.
	EncodingZstdNoCRC = "zstd-nocrc"
	// EncodingZstdColumns is EncodingZstdNoCRC with each frame of a chunk
	// segment rewritten before zstd: its XOR chunks' samples as columns of
	// timestamps and values (columns.go), which zstd shrinks several times
	// further than the XOR bit streams. Asked of a block, its index is
	// stored EncodingZstdNoCRC; a segment whose frames do not decode back
	// to it is stored EncodingZstdNoCRC too.
	EncodingZstdColumns = "zstd-columns"
)

// ParseEncoding checks a configured encoding ("none", "zstd", "zstd-nocrc"
// or "zstd-columns").
func ParseEncoding(s string) (string, error) {
	switch s {
	case "", "none":
		return EncodingNone, nil
	case EncodingZstd, EncodingZstdNoCRC, EncodingZstdColumns:
		return s, nil
	}
	return "", fmt.Errorf("unknown block file encoding %q (none, zstd, zstd-nocrc or zstd-columns)", s)
}

// encodingsToTry returns the encodings to store the file rel in when enc is
// asked for, best first: each falls back to the next when the file's layout
// is not the one it expects or it does not decode back to the file.
func encodingsToTry(rel, enc string) ([]string, error) {
	switch enc {
	case EncodingZstd:
		return []string{EncodingZstd}, nil
	case EncodingZstdNoCRC:
		return []string{EncodingZstdNoCRC, EncodingZstd}, nil
	case EncodingZstdColumns:
		if !isSegment(rel) {
			return []string{EncodingZstdNoCRC, EncodingZstd}, nil
		}
		return []string{EncodingZstdColumns, EncodingZstdNoCRC, EncodingZstd}, nil
	}
	return nil, fmt.Errorf("%s: unknown encoding %q", rel, enc)
}

// ObjectRel is the file's object path relative to the block.
func (f File) ObjectRel() string {
	if f.Encoding != EncodingNone {
		return f.RelPath + ".zst"
	}
	return f.RelPath
}

// BucketBytes is what the file's object takes in the bucket.
func (f File) BucketBytes() int64 {
	if f.Encoding != EncodingNone {
		return f.StoredBytes
	}
	return f.SizeBytes
}

// BucketBytes is what the block's files take in the bucket (meta.json aside).
func (m *Meta) BucketBytes() int64 {
	var n int64
	for _, f := range m.GPUStore.Files {
		n += f.BucketBytes()
	}
	return n
}

// File returns the entry of rel and whether there is one.
func (m *Meta) File(rel string) (File, bool) {
	for _, f := range m.GPUStore.Files {
		if f.RelPath == rel {
			return f, true
		}
	}
	return File{}, false
}

// One encoder and decoder for the process: both are safe for concurrent
// use and keep their state between calls. SpeedBestCompression: blocks are
// encoded once by the compactor and read many times; on downsampled blocks
// it is 10-20 % smaller than the default level (bench/RESULTS.md).
var (
	zstdEncoder, _ = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedBestCompression), zstd.WithEncoderConcurrency(1))
	zstdDecoder, _ = zstd.NewReader(nil, zstd.WithDecoderConcurrency(0))
)

// MaxEncodedFileBytes: a file larger than this is stored plain whatever
// the encoding asked for. Encoding holds a file, its form without CRCs, its
// encoded form and the check that it decodes back in memory at once (about
// 3.5 times the file), and the compactor decodes a source's files whole:
// bounded for a full 512 MiB chunk segment, not for the index of a 14 d
// raw block of a large fleet. A variable for tests.
var MaxEncodedFileBytes int64 = 768 << 20

// ErrEncodedSize says a decoded file does not have the size meta.json records.
var ErrEncodedSize = errors.New("decoded file size differs from meta.json")

// Decode returns the decoded content of an object holding file f: the
// object itself for EncodingNone. A decoded size other than f.SizeBytes is
// an error (a torn or foreign object).
func Decode(f File, object []byte) ([]byte, error) {
	switch f.Encoding {
	case EncodingNone:
		return object, nil
	case EncodingZstd, EncodingZstdNoCRC, EncodingZstdColumns:
	default:
		return nil, fmt.Errorf("%s: unknown encoding %q", f.RelPath, f.Encoding)
	}
	if int64(len(object)) != f.StoredBytes || int64(len(object)) < SeekTableLen(f) {
		return nil, fmt.Errorf("%w: %s.zst has %d bytes, meta.json says %d", ErrEncodedSize, f.RelPath, len(object), f.StoredBytes)
	}
	body := len(object) - int(SeekTableLen(f))
	t, err := ParseSeekTable(f, object[body:])
	if err != nil {
		return nil, err
	}
	return DecodeFrames(f, t, 0, len(t.Frames)-1, object[:body])
}

// uploadEncoded uploads the local file src as f's object under the block
// directory, encoded as f.Encoding says, and returns f with StoredBytes and
// Frames set. The file is encoded in memory (downsampled blocks' files are
// a few MB to a few hundred MB) and decoded again before it is stored.
func uploadEncoded(ctx context.Context, bkt objstore.Bucket, src, dst string, f File) (File, error) {
	plain, err := os.ReadFile(src)
	if err != nil {
		return f, err
	}
	tries, err := encodingsToTry(f.RelPath, f.Encoding)
	if err != nil {
		return f, err
	}
	var enc []byte
	var errs []error
	for _, try := range tries {
		f.Encoding = try
		if enc, f.Frames, err = encodeFrames(f.RelPath, plain, try); err == nil {
			f.StoredBytes = int64(len(enc))
			var back []byte
			if back, err = Decode(f, enc); err == nil && !bytes.Equal(back, plain) {
				err = errors.New("does not decode back to itself")
			}
		}
		if err == nil {
			break
		}
		errs = append(errs, fmt.Errorf("%s: %w", try, err))
	}
	if err != nil {
		return f, fmt.Errorf("encode %s: %w", f.RelPath, errors.Join(errs...))
	}
	tmp, err := os.CreateTemp(filepath.Dir(src), ".encoded-*")
	if err != nil {
		return f, err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(enc)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return f, err
	}
	// Through a file, not a byte reader: a folder bucket links it, and S3
	// uploads learn its size without buffering it again.
	return f, uploadFile(ctx, bkt, tmp.Name(), dst)
}

// DownloadFile writes the decoded content of the block file f of the
// object name to dst. A missing object or one that does not decode to
// f.SizeBytes is reported with bad wrapped (the block's fault, not the
// bucket's).
func DownloadFile(ctx context.Context, bkt objstore.BucketReader, name, dst string, f File, bad error) error {
	rc, err := bkt.Get(ctx, name)
	if err != nil {
		if bkt.IsObjNotFoundErr(err) {
			return fmt.Errorf("%w: %s is missing", bad, name)
		}
		return fmt.Errorf("download %s: %w", name, err)
	}
	defer rc.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	var n int64
	if f.Encoding == EncodingNone {
		n, err = io.Copy(out, rc)
	} else {
		var obj, plain []byte
		if obj, err = io.ReadAll(rc); err == nil {
			if plain, err = Decode(f, obj); err != nil {
				err = fmt.Errorf("%w: %s: %w", bad, name, err)
			} else {
				var w int
				w, err = out.Write(plain)
				n = int64(w)
			}
		}
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if errors.Is(err, bad) {
			return err
		}
		return fmt.Errorf("download %s: %w", name, err)
	}
	if n != f.SizeBytes {
		return fmt.Errorf("%w: %s has %d bytes, meta.json says %d", bad, name, n, f.SizeBytes)
	}
	return nil
}
