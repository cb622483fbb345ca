// Package server is gpustore's HTTP server: one listener for every role's
// endpoints, plus /metrics, /-/healthy and /-/ready.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/grafana/dskit/services"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/model"
)

// Config is the HTTP server's configuration.
type Config struct {
	ListenAddress string `yaml:"listen_address"`
	// ShutdownTimeout bounds how long in-flight requests may finish on shutdown.
	ShutdownTimeout model.Duration `yaml:"shutdown_timeout"`
	ReadTimeout     model.Duration `yaml:"read_timeout"`
}

// DefaultConfig listens on :9201, gpustore's port.
func DefaultConfig() Config {
	return Config{ListenAddress: ":9201", ShutdownTimeout: model.Duration(30 * time.Second), ReadTimeout: model.Duration(5 * time.Minute)}
}

// Server owns the listener and the mux the roles register their routes on.
type Server struct {
	services.Service
	Mux *http.ServeMux

	cfg    Config
	logger *slog.Logger
	srv    *http.Server
	lis    net.Listener

	drainOnce sync.Once
	drainErr  error
}

// New listens at once, so a port conflict fails start-up before any data is
// opened, and so tests learn the port of ":0".
func New(cfg Config, logger *slog.Logger, gatherer prometheus.Gatherer, ready func() error) (*Server, error) {
	lis, err := net.Listen("tcp", cfg.ListenAddress)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", cfg.ListenAddress, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{EnableOpenMetrics: true}))
	mux.HandleFunc("/-/healthy", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("gpustore is Healthy.\n"))
	})
	mux.HandleFunc("/-/ready", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, "gpustore is not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("gpustore is Ready.\n"))
	})
	s := &Server{
		Mux: mux, cfg: cfg, logger: logger, lis: lis,
		srv: &http.Server{Handler: mux, ReadHeaderTimeout: 30 * time.Second, ReadTimeout: time.Duration(cfg.ReadTimeout)},
	}
	s.Service = services.NewBasicService(nil, s.run, s.stop)
	return s, nil
}

// Addr is the address actually listened on.
func (s *Server) Addr() net.Addr { return s.lis.Addr() }

func (s *Server) run(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() {
		s.logger.Info("listening", "address", s.lis.Addr().String())
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
