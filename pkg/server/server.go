// Package server is gpustore's HTTP server: one listener for every role's
// endpoints, plus /metrics, /-/healthy, /-/ready and /-/reload.
//
// Every request except the probes (/-/healthy, /-/ready) passes the web
// configuration (--web.config.file: TLS, basic auth, headers; pkg/auth).
// Process-wide routes (/metrics, /-/reload and those marked with AdminOnly)
// additionally need an identity that tenants.auth lets act for every tenant.
// Write routes (Writes) are limited per tenant in the writes being decoded
// and stored at once (a slot is taken once the body is read, so bodies that
// arrive slowly hold none), and their bodies must keep arriving (a stall
// timeout, a minimum rate).
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"sync"
	"time"

	"github.com/grafana/dskit/services"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/util/notifications"

	"github.com/gpustore/gpustore/pkg/auth"
	"github.com/gpustore/gpustore/pkg/tenancy"
)

// Config is the HTTP server's configuration.
type Config struct {
	ListenAddress string `yaml:"listen_address"`
	// WebConfigFile is a Prometheus web configuration file (exporter-toolkit
	// format): TLS, basic auth, headers. Empty: plain HTTP, no auth.
	WebConfigFile string `yaml:"web_config_file"`
	// ShutdownTimeout bounds how long in-flight requests may finish on shutdown.
	ShutdownTimeout model.Duration `yaml:"shutdown_timeout"`
	// ReadHeaderTimeout bounds the wait for a request's headers, so a client
	// that sends them byte by byte (slowloris) cannot hold a connection.
	ReadHeaderTimeout model.Duration `yaml:"read_header_timeout"`
	// ReadTimeout bounds reading a whole request, body included.
	ReadTimeout model.Duration `yaml:"read_timeout"`
	// WriteTimeout bounds a request from its headers to the end of its
	// answer; it must exceed query.timeout or long queries are cut off.
	WriteTimeout model.Duration `yaml:"write_timeout"`
	// IdleTimeout closes keep-alive connections idle this long.
	IdleTimeout model.Duration `yaml:"idle_timeout"`
	// MaxConcurrentWritesPerTenant bounds one tenant's writes being decoded
	// and stored at once (a write takes its slot once its body is read);
	// beyond it the answer is 503 with Retry-After (0: no bound).
	MaxConcurrentWritesPerTenant int `yaml:"max_concurrent_writes_per_tenant"`
	// WriteBodyStallTimeout cuts a remote-write body that sends nothing for
	// this long (0: only ReadTimeout bounds it).
	WriteBodyStallTimeout model.Duration `yaml:"write_body_stall_timeout"`
	// WriteBodyMinRate (bytes/s) cuts a write body that, after
	// WriteBodyStallTimeout, has arrived slower than this on average since
	// its headers (0: none).
	WriteBodyMinRate int `yaml:"write_body_min_rate"`
}

// DefaultConfig listens on :9201, gpustore's port. The timeouts leave room
// for a query running into query.timeout (2m) and for a 16 MiB write over a
// slow link; the write bound is twice what a Prometheus HA pair with the
// default 50 shards each can have open.
func DefaultConfig() Config {
	return Config{
		ListenAddress:                ":9201",
		ShutdownTimeout:              model.Duration(30 * time.Second),
		ReadHeaderTimeout:            model.Duration(15 * time.Second),
		ReadTimeout:                  model.Duration(5 * time.Minute),
		WriteTimeout:                 model.Duration(5 * time.Minute),
		IdleTimeout:                  model.Duration(2 * time.Minute),
		MaxConcurrentWritesPerTenant: 200,
		WriteBodyStallTimeout:        model.Duration(10 * time.Second),
		WriteBodyMinRate:             4096,
	}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.ReadHeaderTimeout < 0 || c.ReadTimeout < 0 || c.WriteTimeout < 0 || c.IdleTimeout < 0 || c.WriteBodyStallTimeout < 0 {
		return errors.New("server timeouts must not be negative (0: none)")
	}
	if c.WriteBodyMinRate < 0 {
		return errors.New("server.write_body_min_rate must not be negative (0: none)")
	}
	if c.MaxConcurrentWritesPerTenant < 0 {
		return errors.New("server.max_concurrent_writes_per_tenant must not be negative (0: no bound)")
	}
	return nil
}

// Deps are what the server works with.
type Deps struct {
	Logger   *slog.Logger
	Registry *prometheus.Registry
	// Ready reports whether every role runs (/-/ready).
	Ready func() error
	// Tenants resolves a request's tenant (per-tenant write limit) and says
	// which identities may use process-wide routes.
	Tenants tenancy.Config
	// Peers are the identities gpustore's own processes present to each
	// other (ring.peer_identities); with them, only they may use the
	// routes marked Internal (tenancy.Config.Peer).
	Peers []string
	// Notifications, when set, get Prometheus' "Configuration reload has
	// failed." while the last reload failed (/api/v1/notifications).
	Notifications *notifications.Notifications
}

// Server owns the listener and the muxes the roles register their routes on.
type Server struct {
	services.Service
	// Mux serves every route except the probes and the writes.
	Mux *http.ServeMux
	// Writes serves the remote-write routes, limited per tenant.
	Writes *http.ServeMux

	cfg     Config
	deps    Deps
	logger  *slog.Logger
	srv     *http.Server
	lis     net.Listener
	web     *auth.WebConfig // nil without --web.config.file
	handler http.Handler

	adminMtx sync.RWMutex
	admin    map[string]bool
	internal map[string]bool

	reloadMtx sync.Mutex
	reloaders []reloader

	writes *writeLimiter

	drainOnce sync.Once
	drainErr  error
}

type reloader struct {
	name string
	f    func() error
}

// New listens at once, so a port conflict or a bad web config fails start-up
// before any data is opened, and so tests learn the port of ":0".
func New(cfg Config, d Deps) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{
		Mux: http.NewServeMux(), Writes: http.NewServeMux(),
		cfg: cfg, deps: d, logger: d.Logger,
		admin:    map[string]bool{"/metrics": true, "/-/reload": true},
		internal: map[string]bool{},
		writes:   newWriteLimiter(cfg.MaxConcurrentWritesPerTenant, d.Tenants, d.Registry),
	}
	if cfg.WebConfigFile != "" {
		w, err := auth.Load(cfg.WebConfigFile, d.Logger, d.Registry)
		if err != nil {
			return nil, err
		}
		s.web = w
	}
	s.Mux.Handle("/metrics", promhttp.HandlerFor(d.Registry, promhttp.HandlerOpts{EnableOpenMetrics: true}))
	s.Mux.HandleFunc("/-/reload", s.serveReload)
	// Go's profiler, as Prometheus serves it: how an operator finds where a
	// slow query or a growing heap spends. Process-wide, so admin-only.
	s.Mux.HandleFunc("/debug/pprof/", pprof.Index)
	s.Mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	s.Mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	s.Mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	s.Mux.HandleFunc("/debug/pprof/trace", pprof.Trace)

	var routed http.Handler = http.HandlerFunc(s.route)
	if s.web != nil {
		routed = s.web.MiddlewareAnswering(routed, s.refusal)
	}
	probes := http.NewServeMux()
	probes.HandleFunc("/-/healthy", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("gpustore is Healthy.\n"))
	})
	probes.HandleFunc("/-/ready", func(w http.ResponseWriter, _ *http.Request) {
		if err := d.Ready(); err != nil {
			http.Error(w, "gpustore is not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("gpustore is Ready.\n"))
	})
	// The probes stay open: a kubelet or load balancer has no credentials,
	// and they tell nothing about any tenant's data.
	s.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/-/healthy" || r.URL.Path == "/-/ready" {
			probes.ServeHTTP(w, r)
			return
		}
		routed.ServeHTTP(w, r)
	})

	s.srv = &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: time.Duration(cfg.ReadHeaderTimeout),
		ReadTimeout:       time.Duration(cfg.ReadTimeout),
		WriteTimeout:      time.Duration(cfg.WriteTimeout),
		IdleTimeout:       time.Duration(cfg.IdleTimeout),
		ErrorLog:          slog.NewLogLogger(d.Logger.Handler(), slog.LevelDebug),
	}
	if s.web != nil && s.web.TLSEnabled() {
		protos := []string{"http/1.1"}
		if s.web.HTTP2() {
			protos = []string{"h2", "http/1.1"}
		} else {
			s.srv.TLSNextProto = map[string]func(*http.Server, *tls.Conn, http.Handler){}
		}
		tc, err := s.web.TLSConfig(protos)
		if err != nil {
			return nil, err
		}
		s.srv.TLSConfig = tc
	}

	lis, err := net.Listen("tcp", cfg.ListenAddress)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", cfg.ListenAddress, err)
	}
	s.lis = lis
	s.Service = services.NewBasicService(nil, s.run, s.stop)
	return s, nil
}

// Addr is the address actually listened on.
func (s *Server) Addr() net.Addr { return s.lis.Addr() }

// TLS says whether the server speaks HTTPS.
func (s *Server) TLS() bool { return s.srv.TLSConfig != nil }

// AdminOnly marks paths as process-wide: with tenants.auth set, only an
// identity allowed every tenant ("*") may use them, since they show or change
// more than one tenant.
func (s *Server) AdminOnly(paths ...string) {
	s.adminMtx.Lock()
	defer s.adminMtx.Unlock()
	for _, p := range paths {
		s.admin[p] = true
	}
}

// Internal marks paths as the ring's own: only another gpustore process
// (tenancy.Config.Peer: one of Deps.Peers, else an identity allowed every
// tenant) may use them, never a tenant's identity; their requests name
// their tenant in the header (tenancy.AsPeer).
func (s *Server) Internal(paths ...string) {
	s.adminMtx.Lock()
	defer s.adminMtx.Unlock()
	for _, p := range paths {
		s.internal[p] = true
	}
}

func (s *Server) isInternalPath(p string) bool {
	s.adminMtx.RLock()
	defer s.adminMtx.RUnlock()
	return s.internal[p]
}

func (s *Server) isAdminPath(p string) bool {
	s.adminMtx.RLock()
	defer s.adminMtx.RUnlock()
	return s.admin[p] || strings.HasPrefix(p, "/debug/pprof/")
}

// OnReload adds what SIGHUP and POST /-/reload re-read, after the web config.
func (s *Server) OnReload(name string, f func() error) {
	s.reloadMtx.Lock()
	defer s.reloadMtx.Unlock()
	s.reloaders = append(s.reloaders, reloader{name, f})
}

// Reload re-reads the web config and everything registered with OnReload.
// A part that fails keeps its previous configuration; the others still reload.
func (s *Server) Reload() error {
	var errs []error
	if s.web != nil {
		if err := s.web.Reload(); err != nil {
			errs = append(errs, err)
		}
	}
	s.reloadMtx.Lock()
	rs := append([]reloader(nil), s.reloaders...)
	s.reloadMtx.Unlock()
	for _, r := range rs {
		if err := r.f(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", r.name, err))
		}
	}
	if n := s.deps.Notifications; n != nil {
		if len(errs) > 0 {
			n.AddNotification(notifications.ConfigurationUnsuccessful)
		} else {
			n.DeleteNotification(notifications.ConfigurationUnsuccessful)
		}
	}
	return errors.Join(errs...)
}

func (s *Server) serveReload(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost && r.Method != http.MethodPut {
		w.Header().Set("Allow", "POST, PUT")
		http.Error(w, "only POST or PUT requests allowed", http.StatusMethodNotAllowed)
		return
	}
	if err := s.Reload(); err != nil {
		http.Error(w, fmt.Sprintf("failed to reload config: %s", err), http.StatusInternalServerError)
		return
	}
}

// route runs behind the web config: the ring's internal routes only for
// its own processes, writes through the per-tenant limit, process-wide
// routes only for identities allowed every tenant.
func (s *Server) route(w http.ResponseWriter, r *http.Request) {
	if s.isInternalPath(r.URL.Path) {
		if err := s.deps.Tenants.Peer(r, s.deps.Peers); err != nil {
			s.refuse(w, r, err)
			return
		}
		r = r.WithContext(tenancy.AsPeer(r.Context()))
	} else if s.isAdminPath(r.URL.Path) {
		if err := s.deps.Tenants.Admin(r); err != nil {
			s.refuse(w, r, err)
			return
		}
	}
	if h, pattern := s.Writes.Handler(r); pattern != "" {
		if stall := time.Duration(s.cfg.WriteBodyStallTimeout); stall > 0 {
			r.Body = guardStalls(w, r.Body, stall, s.cfg.WriteBodyMinRate, time.Duration(s.cfg.ReadTimeout))
		}
		s.writes.serve(h, w, r)
		return
	}
	s.Mux.ServeHTTP(w, r)
}

// ErrorAnswerer is a route's handler that answers the server's refusals of
// its requests (no or wrong credentials, the rate limit, an identity the
// route is not for) in its protocol's own format: the OTLP paths answer a
// google.rpc.Status, as the OTLP/HTTP specification asks of every failure.
// The headers that go with a refusal (WWW-Authenticate, Retry-After) are
// set before AnswerError is called.
type ErrorAnswerer interface {
	AnswerError(w http.ResponseWriter, r *http.Request, status int, msg string)
}

// refusal answers a refused request in its route's format (ErrorAnswerer),
// or as text.
func (s *Server) refusal(w http.ResponseWriter, r *http.Request, status int, msg string) {
	if h, pattern := s.Writes.Handler(r); pattern != "" {
		if a, ok := h.(ErrorAnswerer); ok {
			a.AnswerError(w, r, status, msg)
			return
		}
	}
	http.Error(w, msg, status)
}

// refuse answers a request its identity may not make.
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, err error) {
	status := http.StatusForbidden
	var te *tenancy.Error
	if errors.As(err, &te) {
		status = te.Status
	}
	s.refusal(w, r, status, err.Error())
}

func (s *Server) run(ctx context.Context) error {
	errc := make(chan error, 1)
	s.logger.Info("listening", "address", s.lis.Addr().String(), "tls", s.TLS(), "auth", s.web != nil)
	if s.web == nil {
		s.warnOpen()
	}
	go func() {
		if s.TLS() {
			errc <- s.srv.ServeTLS(s.lis, "", "")
			return
		}
		errc <- s.srv.Serve(s.lis)
	}()
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			// Drained by the storage role before it closed the databases.
			<-ctx.Done()
			return nil
		}
		return fmt.Errorf("http server: %w", err)
	}
}

// warnOpen says, at start, what anyone who reaches the listener may do
// without a web config: the open default suits one user on one machine, and
// an operator must know before exposing the port that it is not closed.
func (s *Server) warnOpen() {
	s.logger.Warn("every route is open: no --web.config.file",
		"address", s.lis.Addr().String(),
		"open", "POST /-/reload, /debug/pprof/ (profiles, the command line), /metrics and /api/v1/status/* (every tenant's series counts, the flags), every tenant's writes and reads",
		"close_with", "a web config of one line, basic_auth_users: {ops: <bcrypt hash>} (see docs/security.md)")
}

// Drain stops accepting requests and waits for in-flight ones. The storage
// role calls it before closing the TSDBs so no acknowledged write races the
// close; calling it again is a no-op.
func (s *Server) Drain() error {
	s.drainOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(s.cfg.ShutdownTimeout))
		defer cancel()
		s.drainErr = s.srv.Shutdown(ctx)
	})
	return s.drainErr
}

func (s *Server) stop(error) error { return s.Drain() }

// writeLimiter bounds each tenant's writes being decoded and stored. A
// write takes its slot once its body has been read (slotBody): reading a
// body is bounded by the stall timeout, the minimum rate and the in-flight
// bytes, and a slot taken before it let bodies that trickle in (a byte every
// 5 s) hold a tenant's slots for the whole read timeout.
type writeLimiter struct {
	max      int
	tenants  tenancy.Config
	mtx      sync.Mutex
	inflight map[string]int
	rejected *prometheus.CounterVec
	gauge    *prometheus.GaugeVec
}

// writeRetryAfter is what a refused write is told to wait: about the time a
// write in progress takes, so the sender's next try finds a free slot.
const writeRetryAfter = 1 * time.Second

func newWriteLimiter(max int, tenants tenancy.Config, reg prometheus.Registerer) *writeLimiter {
	return &writeLimiter{
		max: max, tenants: tenants, inflight: map[string]int{},
		rejected: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_server_write_requests_throttled_total",
			Help: "Writes answered 503 because the tenant had server.max_concurrent_writes_per_tenant being decoded and stored.",
		}, []string{"tenant"}),
		gauge: promauto.With(reg).NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpustore_server_inflight_write_requests",
			Help: "Writes being decoded and stored (their bodies read), per tenant (no series for a tenant with none).",
		}, []string{"tenant"}),
	}
}

// serve runs h with r's body taking a slot of r's tenant once it is read;
// a write that reads its body whole and finds no slot free reads an error
// instead of the body's end (WriteSlotsBusyError), which it answers.
func (l *writeLimiter) serve(h http.Handler, w http.ResponseWriter, r *http.Request) {
	if l.max <= 0 {
		h.ServeHTTP(w, r)
		return
	}
	id, err := l.tenants.FromRequest(r)
	if err != nil {
		h.ServeHTTP(w, r) // the handler answers the tenant error itself
		return
	}
	body := &slotBody{ReadCloser: r.Body, take: func() error { return l.take(id) }}
	r.Body = body
	defer func() {
		if body.held {
			l.release(id)
		}
	}()
	h.ServeHTTP(w, r)
}

func (l *writeLimiter) take(id string) error {
	l.mtx.Lock()
	defer l.mtx.Unlock()
	if l.inflight[id] >= l.max {
		l.rejected.WithLabelValues(id).Inc()
		return &WriteSlotsBusyError{Tenant: id, Max: l.max}
	}
	l.inflight[id]++
	l.gauge.WithLabelValues(id).Set(float64(l.inflight[id]))
	return nil
}

func (l *writeLimiter) release(id string) {
	l.mtx.Lock()
	defer l.mtx.Unlock()
	// A tenant with no write in progress has no series: anyone may name
	// tenants, and each name's series would stay forever.
	if l.inflight[id]--; l.inflight[id] == 0 {
		delete(l.inflight, id)
		l.gauge.DeleteLabelValues(id)
		return
	}
	l.gauge.WithLabelValues(id).Set(float64(l.inflight[id]))
}

// WriteSlotsBusyError is what a write's body reads in place of its end
// when its tenant has server.max_concurrent_writes_per_tenant writes being
// decoded and stored: the write handler answers 503 with Retry-After
// (HTTPStatus), which every sender retries.
type WriteSlotsBusyError struct {
	Tenant string
	Max    int
}

func (e *WriteSlotsBusyError) Error() string {
	return fmt.Sprintf("tenant %q has %d writes in progress (server.max_concurrent_writes_per_tenant); retry in %s", e.Tenant, e.Max, writeRetryAfter)
}

// HTTPStatus is the answer to the write: 503.
func (e *WriteSlotsBusyError) HTTPStatus() int { return http.StatusServiceUnavailable }

// RetryAfter is how long the sender should wait.
func (e *WriteSlotsBusyError) RetryAfter() time.Duration { return writeRetryAfter }

// slotBody is a write's body that takes its tenant's write slot when it
// has been read to its end.
type slotBody struct {
	io.ReadCloser
	take    func() error
	held    bool
	refused error
}

func (b *slotBody) Read(p []byte) (int, error) {
	if b.refused != nil {
		return 0, b.refused
	}
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.held {
		if b.refused = b.take(); b.refused != nil {
			return n, b.refused
		}
		b.held = true
	}
	return n, err
}

// stallGuard is a write body whose reads fail once no data has come for
// stall, or once, stall after it began, it has come slower than minRate on
// average: before each read it moves the connection's read deadline to the
// earlier of the two, never past the request's own deadline (read_timeout
// from the start). A body that stops arriving, or trickles in (a byte every
// few seconds), is then cut after about stall, not after the whole read
// timeout; a body that keeps coming is bounded by the read timeout as
// before.
type stallGuard struct {
	io.ReadCloser
	rc      *http.ResponseController
	stall   time.Duration
	minRate int // bytes/s; 0: none
	start   time.Time
	read    int64
	until   time.Time // the request's read deadline; zero: none
	done    bool
}

// guardStalls wraps body; where the connection has no read deadlines to
// move (a test's recorder) it returns body unchanged.
func guardStalls(w http.ResponseWriter, body io.ReadCloser, stall time.Duration, minRate int, readTimeout time.Duration) io.ReadCloser {
	g := &stallGuard{ReadCloser: body, rc: http.NewResponseController(w), stall: stall, minRate: minRate, start: time.Now()}
	if readTimeout > 0 {
		g.until = g.start.Add(readTimeout)
	}
	if err := g.rc.SetReadDeadline(g.deadline()); err != nil {
		return body
	}
	return g
}

func (g *stallGuard) deadline() time.Time {
	d := time.Now().Add(g.stall)
	if g.minRate > 0 {
		// What has come may take stall and then minRate's time.
		byRate := g.start.Add(g.stall + time.Duration(float64(g.read)/float64(g.minRate)*float64(time.Second)))
		if byRate.Before(d) {
			d = byRate
		}
	}
	if !g.until.IsZero() && d.After(g.until) {
		return g.until
	}
	return d
}

func (g *stallGuard) Read(p []byte) (int, error) {
	if g.done {
		return g.ReadCloser.Read(p)
	}
	_ = g.rc.SetReadDeadline(g.deadline())
	n, err := g.ReadCloser.Read(p)
	g.read += int64(n)
	if err != nil {
		// The body is over (or broken): the deadline is left alone from
		// here on. At the body's end net/http clears it and reads on in
		// the background to notice a client that leaves; a deadline set
		// again would end that read and cancel the request's context
		// while the handler still stores the body.
		g.done = true
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() && (g.until.IsZero() || time.Now().Before(g.until)) {
			err = fmt.Errorf("the body stalled for %s or arrived slower than %d bytes/s (%d bytes in %s): %w", g.stall, g.minRate, g.read, time.Since(g.start).Round(time.Millisecond), err)
		}
	}
	return n, err
}
