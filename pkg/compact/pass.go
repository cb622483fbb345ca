package compact

import (
	"context"
	"fmt"
	"log/slog"
	"slices"

	"github.com/oklog/ulid/v2"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/storage/bucketindex"
)

// blockState is one block directory of the tenant as listed.
type blockState struct {
	id        ulid.ULID
	meta      *block.Meta // nil: no (readable) meta.json
	deletion  *block.DeletionMark
	noCompact bool
	objects   []string // every object of the directory
	hasMeta   bool
}

func (b *blockState) live() bool { return b.meta != nil && b.deletion == nil }

// pass is one tenant's pass.
type pass struct {
	c      *Compactor
	tenant string
	held   *Held
	logger *slog.Logger
	blocks map[ulid.ULID]*blockState
	cov    map[groupID]map[ulid.ULID]struct{} // per compaction group: sources covered (mayDelete's memo)
}

func (p *pass) run(ctx context.Context) error {
	if err := p.sync(ctx); err != nil {
		return err
	}
	if err := p.deleteMarked(ctx); err != nil {
		return err
	}
	if changed, err := p.applyDeletions(ctx); err != nil { // deletions.go
		return err
	} else if changed {
		if err := p.sync(ctx); err != nil {
			return err
		}
	}
	if err := p.markReplaced(ctx); err != nil {
		return err
	}
	if err := p.applyRetention(ctx); err != nil {
		return err
	}
	if err := p.compactGroups(ctx); err != nil {
		return err
	}
	if err := p.downsampleAll(ctx); err != nil {
		return err
	}
	p.updateGauges()
	return p.writeIndex(ctx)
}

func (p *pass) markDeleted(ctx context.Context, b *blockState, reason, details string) error {
	if err := p.held.Check(ctx); err != nil {
		return err
	}
	now := p.c.now()
	if err := block.WriteDeletionMark(ctx, p.c.bkt, p.tenant, b.id, details, now); err != nil {
		return fmt.Errorf("mark block %s for deletion: %w", b.id, err)
	}
	b.deletion = &block.DeletionMark{ID: b.id, Version: block.MarkVersion, Details: details, DeletionTime: now.Unix()}
	b.objects = append(b.objects, block.ObjectName(p.tenant, b.id, block.DeletionMarkFilename))
	p.c.m.deletionMarks.WithLabelValues(p.tenant, reason).Inc()
	p.logger.Info("marked block for deletion", "block", b.id, "why", details)
	return nil
}

func (p *pass) markNoCompact(ctx context.Context, id ulid.ULID, reason string, cause error) error {
	if err := p.held.Check(ctx); err != nil {
		return err
	}
	if err := block.WriteNoCompactMark(ctx, p.c.bkt, p.tenant, id, reason, cause.Error(), p.c.now()); err != nil {
		return fmt.Errorf("mark block %s no-compact: %w", id, err)
	}
	if b := p.blocks[id]; b != nil {
		b.noCompact = true
		b.objects = append(b.objects, block.ObjectName(p.tenant, id, block.NoCompactMarkFilename))
	}
	p.c.m.noCompactMarks.WithLabelValues(p.tenant, reason).Inc()
	p.logger.Error("block fails to read: marked no-compact, left for queries", "block", id, "reason", reason, "err", cause)
	return nil
}

func (p *pass) sortedIDs() []ulid.ULID {
	ids := make([]ulid.ULID, 0, len(p.blocks))
	for id := range p.blocks {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b ulid.ULID) int { return a.Compare(b) })
	return ids
}

func (p *pass) updateGauges() {
	groups, noCompact := 0, 0
	for range p.groups() {
		groups++
	}
	for _, b := range p.blocks {
		if b.noCompact && b.deletion == nil {
			noCompact++
		}
	}
	p.c.m.groups.WithLabelValues(p.tenant).Set(float64(groups))
	p.c.m.noCompactBlocks.WithLabelValues(p.tenant).Set(float64(noCompact))
}

// writeIndex writes the tenant's bucket index, so that bucket stores learn
// the blocks and marks from one object instead of listing the tenant and
// reading every meta.json. Metas and marks of the previous index are reused.
func (p *pass) writeIndex(ctx context.Context) error {
	p.c.mtx.Lock()
	old := p.c.indexes[p.tenant]
	p.c.mtx.Unlock()
	x, err := bucketindex.Update(ctx, p.c.bkt, p.tenant, old)
	if err != nil {
		return err
	}
	if err := p.held.Check(ctx); err != nil {
		return err
	}
	if err := bucketindex.Write(ctx, p.c.bkt, x); err != nil {
		return err
	}
	p.c.mtx.Lock()
	p.c.indexes[p.tenant] = x
	p.c.mtx.Unlock()
	p.c.m.indexBlocks.WithLabelValues(p.tenant).Set(float64(len(x.Blocks)))
	return nil
}
