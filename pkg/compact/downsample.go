package compact

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/tsdb"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/downsample"
	"github.com/gpustore/gpustore/pkg/storage/bucketindex"
)

// The downsampling step of a pass: raw → 5m and 5m → 1h, with pkg/downsample
// writing ordinary TSDB blocks that the rest of the pass (compaction,
// retention, the bucket index) treats like raw ones, in their own groups.
//
// A block is downsampled once every one of its compaction sources is a
// source of a live block of the next resolution in the same group ("covered").
// Coverage is by sources, not time, so a raw block that vertical compaction
// grew with late samples is downsampled again; the two overlapping results
// are merged by the next compaction of the coarser group, the newer (more
// sources) replacing the older.
//
// Only finished blocks are downsampled: a block of the group starts at or
// after the block's end (the receivers have moved on), which also guarantees
// that the raw sample at exactly the block's end, which belongs to the 5m
// window ending there, is in the bucket. There is no minimum block length
// (unlike Thanos' 40 h): every raw sample is downsampled before raw retention
// may delete it (mayDelete).

// downsampleSteps are the resolutions written, each from the previous one.
var downsampleSteps = []struct{ from, to int64 }{
	{block.ResolutionRaw, downsample.Res5m},
	{downsample.Res5m, downsample.Res1h},
}

// downsampleAll runs both steps over every group until nothing is left.
func (p *pass) downsampleAll(ctx context.Context) error {
	if !p.c.cfg.Downsample {
		return nil
	}
	for _, step := range downsampleSteps {
		for _, m := range p.toDownsample(step.from, step.to) {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := p.downsampleBlock(ctx, m, step.to); err != nil {
				return fmt.Errorf("downsample block %s to %s: %w", m.ULID, downsample.ResolutionName(step.to), err)
			}
		}
	}
	return nil
}

// covered returns the sources of the live blocks of compaction group g.
func (p *pass) covered(g groupID) map[ulid.ULID]struct{} {
	out := map[ulid.ULID]struct{}{}
	for _, b := range p.blocks {
		if b.live() && groupOf(b.meta) == g {
			for _, s := range b.meta.SourceIDs() {
				out[s] = struct{}{}
			}
		}
	}
	return out
}

// isCovered says whether every source of m is a source of a block in one
// of covs (or m's downsampling wrote nothing: it had no sample to keep).
func (p *pass) isCovered(m *block.Meta, covs ...map[ulid.ULID]struct{}) bool {
	p.c.mtx.Lock()
	_, empty := p.c.empty[m.ULID]
	p.c.mtx.Unlock()
	if empty {
		return true
	}
	for _, s := range m.SourceIDs() {
		if !slices.ContainsFunc(covs, func(cov map[ulid.ULID]struct{}) bool { _, ok := cov[s]; return ok }) {
			return false
		}
	}
	return true
}

// toDownsample returns the finished, compactable blocks of resolution from
// that are not covered at resolution to, oldest first.
func (p *pass) toDownsample(from, to int64) []*block.Meta {
	var out []*block.Meta
	for _, metas := range p.groups() {
		if metas[0].GPUStore.Downsample.Resolution != from {
			continue
		}
		cov := p.covered(groupID{res: to, labels: block.GroupKey(metas[0])})
		for _, m := range metas {
			if p.isCovered(m, cov) {
				continue
			}
			finished := false
			for _, o := range metas {
				finished = finished || o.MinTime >= m.MaxTime
			}
			if finished {
				out = append(out, m)
			}
		}
	}
	slices.SortFunc(out, func(a, b *block.Meta) int {
		return cmp.Or(cmp.Compare(a.MinTime, b.MinTime), a.ULID.Compare(b.ULID))
	})
	return out
}

// downsampleBlock writes the block of resolution res that stands for m's
// samples and uploads it. It reads every live block of m's group that holds
// samples of the windows m touches (raw: (mint, maxt], the sample at maxt
// sitting in the next block), so that windows split between blocks are
// whole.
func (p *pass) downsampleBlock(ctx context.Context, m *block.Meta, res int64) error {
	start := time.Now()
	mint := floorDiv(m.MinTime, res) * res
	maxt := -floorDiv(-m.MaxTime, res) * res
	lo, hi := mint+1, maxt+1 // raw samples in (mint, maxt]
	if m.GPUStore.Downsample.Resolution != block.ResolutionRaw {
		lo, hi = mint, maxt // downsampled points are stored 1 ms before the time they stand for
	}
	var inputs []*block.Meta
	g := groupOf(m)
	for _, b := range p.blocks {
		if b.live() && !b.noCompact && groupOf(b.meta) == g && b.meta.MinTime < hi && b.meta.MaxTime > lo {
			inputs = append(inputs, b.meta)
		}
	}
	// A block another input replaces (same resolution, sources a subset:
	// the 5m block of a raw block that vertical compaction has since grown
	// with an uploaded or late block, beside the 5m block of the grown one,
	// until the next pass marks it) holds part of the same windows' samples:
	// merged with its replacement point by point, either window's aggregate
	// could win, and the 1h block would lose the new samples.
	replaced := bucketindex.Replaced(inputs)
	inputs = slices.DeleteFunc(inputs, func(b *block.Meta) bool { _, ok := replaced[b.ULID]; return ok })
	log := p.logger.With("block", m.ULID, "resolution", downsample.ResolutionName(res),
		"mint", time.UnixMilli(mint).UTC().Format(time.RFC3339), "maxt", time.UnixMilli(maxt).UTC().Format(time.RFC3339), "inputs", len(inputs))
	log.Info("downsampling")

	work := filepath.Join(p.c.dir, p.tenant)
	if err := os.RemoveAll(work); err != nil {
		return err
	}
	defer os.RemoveAll(work)
	readers := make([]tsdb.BlockReader, 0, len(inputs))
	defer func() {
		for _, r := range readers {
			_ = r.(*tsdb.Block).Close()
		}
	}()
	for _, in := range inputs {
		dir := filepath.Join(work, in.ULID.String())
		if err := p.download(ctx, in, dir); err != nil {
			return err
		}
		b, err := tsdb.OpenBlock(nil, dir, nil, nil)
		if err != nil {
			return fmt.Errorf("open %s: %w", in.ULID, err)
		}
		readers = append(readers, b)
	}
	out := filepath.Join(work, "out")
	dcfg := downsample.Config{
		SourceResolution: m.GPUStore.Downsample.Resolution, Resolution: res,
		Mint: mint, Maxt: maxt, Dir: out, Tenant: p.tenant, Sources: m.SourceIDs(),
		Fold: p.c.fold, Logger: p.logger,
	}
	dcfg.SourceKeptCounts = true
	for _, in := range inputs {
		dcfg.Folded = append(dcfg.Folded, in.GPUStore.Downsample.FoldedLabels...)
		dcfg.SourceKeptCounts = dcfg.SourceKeptCounts && in.GPUStore.Downsample.KeptCounts
	}
	if dcfg.SourceResolution == block.ResolutionRaw {
		// Counters are told from gauges by the tenant's metadata, which the
		// receivers shipped beside their blocks; names where it is missing.
		types, err := p.typesOf(ctx, inputs)
		if err != nil {
			return err
		}
		dcfg.Types = types.Lookup
	}
	id, st, err := downsample.Downsample(ctx, readers, dcfg)
	if err != nil {
		return err
	}
	p.c.m.downsampleSamples.WithLabelValues(p.tenant, "read").Add(float64(st.InSamples))
	if id == (ulid.ULID{}) {
		// No sample in m's windows (a block holding only a sample at its
		// very start, which belongs to the window before): nothing is lost
		// without a block. Remembered so that m is not read again each pass.
		log.Info("nothing to downsample: no sample in the block's windows")
		p.c.mtx.Lock()
		p.c.empty[m.ULID] = struct{}{}
		p.c.mtx.Unlock()
		return nil
	}
	ds := block.Downsample{Resolution: res, FoldedLabels: dcfg.FoldedLabels(), KeptCounts: dcfg.KeptCounts()}
	_, outBytes, err := p.uploadResult(ctx, filepath.Join(out, id.String()), m.GPUStore.Labels, ds, downsample.Source, nil, nil)
	if err != nil {
		return err
	}
	resName := downsample.ResolutionName(res)
	p.c.m.downsampled.WithLabelValues(p.tenant, resName).Inc()
	p.c.m.downsampleSamples.WithLabelValues(p.tenant, "written").Add(float64(st.OutSamples))
	p.c.m.downsampleBytes.WithLabelValues(p.tenant, resName).Add(float64(outBytes))
	p.c.m.downsampleDuration.Observe(time.Since(start).Seconds())
	log.Info("downsampled", "result", id, "in_samples", st.InSamples, "out_samples", st.OutSamples,
		"bytes", outBytes, "duration", time.Since(start).Round(time.Millisecond))
	return nil
}

// mayDelete says whether retention may delete m: a raw block (with
// downsampling on) only once its samples are in the bucket at 5m or 1h, a 5m
// block only once they are at 1h, whatever the retention flags say (and
// with downsampling off too: 5m data is never the last copy of its hours
// and then deleted). So no time range a coarser resolution does not hold
// yet is left without data: the newest 5m block of a tenant whose receivers
// stopped is never downsampled to 1h (no newer block follows it) and stays.
func (p *pass) mayDelete(m *block.Meta) bool {
	switch m.GPUStore.Downsample.Resolution {
	case block.ResolutionRaw:
		return !p.c.cfg.Downsample || p.isCovered(m, p.coverage(m, downsample.Res5m), p.coverage(m, downsample.Res1h))
	case downsample.Res5m:
		return p.isCovered(m, p.coverage(m, downsample.Res1h))
	}
	return true
}

// coverage is what covered returns for m's group at resolution res,
// computed once per group and pass (retention asks for every block).
func (p *pass) coverage(m *block.Meta, res int64) map[ulid.ULID]struct{} {
	key := groupID{res: res, labels: block.GroupKey(m)}
	cov, ok := p.cov[key]
	if !ok {
		cov = p.covered(key)
		if p.cov == nil {
			p.cov = map[groupID]map[ulid.ULID]struct{}{}
		}
		p.cov[key] = cov
	}
	return cov
}
