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
func (t *otlpTranslation) translate(ctx context.Context, md pmetric.Metrics, o limits.OTLP, lookbackDelta time.Duration, maxSeries int, grow func(int64) error, dst []byte) ([]byte, error) {
	// The translator goes on with the next metric when an append fails; a
	// refusal of the appender's cancels the context, which it watches,
	// so that it stops at once.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	t.app.reset(maxSeries, grow, cancel)
	defer t.app.release()
	t.conv.Reset(&t.app)
	// The warnings (a +Inf bucket bound, attribute names that collide once
	// sanitized, metrics without points) describe data that was still
	// translated; Prometheus logs them, and so would we, per request, so
	// they are left to the series' own outcome.
	_, err := t.conv.FromMetrics(ctx, md, translatorSettings(o, lookbackDelta))
	t.conv.Reset(nil)
	switch {
	case t.app.err != nil:
		return dst[:0], t.app.err
	case t.app.overflow:
		return dst[:0], fmt.Errorf("%w: the translation yields more than %d (limit max_series_per_request)", errTooManySeries, maxSeries)
	case len(t.app.req.Timeseries) == 0:
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
//
// It also counts what the translation allocates for what it appends
// (otlpSeriesBytes and otlpLabelBytes a series and a label), and past the
// estimate the request holds (otlpShape) asks grow to hold more of the
// in-flight bound: a refusal stops the translation with its error.
type rw2Appender struct {
	symbols  writev2.SymbolsTable
	req      writev2.Request
	max      int
	overflow bool
	grow     func(bytes int64) error // nil: not counted
	spent    int64                   // bytes the appended series cost
	asked    int64                   // grow is asked again once spent passes it
	err      error                   // grow's refusal
	stop     context.CancelCauseFunc // ends the translation at the bound
}

// errOverflow stops the translator at the bound; translate answers it.
var errOverflow = errors.New("too many series")

func (a *rw2Appender) reset(max int, grow func(int64) error, stop context.CancelCauseFunc) {
	a.max, a.overflow, a.grow, a.spent, a.asked, a.err, a.stop = max, false, grow, 0, 0, nil, stop
	if a.symbols.Symbols() == nil {
		a.symbols = writev2.NewSymbolTable()
	}
	a.req.Timeseries = a.req.Timeseries[:0]
}

// What a pooled translation keeps of its series and symbols for the next
// request (~1 MiB): a DCGM node's export is a few hundred series.
const (
	maxPooledSeries  = 1 << 12
	maxPooledSymbols = 1 << 12
)

// release lets go of the request's series and symbols once its body is
// marshalled, and of slices grown past what a pooled translation keeps, so
// a large request's memory comes back when it is done, not when the pooled
// state is next used or collected.
func (a *rw2Appender) release() {
	clear(a.req.Timeseries)
	a.req.Timeseries = a.req.Timeseries[:0]
	if cap(a.req.Timeseries) > maxPooledSeries {
		a.req.Timeseries = nil
	}
	a.req.Symbols = nil
	if len(a.symbols.Symbols()) > maxPooledSymbols {
		a.symbols = writev2.NewSymbolTable()
	} else {
		a.symbols.Reset()
	}
	a.grow, a.stop = nil, nil
}

// refuse records why the translation must stop and stops it.
func (a *rw2Appender) refuse(err error) error {
	if a.stop != nil {
		a.stop(err)
	}
	return err
}

func (a *rw2Appender) Append(_ storage.SeriesRef, ls labels.Labels, st, t int64, v float64, h *histogram.Histogram, fh *histogram.FloatHistogram, opts storage.AOptions) (storage.SeriesRef, error) {
	if a.err != nil || a.overflow {
		return 0, errOverflow
	}
	if a.max > 0 && len(a.req.Timeseries) >= a.max {
		a.overflow = true
		return 0, a.refuse(errOverflow)
	}
	if a.grow != nil {
		a.spent += otlpSeriesBytes + int64(ls.Len())*otlpLabelBytes
		if a.spent >= a.asked { // asked every 64 KiB, not every series
			a.asked = a.spent + 64<<10
			if err := a.grow(a.spent); err != nil {
				a.err = err
				return 0, a.refuse(err)
			}
		}
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
