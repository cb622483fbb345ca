package bucketstore

import (
	"fmt"
	"slices"
	"time"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/downsample"
)

// A segment is a time range [from, to) of a Select served by the blocks of
// one resolution.
type segment struct {
	res      int64
	from, to int64 // half-open, in stored time
	blocks   []*bucketBlock
}

// span is a half-open time range.
type span struct{ from, to int64 }

// plan splits [mint, maxt] into segments, each read at one resolution: the
// coarsest resolution at most maxRes that has a block covering the whole
// segment; where none does, the finest coarser one (raw past its retention:
// coarser data answers rather than nothing); raw in forcedRaw, the range the
// receiver's local TSDB serves (downsample.WithLocalFrom). bs are the
// candidate blocks (any resolution).
func plan(bs []*bucketBlock, mint, maxt, maxRes int64, forcedRaw []span) []segment {
	end := maxt + 1 // half-open
	if end < maxt { // maxt is math.MaxInt64
		end = maxt
	}
	cuts := []int64{mint, end}
	for _, b := range bs {
		for _, t := range []int64{b.meta.MinTime, b.meta.MaxTime} {
			if t > mint && t < end {
				cuts = append(cuts, t)
			}
		}
	}
	for _, f := range forcedRaw {
		for _, t := range []int64{f.from, f.to} {
			if t > mint && t < end {
				cuts = append(cuts, t)
			}
		}
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)

	var out []segment
	for i := 0; i+1 < len(cuts); i++ {
		from, to := cuts[i], cuts[i+1]
		res := chooseResolution(bs, from, to, maxRes, forcedRaw)
		if n := len(out); n > 0 && out[n-1].res == res && out[n-1].to == from {
			out[n-1].to = to
			continue
		}
		out = append(out, segment{res: res, from: from, to: to})
	}
	for i := range out {
		s := &out[i]
		for _, b := range bs {
			if b.meta.GPUStore.Downsample.Resolution == s.res && b.meta.MinTime < s.to && b.meta.MaxTime > s.from {
				s.blocks = append(s.blocks, b)
			}
		}
	}
	return out
}

// chooseResolution picks the resolution of [from, to); see plan.
func chooseResolution(bs []*bucketBlock, from, to, maxRes int64, forcedRaw []span) int64 {
	for _, f := range forcedRaw {
		if f.from < to && f.to > from {
			return block.ResolutionRaw
		}
	}
	covered := map[int64]bool{}
	for _, b := range bs {
		if b.meta.MinTime <= from && b.meta.MaxTime >= to {
			covered[b.meta.GPUStore.Downsample.Resolution] = true
		}
	}
	best, fallback := int64(-1), int64(-1)
	for r := range covered {
		if r <= maxRes && r > best {
			best = r
		}
		if r > maxRes && (fallback < 0 || r < fallback) {
			fallback = r
		}
	}
	switch {
	case best >= 0:
		return best
	case fallback >= 0:
		return fallback
	}
	return block.ResolutionRaw // nothing here: raw reads nothing
}

// describe is the info annotation naming the downsampled segments of a
// Select, so that a user sees which resolution served the answer.
func describe(segs []segment) string {
	var parts []string
	for _, s := range segs {
		if s.res == block.ResolutionRaw || len(s.blocks) == 0 {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s data for %s–%s", downsample.ResolutionName(s.res),
			time.UnixMilli(s.from).UTC().Format(time.RFC3339), time.UnixMilli(s.to).UTC().Format(time.RFC3339)))
	}
	if len(parts) == 0 {
		return ""
	}
	return fmt.Sprintf("gpustore: served from downsampled blocks: %v", parts)
}
