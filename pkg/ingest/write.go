package ingest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/prometheus/model/exemplar"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/timestamp"
	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"

	"github.com/gpustore/gpustore/pkg/hatracker"
	"github.com/gpustore/gpustore/pkg/limits"
	"github.com/gpustore/gpustore/pkg/relabel"
	"github.com/gpustore/gpustore/pkg/tenantdb"
)

// The store step of a write, after the transport (ingest.go) has read the
// body: the rate limit, then per series the cache lookup and HA dedup, then
// a helper per data type (samples, histograms, exemplars, metadata) appends
// to one TSDB appender, whose Commit writes the WAL before the request is
// answered.

// Reasons a sample is rejected; they name the label of
// gpustore_ingest_rejected_samples_total and docs/ingest.md's table.
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
	reasonMaxSeriesMetric   = "max_series_per_metric"
	reasonMaxNewSeriesDay   = "max_new_series_per_day"
	// Whole-request rejections.
	reasonTooManySeries = "too_many_series_in_request"
	reasonRateLimited   = "rate_limited"
)

var rejectReasons = []string{
	reasonInvalidLabels, reasonOutOfOrder, reasonDuplicate, reasonTooOld, reasonTooFarFuture, reasonInvalidHist, reasonNoSamples,
	reasonTooManyLabels, reasonLabelNameTooLong, reasonLabelValueTooLong, reasonMaxSeries, reasonMaxSeriesMetric, reasonMaxNewSeriesDay, reasonTooManySeries, reasonRateLimited,
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
	// relabelDropped counts samples of series the tenant's relabel rules
	// drop: acknowledged, not stored.
	relabelDropped int
	// derived is set while a series gpustore derives itself (the dcgm
	// preset's driver info) is appended: its rejections are counted in
	// derivedRejected, not answered to the sender, and what it wrote is
	// derivedAcked, left out of the samples a 2.0 answer reports.
	derived         bool
	derivedAcked    int
	derivedRejected map[string]int
	// metadataRejected counts a 1.0 request's metadata entries refused,
	// by reason (metadata.go), firstMetadata names the first.
	metadataRejected map[string]int
	firstMetadata    string
}

func (s *writeStats) rejectMetadata(reason string, err error) {
	if s.metadataRejected == nil {
		s.metadataRejected = map[string]int{}
	}
	s.metadataRejected[reason]++
	if s.firstMetadata == "" {
		s.firstMetadata = err.Error()
	}
}

// acknowledged is what a 2.0 answer reports as written, out of what the
// sender sent: stored, deduplicated, or dropped by the tenant's rules.
func (s *writeStats) acknowledged() int {
	return s.samples + s.deduplicated + s.relabelDropped - s.derivedAcked
}

func (s *writeStats) reject(reason string, n int, format string, args ...any) {
	if s.derived {
		if s.derivedRejected == nil {
			s.derivedRejected = map[string]int{}
		}
		s.derivedRejected[reason] += n
		return
	}
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
	counts := func(what string, total int, reasons []string, by map[string]int) {
		fmt.Fprintf(&b, "%d %s rejected (", total, what)
		first := true
		for _, r := range reasons {
			if n := by[r]; n > 0 {
				if !first {
					b.WriteString(", ")
				}
				fmt.Fprintf(&b, "%s: %d", r, n)
				first = false
			}
		}
		b.WriteString(")")
	}
	if len(s.rejected) > 0 {
		counts("samples", s.rejectedTotal(), rejectReasons, s.rejected)
	}
	if len(s.metadataRejected) > 0 {
		if len(s.rejected) > 0 {
			b.WriteString(" and ")
		}
		n := 0
		for _, v := range s.metadataRejected {
			n += v
		}
		counts("metadata entries", n, metadataReasons, s.metadataRejected)
	}
	b.WriteString("; the rest of the request was stored; first: ")
	if s.firstRejection != "" {
		b.WriteString(s.firstRejection)
	} else {
		b.WriteString(s.firstMetadata)
	}
	return b.String()
}

// appendCtx is the scratch space of the append helpers; it is pooled with
// the decoders so the steady state allocates nothing.
type appendCtx struct {
	key       seriesKey
	builder   labels.ScratchBuilder
	exemplars []exemplar.Exemplar
	v1hist    prompb.Histogram
	v2hist    writev2.Histogram
	v1ex      prompb.Exemplar
	v2ex      writev2.Exemplar
	v1meta    prompb.MetricMetadata
	// relabel holds a series' labels while the tenant's rules run; nil
	// until a tenant with rules meets a series the cache does not know.
	relabel *labels.Builder
	// info is the dcgm preset's driver info series being derived.
	info decodedSeries
}

// writeRequest is the state of one request's store step. It lives in the
// pooled requestState; reset starts a request.
type writeRequest struct {
	ctx       context.Context
	tenant    *tenantState
	lim       *limits.Limits
	limitsGen uint32             // the tenant's label-limits generation when lim was read
	rules     *relabel.Rules     // the tenant's relabel rules; nil: none (the fast path)
	dcgmHost  string             // with the dcgm preset on, the host label it keeps; else ""
	ha        *hatracker.Tracker // nil: HA pairs are not deduplicated
	gap       int64              // the tracker's gap-fill delay in ms (0: off)
	maxT      int64
	v2        *v2Decoder // nil for 1.0
	app       storage.AppenderV2
	exApp     storage.ExemplarAppenderV2
	zeroApp   ZeroAppender // nil: appendZero appends the zero to app
	ac        appendCtx
	stats     writeStats
	series    int

	// zeros: store a zero at a sample's start timestamp (appendZero), as
	// the tenant's created_timestamp_zero_ingestion says or, on a
	// receiver, as the distributor asks (startTimestamps).
	zeros bool
	// startTimestamps: a receiver reads the start timestamps of a 1.0
	// request, which only its distributor sends (v1Decoder.startTimestamps).
	startTimestamps bool

	// decisions memoises the tracker's answer per HA pair for this request:
	// a request comes from one Prometheus, so it is nearly always one pair.
	decisions []haDecision
	// claims are the request's HA claims, committed or released with it.
	claims []haClaim
}

// release lets go of what the request referenced (its context, tenant,
// appender, the labels and exemplars it built) once it is answered, keeping
// the scratch space that costs nothing to keep.
func (w *writeRequest) release() {
	ac := w.ac
	ac.exemplars = releaseViews(ac.exemplars)
	ac.info.release()
	ac.v1hist.Reset()
	ac.v2hist = writev2.Histogram{}
	ac.v1ex.Reset()
	ac.v2ex = writev2.Exemplar{}
	ac.v1meta.Reset()
	*w = writeRequest{ac: ac, decisions: releaseViews(w.decisions), claims: releaseViews(w.claims)}
}

func (w *writeRequest) reset(ctx context.Context, st *tenantState, lim *limits.Limits, gen uint32, ha *hatracker.Tracker, now time.Time) {
	*w = writeRequest{
		ctx: ctx, tenant: st, lim: lim, limitsGen: gen, ha: ha, rules: lim.Relabel(),
		maxT: timestamp.FromTime(now.Add(maxAheadTime)),
		ac:   w.ac, decisions: w.decisions[:0], claims: w.claims[:0],
	}
	w.dcgmHost, _ = w.rules.DCGM()
	w.ac.builder.SetSymbolTable(st.symbols())
	if ha != nil {
		w.gap = ha.GapFillAfter().Milliseconds()
	}
}

// errTooManySeries fails a request with more series than the tenant allows.
var errTooManySeries = errors.New("too many series in one request")

// store writes a decoded request body to the tenant's TSDB and returns what
// was written and rejected. An error fails the whole request and nothing of
// it is stored; its status is chosen by Ingester.fail.
func (i *Ingester) store(ctx context.Context, st *tenantState, rs *requestState, body []byte, v2 bool) (*writeStats, error) {
	// The generation is read before the limits: a series validated under
	// limits older than the generation says is validated again.
	gen := st.limitsGen.Load()
	lim := i.limits.For(st.id)
	now := i.now()
	w := &rs.w
	w.reset(ctx, st, &lim, gen, i.ha, now)
	if i.downstream {
		// The distributor rate-limited and relabeled this data already.
		lim.IngestionRate = 0
		w.rules, w.dcgmHost = nil, ""
	}
	w.zeros = lim.CreatedTimestampZeroIngestion
	if v2 {
		w.v2 = rs.v2
	} else if i.downstream {
		// The distributor decided per tenant which samples get a zero: it
		// sends a start timestamp with those alone.
		w.startTimestamps, w.zeros = true, true
	}
	rs.v1.startTimestamps = w.startTimestamps

	// The ingestion rate is checked before anything is appended: a request
	// over it must not create head series (which count against
	// max_active_series) nor spend the CPU the limit is there to bound.
	if lim.IngestionRate > 0 {
		n, err := w.count(rs.decoder(body, v2))
		if err != nil {
			return nil, w.failed(err)
		}
		if !v2 {
			// A metadata entry costs what a sample does; requests of
			// metadata alone are rate-limited too.
			n += len(rs.v1.metadata)
		}
		if n > 0 && !i.rate.AllowN(now, st.id, n) {
			st.m.rejected(reasonRateLimited).Add(float64(n))
			return nil, &httpError{
				status:     lim.RateLimitStatusCode,
				retryAfter: max(1, int(math.Ceil(float64(n)/lim.IngestionRate))),
				msg: fmt.Sprintf("ingestion rate limit of %g samples/s (burst %d) for tenant %q exceeded by a request of %d samples; retry later",
					lim.IngestionRate, lim.IngestionBurstSize, st.id, n),
			}
		}
		w.series = 0
	}

	w.app = st.appendable.AppenderV2(ctx)
	w.exApp, _ = w.app.(storage.ExemplarAppenderV2)
	w.zeroApp, _ = w.app.(ZeroAppender)
	err := w.run(rs.decoder(body, v2))
	if err == nil && !v2 {
		err = w.appendMetadataV1(rs.v1.metadata)
	}
	if err != nil {
		_ = w.app.Rollback()
		return nil, w.failed(err)
	}
	// Commit writes the WAL: only after it returns may the request be
	// acknowledged, and only then do its HA claims become the series' state.
	if err := w.app.Commit(); err != nil {
		w.releaseClaims()
		return nil, fmt.Errorf("commit to tenant %q: %w", st.id, err)
	}
	for i := range w.claims {
		w.claims[i].commit()
	}
	w.recordMetrics()
	return &w.stats, nil
}

// failed gives the request's claims back and counts a whole-request rejection.
func (w *writeRequest) failed(err error) error {
	w.releaseClaims()
	if errors.Is(err, errTooManySeries) {
		w.tenant.m.rejected(reasonTooManySeries).Add(float64(w.series))
	}
	if errors.Is(err, errMalformed) || errors.Is(err, errTooManySeries) || errors.Is(err, errHAConflict) {
		return err
	}
	return fmt.Errorf("write to tenant %q: %w", w.tenant.id, err)
}

func (w *writeRequest) releaseClaims() {
	for i := range w.claims {
		w.claims[i].release()
	}
	w.claims = w.claims[:0]
}

func (w *writeRequest) recordMetrics() {
	m, stats := w.tenant.m, &w.stats
	for _, d := range w.decisions {
		if d.dropped > 0 {
			m.deduplicated(d.cluster).Add(float64(d.dropped))
		}
	}
	m.samples.Add(float64(stats.samples))
	m.histograms.Add(float64(stats.histograms))
	m.exemplars.Add(float64(stats.exemplars))
	m.newSeries.Add(float64(stats.newSeries))
	if stats.relabelDropped > 0 {
		m.relabelDropped.Add(float64(stats.relabelDropped))
	}
	for reason, n := range stats.rejected {
		m.rejected(reason).Add(float64(n))
	}
	for reason, n := range stats.derivedRejected {
		m.rejected(reason).Add(float64(n))
	}
	for reason, n := range stats.metadataRejected {
		m.rejectedMetadata[reason].Add(float64(n))
	}
}

// nextSeries counts a series against max_series_per_request.
func (w *writeRequest) nextSeries() error {
	w.series++
	if limit := w.lim.MaxSeriesPerRequest; limit > 0 && w.series > limit {
		return fmt.Errorf("%w: more than %d (limit max_series_per_request)", errTooManySeries, limit)
	}
	return nil
}

// count is the first, cheap pass when the tenant has an ingestion rate: the
// samples and histograms the append pass will try to store, without cache
// lookups, labels or appends. Series of a replica the HA tracker drops are
// not counted, as they are not stored.
func (w *writeRequest) count(dec seriesDecoder) (int, error) {
	n := 0
	for dec.next() {
		if err := w.nextSeries(); err != nil {
			return 0, err
		}
		s := dec.series()
		if w.ha != nil {
			if cluster, replica := haLabels(s.labels, w.lim.HAClusterLabel, w.lim.HAReplicaLabel); replica != nil {
				i, err := w.decide(cluster, replica)
				if err != nil {
					return 0, err
				}
				if d := &w.decisions[i]; !d.elected && !d.fill {
					continue
				}
			}
		}
		n += len(s.samples) + len(s.histograms)
	}
	return n, dec.err()
}

// run appends every series the decoder yields. It returns an error only for
// faults that must fail the whole request (a malformed body, a storage or KV
// fault, too many series, an HA conflict); rejected data is counted in stats.
func (w *writeRequest) run(dec seriesDecoder) error {
	for dec.next() {
		if err := w.nextSeries(); err != nil {
			return err
		}
		s := dec.series()
		if err := w.appendSeries(s); err != nil {
			return err
		}
		if w.dcgmHost != "" {
			if err := w.appendDriverInfo(s); err != nil {
				return err
			}
		}
	}
	return dec.err()
}

// seriesWrite is one series of a request on its way into the appender: its
// cache entry, its TSDB reference and labels as far as they are resolved,
// and its HA claim.
type seriesWrite struct {
	w     *writeRequest
	s     *decodedSeries
	e     *cacheEntry // nil: not cached yet
	ref   storage.SeriesRef
	ls    labels.Labels // built only when the reference is unknown or stale
	claim int           // index in w.claims; -1: not an HA pair's series
	// failed: the series was rejected whole (its labels are invalid) or
	// the tenant's relabel rules drop it.
	failed bool
	// mul and div convert the series' values to the unit the dcgm preset
	// stores (dcgm-exporter 4.9's renamed metrics, see dcgmUnitScale):
	// value * mul / div; div 0: the value is kept.
	mul, div float64
}

func (w *writeRequest) appendSeries(s *decodedSeries) error {
	n := len(s.samples) + len(s.histograms)
	if n == 0 {
		if len(s.exemplars) == 0 {
			w.stats.reject(reasonNoSamples, 0, "series %s has no samples", describe(s.labels))
		}
		return nil
	}
	key := &w.ac.key
	if w.ha != nil {
		key.compute(s.labels, w.lim.HAClusterLabel, w.lim.HAReplicaLabel)
	} else {
		key.compute(s.labels, "", "")
	}
	sw := seriesWrite{w: w, s: s, e: w.tenant.cache.get(key.h1, key.h2), claim: -1}
	if w.dcgmHost != "" {
		sw.mul, sw.div = dcgmUnitScale(s.labels)
	}

	// A series of an HA pair: ask the tracker (once per request and pair).
	if key.replica != nil {
		di, err := w.decide(key.cluster, key.replica)
		if err != nil {
			return err
		}
		d := &w.decisions[di]
		if sw.e == nil {
			sw.e = w.tenant.cache.getOrCreate(key.h1, key.h2) // the dedup state lives there
		}
		if !d.elected && !d.fill {
			d.dropped += n
			w.stats.deduplicated += n
			return nil
		}
		w.claims = append(w.claims, haClaim{st: &sw.e.ha, decision: di, pair: d.pair, elected: d.elected})
		sw.claim = len(w.claims) - 1
		defer sw.dropUnusedClaim()
	}
	if s.meta.set {
		w.setMetadataOfSeries(s)
	}
	if sw.e != nil {
		sw.ref = sw.e.seriesRef()
	}
	if sw.ref != 0 && sw.e.limitsGen.Load() != w.limitsGen && !sw.revalidate() {
		return nil
	}
	if sw.ref == refDropped {
		w.stats.relabelDropped += n
		return nil
	}
	if sw.ref == 0 && !sw.resolve() {
		return nil
	}
	if err := sw.appendSamples(); err != nil || sw.failed {
		return err
	}
	if err := sw.appendHistograms(); err != nil || sw.failed {
		return err
	}
	return sw.appendExemplars()
}

// replicaLabel is the label left out of the stored series: the replica
// label of an HA pair's series.
func (sw *seriesWrite) replicaLabel() string {
	if sw.w.ac.key.replica != nil {
		return sw.w.lim.HAReplicaLabel
	}
	return ""
}

// revalidate checks a cached series again after the tenant's label limits
// or relabel rules changed; false: the series is rejected (and counted).
func (sw *seriesWrite) revalidate() bool {
	w := sw.w
	if w.rules != nil || sw.e.relabeled.Load() {
		// Rules decide which series the labels are stored as (or whether
		// at all): resolve the series again from its labels.
		sw.ref = 0
		return true
	}
	if reason, err := checkLabels(sw.s.labels, w.lim, sw.replicaLabel()); err != nil {
		w.stats.reject(reason, len(sw.s.samples)+len(sw.s.histograms), "%v", err)
		return false
	}
	sw.e.limitsGen.Store(w.limitsGen)
	return true
}

// resolve builds the series' labels, applies the tenant's relabel rules and
// validates the result; false: the series is rejected or dropped by the
// rules (and counted).
func (sw *seriesWrite) resolve() bool {
	w := sw.w
	n := len(sw.s.samples) + len(sw.s.histograms)
	ls, keep, reason, err := w.ac.seriesLabels(sw.s.labels, w.lim, w.rules, sw.replicaLabel())
	switch {
	case err != nil:
		w.stats.reject(reason, n, "%v", err)
	case !keep:
		sw.dropByRules(n)
	default:
		sw.ls = ls
		return true
	}
	sw.failed = true
	return false
}

// dropByRules caches that the tenant's rules drop the series, so its next
// samples are dropped on the cache hit, and counts its samples.
func (sw *seriesWrite) dropByRules(n int) {
	w := sw.w
	if sw.e == nil {
		sw.e = w.tenant.cache.getOrCreate(w.ac.key.h1, w.ac.key.h2)
	}
	sw.e.ref.Store(uint64(refDropped))
	sw.e.relabeled.Store(true)
	sw.e.limitsGen.Store(w.limitsGen)
	w.stats.relabelDropped += n
}

// admit applies the HA rule to a sample at t; false: it is dropped as a
// duplicate of the other replica's.
func (sw *seriesWrite) admit(t int64) (bool, error) {
	if sw.claim < 0 {
		return true, nil
	}
	c := &sw.w.claims[sw.claim]
	ok, err := c.admit(t, sw.w.gap)
	if err != nil {
		return false, fmt.Errorf("%w: series %s", err, describe(sw.s.labels))
	}
	if !ok {
		sw.w.decisions[c.decision].dropped++
		sw.w.stats.deduplicated++
	}
	return ok, nil
}

// dropUnusedClaim removes the series' claim if none of its samples needed it.
func (sw *seriesWrite) dropUnusedClaim() {
	if sw.claim == len(sw.w.claims)-1 && !sw.w.claims[sw.claim].registered {
		sw.w.claims = sw.w.claims[:sw.claim]
	}
}

// appended records a sample or histogram at t the appender took under ref,
// and caches the reference of a series seen for the first time.
func (sw *seriesWrite) appended(ref storage.SeriesRef, t int64) {
	sw.cacheRef(ref)
	if sw.claim >= 0 {
		sw.w.claims[sw.claim].appended(t)
	}
}

// cacheRef caches ref, under which the appender took data of a series seen
// for the first time (its reference was not known yet).
func (sw *seriesWrite) cacheRef(ref storage.SeriesRef) {
	if sw.ref != 0 {
		return
	}
	sw.ref = ref
	if sw.e == nil {
		sw.e = sw.w.tenant.cache.getOrCreate(sw.w.ac.key.h1, sw.w.ac.key.h2)
	}
	sw.e.ref.Store(uint64(ref))
	sw.e.relabeled.Store(sw.w.rules != nil)
	sw.e.limitsGen.Store(sw.w.limitsGen)
	sw.w.stats.newSeries++
}

// rejected classifies an append error; false means a storage fault.
func (sw *seriesWrite) rejected(err error, t int64) bool {
	reason, ok := sampleRejection(err)
	if !ok {
		return false
	}
	if sw.claim >= 0 && (reason == reasonOutOfOrder || reason == reasonDuplicate) {
		// The other replica of the pair already covered this time:
		// a duplicate, not an error the sender should see.
		sw.w.decisions[sw.w.claims[sw.claim].decision].dropped++
		sw.w.stats.deduplicated++
		return true
	}
	sw.w.stats.reject(reason, 1, "%v for series %s at %s", err, describe(sw.s.labels), timestamp.Time(t).UTC().Format(time.RFC3339Nano))
	return true
}

func (sw *seriesWrite) appendSamples() error {
	w := sw.w
	for i := range sw.s.samples {
		smp := &sw.s.samples[i]
		if smp.t > w.maxT {
			w.stats.reject(reasonTooFarFuture, 1, "sample at %s is more than %s in the future for series %s", timestamp.Time(smp.t).UTC().Format(time.RFC3339), maxAheadTime, describe(sw.s.labels))
			continue
		}
		if ok, err := sw.admit(smp.t); err != nil {
			return err
		} else if !ok {
			continue
		}
		zero := w.zeros && smp.st != 0 && smp.st < smp.t
		if zero {
			sw.appendZero(smp.st, nil, nil)
		}
		v := smp.v
		if sw.div != 0 {
			v = v * sw.mul / sw.div
		}
		ref, err := w.app.Append(sw.ref, sw.ls, smp.st, smp.t, v, nil, nil, storage.AOptions{})
		if err != nil && sw.ref != 0 && sw.ls.IsEmpty() && errors.Is(err, tsdb.ErrInvalidSample) {
			// The cached reference is gone from the head (series garbage
			// collected): resolve the series again from its labels. The
			// zero failed under the old reference too: it goes again.
			sw.ref = 0
			if !sw.resolve() {
				return nil
			}
			if zero {
				sw.appendZero(smp.st, nil, nil)
			}
			ref, err = w.app.Append(sw.ref, sw.ls, smp.st, smp.t, v, nil, nil, storage.AOptions{})
		}
		if err != nil {
			if sw.rejected(err, smp.t) {
				continue
			}
			return fmt.Errorf("append sample: %w", err)
		}
		w.stats.samples++
		sw.appended(ref, smp.t)
	}
	return nil
}

// appendZero stores, for a sample whose start (created) timestamp st the
// sender gave, a zero at st before it, as Prometheus does with
// --enable-feature=created-timestamp-zero-ingestion: a counter that
// started (or restarted) at st then reads as rising from 0 there, so
// rate() and increase() count its first samples' value. It is best effort
// as in Prometheus' TSDB: never out of order (a series already holding
// samples at or after st keeps them alone), never reported to the sender,
// not counted as a written sample. A histogram's zero keeps its schema and
// bucket layout, marked as a counter reset. A series it creates is cached
// like one a sample creates (its next write finds it by reference).
//
// The distributor (a ZeroAppender) is handed the zero apart: it cannot
// tell whether it is in order, its receivers can, and an append with
// RejectOutOfOrder is not always a zero (the rules manager appends every
// rule result so). The series' next append is the sample at t > st whose
// start st is.
func (sw *seriesWrite) appendZero(st int64, h *histogram.Histogram, fh *histogram.FloatHistogram) {
	var ref storage.SeriesRef
	var err error
	if sw.w.zeroApp != nil {
		ref, err = sw.w.zeroApp.AppendZero(sw.ref, sw.ls, st)
	} else {
		switch {
		case fh != nil:
			fh = &histogram.FloatHistogram{CounterResetHint: histogram.CounterReset, Schema: fh.Schema, ZeroThreshold: fh.ZeroThreshold, CustomValues: fh.CustomValues}
		case h != nil:
			h = &histogram.Histogram{CounterResetHint: histogram.CounterReset, Schema: h.Schema, ZeroThreshold: h.ZeroThreshold, CustomValues: h.CustomValues}
		}
		ref, err = sw.w.app.Append(sw.ref, sw.ls, 0, st, 0, h, fh, storage.AOptions{RejectOutOfOrder: true})
	}
	if err != nil {
		return
	}
	if sw.ref == 0 {
		sw.cacheRef(ref)
		return
	}
	// The store may have found the series by its labels under another
	// reference than the stale cached one: the sample goes under the
	// zero's, which is how the distributor keeps the two together.
	sw.ref = ref
}

func (sw *seriesWrite) appendHistograms() error {
	w := sw.w
	for _, raw := range sw.s.histograms {
		h, fh, t, st, err := decodeHistogram(&w.ac, raw, w.v2 != nil || w.startTimestamps)
		if err != nil {
			return err
		}
		if t > w.maxT {
			w.stats.reject(reasonTooFarFuture, 1, "histogram at %s is more than %s in the future for series %s", timestamp.Time(t).UTC().Format(time.RFC3339), maxAheadTime, describe(sw.s.labels))
			continue
		}
		if ok, err := sw.admit(t); err != nil {
			return err
		} else if !ok {
			continue
		}
		// Histograms are rare: resolve labels rather than trust a possibly
		// stale reference with empty labels.
		if sw.ls.IsEmpty() && !sw.resolve() {
			return nil
		}
		if w.zeros && st != 0 && st < t {
			sw.appendZero(st, h, fh)
		}
		ref, err := w.app.Append(sw.ref, sw.ls, st, t, 0, h, fh, storage.AOptions{})
		if err != nil {
			if sw.rejected(err, t) {
				continue
			}
			if isHistogramValidationError(err) {
				w.stats.reject(reasonInvalidHist, 1, "%v for series %s", err, describe(sw.s.labels))
				continue
			}
			return fmt.Errorf("append histogram: %w", err)
		}
		w.stats.histograms++
		sw.appended(ref, t)
	}
	return nil
}

// appendExemplars appends the series' exemplars. They are best effort, as
// in Prometheus: only a malformed message fails the request.
func (sw *seriesWrite) appendExemplars() error {
	w := sw.w
	if len(sw.s.exemplars) == 0 || w.exApp == nil || sw.ref == 0 {
		return nil
	}
	if sw.ls.IsEmpty() && !sw.resolve() {
		return nil
	}
	ac := &w.ac
	ac.exemplars = ac.exemplars[:0]
	for _, raw := range sw.s.exemplars {
		e, err := decodeExemplar(ac, raw, w.v2)
		if err != nil {
			return err
		}
		ac.exemplars = append(ac.exemplars, e)
	}
	slices.SortFunc(ac.exemplars, exemplar.Compare)
	_, err := w.exApp.AppendExemplars(sw.ref, sw.ls, ac.exemplars)
	failed := 0
	if err != nil {
		var pErr *storage.AppendPartialError
		if !errors.As(err, &pErr) {
			return nil
		}
		failed = len(pErr.ExemplarErrors)
	}
	w.stats.exemplars += max(0, len(ac.exemplars)-failed)
	return nil
}

func decodeExemplar(ac *appendCtx, raw []byte, v2 *v2Decoder) (exemplar.Exemplar, error) {
	if v2 == nil {
		ac.v1ex.Reset()
		if err := ac.v1ex.Unmarshal(raw); err != nil {
			return exemplar.Exemplar{}, fmt.Errorf("%w: exemplar: %v", errMalformed, err)
		}
		return ac.v1ex.ToExemplar(&ac.builder, nil), nil
	}
	ac.v2ex.Reset()
	if err := ac.v2ex.Unmarshal(raw); err != nil {
		return exemplar.Exemplar{}, fmt.Errorf("%w: exemplar: %v", errMalformed, err)
	}
	refs := ac.v2ex.LabelsRefs
	if len(refs)%2 != 0 {
		return exemplar.Exemplar{}, malformed("Exemplar: odd number of labels_refs (%d)", len(refs))
	}
	lb := &ac.builder
	lb.Reset()
	for i := 0; i < len(refs); i += 2 {
		n, err := v2.symbol(refs[i])
		if err != nil {
			return exemplar.Exemplar{}, err
		}
		v, err := v2.symbol(refs[i+1])
		if err != nil {
			return exemplar.Exemplar{}, err
		}
		lb.Add(string(n), string(v))
	}
	lb.Sort()
	return exemplar.Exemplar{Labels: lb.Labels(), Value: ac.v2ex.Value, Ts: ac.v2ex.Timestamp, HasTs: ac.v2ex.Timestamp != 0}, nil
}

// decodeHistogram decodes a Histogram message and, with withStart, its
// start timestamp: 2.0's Histogram is 1.0's (fields 1 to 16) with
// start_timestamp (17), so 1.0 from a distributor is read as 2.0.
func decodeHistogram(ac *appendCtx, raw []byte, withStart bool) (h *histogram.Histogram, fh *histogram.FloatHistogram, t, st int64, err error) {
	if withStart {
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
	case errors.Is(err, tenantdb.ErrMaxSeriesPerMetric):
		return reasonMaxSeriesMetric, true
	case errors.Is(err, tenantdb.ErrMaxNewSeriesPerDay):
		return reasonMaxNewSeriesDay, true
	case errors.Is(err, tsdb.ErrInvalidSample):
		return reasonInvalidLabels, true
	}
	return "", false
}

func isHistogramValidationError(err error) bool {
	var e histogram.Error
	return errors.As(err, &e)
}
