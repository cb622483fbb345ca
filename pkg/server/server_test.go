package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grafana/dskit/services"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
)

func newTestServer(t *testing.T, ready func() error, shutdownTimeout time.Duration) *Server {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "gpustore_test_total", Help: "A test counter."}))
	cfg := DefaultConfig()
	cfg.ListenAddress = "127.0.0.1:0"
	cfg.ShutdownTimeout = model.Duration(shutdownTimeout)
	s, err := New(cfg, Deps{Logger: slog.New(slog.DiscardHandler), Registry: reg, Ready: ready})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = services.StopAndAwaitTerminated(context.Background(), s) })
	return s
}

func get(t *testing.T, s *Server, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + s.Addr().String() + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The port is taken by New, before any service starts: a conflict fails
// start-up before data is opened.
func TestNewFailsOnAPortInUse(t *testing.T) {
	s := newTestServer(t, func() error { return nil }, time.Second)
	cfg := DefaultConfig()
	cfg.ListenAddress = s.Addr().String()
	if _, err := New(cfg, Deps{Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry()}); err == nil {
		t.Fatalf("second server on %s: no error", cfg.ListenAddress)
	}
}

// /-/healthy answers as soon as the server runs (during a long WAL replay);
// /-/ready is 503 with the reason until every role runs, then 200.
func TestHealthyAndReady(t *testing.T) {
	var notReady atomic.Pointer[error]
	starting := errors.New("services not running: 1 starting")
	notReady.Store(&starting)
	s := newTestServer(t, func() error {
		if err := notReady.Load(); err != nil {
			return *err
		}
		return nil
	}, time.Second)
	if err := services.StartAndAwaitRunning(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	if code, body := get(t, s, "/-/healthy"); code != http.StatusOK || !strings.Contains(body, "Healthy") {
		t.Fatalf("/-/healthy while starting: %d %q", code, body)
	}
	if code, body := get(t, s, "/-/ready"); code != http.StatusServiceUnavailable || !strings.Contains(body, "1 starting") {
		t.Fatalf("/-/ready while starting: %d %q", code, body)
	}
	notReady.Store(nil)
	if code, body := get(t, s, "/-/ready"); code != http.StatusOK || !strings.Contains(body, "Ready") {
		t.Fatalf("/-/ready once running: %d %q", code, body)
	}
	if code, body := get(t, s, "/metrics"); code != http.StatusOK || !strings.Contains(body, "gpustore_test_total 0") {
		t.Fatalf("/metrics: %d %q", code, body)
	}
}

// On shutdown the listener closes at once (new connections are refused), a
// request in flight runs to its end and gets its answer, and only then does
// Drain return (the storage role closes the TSDBs after it). The service
// keeps running until it is stopped: draining is not a failure.
func TestDrainFinishesInFlightAndRefusesNew(t *testing.T) {
	s := newTestServer(t, func() error { return nil }, 30*time.Second)
	entered, release := make(chan struct{}), make(chan struct{})
	s.Mux.HandleFunc("/slow", func(w http.ResponseWriter, _ *http.Request) {
		close(entered)
		<-release
		_, _ = io.WriteString(w, "written")
	})
	if err := services.StartAndAwaitRunning(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		code int
		body string
		err  error
	}
	inflight := make(chan answer, 1)
	go func() {
		resp, err := http.Get("http://" + s.Addr().String() + "/slow")
		if err != nil {
			inflight <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		inflight <- answer{resp.StatusCode, string(b), err}
	}()
	<-entered

	drained := make(chan error, 1)
	go func() { drained <- s.Drain() }()

	// New connections are refused while the request is still in flight.
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", s.Addr().String(), time.Second)
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("the listener still accepts connections 5s into the drain")
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case err := <-drained:
		t.Fatalf("Drain returned (%v) before the request in flight finished", err)
	case a := <-inflight:
		t.Fatalf("the request in flight ended before it was released: %+v", a)
	default:
	}

	close(release)
	if a := <-inflight; a.err != nil || a.code != http.StatusOK || a.body != "written" {
		t.Fatalf("request in flight during the drain: %+v", a)
	}
	if err := <-drained; err != nil {
		t.Fatalf("Drain: %v", err)
	}
	if st := s.State(); st != services.Running {
		t.Fatalf("state after the storage role drained the server: %s, want Running", st)
	}
	if err := services.StopAndAwaitTerminated(context.Background(), s); err != nil {
		t.Fatalf("stop after drain: %v", err)
	}
}

// A request that outlives shutdown_timeout does not hold shutdown forever:
// Drain gives up with an error, and a second Drain (the service's own stop
// after the storage role's) returns that result at once.
func TestDrainGivesUpAfterTheShutdownTimeout(t *testing.T) {
	s := newTestServer(t, func() error { return nil }, 200*time.Millisecond)
	entered, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	s.Mux.HandleFunc("/stuck", func(http.ResponseWriter, *http.Request) {
		close(entered)
		<-release
	})
	if err := services.StartAndAwaitRunning(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	go func() {
		if resp, err := http.Get("http://" + s.Addr().String() + "/stuck"); err == nil {
			resp.Body.Close()
		}
	}()
	<-entered
	start := time.Now()
	err := s.Drain()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Drain with a stuck request: %v, want the shutdown deadline", err)
	}
	if took := time.Since(start); took < 150*time.Millisecond || took > 10*time.Second {
		t.Fatalf("Drain took %s with a 200ms shutdown timeout", took)
	}
	start = time.Now()
	if err2 := s.Drain(); !errors.Is(err2, context.DeadlineExceeded) || time.Since(start) > 100*time.Millisecond {
		t.Fatalf("second Drain: %v after %s, want the first result at once", err2, time.Since(start))
	}
}
