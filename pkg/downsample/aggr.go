// Package downsample turns raw TSDB blocks into 5 m blocks and 5 m blocks into
// 1 h blocks, and reads them back through PromQL.
//
// # Blocks
//
// A downsampled block is an ordinary Prometheus TSDB block in Prometheus'
// own chunk encodings, written with the TSDB's chunk and index writers
// (blockwrite.go), so every reader of raw blocks (the TSDB, the shipper, the
// compactor, the bucket store) reads it unchanged. Each raw series becomes
// one series, marked by the reserved label AggrLabel:
//
//   - gauges: "packed", one point per window holding the count, sum, min and
//     max of the window's samples as a float histogram of the custom-buckets
//     schema (Count, Sum, and min and max as the two bucket values; see
//     packed.go). Prometheus' float histogram chunks XOR each field against
//     the previous point's, so the four aggregates cost one index entry, one
//     timestamp stream and four XOR value streams. Packed points are not
//     valid histograms (min and max may be negative) and never reach PromQL
//     as histograms: the Querier turns them into floats per view.
//   - counters: a subset of the raw samples that keeps the first and last
//     sample of every window, both samples of every counter reset, and every
//     NaN with its neighbours. Between two kept samples the raw series is a
//     run without reset or NaN, so PromQL's reset handling over the kept
//     samples gives the raw increase exactly, resets() is exact over any
//     range, and min/max_over_time are exact. Float samples are stored two
//     per point, "pairs" (a window's first and last sample in one point, see
//     pairs.go); native histograms as they are, "counter".
//
// Blocks written before the packed layout hold a gauge as four float series
// ("count", "sum", "min", "max"), and blocks written before pairs hold a
// counter's kept float samples one per point ("counter"). They are still
// read (a series found in both layouts reads merged, one point per time) and
// downsampled from 5m to 1h in their own layout.
//
// # Windows and time
//
// A window of resolution R ends at a multiple w of R and holds the raw samples
// with timestamps in (w-R, w], the same left-open shape as PromQL's range
// selectors since Prometheus 3, so that rate(x[1h]) evaluated at a multiple of
// 1h reads exactly the windows inside its range. A downsampled point standing
// for raw time t is stored at t-1 ms: a gauge aggregate (raw time w) at w-1, a
// kept counter sample at its raw timestamp - 1. The shift puts every point of
// the windows ending in (A, B] inside the block range [A, B), so downsampled
// blocks line up with the compactor's aligned ranges, and still puts each
// point inside every PromQL range (t-R', t] with t and R' multiples of R that
// contains its raw time. The price: the raw samples of window (B-R, B] include
// the one at exactly B, which lives in the next raw block; Downsample takes
// every source block that holds (A, B].
package downsample

import (
	"fmt"
	"time"
)

// AggrLabel is the reserved label that names the aggregate a series of a
// downsampled block holds. Queries never see it: the Querier removes it.
const AggrLabel = "__gpustore_aggr__"

// Aggregate names (values of AggrLabel).
const (
	// AggrPacked marks the one series that holds a gauge's count, sum, min
	// and max per window as a custom-buckets float histogram (packed.go).
	AggrPacked = "packed"
	// AggrCount, AggrSum, AggrMin and AggrMax are the old layout of a
	// gauge's aggregates, one series each, which blocks written before the
	// packed layout hold. They are still read, and downsampled to 1h in the
	// same layout.
	AggrCount = "count"
	AggrSum   = "sum"
	AggrMin   = "min"
	AggrMax   = "max"
	// AggrPairs marks the series that holds a counter's kept float samples
	// two per point (pairs.go).
	AggrPairs = "pairs"
	// AggrCounter marks a series of kept samples one per point: native
	// histograms, and floats in blocks written before pairs.
	AggrCounter = "counter"
)

// Resolutions in milliseconds (gpustore.downsample.resolution in meta.json).
const (
	ResRaw int64 = 0
	Res5m  int64 = int64(5 * time.Minute / time.Millisecond)
	Res1h  int64 = int64(time.Hour / time.Millisecond)
)

// ParseResolution parses "raw", "5m" or "1h".
func ParseResolution(s string) (int64, error) {
	switch s {
	case "raw", "0", "0s":
		return ResRaw, nil
	case "5m":
		return Res5m, nil
	case "1h":
		return Res1h, nil
	}
	return 0, fmt.Errorf("unknown resolution %q (raw, 5m or 1h)", s)
}

// ResolutionName is the inverse of ParseResolution.
func ResolutionName(r int64) string {
	switch r {
	case ResRaw:
		return "raw"
	case Res5m:
		return "5m"
	case Res1h:
		return "1h"
	}
	return (time.Duration(r) * time.Millisecond).String()
}

// windowEnd returns the end of the window of resolution res that holds raw
// time t: the multiple w of res with t in (w-res, w].
func windowEnd(t, res int64) int64 {
	// Go's division truncates towards zero, which is the ceiling for
	// negative t and the floor for positive t.
	q := t / res
	if t%res != 0 && t > 0 {
		q++
	}
	return q * res
}
