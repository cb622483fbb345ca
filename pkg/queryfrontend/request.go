package queryfrontend

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/timestamp"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/gpustore/gpustore/pkg/downsample"
)

// rangeRequest is a query_range request the frontend may split and cache.
type rangeRequest struct {
	expr       parser.Expr
	start, end int64 // ms, as the engine reads them
	step       int64 // ms
	lookback   time.Duration
	// base keys everything but start and end that changes the answer.
	base    string
	noStore bool // Cache-Control: no-store
}

// passReason says why a request goes to the API unsplit and uncached.
type passReason string

const (
	passNone       passReason = ""
	passParams     passReason = "params"      // a parameter the frontend cannot split (stats, limit, cost, ...) or cannot parse
	passModifier   passReason = "at_modifier" // @ or a negative offset
	passHistograms passReason = "histograms"  // an answer that cannot be joined
)

// unsplittable parameters: each changes the answer as a whole (stats,
// limit, the cost and query-limit overrides), so a join of pieces would not
// be the unsplit answer.
var unsplittable = []string{"stats", "limit", "cost", "max_series", "max_samples_read", "max_query_duration"}

// handledParams are keyed by their meaning (query normalised, start and
// end as the pieces' steps, defaults filled in) or not at all (timeout
// bounds each piece and does not change an answer); every other parameter
// is keyed by its value.
var handledParams = map[string]bool{"query": true, "start": true, "end": true, "step": true, "dedup": true, "max_source_resolution": true, "lookback_delta": true, "timeout": true}

// parseRequest reads r (its form already parsed by the API's chain) and
// says whether the frontend may take it apart. Requests it cannot parse go
// to the API, which answers the error itself.
func (f *Frontend) parseRequest(r *http.Request, tenantID string) (*rangeRequest, passReason) {
	if err := r.ParseForm(); err != nil {
		return nil, passParams
	}
	for _, p := range unsplittable {
		if v := r.Form.Get(p); v != "" && !(p == "limit" && v == "0") {
			return nil, passParams
		}
	}
	if r.Header.Get("X-Prometheus-Use-Start-Timestamps") != "" {
		return nil, passParams
	}
	expr, err := parser.NewParser(parser.Options{}).ParseExpr(r.Form.Get("query"))
	if err != nil {
		return nil, passParams
	}
	if t := expr.Type(); t != parser.ValueTypeVector && t != parser.ValueTypeScalar {
		return nil, passParams
	}
	if readsAhead(expr) {
		return nil, passModifier
	}
	start, err1 := parseTime(r.Form.Get("start"))
	end, err2 := parseTime(r.Form.Get("end"))
	step, err3 := parseDuration(r.Form.Get("step"))
	if err := errors.Join(err1, err2, err3); err != nil || end.Before(start) || step <= 0 || step%time.Millisecond != 0 || end.Sub(start)/step > 11000 {
		return nil, passParams
	}
	req := &rangeRequest{expr: expr, start: timestamp.FromTime(start), end: timestamp.FromTime(end), step: step.Milliseconds(), lookback: f.deps.LookbackDelta}
	if v := r.Form.Get("lookback_delta"); v != "" {
		d, err := parseDuration(v)
		if err != nil {
			return nil, passParams
		}
		if d > 0 {
			req.lookback = d
		}
	}
	dedup := len(f.deps.ReplicaLabels) > 0
	if v := r.Form.Get("dedup"); v != "" && dedup {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, passParams
		}
		dedup = b
	}
	resStr := r.Form.Get("max_source_resolution")
	if resStr == "" {
		resStr = f.deps.MaxSourceResolution
	}
	res, err := downsample.ParseMaxSourceResolution(resStr)
	if err != nil {
		return nil, passParams
	}
	for _, v := range strings.Split(r.Header.Get("Cache-Control"), ",") {
		if strings.TrimSpace(strings.ToLower(v)) == "no-store" {
			req.noStore = true
		}
	}

	// The key: everything but start and end that the answer depends on.
	// The phase (start modulo step) puts requests whose steps fall on the
	// same instants together; Grafana aligns start to the step, so a
	// refreshed panel keeps its phase.
	var b strings.Builder
	fmt.Fprintf(&b, "%s\x00%s\x00step=%d\x00phase=%d\x00lookback=%d\x00res=%d\x00", tenantID, expr.String(), req.step, mod(req.start, req.step), req.lookback.Milliseconds(), res)
	if dedup {
		fmt.Fprintf(&b, "dedup=%s\x00", strings.Join(f.deps.ReplicaLabels, ","))
	}
	names := make([]string, 0, len(r.Form))
	for k := range r.Form {
		if !handledParams[k] {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	for _, k := range names {
		fmt.Fprintf(&b, "%s=%q\x00", k, r.Form[k])
	}
	req.base = b.String()
	return req, passNone
}

// readsAhead reports whether some value of expr at a step depends on more
// than that step and the data before it: an @ modifier (fixed time, or the
// request's start or end, which a piece does not share) or a negative
// offset (data after the step, possibly still changing).
func readsAhead(expr parser.Expr) bool {
	found := false
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.VectorSelector:
			found = found || n.Timestamp != nil || n.StartOrEnd != 0 || n.OriginalOffset < 0
		case *parser.SubqueryExpr:
			found = found || n.Timestamp != nil || n.StartOrEnd != 0 || n.OriginalOffset < 0
		}
		return nil
	})
	return found
}

// parseTime and parseDuration accept what Prometheus' API accepts.
func parseTime(s string) (time.Time, error) {
	if t, err := strconv.ParseFloat(s, 64); err == nil {
		sec, ns := math.Modf(t)
		ns = math.Round(ns*1000) / 1000
		return time.Unix(int64(sec), int64(ns*float64(time.Second))).UTC(), nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("cannot parse %q to a valid timestamp", s)
}

func parseDuration(s string) (time.Duration, error) {
	if d, err := strconv.ParseFloat(s, 64); err == nil {
		ts := d * float64(time.Second)
		if ts > float64(math.MaxInt64) || ts < float64(math.MinInt64) {
			return 0, fmt.Errorf("cannot parse %q to a valid duration: overflows", s)
		}
		return time.Duration(ts), nil
	}
	if d, err := model.ParseDuration(s); err == nil {
		return time.Duration(d), nil
	}
	return 0, fmt.Errorf("cannot parse %q to a valid duration", s)
}

func formatTime(ms int64) string { return time.UnixMilli(ms).UTC().Format(time.RFC3339Nano) }

// mod is the remainder of a / b in [0, b).
func mod(a, b int64) int64 {
	m := a % b
	if m < 0 {
		m += b
	}
	return m
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

const dayMs = int64(24 * time.Hour / time.Millisecond)

// piece is the steps [start, end] of a request that fall into one UTC day.
type piece struct {
	day        int64 // days since the epoch
	start, end int64 // first and last step, ms
}

// split cuts the steps start, start+step, ..., ≤ end at UTC midnights.
// Every piece starts on a step of the request (start + k·step), so each
// step is evaluated exactly once, by exactly one piece, at the same instant
// as in the unsplit query.
func split(start, end, step int64) []piece {
	var out []piece
	for a := start; a <= end; {
		d := floorDiv(a, dayMs)
		last := min((d+1)*dayMs-1, end) // the day's last millisecond, or end
		b := a + (last-a)/step*step     // the last step not after it
		out = append(out, piece{day: d, start: a, end: b})
		a = b + step
	}
	return out
}
