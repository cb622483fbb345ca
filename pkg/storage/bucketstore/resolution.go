package bucketstore

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/storage"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/downsample"
)

// A segment is a time range of a Select read at one resolution, from one
// group's blocks (blocks with the same external labels: one receiver's, or
// several sharing them). Its range [from, to) is in raw time, the time a
// point stands for and is read at: a downsampled point stored at t stands
// for raw time t+1 (downsample's window.go), so a block of resolution R
// over [A, B) holds raw time [A+1, B+1), and a raw sample on the edge of a
// downsampled block is read once, from one side.
type segment struct {
	res      int64
	from, to int64
	// blocks are the group's blocks of res over the segment and its finer
	// blocks whose samples those do not hold (a no-compact block beside the
	// block its neighbours were compacted into, a block uploaded late).
	blocks []*bucketBlock
	group  []*bucketBlock
	// approx says why res's windows do not fit the select's ranges ("":
	// they do; downsample.WindowFit).
	approx string
	// shift, for a resolution whose windows fit the ranges only moved
	// (downsample.FitsShifted), moves each evaluation's points to it; it
	// applies to every block the segment reads.
	shift *downsample.StepShift
}

// span is a half-open time range.
type span struct{ from, to int64 }

// covered is the raw time a block's points stand for.
func covered(m *block.Meta) span {
	if m.GPUStore.Downsample.Resolution == block.ResolutionRaw {
		return span{m.MinTime, m.MaxTime}
	}
	return span{m.MinTime + 1, m.MaxTime + 1}
}

func (s span) overlaps(o span) bool { return s.from < o.to && s.to > o.from }

// planner chooses the resolution of each time range of a Select.
type planner struct {
	// maxRes is the coarsest resolution the select may read
	// (downsample.MaxResolution).
	maxRes int64
	// fit says how the windows of a resolution sit in the select's ranges
	// (downsample.WindowFit).
	fit func(res int64) downsample.Fit
	// forcedRaw is raw time read raw: the caller serves it raw itself
	// (readopts.ReadOptions.LocalFrom).
	forcedRaw []span
	hints     *storage.SelectHints
}

func newPlanner(atSteps bool, h *storage.SelectHints, maxRes int64, forcedRaw []span) planner {
	return planner{maxRes: maxRes, forcedRaw: forcedRaw, hints: h,
		fit: func(res int64) downsample.Fit { return downsample.WindowFit(atSteps, h, res) }}
}

// lead is how much earlier than the select's range a plan begins: a
// window, when a resolution's windows fit the ranges only moved (the range
// of the first evaluation ends at the window end before it).
func (p planner) lead() int64 {
	for _, r := range []int64{downsample.Res1h, downsample.Res5m} {
		if p.fit(r) == downsample.FitsShifted {
			return r
		}
	}
	return 0
}

// plan splits the time [mint, maxt] of a select into segments, per group:
// coverage is judged per group, so a group whose hours are downsampled
// never hides another's raw series, and per block (segment.blocks).
func (p planner) plan(bs []*bucketBlock, mint, maxt int64) []segment {
	end := maxt + 1 // half-open
	if end < maxt { // maxt is math.MaxInt64
		end = maxt
	}
	mint -= p.lead()
	var keys []string
	groups := map[string][]*bucketBlock{}
	for _, b := range bs {
		k := b.group
		if groups[k] == nil {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], b)
	}
	var out []segment
	for _, k := range keys {
		out = append(out, p.planGroup(groups[k], mint, end)...)
	}
	return out
}

// planGroup plans one group's blocks over [from, to): cut at every block's
// edge, each piece read at the resolution choose picks, boundaries moved
// onto the coarser side's window grid (snap), and the blocks of each
// segment listed.
func (p planner) planGroup(g []*bucketBlock, from, to int64) []segment {
	cuts := []int64{from, to}
	add := func(s span) {
		for _, t := range []int64{s.from, s.to} {
			if t > from && t < to {
				cuts = append(cuts, t)
			}
		}
	}
	for _, b := range g {
		add(covered(b.meta))
	}
	for _, f := range p.forcedRaw {
		add(f)
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	var segs []segment
	for i := 0; i+1 < len(cuts); i++ {
		res, fit := p.choose(g, span{cuts[i], cuts[i+1]})
		if n := len(segs); n > 0 && segs[n-1].res == res {
			segs[n-1].to = cuts[i+1]
			continue
		}
		sg := segment{res: res, from: cuts[i], to: cuts[i+1], group: g}
		if fit != downsample.Fits {
			sg.approx = downsample.GridReason(fit)
		}
		if fit == downsample.FitsShifted {
			sg.shift = downsample.NewStepShift(p.hints, res)
		}
		segs = append(segs, sg)
	}
	segs = p.snap(g, segs)
	for i := range segs {
		segs[i].blocks = blocksOf(g, segs[i])
	}
	return segs
}

// choose picks the resolution of a time range: the coarsest at most maxRes
// that a block of the group covers and whose windows fit the select's
// ranges (downsample.Fits, FitsNearly or FitsShifted); else the finest
// coarser one that fits (raw past its retention, an exact answer from 5m
// data); else the finest covering one, approximate (and said so); raw where
// the local TSDB serves the range, or where no block covers it (raw reads
// what there is). It returns how the chosen resolution fits.
func (p planner) choose(g []*bucketBlock, s span) (res int64, fit downsample.Fit) {
	if p.forced(s) {
		return block.ResolutionRaw, downsample.Fits
	}
	var have []int64
	for _, b := range g {
		if c := covered(b.meta); c.from <= s.from && c.to >= s.to {
			have = append(have, b.meta.GPUStore.Downsample.Resolution)
		}
	}
	if h, ok := rawHull(g); ok && h.from <= s.from && h.to >= s.to {
		have = append(have, block.ResolutionRaw)
	}
	if len(have) == 0 {
		return block.ResolutionRaw, downsample.Fits
	}
	slices.Sort(have)
	have = slices.Compact(have)
	fits := func(r int64) bool { return p.fit(r) != downsample.FitsNot }
	res = -1
	for _, r := range have { // ascending: the last that qualifies is the coarsest
		if r <= p.maxRes && fits(r) {
			res = r
		}
	}
	for _, r := range have {
		if res < 0 && r > p.maxRes && fits(r) {
			res = r
		}
	}
	if res < 0 {
		res = have[0]
	}
	return res, p.fit(res)
}

// rawHull is the time from the start of the group's first raw block to the
// end of its last. A gap between two raw blocks holds no raw sample: blocks
// written by Prometheus' block writer (promtool's, a snapshot's, imported
// ones, and what the compactor makes of them) end a millisecond after their
// last sample, off the grid, and the coarser windows over such a gap
// aggregate the raw blocks' own samples on both sides. So it is raw time,
// read raw (it reads nothing), never filled from coarser blocks; only raw
// time before the first raw block (past raw retention) is.
func rawHull(g []*bucketBlock) (span, bool) {
	h, ok := span{math.MaxInt64, math.MinInt64}, false
	for _, b := range g {
		if b.meta.GPUStore.Downsample.Resolution == block.ResolutionRaw {
			c := covered(b.meta)
			h.from, h.to, ok = min(h.from, c.from), max(h.to, c.to), true
		}
	}
	return h, ok
}

// forced says whether the local TSDB serves part of s.
func (p planner) forced(s span) bool {
	return slices.ContainsFunc(p.forcedRaw, s.overlaps)
}

// snap moves each boundary between two segments onto the window grid of
// the coarser side (raw times k·R + 1), so that no window is read in part:
// a downsampled segment that ended inside a window would hold the whole
// window's aggregate while the finer side read some of the same samples
// (the local TSDB's oldest time, a receiver's lookback, are anywhere). The
// straddled window goes to the finer side, unless the finer side comes
// after it, is not the local TSDB's range (downsampled points beside the
// samples it serves would count them twice) and its blocks do not hold the
// window's samples before the boundary: where raw retention ended the
// raw blocks begin at the edge, and the raw sample at exactly the edge
// belongs to the 5m window that ends there, which only the 5m blocks still
// hold (handing it to the raw side lost that window from every range over
// it). A raw block that holds any of the window before the boundary keeps
// it on the raw side: blocks written by Prometheus' block writer end a
// millisecond after their last sample, not on the grid, and the 5m window
// beside such an edge holds samples the raw blocks hold too. Where the
// finer side comes first (raw data, then only downsampled data: no newer
// raw data was written), the window's samples before the boundary are all
// the finer side's and the coarser window holds no more.
// A boundary beside a moved segment (segment.shift) goes between two
// evaluations instead (snapBetween). Segments left empty are dropped.
func (p planner) snap(g []*bucketBlock, segs []segment) []segment {
	for i := 1; i < len(segs); i++ {
		l, r := &segs[i-1], &segs[i]
		if l.shift != nil || r.shift != nil {
			p.snapBetween(g, l, r)
			continue
		}
		res := max(l.res, r.res)
		off := downsampleGridOffset(r.from, res)
		if res == block.ResolutionRaw || off == 0 {
			continue
		}
		down, up := r.from-off, r.from+res-off // the grid points around the boundary
		b := down                              // the left segment is coarser: it ends earlier
		switch {
		case r.res == res:
			b = up // the right one is: it starts later
		case !p.forced(span{r.from, r.to}) && !overlappedBy(g, r.res, span{down, r.from}) && coveredBy(g, l.res, span{r.from, up}) &&
			!finerHoldsAll(g, r.res, l.res, span{down, up}):
			b = up // the finer right one holds none of the window's start
		}
		b = min(max(b, l.from), r.to)
		l.to, r.from = b, b
	}
	return slices.DeleteFunc(segs, func(s segment) bool { return s.from >= s.to })
}

// snapBetween moves the boundary between l and r, one of them moved
// (segment.shift), out of the span of the evaluation it falls in (the
// range it reads and the one it is moved to), so that each evaluation
// reads one side: the evaluation goes to the side whose blocks cover its
// span, the left first (raw data there, typically), never into the local
// TSDB's range from a downsampled side.
func (p planner) snapBetween(g []*bucketBlock, l, r *segment) {
	shift := l.shift
	if r.shift != nil && (shift == nil || r.res > l.res) {
		shift = r.shift
	}
	from, to, ok := shift.Straddled(r.from)
	if !ok {
		return
	}
	takes := func(s *segment, sp span) bool {
		return coveredBy(g, s.res, sp) && (s.res == block.ResolutionRaw || !p.forced(sp))
	}
	switch {
	case to <= r.to && takes(l, span{r.from, to}):
		l.to, r.from = to, to
	case from >= l.from && takes(r, span{from, r.from}):
		l.to, r.from = from, from
	}
}

// coveredBy says whether the group's blocks of res cover sp together.
// finerHoldsAll says whether the blocks of resolution finer in g hold every
// source of the blocks of resolution coarse over sp: then the coarser
// windows there hold no sample the finer blocks lack. So it is where a
// group's data begins (its first raw block starts at its first sample,
// inside a window whose 5m block starts on the grid before it), not where
// raw retention ended (the 5m blocks there were made from raw blocks since
// deleted).
func finerHoldsAll(g []*bucketBlock, finer, coarse int64, sp span) bool {
	held := map[ulid.ULID]bool{}
	for _, b := range g {
		if b.meta.GPUStore.Downsample.Resolution == finer {
			for _, id := range b.meta.SourceIDs() {
				held[id] = true
			}
		}
	}
	found := false
	for _, b := range g {
		if b.meta.GPUStore.Downsample.Resolution != coarse || !covered(b.meta).overlaps(sp) {
			continue
		}
		found = true
		for _, id := range b.meta.SourceIDs() {
			if !held[id] {
				return false
			}
		}
	}
	return found
}

// overlappedBy says whether a block of res in g holds any of sp's time.
func overlappedBy(g []*bucketBlock, res int64, sp span) bool {
	return slices.ContainsFunc(g, func(b *bucketBlock) bool {
		return b.meta.GPUStore.Downsample.Resolution == res && covered(b.meta).overlaps(sp)
	})
}

func coveredBy(g []*bucketBlock, res int64, sp span) bool {
	var cs []span
	for _, b := range g {
		if b.meta.GPUStore.Downsample.Resolution == res {
			cs = append(cs, covered(b.meta))
		}
	}
	slices.SortFunc(cs, func(a, b span) int { return cmp.Compare(a.from, b.from) })
	at := sp.from
	for _, c := range cs {
		if c.from <= at && c.to > at {
			at = c.to
		}
	}
	return at >= sp.to
}

// downsampleGridOffset is how far raw time t is past the start of the
// window of res that holds it (0: t starts a window).
func downsampleGridOffset(t, res int64) int64 {
	m := (t - 1) % res
	if m < 0 {
		m += res
	}
	return m
}

// blocksOf lists the blocks a segment reads: the group's blocks of its
// resolution that overlap it, and the finer ones that overlap it whose
// samples those do not hold. A block of resolution R holds the samples of
// its compaction sources and of its parents (the blocks it was downsampled
// from: any block overlapping its windows then), and the raw sample at its
// very end, which the downsampler reads from the raw block starting there;
// a no-compact block, never an input, and a block of another group are not
// held.
func blocksOf(g []*bucketBlock, s segment) []*bucketBlock {
	sp := span{s.from, s.to}
	var out []*bucketBlock
	held := map[ulid.ULID]bool{}
	ends := map[int64]bool{} // where the blocks of R end
	for _, b := range g {
		if b.meta.GPUStore.Downsample.Resolution == s.res && covered(b.meta).overlaps(sp) {
			out = append(out, b)
			for _, id := range b.meta.Compaction.Sources {
				held[id] = true
			}
			for _, p := range b.meta.Compaction.Parents {
				held[p.ULID] = true
			}
			ends[b.meta.MaxTime] = true
		}
	}
	if s.res == block.ResolutionRaw {
		return out
	}
	for _, b := range g {
		if b.meta.GPUStore.Downsample.Resolution >= s.res || !covered(b.meta).overlaps(sp) || heldIn(b.meta, held, sp) {
			continue
		}
		if c := covered(b.meta); ends[c.from] && max(c.from, sp.from)+1 >= min(c.to, sp.to) {
			continue // only the sample at the end of a block of R is in the segment
		}
		out = append(out, b)
	}
	return out
}

// heldIn says whether the samples of m within sp are held by the blocks
// whose sources and parents are held: m itself, or each of its sources
// that overlaps sp; a block whose sources' ranges are unknown is held when
// any of its sources is (it was compacted with them).
func heldIn(m *block.Meta, held map[ulid.ULID]bool, sp span) bool {
	if held[m.ULID] {
		return true
	}
	srcs := m.Sources()
	if srcs == nil {
		return slices.ContainsFunc(m.Compaction.Sources, func(id ulid.ULID) bool { return held[id] })
	}
	for _, src := range srcs {
		if (span{src.MinTime, src.MaxTime}).overlaps(sp) && !held[src.ULID] {
			return false
		}
	}
	return true
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

// describeFolded is the info annotation of a select that names folded
// labels and reads downsampled data folded over them (raw data has expired
// there): its series there do not carry the labels.
func describeFolded(segs []segment, named []string) string {
	var parts []string
	for _, s := range segs {
		if s.res == block.ResolutionRaw {
			continue
		}
		var folded []string
		for _, b := range s.blocks {
			for _, l := range b.meta.GPUStore.Downsample.FoldedLabels {
				if slices.Contains(named, l) && !slices.Contains(folded, l) {
					folded = append(folded, l)
				}
			}
		}
		if len(folded) > 0 {
			parts = append(parts, fmt.Sprintf("%v in %s data for %s–%s", folded, downsample.ResolutionName(s.res),
				time.UnixMilli(s.from).UTC().Format(time.RFC3339), time.UnixMilli(s.to).UTC().Format(time.RFC3339)))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return fmt.Sprintf("gpustore: the query names labels that downsampling folded away where only downsampled data is left (its series there do not carry them): %v", parts)
}

// stepWindows are the times a range function's select reads when it is
// evaluated at its hints' steps (readopts.ReadOptions.AtSteps): the
// windows [start + k·step, start + k·step + rng] for k ≥ 0 while the window
// starts before end (closed, and a millisecond wider at the start, for the
// downsampled points stored a millisecond before the raw time they stand
// for: a chunk kept by mistake costs a read, one skipped by mistake a wrong
// answer).
type stepWindows struct{ start, end, step, rng int64 }

// sparseWindows returns the windows of a select, or nil when it reads its
// whole range (no step, no range, or steps no longer than the range); each
// window begins lead earlier (a moved range: segment.shift).
func sparseWindows(atSteps bool, h *storage.SelectHints, lead int64) *stepWindows {
	if h == nil || h.Range <= 0 || h.Step <= h.Range || !atSteps {
		return nil
	}
	return &stepWindows{start: h.Start - 1 - lead, end: h.End, step: h.Step, rng: h.Range + 1 + lead}
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
