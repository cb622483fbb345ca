package compact

import (
	"cmp"
	"slices"

	"github.com/gpustore/gpustore/pkg/block"
)

// Plan returns the next blocks of one group to compact into one, or nil when
// there is nothing to do. metas are the group's blocks that may be compacted
// (complete, not marked for deletion or no-compact); ranges are the levels in
// milliseconds, smallest (the receivers' block duration) first.
//
// The rules are those of the Prometheus TSDB's own planner, on metas in the
// bucket instead of directories on disk:
//  1. Blocks that overlap in time (out-of-order data, two receivers holding
//     the same series, a block uploaded twice) are merged first, all of a
//     run of transitively overlapping blocks at once. Overlaps never stop
//     compaction.
//  2. Otherwise, for each level above the first, smallest first: the oldest
//     time-aligned range [k·r, (k+1)·r) that holds more than one block, all
//     of them inside it, and that is finished: its blocks span the whole
//     range, or a block of the group starts at or after its end (so the
//     receivers have moved on). The newest range, which may still receive
//     blocks, is left alone.
func Plan(metas []*block.Meta, ranges []int64) []*block.Meta {
	if len(metas) < 2 {
		return nil
	}
	ms := slices.Clone(metas)
	slices.SortFunc(ms, func(a, b *block.Meta) int {
		if c := cmp.Compare(a.MinTime, b.MinTime); c != 0 {
			return c
		}
		return a.ULID.Compare(b.ULID)
	})
	if o := overlapping(ms); o != nil {
		return o
	}
	newestMin := ms[0].MinTime
	for _, m := range ms {
		newestMin = max(newestMin, m.MinTime)
	}
	for _, r := range ranges[1:] {
		for _, g := range splitByRange(ms, r) {
			if len(g) < 2 {
				continue
			}
			start := floorDiv(g[0].MinTime, r) * r
			end := start + r
			gMin, gMax := g[0].MinTime, g[0].MaxTime
			for _, m := range g {
				gMin, gMax = min(gMin, m.MinTime), max(gMax, m.MaxTime)
			}
			if (gMin == start && gMax == end) || end <= newestMin {
				return g
			}
		}
	}
	return nil
}

// overlapping returns the first run of blocks (sorted by MinTime) whose
// time ranges overlap, or nil. Ranges are half-open: [MinTime, MaxTime).
func overlapping(ms []*block.Meta) []*block.Meta {
	var run []*block.Meta
	var runMax int64
	for _, m := range ms {
		if len(run) > 0 && m.MinTime < runMax {
			run = append(run, m)
			runMax = max(runMax, m.MaxTime)
			continue
		}
		if len(run) > 1 {
			return run
		}
		run = []*block.Meta{m}
		runMax = m.MaxTime
	}
	if len(run) > 1 {
		return run
	}
	return nil
}

// splitByRange groups blocks (sorted by MinTime) by the aligned range of
// length r they fall into wholly; blocks as long as r or crossing a range
// boundary are left out.
func splitByRange(ms []*block.Meta, r int64) [][]*block.Meta {
	var out [][]*block.Meta
	var cur []*block.Meta
	var curStart int64
	for _, m := range ms {
		start := floorDiv(m.MinTime, r) * r
		if m.MaxTime > start+r || m.MaxTime-m.MinTime >= r {
			continue
		}
		if len(cur) > 0 && start != curStart {
			out = append(out, cur)
			cur = nil
		}
		curStart = start
		cur = append(cur, m)
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}
