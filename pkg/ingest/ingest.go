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
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/golang/snappy"
	"github.com/grafana/dskit/limiter"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/metadata"
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
	// MaxInflightBytes bounds the bodies (compressed and decoded) held by
	// the writes in progress of every tenant together; past it 503 with
	// Retry-After (0: no bound).
	MaxInflightBytes int64 `yaml:"max_inflight_bytes"`
}

// DefaultConfig returns limits that fit Prometheus' default batches (2,000
// samples, a few hundred KiB) with a wide margin. The in-flight bound takes
// a thousand such batches at once, or a dozen of the largest bodies.
func DefaultConfig() Config {
	return Config{MaxRequestBytes: 16 << 20, MaxDecodedBytes: 64 << 20, MaxInflightBytes: 1 << 30}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.MaxRequestBytes <= 0 || c.MaxDecodedBytes <= 0 {
		return errors.New("ingest size limits must be positive")
	}
	if c.MaxInflightBytes < 0 || (c.MaxInflightBytes > 0 && c.MaxInflightBytes < c.MaxRequestBytes+c.MaxDecodedBytes) {
		return fmt.Errorf("ingest.max_inflight_bytes (%d) must be 0 (no bound) or hold one largest request, max_request_bytes + max_decoded_bytes (%d)", c.MaxInflightBytes, c.MaxRequestBytes+c.MaxDecodedBytes)
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

// Store is where the ingester writes each tenant's data: the tenants' own
// TSDBs (DBStore, the default) or, in front of the ring of receivers, the
// receivers that own each series (pkg/distributor).
type Store interface {
	Tenant(id string) (TenantStore, error)
}

// TenantStore takes one tenant's appends, committed per request, and its
// metric families' metadata.
type TenantStore interface {
	storage.AppendableV2
	SetMetadata(family string, m metadata.Metadata)
}

// ZeroAppender is implemented by a TenantStore's appender that has
// created-timestamp zeros stored elsewhere (the distributor's: its
// receivers store them). AppendZero asks for a zero at st before the
// series' next append, the sample whose start timestamp st is; like
// appendZero's own it is best effort: stored only if in order, its
// rejection never reported. Without it the ingester appends the zero
// itself, with RejectOutOfOrder.
type ZeroAppender interface {
	AppendZero(ref storage.SeriesRef, ls labels.Labels, st int64) (storage.SeriesRef, error)
}

// DBStore is the Store of the tenants' TSDBs.
func DBStore(dbs *tenantdb.Manager) Store { return dbStore{dbs} }

type dbStore struct{ dbs *tenantdb.Manager }

func (s dbStore) Tenant(id string) (TenantStore, error) {
	db, err := s.dbs.Get(id)
	if err != nil {
		return nil, err
	}
	return dbTenant{db}, nil
}

type dbTenant struct{ *tenantdb.DB }

func (t dbTenant) SetMetadata(family string, m metadata.Metadata) { t.Metadata.Set(family, m) }

func (t dbTenant) SetMetadataBounded(family string, m metadata.Metadata, maxFamilies int) bool {
	return t.Metadata.SetBounded(family, m, maxFamilies)
}

// Deps are what the ingester works with.
type Deps struct {
	Tenants tenancy.Config
	// Store takes the writes; nil means the tenants' TSDBs in DBs.
	Store Store
	DBs   *tenantdb.Manager
	// Downstream marks a receiver behind distributors (the ring): its
	// writes were already HA-deduplicated, relabeled and rate-limited once,
	// by the distributor, so it does none of that again (relabel rules
	// need not be idempotent, and a rate is the tenant's, not a share's).
	// It stores the created-timestamp zeros the distributor asks for with
	// a 1.0 sample's or histogram's start timestamp (pkg/distributor).
	Downstream bool
	// Limits are the per-tenant limits; nil means the defaults.
	Limits *limits.Overrides
	// HA deduplicates Prometheus HA pairs; nil turns dedup off.
	HA *hatracker.Tracker
	// Inflight bounds the bodies held by the writes in progress; nil: one
	// of Config.MaxInflightBytes for this ingester. A distributor and a
	// receiver in one process keep a bound each: sharing one, the
	// distributor's requests could fill it while they wait for the
	// receiver's, which it would then refuse.
	Inflight *limits.InflightBytes
	// RateShare, when set, is how many processes share each tenant's
	// ingestion rate (the ring's healthy distributors): this one allows
	// rate/RateShare() samples per second.
	RateShare func() int
	Logger    *slog.Logger
	Registry  prometheus.Registerer
	// Ready reports whether the process can take writes; until then 503.
	Ready func() error
	// LookbackDelta is the query engine's lookback delta; the OTLP
	// translator repeats a resource's target_info sample within it
	// (0: Prometheus' default, 5m).
	LookbackDelta time.Duration
}

// Ingester is the remote-write HTTP handler.
type Ingester struct {
	cfg     Config
	tenants tenancy.Config
	sink    Store
	// downstream: see Deps.Downstream.
	downstream bool
	limits     *limits.Overrides
	ha         *hatracker.Tracker
	rate       *limiter.RateLimiter
	inflight   *limits.InflightBytes
	logger     *slog.Logger
	metrics    *metrics
	ready      func() error
	now        func() time.Time
	// lookbackDelta: see Deps.LookbackDelta.
	lookbackDelta time.Duration

	pool sync.Pool // *requestState

	mtx    sync.RWMutex
	caches map[string]*tenantState
}

// tenantState is what the ingester keeps per tenant next to its database.
type tenantState struct {
	id string
	// appendable is the tenant's store; tests wrap it to inject storage faults.
	appendable storage.AppendableV2
	cache      *seriesCache
	ha         *haTable
	md         *metadataSink
	m          *tenantMetrics

	// limitsGen advances when the tenant's label limits or relabel rules
	// change, so cached series are validated (or relabeled) again on their
	// next sample (see ApplyLimits); labelLimits are what it stands for.
	limitsGen   atomic.Uint32
	labelLimits atomic.Pointer[labelLimits]
	// drivers remembers per GPU the driver info the dcgm preset last wrote.
	drivers *driverMemo
	// symbols is the table new series' labels are built in (nil under the
	// default build; see tenantdb.DB.Symbols).
	symbols func() *labels.SymbolTable
	// delta converts the tenant's OTLP delta temporality (otlp_delta.go).
	delta tenantDeltas
}

// symbolSource is a TenantStore that keeps its series' labels in a symbol
// table of its own (tenantdb.DB under the dedupelabels build).
type symbolSource interface{ Symbols() *labels.SymbolTable }

// symbolsOf is the symbol table source for a tenant's store: the store's
// own, or, for a store that keeps no labels (a distributor forwards them),
// a table replaced by a fresh one whenever it passes maxForwardSymbols, so
// that churn does not grow it forever.
func symbolsOf(ts TenantStore) func() *labels.SymbolTable {
	if ss, ok := ts.(symbolSource); ok {
		return ss.Symbols
	}
	var cur atomic.Pointer[labels.SymbolTable]
	cur.Store(labels.NewSymbolTable())
	return func() *labels.SymbolTable {
		st := cur.Load()
		if st != nil && st.Len() > maxForwardSymbols {
			st = labels.NewSymbolTable()
			cur.Store(st)
		}
		return st
	}
}

const maxForwardSymbols = 1 << 20

// labelLimits are what a series is validated against when first seen: the
// label limits and the relabel rules (by their fingerprint).
type labelLimits struct {
	names, nameLength, valueLength int
	rules                          string
}

func labelLimitsOf(l limits.Limits) labelLimits {
	return labelLimits{l.MaxLabelNamesPerSeries, l.MaxLabelNameLength, l.MaxLabelValueLength, l.Relabel().Fingerprint()}
}

// requestState is the pooled working memory of one request.
type requestState struct {
	compressed, decoded []byte
	v1                  *v1Decoder
	v2                  *v2Decoder
	w                   writeRequest
	// held is what the request reserved of Ingester.inflight: the
	// capacity of the buffers it holds.
	held int64
	// An OTLP request's translator and the 2.0 body it translated to
	// (otlp.go); nil until the first OTLP request.
	otlp       *otlpTranslation
	translated []byte
	// objects is what pdata's objects of the OTLP request are estimated
	// to take, translation what translating it will allocate
	// (otlp_shape.go); both are held in the in-flight bound. need is what
	// the request needs of the bound but for its translation (its bodies'
	// bytes and its objects): whether it could ever fit.
	objects, translation, need int64
}

// decoder starts decoding body.
func (rs *requestState) decoder(body []byte, v2 bool) seriesDecoder {
	if v2 {
		rs.v2.reset(body)
		return rs.v2
	}
	rs.v1.reset(body)
	return rs.v1
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
	if d.Store == nil {
		d.Store = DBStore(d.DBs)
	}
	if d.Downstream {
		d.HA = nil
	}
	if d.Inflight == nil {
		d.Inflight = limits.NewInflightBytes(cfg.MaxInflightBytes)
	}
	i := &Ingester{
		cfg: cfg, tenants: d.Tenants, sink: d.Store, downstream: d.Downstream, limits: d.Limits, ha: d.HA, logger: d.Logger,
		rate: limiter.NewRateLimiter(rateStrategy(d), 10*time.Second), inflight: d.Inflight,
		metrics: newMetrics(d.Registry, d.Inflight), ready: d.Ready, now: time.Now,
		caches: map[string]*tenantState{}, lookbackDelta: d.LookbackDelta,
	}
	if i.lookbackDelta <= 0 {
		i.lookbackDelta = 5 * time.Minute
	}
	i.pool.New = func() any { return &requestState{v1: newV1Decoder(), v2: newV2Decoder()} }
	return i, nil
}

func rateStrategy(d Deps) limiter.RateLimiterStrategy {
	s := limits.RateStrategy{O: d.Limits}
	if d.RateShare == nil {
		return s
	}
	return limits.SharedRateStrategy{RateStrategy: s, Processes: d.RateShare}
}

// RegisterRoutes adds the write endpoints: Prometheus' path and the ones
// Mimir (/api/v1/push) and Thanos (/api/v1/receive) users already configure,
// and the OTLP/HTTP metrics paths (otlp.go).
func (i *Ingester) RegisterRoutes(mux *http.ServeMux) {
	for _, p := range []string{"/api/v1/write", "/api/v1/push", "/api/v1/receive"} {
		mux.Handle(p, i)
	}
	for _, p := range OTLPPaths {
		mux.Handle(p, otlpHandler{i})
	}
}

func (i *Ingester) tenant(id string) (*tenantState, error) {
	i.mtx.RLock()
	st, ok := i.caches[id]
	i.mtx.RUnlock()
	if ok {
		return st, nil
	}
	ts, err := i.sink.Tenant(id)
	if err != nil {
		return nil, err
	}
	i.mtx.Lock()
	defer i.mtx.Unlock()
	if st, ok := i.caches[id]; ok {
		return st, nil
	}
	st = &tenantState{id: id, appendable: ts, cache: newSeriesCache(), ha: newHATable(), md: newMetadataSink(ts), m: i.metrics.forTenant(id), drivers: newDriverMemo(), symbols: symbolsOf(ts)}
	ll := labelLimitsOf(i.limits.For(id))
	st.labelLimits.Store(&ll)
	i.caches[id] = st
	return st, nil
}

// ApplyLimits is called after the limits overrides were reloaded. The
// series caches and the HA state in them are kept: the other limits are read
// per request, and a cached reference stays right whatever the HA label
// names (a series' key hashes exactly the labels it is stored with). A
// tenant whose label limits changed has its cached series validated again,
// each on its next sample, without building its labels; one whose relabel
// rules changed (or that has rules) has them relabeled again.
func (i *Ingester) ApplyLimits() {
	i.mtx.RLock()
	defer i.mtx.RUnlock()
	for id, st := range i.caches {
		ll := labelLimitsOf(i.limits.For(id))
		if *st.labelLimits.Load() != ll {
			st.labelLimits.Store(&ll)
			st.limitsGen.Add(1)
		}
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

// serve answers one write and returns the HTTP status it answered: the
// transport (method, readiness, content type, tenant, body), then store.
func (i *Ingester) serve(w http.ResponseWriter, r *http.Request, proto *string) int {
	v2, tenantID, err := i.checkRequest(w, r)
	if err != nil {
		return i.fail(w, err)
	}
	*proto = "1.0"
	if v2 {
		*proto = "2.0"
	}
	rs := i.pool.Get().(*requestState)
	defer i.pool.Put(rs)
	defer i.releaseBuffers(rs)
	body, err := i.readBody(r, rs)
	if err != nil {
		return i.fail(w, err)
	}
	st, err := i.tenant(tenantID)
	if err != nil {
		return i.fail(w, tenantError(tenantID, err))
	}
	stats, err := i.store(r.Context(), st, rs, body, v2)
	if err != nil {
		if errors.Is(err, errMalformed) {
			err = fmt.Errorf("decode remote write %s request: %w", *proto, err)
		}
		return i.fail(w, err)
	}

	if v2 {
		// Samples dropped as duplicates of the elected replica count as
		// written: the data is stored (from the other replica), and a lower
		// count would make Prometheus report a failed partial write. So do
		// samples the tenant's relabel rules drop (dropped on purpose).
		h := w.Header()
		h.Set(headerSamplesWritten, strconv.Itoa(stats.acknowledged()))
		h.Set(headerHistogramsWritten, strconv.Itoa(stats.histograms))
		h.Set(headerExemplarsWritten, strconv.Itoa(stats.exemplars))
	}
	if len(stats.rejected) > 0 || len(stats.metadataRejected) > 0 {
		return i.fail(w, &httpError{status: http.StatusBadRequest, msg: stats.errorSummary()})
	}
	w.WriteHeader(http.StatusNoContent)
	return http.StatusNoContent
}

// tenantError is the answer to a tenant whose database cannot be had.
func tenantError(id string, err error) error {
	switch {
	case errors.Is(err, tenantdb.ErrClosed):
		return &httpError{status: http.StatusServiceUnavailable, msg: err.Error()}
	case errors.Is(err, tenantdb.ErrTooManyTenants):
		// 429, not retried by default: the tenant will not fit until an
		// operator raises the bound, and a retried write would only queue
		// behind it (the sender's other tenants are not refused).
		return &httpError{status: http.StatusTooManyRequests, msg: err.Error()}
	}
	return fmt.Errorf("open tenant %q: %w", id, err)
}

// checkRequest checks what a write says about itself before its body is
// read: method, readiness, protocol version and tenant.
func (i *Ingester) checkRequest(w http.ResponseWriter, r *http.Request) (v2 bool, tenantID string, err error) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return false, "", &httpError{status: http.StatusMethodNotAllowed, msg: "remote write takes POST"}
	}
	if err := i.ready(); err != nil {
		return false, "", &httpError{status: http.StatusServiceUnavailable, msg: fmt.Sprintf("not ready: %v", err)}
	}
	v2, err = parseContentType(r.Header.Get("Content-Type"))
	if err != nil {
		return false, "", &httpError{status: http.StatusUnsupportedMediaType, msg: err.Error()}
	}
	if enc := r.Header.Get("Content-Encoding"); enc != "" && enc != "snappy" {
		return false, "", &httpError{status: http.StatusUnsupportedMediaType, msg: fmt.Sprintf("unsupported Content-Encoding %q: remote write bodies are snappy-compressed", enc)}
	}
	tenantID, err = i.tenantOf(r)
	return v2, tenantID, err
}

// tenantOf is the request's tenant, checked against its identity.
func (i *Ingester) tenantOf(r *http.Request) (string, error) {
	id, err := i.tenants.FromRequest(r)
	if err != nil {
		status := http.StatusBadRequest
		var te *tenancy.Error
		if errors.As(err, &te) {
			status = te.Status
		}
		return "", &httpError{status: status, msg: err.Error()}
	}
	return id, nil
}

// httpError is an answer other than 204 with its status.
type httpError struct {
	status     int
	retryAfter int // seconds; 0: no Retry-After header
	msg        string
	// clients marks a 5xx that the client caused (a body cut off): logged
	// at debug level, since anyone can cause it as often as they like.
	clients bool
}

func (e *httpError) Error() string { return e.msg }

// StatusError is a store's error that says how the write is answered: the
// distributor's outcome of a quorum of receivers (400 when they rejected
// the data, 503 when too few could take it).
type StatusError interface {
	error
	HTTPStatus() int
}

// AnswerHeader marks a remote write's failure answer as the ingester's own
// judgement of the request (set to "1"). A distributor passes a receiver's
// 4xx on to the sender as the data's rejection only when it carries it: a
// 4xx without it came from something else on the way (Go's 400 to plain
// HTTP sent to a TLS receiver, a 401 for credentials the receiver does not
// know, a proxy), a transport or configuration fault the sender must retry,
// not a reason to drop its data.
const AnswerHeader = "X-Gpustore-Write-Answer"

// fail answers err and returns the status (see classify).
func (i *Ingester) fail(w http.ResponseWriter, err error) int {
	status, retryAfter := i.classify(err)
	w.Header().Set(AnswerHeader, "1")
	if retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
	}
	http.Error(w, err.Error(), status)
	return status
}

// classify picks the status that answers err, and the Retry-After seconds
// (0: none), and logs it: the httpError's own, 400 for what will never be
// accepted, 503 for what may be retried soon, 500 otherwise.
func (i *Ingester) classify(err error) (status, retryAfter int) {
	status = http.StatusInternalServerError
	var he *httpError
	var se StatusError
	switch {
	case errors.As(err, &he):
		status, retryAfter = he.status, he.retryAfter
	case errors.As(err, &se):
		status = se.HTTPStatus()
		if status == http.StatusServiceUnavailable || status == http.StatusTooManyRequests {
			retryAfter = 1
		}
	case errors.Is(err, errMalformed), errors.Is(err, errTooManySeries):
		status = http.StatusBadRequest
	case errors.Is(err, errHAConflict):
		status, retryAfter = http.StatusServiceUnavailable, 1
	}
	if status >= 500 && (he == nil || !he.clients) {
		i.logger.Error("write failed", "status", status, "err", err)
	} else {
		i.logger.Debug("write rejected", "status", status, "err", err)
	}
	return status, retryAfter
}

// firstBodyAlloc is the most a body's buffer is given before its bytes
// arrive: a Content-Length is only a claim, and a body that stalls or
// trickles after its headers should hold little of the in-flight bound
// (bodies being read take no write slot: pkg/server).
const firstBodyAlloc = 32 << 10

// readBody reads and snappy-decodes the body into the pooled buffers, each
// reserved in the in-flight bound before it is grown or filled.
func (i *Ingester) readBody(r *http.Request, rs *requestState) ([]byte, error) {
	buf, err := i.readRaw(r, rs)
	if err != nil {
		return nil, err
	}
	corrupt := func(err error) error {
		return &httpError{status: http.StatusBadRequest, msg: fmt.Sprintf("corrupt snappy body: %v", err)}
	}
	n, err := snappy.DecodedLen(buf)
	if err != nil {
		return nil, corrupt(err)
	}
	if int64(n) > i.cfg.MaxDecodedBytes {
		return nil, tooLarge("decoded body of %d bytes exceeds the limit of %d", n, i.cfg.MaxDecodedBytes)
	}
	if cap(rs.decoded) < n {
		rs.decoded = make([]byte, n)
	}
	if err := i.hold(rs, cap(buf)+cap(rs.decoded)); err != nil {
		return nil, err
	}
	out, err := snappy.Decode(rs.decoded[:cap(rs.decoded)], buf)
	if err != nil {
		return nil, corrupt(err)
	}
	return out, nil
}

func tooLarge(format string, args ...any) error {
	return &httpError{status: http.StatusRequestEntityTooLarge, msg: fmt.Sprintf(format, args...)}
}

// readRaw reads the body as it came (compressed) into rs.compressed,
// reserved in the in-flight bound before it is grown or filled.
func (i *Ingester) readRaw(r *http.Request, rs *requestState) ([]byte, error) {
	if r.ContentLength > i.cfg.MaxRequestBytes {
		return nil, tooLarge("body of %d bytes exceeds the limit of %d", r.ContentLength, i.cfg.MaxRequestBytes)
	}
	// A buffer of Content-Length bytes and one more: the read that finds the
	// body's end needs room, and growing for it would double the buffer.
	buf := rs.compressed[:0]
	if want := min(r.ContentLength+1, firstBodyAlloc); r.ContentLength > 0 && int64(cap(buf)) < want {
		buf = make([]byte, 0, want)
	}
	rs.compressed = buf
	if err := i.hold(rs, cap(buf)); err != nil {
		return nil, err
	}
	lr := io.LimitReader(r.Body, i.cfg.MaxRequestBytes+1)
	for {
		if len(buf) == cap(buf) {
			more := max(cap(buf), 4096) // doubles, up to Content-Length and one
			if r.ContentLength >= int64(len(buf)) {
				more = min(more, int(r.ContentLength)+1-len(buf))
			}
			buf = slices.Grow(buf, more)
			rs.compressed = buf
			if err := i.hold(rs, cap(buf)); err != nil {
				return nil, err
			}
		}
		n, err := lr.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			rs.compressed = buf
			var se StatusError
			if errors.As(err, &se) {
				// The server refused the write as its body ended (its
				// tenant's write slots are taken: pkg/server): a bound, not
				// a fault, answered with its status and Retry-After.
				return nil, &httpError{status: se.HTTPStatus(), retryAfter: 1, clients: true, msg: err.Error()}
			}
			return nil, bodyCut(len(buf), err)
		}
	}
	rs.compressed = buf
	if int64(len(buf)) > i.cfg.MaxRequestBytes {
		return nil, tooLarge("body exceeds the limit of %d bytes", i.cfg.MaxRequestBytes)
	}
	return buf, nil
}

// hold reserves in the in-flight bound what the request's buffers have
// grown to (bytes: their capacity) since it last held them. Past the bound
// the write is answered 503 with Retry-After: the process is busy, the
// batch is fine, and Prometheus retries 5xx by default but 429 only with
// retry_on_http_429, so a 429 here would lose most senders' batches.
func (i *Ingester) hold(rs *requestState, bytes int) error {
	held := int64(bytes)
	if held <= rs.held {
		return nil
	}
	if !i.inflight.Reserve(held - rs.held) {
		i.metrics.inflightRefused.Inc()
		return &httpError{status: http.StatusServiceUnavailable, retryAfter: 1,
			msg: fmt.Sprintf("remote-write bodies of %d bytes are being read and decoded, this one would pass ingest.max_inflight_bytes (%d): retry", i.inflight.Bytes(), i.inflight.Max())}
	}
	rs.held = held
	return nil
}

// releaseBuffers gives back what the request held of the in-flight bound,
// and lets go of what the pooled state must not keep for the next request.
func (i *Ingester) releaseBuffers(rs *requestState) {
	i.inflight.Release(rs.held)
	rs.held, rs.objects, rs.translation, rs.need = 0, 0, 0, 0
	rs.release()
}

// maxPooledBuffer is the largest buffer a pooled request state keeps for
// the next request: Prometheus' batches (a few hundred KiB decoded) reuse
// theirs, and a rare large request's memory comes back once it is done
// rather than staying with the pool (four OTLP histogram exports left 1.9
// GB live in it).
const maxPooledBuffer = 4 << 20

// release drops the request's references into its body (the decoders'
// views, the store step's appender) and buffers larger than
// maxPooledBuffer.
func (rs *requestState) release() {
	for _, b := range []*[]byte{&rs.compressed, &rs.decoded, &rs.translated} {
		if cap(*b) > maxPooledBuffer {
			*b = nil
		}
	}
	rs.v1.release()
	rs.v2.release()
	rs.w.release()
}

// bodyCut answers a body whose reading failed after n bytes. Every such
// failure is the transport's: a read deadline (the server's read timeout, or
// a body that stalled), a connection that ended before Content-Length or was
// reset, a stream the client cancelled. The bytes that did arrive were never
// judged, so the sender's batch may well be valid: 503 with Retry-After,
// which Prometheus retries, where a 4xx would make it drop the batch. Bodies
// that arrive whole and are bad are told apart after the read (413, 400).
func bodyCut(n int, err error) error {
	return &httpError{status: http.StatusServiceUnavailable, retryAfter: 1, clients: true,
		msg: fmt.Sprintf("request body cut off after %d bytes, retry: %v", n, err)}
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
	inflightRefused prometheus.Counter
	requests        *prometheus.CounterVec
	duration        *prometheus.HistogramVec
	samples         *prometheus.CounterVec
	rejectedV       *prometheus.CounterVec
	series          *prometheus.CounterVec
	dedup           *prometheus.CounterVec
	relabel         *prometheus.CounterVec
	rejectedMeta    *prometheus.CounterVec
}

type tenantMetrics struct {
	samples, histograms, exemplars, newSeries prometheus.Counter
	relabelDropped                            prometheus.Counter
	byReason                                  map[string]prometheus.Counter
	rejectedMetadata                          map[string]prometheus.Counter
	dedup                                     *prometheus.CounterVec
	tenant                                    string
}

func (m *tenantMetrics) deduplicated(cluster string) prometheus.Counter {
	return m.dedup.WithLabelValues(m.tenant, cluster)
}

func (m *tenantMetrics) rejected(reason string) prometheus.Counter { return m.byReason[reason] }

func newMetrics(reg prometheus.Registerer, inflight *limits.InflightBytes) *metrics {
	f := promauto.With(reg)
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "gpustore_ingest_inflight_bytes", Help: "Bytes of remote-write bodies (compressed and decoded) held by the writes in progress.",
	}, func() float64 { return float64(inflight.Bytes()) })
	return &metrics{
		inflightRefused: f.NewCounter(prometheus.CounterOpts{
			Name: "gpustore_ingest_inflight_bytes_refused_requests_total", Help: "Remote writes answered 503 because their bodies would pass ingest.max_inflight_bytes.",
		}),
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
		rejectedMeta: f.NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_ingest_rejected_metadata_total", Help: "Metric family metadata (type, help, unit) not stored, by tenant and reason.",
		}, []string{"tenant", "reason"}),
		relabel: f.NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_ingest_relabel_dropped_samples_total", Help: "Samples and histograms acknowledged and dropped because the tenant's relabel rules drop their series.",
		}, []string{"tenant"}),
	}
}

func (m *metrics) forTenant(id string) *tenantMetrics {
	tm := &tenantMetrics{
		samples:          m.samples.WithLabelValues(id, "sample"),
		histograms:       m.samples.WithLabelValues(id, "histogram"),
		exemplars:        m.samples.WithLabelValues(id, "exemplar"),
		newSeries:        m.series.WithLabelValues(id),
		relabelDropped:   m.relabel.WithLabelValues(id),
		byReason:         map[string]prometheus.Counter{},
		rejectedMetadata: map[string]prometheus.Counter{},
		dedup:            m.dedup,
		tenant:           id,
	}
	for _, r := range rejectReasons {
		tm.byReason[r] = m.rejectedV.WithLabelValues(id, r)
	}
	for _, r := range metadataReasons {
		tm.rejectedMetadata[r] = m.rejectedMeta.WithLabelValues(id, r)
	}
	return tm
}
