// Package compact compacts the blocks in the bucket, per tenant, with the
// Prometheus TSDB's own compactor, and enforces the bucket's retention.
//
// A pass over a tenant, under the tenant's lease (one compactor per tenant
// at a time, see BucketLease):
//
//  1. Sync (sync.go): list the tenant's block directories (one recursive
//     listing) and read the meta.json of blocks not seen before (metas
//     never change) and the marks present.
//  2. Clean (clean.go): delete blocks whose deletion mark is older than
//     DeleteDelay (meta.json first, so a reader never sees half a block,
//     the mark last), and directories without meta.json older than
//     PartialDeleteDelay (uploads cut short by a crash).
//  3. Replacement (replaced.go): mark for deletion every block another
//     complete block replaces (bucketindex.Replaced, the rule readers hide
//     blocks by): the sources of a compaction that crashed before marking
//     them, or a duplicate result of two compactors that raced.
//  4. Retention (retention.go): mark for deletion the blocks wholly past
//     their resolution's retention (a raw block only once its samples are
//     downsampled to 5m).
//  5. Group compaction (group.go), per compaction group (resolution +
//     external labels), repeatedly: Plan (plan.go); download the planned
//     blocks into the working directory (download.go); compact them with
//     tsdb.LeveledCompactor and the compacting chunk-series merger (vertical
//     compaction: overlapping samples are merged, identical ones kept once);
//     upload the result with its meta (result.go; pkg/block.Upload:
//     meta.json last); mark the sources for deletion; remove the working
//     files.
//  6. Downsample (downsample.go): raw blocks to 5m and 5m blocks to 1h,
//     once each is finished; raw retention waits for the 5m data.
//  7. Write the tenant's bucket index (pkg/storage/bucketindex; pass.go), which
//     bucket stores sync from instead of listing the tenant.
//
// Every step is safe to interrupt: before the result's meta.json is
// written, the result is a partial directory readers ignore (cleaned up by
// step 2 later); after it and before the marks, step 3 of the next pass
// marks the sources; marks are idempotent and keep their first time, and
// deletion resumes from whatever is left. Queries read either the sources or
// the result, or both while both are visible: the bucket store merges
// identical samples, so an answer never changes.
//
// A block that fails to read (a missing object, a corrupt index or chunk)
// gets a no-compact mark with the reason and stays for queries; the rest of
// its group compacts without it.
package compact

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/grafana/dskit/tenant"
	"github.com/oklog/ulid/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/thanos-io/objstore"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/downsample"
	"github.com/gpustore/gpustore/pkg/storage/bucketindex"
)

// Limits gives a tenant's retention overrides per resolution (0: the
// configured default). They are asked at every pass, so a reloaded
// overrides file applies from the next pass on.
type Limits interface {
	CompactorRetentionRaw(tenant string) time.Duration
	CompactorRetention5m(tenant string) time.Duration
	CompactorRetention1h(tenant string) time.Duration
}

// Compactor compacts every tenant of a bucket.
type Compactor struct {
	cfg    Config
	bkt    objstore.Bucket
	lease  *BucketLease
	limits Limits
	logger *slog.Logger
	m      *metrics
	dir    string
	now    func() time.Time
	fold   *downsample.Fold // labels merged away at downsampling (nil: none)
	// encoding and rawEncoding: how downsampled blocks' files and the raw
	// blocks the compactor writes are stored (block.Encoding*).
	encoding, rawEncoding block.Encodings

	// afterCompact is a test hook: called with the plan's working directory
	// when the result is written, before anything is removed.
	afterCompact func(dir string)

	mtx     sync.Mutex
	metas   map[string]map[ulid.ULID]*block.Meta // per tenant; metas never change
	indexes map[string]*bucketindex.Index        // per tenant: the last index written
	empty   map[ulid.ULID]struct{}               // blocks whose downsampling wrote nothing
}

// New returns a compactor over bkt working in cfg.DataDir (or
// <dataDir>/compact). limits may be nil.
func New(cfg Config, bkt objstore.Bucket, dataDir string, limits Limits, logger *slog.Logger, reg prometheus.Registerer) (*Compactor, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	dir := cfg.DataDir
	if dir == "" {
		dir = filepath.Join(dataDir, "compact")
	}
	c := &Compactor{
		cfg: cfg, bkt: bkt, limits: limits, logger: logger, dir: dir, now: time.Now,
		lease:   NewBucketLease(bkt, "", time.Duration(cfg.LeaseTTL), time.Duration(cfg.LeaseSettle)),
		metas:   map[string]map[ulid.ULID]*block.Meta{},
		indexes: map[string]*bucketindex.Index{},
		empty:   map[ulid.ULID]struct{}{},
	}
	c.fold, _ = cfg.fold()                               // validated
	ds, _ := block.ParseEncoding(cfg.DownsampleEncoding) // validated
	raw, _ := block.ParseEncoding(cfg.RawEncoding)
	rawIndex, _ := block.ParseEncoding(cfg.RawIndexEncoding)
	c.encoding, c.rawEncoding = block.Uniform(ds), block.Encodings{Chunks: raw, Index: rawIndex}
	c.m = newMetrics(reg)
	return c, nil
}

// Dir is the working directory.
func (c *Compactor) Dir() string { return c.dir }

// Start empties the working directory: what a killed compactor left there
// is never reused.
func (c *Compactor) Start(context.Context) error {
	if err := os.RemoveAll(c.dir); err != nil {
		return fmt.Errorf("clean compactor working directory: %w", err)
	}
	return os.MkdirAll(c.dir, 0o755)
}

// Run compacts every tenant every Interval until ctx ends (a dskit
// service's running function). Failures are logged and retried next pass.
func (c *Compactor) Run(ctx context.Context) error {
	t := time.NewTicker(time.Duration(c.cfg.Interval))
	defer t.Stop()
	for {
		if err := c.CompactAll(ctx); err != nil && ctx.Err() == nil {
			c.logger.Warn("compaction pass failed; retrying next pass", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Tenants lists the tenants with a directory in the bucket.
func (c *Compactor) Tenants(ctx context.Context) ([]string, error) {
	var out []string
	err := c.bkt.Iter(ctx, "", func(name string) error {
		if t, ok := strings.CutSuffix(name, "/"); ok && tenant.ValidTenantID(t) == nil {
			out = append(out, t)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list tenants in bucket: %w", err)
	}
	sort.Strings(out)
	return out, nil
}

// CompactAll runs one pass over every tenant.
func (c *Compactor) CompactAll(ctx context.Context) error {
	tenants, err := c.Tenants(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, t := range tenants {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err := c.CompactTenant(ctx, t); err != nil {
			errs = append(errs, fmt.Errorf("tenant %q: %w", t, err))
		}
	}
	return errors.Join(errs...)
}

// CompactTenant runs one pass over a tenant, unless another compactor holds
// its lease (then it returns nil at once).
func (c *Compactor) CompactTenant(ctx context.Context, tenantID string) error {
	held, err := c.lease.Acquire(ctx, tenantID)
	if err != nil {
		c.m.lastPassFailed.WithLabelValues(tenantID).Set(1)
		return err
	}
	if held == nil {
		c.m.leaseBusy.WithLabelValues(tenantID).Inc()
		c.logger.Debug("another compactor holds the tenant's lease", "tenant", tenantID)
		return nil
	}
	ctx, cancel := context.WithCancelCause(ctx)
	renewing := make(chan struct{})
	go func() {
		defer close(renewing)
		held.KeepAlive(ctx, func(err error) {
			c.logger.Warn("compactor lease lost; stopping the tenant's pass", "tenant", tenantID, "err", err)
			cancel(fmt.Errorf("%w: %v", ErrLeaseLost, err))
		})
	}()
	defer func() {
		// Stop renewing before releasing, or a late renewal writes the lease again.
		cancel(nil)
		<-renewing
		rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer rcancel()
		if err := held.Release(rctx); err != nil {
			c.logger.Warn("release compactor lease", "tenant", tenantID, "err", err)
		}
	}()

	start := c.now()
	p := &pass{c: c, tenant: tenantID, held: held, logger: c.logger.With("tenant", tenantID)}
	err = p.run(ctx)
	if cause := context.Cause(ctx); err != nil && cause != nil && !errors.Is(cause, context.Canceled) {
		err = fmt.Errorf("%w (%v)", err, cause)
	}
	c.m.passDuration.Observe(time.Since(start).Seconds())
	if err != nil {
		c.m.lastPassFailed.WithLabelValues(tenantID).Set(1)
		c.m.failures.WithLabelValues(tenantID).Inc()
		return err
	}
	c.m.lastPassFailed.WithLabelValues(tenantID).Set(0)
	c.m.lastSuccess.WithLabelValues(tenantID).Set(float64(c.now().UnixNano()) / 1e9)
	return nil
}
