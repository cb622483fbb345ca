// Package app wires gpustore's roles together as dskit services with a
// dependency graph (dskit/modules): start-up order, readiness and shutdown
// follow from the graph rather than from hand-written sequencing.
//
//	server, overrides ◀── storage ◀── shipper ◀── ingest ──▶ ha-tracker ──▶ memberlist-kv
//	bucket ◀── shipper, bucket-store;  bucket-store, storage ◀── query ◀── rules
//	all = ingest + query + rules + compact    (objstore.go adds the bucket modules, compact.go the compactor)
//	with the ring (ring.go): ingest, query, distributor ──▶ ring-client;  rules ──▶ rulers-ring;  all += distributor
//
// server listens first so /-/healthy answers during a long WAL replay;
// storage opens the tenants' TSDBs (replaying their WALs) and on shutdown
// drains the HTTP server before closing them, so no acknowledged write races
// the close. Downsampling is the compactor's (compact.go), not a role.
//
// The query and rules roles read through one query.TenantQueryable each,
// over the tenants' TSDBs, the sources (querySources: the bucket store) and
// the ring's receivers; each request's read options are parsed where the
// request is (the query API, rule evaluation: rules.go), never here.
package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/grafana/dskit/dns"
	"github.com/grafana/dskit/kv"
	"github.com/grafana/dskit/kv/memberlist"
	"github.com/grafana/dskit/modules"
	"github.com/grafana/dskit/ring"
	"github.com/grafana/dskit/services"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/prometheus/util/notifications"
	v1 "github.com/prometheus/prometheus/web/api/v1"
	"github.com/thanos-io/objstore"

	"github.com/gpustore/gpustore/internal/logging"
	"github.com/gpustore/gpustore/internal/resources"
	"github.com/gpustore/gpustore/internal/version"
	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/blockquery"
	"github.com/gpustore/gpustore/pkg/compact"
	"github.com/gpustore/gpustore/pkg/hatracker"
	"github.com/gpustore/gpustore/pkg/ingest"
	"github.com/gpustore/gpustore/pkg/limits"
	"github.com/gpustore/gpustore/pkg/query"
	"github.com/gpustore/gpustore/pkg/queryfrontend"
	"github.com/gpustore/gpustore/pkg/rules"
	"github.com/gpustore/gpustore/pkg/server"
	"github.com/gpustore/gpustore/pkg/storage/bucketstore"
	"github.com/gpustore/gpustore/pkg/storage/shipper"
	"github.com/gpustore/gpustore/pkg/tenantdb"
)

// Module names; the user-visible ones are targets of -target.
const (
	Server       = "server"
	Overrides    = "overrides"
	MemberlistKV = "memberlist-kv"
	HATracker    = "ha-tracker"
	Storage      = "storage"
	Ingest       = "ingest"
	Query        = "query"
	Rules        = "rules"
	All          = "all"
)

// Targets lists what -target accepts.
func Targets() []string { return []string{All, Distributor, Ingest, Query, Rules, Compact} }

func isTarget(t string) bool { return slices.Contains(Targets(), t) }

// checkRoles refuses the targets that would hide or lose data: without the
// ring a query role reads only its own process's heads, and a rules role
// writes its results into its own process's TSDBs, which only the ingest
// role ships (with the ring, both read every receiver and rules write
// through the ring); a distributor needs the ring to find receivers.
func checkRoles(targets []string, ringEnabled bool) error {
	has := func(role string) bool { return slices.Contains(targets, role) || slices.Contains(targets, All) }
	if slices.Contains(targets, Distributor) && !ringEnabled {
		return errors.New("target distributor needs the ring (-ring.enabled): it writes to the receivers the ring lists")
	}
	switch {
	case has(Ingest):
		return nil
	case has(Rules) && !ringEnabled:
		return errors.New("target rules needs ingest in the same process (-target=all or -target=ingest,rules) or the ring (-ring.enabled): " +
			"rule results would go to this process's TSDB, which nothing would ship to the bucket")
	case has(Query) && !ringEnabled:
		return errors.New("target query needs ingest in the same process (-target=all or -target=ingest,query): " +
			"a query process without the ring (-ring.enabled) cannot read another process's head, so the samples not yet in the bucket would be missing")
	}
	return nil
}

// App is one gpustore process.
type App struct {
	Cfg      Config
	Logger   *slog.Logger
	Registry *prometheus.Registry
	// Flags is shown by /api/v1/status/flags.
	Flags map[string]string

	Server       *server.Server
	Limits       *limits.Overrides
	MemberlistKV *memberlist.KVInitService
	HA           *hatracker.Tracker // nil when HA dedup is off
	DBs          *tenantdb.Manager
	Ingester     *ingest.Ingester
	// Scale-out (ring.go): nil without ring.enabled. Distributor is the
	// write handler in front of the ring.
	Ring        *ring.Ring
	Lifecycler  *ring.BasicLifecycler
	Distributor *ingest.Ingester
	Receivers   query.Source // what the query role reads of the ring's receivers; nil without the ring
	API         *query.API
	Ruler       *rules.Ruler
	Rulers      *ring.Ring // the rulers' ring, sharing the rule groups out
	rulerID     string     // this process's ID in Rulers

	// Object storage (objstore.go): nil when the role does not run.
	Bucket      objstore.InstrumentedBucket
	Shipper     *shipper.Shipper
	BucketStore *bucketstore.Store
	Compactor   *compact.Compactor

	notifications *notifications.Notifications // shown by /api/v1/notifications

	mm      *modules.Manager
	manager *services.Manager
	storage services.Service // the storage module's service
	volumes *resources.Volumes

	seriesCacheOnce sync.Once
	blockCache      *blockquery.Cache
}

// seriesCache is the one cache of selectors resolved on immutable blocks
// that the local TSDBs and the bucket store share (one bound for both).
func (a *App) seriesCache() *blockquery.Cache {
	a.seriesCacheOnce.Do(func() { a.blockCache = blockquery.NewCache(a.Cfg.Query.SeriesCacheSize, a.Registry) })
	return a.blockCache
}

// New prepares the module graph; nothing starts before Run.
func New(cfg Config, logger *slog.Logger) (*App, error) {
	reg := prometheus.NewRegistry()
	vols := resources.NewVolumes()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		resources.MemoryLimit(), vols)
	a := &App{Cfg: cfg, Logger: logger, Registry: reg, Flags: map[string]string{}, volumes: vols}

	mm := modules.NewManager(logging.GoKit(logger))
	mm.RegisterModule(Server, a.initServer, modules.UserInvisibleModule)
	mm.RegisterModule(Overrides, a.initOverrides, modules.UserInvisibleModule)
	mm.RegisterModule(MemberlistKV, a.initMemberlistKV, modules.UserInvisibleModule)
	mm.RegisterModule(HATracker, a.initHATracker, modules.UserInvisibleModule)
	mm.RegisterModule(Storage, a.initStorage, modules.UserInvisibleModule)
	mm.RegisterModule(Ingest, a.initIngest)
	mm.RegisterModule(Query, a.initQuery)
	mm.RegisterModule(Rules, a.initRules)
	mm.RegisterModule(All, nil)
	deps := map[string][]string{
		Storage:   {Server, Overrides},
		HATracker: {MemberlistKV},
		Ingest:    {Storage, HATracker},
		Query:     {Storage},
		Rules:     {Storage, Query},
		All:       {Ingest, Query, Rules},
	}
	for mod, d := range deps {
		if err := mm.AddDependency(mod, d...); err != nil {
			return nil, err
		}
	}
	a.mm = mm
	if err := a.registerObjstoreModules(); err != nil {
		return nil, err
	}
	if err := a.registerCompactModule(); err != nil {
		return nil, err
	}
	if err := a.registerRingModules(); err != nil {
		return nil, err
	}
	return a, nil
}

// RecordFlags keeps every flag's value, given on the command line, set by
// the YAML file or left at its default, for /api/v1/status/flags (which
// shows them, as Prometheus does, with their secrets redacted); call it
// before Start.
func (a *App) RecordFlags(fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) { a.Flags[f.Name] = f.Value.String() })
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
	// What /api/v1/notifications shows: a failed reload, as in Prometheus
	// (and its --web.max-notifications-subscribers default, 16).
	a.notifications = notifications.NewNotifications(16, a.Registry)
	s, err := server.New(a.Cfg.Server, server.Deps{
		Logger: a.Logger.With("component", "server"), Registry: a.Registry, Ready: a.ready, Tenants: a.Cfg.Tenant,
		Peers: a.Cfg.Ring.PeerIdentities, Notifications: a.notifications,
	})
	if err != nil {
		return nil, err
	}
	a.Server = s
	return s, nil
}

func (a *App) initOverrides() (services.Service, error) {
	o, err := limits.New(a.Cfg.Limits, a.Logger.With("component", "limits"), a.Registry)
	if err != nil {
		return nil, err
	}
	a.Limits = o
	return o, nil
}

// initMemberlistKV prepares the gossip KV; it only runs (joins the cluster)
// when a KV client needs it: ha_tracker.kvstore or ring.kvstore memberlist.
func (a *App) initMemberlistKV() (services.Service, error) {
	haGossip := a.Cfg.HA.Enabled && a.Cfg.HA.KVStore == "memberlist"
	ringGossip := a.Cfg.Ring.Enabled && a.Cfg.Ring.KVStore == "memberlist"
	if !haGossip && !ringGossip {
		return nil, nil
	}
	cfg := a.Cfg.Memberlist
	cfg.Codecs = append(cfg.Codecs, hatracker.Codec(), ring.GetCodec())
	logger := logging.GoKit(a.Logger.With("component", "memberlist"))
	dnsProvider := dns.NewProvider(dns.GolangResolverType, 0, logger, a.Registry)
	a.MemberlistKV = memberlist.NewKVInitService(&cfg, logger, dnsProvider, a.Registry)
	return a.MemberlistKV, nil
}

func (a *App) initHATracker() (services.Service, error) {
	if !a.Cfg.HA.Enabled {
		return nil, nil
	}
	var store kv.StoreConfig
	if a.MemberlistKV != nil {
		store.MemberlistKV = a.MemberlistKV.GetMemberlistKV
	}
	t, err := hatracker.New(a.Cfg.HA, store, a.Logger.With("component", "ha-tracker"), a.Registry)
	if err != nil {
		return nil, err
	}
	a.HA = t
	return t, nil
}

// storageReady: the tenants' databases are open (the storage service runs
// or is stopping; after the close writes get tenantdb.ErrClosed).
func (a *App) storageReady() error {
	if a.storage == nil {
		return errors.New("storage not started")
	}
	switch s := a.storage.State(); s {
	case services.Running, services.Stopping:
		return nil
	default:
		return fmt.Errorf("storage %s", strings.ToLower(s.String()))
	}
}

// tsdbConfig is the TSDB's configuration with "auto" resolved: a crashed
// head is recovered aside only where other replicas answer for its samples
// meanwhile, a ring at RF ≥ 2.
func (a *App) tsdbConfig() tenantdb.Config {
	c := a.Cfg.TSDB
	if c.RecoverWALAside == "auto" || c.RecoverWALAside == "" {
		c.RecoverWALAside = "off"
		if a.Cfg.Ring.Enabled && a.Cfg.Ring.ReplicationFactor >= 2 {
			c.RecoverWALAside = "on"
		}
	}
	return c
}

func (a *App) initStorage() (services.Service, error) {
	dbs, err := tenantdb.NewManager(a.tsdbConfig(), a.Logger.With("component", "tsdb"), a.Registry)
	if err != nil {
		return nil, err
	}
	dbs.SetLimits(a.storageLimits())
	dbs.SetBlockCache(a.seriesCache())
	dbs.SetMaxTenants(a.Limits.MaxTenants())
	a.DBs = dbs
	a.Registry.MustRegister(tenantdb.NewCollector(dbs))
	a.volumes.Add(resources.Volume{Name: "data", Dir: dbs.Config().Dir})
	start := func(ctx context.Context) error { return dbs.OpenExisting(ctx) }
	run := func(ctx context.Context) error {
		t := time.NewTicker(time.Minute)
		defer t.Stop()
		reloaded := a.Limits.Listen(ctx)
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-reloaded:
				// A tenant's out-of-order window may have changed.
				if err := dbs.ApplyLimits(); err != nil {
					a.Logger.Warn("apply reloaded limits", "err", err)
				}
				if a.Ingester != nil {
					a.Ingester.ApplyLimits()
				}
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
	a.storage = services.NewBasicService(start, run, stop)
	return a.storage, nil
}

func (a *App) initIngest() (services.Service, error) {
	deps := ingest.Deps{
		Tenants: a.Cfg.Tenant, DBs: a.DBs, Limits: a.Limits, HA: a.HA,
		Logger: a.Logger.With("component", "ingest"), Registry: a.Registry, Ready: a.ready,
		LookbackDelta: time.Duration(a.Cfg.Query.LookbackDelta),
	}
	if a.Cfg.Ring.Enabled {
		deps.Downstream, deps.Registry = true, wrapStage(a.Registry, "receiver")
		// A receiver takes writes from its WAL replay to its storage's
		// close (ErrClosed: 503), also while it leaves the ring: until the
		// distributors see it LEAVING they still write to it, and refusing
		// would cost quorums when two receivers stop at once.
		deps.Ready = a.storageReady
	}
	ing, err := ingest.New(a.Cfg.Ingest, deps)
	if err != nil {
		return nil, err
	}
	a.Ingester = ing
	if a.Cfg.Ring.Enabled {
		a.receiverRoutes(ing)
		return a.receiverService(ing.SweepCaches)
	}
	ing.RegisterRoutes(a.Server.Writes)
	if a.HA != nil {
		a.Server.Mux.Handle("/ha-tracker", a.HA.Handler())
		a.Server.AdminOnly("/ha-tracker") // lists every tenant's elections
	}
	// Series that stopped arriving leave the cache after two sweep periods.
	sweep := time.Duration(a.Cfg.TSDB.BlockDuration)
	return services.NewTimerService(sweep, nil, func(context.Context) error {
		ing.SweepCaches()
		return nil
	}, nil), nil
}

func (a *App) initQuery() (services.Service, error) {
	var bucketBlocks func(string) []block.Meta
	if a.BucketStore != nil {
		bucketBlocks = a.BucketStore.Blocks
	}
	frontendDeps := queryfrontend.Deps{
		Logger: a.Logger.With("component", "query-frontend"), Registry: a.Registry,
		MaxConcurrency: a.Cfg.Query.MaxConcurrency, Timeout: time.Duration(a.Cfg.Query.Timeout),
		LookbackDelta: time.Duration(a.Cfg.Query.LookbackDelta),
		ReplicaLabels: a.Cfg.Query.ReplicaLabels, MaxSourceResolution: a.Cfg.Query.MaxSourceResolution,
		Blocks: queryfrontend.TenantBlocks(a.DBs, bucketBlocks),
	}
	admin := &tsdbAdmin{a: a}
	frontendDeps.Generation = admin.Generation
	if a.Limits != nil {
		frontendDeps.OutOfOrderWindow = a.Limits.OutOfOrderWindow
	}
	frontend, err := queryfrontend.New(a.Cfg.QueryFrontend, frontendDeps)
	if err != nil {
		return nil, err
	}
	if a.Receivers, err = a.receiversSource(); err != nil {
		return nil, err
	}
	api, err := query.New(query.Options{
		Frontend:       frontend.Wrap,
		Config:         a.Cfg.Query,
		Tenants:        a.Cfg.Tenant,
		DBs:            a.DBs,
		Logger:         a.Logger.With("component", "query"),
		Registry:       a.Registry,
		Ready:          a.ready,
		ActiveQueryDir: filepath.Join(a.Cfg.TSDB.Dir, "query"),
		Flags:          a.Flags,
		TakesWrites:    a.takesWrites(),
		Sources:        a.querySources(),
		Receivers:      a.Receivers, ReceiversLookback: a.receiversLookback(),
		Metadata:      a.receiversMetadata(),
		Rules:         a.rulesRetriever,
		Notifications: a.notifications,
		Limits:        a.queryLimits(),
		Admin:         adminAPI(a.Cfg.Query.EnableAdminAPI, admin),
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
	// Process-wide: every tenant's metrics; the flags, the configuration
	// and the runtime (secrets are redacted, but they are the operator's).
	a.Server.AdminOnly("/api/v1/status/self_metrics", "/api/v1/status/flags", "/api/v1/status/config", "/api/v1/status/runtimeinfo")
	return services.NewIdleService(nil, nil), nil
}

// queryLimits are the tenants' query limits; nil without overrides (a nil
// *limits.Overrides must not become a non-nil interface).
func (a *App) queryLimits() query.TenantLimits {
	if a.Limits == nil {
		return nil
	}
	return a.Limits
}

// adminAPI is admin when the admin API is enabled, else none.
func adminAPI(enabled bool, admin query.Admin) query.Admin {
	if !enabled {
		return nil
	}
	return admin
}

// takesWrites tells whether this process serves remote write and OTLP: the
// ingest role without the ring, the distributor with it.
func (a *App) takesWrites() bool {
	if a.Cfg.Ring.Enabled {
		return a.runs(Distributor)
	}
	return a.runs(Ingest)
}

// runs tells whether this process runs role (itself or through all).
func (a *App) runs(role string) bool {
	targets := strings.Split(a.Cfg.Target, ",")
	return slices.Contains(targets, role) || slices.Contains(targets, All)
}

// wrapStage labels the ingest metrics of one side of the ring (the
// distributor's and the receiver's handlers are both pkg/ingest's).
func wrapStage(reg prometheus.Registerer, stage string) prometheus.Registerer {
	return prometheus.WrapRegistererWith(prometheus.Labels{"stage": stage}, reg)
}

// memberlistKV is the process' gossip KV for the KV clients that use it.
func (a *App) memberlistKV() func() (*memberlist.KV, error) {
	if a.MemberlistKV == nil {
		return nil
	}
	return a.MemberlistKV.GetMemberlistKV
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
