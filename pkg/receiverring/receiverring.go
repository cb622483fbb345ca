// Package receiverring is the ring of receivers: dskit's hash ring, gossiped
// by memberlist, in which every process running the ingest role registers
// itself (tokens, heartbeats, state) and which distributors and queriers read
// to find the receivers of a series. Membership, sharding and replication are
// dskit's; this package only holds gpustore's configuration of them.
package receiverring

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/grafana/dskit/flagext"
	"github.com/grafana/dskit/kv"
	"github.com/grafana/dskit/kv/memberlist"
	"github.com/grafana/dskit/ring"
	"github.com/prometheus/client_golang/prometheus"
	config_util "github.com/prometheus/common/config"
	"github.com/prometheus/common/model"

	"github.com/gpustore/gpustore/internal/logging"
	"github.com/gpustore/gpustore/pkg/tenantdb"
)

// The ring's name (in dskit's metrics and status page) and its key in the KV.
const (
	Name = "receiver"
	Key  = "receivers"
)

// Ring is one ring of the KV: the receivers', the distributors' (which
// only counts them, to share each tenant's ingestion rate), or the rulers'
// (which shares the rule groups out).
type Ring struct{ Name, Key string }

// The rings.
var (
	Receivers    = Ring{Name, Key}
	Distributors = Ring{"distributor", "distributors"}
	Rulers       = Ring{"ruler", "rulers"}
)

// WritePath is where receivers take distributors' writes (not users'); they
// serve queriers at ringread.ReadPath.
const (
	WritePath = "/receiver/write"
)

// Config is the ring section of the configuration.
type Config struct {
	// Enabled turns scale-out on: receivers join the ring, distributors
	// and queriers use it.
	Enabled bool `yaml:"enabled"`
	// KVStore is where the ring lives: memberlist (the memberlist section
	// says whom to join) or inmemory (one process only, for tests).
	KVStore           string `yaml:"kvstore"`
	ReplicationFactor int    `yaml:"replication_factor"`
	// InstanceID names this receiver in the ring; default: the hostname.
	InstanceID string `yaml:"instance_id"`
	// InstanceAddr is the host:port other processes reach this one at;
	// default: the listen address when it names a host, else the first
	// private address of eth0/en0 with the listen port.
	InstanceAddr string `yaml:"instance_addr"`
	// NumTokens is how many tokens a receiver takes in the ring: its share
	// of the series is about its share of the tokens.
	NumTokens        int            `yaml:"num_tokens"`
	HeartbeatPeriod  model.Duration `yaml:"heartbeat_period"`
	HeartbeatTimeout model.Duration `yaml:"heartbeat_timeout"`
	// Scheme and Client are how distributors, queriers and rulers call
	// receivers (TLS, a client certificate, basic auth of a peer identity).
	Scheme string                       `yaml:"scheme"`
	Client config_util.HTTPClientConfig `yaml:"client"`
	// PeerIdentities are the identities of the web config (basic-auth
	// users, client-certificate common names) that gpustore's processes
	// present to each other with Client. Only they may use the receivers'
	// internal routes (/receiver/*: writes that skip the distributors'
	// limits, every tenant's reads), never a tenant's identity; they need
	// no entry in tenants.auth. Empty: identities allowed "*" in
	// tenants.auth (anyone without tenants.auth).
	PeerIdentities flagext.StringSliceCSV `yaml:"peer_identities"`
	// RemoteTimeout bounds one call to a receiver.
	RemoteTimeout model.Duration `yaml:"remote_timeout"`
	// DistributorSeriesCacheMaxSeries bounds the series a distributor
	// keeps cached over all its tenants (0: no bound). Every distributor
	// behind a load balancer sees every series, so without a bound each
	// holds all of them; past it a new series is forwarded uncached.
	DistributorSeriesCacheMaxSeries int `yaml:"distributor_series_cache_max_series"`
	// FlushOnShutdown: a stopping receiver turns LEAVING, flushes its heads
	// into blocks and ships them before it leaves the ring.
	FlushOnShutdown bool `yaml:"flush_on_shutdown"`
	// ZoneAwarenessEnabled places a series' replication_factor copies in
	// that many different zones (dskit's ring does the placement), and
	// reads tolerate whole zones failing rather than counting receivers.
	// Every process of the ring needs it: distributors place by it,
	// queriers read by it.
	ZoneAwarenessEnabled bool `yaml:"zone_awareness_enabled"`
	// InstanceZone is this receiver's availability zone (required on
	// receivers with zone awareness).
	InstanceZone string `yaml:"instance_zone"`
	// ShuffleShardingLookback is how long queriers and rulers keep reading
	// the receivers a tenant's shuffle shard (limits' ingestion_shard_size)
	// had before a receiver joined or the size changed; 0: the receivers'
	// local retention and a block, what they may hold.
	ShuffleShardingLookback model.Duration `yaml:"shuffle_sharding_lookback"`
}

// DefaultConfig is off, with the settings scale-out starts from.
func DefaultConfig() Config {
	return Config{
		KVStore: "memberlist", ReplicationFactor: 3, NumTokens: 128,
		HeartbeatPeriod: model.Duration(5 * time.Second), HeartbeatTimeout: model.Duration(time.Minute),
		Scheme: "http", Client: config_util.DefaultHTTPClientConfig,
		RemoteTimeout:   model.Duration(10 * time.Second),
		FlushOnShutdown: true,
		// About 0.7 GiB of heap (1 GiB of RSS) at 0.7 KiB per cached
		// series: every series of a fleet of 3,500 GPUs (283 series each)
		// is cached, and a distributor of a larger fleet still fits a
		// container of a few GiB, for more CPU per sample over the bound
		// (docs/scale-out.md, Sizing).
		DistributorSeriesCacheMaxSeries: 1_000_000,
	}
}

// RegisterFlags binds the common knobs.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.BoolVar(&c.Enabled, "ring.enabled", c.Enabled, "Scale out: receivers join the ring of receivers, distributors shard and replicate writes by it, queriers read every receiver.")
	fs.StringVar(&c.KVStore, "ring.store", c.KVStore, "Where the ring lives: memberlist or inmemory (one process, tests).")
	fs.IntVar(&c.ReplicationFactor, "ring.replication-factor", c.ReplicationFactor, "Receivers each series is written to; a write succeeds once a quorum (RF/2+1) has it in its WAL.")
	fs.StringVar(&c.InstanceID, "ring.instance-id", c.InstanceID, "This receiver's name in the ring (default: hostname).")
	fs.StringVar(&c.InstanceAddr, "ring.instance-addr", c.InstanceAddr, "host:port other gpustore processes reach this one at (default: from the listen address).")
	fs.Var(&c.HeartbeatPeriod, "ring.heartbeat-period", "How often a receiver renews its entry in the ring.")
	fs.Var(&c.HeartbeatTimeout, "ring.heartbeat-timeout", "A receiver whose heartbeat is older is unhealthy: not written to, and its failures tolerated by reads.")
	fs.Var(&c.PeerIdentities, "ring.peer-identities", "Comma-separated identities of the web config (basic-auth users, client-certificate common names) gpustore's processes call each other as (ring.client); only they may use the receivers' internal routes /receiver/* (default: identities allowed \"*\" in tenants.auth).")
	fs.BoolVar(&c.ZoneAwarenessEnabled, "ring.zone-awareness-enabled", c.ZoneAwarenessEnabled, "Replicate each series to receivers in replication-factor different zones (-ring.instance-zone), so losing a whole zone loses no write quorum and no read; set it on every process of the ring, and run receivers in at least replication-factor zones.")
	fs.StringVar(&c.InstanceZone, "ring.instance-zone", c.InstanceZone, "This receiver's availability zone (required on receivers with -ring.zone-awareness-enabled).")
	fs.Var(&c.ShuffleShardingLookback, "ring.shuffle-sharding-lookback", "How long reads of a shuffle-sharded tenant (limits' ingestion_shard_size) still ask the receivers its shard had before a receiver joined or the size changed; at least the heads' span (1.5 block durations) and the shipping delay (0: storage.tsdb.retention.time plus a block duration).")
	fs.IntVar(&c.DistributorSeriesCacheMaxSeries, "distributor.series-cache.max-series", c.DistributorSeriesCacheMaxSeries, "Series a distributor keeps cached (labels and their remote-write encoding, about 0.7 KiB of heap each) over all tenants; past it new series are forwarded uncached, each write resolving them again from their labels (0: no bound).")
	fs.BoolVar(&c.FlushOnShutdown, "ring.flush-on-shutdown", c.FlushOnShutdown, "A stopping receiver stops taking writes, flushes its heads into blocks and ships them before it leaves the ring (so scale-in leaves nothing in a WAL).")
}

// Validate checks the section.
func (c Config) Validate() error {
	if !c.Enabled {
		return nil
	}
	var errs []error
	if c.KVStore != "memberlist" && c.KVStore != "inmemory" {
		errs = append(errs, fmt.Errorf("ring.kvstore %q: want memberlist or inmemory", c.KVStore))
	}
	if c.ReplicationFactor < 1 {
		errs = append(errs, errors.New("ring.replication_factor must be at least 1"))
	}
	if c.NumTokens < 1 {
		errs = append(errs, errors.New("ring.num_tokens must be at least 1"))
	}
	if c.HeartbeatPeriod <= 0 || c.HeartbeatTimeout <= c.HeartbeatPeriod {
		errs = append(errs, errors.New("ring.heartbeat_timeout must exceed a positive ring.heartbeat_period"))
	}
	if c.DistributorSeriesCacheMaxSeries < 0 {
		errs = append(errs, errors.New("ring.distributor_series_cache_max_series must not be negative (0: no bound)"))
	}
	if c.ShuffleShardingLookback < 0 {
		errs = append(errs, errors.New("ring.shuffle_sharding_lookback must not be negative (0: the receivers' retention and a block)"))
	}
	if c.Scheme != "http" && c.Scheme != "https" {
		errs = append(errs, fmt.Errorf("ring.scheme %q: want http or https", c.Scheme))
	}
	if err := c.Client.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("ring.client: %w", err))
	}
	return errors.Join(errs...)
}

// ValidateReceiver checks what a process that registers as a receiver
// needs beyond Validate: with zone awareness, its zone. dskit's ring
// places a receiver without a zone as if it were in every zone, so a
// series could get two copies in one zone without anyone noticing.
func (c Config) ValidateReceiver() error {
	if c.Enabled && c.ZoneAwarenessEnabled && c.InstanceZone == "" {
		return errors.New("ring.zone_awareness_enabled needs this receiver's zone: set ring.instance_zone (-ring.instance-zone)")
	}
	return nil
}

// KV is the ring's KV configuration; memberlistKV is the process' gossip.
func (c Config) KV(memberlistKV func() (*memberlist.KV, error)) kv.Config {
	return kv.Config{Store: c.KVStore, StoreConfig: kv.StoreConfig{MemberlistKV: memberlistKV}}
}

// NewClient returns the ring r as distributors and queriers read it (a
// dskit service: start it before use).
func (c Config) NewClient(r Ring, memberlistKV func() (*memberlist.KV, error), logger *slog.Logger, reg prometheus.Registerer) (*ring.Ring, error) {
	rc := ring.Config{
		KVStore:           c.KV(memberlistKV),
		HeartbeatTimeout:  time.Duration(c.HeartbeatTimeout),
		ReplicationFactor: c.ReplicationFactor,
		// Only the receivers' ring replicates; the distributors' and
		// rulers' rings are counted and hashed over whole.
		ZoneAwarenessEnabled: c.ZoneAwarenessEnabled && r == Receivers,
	}
	return ring.New(rc, r.Name, r.Key, logging.GoKit(logger), reg)
}

// NewLifecycler registers this process as a receiver: ACTIVE with fresh
// tokens once started, heartbeats while running, and out of the ring when
// stopped (so writes go elsewhere at once). An instance that died without
// leaving is forgotten after ten heartbeat timeouts.
func (c Config) NewLifecycler(r Ring, listenAddr string, memberlistKV func() (*memberlist.KV, error), logger *slog.Logger, reg prometheus.Registerer) (*ring.BasicLifecycler, error) {
	id, addr, err := c.identity(listenAddr, logger)
	if err != nil {
		return nil, err
	}
	if r != Receivers {
		// Only counted, never addressed by ID: the address keeps two
		// processes of one host (or with one -ring.instance-id) apart.
		id += "@" + addr
	}
	store, err := kv.NewClient(c.KV(memberlistKV), ring.GetCodec(), kv.RegistererWithKVName(reg, r.Name+"-lifecycler"), logging.GoKit(logger))
	if err != nil {
		return nil, fmt.Errorf("ring kv: %w", err)
	}
	gk := logging.GoKit(logger)
	var delegate ring.BasicLifecyclerDelegate = ring.NewInstanceRegisterDelegate(ring.ACTIVE, c.NumTokens)
	delegate = ring.NewLeaveOnStoppingDelegate(delegate, gk)
	delegate = ring.NewAutoForgetDelegate(10*time.Duration(c.HeartbeatTimeout), delegate, gk)
	logger.Info("joining a ring", "ring", r.Key, "instance", id, "addr", addr, "zone", c.InstanceZone)
	return ring.NewBasicLifecycler(ring.BasicLifecyclerConfig{
		ID: id, Addr: addr, Zone: c.InstanceZone,
		HeartbeatPeriod:  time.Duration(c.HeartbeatPeriod),
		HeartbeatTimeout: time.Duration(c.HeartbeatTimeout),
		NumTokens:        c.NumTokens,
	}, r.Name, r.Key, store, delegate, gk, reg)
}

// ID is this process' instance ID in the ring.
func (c Config) ID() (string, error) {
	if c.InstanceID != "" {
		return c.InstanceID, nil
	}
	id, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("ring.instance_id: %w", err)
	}
	return id, nil
}

// identity resolves the instance ID and address the defaults leave open.
func (c Config) identity(listenAddr string, logger *slog.Logger) (id, addr string, err error) {
	if id, err = c.ID(); err != nil {
		return "", "", err
	}
	addr = c.InstanceAddr
	if addr != "" {
		return id, addr, nil
	}
	host, port, err := net.SplitHostPort(listenAddr)
	if err != nil {
		return "", "", fmt.Errorf("ring.instance_addr from listen address %q: %w", listenAddr, err)
	}
	if ip := net.ParseIP(host); host != "" && (ip == nil || !ip.IsUnspecified()) {
		return id, listenAddr, nil
	}
	host, err = ring.GetInstanceAddr("", []string{"eth0", "en0"}, logging.GoKit(logger), false)
	if err != nil {
		return "", "", fmt.Errorf("ring.instance_addr: %w (set it)", err)
	}
	p, _ := strconv.Atoi(port)
	return id, net.JoinHostPort(host, strconv.Itoa(p)), nil
}

// ReplicaLimits are a receiver's TSDB limits in the ring.
//
// Every tenant's out-of-order window is at least the remote timeout. A
// distributor acknowledges a write once a quorum of replicas committed it,
// and the sender's next write can overtake the slowest replica's copy on its
// way; without the window that replica would reject the earlier sample as
// out of order and hold less than the others.
//
// A tenant's max_active_series is the whole ring's: with receivers(tenant)
// (the receivers holding tokens, or of the tenant's shuffle shard if fewer;
// nil or 0: not known yet) above the replication factor, each holds about
// RF/receivers of the tenant's series and gets that share of the limit, as
// Mimir's ingesters do (token ownership is not perfectly even, so a tenant
// at its limit may see one receiver refuse a little early). With zone
// awareness every zone holds one copy of each series, spread over the
// zone's receivers (or the tenant's shard's part of them): receivers then
// counts those of this receiver's zone, and each holds about 1/receivers of
// the series (the zones need not be the same size).
func (c Config) ReplicaLimits(l tenantdb.TenantLimits, receivers func(tenant string) int) tenantdb.TenantLimits {
	rf := c.ReplicationFactor
	if c.ZoneAwarenessEnabled {
		rf = 1
	}
	return replicaLimits{TenantLimits: l, minWindow: time.Duration(c.RemoteTimeout), rf: rf, receivers: receivers}
}

type replicaLimits struct {
	tenantdb.TenantLimits
	minWindow time.Duration
	rf        int
	receivers func(tenant string) int
}

func (r replicaLimits) OutOfOrderWindow(tenant string) time.Duration {
	return max(r.TenantLimits.OutOfOrderWindow(tenant), r.minWindow)
}

func (r replicaLimits) MaxActiveSeries(tenant string) int {
	limit := r.TenantLimits.MaxActiveSeries(tenant)
	if limit <= 0 || r.receivers == nil {
		return limit
	}
	n := r.receivers(tenant)
	if n <= r.rf {
		return limit // every receiver holds every series
	}
	return (limit*r.rf + n - 1) / n // rounded up: never 0
}
