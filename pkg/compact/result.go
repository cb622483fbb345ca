// The result of a compaction or a downsampling: its meta.json and its upload.

package compact

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/oklog/ulid/v2"

	"github.com/gpustore/gpustore/pkg/block"
)

// resultDownsample is the downsample section of the meta.json of the block
// the plan's blocks are compacted into: their resolution; the labels folded
// away in any of them (a folded block merged with others makes the result
// folded); counts kept only if every block kept them.
func resultDownsample(plan []*block.Meta) block.Downsample {
	res := plan[0].GPUStore.Downsample.Resolution
	ds := block.Downsample{Resolution: res, KeptCounts: res != block.ResolutionRaw}
	for _, m := range plan {
		ds.FoldedLabels = append(ds.FoldedLabels, m.GPUStore.Downsample.FoldedLabels...)
		ds.KeptCounts = ds.KeptCounts && m.GPUStore.Downsample.KeptCounts
	}
	slices.Sort(ds.FoldedLabels)
	ds.FoldedLabels = slices.Compact(ds.FoldedLabels)
	return ds
}

// sourceRanges are the sources' time ranges of the blocks in plan, once
// each (nil when a block's are unknown): the result's own sources.
func sourceRanges(plan []*block.Meta) []block.SourceRange {
	var out []block.SourceRange
	seen := map[ulid.ULID]bool{}
	for _, m := range plan {
		rs := m.Sources()
		if rs == nil {
			return nil
		}
		for _, r := range rs {
			if !seen[r.ULID] {
				seen[r.ULID] = true
				out = append(out, r)
			}
		}
	}
	slices.SortFunc(out, func(a, b block.SourceRange) int { return a.ULID.Compare(b.ULID) })
	return out
}

// uploadResult uploads a block the pass wrote into dir (a compaction's or a
// downsampling's result; its metric types, then its files, meta.json last)
// with the group's labels, the given resolution and source, and records it
// in the pass. It returns the meta and the block's bytes.
func (p *pass) uploadResult(ctx context.Context, dir string, labels map[string]string, ds block.Downsample, source string, ranges []block.SourceRange, types block.Types) (*block.Meta, int64, error) {
	bm, err := block.ReadLocalMeta(dir)
	if err != nil {
		return nil, 0, err
	}
	if labels == nil {
		labels = map[string]string{}
	}
	meta := &block.Meta{BlockMeta: bm, GPUStore: block.GPUStoreMeta{
		Version: block.MetaVersion, Tenant: p.tenant, Labels: labels,
		Downsample: ds, Source: source, SourceRanges: ranges,
	}}
	if err := p.held.Check(ctx); err != nil {
		return nil, 0, err
	}
	if err := block.WriteTypes(ctx, p.c.bkt, p.tenant, bm.ULID, types); err != nil {
		return nil, 0, err
	}
	// Every block the compactor writes is one level up at least: raw ones
	// are past the receivers' 2h blocks, which stay as the TSDB wrote them.
	encoding := p.c.rawEncoding
	if ds.Resolution != block.ResolutionRaw {
		encoding = p.c.encoding
	}
	if err := block.UploadEncoded(ctx, p.c.bkt, dir, meta, encoding); err != nil {
		return nil, 0, fmt.Errorf("upload %s block %s: %w", source, bm.ULID, err)
	}
	size := meta.BucketBytes()
	p.blocks[bm.ULID] = &blockState{id: bm.ULID, meta: meta, hasMeta: true}
	p.cov = nil // the new block may cover more
	p.c.mtx.Lock()
	p.c.metas[p.tenant][bm.ULID] = meta
	p.c.mtx.Unlock()
	return meta, size, nil
}

// typesOf returns the union of the blocks' metric types (pkg/block.Types),
// the newest block's where they differ. A types object that does not parse
// is left out: its block's metrics are typed by name.
func (p *pass) typesOf(ctx context.Context, metas []*block.Meta) (block.Types, error) {
	byAge := slices.SortedFunc(slices.Values(metas), func(a, b *block.Meta) int {
		return cmp.Or(cmp.Compare(a.MaxTime, b.MaxTime), a.ULID.Compare(b.ULID))
	})
	var out block.Types
	for _, m := range byAge {
		t, err := block.ReadTypes(ctx, p.c.bkt, p.tenant, m.ULID)
		if errors.Is(err, block.ErrBadTypes) {
			p.logger.Warn("metric types of block do not parse; its metrics are typed by name", "block", m.ULID, "err", err)
			continue
		}
		if err != nil {
			return nil, err
		}
		out = out.Merge(t)
	}
	return out, nil
}
