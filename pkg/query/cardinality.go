package query

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/grafana/dskit/tenant"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunks"

	"github.com/gpustore/gpustore/pkg/limits/querylimit"
)

// The cardinality API answers, in the shapes of Mimir's
// /api/v1/cardinality/label_names and /label_values, which labels and
// values make a tenant's series: the operator's way to find the metric and
// label that blew up (a pod label on every DCGM series is the usual one).
//
// Which series are counted:
//   - count_method=inmemory (the default, Mimir's): the series in the
//     tenant's head on this process, read from the head's index;
//   - start and/or end (gpustore's): the series with samples in that range,
//     from every source a query reads (head, local and bucket blocks, the
//     ring's receivers), each once, bounded by the tenant's
//     max_fetched_series_per_query like a query. In a ring, where the
//     query role holds no head, this is how the receivers' series are seen.
//
// selector narrows the series (a PromQL series selector; all by default),
// limit the label names or values listed (20 by default, 500 at most).
const (
	cardinalityDefaultLimit = 20
	cardinalityMaxLimit     = 500
)

// cardinalityRequest is a request's parameters.
type cardinalityRequest struct {
	matchers   []*labels.Matcher
	limit      int
	inRange    bool
	start, end int64
}

func (a *API) parseCardinality(r *http.Request) (cardinalityRequest, error) {
	if err := r.ParseForm(); err != nil {
		return cardinalityRequest{}, fmt.Errorf("error parsing form values: %w", err)
	}
	c := cardinalityRequest{limit: cardinalityDefaultLimit, start: math.MinInt64, end: math.MaxInt64}
	c.matchers = []*labels.Matcher{labels.MustNewMatcher(labels.MatchRegexp, model.MetricNameLabel, ".+")}
	if s := r.Form.Get("selector"); s != "" {
		if err := checkExprBounds(s, a.opts.Config.MaxExpressionBytes, a.opts.Config.MaxExpressionDepth); err != nil {
			return c, err
		}
		ms, err := parser.NewParser(parser.Options{}).ParseMetricSelector(s)
		if err != nil {
			return c, fmt.Errorf("invalid selector: %w", err)
		}
		c.matchers = ms
	}
	if s := r.Form.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n > cardinalityMaxLimit {
			return c, fmt.Errorf("limit must be a number from 0 to %d", cardinalityMaxLimit)
		}
		c.limit = n
	}
	switch m := r.Form.Get("count_method"); m {
	case "", "inmemory":
	default:
		return c, fmt.Errorf("count_method %q is not supported: inmemory (the head's series), or a start and end for the series with samples in a range", m)
	}
	for _, p := range []struct {
		name string
		to   *int64
	}{{"start", &c.start}, {"end", &c.end}} {
		if s := r.Form.Get(p.name); s != "" {
			t, err := parseTime(s)
			if err != nil {
				return c, fmt.Errorf("invalid %s: %w", p.name, err)
			}
			*p.to, c.inRange = t, true
		}
	}
	if c.inRange {
		if c.end == math.MaxInt64 {
			c.end = time.Now().UnixMilli()
		}
		if c.start == math.MinInt64 {
			c.start = c.end - time.Hour.Milliseconds()
		}
		if c.end < c.start {
			return c, errors.New("end must not be before start")
		}
	}
	return c, nil
}

// parseTime reads a time as the query API does: Unix seconds or RFC 3339.
func parseTime(s string) (int64, error) {
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		return int64(math.Round(f * 1000)), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return 0, fmt.Errorf("%q is neither Unix seconds nor RFC 3339", s)
	}
	return t.UnixMilli(), nil
}

// labelCounts are the series of a request, counted by label name and value.
type labelCounts struct {
	series int
	values map[string]map[string]int // name → value → series
}

func (lc *labelCounts) add(lset labels.Labels) {
	lc.series++
	lset.Range(func(l labels.Label) {
		vs := lc.values[l.Name]
		if vs == nil {
			vs = map[string]int{}
			lc.values[l.Name] = vs
		}
		vs[l.Value]++
	})
}

// countSeries counts the request's series of the tenant in ctx.
func (a *API) countSeries(ctx context.Context, c cardinalityRequest) (*labelCounts, error) {
	id, err := tenant.TenantID(ctx)
	if err != nil {
		return nil, err
	}
	lc := &labelCounts{values: map[string]map[string]int{}}
	if !c.inRange {
		db := a.opts.DBs.Existing(id)
		if db == nil {
			return lc, nil
		}
		return lc, headSeries(ctx, db.Head(), c.matchers, lc.add)
	}
	if a.opts.Limits != nil {
		l := a.opts.Limits.QueryLimits(id)
		ctx = querylimit.With(ctx, querylimit.New(id, l.MaxFetchedSeries, 0))
	}
	q, err := a.queryable.Querier(c.start, c.end)
	if err != nil {
		return nil, err
	}
	defer q.Close()
	ss := q.Select(ctx, false, &storage.SelectHints{Start: c.start, End: c.end, Func: "series"}, c.matchers...)
	for ss.Next() {
		lc.add(ss.At().Labels())
	}
	return lc, ss.Err()
}

// headSeries calls f with each series of h that ms match.
func headSeries(ctx context.Context, h *tsdb.Head, ms []*labels.Matcher, f func(labels.Labels)) error {
	ir, err := h.Index()
	if err != nil {
		return err
	}
	defer ir.Close()
	p, err := tsdb.PostingsForMatchers(ctx, ir, ms...)
	if err != nil {
		return err
	}
	var (
		b    labels.ScratchBuilder
		chks []chunks.Meta
	)
	for n := 0; p.Next(); n++ {
		if n%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		if err := ir.Series(p.At(), &b, &chks); err != nil {
			if errors.Is(err, storage.ErrNotFound) {
				continue // deleted by head GC meanwhile
			}
			return err
		}
		f(b.Labels())
	}
	return p.Err()
}

// cardinalityLabelNames answers /api/v1/cardinality/label_names.
func (a *API) cardinalityLabelNames(w http.ResponseWriter, r *http.Request) {
	c, err := a.parseCardinality(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad_data", err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), time.Duration(a.opts.Config.Timeout))
	defer cancel()
	lc, err := a.countSeries(ctx, c)
	if err != nil {
		writeCardinalityError(w, err)
		return
	}
	type nameCount struct {
		LabelName        string `json:"label_name"`
		LabelValuesCount int    `json:"label_values_count"`
	}
	out := struct {
		LabelValuesCountTotal int         `json:"label_values_count_total"`
		LabelNamesCount       int         `json:"label_names_count"`
		Cardinality           []nameCount `json:"cardinality"`
	}{LabelNamesCount: len(lc.values), Cardinality: []nameCount{}}
	for name, vs := range lc.values {
		out.LabelValuesCountTotal += len(vs)
		out.Cardinality = append(out.Cardinality, nameCount{LabelName: name, LabelValuesCount: len(vs)})
	}
	slices.SortFunc(out.Cardinality, func(x, y nameCount) int {
		return cmp.Or(cmp.Compare(y.LabelValuesCount, x.LabelValuesCount), cmp.Compare(x.LabelName, y.LabelName))
	})
	out.Cardinality = out.Cardinality[:min(c.limit, len(out.Cardinality))]
	writeJSON(w, http.StatusOK, out)
}

// cardinalityLabelValues answers /api/v1/cardinality/label_values for the
// label_names[] asked (one at least).
func (a *API) cardinalityLabelValues(w http.ResponseWriter, r *http.Request) {
	c, err := a.parseCardinality(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad_data", err)
		return
	}
	names := r.Form["label_names[]"]
	if len(names) == 0 {
		writeError(w, http.StatusBadRequest, "bad_data", errors.New("label_names[] is required: the label names whose values to count"))
		return
	}
	for _, n := range names {
		if !model.UTF8Validation.IsValidLabelName(n) {
			writeError(w, http.StatusBadRequest, "bad_data", fmt.Errorf("invalid label name %q", n))
			return
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), time.Duration(a.opts.Config.Timeout))
	defer cancel()
	lc, err := a.countSeries(ctx, c)
	if err != nil {
		writeCardinalityError(w, err)
		return
	}
	type valueCount struct {
		LabelValue  string `json:"label_value"`
		SeriesCount int    `json:"series_count"`
	}
	type labelCount struct {
		LabelName        string       `json:"label_name"`
		LabelValuesCount int          `json:"label_values_count"`
		SeriesCount      int          `json:"series_count"`
		Cardinality      []valueCount `json:"cardinality"`
	}
	out := struct {
		SeriesCountTotal int          `json:"series_count_total"`
		Labels           []labelCount `json:"labels"`
	}{SeriesCountTotal: lc.series, Labels: []labelCount{}}
	for _, name := range slices.Compact(slices.Sorted(slices.Values(names))) {
		vs := lc.values[name]
		l := labelCount{LabelName: name, LabelValuesCount: len(vs), Cardinality: []valueCount{}}
		for v, n := range vs {
			l.SeriesCount += n
			l.Cardinality = append(l.Cardinality, valueCount{LabelValue: v, SeriesCount: n})
		}
		slices.SortFunc(l.Cardinality, func(x, y valueCount) int {
			return cmp.Or(cmp.Compare(y.SeriesCount, x.SeriesCount), cmp.Compare(x.LabelValue, y.LabelValue))
		})
		l.Cardinality = l.Cardinality[:min(c.limit, len(l.Cardinality))]
		out.Labels = append(out.Labels, l)
	}
	writeJSON(w, http.StatusOK, out)
}

func writeCardinalityError(w http.ResponseWriter, err error) {
	switch {
	case querylimit.IsError(err):
		writeError(w, http.StatusUnprocessableEntity, "execution", err)
	case errors.Is(err, context.DeadlineExceeded):
		writeError(w, http.StatusServiceUnavailable, "timeout", err)
	case errors.Is(err, context.Canceled):
		writeError(w, statusClientClosedRequest, "canceled", err)
	case errors.Is(err, ErrUnavailable), errors.Is(err, tsdb.ErrNotReady):
		writeError(w, http.StatusServiceUnavailable, "unavailable", err)
	default:
		writeError(w, http.StatusInternalServerError, "internal", err)
	}
}
