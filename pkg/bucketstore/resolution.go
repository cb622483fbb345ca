package bucketstore

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/prometheus/prometheus/storage"

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

// stepWindows are the times a range function's select reads when it is
// evaluated at its hints' steps (downsample.WithSelectsAtSteps): the
// windows [start + k·step, start + k·step + rng] for k ≥ 0 while the window
// starts before end (closed, and a millisecond wider at the start, for the
// downsampled points stored a millisecond before the raw time they stand
// for: a chunk kept by mistake costs a read, one skipped by mistake a wrong
// answer).
type stepWindows struct{ start, end, step, rng int64 }

// sparseWindows returns the windows of a select, or nil when it reads its
// whole range (no step, no range, or steps no longer than the range).
func sparseWindows(ctx context.Context, h *storage.SelectHints) *stepWindows {
	if h == nil || h.Range <= 0 || h.Step <= h.Range || !downsample.SelectsAtSteps(ctx) {
		return nil
	}
	return &stepWindows{start: h.Start - 1, end: h.End, step: h.Step, rng: h.Range + 1}
}

// overlaps says whether [mint, maxt] meets a window.
func (w *stepWindows) overlaps(mint, maxt int64) bool {
	// The first window that ends at or after mint.
	k := int64(0)
	if d := mint - w.start - w.rng; d > 0 {
		k = (d + w.step - 1) / w.step
	}
	from := w.start + k*w.step
	return from <= w.end && from <= maxt
}

type needKey struct{}

func withNeededWindows(ctx context.Context, w *stepWindows) context.Context {
	if w == nil {
		return ctx
	}
	return context.WithValue(ctx, needKey{}, w)
}

func neededWindows(ctx context.Context) *stepWindows {
	w, _ := ctx.Value(needKey{}).(*stepWindows)
	return w
}
