package ingest

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/exemplar"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/metadata"
	"github.com/prometheus/prometheus/model/timestamp"
	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
)

// Reasons a sample is rejected; they name the label of
// gpustore_ingest_rejected_samples_total and the README's table.
const (
	reasonInvalidLabels = "invalid_labels"
	reasonOutOfOrder    = "out_of_order"
	reasonDuplicate     = "duplicate_timestamp"
	reasonTooOld        = "too_old"
	reasonTooFarFuture  = "too_far_in_future"
	reasonInvalidHist   = "invalid_histogram"
	reasonNoSamples     = "no_samples"
)

var rejectReasons = []string{reasonInvalidLabels, reasonOutOfOrder, reasonDuplicate, reasonTooOld, reasonTooFarFuture, reasonInvalidHist, reasonNoSamples}

// maxAheadTime is how far in the future a sample may be; Prometheus' own
// receiver uses the same bound.
const maxAheadTime = 10 * time.Minute

// writeStats counts what one request wrote and what it rejected.
type writeStats struct {
	samples, histograms, exemplars int
	rejected                       map[string]int
	firstRejection                 string
	newSeries                      int
}

func (s *writeStats) reject(reason string, n int, format string, args ...any) {
	if s.rejected == nil {
		s.rejected = map[string]int{}
	}
	s.rejected[reason] += n
	if s.firstRejection == "" {
		s.firstRejection = fmt.Sprintf(format, args...)
	}
}

func (s *writeStats) rejectedTotal() int {
	n := 0
	for _, v := range s.rejected {
		n += v
	}
	return n
}

// errorSummary is the 400 answer's text: counts by reason, then the first offender.
func (s *writeStats) errorSummary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d samples rejected (", s.rejectedTotal())
	first := true
	for _, r := range rejectReasons {
		if n := s.rejected[r]; n > 0 {
			if !first {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s: %d", r, n)
			first = false
		}
	}
	fmt.Fprintf(&b, "); the rest of the request was stored; first: %s", s.firstRejection)
	return b.String()
}

// appendCtx carries the per-request state of the append loop; it is pooled
// with the decoders so the steady state allocates nothing.
type appendCtx struct {
	builder   labels.ScratchBuilder
	exemplars []exemplar.Exemplar
	v1hist    prompb.Histogram
	v2hist    writev2.Histogram
	v1ex      prompb.Exemplar
	v2ex      writev2.Exemplar
}

// appendSeries writes every series the decoder yields into app. It returns an
// error only for faults that must fail the whole request (a malformed body,
// or a storage fault); rejected data is counted in stats.
func appendSeries(app storage.AppenderV2, dec seriesDecoder, v2 *v2Decoder, cache *seriesCache, md *metadataSink, ac *appendCtx, now time.Time, stats *writeStats) error {
	exApp, _ := app.(storage.ExemplarAppenderV2)
	maxT := timestamp.FromTime(now.Add(maxAheadTime))
	for dec.next() {
		s := dec.series()
		n := len(s.samples) + len(s.histograms)
		if n == 0 {
			if len(s.exemplars) == 0 {
				stats.reject(reasonNoSamples, 0, "series %s has no samples", describe(s.labels))
			}
			continue
		}
		ref, known := cache.get(s.h1, s.h2)
		var ls labels.Labels // built only for a series the cache does not know
		if !known {
			var err error
			ls, err = buildLabels(&ac.builder, s.labels)
			if err != nil {
				stats.reject(reasonInvalidLabels, n, "%v", err)
				continue
			}
		}
		if s.meta.set && md != nil {
			md.setFromSeries(s)
		}

		for i := range s.samples {
			smp := &s.samples[i]
			if smp.t > maxT {
				stats.reject(reasonTooFarFuture, 1, "sample at %s is more than %s in the future for series %s", timestamp.Time(smp.t).UTC().Format(time.RFC3339), maxAheadTime, describe(s.labels))
				continue
			}
			newRef, err := app.Append(ref, ls, smp.st, smp.t, smp.v, nil, nil, storage.AOptions{})
			if err != nil && known && errors.Is(err, tsdb.ErrInvalidSample) {
				// The cached reference is gone from the head (series garbage
				// collected): resolve the series again from its labels.
				cache.drop(s.h1)
				known, ref = false, 0
				if ls, err = buildLabels(&ac.builder, s.labels); err != nil {
					stats.reject(reasonInvalidLabels, n, "%v", err)
					break
				}
				newRef, err = app.Append(0, ls, smp.st, smp.t, smp.v, nil, nil, storage.AOptions{})
			}
			if err != nil {
				if reason, ok := sampleRejection(err); ok {
					stats.reject(reason, 1, "%v for series %s at %s", err, describe(s.labels), timestamp.Time(smp.t).UTC().Format(time.RFC3339Nano))
					continue
				}
				return fmt.Errorf("append sample: %w", err)
			}
			stats.samples++
			if !known {
				ref, known = newRef, true
				cache.put(s.h1, s.h2, ref)
				stats.newSeries++
			}
		}

		for _, raw := range s.histograms {
			h, fh, t, st, err := decodeHistogram(ac, raw, v2 != nil)
			if err != nil {
				return err
			}
			if t > maxT {
				stats.reject(reasonTooFarFuture, 1, "histogram at %s is more than %s in the future for series %s", timestamp.Time(t).UTC().Format(time.RFC3339), maxAheadTime, describe(s.labels))
				continue
			}
			if ls.IsEmpty() {
				// Histograms are rare: resolve labels rather than trust a
				// possibly stale reference with empty labels.
				if ls, err = buildLabels(&ac.builder, s.labels); err != nil {
					stats.reject(reasonInvalidLabels, 1, "%v", err)
					break
				}
			}
			newRef, err := app.Append(ref, ls, st, t, 0, h, fh, storage.AOptions{})
			if err != nil {
				if reason, ok := sampleRejection(err); ok {
					stats.reject(reason, 1, "%v for series %s at %s", err, describe(s.labels), timestamp.Time(t).UTC().Format(time.RFC3339Nano))
					continue
				}
				if isHistogramValidationError(err) {
					stats.reject(reasonInvalidHist, 1, "%v for series %s", err, describe(s.labels))
					continue
				}
				return fmt.Errorf("append histogram: %w", err)
			}
			stats.histograms++
			if !known {
				ref, known = newRef, true
				cache.put(s.h1, s.h2, ref)
				stats.newSeries++
			}
		}

		if len(s.exemplars) > 0 && exApp != nil && known {
			if ls.IsEmpty() {
				var err error
				if ls, err = buildLabels(&ac.builder, s.labels); err != nil {
					continue
				}
			}
			if err := appendExemplars(exApp, ac, ref, ls, s.exemplars, v2, stats); err != nil {
				return err
			}
		}
	}
	return dec.err()
}

func appendExemplars(app storage.ExemplarAppenderV2, ac *appendCtx, ref storage.SeriesRef, ls labels.Labels, raws [][]byte, v2 *v2Decoder, stats *writeStats) error {
	ac.exemplars = ac.exemplars[:0]
	for _, raw := range raws {
		var e exemplar.Exemplar
		if v2 != nil {
			ac.v2ex.Reset()
			if err := ac.v2ex.Unmarshal(raw); err != nil {
				return fmt.Errorf("%w: exemplar: %v", errMalformed, err)
			}
			lb := &ac.builder
			lb.Reset()
			for i := 0; i+1 < len(ac.v2ex.LabelsRefs); i += 2 {
				n, err := v2.symbol(ac.v2ex.LabelsRefs[i])
				if err != nil {
					return err
				}
				v, err := v2.symbol(ac.v2ex.LabelsRefs[i+1])
				if err != nil {
					return err
				}
				lb.Add(string(n), string(v))
			}
			lb.Sort()
			e = exemplar.Exemplar{Labels: lb.Labels(), Value: ac.v2ex.Value, Ts: ac.v2ex.Timestamp, HasTs: ac.v2ex.Timestamp != 0}
		} else {
			ac.v1ex.Reset()
			if err := ac.v1ex.Unmarshal(raw); err != nil {
				return fmt.Errorf("%w: exemplar: %v", errMalformed, err)
			}
			e = ac.v1ex.ToExemplar(&ac.builder, nil)
		}
		ac.exemplars = append(ac.exemplars, e)
	}
	slices.SortFunc(ac.exemplars, exemplar.Compare)
	_, err := app.AppendExemplars(ref, ls, ac.exemplars)
	failed := 0
	if err != nil {
		var pErr *storage.AppendPartialError
		if !errors.As(err, &pErr) {
			// Exemplars are best effort, as in Prometheus: never fail a request for them.
			return nil
		}
		failed = len(pErr.ExemplarErrors)
	}
	stats.exemplars += max(0, len(ac.exemplars)-failed)
	return nil
}

func decodeHistogram(ac *appendCtx, raw []byte, v2 bool) (h *histogram.Histogram, fh *histogram.FloatHistogram, t, st int64, err error) {
	if v2 {
		ac.v2hist.Reset()
		if err := ac.v2hist.Unmarshal(raw); err != nil {
			return nil, nil, 0, 0, fmt.Errorf("%w: histogram: %v", errMalformed, err)
		}
		hp := &ac.v2hist
		if hp.IsFloatHistogram() {
			return nil, hp.ToFloatHistogram(), hp.Timestamp, hp.StartTimestamp, nil
		}
		return hp.ToIntHistogram(), nil, hp.Timestamp, hp.StartTimestamp, nil
	}
	ac.v1hist.Reset()
	if err := ac.v1hist.Unmarshal(raw); err != nil {
		return nil, nil, 0, 0, fmt.Errorf("%w: histogram: %v", errMalformed, err)
	}
	hp := &ac.v1hist
	if hp.IsFloatHistogram() {
		return nil, hp.ToFloatHistogram(), hp.Timestamp, 0, nil
	}
	return hp.ToIntHistogram(), nil, hp.Timestamp, 0, nil
}

// sampleRejection maps the TSDB's per-sample errors to a rejection reason.
// Anything else is a storage fault and fails the request with a 5xx.
func sampleRejection(err error) (string, bool) {
	switch {
	case errors.Is(err, storage.ErrOutOfOrderSample):
		return reasonOutOfOrder, true
	case errors.Is(err, storage.ErrDuplicateSampleForTimestamp):
		return reasonDuplicate, true
	case errors.Is(err, storage.ErrOutOfBounds), errors.Is(err, storage.ErrTooOldSample):
		return reasonTooOld, true
	case errors.Is(err, tsdb.ErrInvalidSample):
		return reasonInvalidLabels, true
	}
	return "", false
}

func isHistogramValidationError(err error) bool {
	var e histogram.Error
	return errors.As(err, &e)
}

// buildLabels validates a series' label pairs and returns them as sorted
// labels. It runs only for series the cache does not know.
func buildLabels(b *labels.ScratchBuilder, pairs []labelPair) (labels.Labels, error) {
	b.Reset()
	hasName := false
	for _, p := range pairs {
		if len(p.name) == 0 {
			return labels.EmptyLabels(), fmt.Errorf("empty label name in series %s", describe(pairs))
		}
		if len(p.value) == 0 {
			// An empty value means the label is absent, as everywhere in Prometheus.
			continue
		}
		if !utf8.Valid(p.name) || !model.UTF8Validation.IsValidLabelName(yoloString(p.name)) {
			return labels.EmptyLabels(), fmt.Errorf("invalid label name %q in series %s", p.name, describe(pairs))
		}
		if !utf8.Valid(p.value) {
			return labels.EmptyLabels(), fmt.Errorf("label %q has a value that is not valid UTF-8 in series %s", p.name, describe(pairs))
		}
		if bytes.Equal(p.name, nameLabel) {
			hasName = true
		}
		b.Add(yoloString(p.name), yoloString(p.value))
	}
	if !hasName {
		return labels.EmptyLabels(), fmt.Errorf("series %s has no metric name (__name__)", describe(pairs))
	}
	b.Sort()
	ls := b.Labels() // copies: the result no longer points into the request body
	if dup, ok := ls.HasDuplicateLabelNames(); ok {
		return labels.EmptyLabels(), fmt.Errorf("duplicate label name %q in series %s", dup, describe(pairs))
	}
	return ls, nil
}

var nameLabel = []byte(labels.MetricName)

// describe renders wire labels for an error message: {__name__="x", a="b"}.
func describe(pairs []labelPair) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, p := range pairs {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s=%q", p.name, p.value)
		if b.Len() > 512 {
			b.WriteString(", …")
			break
		}
	}
	b.WriteByte('}')
	return b.String()
}

// metadataSink records per-family metadata into a tenant's store.
type metadataSink struct {
	set func(family string, m metadata.Metadata)
}

func (m *metadataSink) setFromSeries(s *decodedSeries) {
	var name []byte
	for _, p := range s.labels {
		if bytes.Equal(p.name, nameLabel) {
			name = p.value
			break
		}
	}
	if len(name) == 0 {
		return
	}
	typ := metricTypeFromWire(s.meta.typ)
	m.set(familyName(string(name), typ), metadata.Metadata{Type: typ, Help: string(s.meta.help), Unit: string(s.meta.unit)})
}

// metricTypeFromWire converts the wire enum; 1.0 and 2.0 number the types alike.
func metricTypeFromWire(t int32) model.MetricType {
	switch prompb.MetricMetadata_MetricType(t) {
	case prompb.MetricMetadata_COUNTER:
		return model.MetricTypeCounter
	case prompb.MetricMetadata_GAUGE:
		return model.MetricTypeGauge
	case prompb.MetricMetadata_HISTOGRAM:
		return model.MetricTypeHistogram
	case prompb.MetricMetadata_GAUGEHISTOGRAM:
		return model.MetricTypeGaugeHistogram
	case prompb.MetricMetadata_SUMMARY:
		return model.MetricTypeSummary
	case prompb.MetricMetadata_INFO:
		return model.MetricTypeInfo
	case prompb.MetricMetadata_STATESET:
		return model.MetricTypeStateset
	}
	return model.MetricTypeUnknown
}

// familyName strips the suffixes a histogram or summary adds to its series.
func familyName(name string, typ model.MetricType) string {
	switch typ {
	case model.MetricTypeHistogram, model.MetricTypeGaugeHistogram, model.MetricTypeSummary:
		for _, suf := range []string{"_bucket", "_count", "_sum", "_created"} {
			if strings.HasSuffix(name, suf) {
				return strings.TrimSuffix(name, suf)
			}
		}
	case model.MetricTypeCounter:
		return strings.TrimSuffix(name, "_created")
	}
	return name
}
