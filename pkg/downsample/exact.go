package downsample

import (
	"fmt"

	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/util/annotations"
)

// Which answers over downsampled data are raw's.
//
// Over ranges of whole windows (WindowFit's Fits), a function reads from a
// downsampled series exactly the aggregates raw data would give it when
// they are:
//
//	gauge (packed count/sum/min/max)   min_over_time (min), max_over_time (max),
//	                                   sum_over_time (sum; and the count and sum
//	                                   views Rewrite makes of count_over_time and
//	                                   avg_over_time), present_over_time,
//	                                   absent_over_time
//	counter (kept samples)             rate, increase, delta, resets,
//	                                   min_over_time, max_over_time,
//	                                   first_over_time, last_over_time,
//	                                   present_over_time, absent_over_time
//
// (rate, increase and delta up to float rounding, also where a series
// starts or ends inside the range: densify.go puts back the raw samples the
// engine's extrapolation counts, or says the answer is approximate where
// the data does not record them). Everything else is an approximation, and the select says so
// with an info annotation (Approximation): a plain selector reads each
// window's average (a counter's last kept sample); count/sum/avg_over_time,
// changes, irate, idelta, deriv, predict_linear and the *_over_time
// statistics of a counter see only its kept samples (each window's first and
// last, and both sides of every reset), not every raw sample; any other
// function of a gauge sees one point per window.

// exactRead reports whether the function around a select (hints.Func)
// answers over the points view reads as over raw data, for a series whose
// data is kept samples (counters, native histograms) or gauge aggregates.
// explicit says the view was named by an AggrLabel matcher (Rewrite).
func exactRead(h *storage.SelectHints, view View, explicit, kept bool) bool {
	if h == nil || h.Range == 0 {
		return false // a plain selector: the window's average, or the last kept sample
	}
	switch h.Func {
	case "present_over_time", "absent_over_time":
		return true
	}
	if kept {
		if explicit && (view == ViewCount || view == ViewSum) {
			return false // count_over_time and avg_over_time, rewritten: kept samples only
		}
		switch h.Func {
		case "rate", "increase", "delta", "resets", "min_over_time", "max_over_time", "first_over_time", "last_over_time":
			return true
		}
		return false
	}
	switch h.Func {
	case "min_over_time":
		return view == ViewMin
	case "max_over_time":
		return view == ViewMax
	case "sum_over_time":
		return view == ViewSum || view == ViewCount
	}
	return false
}

// whyApproximate says, for an answer exactRead finds not exact, what the
// function read instead of raw samples.
func whyApproximate(h *storage.SelectHints, view View, explicit, kept bool) string {
	fn := "a plain selector"
	if h != nil && h.Range > 0 {
		fn = h.Func
		if explicit && (view == ViewCount || view == ViewSum) {
			fn = "count_over_time or avg_over_time"
		}
	}
	switch {
	case h == nil || h.Range == 0:
		return "a plain selector reads each window's average (a counter's last kept sample), not the last raw sample"
	case kept:
		return fmt.Sprintf("%s of a counter reads the samples kept per window (its first and last, both sides of each reset), not every raw sample", fn)
	}
	return fmt.Sprintf("%s of a gauge reads one point per window (its %s); min/max/sum/count/avg_over_time are exact", fn, view)
}

// Approximation is the info annotation of a select answered from
// downsampled data that is not what raw data would give, and why. It names
// no resolution or time range (the bucket store's "served from downsampled
// blocks" info does), so that the pieces of a split query say it alike.
func Approximation(why string) error {
	return fmt.Errorf("%w: gpustore: approximate answer from downsampled data: %s", annotations.PromQLInfo, why)
}

// GridReason is why a select whose ranges the windows of its resolution do
// not fit (WindowFit) is approximate when read downsampled.
func GridReason(f Fit) string {
	switch f {
	case FitsNearly:
		return "the range is not a multiple of the resolution: the window at each range's start is read whole"
	case FitsShifted:
		return "each step is evaluated at the last window end at or before it (a step, start or offset that is not a multiple of the resolution), at most a window early"
	}
	return "the windows straddle the ranges evaluated (a step, start, offset or range that is not a multiple of the resolution, or a subquery)"
}
