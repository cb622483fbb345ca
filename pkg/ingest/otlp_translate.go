package ingest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/storage/remote/otlptranslator/prometheusremotewrite"
	"go.opentelemetry.io/collector/pdata/pmetric"

	"github.com/gpustore/gpustore/pkg/limits"
)

// otlpTranslation turns OTLP metrics into a remote-write 2.0 body with
// Prometheus' translator: the translator appends each data point's series
// to a storage.AppenderV2, and rw2Appender, the appender it is given, only
// writes them down as 2.0 time series (one per call, in the call's order).
// The store step then reads that body like any remote write. It is kept in
// the pooled requestState, so its converter's caches and buffers are reused.
type otlpTranslation struct {
	conv *prometheusremotewrite.PrometheusConverter
	app  rw2Appender
}

func newOTLPTranslation() *otlpTranslation {
	return &otlpTranslation{conv: prometheusremotewrite.NewPrometheusConverter(nil)}
}

// translate appends md's series as a 2.0 request to dst. The error is the
// translator's, for the metrics it refused (the others are in the body),
// or the context's when the request was given up.
func (t *otlpTranslation) translate(ctx context.Context, md pmetric.Metrics, o limits.OTLP, lookbackDelta time.Duration, maxSeries int, dst []byte) ([]byte, error) {
	t.app.reset(maxSeries)
	t.conv.Reset(&t.app)
	// The warnings (a +Inf bucket bound, attribute names that collide once
	// sanitized, metrics without points) describe data that was still
	// translated; Prometheus logs them, and so would we, per request, so
	// they are left to the series' own outcome.
	_, err := t.conv.FromMetrics(ctx, md, translatorSettings(o, lookbackDelta))
	t.conv.Reset(nil)
	if t.app.overflow {
		return dst[:0], fmt.Errorf("%w: the translation yields more than %d (limit max_series_per_request)", errTooManySeries, maxSeries)
	}
	if len(t.app.req.Timeseries) == 0 {
		return dst[:0], err
	}
	t.app.req.Symbols = t.app.symbols.Symbols()
	body, merr := t.app.req.OptimizedMarshal(dst)
	if merr != nil {
		return dst[:0], merr
	}
	return body, err
}

// rw2Appender is the storage.AppenderV2 the translator appends to: it
// records each call as one remote-write 2.0 time series, up to max (0: no
// bound). The bound matters before the store's own count of series: the
// translator writes a resource's target_info every half lookback delta
// from its earliest data point to its latest, so one point stamped 1970
// beside one of today would make it append twelve million.
type rw2Appender struct {
	symbols  writev2.SymbolsTable
	req      writev2.Request
	max      int
	overflow bool
}

// errOverflow stops the translator at the bound; translate answers it.
var errOverflow = errors.New("too many series")

func (a *rw2Appender) reset(max int) {
	a.max, a.overflow = max, false
	if a.symbols.Symbols() == nil {
		a.symbols = writev2.NewSymbolTable()
	}
	a.symbols.Reset()
	a.req.Symbols = nil
	clear(a.req.Timeseries) // let go of the previous request's slices
	a.req.Timeseries = a.req.Timeseries[:0]
}

func (a *rw2Appender) Append(_ storage.SeriesRef, ls labels.Labels, st, t int64, v float64, h *histogram.Histogram, fh *histogram.FloatHistogram, opts storage.AOptions) (storage.SeriesRef, error) {
	if a.max > 0 && len(a.req.Timeseries) >= a.max {
		a.overflow = true
		return 0, errOverflow
	}
	ts := writev2.TimeSeries{LabelsRefs: a.symbols.SymbolizeLabels(ls, nil)}
	switch {
	case fh != nil:
		ts.Histograms = []writev2.Histogram{writev2.FromFloatHistogram(st, t, fh)}
	case h != nil:
		ts.Histograms = []writev2.Histogram{writev2.FromIntHistogram(st, t, h)}
	default:
		ts.Samples = []writev2.Sample{{Value: v, Timestamp: t, StartTimestamp: st}}
	}
	if len(opts.Exemplars) > 0 {
		ts.Exemplars = make([]writev2.Exemplar, 0, len(opts.Exemplars))
		for _, e := range opts.Exemplars {
			ts.Exemplars = append(ts.Exemplars, writev2.Exemplar{LabelsRefs: a.symbols.SymbolizeLabels(e.Labels, nil), Value: e.Value, Timestamp: e.Ts})
		}
	}
	if m := opts.Metadata; !m.IsEmpty() {
		ts.Metadata = writev2.Metadata{Type: writev2.FromMetadataType(m.Type), HelpRef: a.symbols.Symbolize(m.Help), UnitRef: a.symbols.Symbolize(m.Unit)}
	}
	a.req.Timeseries = append(a.req.Timeseries, ts)
	// The reference only has to be non-zero and stable within the request;
	// the translator does not pass it back.
	return storage.SeriesRef(len(a.req.Timeseries)), nil
}

func (*rw2Appender) Commit() error   { return nil }
func (*rw2Appender) Rollback() error { return nil }
