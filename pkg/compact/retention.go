// The retention phase of a pass: blocks past their resolution's
// retention are marked for deletion.

package compact

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/common/model"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/downsample"
)

// retention returns how long blocks of a resolution are kept (0: forever):
// the tenant's override, else the configured default.
func (p *pass) retention(res int64) time.Duration {
	var override func(string) time.Duration
	var def model.Duration
	switch res {
	case block.ResolutionRaw:
		def = p.c.cfg.RetentionRaw
		if p.c.limits != nil {
			override = p.c.limits.CompactorRetentionRaw
		}
	case downsample.Res5m:
		def = p.c.cfg.Retention5m
		if p.c.limits != nil {
			override = p.c.limits.CompactorRetention5m
		}
	case downsample.Res1h:
		def = p.c.cfg.Retention1h
		if p.c.limits != nil {
			override = p.c.limits.CompactorRetention1h
		}
	default:
		return 0
	}
	if override != nil {
		if d := override(p.tenant); d > 0 {
			return d
		}
	}
	return time.Duration(def)
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
