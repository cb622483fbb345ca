package compact

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/tsdb"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/deletion"
	"github.com/gpustore/gpustore/pkg/rewrite"
)

// applyDeletions removes the samples of the tenant's series deletion
// requests (pkg/deletion) from its bucket blocks, raw and downsampled: each
// block that may hold deleted samples is downloaded, given the requests as
// tombstones, rewritten without them (series wholly deleted leave the
// index and its symbol table) and uploaded in place of the old block, which
// is marked for deletion and goes after the delete delay like any replaced
// block.
//
// Which blocks may hold deleted samples (a request covers samples up to the
// time it was made): those written before the request's cutoff (by ULID
// time), which the first pass that sees the request sets to its own start,
// and blocks the compactor did not make (a receiver's, an upload's) that
// overlap the request, whenever they were written: a receiver that is not
// the process that took the request (no tombstones in its head), a block
// cut before the deletion and shipped later, a clock ahead. Every block
// the compactor writes after the cutoff comes from inputs this step had
// already rewritten (merges and downsamplings of this pass and later ones
// run after it). Blocks checked (rewritten or found without matching
// series) are listed in the cutoff record, so a block is downloaded once
// per request.
//
// It reports whether it changed any block (the pass then lists the tenant
// again).
func (p *pass) applyDeletions(ctx context.Context) (bool, error) {
	reqs, err := deletion.List(ctx, p.c.bkt, p.tenant, nil)
	if err != nil || len(reqs) == 0 {
		return false, err
	}
	changed := false
	for _, r := range reqs {
		cut, err := deletion.ReadCutoff(ctx, p.c.bkt, p.tenant, r.ID)
		if err != nil {
			return changed, err
		}
		if cut == nil {
			if err := p.held.Check(ctx); err != nil {
				return changed, err
			}
			cut = &deletion.Cutoff{Time: p.c.now()}
			if err := deletion.WriteCutoff(ctx, p.c.bkt, p.tenant, r.ID, *cut); err != nil {
				return changed, err
			}
		}
		done := len(cut.Checked)
		for _, id := range p.sortedIDs() {
			b := p.blocks[id]
			if !b.live() || slices.Contains(cut.Checked, id) || !r.Overlaps(b.meta.MinTime, b.meta.MaxTime) ||
				ulid.Time(id.Time()).Compare(cut.Time) >= 0 && b.meta.GPUStore.Source == block.SourceCompactor {
				continue
			}
			rw, err := p.deleteFromBlock(ctx, b, r)
			if err != nil {
				return changed, fmt.Errorf("deletion %s in block %s: %w", r.ID, id, err)
			}
			if rw.Changed {
				changed = true
				if rw.New != nil {
					cut.Checked = append(cut.Checked, rw.New.ULID) // written without the samples
				}
				b.deletion = &block.DeletionMark{ID: id, DeletionTime: p.c.now().Unix()}
				p.c.m.deletionMarks.WithLabelValues(p.tenant, "series-deletion").Inc()
				p.logger.Info("block rewritten without deleted series", "request", r.ID, "block", id,
					"new", newID(rw.New), "series_dropped", rw.DroppedSeries)
			}
			cut.Checked = append(cut.Checked, id)
		}
		if len(cut.Checked) > done {
			if err := deletion.WriteCutoff(ctx, p.c.bkt, p.tenant, r.ID, *cut); err != nil {
				return changed, err
			}
		}
	}
	return changed, nil
}

func newID(m *block.Meta) string {
	if m == nil {
		return "none (no series left)"
	}
	return m.ULID.String()
}

// deleteFromBlock rewrites one block without the request's samples.
func (p *pass) deleteFromBlock(ctx context.Context, b *blockState, r *deletion.Request) (Rewritten, error) {
	work, err := os.MkdirTemp(p.c.dir, "deletion-")
	if err != nil {
		return Rewritten{}, err
	}
	defer os.RemoveAll(work)
	src := filepath.Join(work, b.id.String())
	if err := p.download(ctx, b.meta, src); err != nil {
		return Rewritten{}, err
	}
	// Series deleted over the block's whole range are dropped (their label
	// values leave the symbol table too); the others get tombstones.
	var drop [][]*labels.Matcher
	if r.MinTime <= b.meta.MinTime && r.MaxTime >= b.meta.MaxTime-1 {
		drop = r.Matchers()
	}
	tombstoned := false
	if drop == nil {
		tb, err := tsdb.OpenBlock(nil, src, nil, nil)
		if err != nil {
			return Rewritten{}, err
		}
		for _, ms := range r.Matchers() {
			if err := tb.Delete(ctx, r.MinTime, r.MaxTime, ms...); err != nil {
				tb.Close()
				return Rewritten{}, err
			}
		}
		tombstoned = tb.Meta().Stats.NumTombstones > 0
		if err := tb.Close(); err != nil {
			return Rewritten{}, err
		}
		if !tombstoned {
			return Rewritten{}, nil
		}
	}
	return RewriteBlock(ctx, p.c.bkt, p.held, p.tenant, b.meta, src, tombstoned, rewrite.Options{Drop: drop}, p.logger)
}
