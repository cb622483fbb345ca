// Package bucketindex keeps one object per tenant in the bucket,
// <tenant>/bucket-index.json.gz, that lists the tenant's complete blocks
// (their meta.json), their deletion and no-compact marks, and when it was
// built. The compactor writes it after each pass; the bucket store reads it
// instead of listing every block and reading every meta.json and mark each
// sync, which does not scale to thousands of blocks per tenant.
//
// Update builds a new index from a listing of the tenant's objects and the
// previous index: it reads only the meta.json of blocks the previous index
// does not have and the marks it has not seen, so an update costs a few LIST
// requests plus one GET per new block or new mark.
//
// The index is a cache of the bucket, never the truth: a block is complete
// when its meta.json exists, whatever the index says, and a reader that finds
// no index, or a stale one, lists the bucket instead.
package bucketindex

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/thanos-io/objstore"

	"github.com/gpustore/gpustore/pkg/block"
)

// Filename is the index object inside a tenant's directory.
const Filename = "bucket-index.json.gz"

// Version is the index format version this package writes and reads.
const Version = 1

// ErrNotFound is returned by Read when the tenant has no index.
var ErrNotFound = errors.New("bucket index not found")

// Index is a tenant's bucket index.
type Index struct {
	Version int    `json:"version"`
	Tenant  string `json:"tenant"`
	// UpdatedAt is when the listing the index was built from began, in Unix
	// seconds: every block complete before then is in it.
	UpdatedAt int64 `json:"updated_at"`
	// Blocks are the complete blocks (with a valid meta.json), by MinTime then ULID.
	Blocks []*block.Meta `json:"blocks"`
	// DeletionMarks and NoCompactMarks are the marks of listed blocks, by ULID.
	DeletionMarks  []*block.DeletionMark  `json:"deletion_marks"`
	NoCompactMarks []*block.NoCompactMark `json:"no_compact_marks"`
	// Partial are block directories without meta.json: an upload in
	// progress, or one that crashed. They are never read.
	Partial []ulid.ULID `json:"partial_blocks,omitempty"`
	// Corrupted are block directories whose meta.json is not valid. They are
	// never read, and never deleted for it.
	Corrupted []ulid.ULID `json:"corrupted_blocks,omitempty"`
}

// ObjectName is the bucket object of the tenant's index.
func ObjectName(tenant string) string { return tenant + "/" + Filename }

// UpdatedTime is UpdatedAt as a time.
func (x *Index) UpdatedTime() time.Time { return time.Unix(x.UpdatedAt, 0) }

// Block returns the meta of the block id, or nil.
func (x *Index) Block(id ulid.ULID) *block.Meta {
	for _, b := range x.Blocks {
		if b.ULID == id {
			return b
		}
	}
	return nil
}

// DeletionMarkMap returns the deletion marks by block.
func (x *Index) DeletionMarkMap() map[ulid.ULID]*block.DeletionMark {
	m := make(map[ulid.ULID]*block.DeletionMark, len(x.DeletionMarks))
	for _, d := range x.DeletionMarks {
		m[d.ID] = d
	}
	return m
}

// NoCompactMarkMap returns the no-compact marks by block.
func (x *Index) NoCompactMarkMap() map[ulid.ULID]*block.NoCompactMark {
	m := make(map[ulid.ULID]*block.NoCompactMark, len(x.NoCompactMarks))
	for _, d := range x.NoCompactMarks {
		m[d.ID] = d
	}
	return m
}

// Listing is what one listing of a tenant's directory found per block.
type listing struct {
	meta, deletion, noCompact bool
}

// list lists every object under the tenant's directory (recursively: a few
// requests per thousand objects) and returns, per block directory, which of
// the files that matter exist.
func list(ctx context.Context, bkt objstore.BucketReader, tenant string) (map[ulid.ULID]*listing, error) {
	prefix := tenant + "/"
	found := map[ulid.ULID]*listing{}
	err := bkt.Iter(ctx, prefix, func(name string) error {
		rest := strings.TrimPrefix(name, prefix)
		dir, file, ok := strings.Cut(rest, "/")
		if !ok {
			return nil // an object of the tenant's directory itself (the index)
		}
		id, err := ulid.ParseStrict(dir)
		if err != nil {
			return nil
		}
		l := found[id]
		if l == nil {
			l = &listing{}
			found[id] = l
		}
		switch file {
		case block.MetaFilename:
			l.meta = true
		case block.DeletionMarkFilename:
			l.deletion = true
		case block.NoCompactMarkFilename:
			l.noCompact = true
		}
		return nil
	}, objstore.WithRecursiveIter())
	if err != nil {
		return nil, fmt.Errorf("list blocks of tenant %q: %w", tenant, err)
	}
	return found, nil
}

// Update lists the tenant's blocks and returns a new index. What old already
// holds (metas, marks) is kept without reading it again: a block's meta.json
// never changes, and a deletion mark is never rewritten (block.WriteDeletionMark
// keeps the first). A no-compact mark is re-read only if old lacks it. old may
// be nil (a first build) and is not modified.
//
// A meta.json or mark that cannot be read (bucket error) fails the update, so
// that a block is never dropped from the index for a passing fault; a
// meta.json that is read but invalid puts the block in Corrupted.
func Update(ctx context.Context, bkt objstore.BucketReader, tenant string, old *Index) (*Index, error) {
	start := time.Now()
	found, err := list(ctx, bkt, tenant)
	if err != nil {
		return nil, err
	}
	var (
		oldBlocks = map[ulid.ULID]*block.Meta{}
		oldDel    = map[ulid.ULID]*block.DeletionMark{}
		oldNC     = map[ulid.ULID]*block.NoCompactMark{}
	)
	if old != nil {
		for _, b := range old.Blocks {
			oldBlocks[b.ULID] = b
		}
		oldDel, oldNC = old.DeletionMarkMap(), old.NoCompactMarkMap()
	}
	x := &Index{Version: Version, Tenant: tenant, UpdatedAt: start.Unix(), Blocks: []*block.Meta{}, DeletionMarks: []*block.DeletionMark{}, NoCompactMarks: []*block.NoCompactMark{}}
	for id, l := range found {
		if !l.meta {
			x.Partial = append(x.Partial, id)
			continue
		}
		meta := oldBlocks[id]
		if meta == nil {
			meta, err = block.ReadMeta(ctx, bkt, tenant, id)
			switch {
			case errors.Is(err, block.ErrNoMeta):
				// Deleted between the listing and the read.
				continue
			case errors.Is(err, block.ErrBadMeta):
				x.Corrupted = append(x.Corrupted, id)
				continue
			case err != nil:
				return nil, fmt.Errorf("update bucket index of %q: %w", tenant, err)
			}
		}
		x.Blocks = append(x.Blocks, meta)
		if l.deletion {
			m := oldDel[id]
			if m == nil {
				if m, err = readDeletionMark(ctx, bkt, tenant, id); err != nil {
					return nil, fmt.Errorf("update bucket index of %q: %w", tenant, err)
				}
			}
			if m != nil {
				x.DeletionMarks = append(x.DeletionMarks, m)
			}
		}
		if l.noCompact {
			m := oldNC[id]
			if m == nil {
				m, err = block.ReadNoCompactMark(ctx, bkt, tenant, id)
				if errors.Is(err, block.ErrBadMark) {
					// The mark is there: the compactor leaves the block out.
					m, err = &block.NoCompactMark{ID: id, Version: block.MarkVersion, Reason: "unparsable-mark", Details: err.Error()}, nil
				}
				if err != nil {
					return nil, fmt.Errorf("update bucket index of %q: %w", tenant, err)
				}
			}
			if m != nil {
				x.NoCompactMarks = append(x.NoCompactMarks, m)
			}
		}
	}
	x.sort()
	return x, nil
}

// readDeletionMark reads a block's deletion mark; one that does not parse
// (torn) counts as absent, as the compactor counts it: the block stays
// visible until the compactor marks it again.
func readDeletionMark(ctx context.Context, bkt objstore.BucketReader, tenant string, id ulid.ULID) (*block.DeletionMark, error) {
	m, err := block.ReadDeletionMark(ctx, bkt, tenant, id)
	if errors.Is(err, block.ErrBadMark) {
		return nil, nil
	}
	return m, err
}

func (x *Index) sort() {
	slices.SortFunc(x.Blocks, func(a, b *block.Meta) int {
		if a.MinTime != b.MinTime {
			if a.MinTime < b.MinTime {
				return -1
			}
			return 1
		}
		return a.ULID.Compare(b.ULID)
	})
	slices.SortFunc(x.DeletionMarks, func(a, b *block.DeletionMark) int { return a.ID.Compare(b.ID) })
	slices.SortFunc(x.NoCompactMarks, func(a, b *block.NoCompactMark) int { return a.ID.Compare(b.ID) })
	slices.SortFunc(x.Partial, func(a, b ulid.ULID) int { return a.Compare(b) })
	slices.SortFunc(x.Corrupted, func(a, b ulid.ULID) int { return a.Compare(b) })
}

// Write uploads the index as <tenant>/bucket-index.json.gz (replacing the
// previous one in one PUT: readers see the old or the new index, whole).
func Write(ctx context.Context, bkt objstore.Bucket, x *Index) error {
	if x.Tenant == "" {
		return errors.New("write bucket index: no tenant")
	}
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	if err := json.NewEncoder(gz).Encode(x); err != nil {
		return fmt.Errorf("encode bucket index of %q: %w", x.Tenant, err)
	}
	if err := gz.Close(); err != nil {
		return fmt.Errorf("compress bucket index of %q: %w", x.Tenant, err)
	}
	if err := bkt.Upload(ctx, ObjectName(x.Tenant), &buf); err != nil {
		return fmt.Errorf("upload bucket index of %q: %w", x.Tenant, err)
	}
	return nil
}

// Read downloads the tenant's index; ErrNotFound when there is none.
func Read(ctx context.Context, bkt objstore.BucketReader, tenant string) (*Index, error) {
	rc, err := block.ExpectMissing(bkt).Get(ctx, ObjectName(tenant))
	if err != nil {
		if bkt.IsObjNotFoundErr(err) {
			return nil, ErrNotFound
		}
		return nil, fmt.Errorf("get bucket index of %q: %w", tenant, err)
	}
	defer rc.Close()
	gz, err := gzip.NewReader(rc)
	if err != nil {
		return nil, fmt.Errorf("read bucket index of %q: %w", tenant, err)
	}
	defer gz.Close()
	b, err := io.ReadAll(gz)
	if err != nil {
		return nil, fmt.Errorf("read bucket index of %q: %w", tenant, err)
	}
	var x Index
	if err := json.Unmarshal(b, &x); err != nil {
		return nil, fmt.Errorf("parse bucket index of %q: %w", tenant, err)
	}
	if x.Version != Version {
		return nil, fmt.Errorf("bucket index of %q: version %d, want %d", tenant, x.Version, Version)
	}
	if x.Tenant != tenant {
		return nil, fmt.Errorf("bucket index of %q names tenant %q", tenant, x.Tenant)
	}
	for _, m := range x.Blocks {
		if m == nil || m.GPUStore.Tenant != tenant {
			return nil, fmt.Errorf("bucket index of %q lists a block of another tenant", tenant)
		}
		if err := m.Validate(); err != nil {
			return nil, fmt.Errorf("bucket index of %q: %w", tenant, err)
		}
	}
	return &x, nil
}

// WithUnindexed returns x brought up to a cheap listing of the tenant's block
// directories (one LIST request per thousand blocks, no recursion): blocks x
// lists whose directory is gone are left out, and directories x does not
// know (blocks uploaded since the compactor wrote x) are read — their
// meta.json and deletion mark, unless known (the reader's previous view, may
// be nil) already holds them. This is how a reader of the index sees a new
// block within one sync instead of one compactor pass. x is not modified.
func WithUnindexed(ctx context.Context, bkt objstore.BucketReader, x, known *Index) (*Index, error) {
	tenant := x.Tenant
	listed := map[ulid.ULID]struct{}{}
	var dirs []ulid.ULID
	err := bkt.Iter(ctx, tenant+"/", func(name string) error {
		if !strings.HasSuffix(name, "/") {
			return nil
		}
		if id, ok := block.ParseDir(name); ok {
			listed[id] = struct{}{}
			dirs = append(dirs, id)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list block directories of tenant %q: %w", tenant, err)
	}
	out := &Index{Version: x.Version, Tenant: tenant, UpdatedAt: x.UpdatedAt, Blocks: []*block.Meta{}, DeletionMarks: []*block.DeletionMark{}, NoCompactMarks: []*block.NoCompactMark{}}
	indexed := map[ulid.ULID]struct{}{}
	for _, m := range x.Blocks {
		indexed[m.ULID] = struct{}{}
		if _, ok := listed[m.ULID]; ok {
			out.Blocks = append(out.Blocks, m)
		}
	}
	for _, d := range x.DeletionMarks {
		if _, ok := listed[d.ID]; ok {
			out.DeletionMarks = append(out.DeletionMarks, d)
		}
	}
	for _, d := range x.NoCompactMarks {
		if _, ok := listed[d.ID]; ok {
			out.NoCompactMarks = append(out.NoCompactMarks, d)
		}
	}
	for _, id := range x.Corrupted {
		if _, ok := listed[id]; ok {
			indexed[id] = struct{}{}
			out.Corrupted = append(out.Corrupted, id)
		}
	}
	knownBlocks := map[ulid.ULID]*block.Meta{}
	knownDel := map[ulid.ULID]*block.DeletionMark{}
	if known != nil {
		for _, m := range known.Blocks {
			knownBlocks[m.ULID] = m
		}
		knownDel = known.DeletionMarkMap()
	}
	for _, id := range dirs {
		if _, ok := indexed[id]; ok {
			continue
		}
		meta := knownBlocks[id]
		if meta == nil {
			meta, err = block.ReadMeta(ctx, bkt, tenant, id)
			switch {
			case errors.Is(err, block.ErrNoMeta):
				out.Partial = append(out.Partial, id)
				continue
			case errors.Is(err, block.ErrBadMeta):
				out.Corrupted = append(out.Corrupted, id)
				continue
			case err != nil:
				return nil, err
			}
		}
		out.Blocks = append(out.Blocks, meta)
		d := knownDel[id]
		if d == nil {
			if d, err = readDeletionMark(ctx, bkt, tenant, id); err != nil {
				return nil, err
			}
		}
		if d != nil {
			out.DeletionMarks = append(out.DeletionMarks, d)
		}
	}
	out.sort()
	return out, nil
}
