// Package auth applies a Prometheus web configuration file
// (--web.config.file, the exporter-toolkit format) to gpustore's HTTP
// server: TLS with optional client certificates, basic-auth users with
// bcrypt-hashed passwords, extra response headers and a request rate limit.
// It also tells the rest of gpustore who a request authenticated as (its
// Identity), which tenant authorisation (pkg/tenancy) maps to tenants.
//
// The file's format, its checks and the TLS configuration are the
// exporter-toolkit's own (web.Validate, web.Config, web.ConfigToTLSConfig).
// gpustore does not serve through the toolkit's web.Serve because that wraps
// every path of the server: the probes /-/healthy and /-/ready must stay open
// for a kubelet or load balancer that has no credentials.
//
// Reloading differs from the toolkit in one way, on purpose. The toolkit
// re-reads and re-parses the file on every request and on every TLS
// handshake, so a broken edit answers 500 to every request until it is
// fixed. gpustore reads the file at start and again on SIGHUP and POST
// /-/reload; a file that does not pass the toolkit's checks is refused and
// the previous configuration stays in force. As with the toolkit, the
// certificate and key files are read on every new TLS connection, so a
// rotated certificate is served without a reload; open connections are never
// dropped by a reload.
package auth

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/exporter-toolkit/web"
	"go.yaml.in/yaml/v2"
	"golang.org/x/crypto/bcrypt"
	"golang.org/x/sync/singleflight"
	"golang.org/x/time/rate"
)

// WebConfig is a loaded web configuration file, swapped whole on reload.
type WebConfig struct {
	path   string
	logger *slog.Logger
	cur    atomic.Pointer[loaded]
	// tlsOn is fixed at start: the listener is either TLS or not.
	tlsOn bool

	// bcrypt is deliberately slow. Passwords that passed are remembered
	// (by a hash of user, stored hash and password), so a sender that sends
	// the same credentials with every request pays once. Failures are not
	// remembered: a flood of wrong guesses, each new, would only fill the
	// memo and push the verified ones out of it.
	verifiedMtx sync.RWMutex
	verified    map[[sha256.Size]byte]struct{}
	// checking makes concurrent checks of the same credentials one check
	// (a Prometheus' shards all start at once); queue bounds the checks
	// running at once (checkSlots) and those waiting (checkqueue.go), so a
	// flood of guesses neither takes every core nor piles up, verified
	// senders never wait for it, and a user's first check waits its turn.
	checking singleflight.Group
	queue    *checkQueue
	compare  func(hash, password []byte) error // bcrypt's; tests slow it down
	checks   *prometheus.CounterVec

	reloadOK   prometheus.Gauge
	reloadTime prometheus.Gauge
	denied     *prometheus.CounterVec
}

type loaded struct {
	cfg    *web.Config
	limits *identityLimits // nil without rate_limit
	// fakeHash is compared against for unknown users, so that an answer's
	// timing does not tell which users exist: a hash of the users' highest
	// bcrypt cost (a fixed cost would make unknown users slower or faster
	// to refuse than known ones).
	fakeHash []byte
}

// checkSlots is how many bcrypt checks run at once: half the cores, at
// least one. Checks on every core let a flood of guesses starve everything
// else: on 2 cores, 150 connections guessing at bcrypt's default cost made
// the requests of verified users wait 30-60 ms at the median (up to 370 ms)
// with two checks at once, 2-3 ms (up to 140 ms) with one
// (TestPasswordFloodLatency, GPUSTORE_MEASURE=1).
func checkSlots() int { return max(1, runtime.GOMAXPROCS(0)/2) }

// The checks that may wait for a slot, per user (a user has one password:
// more are guesses) and in all; past them a request is answered 503 at
// once. At bcrypt's default cost (~70 ms a check on a core) the last of 64
// waits ~4.5 s on one slot.
const (
	maxWaitingChecksPerUser = 8
	maxWaitingChecks        = 64
)

// maxVerified bounds the memo of verified passwords. Only a password that
// passes enters it, about one per user; past the bound an entry is dropped
// to make room.
const maxVerified = 1024

// Load reads and checks the file. An error means gpustore must not start.
func Load(path string, logger *slog.Logger, reg prometheus.Registerer) (*WebConfig, error) {
	w := &WebConfig{
		path: path, logger: logger, verified: map[[sha256.Size]byte]struct{}{},
		queue:   newCheckQueue(checkSlots(), maxWaitingChecksPerUser, maxWaitingChecks),
		compare: bcrypt.CompareHashAndPassword,
		checks: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_server_password_checks_total",
			Help: "Basic-auth passwords to check with bcrypt (not remembered from an earlier check), by result: ok, wrong, busy (refused unchecked: too many checks waiting), abandoned (the client left before its check).",
		}, []string{"result"}),
		reloadOK: promauto.With(reg).NewGauge(prometheus.GaugeOpts{
			Name: "gpustore_server_web_config_last_reload_successful",
			Help: "Whether the last load of --web.config.file succeeded (1) or the previous configuration is still in force (0).",
		}),
		reloadTime: promauto.With(reg).NewGauge(prometheus.GaugeOpts{
			Name: "gpustore_server_web_config_last_reload_success_timestamp_seconds",
			Help: "When --web.config.file was last loaded successfully.",
		}),
		denied: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_server_unauthorized_requests_total",
			Help: "Requests refused by the web configuration, by reason (no_credentials, bad_credentials, rate_limited, checks_busy).",
		}, []string{"reason"}),
	}
	l, err := parse(path)
	if err != nil {
		return nil, err
	}
	w.tlsOn = l.cfg.TLSConfig.IsEnabled()
	w.cur.Store(l)
	w.reloadOK.Set(1)
	w.reloadTime.SetToCurrentTime()
	return w, nil
}

// parse checks the file with the toolkit's own validation (strict YAML,
// allowed headers, bcrypt hashes, certificates and keys that load), then
// reads it into the toolkit's Config with the toolkit's defaults.
func parse(path string) (*loaded, error) {
	if err := web.Validate(path); err != nil {
		return nil, fmt.Errorf("web config %s: %w", path, err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("web config: %w", err)
	}
	c := &web.Config{
		TLSConfig:  web.TLSConfig{MinVersion: tls.VersionTLS12, MaxVersion: tls.VersionTLS13},
		HTTPConfig: web.HTTPConfig{HTTP2: true},
	}
	if err := yaml.UnmarshalStrict(b, c); err != nil {
		return nil, fmt.Errorf("web config %s: %w", path, err)
	}
	c.TLSConfig.SetDirectory(filepath.Dir(path))
	l := &loaded{cfg: c}
	if len(c.Users) > 0 {
		cost := bcrypt.MinCost
		for _, h := range c.Users {
			if hc, err := bcrypt.Cost([]byte(h)); err == nil {
				cost = max(cost, hc)
			}
		}
		// At most 16 (~5 s on a core): generating the fake hash must not
		// stall a load for a cost that would stall every request anyway.
		if l.fakeHash, err = bcrypt.GenerateFromPassword([]byte("not a password of anybody"), min(cost, 16)); err != nil {
			return nil, fmt.Errorf("web config %s: %w", path, err)
		}
	}
	if rl := c.RateLimiterConfig; rl.Interval > 0 {
		l.limits = &identityLimits{every: rate.Every(rl.Interval), burst: rl.Burst, byName: map[string]*rate.Limiter{}}
	}
	return l, nil
}

// identityLimits is the web config's rate_limit, one bucket per identity.
// The toolkit keeps one bucket for the server and takes from it before it
// checks credentials, so anyone, without credentials, spends every
// sender's budget (an anonymous flood got 18 of a sender's 20 writes
// answered 429). Here a request takes from its identity's bucket once
// authenticated; requests without an identity (no basic_auth_users and no
// verified client certificate) share the bucket of the empty name, which
// is the toolkit's behaviour for a server without authentication.
type identityLimits struct {
	every  rate.Limit
	burst  int
	mtx    sync.Mutex
	byName map[string]*rate.Limiter
}

// maxLimitedIdentities bounds the buckets kept; identities are the
// configured users or the subjects of certificates the client CA signed,
// so it is reached only by a CA signing certificates without end: then the
// buckets start over.
const maxLimitedIdentities = 10000

func (il *identityLimits) allow(name string) bool {
	il.mtx.Lock()
	lim, ok := il.byName[name]
	if !ok {
		if len(il.byName) >= maxLimitedIdentities {
			clear(il.byName)
		}
		lim = rate.NewLimiter(il.every, il.burst)
		il.byName[name] = lim
	}
	il.mtx.Unlock()
	return lim.Allow()
}

// Reload re-reads the file. On error the previous configuration stays.
func (w *WebConfig) Reload() error {
	l, err := parse(w.path)
	if err == nil && l.cfg.TLSConfig.IsEnabled() != w.tlsOn {
		err = fmt.Errorf("web config %s: turning TLS on or off needs a restart", w.path)
	}
	if err != nil {
		w.reloadOK.Set(0)
		return err
	}
	// The verified passwords stay verified: each is remembered with its
	// user's hash, so a changed or removed user's no longer matches.
	w.cur.Store(l)
	w.reloadOK.Set(1)
	w.reloadTime.SetToCurrentTime()
	return nil
}

// TLSEnabled says whether the listener serves TLS.
func (w *WebConfig) TLSEnabled() bool { return w.tlsOn }

// TLSConfig is the server's TLS configuration, nil without TLS. Each new
// connection gets the configuration in force then (and the toolkit reads
// the certificate files again), so a reload applies to new connections.
func (w *WebConfig) TLSConfig(nextProtos []string) (*tls.Config, error) {
	if !w.tlsOn {
		return nil, nil
	}
	build := func() (*tls.Config, error) {
		c, err := web.ConfigToTLSConfig(&w.cur.Load().cfg.TLSConfig)
		if err != nil {
			return nil, err
		}
		c.NextProtos = nextProtos
		return c, nil
	}
	first, err := build()
	if err != nil {
		return nil, err
	}
	first.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) { return build() }
	return first, nil
}

// HTTP2 says whether the file allows HTTP/2 over TLS (http_server_config.http2).
func (w *WebConfig) HTTP2() bool { return w.cur.Load().cfg.HTTPConfig.HTTP2 }

// Identity is who a request authenticated as.
type Identity struct {
	// User is the basic-auth user, when basic_auth_users is set.
	User string
	// CommonName is the subject CN of a client certificate that was verified
	// against client_ca_file (never of an unverified one).
	CommonName string
}

// Name is the identity tenant authorisation looks up: the basic-auth user
// when there is one, else the certificate's common name.
func (id Identity) Name() string {
	if id.User != "" {
		return id.User
	}
	return id.CommonName
}

type identityKey struct{}

// IdentityFrom returns the request's identity; false when the request did not
// authenticate (no web config, or neither users nor client certificates).
func IdentityFrom(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(identityKey{}).(Identity)
	return id, ok && id.Name() != ""
}

// WithIdentity returns ctx carrying id.
func WithIdentity(ctx context.Context, id Identity) context.Context {
	return context.WithValue(ctx, identityKey{}, id)
}

// Middleware applies the configuration to every request: response headers,
// basic auth (401 with WWW-Authenticate), the rate limit of the request's
// identity (429, as the toolkit answers), then records the identity in the
// request context. Refusals are answered as text.
func (w *WebConfig) Middleware(next http.Handler) http.Handler {
	return w.MiddlewareAnswering(next, TextRefusal)
}

// Refusal answers a request the configuration refuses, with status and a
// message; the headers that go with it (WWW-Authenticate, Retry-After) are
// set already. Routes of another protocol answer in its format (OTLP: a
// google.rpc.Status).
type Refusal func(rw http.ResponseWriter, r *http.Request, status int, msg string)

// TextRefusal answers a refusal as text, as net/http's http.Error does.
func TextRefusal(rw http.ResponseWriter, _ *http.Request, status int, msg string) {
	http.Error(rw, msg, status)
}

// MiddlewareAnswering is Middleware with refusals answered by refuse.
func (w *WebConfig) MiddlewareAnswering(next http.Handler, refuse Refusal) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		l := w.cur.Load()
		for k, v := range l.cfg.HTTPConfig.Header {
			rw.Header().Set(k, v)
		}
		var id Identity
		if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 && len(r.TLS.VerifiedChains[0]) > 0 {
			id.CommonName = r.TLS.VerifiedChains[0][0].Subject.CommonName
		}
		if len(l.cfg.Users) > 0 {
			user, pass, ok := r.BasicAuth()
			if !ok {
				w.deny(rw, r, refuse, "no_credentials")
				return
			}
			ok, err := w.checkPassword(r.Context(), l, user, pass)
			switch {
			case err != nil && r.Context().Err() != nil:
				return // the client left before its password was checked
			case err != nil:
				// Too many checks wait: the password was not checked.
				// 503, which a legitimate client caught in a flood of
				// guesses retries (Prometheus and OTLP exporters do), not
				// 401, which it would not.
				w.denied.WithLabelValues("checks_busy").Inc()
				rw.Header().Set("Retry-After", "1")
				refuse(rw, r, http.StatusServiceUnavailable, "too many password checks in progress, retry later")
				return
			case !ok:
				w.deny(rw, r, refuse, "bad_credentials")
				return
			}
			id.User = user
		}
		if l.limits != nil && !l.limits.allow(id.Name()) {
			w.denied.WithLabelValues("rate_limited").Inc()
			refuse(rw, r, http.StatusTooManyRequests, http.StatusText(http.StatusTooManyRequests))
			return
		}
		next.ServeHTTP(rw, r.WithContext(WithIdentity(r.Context(), id)))
	})
}

func (w *WebConfig) deny(rw http.ResponseWriter, r *http.Request, refuse Refusal, reason string) {
	w.denied.WithLabelValues(reason).Inc()
	rw.Header().Set("WWW-Authenticate", `Basic realm="gpustore"`)
	refuse(rw, r, http.StatusUnauthorized, http.StatusText(http.StatusUnauthorized))
}

// checkPassword says whether pass is user's password: at once when it was
// verified before, else after a bcrypt check, for which it waits its turn
// (checkQueue). The error says it was not checked: errChecksBusy, or ctx's
// when the client left first.
func (w *WebConfig) checkPassword(ctx context.Context, l *loaded, user, pass string) (bool, error) {
	stored, known := l.cfg.Users[user]
	hash := []byte(stored)
	turn := user // the queue's turns: each known user, and unknown ones together
	if !known {
		hash, turn = l.fakeHash, ""
	}
	key := sha256.Sum256(fmt.Appendf(nil, "%d:%s\x00%s\x00%s", len(user), user, hash, pass))
	w.verifiedMtx.RLock()
	_, ok := w.verified[key]
	w.verifiedMtx.RUnlock()
	if ok {
		return true, nil
	}
	for {
		// The check runs in the first request's goroutine's stead (DoChan)
		// and waits for its slot as long as that request does; requests
		// with the same credentials share it, and check again should its
		// request leave before the check ran.
		ch := w.checking.DoChan(string(key[:]), func() (any, error) {
			return w.check(ctx, turn, user, hash, pass, known, key)
		})
		select {
		case res := <-ch:
			if res.Err != nil && !errors.Is(res.Err, errChecksBusy) && ctx.Err() == nil {
				continue // the request whose check it was left: check again
			}
			if res.Err != nil {
				return false, res.Err
			}
			return res.Val.(bool), nil
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
}

// check runs one bcrypt check in a slot of the queue and remembers a
// password that passed.
func (w *WebConfig) check(ctx context.Context, turn, user string, hash []byte, pass string, known bool, key [sha256.Size]byte) (bool, error) {
	if err := w.queue.acquire(ctx, turn); err != nil {
		result := "abandoned"
		if errors.Is(err, errChecksBusy) {
			result = "busy"
		}
		w.checks.WithLabelValues(result).Inc()
		return false, err
	}
	defer w.queue.release()
	start := time.Now()
	ok := w.compare(hash, []byte(pass)) == nil && known
	w.logger.Debug("checked password", "user", user, "ok", ok, "took", time.Since(start))
	if !ok {
		w.checks.WithLabelValues("wrong").Inc()
		return false, nil
	}
	w.checks.WithLabelValues("ok").Inc()
	w.verifiedMtx.Lock()
	defer w.verifiedMtx.Unlock()
	if len(w.verified) >= maxVerified {
		for k := range w.verified {
			delete(w.verified, k)
			break
		}
	}
	w.verified[key] = struct{}{}
	return true, nil
}
