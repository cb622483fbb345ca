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
	"mime"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/golang/snappy"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/prometheus/model/metadata"
	"github.com/prometheus/prometheus/prompb"

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

// Ingester is the remote-write HTTP handler.
type Ingester struct {
	cfg     Config
	tenants tenancy.Config
	dbs     *tenantdb.Manager
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
	db    *tenantdb.DB
	cache *seriesCache
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
}

// New returns an Ingester. ready reports whether the process can take writes
// (nil error); until then requests get 503.
func New(cfg Config, tenants tenancy.Config, dbs *tenantdb.Manager, logger *slog.Logger, reg prometheus.Registerer, ready func() error) (*Ingester, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	i := &Ingester{
		cfg: cfg, tenants: tenants, dbs: dbs, logger: logger,
		metrics: newMetrics(reg), ready: ready, now: time.Now,
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
	st = &tenantState{db: db, cache: newSeriesCache(), md: &metadataSink{set: db.Metadata.Set}, m: i.metrics.forTenant(id)}
	i.caches[id] = st
	return st, nil
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

// httpError is an answer other than 2xx.
type httpError struct {
	status int
	msg    string
}

func (i *Ingester) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := i.now()
	proto := "unknown"
	status, written := i.serve(w, r, &proto)
	i.metrics.requests.WithLabelValues(proto, strconv.Itoa(status)).Inc()
	i.metrics.duration.WithLabelValues(proto).Observe(time.Since(start).Seconds())
	_ = written
}

func (i *Ingester) serve(w http.ResponseWriter, r *http.Request, proto *string) (int, bool) {
	fail := func(status int, format string, args ...any) (int, bool) {
		msg := fmt.Sprintf(format, args...)
		if status >= 500 {
			i.logger.Error("remote write failed", "status", status, "err", msg)
		} else {
			i.logger.Debug("remote write rejected", "status", status, "err", msg)
		}
		http.Error(w, msg, status)
		return status, false
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
	app := st.db.AppenderV2(r.Context())
	var dec seriesDecoder
	var v2 *v2Decoder
	if isV2 {
		rs.v2.reset(body)
		dec, v2 = rs.v2, rs.v2
	} else {
		rs.v1.reset(body)
		dec = rs.v1
	}
	err = appendSeries(app, dec, v2, st.cache, st.md, &rs.ac, i.now(), &stats)
	if err == nil && !isV2 {
		err = i.storeV1Metadata(rs, st)
	}
	if err != nil {
		_ = app.Rollback()
		if errors.Is(err, errMalformed) {
			return fail(http.StatusBadRequest, "decode remote write %s request: %v", *proto, err)
		}
		return fail(http.StatusInternalServerError, "write to tenant %q: %v", tenantID, err)
	}
	// Commit writes the WAL: only after it returns may the request be acknowledged.
	if err := app.Commit(); err != nil {
		return fail(http.StatusInternalServerError, "commit to tenant %q: %v", tenantID, err)
	}

	st.m.samples.Add(float64(stats.samples))
	st.m.histograms.Add(float64(stats.histograms))
	st.m.exemplars.Add(float64(stats.exemplars))
	st.m.newSeries.Add(float64(stats.newSeries))
	for reason, n := range stats.rejected {
		st.m.rejected(reason).Add(float64(n))
	}

	if isV2 {
		h := w.Header()
		h.Set(headerSamplesWritten, strconv.Itoa(stats.samples))
		h.Set(headerHistogramsWritten, strconv.Itoa(stats.histograms))
		h.Set(headerExemplarsWritten, strconv.Itoa(stats.exemplars))
	}
	if len(stats.rejected) > 0 {
		return fail(http.StatusBadRequest, "%s", stats.errorSummary())
	}
	w.WriteHeader(http.StatusNoContent)
	return http.StatusNoContent, true
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
}

type tenantMetrics struct {
	samples, histograms, exemplars, newSeries prometheus.Counter
	byReason                                  map[string]prometheus.Counter
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
	}
}

func (m *metrics) forTenant(id string) *tenantMetrics {
	tm := &tenantMetrics{
		samples:    m.samples.WithLabelValues(id, "sample"),
		histograms: m.samples.WithLabelValues(id, "histogram"),
		exemplars:  m.samples.WithLabelValues(id, "exemplar"),
		newSeries:  m.series.WithLabelValues(id),
		byReason:   map[string]prometheus.Counter{},
	}
	for _, r := range rejectReasons {
		tm.byReason[r] = m.rejectedV.WithLabelValues(id, r)
	}
	return tm
}
