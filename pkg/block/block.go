// Package block is the layout of a TSDB block in the bucket and the
// meta.json gpustore writes beside it.
//
// A block lives under <tenant>/<ULID>/ as the TSDB writes it on disk
// (chunks/000001..., index) plus meta.json: the TSDB's own BlockMeta with a
// "gpustore" section that records the tenant, the receiver's external labels,
// the resolution (0 for raw samples), the source ("receive") and the size of
// every file (so a reader can range-read them without asking the bucket).
//
// meta.json is always the last object written and the first one read: a
// block without it is partial (an upload that has not finished, or crashed)
// and is never read. The shape follows Thanos' meta.json ("thanos" section)
// in spirit; it is gpustore's own.
package block

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/thanos-io/objstore"
)

// File and directory names inside a block.
const (
	MetaFilename  = "meta.json"
	IndexFilename = "index"
	ChunksDirname = "chunks"
)

// Sources of a block.
const (
	// SourceReceive is a block cut by a receiver's TSDB from remote-written samples.
	SourceReceive = "receive"
	// SourceCompactor is a block the compactor built from other blocks.
	SourceCompactor = "compactor"
)

// ResolutionRaw is the resolution of blocks holding raw samples.
const ResolutionRaw int64 = 0

// MetaVersion is the version of the gpustore section.
const MetaVersion = 1

// Meta is meta.json in the bucket.
type Meta struct {
	tsdb.BlockMeta
	GPUStore GPUStoreMeta `json:"gpustore"`
}

// GPUStoreMeta is what gpustore knows about a block beyond the TSDB's meta.
type GPUStoreMeta struct {
	Version int `json:"version"`
	// Tenant whose samples the block holds.
	Tenant string `json:"tenant"`
	// Labels are the external labels of the receiver that cut the block. They
	// are recorded, not added to the block's series.
	Labels map[string]string `json:"labels"`
	// Downsample.Resolution is the step of the block's points in milliseconds (0: raw).
	Downsample Downsample `json:"downsample"`
	// Source is what produced the block (SourceReceive).
	Source string `json:"source"`
	// Files lists every object of the block except meta.json, with its size.
	Files []File `json:"files"`
	// SourceRanges are the time ranges of the compaction sources of a
	// compacted block (absent on blocks compacted before it was recorded):
	// a reader that serves some sources itself (the local TSDB keeps its
	// recent blocks after shipping them) reads this block only where the
	// other sources' data lies.
	SourceRanges []SourceRange `json:"source_ranges,omitempty"`
}

// SourceRange is a compaction source and the time range of its samples,
// half-open: [MinTime, MaxTime).
type SourceRange struct {
	ULID    ulid.ULID `json:"ulid"`
	MinTime int64     `json:"minTime"`
	MaxTime int64     `json:"maxTime"`
}

// Sources returns the time ranges of the block's sources: itself for a
// block never compacted, the recorded ones for a compacted block, and nil
// when they are unknown.
func (m *Meta) Sources() []SourceRange {
	if s := m.Compaction.Sources; len(s) == 0 || (len(s) == 1 && s[0] == m.ULID) {
		return []SourceRange{{ULID: m.ULID, MinTime: m.MinTime, MaxTime: m.MaxTime}}
	}
	if len(m.GPUStore.SourceRanges) != len(m.Compaction.Sources) {
		return nil
	}
	return m.GPUStore.SourceRanges
}

// Downsample describes a block's resolution.
type Downsample struct {
	Resolution int64 `json:"resolution"`
	// FoldedLabels are labels downsampling merged series over (pod: one
	// series per GPU rather than per GPU and pod); a query naming one reads
	// finer data where it exists.
	FoldedLabels []string `json:"folded_labels,omitempty"`
	// KeptCounts says the block's counters record how many raw samples
	// each kept sample stands for (downsample's pairs.go), which rate and
	// increase need where a series starts or ends inside their range.
	// Blocks downsampled before it was recorded, and blocks compacted or
	// downsampled from any such block, do not.
	KeptCounts bool `json:"kept_counts,omitempty"`
}

// File is one file of a block, by its path relative to the block.
type File struct {
	RelPath string `json:"rel_path"`
	// SizeBytes is the file's size as the TSDB wrote it (decoded).
	SizeBytes int64 `json:"size_bytes"`
	// Encoding is how the file is stored in the bucket (EncodingNone: as
	// is, object RelPath; EncodingZstd: compressed, object RelPath+".zst").
	// Older gpustore versions do not know it and fail to find the object
	// rather than misread it.
	Encoding string `json:"encoding,omitempty"`
	// StoredBytes is the size of an encoded file's object, Frames the
	// number of its zstd frames (frames.go).
	StoredBytes int64 `json:"stored_bytes,omitempty"`
	Frames      int   `json:"frames,omitempty"`
}

// Dir is the bucket directory of a tenant's block.
func Dir(tenant string, id ulid.ULID) string { return tenant + "/" + id.String() }

// ObjectName is the bucket object of a file of a tenant's block.
func ObjectName(tenant string, id ulid.ULID, rel string) string {
	return path.Join(Dir(tenant, id), filepath.ToSlash(rel))
}

// Size returns the size recorded for rel, or -1.
func (m *Meta) Size(rel string) int64 {
	for _, f := range m.GPUStore.Files {
		if f.RelPath == rel {
			return f.SizeBytes
		}
	}
	return -1
}

// ChunkSegments returns the relative paths of the chunk segment files, in order.
func (m *Meta) ChunkSegments() []string {
	var segs []string
	for _, f := range m.GPUStore.Files {
		if strings.HasPrefix(f.RelPath, ChunksDirname+"/") {
			segs = append(segs, f.RelPath)
		}
	}
	sort.Strings(segs)
	return segs
}

// Validate checks what a reader relies on.
func (m *Meta) Validate() error {
	if m.ULID == (ulid.ULID{}) {
		return errors.New("meta.json without ULID")
	}
	if m.MinTime > m.MaxTime {
		return fmt.Errorf("block %s: minTime %d after maxTime %d", m.ULID, m.MinTime, m.MaxTime)
	}
	if m.GPUStore.Tenant == "" {
		return fmt.Errorf("block %s: meta.json has no gpustore.tenant", m.ULID)
	}
	if m.Size(IndexFilename) < 0 {
		return fmt.Errorf("block %s: meta.json lists no index", m.ULID)
	}
	return nil
}

// ReadLocalMeta reads the TSDB's meta.json of a block directory.
func ReadLocalMeta(dir string) (tsdb.BlockMeta, error) {
	var m tsdb.BlockMeta
	b, err := os.ReadFile(filepath.Join(dir, MetaFilename))
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("parse %s: %w", filepath.Join(dir, MetaFilename), err)
	}
	return m, nil
}

// LocalFiles lists the files of a local block directory that are uploaded:
// the chunk segments and the index (not meta.json, written separately, and
// not tombstones: gpustore offers no delete API, so blocks have none).
func LocalFiles(dir string) ([]File, error) {
	var files []File
	segs, err := os.ReadDir(filepath.Join(dir, ChunksDirname))
	if err != nil {
		return nil, fmt.Errorf("list chunks of %s: %w", dir, err)
	}
	for _, e := range segs {
		if e.IsDir() {
			continue
		}
		st, err := e.Info()
		if err != nil {
			return nil, err
		}
		files = append(files, File{RelPath: ChunksDirname + "/" + e.Name(), SizeBytes: st.Size()})
	}
	st, err := os.Stat(filepath.Join(dir, IndexFilename))
	if err != nil {
		return nil, err
	}
	files = append(files, File{RelPath: IndexFilename, SizeBytes: st.Size()})
	return files, nil
}

// Linker is a bucket that can store a local file without copying it: a
// folder bucket on the same filesystem as the file (pkg/storage/bucket), by a hard
// link. A block's chunk segments and index are never written again once the
// block is complete, so the local block and the bucket can share them: with
// the embedded default (a folder inside the data directory) a block uploaded
// and still kept locally is on disk once, and deleting the local copy only
// removes a name. Link replaces a file already at name; an error (the file
// is on another filesystem) leaves Upload to copy.
type Linker interface {
	Link(src, name string) error
}

// Upload copies the local block directory dir to <tenant>/<ULID>/ with meta
// as its meta.json: every chunk segment, then the index, then meta.json last,
// so that a reader that finds meta.json finds a whole block. Re-uploading a
// block (after a failed or crashed attempt) overwrites what is there. A
// bucket that is a Linker takes the segments and the index by hard link.
func Upload(ctx context.Context, bkt objstore.Bucket, dir string, meta Meta) error {
	return UploadEncoded(ctx, bkt, dir, &meta, Uniform(EncodingNone))
}

// Encodings say how a block's files are stored in the bucket: its chunk
// segments and its index (an index asked zstd-columns is stored
// zstd-nocrc: it has no chunks).
type Encodings struct{ Chunks, Index string }

// Uniform stores every file of a block in enc.
func Uniform(enc string) Encodings { return Encodings{Chunks: enc, Index: enc} }

// EncodingsOf are the encodings the block m was stored with. A file too
// large to encode is stored plain beside encoded ones: any encoded file of
// a kind says how that kind was asked.
func EncodingsOf(m *Meta) Encodings {
	var e Encodings
	for _, f := range m.GPUStore.Files {
		kind := &e.Index
		if isSegment(f.RelPath) {
			kind = &e.Chunks
		}
		if f.Encoding != EncodingNone {
			*kind = f.Encoding
		}
	}
	return e
}

// UploadEncoded is Upload with the segments and the index stored in the
// given encodings; it sets meta's file list to what it uploaded.
func UploadEncoded(ctx context.Context, bkt objstore.Bucket, dir string, meta *Meta, enc Encodings) error {
	files, err := LocalFiles(dir)
	if err != nil {
		return err
	}
	meta.GPUStore.Files = files
	if err := meta.Validate(); err != nil {
		return err
	}
	for i, f := range files {
		src := filepath.Join(dir, filepath.FromSlash(f.RelPath))
		encoding := enc.Index
		if isSegment(f.RelPath) {
			encoding = enc.Chunks
		}
		if encoding == EncodingNone || f.SizeBytes > MaxEncodedFileBytes {
			err = uploadFile(ctx, bkt, src, ObjectName(meta.GPUStore.Tenant, meta.ULID, f.RelPath))
		} else {
			f.Encoding = encoding
			files[i], err = uploadEncoded(ctx, bkt, src, ObjectName(meta.GPUStore.Tenant, meta.ULID, f.ObjectRel()), f)
		}
		if err != nil {
			return err
		}
	}
	b, err := json.MarshalIndent(meta, "", "\t")
	if err != nil {
		return err
	}
	if err := bkt.Upload(ctx, ObjectName(meta.GPUStore.Tenant, meta.ULID, MetaFilename), bytes.NewReader(b)); err != nil {
		return fmt.Errorf("upload meta.json of block %s: %w", meta.ULID, err)
	}
	return nil
}

func uploadFile(ctx context.Context, bkt objstore.Bucket, src, dst string) error {
	if l, ok := bkt.(Linker); ok {
		if err := l.Link(src, dst); err == nil {
			return nil
		}
		// Copied instead, into a new file: one left at dst by an earlier
		// attempt may be a link of src, and a folder bucket's upload writes
		// into the file it finds, which would truncate src.
		if err := bkt.Delete(ctx, dst); err != nil && !bkt.IsObjNotFoundErr(err) {
			return fmt.Errorf("replace %s: %w", dst, err)
		}
	}
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := bkt.Upload(ctx, dst, f); err != nil {
		return fmt.Errorf("upload %s: %w", dst, err)
	}
	return nil
}

// ErrNoMeta is returned by ReadMeta for a block directory without meta.json:
// a partial block.
var ErrNoMeta = errors.New("block has no meta.json (partial upload)")

// ErrBadMeta is wrapped by ReadMeta's errors for a meta.json that was read but
// is not valid: it will not get better by reading it again.
var ErrBadMeta = errors.New("bad meta.json")

// ExpectMissing returns bkt's reader on which a missing object is an
// answer, not a failed operation: objstore's metrics count every error of
// an instrumented bucket as a failure unless told it is expected. Reads of
// objects that may rightly be absent (a block's meta.json while it
// uploads, the marks of unmarked blocks, the bucket index and the
// compactor's lease before they are written) go through it, so that
// objstore_bucket_operation_failures_total stays 0 on a healthy bucket.
func ExpectMissing(bkt objstore.BucketReader) objstore.BucketReader {
	if ib, ok := bkt.(objstore.InstrumentedBucketReader); ok {
		return ib.ReaderWithExpectedErrs(ib.IsObjNotFoundErr)
	}
	return bkt
}

// ReadMeta reads and checks a block's meta.json from the bucket.
func ReadMeta(ctx context.Context, bkt objstore.BucketReader, tenant string, id ulid.ULID) (*Meta, error) {
	rc, err := ExpectMissing(bkt).Get(ctx, ObjectName(tenant, id, MetaFilename))
	if err != nil {
		if bkt.IsObjNotFoundErr(err) {
			return nil, ErrNoMeta
		}
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return nil, fmt.Errorf("read meta.json of %s/%s: %w", tenant, id, err)
	}
	var m Meta
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%w: parse meta.json of %s/%s: %w", ErrBadMeta, tenant, id, err)
	}
	if m.ULID != id {
		return nil, fmt.Errorf("%w: meta.json of %s/%s names block %s", ErrBadMeta, tenant, id, m.ULID)
	}
	if m.GPUStore.Tenant != tenant {
		return nil, fmt.Errorf("%w: meta.json of %s/%s names tenant %q", ErrBadMeta, tenant, id, m.GPUStore.Tenant)
	}
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadMeta, err)
	}
	return &m, nil
}

// ParseDir returns the ULID of a bucket directory entry "<tenant>/<ULID>/".
func ParseDir(name string) (ulid.ULID, bool) {
	base := path.Base(strings.TrimSuffix(name, "/"))
	id, err := ulid.ParseStrict(base)
	return id, err == nil
}

// Download copies a bucket block's files into the local directory dir as
// the TSDB reads them (encoded files decoded), with its TSDB meta.json
// (without the gpustore section): a block the TSDB's own readers and
// compactor open. Errors that are the block's fault (a missing object, a
// file that does not decode) wrap bad.
func Download(ctx context.Context, bkt objstore.BucketReader, m *Meta, dir string, bad error) error {
	if err := os.MkdirAll(filepath.Join(dir, ChunksDirname), 0o755); err != nil {
		return err
	}
	for _, f := range m.GPUStore.Files {
		if err := DownloadFile(ctx, bkt, ObjectName(m.GPUStore.Tenant, m.ULID, f.ObjectRel()), filepath.Join(dir, filepath.FromSlash(f.RelPath)), f, bad); err != nil {
			return err
		}
	}
	b, err := json.MarshalIndent(m.BlockMeta, "", "\t")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, MetaFilename), b, 0o644)
}
