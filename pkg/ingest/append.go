package ingest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
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

	"github.com/gpustore/gpustore/pkg/hatracker"
	"github.com/gpustore/gpustore/pkg/limits"
	"github.com/gpustore/gpustore/pkg/tenantdb"
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

	reasonTooManyLabels     = "too_many_labels"
	reasonLabelNameTooLong  = "label_name_too_long"
	reasonLabelValueTooLong = "label_value_too_long"
	reasonMaxSeries         = "max_active_series"
	// Whole-request rejections.
	reasonTooManySeries = "too_many_series_in_request"
	reasonRateLimited   = "rate_limited"
)

var rejectReasons = []string{
	reasonInvalidLabels, reasonOutOfOrder, reasonDuplicate, reasonTooOld, reasonTooFarFuture, reasonInvalidHist, reasonNoSamples,
	reasonTooManyLabels, reasonLabelNameTooLong, reasonLabelValueTooLong, reasonMaxSeries, reasonTooManySeries, reasonRateLimited,
}

// maxAheadTime is how far in the future a sample may be; Prometheus' own
// receiver uses the same bound.
const maxAheadTime = 10 * time.Minute

// writeStats counts what one request wrote and what it rejected.
type writeStats struct {
	samples, histograms, exemplars int
	rejected                       map[string]int
	firstRejection                 string
	newSeries                      int
	// deduplicated counts samples dropped because the other replica of their
	// HA pair is elected (or already covered their time): acknowledged, not stored.
	deduplicated int
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
	key       seriesKey
	builder   labels.ScratchBuilder
	exemplars []exemplar.Exemplar
	v1hist    prompb.Histogram
	v2hist    writev2.Histogram
	v1ex      prompb.Exemplar
	v2ex      writev2.Exemplar
}

// writeRequest is the append loop of one request.
type writeRequest struct {
	ctx    context.Context
	tenant *tenantState
	app    storage.AppenderV2
	exApp  storage.ExemplarAppenderV2
	v2     *v2Decoder // nil for 1.0
	ac     *appendCtx
	lim    *limits.Limits
	ha     *hatracker.Tracker // nil: HA pairs are not deduplicated
	gap    int64              // the tracker's gap-fill delay in ms (0: off)
	maxT   int64
	stats  *writeStats
	series int
	// decisions memoises the tracker's answer per HA pair for this request:
	// a request comes from one Prometheus, so it is nearly always one pair.
	decisions []haDecision
}

// haDecision is the tracker's answer for one (cluster, replica) of a request.
type haDecision struct {
	pair             uint32 // index in the tenant's haTable
	cluster, replica string
	elected          bool
	// fill: the elected replica has been silent for the gap-fill delay, so
	// this replica's samples may fill the gap until the failover.
	fill    bool
	dropped int // samples dropped as duplicates
}

// errTooManySeries fails a request with more series than the tenant allows.
var errTooManySeries = errors.New("too many series in one request")

// run writes every series the decoder yields. It returns an error only for
// faults that must fail the whole request (a malformed body, a storage or KV
// fault, too many series); rejected data is counted in stats.
func (w *writeRequest) run(dec seriesDecoder) error {
	if w.ha != nil {
		w.gap = w.ha.GapFillAfter().Milliseconds()
	}
	for dec.next() {
		w.series++
		if limit := w.lim.MaxSeriesPerRequest; limit > 0 && w.series > limit {
			return fmt.Errorf("%w: more than %d (limit max_series_per_request)", errTooManySeries, limit)
		}
		if err := w.appendOne(dec.series()); err != nil {
			return err
		}
	}
	return dec.err()
}

func (w *writeRequest) appendOne(s *decodedSeries) error {
	stats, cache := w.stats, w.tenant.cache
	n := len(s.samples) + len(s.histograms)
	if n == 0 {
		if len(s.exemplars) == 0 {
			stats.reject(reasonNoSamples, 0, "series %s has no samples", describe(s.labels))
		}
		return nil
	}
	key := &w.ac.key
	if w.ha != nil {
		key.compute(s.labels, w.lim.HAClusterLabel, w.lim.HAReplicaLabel)
	} else {
		key.compute(s.labels, "", "")
	}
	e := cache.get(key.h1, key.h2)

	// A series of an HA pair: ask the tracker (once per request and pair).
	var d *haDecision
	if key.replica != nil {
		var err error
		if d, err = w.decide(key.cluster, key.replica); err != nil {
			return err
		}
		if !d.elected && !d.fill {
			d.dropped += n
			stats.deduplicated += n
			if e == nil {
				cache.put(key.h1, key.h2, 0) // known, labels not needed yet
			}
			return nil
		}
	}
	if s.meta.set {
		w.tenant.md.setFromSeries(s)
	}

	var ref storage.SeriesRef
	if e != nil {
		ref = e.ref
	}
	// ls is built only when the cache has no reference for the series.
	var ls labels.Labels
	resolve := func() bool {
		var reason string
		var err error
		drop := ""
		if key.replica != nil {
			drop = w.lim.HAReplicaLabel
		}
		ls, reason, err = buildLabels(&w.ac.builder, s.labels, w.lim, drop)
		if err != nil {
			stats.reject(reason, n, "%v", err)
			return false
		}
		return true
	}
	if ref == 0 && !resolve() {
		return nil
	}
	// appended records a successful append and caches a new reference.
	appended := func(newRef storage.SeriesRef) {
		if ref == 0 {
			ref = newRef
			e = cache.put(key.h1, key.h2, ref)
			stats.newSeries++
		}
	}
	// rejected classifies an append error; false means a storage fault.
	rejected := func(err error, t int64) bool {
		reason, ok := sampleRejection(err)
		if !ok {
			return false
		}
		if d != nil && (reason == reasonOutOfOrder || reason == reasonDuplicate) {
			// The other replica of the pair already covered this time:
			// a duplicate, not an error the sender should see.
			d.dropped++
			stats.deduplicated++
			return true
		}
		stats.reject(reason, 1, "%v for series %s at %s", err, describe(s.labels), timestamp.Time(t).UTC().Format(time.RFC3339Nano))
		return true
	}
	// duplicate applies the HA rule to one sample and, if it is to be
	// stored, records it as the series' newest.
	duplicate := func(t int64) bool {
		if d == nil || e == nil {
			return false
		}
		if w.claim(e, d, t) {
			return false
		}
		d.dropped++
		stats.deduplicated++
		return true
	}

	for i := range s.samples {
		smp := &s.samples[i]
		if smp.t > w.maxT {
			stats.reject(reasonTooFarFuture, 1, "sample at %s is more than %s in the future for series %s", timestamp.Time(smp.t).UTC().Format(time.RFC3339), maxAheadTime, describe(s.labels))
			continue
		}
		if duplicate(smp.t) {
			continue
		}
		newRef, err := w.app.Append(ref, ls, smp.st, smp.t, smp.v, nil, nil, storage.AOptions{})
		if err != nil && ref != 0 && ls.IsEmpty() && errors.Is(err, tsdb.ErrInvalidSample) {
			// The cached reference is gone from the head (series garbage
			// collected): resolve the series again from its labels.
			ref = 0
			if !resolve() {
				return nil
			}
			newRef, err = w.app.Append(0, ls, smp.st, smp.t, smp.v, nil, nil, storage.AOptions{})
		}
		if err != nil {
			if rejected(err, smp.t) {
				continue
			}
			return fmt.Errorf("append sample: %w", err)
		}
		stats.samples++
		appended(newRef)
		if d != nil && i == 0 && e != nil && e.lastPair.Load() == 0 {
			w.claim(e, d, smp.t) // first sample of a new series
		}
	}

	for _, raw := range s.histograms {
		h, fh, t, st, err := decodeHistogram(w.ac, raw, w.v2 != nil)
		if err != nil {
			return err
		}
		if t > w.maxT {
			stats.reject(reasonTooFarFuture, 1, "histogram at %s is more than %s in the future for series %s", timestamp.Time(t).UTC().Format(time.RFC3339), maxAheadTime, describe(s.labels))
			continue
		}
		if duplicate(t) {
			continue
		}
		// Histograms are rare: resolve labels rather than trust a possibly
		// stale reference with empty labels.
		if ls.IsEmpty() && !resolve() {
			return nil
		}
		newRef, err := w.app.Append(ref, ls, st, t, 0, h, fh, storage.AOptions{})
		if err != nil {
			if rejected(err, t) {
				continue
			}
			if isHistogramValidationError(err) {
				stats.reject(reasonInvalidHist, 1, "%v for series %s", err, describe(s.labels))
				continue
			}
			return fmt.Errorf("append histogram: %w", err)
		}
		stats.histograms++
		appended(newRef)
	}

	if len(s.exemplars) > 0 && w.exApp != nil && ref != 0 {
		if ls.IsEmpty() && !resolve() {
			return nil
		}
		return appendExemplars(w.exApp, w.ac, ref, ls, s.exemplars, w.v2, stats)
	}
	return nil
}

// claim decides whether a sample at t of an HA series is stored, and if so
// records it as the series' newest. The rule keeps one replica's samples
// per series and never stores two samples of different replicas closer than
// the gap-fill delay:
//   - the elected replica's sample is stored unless the newest stored one
//     came from the other replica less than the delay before (a gap it filled);
//   - the other replica's sample, while the elected one is silent (fill), is
//     stored if it continues its own fill or is at least the delay newer than
//     the newest stored sample.
//
// The compare-and-swap makes the check and the update one step, so two
// requests racing on one series cannot both pass.
func (w *writeRequest) claim(e *cacheEntry, d *haDecision, t int64) bool {
	// The steady state, the elected replica continuing its own series, is
	// a plain store: no compare-and-swap on the hot path.
	if last, lastPair := e.lastT.Load(), e.lastPair.Load(); d.elected && lastPair == d.pair {
		if t > last {
			e.lastT.Store(t)
		}
		return true
	}
	for {
		last, lastPair := e.lastT.Load(), e.lastPair.Load()
		ok := false
		switch {
		case lastPair == 0:
			ok = true
		case d.elected:
			ok = lastPair == d.pair || t >= last+w.gap
		default: // filling
			ok = (lastPair == d.pair && t >= last) || t >= last+w.gap
		}
		if !ok {
			return false
		}
		if t <= last && lastPair != 0 {
			return true // older than the newest: the TSDB decides (out of order)
		}
		if e.lastT.CompareAndSwap(last, t) {
			e.lastPair.Store(d.pair)
			return true
		}
	}
}

// decide asks the tracker, once per request and HA pair, whether the pair's
// replica is the elected one.
func (w *writeRequest) decide(cluster, replica []byte) (*haDecision, error) {
	// The memo is searched by the wire bytes: a request nearly always has a
	// single pair, so this is one short comparison per series instead of an
	// intern-table lookup (a lock and a string hash).
	for i := range w.decisions {
		d := &w.decisions[i]
		if string(replica) == d.replica && string(cluster) == d.cluster {
			return d, nil
		}
	}
	idx := w.tenant.ha.index(cluster, replica)
	p := w.tenant.ha.pair(idx)
	elected, err := w.ha.Accept(w.ctx, w.tenant.id, p.cluster, p.replica)
	if err != nil {
		return nil, err
	}
	d := haDecision{pair: idx, cluster: p.cluster, replica: p.replica, elected: elected}
	if !elected && w.gap > 0 && w.ha.Silence(w.tenant.id, p.cluster).Milliseconds() >= w.gap {
		d.fill = true
	}
	w.decisions = append(w.decisions, d)
	return &w.decisions[len(w.decisions)-1], nil
}

// haTable interns the (cluster, replica) pairs of a tenant's series as small
// indexes, so the dedup state per series is two atomics.
type haTable struct {
	mtx   sync.RWMutex
	idx   map[haPair]uint32
	pairs []haPair // pairs[0] is "no pair"
}

type haPair struct{ cluster, replica string }

func newHATable() *haTable {
	return &haTable{idx: map[haPair]uint32{}, pairs: []haPair{{}}}
}

func (t *haTable) index(cluster, replica []byte) uint32 {
	t.mtx.RLock()
	i, ok := t.idx[haPair{yoloString(cluster), yoloString(replica)}]
	t.mtx.RUnlock()
	if ok {
		return i
	}
	p := haPair{string(cluster), string(replica)}
	t.mtx.Lock()
	defer t.mtx.Unlock()
	if i, ok := t.idx[p]; ok {
		return i
	}
	i = uint32(len(t.pairs))
	t.pairs = append(t.pairs, p)
	t.idx[p] = i
	return i
}

func (t *haTable) pair(i uint32) haPair {
	t.mtx.RLock()
	defer t.mtx.RUnlock()
	return t.pairs[i]
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
	case errors.Is(err, tenantdb.ErrMaxActiveSeries):
		return reasonMaxSeries, true
	case errors.Is(err, tsdb.ErrInvalidSample):
		return reasonInvalidLabels, true
	}
	return "", false
}

func isHistogramValidationError(err error) bool {
	var e histogram.Error
	return errors.As(err, &e)
}

// buildLabels validates a series' label pairs against the tenant's limits
// and returns them as sorted labels, without the label named drop (the HA
// replica label). It runs only for series the cache does not know; on error
// it also returns the rejection reason.
func buildLabels(b *labels.ScratchBuilder, pairs []labelPair, lim *limits.Limits, drop string) (labels.Labels, string, error) {
	b.Reset()
	hasName := false
	n := 0
	for _, p := range pairs {
		if len(p.name) == 0 {
			return labels.EmptyLabels(), reasonInvalidLabels, fmt.Errorf("empty label name in series %s", describe(pairs))
		}
		if len(p.value) == 0 || (drop != "" && yoloString(p.name) == drop) {
			// An empty value means the label is absent, as everywhere in Prometheus.
			continue
		}
		if !utf8.Valid(p.name) || !model.UTF8Validation.IsValidLabelName(yoloString(p.name)) {
			return labels.EmptyLabels(), reasonInvalidLabels, fmt.Errorf("invalid label name %q in series %s", p.name, describe(pairs))
		}
		if !utf8.Valid(p.value) {
			return labels.EmptyLabels(), reasonInvalidLabels, fmt.Errorf("label %q has a value that is not valid UTF-8 in series %s", p.name, describe(pairs))
		}
		if len(p.name) > lim.MaxLabelNameLength {
			return labels.EmptyLabels(), reasonLabelNameTooLong, fmt.Errorf("label name %q is longer than %d (limit max_label_name_length) in series %s", p.name, lim.MaxLabelNameLength, describe(pairs))
		}
		if len(p.value) > lim.MaxLabelValueLength {
			return labels.EmptyLabels(), reasonLabelValueTooLong, fmt.Errorf("value of label %q is longer than %d (limit max_label_value_length) in series %s", p.name, lim.MaxLabelValueLength, describe(pairs))
		}
		if bytes.Equal(p.name, nameLabel) {
			hasName = true
		}
		n++
		b.Add(yoloString(p.name), yoloString(p.value))
	}
	if !hasName {
		return labels.EmptyLabels(), reasonInvalidLabels, fmt.Errorf("series %s has no metric name (__name__)", describe(pairs))
	}
	if n > lim.MaxLabelNamesPerSeries {
		return labels.EmptyLabels(), reasonTooManyLabels, fmt.Errorf("series %s has %d labels, more than %d (limit max_label_names_per_series)", describe(pairs), n, lim.MaxLabelNamesPerSeries)
	}
	b.Sort()
	ls := b.Labels() // copies: the result no longer points into the request body
	if dup, ok := ls.HasDuplicateLabelNames(); ok {
		return labels.EmptyLabels(), reasonInvalidLabels, fmt.Errorf("duplicate label name %q in series %s", dup, describe(pairs))
	}
	return ls, "", nil
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
