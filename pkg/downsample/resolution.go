package downsample

import (
	"fmt"
	"slices"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"

	"github.com/gpustore/gpustore/pkg/readopts"
)

// Auto is the max source resolution that lets each Select pick its own from
// its hints (MaxResolution).
const Auto = readopts.AutoResolution

// ParseMaxSourceResolution parses a max_source_resolution value: raw, 5m,
// 1h or auto (Thanos' parameter).
func ParseMaxSourceResolution(s string) (int64, error) {
	if s == "auto" || s == "" {
		return Auto, nil
	}
	r, err := ParseResolution(s)
	if err != nil {
		return 0, fmt.Errorf("max_source_resolution: %w (or auto)", err)
	}
	return r, nil
}

// MaxResolution is the coarsest resolution a Select may read. An explicit
// max_source_resolution (maxSource, the request's
// readopts.ReadOptions.MaxSourceResolution) wins. Auto picks, for a range function, the
// coarsest resolution that is at most a fifth of the query's step (as Thanos
// does: several windows per step, so that downsampled data is read only
// where it saves most of the points) and no coarser than the function's
// range (so that every range holds whole windows: rate(x[5m]) reads at most
// 5m data). A plain selector reads one point per step whatever the
// resolution, the average of the window before it, so it may read up to
// half the step: each step still reads its own window, and a coarser window
// stands for more of the step it is drawn for. Grafana asks for about 250
// points per panel, so a 24-hour panel's ~6 min step reads raw, a 7-day
// panel's ~40 min step 5m data and a 30-day panel's ~3 h step 1h data for
// its plain selectors (5m for its range functions). Selects without a step
// (instant queries, series and label lookups) read raw.
//
// This is the most a Select may read, not what it gets: where no block of
// that resolution covers a time range, finer data answers, and where only
// coarser data is left (raw past its retention) coarser data does, so an
// answer is never empty where any data exists.
func MaxResolution(maxSource int64, h *storage.SelectHints) int64 {
	if maxSource != Auto {
		return maxSource
	}
	if h == nil || h.Step <= 0 {
		return ResRaw
	}
	limit := h.Step / 2
	if h.Range > 0 {
		limit = min(h.Step/5, h.Range)
	}
	for _, r := range []int64{Res1h, Res5m} {
		if r <= limit {
			return r
		}
	}
	return ResRaw
}

// Fit is how the windows of a resolution sit in the ranges a select is
// evaluated over (WindowFit).
type Fit uint8

const (
	// Fits: every range the select is evaluated over is whole windows (its
	// evaluation times, less any offset, are window ends and its range is a
	// multiple of the resolution), so the functions that are exact over
	// windows answer as over raw data. Plain selectors always fit: they read
	// the window before each evaluation time by design.
	Fits Fit = iota
	// FitsNearly: the ranges end on window ends but are not a whole number
	// of windows (Grafana's $__rate_interval, the step plus a scrape
	// interval) and span at least MinNearlyWindows windows: only the window
	// that straddles each range's start is read whole rather than in part.
	FitsNearly
	// FitsShifted: evaluation times fall inside windows (a step or start
	// that is not a multiple of the resolution, an offset that is not), the
	// range is whole windows and the steps are at least a range and a window
	// apart: each evaluation can read the windows of the range ending at the
	// last window end at or before it, moved to it (StepShift), an answer
	// at most a window early that says so.
	FitsShifted
	// FitsNot: evaluation times fall inside windows and the range is not
	// whole windows or the steps too close for FitsShifted, or the times are
	// not known from the hints (a query with subqueries): the windows at both
	// ends of every range straddle it, and a range no longer than a window
	// holds none whole (rate(x[5m]) over 5m data at a 27m step read 90 % low).
	FitsNot
)

// MinNearlyWindows is the fewest windows a range that FitsNearly spans: the
// window read whole at its start is at most a quarter of it.
const MinNearlyWindows = 4

// WindowFit says how the windows of resolution res sit in the ranges of a
// select with hints h. The engine evaluates a range function's select at
// Start + Range - 1 + k·Step (k ≥ 0, up to End; Start and End already less
// the offset), over the left-open range of Range before each time; at the
// steps only when the query says so (atSteps: readopts.ReadOptions.AtSteps),
// otherwise only a select with a single evaluation time (an instant query,
// @) is known.
func WindowFit(atSteps bool, h *storage.SelectHints, res int64) Fit {
	if res == ResRaw || h == nil || h.Range == 0 {
		return Fits
	}
	first := h.Start + h.Range - 1
	// A range query's select is judged by its step even when it has one
	// evaluation (a query frontend's piece), so that every piece of a split
	// query reads its steps as the whole query does.
	steps := h.Step > 0 && atSteps
	if !steps && first != h.End {
		return FitsNot
	}
	onGrid := floorMod(first, res) == 0 && (!steps || h.Step%res == 0)
	switch {
	case onGrid && h.Range%res == 0:
		return Fits
	case onGrid && h.Range >= MinNearlyWindows*res:
		return FitsNearly
	case !onGrid && h.Range%res == 0 && (!steps || h.Step >= h.Range+res):
		return FitsShifted
	}
	return FitsNot
}

// StepShift moves the downsampled points a select reads for each of its
// evaluation times T to T: those of the range ending at e, the last window
// end at or before T, moved by T - e (< res). The ranges read and the
// ranges moved to never overlap another step's (Step ≥ Range + res), so
// the points stay in time order. It is for selects that FitsShifted.
type StepShift struct {
	first, end, step, rng, res int64
}

// NewStepShift is the shift of a select with hints h read at res.
func NewStepShift(h *storage.SelectHints, res int64) *StepShift {
	return &StepShift{first: h.Start + h.Range - 1, end: h.End, step: h.Step, rng: h.Range, res: res}
}

// Map returns the time a point read at t is moved to, and false when no
// evaluation reads it.
func (s *StepShift) Map(t int64) (int64, bool) {
	at, e, ok := s.evaluation(t)
	if !ok || t > e || t <= e-s.rng {
		return 0, false
	}
	return t + at - e, true
}

// Straddled returns the span of the evaluation that a cut at raw time t
// (a boundary between data read at two resolutions) falls inside: the raw
// time [from, to) from its range read to the range it is moved to; ok is
// false when t falls between evaluations' spans.
func (s *StepShift) Straddled(t int64) (from, to int64, ok bool) {
	at, e, ok := s.evaluation(t - 1)
	from, to = e-s.rng+1, at+1
	return from, to, ok && t > from && t < to
}

// evaluation returns the first evaluation time at or after t and the
// window end its data is read up to; ok is false when there is none.
func (s *StepShift) evaluation(t int64) (at, e int64, ok bool) {
	k := int64(0)
	if s.step > 0 && t > s.first {
		k = (t - s.first + s.step - 1) / s.step
	}
	at = s.first + k*s.step
	return at, at - floorMod(at, s.res), at <= s.end
}

func floorMod(a, b int64) int64 {
	m := a % b
	if m < 0 {
		m += b
	}
	return m
}

// NamesFolded says whether a select (its matchers and hints, and the
// labels its query names: readopts.ReadOptions.QueryLabels) uses any of
// the folded labels: then downsampled data folded over them cannot tell
// its series apart, and the select reads finer data where it exists.
func NamesFolded(queryLabels, folded []string, h *storage.SelectHints, ms []*labels.Matcher) bool {
	if len(folded) == 0 {
		return false
	}
	for _, m := range ms {
		if slices.Contains(folded, m.Name) {
			return true
		}
	}
	if h != nil && h.By {
		for _, g := range h.Grouping {
			if slices.Contains(folded, g) {
				return true
			}
		}
	}
	for _, n := range queryLabels {
		if slices.Contains(folded, n) {
			return true
		}
	}
	return false
}
