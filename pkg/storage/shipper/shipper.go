// Package shipper uploads every block a tenant's TSDB completes to the bucket,
// under <tenant>/<ULID>/, and keeps the local copy until the upload is
// confirmed.
//
// Guarantees:
//   - A block is uploaded chunks and index first, meta.json last: a reader
//     never sees a half-written block (see pkg/block).
//   - A local block is deleted only when it is past the local retention AND
//     its upload is confirmed (Shipper.MayDelete is the TSDB's deletion gate,
//     installed with tenantdb.Manager.SetDeletionGate). A bucket outage only
//     delays uploads: blocks pile up on local disk and are uploaded, oldest
//     first, when the bucket is back.
//   - What was shipped is remembered across restarts in
//     <tenant dir>/shipper.json. A block whose meta.json is already in the
//     bucket (uploaded by a process that crashed before recording it) is not
//     uploaded again; a block whose upload was cut short (no meta.json, or
//     one that does not parse) is uploaded again whole, overwriting the
//     partial objects.
//   - Failed uploads are retried with exponential backoff per tenant
//     (min_backoff doubling up to max_backoff).
package shipper

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/thanos-io/objstore"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/downsample"
	"github.com/gpustore/gpustore/pkg/tenantdb"
)

// StateFilename is the shipper's record of uploaded blocks in a tenant's directory.
const StateFilename = "shipper.json"

// Config is the shipper's configuration.
type Config struct {
	// Enabled ships blocks; when false local blocks leave by retention alone.
	Enabled bool `yaml:"enabled"`
	// Interval between looks for new blocks.
	Interval model.Duration `yaml:"interval"`
	// MinBackoff and MaxBackoff bound the wait before retrying a tenant whose upload failed.
	MinBackoff model.Duration `yaml:"min_backoff"`
	MaxBackoff model.Duration `yaml:"max_backoff"`
	// ExternalLabels are recorded in every shipped block's meta.json.
	ExternalLabels map[string]string `yaml:"external_labels"`
}

// DefaultConfig ships every 30s, retrying after 1s doubling to 5m.
func DefaultConfig() Config {
	return Config{
		Enabled:    true,
		Interval:   model.Duration(30 * time.Second),
		MinBackoff: model.Duration(time.Second),
		MaxBackoff: model.Duration(5 * time.Minute),
	}
}

// Validate checks the intervals.
func (c Config) Validate() error {
	if c.Interval <= 0 {
		return errors.New("shipper interval must be positive")
	}
	if c.MinBackoff <= 0 || c.MaxBackoff < c.MinBackoff {
		return fmt.Errorf("shipper backoff: want 0 < min_backoff (%s) <= max_backoff (%s)", c.MinBackoff, c.MaxBackoff)
	}
	return nil
}

// Tenants is what the shipper needs of tenantdb.Manager.
type Tenants interface {
	Tenants() []string
	Existing(tenant string) *tenantdb.DB
	TenantDir(tenant string) string
}

// Shipper uploads the blocks of every open tenant database.
type Shipper struct {
	cfg    Config
	bkt    objstore.Bucket
	dbs    Tenants
	logger *slog.Logger
	m      *metrics

	// OnUpload, when set, is called after each confirmed upload (the bucket
	// store uses it to see the block at once).
	OnUpload func(tenant string, meta block.Meta)
	// KeepAfterUpload is how long an uploaded block stays on disk at least
	// (past the local retention too): with the ring, queriers in other
	// processes see a new block only at their next bucket listing, and
	// until then the receiver must still serve it.
	KeepAfterUpload time.Duration

	mtx     sync.Mutex
	tenants map[string]*tenantState
}

type tenantState struct {
	tenant string
	path   string

	syncMtx sync.Mutex // one sync of the tenant at a time

	// Guarded by Shipper.mtx.
	shipped     map[ulid.ULID]time.Time // when the upload was confirmed (zero: before a restart)
	pending     []ulid.ULID             // local blocks not yet shipped, as of the last sync
	backoff     time.Duration
	nextAttempt time.Time
}

// state is the JSON shape of shipper.json.
type state struct {
	Version  int         `json:"version"`
	Uploaded []ulid.ULID `json:"uploaded"`
}

// New returns a shipper; reg receives its metrics.
func New(cfg Config, bkt objstore.Bucket, dbs Tenants, logger *slog.Logger, reg prometheus.Registerer) (*Shipper, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Shipper{cfg: cfg, bkt: bkt, dbs: dbs, logger: logger, tenants: map[string]*tenantState{}}
	s.m = newMetrics(s)
	if reg != nil {
		if err := reg.Register(s.m); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// state returns the tenant's state, reading shipper.json the first time.
// Called with s.mtx held.
func (s *Shipper) stateLocked(tenant string) *tenantState {
	if st, ok := s.tenants[tenant]; ok {
		return st
	}
	st := &tenantState{tenant: tenant, path: filepath.Join(s.dbs.TenantDir(tenant), StateFilename), shipped: map[ulid.ULID]time.Time{}}
	b, err := os.ReadFile(st.path)
	switch {
	case err == nil:
		var f state
		if err := json.Unmarshal(b, &f); err != nil {
			// Losing the record costs one existence check per block, never data.
			s.logger.Warn("ignoring damaged shipper state; blocks are checked against the bucket", "tenant", tenant, "file", st.path, "err", err)
		}
		for _, id := range f.Uploaded {
			st.shipped[id] = time.Time{}
		}
	case !errors.Is(err, os.ErrNotExist):
		s.logger.Warn("read shipper state", "tenant", tenant, "file", st.path, "err", err)
	}
	s.tenants[tenant] = st
	s.m.initTenant(tenant)
	return st
}

// MayDelete is the TSDB's deletion gate (tenantdb.DeletionGate): a block past
// the local retention may go once its upload is confirmed, and
// KeepAfterUpload has passed since.
func (s *Shipper) MayDelete(tenant string, id ulid.ULID) bool {
	s.mtx.Lock()
	defer s.mtx.Unlock()
	at, ok := s.stateLocked(tenant).shipped[id]
	return ok && time.Since(at) >= s.KeepAfterUpload
}

// Shipped reports whether the block's upload is confirmed.
func (s *Shipper) Shipped(tenant string, id ulid.ULID) bool {
	s.mtx.Lock()
	defer s.mtx.Unlock()
	_, ok := s.stateLocked(tenant).shipped[id]
	return ok
}

// Run syncs every Interval until ctx ends (a dskit service's running function).
func (s *Shipper) Run(ctx context.Context) error {
	t := time.NewTicker(time.Duration(s.cfg.Interval))
	defer t.Stop()
	for {
		s.Sync(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Sync uploads the pending blocks of every open tenant whose backoff has
// passed. Errors are logged and counted; they delay, never drop, a block.
func (s *Shipper) Sync(ctx context.Context) {
	for _, t := range s.dbs.Tenants() {
		if ctx.Err() != nil {
			return
		}
		db := s.dbs.Existing(t)
		if db == nil {
			continue
		}
		if err := s.SyncTenant(ctx, t, db.DB, false); err != nil && ctx.Err() == nil {
			s.logger.Warn("block upload failed; will retry", "tenant", t, "err", err)
		}
	}
}

// Flush uploads every tenant's unshipped blocks now, whatever the backoff,
// and returns what failed (a receiver leaving the ring ships all it has).
func (s *Shipper) Flush(ctx context.Context) error {
	var errs []error
	for _, t := range s.dbs.Tenants() {
		if db := s.dbs.Existing(t); db != nil {
			if err := s.SyncTenant(ctx, t, db.DB, true); err != nil {
				errs = append(errs, fmt.Errorf("tenant %q: %w", t, err))
			}
		}
	}
	return errors.Join(errs...)
}

// SyncTenant uploads the tenant's unshipped blocks, oldest first. force
// ignores the backoff. It stops at the first failure.
func (s *Shipper) SyncTenant(ctx context.Context, tenant string, db *tsdb.DB, force bool) error {
	s.mtx.Lock()
	st := s.stateLocked(tenant)
	wait := !force && time.Now().Before(st.nextAttempt)
	s.mtx.Unlock()

	st.syncMtx.Lock()
	defer st.syncMtx.Unlock()

	blocks := slices.Clone(db.Blocks()) // the TSDB's own slice: never sort it in place
	slices.SortFunc(blocks, func(a, b *tsdb.Block) int {
		if c := cmp.Compare(a.Meta().MinTime, b.Meta().MinTime); c != 0 {
			return c
		}
		return a.Meta().ULID.Compare(b.Meta().ULID)
	})
	local := make(map[ulid.ULID]struct{}, len(blocks))
	var pending []*tsdb.Block
	s.mtx.Lock()
	for _, b := range blocks {
		id := b.Meta().ULID
		local[id] = struct{}{}
		if _, ok := st.shipped[id]; !ok {
			pending = append(pending, b)
		}
	}
	// Forget blocks no longer on disk: the TSDB deleted them (only ever after
	// their upload), so the gate will not be asked about them again.
	pruned := false
	for id := range st.shipped {
		if _, ok := local[id]; !ok {
			delete(st.shipped, id)
			pruned = true
		}
	}
	st.pending = st.pending[:0]
	for _, b := range pending {
		st.pending = append(st.pending, b.Meta().ULID)
	}
	s.mtx.Unlock()
	if pruned {
		if err := s.persist(st); err != nil {
			s.logger.Warn("write shipper state", "tenant", tenant, "err", err)
		}
	}
	if wait || len(pending) == 0 {
		return nil
	}

	for _, b := range pending {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := s.ship(ctx, tenant, b); err != nil {
			s.m.failures.WithLabelValues(tenant).Inc()
			s.mtx.Lock()
			st.backoff = min(time.Duration(s.cfg.MaxBackoff), max(time.Duration(s.cfg.MinBackoff), 2*st.backoff))
			st.nextAttempt = time.Now().Add(st.backoff)
			s.mtx.Unlock()
			return fmt.Errorf("block %s: %w", b.Meta().ULID, err)
		}
		s.mtx.Lock()
		st.shipped[b.Meta().ULID] = time.Now()
		st.pending = slices.DeleteFunc(st.pending, func(id ulid.ULID) bool { return id == b.Meta().ULID })
		st.backoff, st.nextAttempt = 0, time.Time{}
		s.mtx.Unlock()
		if err := s.persist(st); err != nil {
			// The upload is done; a restart finds meta.json in the bucket and
			// records it then. Until then the block stays on disk.
			s.logger.Warn("write shipper state", "tenant", tenant, "err", err)
		}
		s.m.lastSuccess.WithLabelValues(tenant).SetToCurrentTime()
	}
	return nil
}

// ship uploads one block unless its meta.json is already in the bucket.
func (s *Shipper) ship(ctx context.Context, tenant string, b *tsdb.Block) error {
	bm := b.Meta()
	meta := block.Meta{
		BlockMeta: bm,
		GPUStore: block.GPUStoreMeta{
			Version:    block.MetaVersion,
			Tenant:     tenant,
			Labels:     s.cfg.ExternalLabels,
			Downsample: block.Downsample{Resolution: block.ResolutionRaw},
			Source:     block.SourceReceive,
		},
	}
	if meta.GPUStore.Labels == nil {
		meta.GPUStore.Labels = map[string]string{}
	}
	// Read, not only stat: a meta.json that does not parse (torn by a crash
	// on a store whose writes were not durable) is no upload, and the local
	// copy is the only whole one.
	switch _, err := block.ReadMeta(ctx, s.bkt, tenant, bm.ULID); {
	case err == nil:
		s.logger.Info("block already in the bucket; recording it as shipped", "tenant", tenant, "block", bm.ULID)
		return nil
	case errors.Is(err, block.ErrBadMeta):
		s.logger.Warn("block's meta.json in the bucket does not parse; uploading the block again", "tenant", tenant, "block", bm.ULID, "err", err)
	case !errors.Is(err, block.ErrNoMeta):
		return fmt.Errorf("check bucket: %w", err)
	}
	start := time.Now()
	files, err := block.LocalFiles(b.Dir())
	if err != nil {
		return err
	}
	types, err := s.types(ctx, tenant, b)
	if err != nil {
		return err
	}
	if err := block.WriteTypes(ctx, s.bkt, tenant, bm.ULID, types); err != nil { // before meta.json
		return err
	}
	if err := block.Upload(ctx, s.bkt, b.Dir(), meta); err != nil {
		return err
	}
	var size int64
	for _, f := range files {
		size += f.SizeBytes
	}
	s.m.uploaded.WithLabelValues(tenant).Inc()
	s.m.uploadedBytes.WithLabelValues(tenant).Add(float64(size))
	s.logger.Info("uploaded block", "tenant", tenant, "block", bm.ULID, "mint", bm.MinTime, "maxt", bm.MaxTime, "bytes", size, "duration", time.Since(start))
	if s.OnUpload != nil {
		meta.GPUStore.Files = files
		s.OnUpload(tenant, meta)
	}
	return nil
}

// types returns the metric types of the families in block b, from the
// tenant's metadata store (what remote write sent): the compactor, which may
// see nothing but the bucket, downsamples counters by them.
func (s *Shipper) types(ctx context.Context, tenant string, b *tsdb.Block) (block.Types, error) {
	db := s.dbs.Existing(tenant)
	if db == nil || db.Metadata == nil {
		return nil, nil
	}
	ir, err := b.Index()
	if err != nil {
		return nil, fmt.Errorf("open index of block %s: %w", b.Meta().ULID, err)
	}
	defer ir.Close()
	names, err := ir.SortedLabelValues(ctx, model.MetricNameLabel, nil)
	if err != nil {
		return nil, fmt.Errorf("metric names of block %s: %w", b.Meta().ULID, err)
	}
	return downsample.TypesOf(names, func(family string) (model.MetricType, bool) {
		m, ok := db.Metadata.Get(family)
		return m.Type, ok
	}), nil
}

// persist writes the tenant's shipper.json atomically.
func (s *Shipper) persist(st *tenantState) error {
	s.mtx.Lock()
	f := state{Version: 1, Uploaded: make([]ulid.ULID, 0, len(st.shipped))}
	for id := range st.shipped {
		f.Uploaded = append(f.Uploaded, id)
	}
	s.mtx.Unlock()
	sort.Slice(f.Uploaded, func(i, j int) bool { return f.Uploaded[i].Compare(f.Uploaded[j]) < 0 })
	b, err := json.MarshalIndent(f, "", "\t")
	if err != nil {
		return err
	}
	tmp := st.path + ".tmp"
	fh, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if _, err := fh.Write(b); err != nil {
		fh.Close()
		return err
	}
	if err := fh.Sync(); err != nil {
		fh.Close()
		return err
	}
	if err := fh.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, st.path); err != nil {
		return err
	}
	if d, err := os.Open(filepath.Dir(st.path)); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}

// Pending returns the tenant's blocks not yet shipped as of the last sync.
func (s *Shipper) Pending(tenant string) []ulid.ULID {
	s.mtx.Lock()
	defer s.mtx.Unlock()
	st, ok := s.tenants[tenant]
	if !ok {
		return nil
	}
	return slices.Clone(st.pending)
}

// metrics exports the shipper's counters and, at scrape time, the pending
// blocks and the age of the oldest one per tenant.
type metrics struct {
	s             *Shipper
	uploaded      *prometheus.CounterVec
	uploadedBytes *prometheus.CounterVec
	failures      *prometheus.CounterVec
	lastSuccess   *prometheus.GaugeVec
	pending       *prometheus.Desc
	oldestAge     *prometheus.Desc
}

func newMetrics(s *Shipper) *metrics {
	return &metrics{
		s: s,
		uploaded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_shipper_uploaded_blocks_total", Help: "Blocks uploaded to the bucket.",
		}, []string{"tenant"}),
		uploadedBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_shipper_uploaded_bytes_total", Help: "Bytes of block files uploaded to the bucket.",
		}, []string{"tenant"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_shipper_upload_failures_total", Help: "Block uploads that failed (and will be retried).",
		}, []string{"tenant"}),
		lastSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpustore_shipper_last_upload_timestamp_seconds", Help: "When the tenant's last block upload was confirmed.",
		}, []string{"tenant"}),
		pending: prometheus.NewDesc("gpustore_shipper_pending_blocks",
			"Local blocks of the tenant not yet uploaded to the bucket.", []string{"tenant"}, nil),
		oldestAge: prometheus.NewDesc("gpustore_shipper_oldest_pending_block_age_seconds",
			"Time since the oldest block of the tenant not yet uploaded was cut (0 when none is pending).", []string{"tenant"}, nil),
	}
}

// initTenant makes the tenant's counters exist at 0 from the first look at
// it: a rate or increase over a counter that appears with its first upload
// failure misses that failure (GpustoreShipperUploadFailing).
func (m *metrics) initTenant(tenant string) {
	m.uploaded.WithLabelValues(tenant)
	m.uploadedBytes.WithLabelValues(tenant)
	m.failures.WithLabelValues(tenant)
}

func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	m.uploaded.Describe(ch)
	m.uploadedBytes.Describe(ch)
	m.failures.Describe(ch)
	m.lastSuccess.Describe(ch)
	ch <- m.pending
	ch <- m.oldestAge
}

func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	m.uploaded.Collect(ch)
	m.uploadedBytes.Collect(ch)
	m.failures.Collect(ch)
	m.lastSuccess.Collect(ch)
	m.s.mtx.Lock()
	defer m.s.mtx.Unlock()
	now := time.Now()
	for t, st := range m.s.tenants {
		ch <- prometheus.MustNewConstMetric(m.pending, prometheus.GaugeValue, float64(len(st.pending)), t)
		age := 0.0
		for _, id := range st.pending {
			// A block's ULID carries the time it was cut.
			if a := now.Sub(ulid.Time(id.Time())).Seconds(); a > age {
				age = a
			}
		}
		ch <- prometheus.MustNewConstMetric(m.oldestAge, prometheus.GaugeValue, age, t)
	}
}

// RegisterFlags binds the shipper's flags.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.BoolVar(&c.Enabled, "shipper.enabled", c.Enabled, "Upload every completed block to the bucket; local blocks past retention are deleted only once uploaded.")
	fs.Var(&c.Interval, "shipper.interval", "How often the shipper looks for blocks to upload.")
	fs.Var(&c.MinBackoff, "shipper.min-backoff", "First wait before retrying a failed upload (doubles per failure).")
	fs.Var(&c.MaxBackoff, "shipper.max-backoff", "Longest wait between retries of a failed upload.")
}
