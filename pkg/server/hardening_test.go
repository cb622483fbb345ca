package server

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grafana/dskit/services"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"

	"github.com/gpustore/gpustore/internal/abuse"
	"github.com/gpustore/gpustore/pkg/tenancy"
)

func shortTimeouts() Config {
	return Config{
		ListenAddress:     "127.0.0.1:0",
		ReadHeaderTimeout: model.Duration(500 * time.Millisecond),
		ReadTimeout:       model.Duration(time.Second),
		WriteTimeout:      model.Duration(5 * time.Second),
		IdleTimeout:       model.Duration(500 * time.Millisecond),
	}
}

// closedWithin reports whether the server closes conn within d (a read
// returns EOF or a reset rather than our deadline passing).
func closedWithin(conn net.Conn, d time.Duration) bool {
	_ = conn.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 4096)
	for {
		_, err := conn.Read(buf)
		if err == nil {
			continue // e.g. a 408 answer before the close
		}
		var ne net.Error
		if errorsAs(err, &ne) && ne.Timeout() {
			return false
		}
		return true
	}
}

func errorsAs(err error, target *net.Error) bool {
	ne, ok := err.(net.Error)
	if ok {
		*target = ne
	}
	return ok
}

// TestSlowlorisAndIdleConnections: clients that send headers a byte at a
// time, open connections and send nothing, trickle a body, or keep an idle
// keep-alive connection are all cut off by the timeouts, and an honest client
// is served quickly all the while.
func TestSlowlorisAndIdleConnections(t *testing.T) {
	s := startServer(t, shortTimeouts(), tenancy.DefaultConfig())
	s.Mux.HandleFunc("/slowbody", func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusRequestTimeout)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	addr := s.Addr().String()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}

	// 200 idle connections and 20 slowloris clients at once.
	var idle []net.Conn
	for range 200 {
		idle = append(idle, dial())
	}
	var wg sync.WaitGroup
	slowClosed := make(chan bool, 20)
	for range 20 {
		c := dial()
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = io.WriteString(c, "GET /api/v1/query HTTP/1.1\r\nHost: x\r\n")
			// One header byte every 100 ms: it would take minutes to finish.
			deadline := time.Now().Add(5 * time.Second)
			for time.Now().Before(deadline) {
				if _, err := io.WriteString(c, "X"); err != nil {
					slowClosed <- true
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
			slowClosed <- closedWithin(c, 10*time.Millisecond)
		}()
	}
	// An honest client is served while they hang on.
	start := time.Now()
	resp, err := http.Get("http://" + addr + "/api/v1/query")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || time.Since(start) > 2*time.Second {
		t.Errorf("honest request: %d after %s", resp.StatusCode, time.Since(start))
	}
	for i, c := range idle {
		if !closedWithin(c, 3*time.Second) {
			t.Fatalf("idle connection %d still open after read_header_timeout", i)
		}
	}
	wg.Wait()
	close(slowClosed)
	for closed := range slowClosed {
		if !closed {
			t.Fatal("a slowloris connection was not closed by read_header_timeout")
		}
	}

	// A body trickled past read_timeout fails instead of holding the handler.
	c := dial()
	_, _ = io.WriteString(c, "POST /slowbody HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 50 {
			if _, err := io.WriteString(c, "x"); err != nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	br := bufio.NewReader(c)
	_ = c.SetReadDeadline(time.Now().Add(4 * time.Second))
	line, err := br.ReadString('\n')
	if err == nil && strings.Contains(line, " 200 ") {
		t.Errorf("trickled body answered %q", line)
	}
	if err != nil {
		var ne net.Error
		if errorsAs(err, &ne) && ne.Timeout() {
			t.Error("trickled body still being read 3 s after read_timeout")
		}
	}
	<-done

	// A keep-alive connection is closed after idle_timeout.
	c = dial()
	_, _ = io.WriteString(c, "GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
	br = bufio.NewReader(c)
	r, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, r.Body)
	r.Body.Close()
	if !closedWithin(c, 3*time.Second) {
		t.Error("idle keep-alive connection not closed after idle_timeout")
	}
}

// TestWriteConcurrencyPerTenant: past max_concurrent_writes_per_tenant a
// tenant's writes are answered 503 with Retry-After (Prometheus retries 5xx),
// while other tenants and the tenant's later writes go through.
func TestWriteConcurrencyPerTenant(t *testing.T) {
	cfg := shortTimeouts()
	cfg.MaxConcurrentWritesPerTenant = 2
	s, err := New(cfg, Deps{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Registry: prometheus.NewRegistry(),
		Ready: func() error { return nil }, Tenants: tenancy.DefaultConfig(),
	})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	entered := make(chan struct{}, 10)
	s.Writes.HandleFunc("/api/v1/write", func(w http.ResponseWriter, r *http.Request) {
		// A write reads its body first (its slot is taken at its end) and
		// answers a read error as the ingester does.
		if _, err := io.ReadAll(r.Body); err != nil {
			var busy *WriteSlotsBusyError
			if errors.As(err, &busy) {
				w.Header().Set("Retry-After", "1")
			}
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		if r.Header.Get(tenancy.OrgIDHeader) == "a" && r.URL.Query().Get("block") != "" {
			entered <- struct{}{}
			<-release
		}
		w.WriteHeader(http.StatusNoContent)
	})
	if err := services.StartAndAwaitRunning(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = services.StopAndAwaitTerminated(context.Background(), s) })
	base := "http://" + s.Addr().String()
	post := func(tenant, query string) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, base+"/api/v1/write"+query, strings.NewReader("x"))
		req.Header.Set(tenancy.OrgIDHeader, tenant)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return nil
		}
		resp.Body.Close()
		return resp
	}
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); post("a", "?block=1") }()
	}
	<-entered
	<-entered
	resp := post("a", "")
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("third write of tenant a: %d, Retry-After %q; want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if resp := post("b", ""); resp.StatusCode != http.StatusNoContent {
		t.Errorf("tenant b while a is at its limit: %d", resp.StatusCode)
	}
	close(release)
	wg.Wait()
	if resp := post("a", ""); resp.StatusCode != http.StatusNoContent {
		t.Errorf("tenant a after its writes finished: %d", resp.StatusCode)
	}
	mfs, _ := s.deps.Registry.Gather()
	found := false
	for _, mf := range mfs {
		if mf.GetName() == "gpustore_server_write_requests_throttled_total" {
			found = mf.GetMetric()[0].GetCounter().GetValue() == 1
		}
	}
	if !found {
		t.Error("gpustore_server_write_requests_throttled_total{tenant=a} is not 1")
	}
}

// TestStalledBodiesFreeTheirWriteSlots: bodies that stop arriving (the
// abuse.SlowBodies workload: headers and one byte, then nothing), as many
// as the tenant has write slots, keep none of them (a slot is taken once a
// body is read) and are each cut once they have stalled for
// write_body_stall_timeout, long before the read timeout, with the error
// the handler answers 503 to.
func TestStalledBodiesFreeTheirWriteSlots(t *testing.T) {
	cfg := shortTimeouts()
	cfg.ReadTimeout = model.Duration(time.Minute)
	cfg.WriteTimeout = model.Duration(time.Minute)
	cfg.MaxConcurrentWritesPerTenant = 50
	cfg.WriteBodyStallTimeout = model.Duration(500 * time.Millisecond)
	var cut atomic.Int32
	s := startWriteServer(t, cfg, func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			cut.Add(1)
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	closeSlow, err := abuse.SlowBodies(s.Addr().String(), nil, cfg.MaxConcurrentWritesPerTenant, http.Header{tenancy.OrgIDHeader: {"gpu-prod"}})
	if err != nil {
		t.Fatal(err)
	}
	defer closeSlow()
	start := time.Now()
	req, _ := http.NewRequest(http.MethodPost, "http://"+s.Addr().String()+"/api/v1/write", strings.NewReader("x"))
	req.Header.Set(tenancy.OrgIDHeader, "gpu-prod")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Errorf("a write of the tenant while %d bodies stall: %d", cfg.MaxConcurrentWritesPerTenant, resp.StatusCode)
	}
	for n := cut.Load(); n != int32(cfg.MaxConcurrentWritesPerTenant); n = cut.Load() {
		if time.Since(start) > 5*time.Second {
			t.Fatalf("%d stalled bodies were cut %s after they were sent, want %d (stall timeout %s, read timeout %s)", n, time.Since(start), cfg.MaxConcurrentWritesPerTenant, cfg.WriteBodyStallTimeout, cfg.ReadTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("%d stalled bodies cut %s after they were sent", cfg.MaxConcurrentWritesPerTenant, time.Since(start).Round(time.Millisecond))
}

// TestSlowHandlerAfterItsBodyKeepsItsContext: the stall deadline applies
// while the body is read, not after: a write whose storing takes longer
// than write_body_stall_timeout once its body is in keeps its request
// context (net/http reads on in the background after the body and cancels
// the context when that read fails).
func TestSlowHandlerAfterItsBodyKeepsItsContext(t *testing.T) {
	cfg := shortTimeouts()
	cfg.ReadTimeout = model.Duration(time.Minute)
	cfg.WriteBodyStallTimeout = model.Duration(200 * time.Millisecond)
	s := startWriteServer(t, cfg, func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		select {
		case <-r.Context().Done():
			http.Error(w, "context cancelled while storing: "+context.Cause(r.Context()).Error(), http.StatusInternalServerError)
		case <-time.After(4 * time.Duration(cfg.WriteBodyStallTimeout)):
			w.WriteHeader(http.StatusNoContent)
		}
	})
	resp, err := http.Post("http://"+s.Addr().String()+"/api/v1/write", "application/x-protobuf", strings.NewReader("body"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
}

// startWriteServer runs a server of cfg whose write route is handler.
func startWriteServer(t *testing.T, cfg Config, handler http.HandlerFunc) *Server {
	t.Helper()
	s, err := New(cfg, Deps{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Registry: prometheus.NewRegistry(),
		Ready: func() error { return nil }, Tenants: tenancy.DefaultConfig(),
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Writes.HandleFunc("/api/v1/write", handler)
	if err := services.StartAndAwaitRunning(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = services.StopAndAwaitTerminated(context.Background(), s) })
	return s
}

// TestTrickledBodiesHoldNoWriteSlots: bodies that trickle in (the
// abuse.TrickledBodies workload: a byte every 300 ms, under the stall
// timeout) do not keep their tenant's writes out, and each is cut once it
// falls below write_body_min_rate, long before the read timeout. Before, a
// write slot was taken before the body was read: a byte every 5 s held one
// for the 5-minute read timeout, and 200 such bodies denied a tenant its
// writes. The slot is now taken once the body has been read.
func TestTrickledBodiesHoldNoWriteSlots(t *testing.T) {
	cfg := shortTimeouts()
	cfg.ReadTimeout = model.Duration(time.Minute)
	cfg.WriteTimeout = model.Duration(time.Minute)
	cfg.MaxConcurrentWritesPerTenant = 4
	cfg.WriteBodyStallTimeout = model.Duration(time.Second)
	cfg.WriteBodyMinRate = 1024
	var cut atomic.Int32
	s := startWriteServer(t, cfg, func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			cut.Add(1)
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	n := 2 * cfg.MaxConcurrentWritesPerTenant
	cutByServer, closeAll, err := abuse.TrickledBodies(s.Addr().String(), nil, "/api/v1/write", n, http.Header{tenancy.OrgIDHeader: {"gpu-prod"}}, 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll()
	start := time.Now()
	time.Sleep(300 * time.Millisecond) // every trickled body has begun
	for i := range 5 {
		req, _ := http.NewRequest(http.MethodPost, "http://"+s.Addr().String()+"/api/v1/write", strings.NewReader("x"))
		req.Header.Set(tenancy.OrgIDHeader, "gpu-prod")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			t.Errorf("write %d of the tenant while %d bodies trickle in: %d", i, n, resp.StatusCode)
		}
	}
	for int(cut.Load()) < n || cutByServer() < n {
		if time.Since(start) > 20*time.Second {
			t.Fatalf("%d of %d trickled bodies cut (%d connections answered) %s after they began (stall %s, min rate %d B/s, read timeout %s)",
				cut.Load(), n, cutByServer(), time.Since(start), cfg.WriteBodyStallTimeout, cfg.WriteBodyMinRate, cfg.ReadTimeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("%d trickled bodies cut %s after they began", n, time.Since(start).Round(100*time.Millisecond))
}
