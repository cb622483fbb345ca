package app

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/grafana/dskit/modules"
	"github.com/grafana/dskit/ring"
	shardutil "github.com/grafana/dskit/ring/shard"
	"github.com/grafana/dskit/services"
	"github.com/prometheus/prometheus/storage"

	"github.com/gpustore/gpustore/pkg/distributor"
	"github.com/gpustore/gpustore/pkg/ingest"
	"github.com/gpustore/gpustore/pkg/query"
	"github.com/gpustore/gpustore/pkg/receiverring"
	"github.com/gpustore/gpustore/pkg/ringread"
	"github.com/gpustore/gpustore/pkg/tenantdb"
)

// Scale-out modules (ring.enabled):
//
//	memberlist-kv ◀── ring ◀── distributor (also: server, overrides, ha-tracker)
//	                       ◀── ingest: a receiver, registered in the ring by its lifecycler
//	                       ◀── query: reads every receiver
//	              ◀── rulers-ring ◀── rules: the rulers share the rule groups out
//
// Without ring.enabled the ring module runs nothing and the distributor
// refuses to start (checkRoles).
const (
	Distributor = "distributor"
	RingClient  = "ring"
	RulersRing  = "rulers-ring"
)

func (a *App) registerRingModules() error {
	a.mm.RegisterModule(RingClient, a.initRing, modules.UserInvisibleModule)
	a.mm.RegisterModule(Distributor, a.initDistributor)
	a.mm.RegisterModule(RulersRing, a.initRulersRing, modules.UserInvisibleModule)
	deps := [][2]string{
		{RingClient, MemberlistKV}, {RingClient, Server},
		{Distributor, Server}, {Distributor, Overrides}, {Distributor, HATracker}, {Distributor, RingClient},
		{RulersRing, MemberlistKV}, {RulersRing, Server},
	}
	if a.Cfg.Ring.Enabled {
		deps = append(deps, [2]string{Ingest, RingClient}, [2]string{Query, RingClient}, [2]string{All, Distributor},
			[2]string{Rules, RulersRing})
	}
	for _, d := range deps {
		if err := a.mm.AddDependency(d[0], d[1]); err != nil {
			return err
		}
	}
	return nil
}

func (a *App) initRing() (services.Service, error) {
	if !a.Cfg.Ring.Enabled {
		return nil, nil
	}
	r, err := a.Cfg.Ring.NewClient(receiverring.Receivers, a.memberlistKV(), a.Logger.With("component", "ring"), a.Registry)
	if err != nil {
		return nil, err
	}
	a.Ring = r
	a.Server.Mux.Handle("/ring", r) // dskit's status page: instances, tokens, heartbeats
	a.Server.AdminOnly("/ring")     // it can forget instances
	return r, nil
}

// receiverService runs a receiver in the ring: its lifecycler joins the
// ring once the receiver takes writes (the storage module, which ingest
// depends on, has replayed the WAL) and, on shutdown, leaves it before the
// storage closes, so distributors stop writing to it first. With
// ring.flush_on_shutdown the receiver first turns LEAVING (no new writes),
// then flushes its heads into blocks and ships them: a receiver removed
// for good (scale-in) leaves its samples in the bucket, not in a WAL.
func (a *App) receiverService(sweep func()) (services.Service, error) {
	l, err := a.Cfg.Ring.NewLifecycler(receiverring.Receivers, a.Server.Addr().String(), a.memberlistKV(), a.Logger.With("component", "lifecycler"), a.Registry)
	if err != nil {
		return nil, err
	}
	a.Lifecycler = l
	period := time.Duration(a.Cfg.TSDB.BlockDuration)
	failed := services.NewFailureWatcher()
	failed.WatchService(l)
	return services.NewBasicService(
		// Not the starting context: the lifecycler would stop with it, the
		// moment this service starts stopping, before it could turn LEAVING.
		func(ctx context.Context) error {
			if err := l.StartAsync(context.Background()); err != nil {
				return err
			}
			return l.AwaitRunning(ctx)
		},
		func(ctx context.Context) error {
			t := time.NewTicker(period)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return nil
				case err := <-failed.Chan():
					return fmt.Errorf("ring lifecycler: %w", err)
				case <-t.C:
					sweep()
				}
			}
		},
		func(error) error {
			if a.Cfg.Ring.FlushOnShutdown {
				a.flushAndShip(l)
			}
			return services.StopAndAwaitTerminated(context.Background(), l)
		},
	), nil
}

// flushAndShip is a leaving receiver's last work: LEAVING in the ring, a
// heartbeat period for distributors to see it, then heads to blocks and
// blocks to the bucket. Failures are logged: what is not shipped stays on
// disk (blocks) and is shipped at the next start.
func (a *App) flushAndShip(l *ring.BasicLifecycler) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	log := a.Logger.With("component", "lifecycler")
	if err := l.ChangeState(ctx, ring.LEAVING); err != nil {
		log.Warn("turn LEAVING in the ring", "err", err)
	}
	time.Sleep(time.Duration(a.Cfg.Ring.HeartbeatPeriod))
	start := time.Now()
	log.Info("leaving the ring: flushing heads into blocks and shipping them")
	if err := a.DBs.FlushHeads(ctx); err != nil {
		log.Error("flush heads before leaving; the WAL keeps what was not flushed", "err", err)
	}
	if a.Shipper == nil {
		log.Warn("shipper disabled: flushed blocks stay on local disk")
		return
	}
	if err := a.Shipper.Flush(ctx); err != nil {
		log.Error("ship blocks before leaving; they stay on local disk and are shipped at the next start", "err", err)
		return
	}
	log.Info("heads flushed and shipped", "took", time.Since(start).Round(time.Millisecond))
}

func (a *App) initDistributor() (services.Service, error) {
	if !a.Cfg.Ring.Enabled {
		return nil, nil // only checkRoles' error reaches a user who asks for it
	}
	reg := wrapStage(a.Registry, "distributor")
	logger := a.Logger.With("component", "distributor")
	d, err := distributor.New(a.Cfg.Ring, a.Ring, a.Limits.IngestionShardSize, logger, reg)
	if err != nil {
		return nil, err
	}
	// The distributors count themselves in a ring of their own: each allows
	// its share of a tenant's ingestion rate (dskit's global strategy).
	peers, err := a.Cfg.Ring.NewClient(receiverring.Distributors, a.memberlistKV(), logger, a.Registry)
	if err != nil {
		return nil, err
	}
	self, err := a.Cfg.Ring.NewLifecycler(receiverring.Distributors, a.Server.Addr().String(), a.memberlistKV(), logger, a.Registry)
	if err != nil {
		return nil, err
	}
	share := func() int {
		rs, err := peers.GetAllHealthy(ring.Reporting)
		if err != nil {
			return 1
		}
		return max(1, len(rs.Instances))
	}
	ing, err := ingest.New(a.Cfg.Ingest, ingest.Deps{
		Tenants: a.Cfg.Tenant, Store: d, Limits: a.Limits, HA: a.HA, RateShare: share,
		Logger: logger, Registry: reg, Ready: a.ready, LookbackDelta: time.Duration(a.Cfg.Query.LookbackDelta),
	})
	if err != nil {
		return nil, err
	}
	a.Distributor = ing
	ing.RegisterRoutes(a.Server.Writes)
	if a.HA != nil {
		a.Server.Mux.Handle("/ha-tracker", a.HA.Handler())
		a.Server.AdminOnly("/ha-tracker")
	}
	sweep := time.NewTicker(time.Duration(a.Cfg.TSDB.BlockDuration))
	return services.NewBasicService(
		func(ctx context.Context) error { return joinRing(ctx, peers, self) },
		func(ctx context.Context) error {
			for {
				select {
				case <-ctx.Done():
					return nil
				case <-sweep.C:
					ing.SweepCaches()
					d.Sweep()
				}
			}
		},
		func(error) error {
			sweep.Stop()
			return leaveRing(peers, self)
		},
	), nil
}

// joinRing starts a ring's client, then this process's lifecycler in it.
// The lifecycler runs under a context of its own, as in receiverService:
// its stopping (LEAVING, unregistering) must not be cut short by ctx.
func joinRing(ctx context.Context, peers *ring.Ring, self *ring.BasicLifecycler) error {
	if err := services.StartAndAwaitRunning(ctx, peers); err != nil {
		return err
	}
	if err := self.StartAsync(context.Background()); err != nil {
		return err
	}
	return self.AwaitRunning(ctx)
}

// leaveRing stops what joinRing started, the lifecycler first.
func leaveRing(peers *ring.Ring, self *ring.BasicLifecycler) error {
	return errors.Join(
		services.StopAndAwaitTerminated(context.Background(), self),
		services.StopAndAwaitTerminated(context.Background(), peers))
}

// storageLimits are the limits the tenants' TSDBs apply; a receiver in the
// ring widens the out-of-order window and takes its share of each tenant's
// max_active_series (receiverring.ReplicaLimits): the tenant's series are
// spread over its shuffle shard, or the whole ring.
func (a *App) storageLimits() tenantdb.TenantLimits {
	if !a.Cfg.Ring.Enabled {
		return a.Limits
	}
	// The ring client starts after the storage: a.Ring is read per call.
	return a.Cfg.Ring.ReplicaLimits(a.Limits, func(tenant string) int {
		if a.Ring == nil {
			return 0
		}
		if a.Cfg.Ring.ZoneAwarenessEnabled {
			// One copy in each zone, over the zone's receivers, or over
			// its part of the tenant's shard (dskit takes as many
			// receivers from each zone).
			n := a.Ring.InstancesWithTokensInZoneCount(a.Cfg.Ring.InstanceZone)
			if shard := a.Limits.IngestionShardSize(tenant); shard > 0 {
				n = min(n, shardutil.ShuffleShardExpectedInstancesPerZone(max(shard, a.Cfg.Ring.ReplicationFactor), max(1, a.Ring.ZonesCount())))
			}
			return n
		}
		n := a.Ring.InstancesWithTokensCount()
		if shard := a.Limits.IngestionShardSize(tenant); shard > 0 {
			n = min(n, max(shard, a.Cfg.Ring.ReplicationFactor))
		}
		return n
	})
}

// initRulersRing: every process that evaluates rules in the ring (a
// receiver with -target=ingest,rules or a ruler of its own with
// -target=rules) joins the rulers' ring, and a rule group is evaluated by
// the ruler owning its hash there (ruleSharding). Rulers joining or leaving
// move groups; receivers and rulers can share the work in one ring.
func (a *App) initRulersRing() (services.Service, error) {
	if !a.Cfg.Ring.Enabled {
		return nil, nil
	}
	logger := a.Logger.With("component", "rulers-ring")
	peers, err := a.Cfg.Ring.NewClient(receiverring.Rulers, a.memberlistKV(), logger, a.Registry)
	if err != nil {
		return nil, err
	}
	self, err := a.Cfg.Ring.NewLifecycler(receiverring.Rulers, a.Server.Addr().String(), a.memberlistKV(), logger, a.Registry)
	if err != nil {
		return nil, err
	}
	a.Rulers, a.rulerID = peers, self.GetInstanceID()
	return services.NewIdleService(
		func(ctx context.Context) error { return joinRing(ctx, peers, self) },
		func(error) error { return leaveRing(peers, self) },
	), nil
}

// ruleSharding shares the rule groups out over the rulers' ring: a group
// (tenant, file, group) is evaluated by the healthy ACTIVE ruler with the
// highest hash of (ruler, group) (rendezvous hashing over the ring's
// members). A ruler that dies hands its groups over once its heartbeat
// times out (a token lookup with one replica would wait until the ring
// forgets it), and a ruler joining or leaving moves only its own share.
// nil without the ring (every group, here).
func (a *App) ruleSharding() (owns func(tenant, file, group string) bool, ownership func() string) {
	if a.Rulers == nil {
		return nil, nil
	}
	owns = func(tenant, file, group string) bool {
		rs, err := a.Rulers.GetAllHealthy(ring.Write)
		if err != nil || len(rs.Instances) == 0 {
			a.Logger.Warn("ring: cannot tell which ruler evaluates a rule group", "tenant", tenant, "group", group, "err", err)
			return false
		}
		key := "\xff" + tenant + "\xff" + file + "\xff" + group
		var owner string
		var best uint64
		for _, in := range rs.Instances {
			if h := xxhash.Sum64String(in.Id + key); owner == "" || h > best {
				owner, best = in.Id, h
			}
		}
		return owner == a.rulerID
	}
	ownership = func() string {
		rs, err := a.Rulers.GetAllHealthy(ring.Write)
		if err != nil {
			return "unknown: " + err.Error()
		}
		ids := make([]string, 0, len(rs.Instances))
		for _, in := range rs.Instances {
			ids = append(ids, in.Id)
		}
		slices.Sort(ids)
		return strings.Join(ids, ",")
	}
	return owns, ownership
}

// ruleDataTenants are the tenants whose data the rules read (they get the
// GPU pack): with the ring, those of every receiver, this process's own
// included; nil without the ring (the ruler's default: this process's).
func (a *App) ruleDataTenants() func() []string {
	src, ok := a.Receivers.(*ringread.Source)
	if !ok {
		return nil
	}
	return func() []string {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ts, err := src.Tenants(ctx)
		switch {
		case err != nil && len(ts) == 0:
			a.Logger.Warn("rules: no receiver listed its tenants", "err", err)
		case err != nil: // a receiver down: its tenants are on its replicas
			a.Logger.Debug("rules: listing the receivers' tenants", "err", err)
		}
		for _, t := range a.DBs.Tenants() {
			if !slices.Contains(ts, t) {
				ts = append(ts, t)
			}
		}
		return ts
	}
}

// ringAppendable is where rule results go with the ring: a distributor of
// the ruler's own (no HTTP route, no HA or relabeling: results are not a
// Prometheus pair's), so they are written to RF receivers at quorum like
// every other sample; nil without the ring (the local TSDB). Rule series
// are few and stable, so its series references are never swept.
func (a *App) ringAppendable() (func(string) (storage.AppendableV2, error), error) {
	if a.Ring == nil {
		return nil, nil
	}
	d, err := distributor.New(a.Cfg.Ring, a.Ring, a.Limits.IngestionShardSize, a.Logger.With("component", "rules"), wrapStage(a.Registry, "rules"))
	if err != nil {
		return nil, err
	}
	return func(tenant string) (storage.AppendableV2, error) { return d.Tenant(tenant) }, nil
}

// receiverRoutes are a receiver's routes in the ring: writes from
// distributors, remote reads and metric metadata for queriers and the
// tenant list for rulers, on paths of their own (a process may run the
// distributor's and the query API's public routes too).
func (a *App) receiverRoutes(ing *ingest.Ingester) {
	a.Server.Writes.Handle(receiverring.WritePath, ing)
	a.Server.Mux.Handle(ringread.ReadPath, ringread.ReadHandler(a.DBs, a.Cfg.Tenant, a.Logger.With("component", "receiver-read"), a.Registry))
	a.Server.Mux.Handle(ringread.MetadataPath, ringread.MetadataHandler(a.DBs, a.Cfg.Tenant))
	a.Server.Mux.Handle(ringread.TenantsPath, ringread.TenantsHandler(a.DBs))
	// For the ring's own processes only: a tenant's identity could write
	// past the distributors' rate limit and HA election, or read any tenant.
	a.Server.Internal(receiverring.WritePath, ringread.ReadPath, ringread.MetadataPath, ringread.TenantsPath)
}

// receiversMetadata is where /api/v1/metadata finds the metadata of the
// ring's receivers; nil without the ring (the local TSDB's alone).
func (a *App) receiversMetadata() query.MetadataSource {
	if src, ok := a.Receivers.(*ringread.Source); ok {
		return src
	}
	return nil
}

// receiversSource reads the ring's receivers for the query role; nil
// without the ring. This process's own receiver (if any) is read from disk.
func (a *App) receiversSource() (query.Source, error) {
	if a.Ring == nil {
		return nil, nil
	}
	cfg := ringread.SourceConfig{
		Client: a.Cfg.Ring.Client, Scheme: a.Cfg.Ring.Scheme, Timeout: time.Duration(a.Cfg.Query.Timeout),
	}
	if a.Limits != nil {
		// Each tenant is read from its shuffle shard and the receivers
		// the shard had within the lookback (ingestion_shard_size).
		cfg.ShardSize, cfg.ShardLookback = a.Limits.IngestionShardSizeSince, a.shardLookback()
	}
	if a.runs(Ingest) {
		id, err := a.Cfg.Ring.ID()
		if err != nil {
			return nil, err
		}
		cfg.Self = id
		// Its own data lacks a crashed head it still recovers.
		cfg.SelfRecovering = func(tenant string) bool { return a.DBs != nil && a.DBs.Recovering(tenant) }
	}
	return ringread.NewSource(cfg, a.Ring, a.Logger.With("component", "receivers"), a.Registry)
}

// shardLookback is ring.shuffle_sharding_lookback, by default what the
// receivers may hold (receiversLookback). Shorter than their heads' span
// (1.5 blocks), a shard that shrank or a receiver that joined would leave
// acknowledged samples unread until they are shipped: warned about.
func (a *App) shardLookback() time.Duration {
	l := time.Duration(a.Cfg.Ring.ShuffleShardingLookback)
	if l == 0 {
		return a.receiversLookback()
	}
	if head := 3 * time.Duration(a.Cfg.TSDB.BlockDuration) / 2; l < head {
		a.Logger.Warn("ring.shuffle_sharding_lookback is shorter than the receivers' heads: after a shuffle shard shrinks or a receiver joins, samples still in a head outside the shard are not read until shipped",
			"lookback", l, "heads", head)
	}
	return l
}

// receiversLookback is how far back the receivers hold data: their local
// retention (gpustore's processes share one configuration), plus a block
// that retention has not deleted yet.
func (a *App) receiversLookback() time.Duration {
	return time.Duration(a.Cfg.TSDB.Retention) + time.Duration(a.Cfg.TSDB.BlockDuration)
}
