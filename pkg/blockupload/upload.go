// Package blockupload brings TSDB blocks written elsewhere (a Prometheus
// data directory, a Prometheus snapshot, what `promtool tsdb
// create-blocks-from` writes, another system's bucket) into a tenant's
// bucket, where the compactor merges them with the tenant's own blocks
// (vertically where they overlap), downsamples them and applies retention,
// and the bucket store serves them.
//
// Both ways in share it: `gpustore tools bucket upload-blocks` (pkg/tools)
// and Mimir's block-upload HTTP API (api.go), which `mimirtool backfill`
// speaks. Each block is:
//
//  1. verified whole (block.VerifyLocal): a block that does not read, or
//     whose samples are out of order or outside its range, is refused with
//     the reason;
//  2. judged against the tenant's bucket (Judge): skipped when the bucket
//     already holds it (its ULID, or a block compacted from all of its
//     sources), refused when it overlaps blocks the compactor will not merge
//     it with (marked no-compact);
//  3. cut at the compactor's largest block range where it crosses one
//     (a block across such a boundary would never be compacted with its
//     neighbours, and merging everything it overlaps would grow without
//     bound), and rewritten where it has tombstones (a Prometheus snapshot
//     after delete_series): pkg/rewrite. Its time range is widened to the
//     compactor's smallest range (2h): promtool and the blocks written
//     from them end at their last sample + 1 ms, and the bucket store
//     reads the hours between two such blocks as not held raw (it would
//     answer them from 5m data) where a receiver's blocks are contiguous;
//  4. uploaded with block.Upload (chunks, index, meta.json last, so a
//     reader never sees half a block), its meta.json's gpustore section
//     naming the tenant, the group's labels and source "upload".
//
// Uploading needs no lease: like the shipper, it only adds blocks, and a
// block directory without meta.json (an upload cut short) is partial, never
// read, and deleted by the compactor once its objects are
// compact.partial_delete_delay old.
package blockupload

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/thanos-io/objstore"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/rewrite"
	"github.com/gpustore/gpustore/pkg/storage/bucketindex"
)

// SourceUpload is the gpustore source of a block brought in from elsewhere.
const SourceUpload = "upload"

// Local is a block directory on local disk.
type Local struct {
	Dir  string
	Meta tsdb.BlockMeta
}

// Find returns the blocks in dir: dir itself when it is a block (it holds
// meta.json), else each of its subdirectories that is one, oldest first.
// What a Prometheus data directory holds beside its blocks (wal,
// chunks_head, lock files) is not a block and is left alone; so are
// directories the TSDB is still writing or deleting (*.tmp-for-creation,
// *.tmp-for-deletion) and blocks Prometheus marked deletable (compacted
// into nothing), which skipped lists with the reason.
func Find(dir string) (blocks []Local, skipped []string, err error) {
	if _, err := os.Stat(filepath.Join(dir, block.MetaFilename)); err == nil {
		m, err := block.ReadLocalMeta(dir)
		if err != nil {
			return nil, nil, err
		}
		return []Local{{Dir: dir, Meta: m}}, nil, nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", dir, err)
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		sub := filepath.Join(dir, e.Name())
		if strings.Contains(e.Name(), ".tmp-for-") {
			skipped = append(skipped, fmt.Sprintf("%s: being written or deleted by the TSDB", sub))
			continue
		}
		if _, err := os.Stat(filepath.Join(sub, block.MetaFilename)); err != nil {
			continue // wal, chunks_head, ...
		}
		m, err := block.ReadLocalMeta(sub)
		if err != nil {
			return nil, nil, err
		}
		if m.Compaction.Deletable {
			skipped = append(skipped, fmt.Sprintf("%s: marked deletable by the TSDB that wrote it", sub))
			continue
		}
		blocks = append(blocks, Local{Dir: sub, Meta: m})
	}
	slices.SortFunc(blocks, func(a, b Local) int {
		return cmp.Or(cmp.Compare(a.Meta.MinTime, b.Meta.MinTime), a.Meta.ULID.Compare(b.Meta.ULID))
	})
	if len(blocks) == 0 {
		return nil, skipped, fmt.Errorf("%s holds no TSDB block (a directory with meta.json, index and chunks/)", dir)
	}
	return blocks, skipped, nil
}

// Bucket is what Judge knows of the tenant's bucket.
type Bucket struct {
	Tenant string
	Index  *bucketindex.Index // the tenant's complete blocks and marks
	// Labels are the uploaded blocks' group labels.
	Labels map[string]string
}

// ReadBucket reads the tenant's blocks and marks (its bucket index brought
// up to a listing, or a listing when it has none) and settles the uploaded
// blocks' group labels: explicit ones when given (non-nil), else those of
// the tenant's raw blocks when they all share one set (so the compactor
// merges the uploads with them), else none for a tenant without raw blocks.
// Raw blocks of several label sets (several receivers with their own
// external labels) need the labels chosen.
func ReadBucket(ctx context.Context, bkt objstore.BucketReader, tenant string, explicit map[string]string) (*Bucket, error) {
	x, err := bucketindex.Read(ctx, bkt, tenant)
	switch {
	case errors.Is(err, bucketindex.ErrNotFound):
		x, err = bucketindex.Update(ctx, bkt, tenant, nil)
	case err == nil:
		x, err = bucketindex.WithUnindexed(ctx, bkt, x, nil)
	}
	if err != nil {
		return nil, fmt.Errorf("read the blocks of tenant %q: %w", tenant, err)
	}
	b := &Bucket{Tenant: tenant, Index: x, Labels: explicit}
	if b.Labels != nil {
		return b, nil
	}
	del := x.DeletionMarkMap()
	sets := map[string]map[string]string{}
	for _, m := range x.Blocks {
		if _, gone := del[m.ULID]; gone || m.GPUStore.Downsample.Resolution != block.ResolutionRaw {
			continue
		}
		sets[labelsKey(m.GPUStore.Labels)] = m.GPUStore.Labels
	}
	switch len(sets) {
	case 0:
		b.Labels = map[string]string{}
	case 1:
		for _, l := range sets {
			b.Labels = maps.Clone(l)
		}
		if b.Labels == nil {
			b.Labels = map[string]string{}
		}
	default:
		keys := slices.Sorted(maps.Keys(sets))
		return nil, fmt.Errorf("the raw blocks of tenant %q carry %d sets of external labels (%s): say which the uploaded blocks join (tools: --label name=value, once per label; API: the block's thanos.labels)",
			tenant, len(sets), strings.Join(keys, "; "))
	}
	return b, nil
}

func labelsKey(l map[string]string) string {
	keys := slices.Sorted(maps.Keys(l))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%q", k, l[k])
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// Piece is one block to upload for a local block: the block itself, or a
// part of its time range.
type Piece struct {
	ULID             ulid.ULID
	MinTime, MaxTime int64
	// Skip says why the piece is not uploaded (it is in the bucket already).
	Skip string
}

// Plan is what happens to one local block.
type Plan struct {
	Block    Local
	Verified block.Verified
	// Refused says why the block is not uploaded at all (nil: it is).
	Refused error
	// Pieces are the blocks it becomes: itself, or its parts cut at
	// MaxRange boundaries.
	Pieces []Piece
	// Rewrite: the pieces are written anew (cut, or tombstones applied)
	// rather than uploaded as they are.
	Rewrite bool
}

// Uploads says whether any piece is to be uploaded.
func (p *Plan) Uploads() bool {
	return p.Refused == nil && slices.ContainsFunc(p.Pieces, func(x Piece) bool { return x.Skip == "" })
}

// Judge verifies the local block and decides what to upload for it, given
// the tenant's bucket and the compactor's block ranges (ms, smallest first).
func Judge(ctx context.Context, b *Bucket, l Local, ranges []int64) Plan {
	grid, maxRange := ranges[0], ranges[len(ranges)-1]
	p := Plan{Block: l}
	if res, err := thanosResolution(l.Dir); err != nil || res != 0 {
		if err == nil {
			err = fmt.Errorf("%w: block %s is downsampled by Thanos (resolution %s): its chunks are Thanos' aggregates, which gpustore does not read; upload the raw blocks (resolution 0), gpustore downsamples them itself", block.ErrInvalidBlock, l.Meta.ULID, time.Duration(res)*time.Millisecond)
		}
		p.Refused = err
		return p
	}
	v, err := block.VerifyLocal(ctx, l.Dir)
	p.Verified = v
	if err != nil {
		p.Refused = err
		return p
	}
	m := l.Meta
	// Cut at the largest range's boundaries; each piece's range widened to
	// the smallest range's grid (which stays within its largest range).
	for lo := m.MinTime; lo < m.MaxTime; {
		hi := min(m.MaxTime, (floorDiv(lo, maxRange)+1)*maxRange)
		p.Pieces = append(p.Pieces, Piece{MinTime: floorDiv(lo, grid) * grid, MaxTime: -floorDiv(-hi, grid) * grid})
		lo = hi
	}
	if len(p.Pieces) == 1 {
		p.Pieces[0].ULID = m.ULID
		p.Rewrite = v.TombstonedSeries > 0
	} else {
		p.Rewrite = true
		for i := range p.Pieces {
			p.Pieces[i].ULID = pieceULID(m.ULID, p.Pieces[i].MinTime)
		}
	}
	del := b.Index.DeletionMarkMap()
	noCompact := b.Index.NoCompactMarkMap()
	group := labelsKey(b.Labels)
	for i := range p.Pieces {
		pc := &p.Pieces[i]
		// Sources of the piece: the block's own when uploaded whole.
		srcs := []ulid.ULID{pc.ULID}
		if len(p.Pieces) == 1 && len(m.Compaction.Sources) > 0 {
			srcs = m.Compaction.Sources
		}
		for _, o := range b.Index.Blocks {
			if o.ULID == pc.ULID {
				pc.Skip = "in the bucket already"
				if d := del[o.ULID]; d != nil {
					pc.Skip += " (marked for deletion: " + d.Details + ")"
				}
				break
			}
			if o.GPUStore.Downsample.Resolution != block.ResolutionRaw || labelsKey(o.GPUStore.Labels) != group {
				continue
			}
			if _, gone := del[o.ULID]; !gone && containsAll(o.Compaction.Sources, srcs) {
				pc.Skip = fmt.Sprintf("in the bucket already, compacted into %s", o.ULID)
				break
			}
		}
		if pc.Skip != "" {
			continue
		}
		for _, o := range b.Index.Blocks {
			nc := noCompact[o.ULID]
			if nc == nil || del[o.ULID] != nil || labelsKey(o.GPUStore.Labels) != group || o.GPUStore.Downsample.Resolution != block.ResolutionRaw {
				continue
			}
			if o.MinTime < pc.MaxTime && pc.MinTime < o.MaxTime {
				p.Refused = fmt.Errorf("block %s: overlaps block %s of the bucket %s, which is marked no-compact (%s: %s): the compactor would never merge the two; remove the mark (gpustore tools bucket mark --remove) once the block reads, or delete it",
					m.ULID, o.ULID, span(o.MinTime, o.MaxTime), nc.Reason, nc.Details)
				return p
			}
		}
	}
	return p
}

// thanosResolution is the resolution a Thanos meta.json (its "thanos"
// section) gives the block; 0 for a raw block and for a meta.json without
// the section (Prometheus').
func thanosResolution(dir string) (int64, error) {
	b, err := os.ReadFile(filepath.Join(dir, block.MetaFilename))
	if err != nil {
		return 0, err
	}
	var m struct {
		Thanos struct {
			Downsample struct {
				Resolution int64 `json:"resolution"`
			} `json:"downsample"`
		} `json:"thanos"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return 0, fmt.Errorf("%w: %s: %v", block.ErrInvalidBlock, filepath.Join(dir, block.MetaFilename), err)
	}
	return m.Thanos.Downsample.Resolution, nil
}

// pieceULID names the piece of block id starting at mint: the same every
// time, so that uploading a directory again finds the pieces it uploaded
// before (as it finds whole blocks by their ULID).
func pieceULID(id ulid.ULID, mint int64) ulid.ULID {
	h := sha256.New()
	h.Write(id[:])
	_ = binary.Write(h, binary.BigEndian, mint)
	sum := h.Sum(nil)
	var out ulid.ULID
	_ = out.SetTime(id.Time())
	_ = out.SetEntropy(sum[:10])
	return out
}

// Upload writes the plan's pieces into the tenant's bucket. Pieces that need
// rewriting are written into work (a scratch directory) first and removed
// after. It returns the metas uploaded.
func Upload(ctx context.Context, bkt objstore.Bucket, b *Bucket, p Plan, work string, logger *slog.Logger) ([]*block.Meta, error) {
	if p.Refused != nil {
		return nil, p.Refused
	}
	var out []*block.Meta
	for _, pc := range p.Pieces {
		if pc.Skip != "" {
			continue
		}
		dir := p.Block.Dir
		if p.Rewrite {
			lineage := rewrite.Replacement
			if len(p.Pieces) > 1 {
				lineage = rewrite.Piece
			}
			if err := os.MkdirAll(work, 0o755); err != nil {
				return out, err
			}
			res, err := rewrite.Block(ctx, logger, p.Block.Dir, work, rewrite.Options{MinTime: pc.MinTime, MaxTime: pc.MaxTime, ULID: pc.ULID, Lineage: lineage})
			if err != nil {
				return out, err
			}
			if res.Meta == nil {
				continue // every sample of the piece was tombstoned
			}
			dir = res.Dir
		}
		m, err := uploadDir(ctx, bkt, b, dir, pc)
		if dir != p.Block.Dir {
			_ = os.RemoveAll(dir)
		}
		if err != nil {
			return out, err
		}
		out = append(out, m)
	}
	return out, nil
}

// uploadDir uploads a verified local block as the tenant's, with the
// piece's time range.
func uploadDir(ctx context.Context, bkt objstore.Bucket, b *Bucket, dir string, pc Piece) (*block.Meta, error) {
	bm, err := block.ReadLocalMeta(dir)
	if err != nil {
		return nil, err
	}
	bm.MinTime, bm.MaxTime = pc.MinTime, pc.MaxTime
	meta := &block.Meta{BlockMeta: bm, GPUStore: block.GPUStoreMeta{
		Version: block.MetaVersion, Tenant: b.Tenant, Labels: maps.Clone(b.Labels), Source: SourceUpload,
	}}
	if meta.GPUStore.Labels == nil {
		meta.GPUStore.Labels = map[string]string{}
	}
	if err := block.UploadEncoded(ctx, bkt, dir, meta, block.Uniform(block.EncodingNone)); err != nil {
		return nil, fmt.Errorf("upload block %s: %w", bm.ULID, err)
	}
	return meta, nil
}

func containsAll(super, sub []ulid.ULID) bool {
	if len(super) == 0 {
		return false
	}
	for _, s := range sub {
		if !slices.Contains(super, s) {
			return false
		}
	}
	return true
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

func span(mint, maxt int64) string {
	f := func(ms int64) string { return time.UnixMilli(ms).UTC().Format(time.RFC3339) }
	return "[" + f(mint) + ", " + f(maxt) + ")"
}
