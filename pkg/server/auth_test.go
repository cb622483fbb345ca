package server

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/grafana/dskit/services"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/crypto/bcrypt"

	"github.com/gpustore/gpustore/internal/abuse"
	"github.com/gpustore/gpustore/internal/testcerts"
	"github.com/gpustore/gpustore/pkg/auth"
	"github.com/gpustore/gpustore/pkg/tenancy"
)

// startServer runs a Server with a write route and a query-like route that
// answer the tenant they were given, or the tenancy error.
func startServer(t *testing.T, cfg Config, tenants tenancy.Config) *Server {
	t.Helper()
	if cfg.ListenAddress == "" {
		cfg.ListenAddress = "127.0.0.1:0"
	}
	s, err := New(cfg, Deps{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Registry: prometheus.NewRegistry(),
		Ready: func() error { return nil }, Tenants: tenants,
	})
	if err != nil {
		t.Fatal(err)
	}
	echo := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := tenants.FromRequest(r)
		if err != nil {
			http.Error(w, err.Error(), err.(*tenancy.Error).Status)
			return
		}
		who, _ := auth.IdentityFrom(r.Context())
		fmt.Fprintf(w, "tenant=%s identity=%s", id, who.Name())
	})
	s.Writes.Handle("/api/v1/write", echo)
	s.Mux.Handle("/api/v1/", echo)
	if err := services.StartAndAwaitRunning(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = services.StopAndAwaitTerminated(context.Background(), s) })
	return s
}

func bcryptHash(t *testing.T, pass string) string {
	t.Helper()
	h, err := bcrypt.GenerateFromPassword([]byte(pass), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	return string(h)
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

type call struct {
	method, path, user, pass, tenant string
}

func do(t *testing.T, c *http.Client, base string, k call) (int, string) {
	t.Helper()
	if k.method == "" {
		k.method = http.MethodGet
	}
	req, _ := http.NewRequest(k.method, base+k.path, nil)
	if k.user != "" {
		req.SetBasicAuth(k.user, k.pass)
	}
	if k.tenant != "" {
		req.Header.Set(tenancy.OrgIDHeader, k.tenant)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", k.method, k.path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestWebConfigTLSAndBasicAuth: with a web config file of TLS and bcrypt
// users, every route but the probes needs credentials (401 without, 200 with),
// plain HTTP is refused, the probes answer without credentials, and the
// configured headers are on every answer.
func TestWebConfigTLSAndBasicAuth(t *testing.T) {
	ca := testcerts.NewCA(t, "gpustore-test")
	srv := ca.Server(t, "server")
	dir := t.TempDir()
	file := filepath.Join(dir, "web.yml")
	writeFile(t, file, fmt.Sprintf(`tls_server_config:
  cert_file: %s
  key_file: %s
  min_version: TLS13
basic_auth_users:
  prometheus: %s
http_server_config:
  headers:
    X-Content-Type-Options: nosniff
`, srv.CertFile, srv.KeyFile, bcryptHash(t, "s3cret")))
	s := startServer(t, Config{WebConfigFile: file}, tenancy.DefaultConfig())
	base := "https://" + s.Addr().String()
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool}}}

	for _, path := range []string{"/api/v1/write", "/api/v1/query", "/metrics", "/-/reload"} {
		if code, _ := do(t, client, base, call{path: path}); code != http.StatusUnauthorized {
			t.Errorf("%s without credentials: %d, want 401", path, code)
		}
		if code, _ := do(t, client, base, call{path: path, user: "prometheus", pass: "wrong"}); code != http.StatusUnauthorized {
			t.Errorf("%s with a wrong password: %d, want 401", path, code)
		}
		if code, _ := do(t, client, base, call{path: path, user: "nobody", pass: "s3cret"}); code != http.StatusUnauthorized {
			t.Errorf("%s as an unknown user: %d, want 401", path, code)
		}
	}
	code, body := do(t, client, base, call{path: "/api/v1/write", user: "prometheus", pass: "s3cret"})
	if code != http.StatusOK || body != "tenant=default identity=prometheus" {
		t.Errorf("write with credentials: %d %q", code, body)
	}
	if code, _ := do(t, client, base, call{path: "/metrics", user: "prometheus", pass: "s3cret"}); code != http.StatusOK {
		t.Errorf("/metrics with credentials: %d", code)
	}
	for _, path := range []string{"/-/healthy", "/-/ready"} {
		if code, _ := do(t, client, base, call{path: path}); code != http.StatusOK {
			t.Errorf("probe %s without credentials: %d, want 200", path, code)
		}
	}
	req, _ := http.NewRequest(http.MethodGet, base+"/api/v1/query", nil)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Get("X-Content-Type-Options"); got != "nosniff" {
		t.Errorf("configured header missing on a 401: %q", got)
	}
	if resp.Header.Get("WWW-Authenticate") == "" {
		t.Error("401 without WWW-Authenticate")
	}
	// Plain HTTP to the TLS port gets no answer from the handlers.
	if resp, err := http.Get("http://" + s.Addr().String() + "/-/healthy"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Error("plain HTTP served on the TLS listener")
		}
	}
	// TLS 1.2 is below min_version.
	old := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool, MaxVersion: tls.VersionTLS12}}}
	if _, err := old.Get(base + "/-/healthy"); err == nil {
		t.Error("TLS 1.2 accepted with min_version TLS13")
	}
}

// TestWebConfigMutualTLS: with client_auth_type RequireAndVerifyClientCert a
// client without a certificate, or with one from another CA, cannot connect;
// one with a certificate of the client CA can, and its common name is the
// request's identity.
func TestWebConfigMutualTLS(t *testing.T) {
	ca := testcerts.NewCA(t, "gpustore-test")
	other := testcerts.NewCA(t, "other")
	srv := ca.Server(t, "server")
	file := filepath.Join(t.TempDir(), "web.yml")
	writeFile(t, file, fmt.Sprintf(`tls_server_config:
  cert_file: %s
  key_file: %s
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: %s
`, srv.CertFile, srv.KeyFile, ca.CertFile))
	s := startServer(t, Config{WebConfigFile: file}, tenancy.DefaultConfig())
	base := "https://" + s.Addr().String()
	clientWith := func(certs ...tls.Certificate) *http.Client {
		return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool, Certificates: certs}}}
	}
	if _, err := clientWith().Get(base + "/api/v1/query"); err == nil {
		t.Error("connected without a client certificate")
	}
	if _, err := clientWith(other.Client(t, "intruder").TLS).Get(base + "/api/v1/query"); err == nil {
		t.Error("connected with a certificate of an unknown CA")
	}
	code, body := do(t, clientWith(ca.Client(t, "prometheus-a").TLS), base, call{path: "/api/v1/query"})
	if code != http.StatusOK || body != "tenant=default identity=prometheus-a" {
		t.Errorf("with a client certificate: %d %q", code, body)
	}
}

// TestWebConfigReload: POST /-/reload (and Server.Reload, which SIGHUP calls)
// applies a changed users list; a broken file is refused with 500, the
// previous configuration stays in force and the metric says so.
func TestWebConfigReload(t *testing.T) {
	file := filepath.Join(t.TempDir(), "web.yml")
	writeFile(t, file, "basic_auth_users:\n  alice: "+bcryptHash(t, "one")+"\n")
	s := startServer(t, Config{WebConfigFile: file}, tenancy.DefaultConfig())
	base := "http://" + s.Addr().String()
	c := http.DefaultClient
	if code, _ := do(t, c, base, call{path: "/api/v1/query", user: "alice", pass: "one"}); code != http.StatusOK {
		t.Fatalf("before reload: %d", code)
	}
	writeFile(t, file, "basic_auth_users:\n  alice: "+bcryptHash(t, "two")+"\n")
	// Nothing changes before the reload: the file is not read per request.
	if code, _ := do(t, c, base, call{path: "/api/v1/query", user: "alice", pass: "one"}); code != http.StatusOK {
		t.Fatalf("before reload, old password: %d", code)
	}
	if code, body := do(t, c, base, call{method: http.MethodPost, path: "/-/reload", user: "alice", pass: "one"}); code != http.StatusOK {
		t.Fatalf("reload: %d %s", code, body)
	}
	if code, _ := do(t, c, base, call{path: "/api/v1/query", user: "alice", pass: "one"}); code != http.StatusUnauthorized {
		t.Errorf("after reload, old password: %d, want 401", code)
	}
	if code, _ := do(t, c, base, call{path: "/api/v1/query", user: "alice", pass: "two"}); code != http.StatusOK {
		t.Errorf("after reload, new password: %d", code)
	}

	writeFile(t, file, "basic_auth_users:\n  alice: not-a-bcrypt-hash\n")
	code, body := do(t, c, base, call{method: http.MethodPost, path: "/-/reload", user: "alice", pass: "two"})
	if code != http.StatusInternalServerError || !strings.Contains(body, "web config") {
		t.Errorf("reload of a broken file: %d %q, want 500 naming the web config", code, body)
	}
	if code, _ := do(t, c, base, call{path: "/api/v1/query", user: "alice", pass: "two"}); code != http.StatusOK {
		t.Errorf("after a failed reload the previous users must stay: %d", code)
	}
	if v := gaugeValue(t, s, "gpustore_server_web_config_last_reload_successful"); v != 0 {
		t.Errorf("reload success gauge %v after a failed reload, want 0", v)
	}
	if err := s.Reload(); err == nil {
		t.Error("Server.Reload of a broken file: no error")
	}
}

// TestWebConfigBadFileFailsStart: gpustore does not start on a web config the
// toolkit rejects (unknown key, header not allowed, missing certificate).
func TestWebConfigBadFileFailsStart(t *testing.T) {
	for name, content := range map[string]string{
		"unknown key":      "basic_auth_user:\n  a: b\n",
		"header":           "http_server_config:\n  headers:\n    X-Powered-By: me\n",
		"missing cert":     "tls_server_config:\n  cert_file: /nonexistent.crt\n  key_file: /nonexistent.key\n",
		"bad hash":         "basic_auth_users:\n  a: plaintext\n",
		"ca without auth":  "tls_server_config:\n  client_ca_file: /nonexistent.crt\n",
		"not yaml":         "{{{",
		"bad min version":  "tls_server_config:\n  min_version: TLS9\n",
		"bad client auth":  "tls_server_config:\n  cert: x\n  key: y\n  client_auth_type: Sometimes\n",
		"rate limit types": "rate_limit:\n  burst: many\n",
	} {
		file := filepath.Join(t.TempDir(), "web.yml")
		writeFile(t, file, content)
		_, err := New(Config{ListenAddress: "127.0.0.1:0", WebConfigFile: file}, Deps{
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Registry: prometheus.NewRegistry(),
			Ready: func() error { return nil },
		})
		if err == nil {
			t.Errorf("%s: server started", name)
		}
	}
}

func gaugeValue(t *testing.T, s *Server, name string) float64 {
	t.Helper()
	mfs, err := s.deps.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("metric %s not found", name)
	return 0
}

// lockedBuffer is a log sink for concurrent writers.
type lockedBuffer struct {
	mtx sync.Mutex
	b   strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mtx.Lock()
	defer l.mtx.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mtx.Lock()
	defer l.mtx.Unlock()
	return l.b.String()
}

// TestPasswordFloodKeepsVerifiedUsersVerified: a flood of wrong passwords
// (the abuse.PasswordFlood workload, distinct guesses, real bcrypt) is
// answered 401 and never makes a user whose password was verified pay a
// bcrypt check again: only successes are remembered, so failures cannot
// push them out (they used to fill the memo of checks and wipe it at 1,024,
// and the user's next request queued behind the attackers' checks). Under
// the race detector the flood is smaller (bcrypt is ~20x slower there); the
// memo's bound is also checked in pkg/auth with instant comparisons.
func TestPasswordFloodKeepsVerifiedUsersVerified(t *testing.T) {
	file := filepath.Join(t.TempDir(), "web.yml")
	writeFile(t, file, "basic_auth_users:\n  prometheus: "+bcryptHash(t, "s3cret")+"\n")
	var logs lockedBuffer
	s, err := New(Config{ListenAddress: "127.0.0.1:0", WebConfigFile: file}, Deps{
		Logger:   slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Registry: prometheus.NewRegistry(), Ready: func() error { return nil }, Tenants: tenancy.DefaultConfig(),
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Mux.HandleFunc("/api/v1/query", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	if err := services.StartAndAwaitRunning(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = services.StopAndAwaitTerminated(context.Background(), s) })
	base := "http://" + s.Addr().String()
	legit := call{path: "/api/v1/query", user: "prometheus", pass: "s3cret"}
	if code, _ := do(t, http.DefaultClient, base, legit); code != http.StatusOK {
		t.Fatalf("legitimate request: %d", code)
	}

	guesses := 1100 // more than the 1,024 checks the old memo held before it was wiped
	if raceDetector {
		guesses = 100
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var flood *abuse.Answers
	done := make(chan struct{})
	floodStart := time.Now()
	go func() {
		defer close(done)
		flood = abuse.PasswordFlood(ctx, &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}, base+"/api/v1/query", "prometheus", 16)
	}()
	for strings.Count(logs.String(), `msg="checked password" user=prometheus ok=false`) < guesses && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	<-done
	// Every answer the flood read was a 401, or a 503 past the bound of
	// checks waiting (the last guesses' answers may have been cut by the
	// cancel).
	others := 0
	for code, n := range flood.ByCode {
		if code != http.StatusUnauthorized && code != http.StatusServiceUnavailable {
			others += n
		}
	}
	if n := flood.Count(http.StatusUnauthorized); n < guesses/2 || others > 0 {
		t.Fatalf("the flood's answers: %v", flood.ByCode)
	}
	t.Logf("%d guesses answered 401 in %s", flood.Count(http.StatusUnauthorized), time.Since(floodStart).Round(time.Millisecond))
	if code, _ := do(t, http.DefaultClient, base, legit); code != http.StatusOK {
		t.Fatalf("legitimate request after the flood: %d", code)
	}
	if n := strings.Count(logs.String(), `msg="checked password" user=prometheus ok=true`); n != 1 {
		t.Errorf("the verified password was checked with bcrypt %d times, want once", n)
	}
}

// TestPasswordFloodLatency (GPUSTORE_MEASURE=1, about 7 s) measures what a
// flood of wrong passwords costs the users already verified: 150 connections
// guess at bcrypt's default cost while a verified user sends a request
// (2 ms of work) every 20 ms; it reports that user's latencies. It
// asserts only a generous bound: it measures (see auth.checkSlots).
func TestPasswordFloodLatency(t *testing.T) {
	if os.Getenv("GPUSTORE_MEASURE") != "1" {
		t.Skip("a measurement: GPUSTORE_MEASURE=1")
	}
	h, err := bcrypt.GenerateFromPassword([]byte("s3cret"), bcrypt.DefaultCost)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "web.yml")
	writeFile(t, file, "basic_auth_users:\n  prometheus: "+string(h)+"\n")
	s, err := New(Config{ListenAddress: "127.0.0.1:0", WebConfigFile: file}, Deps{
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		Registry: prometheus.NewRegistry(), Ready: func() error { return nil }, Tenants: tenancy.DefaultConfig(),
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Mux.HandleFunc("/api/v1/query", func(w http.ResponseWriter, _ *http.Request) {
		for start := time.Now(); time.Since(start) < 2*time.Millisecond; {
		}
		w.WriteHeader(http.StatusOK)
	})
	if err := services.StartAndAwaitRunning(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = services.StopAndAwaitTerminated(context.Background(), s) })
	base := "http://" + s.Addr().String()
	legit := call{path: "/api/v1/query", user: "prometheus", pass: "s3cret"}
	do(t, http.DefaultClient, base, legit)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Second)
	defer cancel()
	done := make(chan *abuse.Answers)
	go func() { done <- abuse.PasswordFlood(ctx, &http.Client{}, base+"/api/v1/query", "prometheus", 150) }()
	time.Sleep(time.Second)
	var lat []time.Duration
	for ctx.Err() == nil {
		start := time.Now()
		if code, _ := do(t, http.DefaultClient, base, legit); code != http.StatusOK {
			t.Fatalf("verified user during the flood: %d", code)
		}
		lat = append(lat, time.Since(start))
		time.Sleep(20 * time.Millisecond)
	}
	flood := <-done
	slices.Sort(lat)
	t.Logf("verified user: %d requests, p50 %s, p99 %s, max %s; flood answers %v", len(lat),
		lat[len(lat)/2].Round(100*time.Microsecond), lat[len(lat)*99/100].Round(100*time.Microsecond), lat[len(lat)-1].Round(100*time.Microsecond), flood.ByCode)
	if lat[len(lat)/2] > time.Second {
		t.Errorf("a verified user's median latency under the flood is %s", lat[len(lat)/2])
	}
}

// TestRateLimitIsPerIdentity: the web config's rate_limit is counted per
// authenticated identity, after authentication: an anonymous flood (no
// credentials, answered 401) spends nobody's budget, so the legitimate
// sender's writes within its burst all pass; past its own burst it gets 429
// as the toolkit answers.
func TestRateLimitIsPerIdentity(t *testing.T) {
	file := filepath.Join(t.TempDir(), "web.yml")
	writeFile(t, file, "basic_auth_users:\n  prometheus: "+bcryptHash(t, "s3cret")+"\n  grafana: "+bcryptHash(t, "g")+
		"\nrate_limit:\n  interval: 1m\n  burst: 20\n")
	s := startServer(t, Config{WebConfigFile: file}, tenancy.DefaultConfig())
	base := "http://" + s.Addr().String()

	var wg sync.WaitGroup
	anonymous := make(chan int, 200)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				code, _ := do(t, http.DefaultClient, base, call{method: http.MethodPost, path: "/api/v1/write"})
				anonymous <- code
			}
		}()
	}
	wg.Wait()
	close(anonymous)
	for code := range anonymous {
		if code != http.StatusUnauthorized {
			t.Fatalf("anonymous request: %d, want 401", code)
		}
	}
	limited := 0
	for range 20 {
		if code, _ := do(t, http.DefaultClient, base, call{method: http.MethodPost, path: "/api/v1/write", user: "prometheus", pass: "s3cret"}); code == http.StatusTooManyRequests {
			limited++
		}
	}
	if limited > 0 {
		t.Errorf("%d of the legitimate sender's 20 writes (its burst) got 429 after an anonymous flood", limited)
	}
	if code, _ := do(t, http.DefaultClient, base, call{method: http.MethodPost, path: "/api/v1/write", user: "prometheus", pass: "s3cret"}); code != http.StatusTooManyRequests {
		t.Errorf("the sender's 21st write within the interval: %d, want 429", code)
	}
	if code, _ := do(t, http.DefaultClient, base, call{path: "/api/v1/query", user: "grafana", pass: "g"}); code != http.StatusOK {
		t.Errorf("another identity while the sender is limited: %d", code)
	}
}

// statusAnswerer is a write route that answers in a format of its own, as
// the OTLP handler answers a google.rpc.Status: the server's refusals on
// its path go through AnswerError.
type statusAnswerer struct{}

func (statusAnswerer) ServeHTTP(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }

func (statusAnswerer) AnswerError(w http.ResponseWriter, _ *http.Request, status int, msg string) {
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.WriteHeader(status)
	_, _ = fmt.Fprintf(w, "status{%d %s}", status, msg)
}

// TestRefusalsInTheRoutesFormat: the web config's refusals (no or wrong
// credentials 401, too many password checks waiting 503, the rate limit
// 429) are answered by a route that answers errors in a format of its own
// (the OTLP paths: a google.rpc.Status, as the OTLP/HTTP specification asks
// of every failure), with their headers (WWW-Authenticate, Retry-After);
// other routes keep the text answers. Before, the OTLP paths' 401 was text.
func TestRefusalsInTheRoutesFormat(t *testing.T) {
	file := filepath.Join(t.TempDir(), "web.yml")
	writeFile(t, file, "basic_auth_users:\n  prometheus: "+bcryptHash(t, "s3cret")+"\nrate_limit:\n  interval: 1h\n  burst: 1\n")
	s, err := New(Config{ListenAddress: "127.0.0.1:0", WebConfigFile: file}, Deps{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Registry: prometheus.NewRegistry(),
		Ready: func() error { return nil }, Tenants: tenancy.DefaultConfig(),
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Writes.Handle("/otlp/v1/metrics", statusAnswerer{})
	s.Mux.HandleFunc("/api/v1/query", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	if err := services.StartAndAwaitRunning(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = services.StopAndAwaitTerminated(context.Background(), s) })
	base := "http://" + s.Addr().String()
	for _, k := range []call{{path: "/otlp/v1/metrics", method: http.MethodPost}, {path: "/otlp/v1/metrics", method: http.MethodPost, user: "prometheus", pass: "wrong"}} {
		req, _ := http.NewRequest(k.method, base+k.path, strings.NewReader("x"))
		if k.user != "" {
			req.SetBasicAuth(k.user, k.pass)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(string(b), "status{401 ") || resp.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("OTLP export, credentials %q: %d %q (WWW-Authenticate %q), want the route's 401", k.user, resp.StatusCode, b, resp.Header.Get("WWW-Authenticate"))
		}
	}
	// The one request of the rate limit's burst passes; the next is 429.
	if code, _ := do(t, http.DefaultClient, base, call{path: "/otlp/v1/metrics", method: http.MethodPost, user: "prometheus", pass: "s3cret"}); code != http.StatusOK {
		t.Fatalf("an export with credentials: %d", code)
	}
	code, body := do(t, http.DefaultClient, base, call{path: "/otlp/v1/metrics", method: http.MethodPost, user: "prometheus", pass: "s3cret"})
	if code != http.StatusTooManyRequests || !strings.HasPrefix(body, "status{429 ") {
		t.Errorf("an export past the rate limit: %d %q, want the route's 429", code, body)
	}
	if code, body := do(t, http.DefaultClient, base, call{path: "/api/v1/query"}); code != http.StatusUnauthorized || strings.HasPrefix(body, "status{") {
		t.Errorf("a query without credentials: %d %q, want a text 401", code, body)
	}
}
