// Package hatracker elects one replica per (tenant, cluster) of a Prometheus
// HA pair, so that gpustore stores every sample once.
//
// Both replicas of a pair scrape the same targets and remote-write the same
// series, differing only in their replica label (`__replica__` by default).
// The tracker keeps, per tenant and cluster, the elected replica and when it
// was last heard from. Writes from the elected replica are stored (without
// the replica label); writes from the other are acknowledged and dropped.
// When the elected replica has sent nothing for the failover timeout, the
// next write from another replica wins the election.
//
// The election lives in a dskit KV store: "inmemory" for one process, or
// "memberlist" (or consul/etcd) so that several receivers agree. Each
// receiver keeps a local copy, refreshed by watching the store, and writes
// to the store only on an election or, for the elected replica, at most once
// per update timeout: the hot path is a map lookup under a read lock.
package hatracker

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/grafana/dskit/kv"
	"github.com/grafana/dskit/kv/consul"
	"github.com/grafana/dskit/services"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/common/model"

	"github.com/gpustore/gpustore/internal/logging"
)

// Config configures the tracker. Label names can be overridden per tenant
// through the limits overrides.
type Config struct {
	Enabled bool `yaml:"enabled"`
	// FailoverTimeout is how long the elected replica may be silent before
	// another replica takes over.
	FailoverTimeout model.Duration `yaml:"failover_timeout"`
	// UpdateTimeout is how often the elected replica's last write is
	// recorded in the KV store. It must be well below FailoverTimeout.
	UpdateTimeout model.Duration `yaml:"update_timeout"`
	// KV is the store shared by receivers: inmemory, memberlist, consul, etcd.
	KVStore string `yaml:"kvstore"`
	// KVPrefix begins the keys of the election's entries in the KV store.
	KVPrefix string `yaml:"kv_prefix"`
	// GapFillAfter closes the hole a failover would leave: once the elected
	// replica has been silent this long, samples of the other replica that
	// are at least this much newer than anything stored for the cluster are
	// stored too, before the failover timeout elects it. Two samples of one
	// series from different replicas are then never closer than this, so
	// nothing is stored twice. 0 turns gap filling off.
	GapFillAfter model.Duration `yaml:"gap_fill_after"`
}

// DefaultConfig: on, 30 s failover, in-memory store.
func DefaultConfig() Config {
	return Config{
		Enabled:         true,
		FailoverTimeout: model.Duration(30 * time.Second),
		UpdateTimeout:   model.Duration(5 * time.Second),
		KVStore:         "inmemory",
		KVPrefix:        "ha-tracker/",
		GapFillAfter:    model.Duration(10 * time.Second),
	}
}

// RegisterFlags adds the tracker's flags.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.BoolVar(&c.Enabled, "ha-tracker.enabled", c.Enabled, "Deduplicate Prometheus HA pairs at ingest (by the cluster and replica labels).")
	fs.Var(&c.FailoverTimeout, "ha-tracker.failover-timeout", "Silence of the elected replica after which another replica takes over.")
	fs.Var(&c.UpdateTimeout, "ha-tracker.update-timeout", "How often the elected replica's last write is recorded in the KV store.")
	fs.StringVar(&c.KVStore, "ha-tracker.store", c.KVStore, "KV store of the election: inmemory (one process) or memberlist (several receivers).")
	fs.Var(&c.GapFillAfter, "ha-tracker.gap-fill-after", "Silence of the elected replica after which the other replica's newer samples fill the gap until failover (0: off).")
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if !c.Enabled {
		return nil
	}
	if c.FailoverTimeout <= 0 || c.UpdateTimeout <= 0 {
		return errors.New("ha-tracker timeouts must be positive")
	}
	if c.GapFillAfter < 0 || c.GapFillAfter >= c.FailoverTimeout {
		return fmt.Errorf("ha-tracker gap fill delay %s must be below the failover timeout %s", c.GapFillAfter, c.FailoverTimeout)
	}
	if c.KVStore != "inmemory" && c.GapFillAfter > 0 && c.GapFillAfter+c.UpdateTimeout >= c.FailoverTimeout {
		// See Tracker.Silence: with a shared store, a receiver counts the
		// silence of writes it did not see from the update timeout's end.
		return fmt.Errorf("ha-tracker gap fill delay %s plus update timeout %s must be below the failover timeout %s with a shared store", c.GapFillAfter, c.UpdateTimeout, c.FailoverTimeout)
	}
	if time.Duration(c.UpdateTimeout)*2 > time.Duration(c.FailoverTimeout) {
		return fmt.Errorf("ha-tracker update timeout %s must be at most half the failover timeout %s", c.UpdateTimeout, c.FailoverTimeout)
	}
	return nil
}

type key struct{ tenant, cluster string }

func (k key) String() string { return k.tenant + "/" + k.cluster }

func parseKey(s string) (key, bool) {
	tenant, cluster, ok := strings.Cut(s, "/")
	return key{tenant, cluster}, ok
}

// entry is the local view of one cluster's election.
type entry struct {
	desc ReplicaDesc
	// lastSeen is when this receiver last accepted a write from the elected
	// replica; it can be newer than desc.ReceivedAt (written at most once
	// per update timeout).
	lastSeen int64
}

// Tracker is the HA election service.
type Tracker struct {
	services.Service

	cfg    Config
	kv     kv.Client
	logger *slog.Logger
	now    func() time.Time

	mtx   sync.RWMutex
	local map[key]*entry

	elected       *prometheus.GaugeVec
	changes       *prometheus.CounterVec
	kvErrors      prometheus.Counter
	electedLabels map[key]string // replica currently exported in `elected`
}

// Option changes a tracker built by New.
type Option func(*Tracker)

// WithClock replaces the wall clock (tests drive failover with a fake one).
func WithClock(now func() time.Time) Option { return func(t *Tracker) { t.now = now } }

// WithKV replaces the KV client (tests use one whose store is down).
func WithKV(c kv.Client) Option { return func(t *Tracker) { t.kv = c } }

// New builds a tracker over the configured KV store; storeCfg.MemberlistKV is
// used only with store "memberlist".
func New(cfg Config, storeCfg kv.StoreConfig, logger *slog.Logger, reg prometheus.Registerer, opts ...Option) (*Tracker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var client kv.Client
	var err error
	if cfg.KVStore == "inmemory" {
		// A store of its own rather than dskit's process-wide in-memory
		// singleton: two gpustores in one test process must not share it.
		client, _ = consul.NewInMemoryClient(replicaCodec{}, logging.GoKit(logger), nil)
		client = kv.PrefixClient(client, cfg.KVPrefix)
	} else {
		client, err = kv.NewClient(kv.Config{Store: cfg.KVStore, Prefix: cfg.KVPrefix, StoreConfig: storeCfg}, replicaCodec{},
			kv.RegistererWithKVName(reg, "ha-tracker"), logging.GoKit(logger))
		if err != nil {
			return nil, fmt.Errorf("ha-tracker kv store: %w", err)
		}
	}
	t := newTracker(cfg, client, logger, reg)
	for _, o := range opts {
		o(t)
	}
	return t, nil
}

func newTracker(cfg Config, client kv.Client, logger *slog.Logger, reg prometheus.Registerer) *Tracker {
	f := promauto.With(reg)
	t := &Tracker{
		cfg: cfg, kv: client, logger: logger, now: time.Now,
		local:         map[key]*entry{},
		electedLabels: map[key]string{},
		elected: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpustore_ha_elected_replica", Help: "1 for the replica elected per tenant and cluster of a Prometheus HA pair.",
		}, []string{"tenant", "cluster", "replica"}),
		changes: f.NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_ha_elected_replica_changes_total", Help: "Elections (first election and failovers) per tenant and cluster.",
		}, []string{"tenant", "cluster"}),
		kvErrors: f.NewCounter(prometheus.CounterOpts{
			Name: "gpustore_ha_kv_errors_total", Help: "Failed reads and writes of the HA election KV store.",
		}),
	}
	t.Service = services.NewBasicService(nil, t.watch, nil)
	return t
}

// watch keeps the local view in step with elections made by other receivers.
func (t *Tracker) watch(ctx context.Context) error {
	t.kv.WatchPrefix(ctx, "", func(k string, v any) bool {
		d, ok := v.(*ReplicaDesc)
		if !ok || d == nil {
			return true
		}
		if kk, ok := parseKey(k); ok {
			t.observe(kk, *d)
		}
		return true
	})
	return nil
}

// observe merges a stored description into the local view.
func (t *Tracker) observe(k key, d ReplicaDesc) {
	t.mtx.Lock()
	defer t.mtx.Unlock()
	e, ok := t.local[k]
	if ok && !d.newerThan(&e.desc) {
		return
	}
	if !ok {
		e = &entry{}
		t.local[k] = e
	}
	if e.desc.Replica != d.Replica {
		e.lastSeen = 0
	}
	e.desc = d
	t.exportLocked(k, d.Replica)
}

func (t *Tracker) exportLocked(k key, replica string) {
	if old, ok := t.electedLabels[k]; ok {
		if old == replica {
			return
		}
		t.elected.DeleteLabelValues(k.tenant, k.cluster, old)
	}
	t.electedLabels[k] = replica
	t.elected.WithLabelValues(k.tenant, k.cluster, replica).Set(1)
}

// Accept reports whether a write from replica of cluster in tenant is to be
// stored (true) or dropped as a duplicate (false). It errs only when the KV
// store cannot be reached for an election; the caller answers 5xx and the
// sender retries.
func (t *Tracker) Accept(ctx context.Context, tenant, cluster, replica string) (bool, error) {
	k := key{tenant, cluster}
	now := t.now().UnixMilli()
	failover := time.Duration(t.cfg.FailoverTimeout).Milliseconds()
	update := time.Duration(t.cfg.UpdateTimeout).Milliseconds()

	t.mtx.RLock()
	e, ok := t.local[k]
	var d ReplicaDesc
	var lastSeen int64
	if ok {
		d, lastSeen = e.desc, e.lastSeen
	}
	t.mtx.RUnlock()

	if ok && d.Replica == replica {
		if now-d.ReceivedAt < update {
			t.touch(k, replica, now)
			return true, nil
		}
		// Record that the elected replica is alive, at most once per update timeout.
	} else if ok && now-max(d.ReceivedAt, lastSeen) < failover {
		return false, nil
	}
	return t.elect(ctx, k, replica, now, failover)
}

// GapFillAfter returns the configured gap-fill delay (0: off).
func (t *Tracker) GapFillAfter() time.Duration { return time.Duration(t.cfg.GapFillAfter) }

// Silence is how long the elected replica of the cluster has surely not
// written, as far as this receiver knows. Its own writes this receiver saw
// (lastSeen) are exact. Writes other receivers took reach it only through
// the store, which records them at most once per update timeout: a replica
// recorded at ReceivedAt may have written until ReceivedAt + update timeout
// without the store showing it, so with a shared store that is the latest
// it can be known silent from. (Counting from ReceivedAt, a receiver that
// never sees the elected replica's writes, as when the two replicas of a
// pair write to different distributors, took an alive replica for silent
// during each update timeout and let the other fill a gap it did not have:
// CI saw one scrape of the other replica stored besides the elected one's.)
func (t *Tracker) Silence(tenant, cluster string) time.Duration {
	t.mtx.RLock()
	e := t.local[key{tenant, cluster}]
	var last int64
	if e != nil {
		recorded := e.desc.ReceivedAt
		if t.cfg.KVStore != "inmemory" {
			recorded += time.Duration(t.cfg.UpdateTimeout).Milliseconds()
		}
		last = max(recorded, e.lastSeen)
	}
	t.mtx.RUnlock()
	if e == nil {
		return 0
	}
	return time.Duration(t.now().UnixMilli()-last) * time.Millisecond
}

// touch notes locally that the elected replica wrote now.
func (t *Tracker) touch(k key, replica string, now int64) {
	t.mtx.RLock()
	e := t.local[k]
	stale := e != nil && e.desc.Replica == replica && e.lastSeen < now
	t.mtx.RUnlock()
	if !stale {
		return
	}
	t.mtx.Lock()
	if e := t.local[k]; e != nil && e.desc.Replica == replica && e.lastSeen < now {
		e.lastSeen = now
	}
	t.mtx.Unlock()
}

// elect runs the election for k in the KV store: replica keeps or takes the
// cluster if it is elected already, nobody is, or the elected one has been
// silent for the failover timeout.
func (t *Tracker) elect(ctx context.Context, k key, replica string, now, failover int64) (bool, error) {
	var result ReplicaDesc
	accepted := false
	changed := false
	err := t.kv.CAS(ctx, k.String(), func(in any) (any, bool, error) {
		cur, _ := in.(*ReplicaDesc)
		switch {
		case cur == nil:
			result = ReplicaDesc{Replica: replica, ReceivedAt: now, ElectedAt: now, Term: 1}
			accepted, changed = true, true
		case cur.DeletedAt != 0:
			result = ReplicaDesc{Replica: replica, ReceivedAt: now, ElectedAt: now, Term: cur.Term + 1}
			accepted, changed = true, true
		case cur.Replica == replica:
			result = *cur
			result.ReceivedAt = max(cur.ReceivedAt, now)
			accepted, changed = true, false
		case now-cur.ReceivedAt >= failover && now-t.localLastSeen(k, cur.Replica) >= failover:
			result = ReplicaDesc{Replica: replica, ReceivedAt: now, ElectedAt: max(now, cur.ElectedAt+1), Term: cur.Term + 1}
			accepted, changed = true, true
		default:
			result = *cur
			accepted, changed = false, false
			return nil, false, nil // nothing to write
		}
		return &result, true, nil
	})
	if err != nil {
		t.kvErrors.Inc()
		return false, fmt.Errorf("ha-tracker election for %s: %w", k, err)
	}
	t.observe(k, result)
	if accepted {
		t.touch(k, replica, now)
	}
	if changed {
		t.changes.WithLabelValues(k.tenant, k.cluster).Inc()
		t.logger.Info("elected replica", "tenant", k.tenant, "cluster", k.cluster, "replica", replica)
	}
	return accepted, nil
}

func (t *Tracker) localLastSeen(k key, replica string) int64 {
	t.mtx.RLock()
	defer t.mtx.RUnlock()
	if e := t.local[k]; e != nil && e.desc.Replica == replica {
		return e.lastSeen
	}
	return 0
}

// Status is one cluster's election, as /ha-tracker lists it.
type Status struct {
	Tenant     string    `json:"tenant"`
	Cluster    string    `json:"cluster"`
	Replica    string    `json:"elected_replica"`
	ElectedAt  time.Time `json:"elected_at"`
	LastSeen   time.Time `json:"last_seen"`
	FailoverAt time.Time `json:"failover_at"`
}

// Statuses lists every known election, sorted by tenant and cluster.
func (t *Tracker) Statuses() []Status {
	t.mtx.RLock()
	defer t.mtx.RUnlock()
	out := make([]Status, 0, len(t.local))
	for k, e := range t.local {
		last := max(e.desc.ReceivedAt, e.lastSeen)
		out = append(out, Status{
			Tenant: k.tenant, Cluster: k.cluster, Replica: e.desc.Replica,
			ElectedAt: time.UnixMilli(e.desc.ElectedAt).UTC(), LastSeen: time.UnixMilli(last).UTC(),
			FailoverAt: time.UnixMilli(last).Add(time.Duration(t.cfg.FailoverTimeout)).UTC(),
		})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Tenant != out[j].Tenant {
			return out[i].Tenant < out[j].Tenant
		}
		return out[i].Cluster < out[j].Cluster
	})
	return out
}

// Handler serves the elections as JSON: GET /ha-tracker.
func (t *Tracker) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"failover_timeout": t.cfg.FailoverTimeout.String(),
			"elections":        t.Statuses(),
		})
	})
}
