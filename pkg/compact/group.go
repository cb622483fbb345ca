// The group compaction phase of a pass: each compaction group's plans,
// one after another, until none is left.

package compact

import (
	"cmp"
	"context"
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
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunkenc"

	"github.com/gpustore/gpustore/pkg/block"
)

// groupID is a compaction group: the blocks of one group (block.GroupKey)
// at one resolution, which may be compacted together. Blocks of two
// receivers with the same external labels share a group, so their
// overlapping blocks are merged.
type groupID struct {
	res    int64
	labels string // block.GroupKey
}

func groupOf(m *block.Meta) groupID {
	return groupID{res: m.GPUStore.Downsample.Resolution, labels: block.GroupKey(m)}
}

func (g groupID) String() string { return fmt.Sprintf("%d@%s", g.res, g.labels) }

func (g groupID) compare(o groupID) int {
	return cmp.Or(cmp.Compare(g.res, o.res), strings.Compare(g.labels, o.labels))
}

// groups returns the compactable blocks per compaction group.
func (p *pass) groups() map[groupID][]*block.Meta {
	out := map[groupID][]*block.Meta{}
	for _, b := range p.blocks {
		if b.live() && !b.noCompact {
			k := groupOf(b.meta)
			out[k] = append(out[k], b.meta)
		}
	}
	return out
}

// compactGroups compacts each group until its plan is empty.
func (p *pass) compactGroups(ctx context.Context) error {
	groups := p.groups()
	keys := slices.SortedFunc(maps.Keys(groups), groupID.compare)
	ranges := p.c.cfg.ranges()
	for _, k := range keys {
		start := time.Now()
		done := 0
		for {
			if err := ctx.Err(); err != nil {
				return err
			}
			plan := Plan(p.groups()[k], ranges)
			if plan == nil {
				break
			}
			if err := p.compactPlan(ctx, k, plan); err != nil {
				var bad *badBlocksError
				if errors.As(err, &bad) {
					continue // marked no-compact; plan again without them
				}
				return fmt.Errorf("group %s: %w", k, err)
			}
			done++
		}
		if done > 0 {
			p.logger.Info("group compacted", "group", k, "compactions", done, "duration", time.Since(start).Round(time.Millisecond))
		}
	}
	return nil
}

// badBlocksError says a plan's blocks failed to read and were marked no-compact.
type badBlocksError struct{ ids []ulid.ULID }

func (e *badBlocksError) Error() string { return fmt.Sprintf("blocks %v fail to read", e.ids) }

// compactPlan compacts the planned blocks of a group into one block in the
// bucket and marks them for deletion: download (downloadPlan), merge
// (mergePlan), upload with the result's meta (resultDownsample), mark.
func (p *pass) compactPlan(ctx context.Context, group groupID, plan []*block.Meta) error {
	start := time.Now()
	work := filepath.Join(p.c.dir, p.tenant)
	if err := os.RemoveAll(work); err != nil {
		return err
	}
	if err := os.MkdirAll(work, 0o755); err != nil {
		return err
	}
	defer os.RemoveAll(work)

	ids := make([]ulid.ULID, len(plan))
	var srcBytes int64
	for i, m := range plan {
		ids[i] = m.ULID
		srcBytes += m.BucketBytes()
	}
	mint, maxt := plan[0].MinTime, plan[0].MaxTime
	for _, m := range plan {
		mint, maxt = min(mint, m.MinTime), max(maxt, m.MaxTime)
	}
	log := p.logger.With("group", group, "blocks", len(plan), "mint", time.UnixMilli(mint).UTC().Format(time.RFC3339), "maxt", time.UnixMilli(maxt).UTC().Format(time.RFC3339))
	log.Info("compacting", "sources", ids, "bytes", srcBytes)

	dirs, err := p.downloadPlan(ctx, work, plan)
	if err != nil {
		return err
	}
	res, err := p.mergePlan(ctx, log, start, work, plan, dirs)
	if err != nil {
		return err
	}
	if p.c.afterCompact != nil {
		p.c.afterCompact(work)
	}
	if res == (ulid.ULID{}) { // no samples at all: nothing replaces them
		for _, m := range plan {
			if err := p.markDeleted(ctx, p.blocks[m.ULID], "compacted", "compacted: no samples"); err != nil {
				return err
			}
		}
		return nil
	}
	types, err := p.typesOf(ctx, plan)
	if err != nil {
		return err
	}
	meta, resBytes, err := p.uploadResult(ctx, filepath.Join(work, res.String()), plan[0].GPUStore.Labels, resultDownsample(plan), block.SourceCompactor, sourceRanges(plan), types)
	if err != nil {
		return err
	}
	bm := meta.BlockMeta
	for _, m := range plan {
		if err := p.markDeleted(ctx, p.blocks[m.ULID], "compacted", fmt.Sprintf("compacted into %s", bm.ULID)); err != nil {
			return err
		}
	}
	took := time.Since(start)
	p.c.m.compactions.WithLabelValues(p.tenant).Inc()
	p.c.m.compactedBlocks.WithLabelValues(p.tenant).Add(float64(len(plan)))
	p.c.m.readBytes.WithLabelValues(p.tenant).Add(float64(srcBytes))
	p.c.m.writtenBytes.WithLabelValues(p.tenant).Add(float64(resBytes))
	p.c.m.samples.WithLabelValues(p.tenant).Add(float64(bm.Stats.NumSamples))
	p.c.m.duration.Observe(took.Seconds())
	log.Info("compacted", "block", bm.ULID, "level", bm.Compaction.Level, "samples", bm.Stats.NumSamples, "series", bm.Stats.NumSeries, "bytes", resBytes, "duration", took.Round(time.Millisecond))
	return nil
}

// mergePlan merges the plan's downloaded blocks (dirs) into one block in
// work with the TSDB's leveled compactor and the compacting chunk-series
// merger (vertical compaction), and returns its ULID (zero: the blocks held
// no sample). When the merge fails, each block is read whole and those that
// fail are marked no-compact (a *badBlocksError).
func (p *pass) mergePlan(ctx context.Context, log *slog.Logger, start time.Time, work string, plan []*block.Meta, dirs []string) (ulid.ULID, error) {
	lc, err := tsdb.NewLeveledCompactorWithOptions(ctx, nil, p.logger, p.c.cfg.ranges(), chunkenc.NewPool(), tsdb.LeveledCompactorOptions{
		MergeFunc:                   storage.NewCompactingChunkSeriesMerger(storage.ChainedSeriesMerge),
		EnableOverlappingCompaction: true,
	})
	if err != nil {
		return ulid.ULID{}, err
	}
	stopProgress := p.progress(log, start)
	res, err := lc.Compact(work, dirs, nil)
	stopProgress()
	if err == nil {
		if len(res) == 0 {
			return ulid.ULID{}, nil
		}
		return res[0], nil
	}
	if ctx.Err() != nil {
		return ulid.ULID{}, ctx.Err()
	}
	// Which block is at fault? Read each one whole; a block that fails
	// is marked no-compact and the group goes on without it.
	var bad []ulid.ULID
	for i, d := range dirs {
		if verr := verifyBlock(d); verr != nil {
			if err := p.markNoCompact(ctx, plan[i].ULID, "block-read-failure", verr); err != nil {
				return ulid.ULID{}, err
			}
			bad = append(bad, plan[i].ULID)
		}
	}
	if len(bad) > 0 {
		return ulid.ULID{}, &badBlocksError{ids: bad}
	}
	ids := make([]ulid.ULID, len(plan))
	for i, m := range plan {
		ids[i] = m.ULID
	}
	return ulid.ULID{}, fmt.Errorf("compact %v: %w", ids, err)
}

// progress logs every 30s while a compaction runs.
func (p *pass) progress(log *slog.Logger, start time.Time) func() {
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(30 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				log.Info("compaction in progress", "elapsed", time.Since(start).Round(time.Second))
			}
		}
	}()
	return func() { close(done) }
}
