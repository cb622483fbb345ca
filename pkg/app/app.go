// Package app wires gpustore's roles together as dskit services with a
// dependency graph (dskit/modules): start-up order, readiness and shutdown
// follow from the graph rather than from hand-written sequencing.
//
//	server ◀── storage ◀── ingest
//	                   ◀── query
//	all = ingest + query
//
// server listens first so /-/healthy answers during a long WAL replay;
// storage opens the tenants' TSDBs (replaying their WALs) and on shutdown
// drains the HTTP server before closing them, so no acknowledged write races
// the close. Later roles (rules, shipper, compact) join the graph here.
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/grafana/dskit/modules"
	"github.com/grafana/dskit/services"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	v1 "github.com/prometheus/prometheus/web/api/v1"

	"github.com/gpustore/gpustore/internal/logging"
	"github.com/gpustore/gpustore/internal/version"
	"github.com/gpustore/gpustore/pkg/ingest"
	"github.com/gpustore/gpustore/pkg/query"
	"github.com/gpustore/gpustore/pkg/server"
	"github.com/gpustore/gpustore/pkg/tenantdb"
)

// Module names; the user-visible ones are targets of -target.
const (
	Server  = "server"
	Storage = "storage"
	Ingest  = "ingest"
	Query   = "query"
	All     = "all"
)

// Targets lists what -target accepts.
func Targets() []string { return []string{All, Ingest, Query} }

func isTarget(t string) bool { return slices.Contains(Targets(), t) }

// App is one gpustore process.
type App struct {
	Cfg      Config
	Logger   *slog.Logger
	Registry *prometheus.Registry
	// Flags is shown by /api/v1/status/flags.
	Flags map[string]string

	Server   *server.Server
	DBs      *tenantdb.Manager
	Ingester *ingest.Ingester
	API      *query.API

	mm      *modules.Manager
	manager *services.Manager
}

// New prepares the module graph; nothing starts before Run.
func New(cfg Config, logger *slog.Logger) (*App, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	a := &App{Cfg: cfg, Logger: logger, Registry: reg, Flags: map[string]string{}}

	mm := modules.NewManager(logging.GoKit(logger))
	mm.RegisterModule(Server, a.initServer, modules.UserInvisibleModule)
	mm.RegisterModule(Storage, a.initStorage, modules.UserInvisibleModule)
	mm.RegisterModule(Ingest, a.initIngest)
	mm.RegisterModule(Query, a.initQuery)
	mm.RegisterModule(All, nil)
	deps := map[string][]string{
		Storage: {Server},
		Ingest:  {Storage},
		Query:   {Storage},
		All:     {Ingest, Query},
	}
	for mod, d := range deps {
		if err := mm.AddDependency(mod, d...); err != nil {
			return nil, err
		}
	}
	a.mm = mm
	return a, nil
}

// ready is the readiness every role reports: all services running.
func (a *App) ready() error {
	if a.manager == nil {
		return errors.New("starting")
	}
	if !a.manager.IsHealthy() {
		var starting []string
		for state, svcs := range a.manager.ServicesByState() {
			if state != services.Running {
				starting = append(starting, fmt.Sprintf("%d %s", len(svcs), strings.ToLower(state.String())))
			}
		}
		sort.Strings(starting)
		return fmt.Errorf("services not running: %s", strings.Join(starting, ", "))
	}
	return nil
}

func (a *App) initServer() (services.Service, error) {
	s, err := server.New(a.Cfg.Server, a.Logger.With("component", "server"), a.Registry, a.ready)
	if err != nil {
		return nil, err
	}
	a.Server = s
	return s, nil
}

func (a *App) initStorage() (services.Service, error) {
	dbs, err := tenantdb.NewManager(a.Cfg.TSDB, a.Logger.With("component", "tsdb"), a.Registry)
	if err != nil {
		return nil, err
	}
	a.DBs = dbs
	a.Registry.MustRegister(tenantdb.NewCollector(dbs))
	start := func(ctx context.Context) error { return dbs.OpenExisting(ctx) }
	run := func(ctx context.Context) error {
		t := time.NewTicker(time.Minute)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
				if err := dbs.FlushMetadata(); err != nil {
					a.Logger.Warn("flush metadata", "err", err)
				}
			}
		}
	}
	stop := func(error) error {
		if a.Server != nil {
			if err := a.Server.Drain(); err != nil {
				a.Logger.Warn("drain http server", "err", err)
			}
		}
		return dbs.Close()
	}
	return services.NewBasicService(start, run, stop), nil
}

func (a *App) initIngest() (services.Service, error) {
	ing, err := ingest.New(a.Cfg.Ingest, a.Cfg.Tenant, a.DBs, a.Logger.With("component", "ingest"), a.Registry, a.ready)
	if err != nil {
		return nil, err
	}
	a.Ingester = ing
	ing.RegisterRoutes(a.Server.Mux)
	// Series that stopped arriving leave the cache after two sweep periods.
	sweep := time.Duration(a.Cfg.TSDB.BlockDuration)
	return services.NewTimerService(sweep, nil, func(context.Context) error {
		ing.SweepCaches()
		return nil
	}, nil), nil
}

func (a *App) initQuery() (services.Service, error) {
	api, err := query.New(query.Options{
		Config:         a.Cfg.Query,
		Tenants:        a.Cfg.Tenant,
		DBs:            a.DBs,
		Logger:         a.Logger.With("component", "query"),
		Registry:       a.Registry,
		Ready:          a.ready,
		ActiveQueryDir: filepath.Join(a.Cfg.TSDB.Dir, "query"),
		Flags:          a.Flags,
		BuildInfo: v1.PrometheusVersion{
			Version: version.Version, Revision: version.Revision, Branch: version.Branch,
			BuildUser: version.BuildUser, BuildDate: version.BuildDate, GoVersion: version.GoVersion,
		},
	})
	if err != nil {
		return nil, err
	}
	a.API = api
	api.RegisterRoutes(a.Server.Mux)
	return services.NewIdleService(nil, nil), nil
}

// Start initialises the target's modules and starts them; it returns once
// every service is running (or one failed).
func (a *App) Start(ctx context.Context) error {
	svcs, err := a.mm.InitModuleServices(strings.Split(a.Cfg.Target, ",")...)
	if err != nil {
		return err
	}
	list := make([]services.Service, 0, len(svcs))
	for _, s := range svcs {
		list = append(list, s)
	}
	m, err := services.NewManager(list...)
	if err != nil {
		return err
	}
	m.AddListener(services.NewManagerListener(nil, nil, func(s services.Service) {
		a.Logger.Error("service failed", "err", s.FailureCase())
	}))
	a.manager = m
	// Services live until Stop, not until ctx ends: ctx only bounds start-up.
	if err := m.StartAsync(context.Background()); err != nil {
		return err
	}
	if err := m.AwaitHealthy(ctx); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	return nil
}

// Wait blocks until ctx ends or a service fails, then stops everything.
func (a *App) Wait(ctx context.Context) error {
	failed := make(chan struct{})
	a.manager.AddListener(services.NewManagerListener(nil, func() { close(failed) }, nil))
	select {
	case <-ctx.Done():
	case <-failed:
	}
	return a.Stop()
}

// Stop stops every service in dependency order and waits for them.
func (a *App) Stop() error {
	if a.manager == nil {
		return nil
	}
	a.manager.StopAsync()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := a.manager.AwaitStopped(ctx); err != nil {
		return fmt.Errorf("stop: %w", err)
	}
	var errs []error
	for _, s := range a.manager.ServicesByState()[services.Failed] {
		errs = append(errs, s.FailureCase())
	}
	return errors.Join(errs...)
}
