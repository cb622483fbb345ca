// The retention phase of a pass: blocks past their resolution's
// retention are marked for deletion.

package compact

import (
	"context"
	"fmt"
	"time"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/downsample"
)

// retention returns how long blocks of a resolution are kept (0: forever).
func (p *pass) retention(res int64) time.Duration {
	switch res {
	case block.ResolutionRaw:
		if p.c.limits != nil {
			if d := p.c.limits.CompactorRetentionRaw(p.tenant); d > 0 {
				return d
			}
		}
		return time.Duration(p.c.cfg.RetentionRaw)
	case downsample.Res5m:
		return time.Duration(p.c.cfg.Retention5m)
	case downsample.Res1h:
		return time.Duration(p.c.cfg.Retention1h)
	}
	return 0
}

// applyRetention marks the blocks wholly older than their resolution's
// retention for deletion.
func (p *pass) applyRetention(ctx context.Context) error {
	now := p.c.now()
	for _, id := range p.sortedIDs() {
		b := p.blocks[id]
		if !b.live() {
			continue
		}
		res := b.meta.GPUStore.Downsample.Resolution
		r := p.retention(res)
		if r <= 0 || b.meta.MaxTime > now.Add(-r).UnixMilli() {
			continue
		}
		if !p.mayDelete(b.meta) {
			continue
		}
		if err := p.markDeleted(ctx, b, "retention", fmt.Sprintf("retention %s", shortDuration(r))); err != nil {
			return err
		}
	}
	return nil
}

func shortDuration(d time.Duration) string {
	if d%(24*time.Hour) == 0 {
		return fmt.Sprintf("%dd", d/(24*time.Hour))
	}
	return d.String()
}
