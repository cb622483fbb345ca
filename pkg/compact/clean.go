// The clean phase of a pass: blocks whose deletion is due and crashed
// uploads go.

package compact

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/gpustore/gpustore/pkg/block"
)

// deleteMarked deletes blocks marked for deletion longer than DeleteDelay
// ago and partial directories older than PartialDeleteDelay.
func (p *pass) deleteMarked(ctx context.Context) error {
	now := p.c.now()
	for _, id := range p.sortedIDs() {
		b := p.blocks[id]
		switch {
		case b.deletion != nil:
			if now.Sub(time.Unix(b.deletion.DeletionTime, 0)) < time.Duration(p.c.cfg.DeleteDelay) {
				continue
			}
		case !b.hasMeta:
			old, err := p.allOlderThan(ctx, b, now.Add(-time.Duration(p.c.cfg.PartialDeleteDelay)))
			if err != nil {
				return err
			}
			if !old {
				continue
			}
		default:
			continue
		}
		if err := p.held.Check(ctx); err != nil {
			return err
		}
		if err := p.deleteBlock(ctx, b); err != nil {
			return err
		}
		reason := "marked"
		if !b.hasMeta && b.deletion == nil {
			reason = "partial"
		}
		p.c.m.deleted.WithLabelValues(p.tenant, reason).Inc()
		p.logger.Info("deleted block", "block", id, "why", reason)
		delete(p.blocks, id)
	}
	return nil
}

// allOlderThan reports whether every object of a partial block was last
// modified before t.
func (p *pass) allOlderThan(ctx context.Context, b *blockState, t time.Time) (bool, error) {
	if t.Before(ulid.Time(b.id.Time())) {
		return false, nil // the block itself is younger
	}
	for _, o := range b.objects {
		a, err := block.ExpectMissing(p.c.bkt).Attributes(ctx, o) // a partial block's objects may go meanwhile
		if err != nil {
			if p.c.bkt.IsObjNotFoundErr(err) {
				continue
			}
			return false, fmt.Errorf("attributes of %s: %w", o, err)
		}
		if a.LastModified.After(t) {
			return false, nil
		}
	}
	return true, nil
}

// deleteBlock deletes meta.json first (the block stops being a block for
// every reader), then the data, then the marks.
func (p *pass) deleteBlock(ctx context.Context, b *blockState) error {
	objs := slices.Clone(b.objects)
	rank := func(o string) int {
		switch {
		case strings.HasSuffix(o, "/"+block.MetaFilename):
			return 0
		case strings.HasSuffix(o, "/"+block.DeletionMarkFilename), strings.HasSuffix(o, "/"+block.NoCompactMarkFilename):
			return 2
		}
		return 1
	}
	slices.SortStableFunc(objs, func(a, b string) int { return rank(a) - rank(b) })
	for _, o := range objs {
		if err := p.c.bkt.Delete(ctx, o); err != nil && !p.c.bkt.IsObjNotFoundErr(err) {
			return fmt.Errorf("delete %s: %w", o, err)
		}
	}
	return nil
}
