// Package tenantdb owns one Prometheus TSDB per tenant under a data directory.
//
// Each tenant gets <data-dir>/tenants/<tenant>/ with its own WAL, head and
// blocks, so a tenant's data can be shipped, compacted, limited and deleted on
// its own. Databases of tenants found on disk are opened at start-up (their
// WAL is replayed before the process reports ready); a new tenant's database
// is opened on its first write.
package tenantdb

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/grafana/dskit/tenant"
	"github.com/oklog/ulid/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/config"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/util/compression"

	"github.com/gpustore/gpustore/pkg/blockquery"
)

// Config is the part of gpustore's configuration that shapes each tenant's TSDB.
type Config struct {
	// Dir is the data directory; tenants live under Dir/tenants.
	Dir string `yaml:"dir"`
	// BlockDuration is the head's block range (2h by default). Tests use minutes.
	BlockDuration model.Duration `yaml:"block_duration"`
	// Retention is how long local blocks are kept.
	Retention model.Duration `yaml:"retention"`
	// MaxExemplars bounds the in-memory exemplar ring buffer per tenant; 0 disables exemplars.
	MaxExemplars int64 `yaml:"max_exemplars"`
	// WALCompression turns snappy compression of WAL records on.
	WALCompression bool `yaml:"wal_compression"`
	// Isolation turns on the TSDB's isolation: a query does not see a
	// commit in progress (part of one request's samples). Off by default:
	// remote write already splits a scrape over shards and requests, so a
	// reader can never count on seeing a scrape whole, and isolation costs
	// every series a ring of append IDs (54 bytes per series of a 1 M-series
	// heap) and every commit the isolation lock.
	Isolation bool `yaml:"isolation"`
	// StripeSize is the number of shards of a tenant's head series map (a
	// power of two). The TSDB's default, 16,384, costs every tenant ~4 MB
	// of empty shards before its first series; see DefaultConfig.
	StripeSize int `yaml:"stripe_size"`
	// MemorySnapshotOnShutdown makes a clean close write each tenant's head
	// (series, chunks, exemplars) to a chunk snapshot that the next open
	// loads instead of replaying the WAL up to it: a receiver that stops
	// without flushing its heads (no ring, or ring.flush_on_shutdown off)
	// restarts in seconds rather than replaying hours of samples. A kill -9
	// writes none; the open then loads the last clean close's snapshot, if
	// the WAL still holds everything after it, and replays the rest.
	MemorySnapshotOnShutdown bool `yaml:"memory_snapshot_on_shutdown"`
	// RecoverWALAside, "on", "off" or "auto", sets a crashed head aside at
	// open (recover.go): the tenant opens with an empty head at once and
	// the crashed one is replayed into blocks in the background, instead of
	// the receiver staying unready for the replay (minutes at millions of
	// series). Its answers lack those samples until then, so "auto" (the
	// default) turns it on only in a ring at RF ≥ 2, where the other
	// replicas answer for them; the app resolves "auto".
	RecoverWALAside string `yaml:"recover_wal_aside"`
	// RecoverAsideMinWALBytes is the WAL to replay from which a head is set
	// aside: below it the replay takes seconds.
	RecoverAsideMinWALBytes int64 `yaml:"recover_aside_min_wal_bytes"`
}

// DefaultConfig returns the embedded defaults.
func DefaultConfig() Config {
	return Config{
		Dir:           "./data",
		BlockDuration: model.Duration(2 * time.Hour),
		// Uploaded blocks are read from the bucket (compacted there), so the
		// local copy is only kept a few hours; a block is never deleted before
		// its upload is confirmed (the shipper's deletion gate).
		Retention:      model.Duration(6 * time.Hour),
		MaxExemplars:   100000,
		WALCompression: true,
		StripeSize:     defaultStripeSize,
		// A restart's replay is the longest time a receiver is not ready:
		// loading the snapshot of 1 M series × 1 h of head took 20 CPU-s
		// against the WAL's 106, and writing it took 4.9 s of the clean
		// stop (bench/RESULTS.md, "WAL replay taken apart").
		MemorySnapshotOnShutdown: true,
		RecoverWALAside:          "auto",
		// ≈ 7 M samples: 3–5 s of replay (bench/RESULTS.md).
		RecoverAsideMinWALBytes: 64 << 20,
	}
}

// defaultStripeSize is 1,024 shards (~0.25 MB per tenant) rather than the
// TSDB's 16,384 (~4 MB): BenchmarkHeadNewSeries (1 M series) and
// BenchmarkIngest (pkg/ingest) measured the same CPU per series and sample
// within their noise, and 0.6 % more heap per series, with both
// (bench/RESULTS.md). Appends take one shard's lock per series; 1,024
// shards leave contention to the hundreds of cores.
const defaultStripeSize = 1024

// blockReloadInterval is how often a tenant's database reloads its blocks
// (and so applies retention): at least every eighth of a block period, so
// that minute-long test blocks leave the disk within seconds of upload.
func (c Config) blockReloadInterval() time.Duration {
	return min(time.Minute, max(time.Second, time.Duration(c.BlockDuration)/8))
}

// Validate reports configuration errors before anything is opened.
func (c Config) Validate() error {
	if c.Dir == "" {
		return errors.New("tsdb dir must not be empty")
	}
	if time.Duration(c.BlockDuration) < time.Minute {
		return fmt.Errorf("tsdb block duration %s is shorter than one minute", c.BlockDuration)
	}
	if c.Retention < c.BlockDuration {
		return fmt.Errorf("tsdb retention %s is shorter than the block duration %s", c.Retention, c.BlockDuration)
	}
	switch c.RecoverWALAside {
	case "", "auto", "on", "off":
	default:
		return fmt.Errorf("tsdb recover_wal_aside %q is not one of auto, on, off", c.RecoverWALAside)
	}
	if c.StripeSize < 0 || c.StripeSize&(c.StripeSize-1) != 0 {
		return fmt.Errorf("tsdb stripe_size %d is not a power of two (0: the default)", c.StripeSize)
	}
	return nil
}

// DB is one tenant's database and the metadata its senders reported.
type DB struct {
	*tsdb.DB
	Tenant   string
	Metadata *MetadataStore

	openedWindow int64 // out-of-order window (ms) the database was opened with
	logger       *slog.Logger
	symbols      symbols
	exemplars    *exemplarRing
	reads        *localReads
	series       *seriesLimiter // the head's series by metric, and today's
}

// TenantLimits lets the per-tenant limits shape each tenant's database.
type TenantLimits interface {
	// MaxActiveSeries bounds the series in the tenant's head; 0 = unlimited.
	MaxActiveSeries(tenant string) int
	// OutOfOrderWindow is how far behind its series' newest sample a sample may be.
	OutOfOrderWindow(tenant string) time.Duration
	// MaxSeriesPerMetric bounds the head's series of one metric name, and
	// MaxNewSeriesPerDay the series the head creates in a UTC day; 0 =
	// unlimited (cardinality.go).
	MaxSeriesPerMetric(tenant string) int
	MaxNewSeriesPerDay(tenant string) int
}

type noLimits struct{}

func (noLimits) MaxActiveSeries(string) int            { return 0 }
func (noLimits) OutOfOrderWindow(string) time.Duration { return 0 }
func (noLimits) MaxSeriesPerMetric(string) int         { return 0 }
func (noLimits) MaxNewSeriesPerDay(string) int         { return 0 }

// ErrTooManyTenants is returned (wrapped) by Get for a tenant that has no
// database yet when the manager holds MaxTenants already.
var ErrTooManyTenants = errors.New("tenant limit reached")

// Manager opens, hands out and closes the per-tenant databases.
type Manager struct {
	cfg    Config
	logger *slog.Logger
	reg    prometheus.Registerer
	limits TenantLimits
	// maxTenants bounds the tenants created (SetMaxTenants); 0: none.
	maxTenants int

	// mtx guards the maps and closed, never an open: a tenant's WAL replay
	// (minutes for a big head) must not stall the other tenants.
	mtx     sync.RWMutex
	dbs     map[string]*DB
	opening map[string]*opening // tenants whose database is being opened
	closed  bool

	gate DeletionGate // nil: local blocks leave by retention alone

	// blockCache holds the selectors resolved on persisted blocks
	// (pkg/blockquery), shared by every tenant; nil caches nothing.
	blockCache *blockquery.Cache

	// openTSDB is tsdb.Open; tests wrap it to make one tenant's open slow.
	openTSDB func(dir string, l *slog.Logger, r prometheus.Registerer, opts *tsdb.Options) (*tsdb.DB, error)

	recoveries *recoveries // crashed heads set aside at open (recover.go)
}

// DeletionGate reports whether a tenant's local block that is past the local
// retention may be deleted. The shipper installs one that allows it only once
// the block's upload to the bucket is confirmed.
type DeletionGate func(tenant string, block ulid.ULID) bool

// SetDeletionGate installs g for every tenant database opened afterwards:
// call it before OpenExisting (dskit runs every module's init before any
// service starts, so the shipper's init does). With a gate installed, local
// blocks are never compacted together (vertical compaction of overlapping
// out-of-order blocks is left to the bucket's compactor), so the TSDB never
// deletes a block's data except by retention, and retention deletes only what
// g allows.
func (m *Manager) SetDeletionGate(g DeletionGate) {
	m.mtx.Lock()
	defer m.mtx.Unlock()
	m.gate = g
}

// TenantDir is the directory of the tenant's TSDB.
func (m *Manager) TenantDir(tenantID string) string {
	return filepath.Join(m.cfg.Dir, "tenants", tenantID)
}

// NewManager returns a Manager; call OpenExisting before serving.
func NewManager(cfg Config, logger *slog.Logger, reg prometheus.Registerer) (*Manager, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(cfg.Dir, "tenants"), 0o755); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	return &Manager{cfg: cfg, logger: logger, reg: reg, limits: noLimits{}, dbs: map[string]*DB{}, opening: map[string]*opening{}, openTSDB: openTSDB, recoveries: newRecoveries(reg)}, nil
}

// SetLimits installs the per-tenant limits; call it before any database is opened.
func (m *Manager) SetLimits(l TenantLimits) { m.limits = l }

// SetBlockCache makes every tenant's persisted blocks keep their resolved
// selectors in c (pkg/blockquery); call it before any database is opened.
func (m *Manager) SetBlockCache(c *blockquery.Cache) { m.blockCache = c }

// SetMaxTenants bounds the tenants the manager holds (limits.max_tenants;
// 0: no bound); call it before any database is opened.
func (m *Manager) SetMaxTenants(n int) { m.maxTenants = n }

// ApplyLimits re-applies the limits that a running database can change (the
// out-of-order window) to every open tenant, after the overrides changed.
func (m *Manager) ApplyLimits() error {
	m.mtx.RLock()
	defer m.mtx.RUnlock()
	var errs []error
	for t, db := range m.dbs {
		if err := m.applyLimits(t, db); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (m *Manager) applyLimits(t string, db *DB) error {
	window := m.limits.OutOfOrderWindow(t).Milliseconds()
	// ApplyConfig also re-applies the exemplar buffer size: pass the
	// tenant's own (0 until its first exemplar).
	cfg := &config.Config{StorageConfig: config.StorageConfig{
		TSDBConfig:      &config.TSDBConfig{OutOfOrderTimeWindow: window},
		ExemplarsConfig: &config.ExemplarsConfig{MaxExemplars: db.exemplars.size()},
	}}
	if err := db.ApplyConfig(cfg); err != nil {
		return fmt.Errorf("apply limits to tenant %q: %w", t, err)
	}
	return nil
}

// Config returns the configuration the manager opens databases with.
func (m *Manager) Config() Config { return m.cfg }

// OpenExisting opens (and so replays the WAL of) every tenant found on disk.
func (m *Manager) OpenExisting(ctx context.Context) error {
	entries, err := os.ReadDir(filepath.Join(m.cfg.Dir, "tenants"))
	if err != nil {
		return fmt.Errorf("list tenants: %w", err)
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if _, err := m.get(e.Name(), true); err != nil {
			return err
		}
	}
	return nil
}

// opening is one open of a tenant's database in flight; Gets of the tenant
// that arrive meanwhile wait for done and share db and err.
type opening struct {
	done    chan struct{}
	db      *DB
	err     error
	waiters int // Gets waiting for done, guarded by Manager.mtx
}

// Get returns the tenant's database, opening it on first use. The open (a
// WAL replay) runs outside the manager's lock: other tenants' Gets, Existing
// and Tenants go on meanwhile, and concurrent Gets of the same tenant wait
// for that one open. A failed open is not remembered: the next Get tries again.
// A tenant without a directory is created only while the manager holds
// fewer than MaxTenants (ErrTooManyTenants); tenants on disk always open.
func (m *Manager) Get(tenantID string) (*DB, error) { return m.get(tenantID, false) }

func (m *Manager) get(tenantID string, onDisk bool) (*DB, error) {
	m.mtx.RLock()
	db, ok := m.dbs[tenantID]
	closed := m.closed
	m.mtx.RUnlock()
	if ok {
		return db, nil
	}
	if closed {
		return nil, ErrClosed
	}
	if err := tenant.ValidTenantID(tenantID); err != nil {
		return nil, fmt.Errorf("invalid tenant %q: %w", tenantID, err)
	}

	m.mtx.Lock()
	if m.closed {
		m.mtx.Unlock()
		return nil, ErrClosed
	}
	if db, ok := m.dbs[tenantID]; ok {
		m.mtx.Unlock()
		return db, nil
	}
	if op, ok := m.opening[tenantID]; ok {
		op.waiters++
		m.mtx.Unlock()
		<-op.done
		return op.db, op.err
	}
	if err := m.mayCreate(tenantID, onDisk); err != nil {
		m.mtx.Unlock()
		return nil, err
	}
	op := &opening{done: make(chan struct{})}
	m.opening[tenantID] = op
	gate := m.gate
	m.mtx.Unlock()

	op.db, op.err = m.open(tenantID, gate)

	m.mtx.Lock()
	delete(m.opening, tenantID)
	closedMeanwhile, waiters := m.closed, op.waiters
	if op.err == nil && !closedMeanwhile {
		m.dbs[tenantID] = op.db
	}
	m.mtx.Unlock()
	if op.err == nil && !closedMeanwhile && m.limits.OutOfOrderWindow(tenantID).Milliseconds() != op.db.openedWindow {
		// The overrides changed during the open, and ApplyLimits did not see
		// this database yet.
		if err := m.applyLimits(tenantID, op.db); err != nil {
			m.logger.Warn("apply limits to a newly opened tenant", "tenant", tenantID, "err", err)
		}
	}
	if op.err == nil && closedMeanwhile {
		// Close ran during the open and waits on done: close what was
		// opened so nothing holds the tenant's directory once Close returns.
		if err := op.db.Close(); err != nil {
			m.logger.Warn("close tenant database opened during shutdown", "tenant", tenantID, "err", err)
		}
		op.db, op.err = nil, ErrClosed
	}
	if waiters > 0 {
		m.logger.Info("writes and queries of the tenant waited for its database to open", "tenant", tenantID, "waiters", waiters, "err", op.err)
	}
	close(op.done)
	return op.db, op.err
}

// mayCreate refuses a tenant that is not on disk when the manager holds (or
// is opening) MaxTenants tenants already. Every tenant's database is opened
// again at start, so a bound checked only on first writes would not be one:
// tenants on disk count, and keep opening whatever the bound became. Called
// with m.mtx held.
func (m *Manager) mayCreate(tenantID string, onDisk bool) error {
	max := m.maxTenants
	if onDisk || max <= 0 || len(m.dbs)+len(m.opening) < max {
		return nil
	}
	if _, err := os.Stat(m.TenantDir(tenantID)); err == nil {
		return nil // on disk, not open yet (an open that failed)
	}
	return fmt.Errorf("%w: gpustore holds %d tenants (limits.max_tenants); tenant %q is new and is refused, the existing ones are not", ErrTooManyTenants, max, tenantID)
}

// Existing returns the tenant's database if it is open, without opening it:
// the query path uses it so that reading an unknown tenant creates nothing.
func (m *Manager) Existing(tenantID string) *DB {
	m.mtx.RLock()
	defer m.mtx.RUnlock()
	return m.dbs[tenantID]
}

// Tenants lists the open tenants, sorted.
func (m *Manager) Tenants() []string {
	m.mtx.RLock()
	defer m.mtx.RUnlock()
	out := make([]string, 0, len(m.dbs))
	for t := range m.dbs {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// ErrClosed is returned once the manager has been closed.
var ErrClosed = errors.New("tenant databases are closed")

func (m *Manager) open(tenantID string, gate DeletionGate) (*DB, error) {
	dir := filepath.Join(m.cfg.Dir, "tenants", tenantID)
	opts := tsdb.DefaultOptions()
	blockMs := m.cfg.BlockDuration.Milliseconds()
	opts.MinBlockDuration = blockMs
	// Local blocks stay at the head's block size: merging 2h blocks into larger
	// ones is the compactor's job once they are in the bucket.
	opts.MaxBlockDuration = blockMs
	opts.RetentionDuration = m.cfg.Retention.Milliseconds()
	opts.OutOfOrderTimeWindow = m.limits.OutOfOrderWindow(tenantID).Milliseconds()
	var opened atomic.Pointer[tsdb.DB]
	series := newSeriesLimiter(tenantID, m.limits, func() *tsdb.Head {
		if db := opened.Load(); db != nil {
			return db.Head()
		}
		return nil // during WAL replay: the series being restored are not new
	})
	opts.SeriesLifecycleCallback = series
	// Persisted blocks are read through pkg/blockquery (localread.go).
	reads := &localReads{cache: m.blockCache}
	opts.BlockQuerierFunc = reads.blockQuerier
	opts.BlockChunkQuerierFunc = reads.blockChunkQuerier
	// The exemplar ring buffer (MaxExemplars entries, ~7 MB at the
	// default) is allocated when the tenant sends its first exemplar, and
	// at open for tenants that did (their WAL holds exemplars to replay).
	opts.EnableExemplarStorage = m.cfg.MaxExemplars > 0
	ring := &exemplarRing{max: m.cfg.MaxExemplars, marker: filepath.Join(dir, exemplarsMarker)}
	ring.load()
	opts.MaxExemplars = ring.size()
	opts.IsolationDisabled = !m.cfg.Isolation
	opts.StripeSize = cmp.Or(m.cfg.StripeSize, defaultStripeSize)
	opts.EnableMemorySnapshotOnShutdown = m.cfg.MemorySnapshotOnShutdown
	if m.cfg.WALCompression {
		opts.WALCompression = compression.Snappy
	}
	opts.BlockReloadInterval = m.cfg.blockReloadInterval()
	var self atomic.Pointer[tsdb.DB]
	if gate != nil {
		opts.EnableOverlappingCompaction = false
		opts.BlocksToDelete = func(blocks []*tsdb.Block) map[ulid.ULID]struct{} {
			db := self.Load()
			if db == nil {
				return nil // still opening: nothing is deleted before the gate can be asked
			}
			del := tsdb.DefaultBlocksToDelete(db)(blocks)
			for id := range del {
				if !gate(tenantID, id) {
					delete(del, id)
				}
			}
			return del
		}
	}
	heads, err := m.setAside(tenantID, dir)
	if err != nil {
		return nil, err
	}
	reg := &undoRegisterer{Registerer: prometheus.WrapRegistererWith(prometheus.Labels{"tenant": tenantID}, m.reg)}
	start := time.Now()
	tdb, err := m.openTSDB(dir, m.logger.With("tenant", tenantID), reg, opts)
	if err != nil {
		// tsdb.Open registers metrics before it can fail and does not take
		// them back; without this the next attempt would panic on them.
		reg.undo()
		return nil, fmt.Errorf("open tsdb of tenant %q: %w", tenantID, err)
	}
	self.Store(tdb)
	opened.Store(tdb)
	md, err := openMetadataStore(filepath.Join(dir, metadataFile))
	if err != nil {
		_ = tdb.Close()
		reg.undo()
		return nil, fmt.Errorf("open metadata of tenant %q: %w", tenantID, err)
	}
	m.logger.Info("opened tenant database", "tenant", tenantID, "dir", dir, "duration", time.Since(start))
	db := &DB{DB: tdb, Tenant: tenantID, Metadata: md, openedWindow: opts.OutOfOrderTimeWindow, logger: m.logger.With("tenant", tenantID), exemplars: ring, reads: reads, series: series}
	ring.grow = func() error { return m.applyLimits(tenantID, db) }
	db.initSymbols()
	m.recoveries.start(tdb, tenantID, dir, heads, m.asideOptions(opts.OutOfOrderTimeWindow), db.logger)
	return db, nil
}

func openTSDB(dir string, l *slog.Logger, r prometheus.Registerer, opts *tsdb.Options) (*tsdb.DB, error) {
	return tsdb.Open(dir, l, r, opts, nil)
}

// FlushHeads writes every tenant's head into blocks (out-of-order samples
// first, then the in-order head one block range at a time) and truncates the
// WAL: what a receiver does before it leaves the ring for good, so that its
// samples reach the bucket with the shipper's next sync rather than stay in
// a WAL nobody replays. Blocks overlapping later ones are merged by the
// compactor and, until then, by queries.
func (m *Manager) FlushHeads(ctx context.Context) error {
	m.mtx.RLock()
	dbs := make([]*DB, 0, len(m.dbs))
	for _, db := range m.dbs {
		dbs = append(dbs, db)
	}
	m.mtx.RUnlock()
	rng := time.Duration(m.cfg.BlockDuration).Milliseconds()
	var errs []error
	for _, db := range dbs {
		if err := flushHead(ctx, db.DB, rng); err != nil {
			errs = append(errs, fmt.Errorf("flush head of tenant %q: %w", db.Tenant, err))
		}
	}
	return errors.Join(errs...)
}

// flushHead writes db's head into blocks: the out-of-order head first, then
// the in-order head one block range (rng) at a time.
func flushHead(ctx context.Context, db *tsdb.DB, rng int64) error {
	if err := db.CompactOOOHead(ctx); err != nil {
		return err
	}
	h := db.Head()
	if h.NumSeries() == 0 {
		return nil
	}
	mint, maxt := h.MinTime(), h.MaxTime()
	for start := mint - ((mint%rng)+rng)%rng; start <= maxt; start += rng {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := db.CompactHead(tsdb.NewRangeHead(h, max(start, mint), min(start+rng-1, maxt))); err != nil {
			return err
		}
	}
	return nil
}

// FlushMetadata writes every tenant's metadata that changed since the last flush.
func (m *Manager) FlushMetadata() error {
	m.mtx.RLock()
	defer m.mtx.RUnlock()
	var errs []error
	for _, db := range m.dbs {
		if err := db.Metadata.Flush(); err != nil {
			errs = append(errs, fmt.Errorf("flush metadata of tenant %q: %w", db.Tenant, err))
		}
	}
	return errors.Join(errs...)
}

// Close closes every tenant database; later Get calls fail with ErrClosed.
// Opens in flight are waited for and what they opened is closed.
func (m *Manager) Close() error {
	m.mtx.Lock()
	m.closed = true
	inflight := make([]*opening, 0, len(m.opening))
	for _, op := range m.opening {
		inflight = append(inflight, op)
	}
	m.mtx.Unlock()
	for _, op := range inflight {
		<-op.done
	}
	m.recoveries.stop()

	m.mtx.Lock()
	defer m.mtx.Unlock()
	var errs []error
	for t, db := range m.dbs {
		if err := db.Metadata.Flush(); err != nil {
			errs = append(errs, fmt.Errorf("flush metadata of tenant %q: %w", t, err))
		}
		if err := db.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close tsdb of tenant %q: %w", t, err))
		}
	}
	m.dbs = map[string]*DB{}
	return errors.Join(errs...)
}

// undoRegisterer remembers what it registered so that a failed open can
// unregister it.
type undoRegisterer struct {
	prometheus.Registerer
	mtx  sync.Mutex
	done []prometheus.Collector
}

func (r *undoRegisterer) Register(c prometheus.Collector) error {
	if err := r.Registerer.Register(c); err != nil {
		return err
	}
	r.mtx.Lock()
	r.done = append(r.done, c)
	r.mtx.Unlock()
	return nil
}

func (r *undoRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

func (r *undoRegisterer) undo() {
	r.mtx.Lock()
	defer r.mtx.Unlock()
	for _, c := range r.done {
		r.Registerer.Unregister(c)
	}
	r.done = nil
}
