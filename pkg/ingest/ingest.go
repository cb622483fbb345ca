// Package ingest receives Prometheus remote write 1.0 and 2.0 and appends the
// samples to each tenant's TSDB.
//
// The path of a request: the tenant is read from its headers; the body is read
// into a pooled buffer (413 past the size limit) and snappy-decoded (400 if
// corrupt); the protobuf is walked without unmarshalling it (decode.go); each
// series is looked up in the tenant's series cache by a hash of its raw labels,
// and only unknown series get their labels built and validated (append.go);
// samples go through one TSDB appender whose Commit writes the WAL before the
// answer is sent. Data that can never be accepted (bad labels, out of order,
// too old) is counted and answered with 400 while the rest of the request is
// stored; faults of gpustore's own are answered 5xx so the sender retries.
package ingest

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"mime"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/golang/snappy"
	"github.com/grafana/dskit/limiter"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/prometheus/model/metadata"
	"github.com/prometheus/prometheus/model/timestamp"
	"github.com/prometheus/prometheus/prompb"
	"github.com/prometheus/prometheus/storage"

	"github.com/gpustore/gpustore/pkg/hatracker"
	"github.com/gpustore/gpustore/pkg/limits"
	"github.com/gpustore/gpustore/pkg/tenancy"
	"github.com/gpustore/gpustore/pkg/tenantdb"
)

// Config holds the ingest knobs.
type Config struct {
	// MaxRequestBytes bounds the compressed body; larger requests get 413.
	MaxRequestBytes int64 `yaml:"max_request_bytes"`
	// MaxDecodedBytes bounds the body after snappy decoding; larger get 413.
	MaxDecodedBytes int64 `yaml:"max_decoded_bytes"`
}

// DefaultConfig returns limits that fit Prometheus' default batches (2,000
// samples, a few hundred KiB) with a wide margin.
func DefaultConfig() Config {
	return Config{MaxRequestBytes: 16 << 20, MaxDecodedBytes: 64 << 20}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.MaxRequestBytes <= 0 || c.MaxDecodedBytes <= 0 {
		return errors.New("ingest size limits must be positive")
	}
	return nil
}

// Content types of the two protocol versions.
const (
	protoV1 = "prometheus.WriteRequest"
	protoV2 = "io.prometheus.write.v2.Request"

	headerSamplesWritten    = "X-Prometheus-Remote-Write-Samples-Written"
	headerHistogramsWritten = "X-Prometheus-Remote-Write-Histograms-Written"
	headerExemplarsWritten  = "X-Prometheus-Remote-Write-Exemplars-Written"
)

// Deps are what the ingester works with.
type Deps struct {
	Tenants tenancy.Config
	DBs     *tenantdb.Manager
	// Limits are the per-tenant limits; nil means the defaults.
	Limits *limits.Overrides
	// HA deduplicates Prometheus HA pairs; nil turns dedup off.
	HA       *hatracker.Tracker
	Logger   *slog.Logger
	Registry prometheus.Registerer
	// Ready reports whether the process can take writes; until then 503.
	Ready func() error
}

// Ingester is the remote-write HTTP handler.
type Ingester struct {
	cfg     Config
	tenants tenancy.Config
	dbs     *tenantdb.Manager
	limits  *limits.Overrides
	ha      *hatracker.Tracker
	rate    *limiter.RateLimiter
	logger  *slog.Logger
	metrics *metrics
	ready   func() error
	now     func() time.Time

	pool sync.Pool // *requestState

	mtx    sync.RWMutex
	caches map[string]*tenantState
}

// tenantState is what the ingester keeps per tenant next to its database.
type tenantState struct {
	id    string
	db    *tenantdb.DB
	cache *seriesCache
	ha    *haTable
	md    *metadataSink
	m     *tenantMetrics
}

// requestState is the pooled working memory of one request.
type requestState struct {
	compressed, decoded []byte
	v1                  *v1Decoder
	v2                  *v2Decoder
	ac                  appendCtx
	v1meta              prompb.MetricMetadata
	decisions           []haDecision
}

// New returns an Ingester.
func New(cfg Config, d Deps) (*Ingester, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if d.Limits == nil {
		var err error
		if d.Limits, err = limits.New(limits.DefaultConfig(), d.Logger, d.Registry); err != nil {
			return nil, err
		}
	}
	i := &Ingester{
		cfg: cfg, tenants: d.Tenants, dbs: d.DBs, limits: d.Limits, ha: d.HA, logger: d.Logger,
		rate:    limiter.NewRateLimiter(limits.RateStrategy{O: d.Limits}, 10*time.Second),
		metrics: newMetrics(d.Registry), ready: d.Ready, now: time.Now,
		caches: map[string]*tenantState{},
	}
	i.pool.New = func() any { return &requestState{v1: newV1Decoder(), v2: newV2Decoder()} }
	return i, nil
}

// RegisterRoutes adds the write endpoints: Prometheus' path and the ones
// Mimir (/api/v1/push) and Thanos (/api/v1/receive) users already configure.
func (i *Ingester) RegisterRoutes(mux *http.ServeMux) {
	for _, p := range []string{"/api/v1/write", "/api/v1/push", "/api/v1/receive"} {
		mux.Handle(p, i)
	}
}

func (i *Ingester) tenant(id string) (*tenantState, error) {
	i.mtx.RLock()
	st, ok := i.caches[id]
	i.mtx.RUnlock()
	if ok {
		return st, nil
	}
	db, err := i.dbs.Get(id)
	if err != nil {
		return nil, err
	}
	i.mtx.Lock()
	defer i.mtx.Unlock()
	if st, ok := i.caches[id]; ok {
		return st, nil
	}
	st = &tenantState{id: id, db: db, cache: newSeriesCache(), ha: newHATable(), md: &metadataSink{set: db.Metadata.Set}, m: i.metrics.forTenant(id)}
	i.caches[id] = st
	return st, nil
}

// ResetCaches forgets every cached series; called when the limits were
// reloaded, since a tenant's HA label names may have changed.
func (i *Ingester) ResetCaches() {
	i.mtx.RLock()
	defer i.mtx.RUnlock()
	for _, st := range i.caches {
		st.cache.reset()
	}
}

// SweepCaches drops series-cache entries unused since the previous sweep.
func (i *Ingester) SweepCaches() {
	i.mtx.RLock()
	defer i.mtx.RUnlock()
	for id, st := range i.caches {
		n := st.cache.sweep()
		i.logger.Debug("swept series cache", "tenant", id, "removed", n, "kept", st.cache.len())
	}
}

func (i *Ingester) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := i.now()
	proto := "unknown"
	status := i.serve(w, r, &proto)
	i.metrics.requests.WithLabelValues(proto, strconv.Itoa(status)).Inc()
	i.metrics.duration.WithLabelValues(proto).Observe(time.Since(start).Seconds())
}

// serve answers one write and returns the HTTP status it answered.
func (i *Ingester) serve(w http.ResponseWriter, r *http.Request, proto *string) int {
	fail := func(status int, format string, args ...any) int {
		msg := fmt.Sprintf(format, args...)
		if status >= 500 {
			i.logger.Error("remote write failed", "status", status, "err", msg)
		} else {
			i.logger.Debug("remote write rejected", "status", status, "err", msg)
		}
		http.Error(w, msg, status)
		return status
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return fail(http.StatusMethodNotAllowed, "remote write takes POST")
	}
	if err := i.ready(); err != nil {
		return fail(http.StatusServiceUnavailable, "not ready: %v", err)
	}

	isV2, err := parseContentType(r.Header.Get("Content-Type"))
	if err != nil {
		return fail(http.StatusUnsupportedMediaType, "%v", err)
	}
	*proto = "1.0"
	if isV2 {
		*proto = "2.0"
	}
	if enc := r.Header.Get("Content-Encoding"); enc != "" && enc != "snappy" {
		return fail(http.StatusUnsupportedMediaType, "unsupported Content-Encoding %q: remote write bodies are snappy-compressed", enc)
	}

	tenantID, err := i.tenants.FromRequest(r)
	if err != nil {
		var te *tenancy.Error
		if errors.As(err, &te) {
			return fail(te.Status, "%v", err)
		}
		return fail(http.StatusBadRequest, "%v", err)
	}

	rs := i.pool.Get().(*requestState)
	defer i.pool.Put(rs)

	body, status, err := i.readBody(r, rs)
	if err != nil {
		return fail(status, "%v", err)
	}

	st, err := i.tenant(tenantID)
	if err != nil {
		if errors.Is(err, tenantdb.ErrClosed) {
			return fail(http.StatusServiceUnavailable, "%v", err)
		}
		return fail(http.StatusInternalServerError, "open tenant %q: %v", tenantID, err)
	}

	var stats writeStats
	lim := i.limits.For(tenantID)
	now := i.now()
	app := st.db.AppenderV2(r.Context())
	wr := &writeRequest{
		ctx: r.Context(), tenant: st, app: app, ac: &rs.ac, lim: &lim, ha: i.ha,
		maxT: timestamp.FromTime(now.Add(maxAheadTime)), stats: &stats, decisions: rs.decisions[:0],
	}
	wr.exApp, _ = app.(storage.ExemplarAppenderV2)
	var dec seriesDecoder
	if isV2 {
		rs.v2.reset(body)
		dec, wr.v2 = rs.v2, rs.v2
	} else {
		rs.v1.reset(body)
		dec = rs.v1
	}
	err = wr.run(dec)
	rs.decisions = wr.decisions
	if err == nil && !isV2 {
		err = i.storeV1Metadata(rs, st)
	}
	if err != nil {
		_ = app.Rollback()
		switch {
		case errors.Is(err, errMalformed):
			return fail(http.StatusBadRequest, "decode remote write %s request: %v", *proto, err)
		case errors.Is(err, errTooManySeries):
			st.m.rejected(reasonTooManySeries).Add(float64(wr.series))
			return fail(http.StatusBadRequest, "%v", err)
		}
		return fail(http.StatusInternalServerError, "write to tenant %q: %v", tenantID, err)
	}
	// The rate limit is checked once the request's sample count is known;
	// over it, nothing is stored and the sender is told to retry later.
	if n := stats.samples + stats.histograms; lim.IngestionRate > 0 && n > 0 && !i.rate.AllowN(now, tenantID, n) {
		_ = app.Rollback()
		st.m.rejected(reasonRateLimited).Add(float64(n))
		retry := max(1, int(math.Ceil(float64(n)/lim.IngestionRate)))
		w.Header().Set("Retry-After", strconv.Itoa(retry))
		return fail(lim.RateLimitStatusCode, "ingestion rate limit of %g samples/s (burst %d) for tenant %q exceeded by a request of %d samples; retry later",
			lim.IngestionRate, lim.IngestionBurstSize, tenantID, n)
	}
	// Commit writes the WAL: only after it returns may the request be acknowledged.
	if err := app.Commit(); err != nil {
		return fail(http.StatusInternalServerError, "commit to tenant %q: %v", tenantID, err)
	}
	for _, d := range wr.decisions {
		if d.dropped > 0 {
			st.m.deduplicated(st.ha.pair(d.pair).cluster).Add(float64(d.dropped))
		}
	}

	st.m.samples.Add(float64(stats.samples))
	st.m.histograms.Add(float64(stats.histograms))
	st.m.exemplars.Add(float64(stats.exemplars))
	st.m.newSeries.Add(float64(stats.newSeries))
	for reason, n := range stats.rejected {
		st.m.rejected(reason).Add(float64(n))
	}

	if isV2 {
		// Samples dropped as duplicates of the elected replica count as
		// written: the data is stored (from the other replica), and a lower
		// count would make Prometheus report a failed partial write.
		h := w.Header()
		h.Set(headerSamplesWritten, strconv.Itoa(stats.samples+stats.deduplicated))
		h.Set(headerHistogramsWritten, strconv.Itoa(stats.histograms))
		h.Set(headerExemplarsWritten, strconv.Itoa(stats.exemplars))
	}
	if len(stats.rejected) > 0 {
		return fail(http.StatusBadRequest, "%s", stats.errorSummary())
	}
	w.WriteHeader(http.StatusNoContent)
	return http.StatusNoContent
}

func (i *Ingester) storeV1Metadata(rs *requestState, st *tenantState) error {
	for _, raw := range rs.v1.metadata {
		m := &rs.v1meta
		m.Reset()
		if err := m.Unmarshal(raw); err != nil {
			return fmt.Errorf("%w: metadata: %v", errMalformed, err)
		}
		if m.MetricFamilyName == "" {
			continue
		}
		st.db.Metadata.Set(m.MetricFamilyName, metadata.Metadata{Type: metricTypeFromWire(int32(m.Type)), Help: m.Help, Unit: m.Unit})
	}
	return nil
}

// readBody reads and snappy-decodes the body into the pooled buffers.
func (i *Ingester) readBody(r *http.Request, rs *requestState) ([]byte, int, error) {
	if r.ContentLength > i.cfg.MaxRequestBytes {
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("body of %d bytes exceeds the limit of %d", r.ContentLength, i.cfg.MaxRequestBytes)
	}
	buf := rs.compressed[:0]
	if r.ContentLength > 0 && int64(cap(buf)) < r.ContentLength {
		buf = make([]byte, 0, r.ContentLength)
	}
	lr := io.LimitReader(r.Body, i.cfg.MaxRequestBytes+1)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := lr.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			rs.compressed = buf
			return nil, http.StatusBadRequest, fmt.Errorf("read body: %w", err)
		}
	}
	rs.compressed = buf
	if int64(len(buf)) > i.cfg.MaxRequestBytes {
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("body exceeds the limit of %d bytes", i.cfg.MaxRequestBytes)
	}
	n, err := snappy.DecodedLen(buf)
	if err != nil {
		return nil, http.StatusBadRequest, fmt.Errorf("corrupt snappy body: %w", err)
	}
	if int64(n) > i.cfg.MaxDecodedBytes {
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("decoded body of %d bytes exceeds the limit of %d", n, i.cfg.MaxDecodedBytes)
	}
	if cap(rs.decoded) < n {
		rs.decoded = make([]byte, n)
	}
	out, err := snappy.Decode(rs.decoded[:cap(rs.decoded)], buf)
	if err != nil {
		return nil, http.StatusBadRequest, fmt.Errorf("corrupt snappy body: %w", err)
	}
	return out, 0, nil
}

// parseContentType picks the protocol version. A missing type means 1.0, as
// the 2.0 specification asks of receivers that speak both.
func parseContentType(ct string) (v2 bool, err error) {
	if ct == "" {
		return false, nil
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil {
		return false, fmt.Errorf("unparseable Content-Type %q: %v", ct, err)
	}
	if mt != "application/x-protobuf" {
		return false, fmt.Errorf("unsupported Content-Type %q: want application/x-protobuf", ct)
	}
	switch p := params["proto"]; p {
	case "", protoV1:
		return false, nil
	case protoV2:
		return true, nil
	default:
		return false, fmt.Errorf("unsupported remote write message %q: gpustore accepts %s and %s", p, protoV1, protoV2)
	}
}

type metrics struct {
	reg       prometheus.Registerer
	requests  *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	samples   *prometheus.CounterVec
	rejectedV *prometheus.CounterVec
	series    *prometheus.CounterVec
	dedup     *prometheus.CounterVec
}

type tenantMetrics struct {
	samples, histograms, exemplars, newSeries prometheus.Counter
	byReason                                  map[string]prometheus.Counter
	dedup                                     *prometheus.CounterVec
	tenant                                    string
}

func (m *tenantMetrics) deduplicated(cluster string) prometheus.Counter {
	return m.dedup.WithLabelValues(m.tenant, cluster)
}

func (m *tenantMetrics) rejected(reason string) prometheus.Counter { return m.byReason[reason] }

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	return &metrics{
		requests: f.NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_ingest_requests_total", Help: "Remote write requests by protocol version and HTTP status.",
		}, []string{"protocol", "code"}),
		duration: f.NewHistogramVec(prometheus.HistogramOpts{
			Name: "gpustore_ingest_request_duration_seconds", Help: "Time to decode, append and commit one remote write request.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}, []string{"protocol"}),
		samples: f.NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_ingest_written_total", Help: "Samples, histograms and exemplars committed to a tenant's TSDB.",
		}, []string{"tenant", "type"}),
		rejectedV: f.NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_ingest_rejected_samples_total", Help: "Samples rejected with a 4xx answer, by tenant and reason.",
		}, []string{"tenant", "reason"}),
		series: f.NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_ingest_series_created_total", Help: "Series first seen by the ingest series cache (new series or re-resolved after head GC).",
		}, []string{"tenant"}),
		dedup: f.NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_ingest_ha_deduplicated_samples_total", Help: "Samples acknowledged and dropped because the other replica of their Prometheus HA pair is elected.",
		}, []string{"tenant", "cluster"}),
	}
}

func (m *metrics) forTenant(id string) *tenantMetrics {
	tm := &tenantMetrics{
		samples:    m.samples.WithLabelValues(id, "sample"),
		histograms: m.samples.WithLabelValues(id, "histogram"),
		exemplars:  m.samples.WithLabelValues(id, "exemplar"),
		newSeries:  m.series.WithLabelValues(id),
		byReason:   map[string]prometheus.Counter{},
		dedup:      m.dedup,
		tenant:     id,
	}
	for _, r := range rejectReasons {
		tm.byReason[r] = m.rejectedV.WithLabelValues(id, r)
	}
	return tm
}
