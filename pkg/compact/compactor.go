// Package compact compacts the blocks in the bucket, per tenant, with the
// Prometheus TSDB's own compactor, and enforces the bucket's retention.
//
// A pass over a tenant, under the tenant's lease (one compactor per tenant
// at a time, see BucketLease):
//
//  1. List the tenant's block directories (one recursive listing) and read
//     the meta.json of blocks not seen before (metas never change) and the
//     marks present.
//  2. Delete blocks whose deletion mark is older than DeleteDelay (meta.json
//     first, so a reader never sees half a block, the mark last), and
//     directories without meta.json older than PartialDeleteDelay (uploads
//     cut short by a crash).
//  3. Mark for deletion every block whose sources (meta.json's
//     compaction.sources) another complete block holds: the result of a
//     compaction that crashed before marking its sources, or a duplicate
//     result of two compactors that raced.
//  4. Mark for deletion the blocks wholly past their resolution's retention
//     (a raw block only once its samples are downsampled to 5m).
//  5. Per group (resolution + external labels), repeatedly: Plan; download
//     the planned blocks into the working directory; compact them with
//     tsdb.LeveledCompactor and the compacting chunk-series merger (vertical
//     compaction: overlapping samples are merged, identical ones kept once);
//     upload the result (pkg/block.Upload: meta.json last); mark the sources
//     for deletion; remove the working files.
//  6. Downsample (downsample.go): raw blocks to 5m and 5m blocks to 1h,
//     once each is finished; raw retention waits for the 5m data.
//  7. Write the tenant's bucket index (pkg/bucketindex), which bucket
//     stores sync from instead of listing the tenant.
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
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/grafana/dskit/tenant"
	"github.com/oklog/ulid/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/tsdb/index"
	"github.com/thanos-io/objstore"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/bucketindex"
	"github.com/gpustore/gpustore/pkg/downsample"
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
	// encoding is how downsampled blocks' files are stored (block.Encoding*).
	encoding string

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
	c.fold, _ = cfg.fold() // validated
	c.encoding, _ = block.ParseEncoding(cfg.DownsampleEncoding)
	c.m = newMetrics()
	if reg != nil {
		if err := reg.Register(c.m); err != nil {
			return nil, err
		}
	}
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
		c.m.halted.WithLabelValues(tenantID).Set(1)
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
		c.m.halted.WithLabelValues(tenantID).Set(1)
		c.m.failures.WithLabelValues(tenantID).Inc()
		return err
	}
	c.m.halted.WithLabelValues(tenantID).Set(0)
	c.m.lastSuccess.WithLabelValues(tenantID).Set(float64(c.now().UnixNano()) / 1e9)
	return nil
}

// blockState is one block directory of the tenant as listed.
type blockState struct {
	id        ulid.ULID
	meta      *block.Meta // nil: no (readable) meta.json
	deletion  *block.DeletionMark
	noCompact bool
	objects   []string // every object of the directory
	hasMeta   bool
}

func (b *blockState) live() bool { return b.meta != nil && b.deletion == nil }

// pass is one tenant's pass.
type pass struct {
	c      *Compactor
	tenant string
	held   *Held
	logger *slog.Logger
	blocks map[ulid.ULID]*blockState
	cov    map[string]map[ulid.ULID]struct{} // per resolution and group labels: sources covered (mayDelete's memo)
}

func (p *pass) run(ctx context.Context) error {
	if err := p.sync(ctx); err != nil {
		return err
	}
	if err := p.deleteMarked(ctx); err != nil {
		return err
	}
	if changed, err := p.applyDeletions(ctx); err != nil { // deletions.go
		return err
	} else if changed {
		if err := p.sync(ctx); err != nil {
			return err
		}
	}
	if err := p.markReplaced(ctx); err != nil {
		return err
	}
	if err := p.applyRetention(ctx); err != nil {
		return err
	}
	if err := p.compactGroups(ctx); err != nil {
		return err
	}
	if err := p.downsampleAll(ctx); err != nil {
		return err
	}
	p.updateGauges()
	return p.writeIndex(ctx)
}

// writeIndex writes the tenant's bucket index, so that bucket stores learn
// the blocks and marks from one object instead of listing the tenant and
// reading every meta.json. Metas and marks of the previous index are reused.
func (p *pass) writeIndex(ctx context.Context) error {
	p.c.mtx.Lock()
	old := p.c.indexes[p.tenant]
	p.c.mtx.Unlock()
	x, err := bucketindex.Update(ctx, p.c.bkt, p.tenant, old)
	if err != nil {
		return err
	}
	if err := p.held.Check(ctx); err != nil {
		return err
	}
	if err := bucketindex.Write(ctx, p.c.bkt, x); err != nil {
		return err
	}
	p.c.mtx.Lock()
	p.c.indexes[p.tenant] = x
	p.c.mtx.Unlock()
	p.c.m.indexBlocks.WithLabelValues(p.tenant).Set(float64(len(x.Blocks)))
	return nil
}

// sync lists the tenant's block directories with one recursive listing and
// reads what changed: metas of new blocks and marks.
func (p *pass) sync(ctx context.Context) error {
	p.blocks = map[ulid.ULID]*blockState{}
	err := p.c.bkt.Iter(ctx, p.tenant+"/", func(name string) error {
		rest := strings.TrimPrefix(name, p.tenant+"/")
		dir, file, ok := strings.Cut(rest, "/")
		if !ok || file == "" {
			return nil
		}
		id, err := ulid.ParseStrict(dir)
		if err != nil {
			return nil
		}
		b := p.blocks[id]
		if b == nil {
			b = &blockState{id: id}
			p.blocks[id] = b
		}
		b.objects = append(b.objects, name)
		switch file {
		case block.MetaFilename:
			b.hasMeta = true
		case block.NoCompactMarkFilename:
			b.noCompact = true
		}
		return nil
	}, objstore.WithRecursiveIter())
	if err != nil {
		return fmt.Errorf("list blocks: %w", err)
	}
	p.c.mtx.Lock()
	cache := p.c.metas[p.tenant]
	if cache == nil {
		cache = map[ulid.ULID]*block.Meta{}
		p.c.metas[p.tenant] = cache
	}
	p.c.mtx.Unlock()
	bad := map[string]int{}
	for id, b := range p.blocks {
		if slices.Contains(b.objects, block.ObjectName(p.tenant, id, block.DeletionMarkFilename)) {
			m, err := block.ReadDeletionMark(ctx, p.c.bkt, p.tenant, id)
			switch {
			case errors.Is(err, block.ErrBadMark):
				// Torn: as if absent. If the block is still to go, this
				// pass marks it again (replacing the torn mark); until
				// then it is a live block like any other.
				p.logger.Warn("deletion mark does not parse; treated as absent", "block", id, "err", err)
				bad[block.DeletionMarkFilename]++
			case err != nil:
				return err
			case m == nil: // deleted since the listing
				b.deletion = &block.DeletionMark{ID: id, DeletionTime: p.c.now().Unix()}
			default:
				b.deletion = m
			}
		}
		if !b.hasMeta {
			continue
		}
		p.c.mtx.Lock()
		m := cache[id]
		p.c.mtx.Unlock()
		if m == nil {
			var err error
			m, err = block.ReadMeta(ctx, p.c.bkt, p.tenant, id)
			switch {
			case errors.Is(err, block.ErrNoMeta): // deleted since the listing
				b.hasMeta = false
				continue
			case errors.Is(err, block.ErrBadMeta):
				// Neither queries nor the compactor can read the block. It
				// is left as it is, not marked: a receiver whose local copy
				// is whole uploads meta.json again (pkg/shipper), and then
				// the block is compacted like the others.
				p.logger.Error("meta.json does not parse: block left alone", "block", id, "err", err)
				bad[block.MetaFilename]++
				continue
			case err != nil:
				return err
			}
			p.c.mtx.Lock()
			cache[id] = m
			p.c.mtx.Unlock()
		}
		b.meta = m
	}
	for _, f := range []string{block.MetaFilename, block.DeletionMarkFilename} {
		p.c.m.badFiles.WithLabelValues(p.tenant, f).Set(float64(bad[f]))
	}
	// Forget metas of blocks gone from the bucket.
	p.c.mtx.Lock()
	for id := range cache {
		if _, ok := p.blocks[id]; !ok {
			delete(cache, id)
		}
	}
	p.c.mtx.Unlock()
	return nil
}

// deleteMarked deletes blocks marked for deletion longer than DeleteDelay
// ago and partial directories older than PartialDeleteDelay.
func (p *pass) deleteMarked(ctx context.Context) error {
	now := p.c.now()
	for _, id := range p.sortedIDs() {
		b := p.blocks[id]
		switch {
		case b.deletion != nil:
			if now.Sub(time.Unix(b.deletion.DeletionTime, 0)) < time.Duration(p.c.cfg.DeleteDelay) {
				continue
			}
		case !b.hasMeta:
			old, err := p.allOlderThan(ctx, b, now.Add(-time.Duration(p.c.cfg.PartialDeleteDelay)))
			if err != nil {
				return err
			}
			if !old {
				continue
			}
		default:
			continue
		}
		if err := p.held.Check(ctx); err != nil {
			return err
		}
		if err := p.deleteBlock(ctx, b); err != nil {
			return err
		}
		reason := "marked"
		if !b.hasMeta && b.deletion == nil {
			reason = "partial"
		}
		p.c.m.deleted.WithLabelValues(p.tenant, reason).Inc()
		p.logger.Info("deleted block", "block", id, "why", reason)
		delete(p.blocks, id)
	}
	return nil
}

// allOlderThan reports whether every object of a partial block was last
// modified before t.
func (p *pass) allOlderThan(ctx context.Context, b *blockState, t time.Time) (bool, error) {
	if t.Before(ulid.Time(b.id.Time())) {
		return false, nil // the block itself is younger
	}
	for _, o := range b.objects {
		a, err := block.ExpectMissing(p.c.bkt).Attributes(ctx, o) // a partial block's objects may go meanwhile
		if err != nil {
			if p.c.bkt.IsObjNotFoundErr(err) {
				continue
			}
			return false, fmt.Errorf("attributes of %s: %w", o, err)
		}
		if a.LastModified.After(t) {
			return false, nil
		}
	}
	return true, nil
}

// deleteBlock deletes meta.json first (the block stops being a block for
// every reader), then the data, then the marks.
func (p *pass) deleteBlock(ctx context.Context, b *blockState) error {
	objs := slices.Clone(b.objects)
	rank := func(o string) int {
		switch {
		case strings.HasSuffix(o, "/"+block.MetaFilename):
			return 0
		case strings.HasSuffix(o, "/"+block.DeletionMarkFilename), strings.HasSuffix(o, "/"+block.NoCompactMarkFilename):
			return 2
		}
		return 1
	}
	slices.SortStableFunc(objs, func(a, b string) int { return rank(a) - rank(b) })
	for _, o := range objs {
		if err := p.c.bkt.Delete(ctx, o); err != nil && !p.c.bkt.IsObjNotFoundErr(err) {
			return fmt.Errorf("delete %s: %w", o, err)
		}
	}
	return nil
}

// markReplaced marks for deletion each complete block whose sources another
// complete, unmarked block of its group (resolution and labels) holds (with
// more sources, or the same sources and a smaller ULID: of two identical
// results the older stays).
func (p *pass) markReplaced(ctx context.Context) error {
	bySource := map[ulid.ULID][]*blockState{}
	for _, b := range p.blocks {
		if b.live() {
			for _, s := range sources(b.meta) {
				bySource[s] = append(bySource[s], b)
			}
		}
	}
	for _, id := range p.sortedIDs() {
		b := p.blocks[id]
		if !b.live() {
			continue
		}
		src := sources(b.meta)
		for _, a := range bySource[src[0]] {
			if a == b || !a.live() {
				continue
			}
			if GroupKey(a.meta) != GroupKey(b.meta) {
				continue // a downsampled block has its raw block's sources, and replaces nothing
			}
			as := sources(a.meta)
			if len(as) < len(src) || (len(as) == len(src) && a.id.Compare(b.id) > 0) || !containsAll(as, src) {
				continue
			}
			if err := p.markDeleted(ctx, b, "replaced", fmt.Sprintf("replaced by %s", a.id)); err != nil {
				return err
			}
			break
		}
	}
	return nil
}

// sources are a block's compaction sources (itself for a block that never
// was compacted).
func sources(m *block.Meta) []ulid.ULID {
	if len(m.Compaction.Sources) == 0 {
		return []ulid.ULID{m.ULID}
	}
	return m.Compaction.Sources
}

// sourceRanges are the sources' time ranges of the blocks in plan, once
// each (nil when a block's are unknown): the result's own sources.
func sourceRanges(plan []*block.Meta) []block.SourceRange {
	var out []block.SourceRange
	seen := map[ulid.ULID]bool{}
	for _, m := range plan {
		rs := m.Sources()
		if rs == nil {
			return nil
		}
		for _, r := range rs {
			if !seen[r.ULID] {
				seen[r.ULID] = true
				out = append(out, r)
			}
		}
	}
	slices.SortFunc(out, func(a, b block.SourceRange) int { return a.ULID.Compare(b.ULID) })
	return out
}

func containsAll(super, sub []ulid.ULID) bool {
	set := make(map[ulid.ULID]struct{}, len(super))
	for _, s := range super {
		set[s] = struct{}{}
	}
	for _, s := range sub {
		if _, ok := set[s]; !ok {
			return false
		}
	}
	return true
}

// retention returns how long blocks of a resolution are kept (0: forever):
// the tenant's override, else the configured default.
func (p *pass) retention(res int64) time.Duration {
	var override func(string) time.Duration
	var def model.Duration
	switch res {
	case block.ResolutionRaw:
		def = p.c.cfg.RetentionRaw
		if p.c.limits != nil {
			override = p.c.limits.CompactorRetentionRaw
		}
	case downsample.Res5m:
		def = p.c.cfg.Retention5m
		if p.c.limits != nil {
			override = p.c.limits.CompactorRetention5m
		}
	case downsample.Res1h:
		def = p.c.cfg.Retention1h
		if p.c.limits != nil {
			override = p.c.limits.CompactorRetention1h
		}
	default:
		return 0
	}
	if override != nil {
		if d := override(p.tenant); d > 0 {
			return d
		}
	}
	return time.Duration(def)
}

// applyRetention marks the blocks wholly older than their resolution's
// retention for deletion.
func (p *pass) applyRetention(ctx context.Context) error {
	now := p.c.now()
	for _, id := range p.sortedIDs() {
		b := p.blocks[id]
		if !b.live() {
			continue
		}
		res := b.meta.GPUStore.Downsample.Resolution
		r := p.retention(res)
		if r <= 0 || b.meta.MaxTime > now.Add(-r).UnixMilli() {
			continue
		}
		if !p.mayDelete(b.meta) {
			continue
		}
		if err := p.markDeleted(ctx, b, "retention", fmt.Sprintf("retention %s", shortDuration(r))); err != nil {
			return err
		}
	}
	return nil
}

func (p *pass) markDeleted(ctx context.Context, b *blockState, reason, details string) error {
	if err := p.held.Check(ctx); err != nil {
		return err
	}
	now := p.c.now()
	if err := block.WriteDeletionMark(ctx, p.c.bkt, p.tenant, b.id, details, now); err != nil {
		return fmt.Errorf("mark block %s for deletion: %w", b.id, err)
	}
	b.deletion = &block.DeletionMark{ID: b.id, Version: block.MarkVersion, Details: details, DeletionTime: now.Unix()}
	b.objects = append(b.objects, block.ObjectName(p.tenant, b.id, block.DeletionMarkFilename))
	p.c.m.deletionMarks.WithLabelValues(p.tenant, reason).Inc()
	p.logger.Info("marked block for deletion", "block", b.id, "why", details)
	return nil
}

func (p *pass) markNoCompact(ctx context.Context, id ulid.ULID, reason string, cause error) error {
	if err := p.held.Check(ctx); err != nil {
		return err
	}
	if err := block.WriteNoCompactMark(ctx, p.c.bkt, p.tenant, id, reason, cause.Error(), p.c.now()); err != nil {
		return fmt.Errorf("mark block %s no-compact: %w", id, err)
	}
	if b := p.blocks[id]; b != nil {
		b.noCompact = true
		b.objects = append(b.objects, block.ObjectName(p.tenant, id, block.NoCompactMarkFilename))
	}
	p.c.m.noCompactMarks.WithLabelValues(p.tenant, reason).Inc()
	p.logger.Error("block fails to read: marked no-compact, left for queries", "block", id, "reason", reason, "err", cause)
	return nil
}

func (p *pass) sortedIDs() []ulid.ULID {
	ids := make([]ulid.ULID, 0, len(p.blocks))
	for id := range p.blocks {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b ulid.ULID) int { return a.Compare(b) })
	return ids
}

// groups returns the compactable blocks per group.
func (p *pass) groups() map[string][]*block.Meta {
	out := map[string][]*block.Meta{}
	for _, b := range p.blocks {
		if b.live() && !b.noCompact {
			k := GroupKey(b.meta)
			out[k] = append(out[k], b.meta)
		}
	}
	return out
}

func (p *pass) updateGauges() {
	groups, noCompact := 0, 0
	for range p.groups() {
		groups++
	}
	for _, b := range p.blocks {
		if b.noCompact && b.deletion == nil {
			noCompact++
		}
	}
	p.c.m.groups.WithLabelValues(p.tenant).Set(float64(groups))
	p.c.m.noCompactBlocks.WithLabelValues(p.tenant).Set(float64(noCompact))
}

// compactGroups compacts each group until its plan is empty.
func (p *pass) compactGroups(ctx context.Context) error {
	groups := p.groups()
	keys := make([]string, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	ranges := p.c.cfg.ranges()
	for _, k := range keys {
		start := time.Now()
		done := 0
		for {
			if err := ctx.Err(); err != nil {
				return err
			}
			plan := Plan(p.groups()[k], ranges)
			if plan == nil {
				break
			}
			if err := p.compactPlan(ctx, k, plan); err != nil {
				var bad *badBlocksError
				if errors.As(err, &bad) {
					continue // marked no-compact; plan again without them
				}
				return fmt.Errorf("group %s: %w", k, err)
			}
			done++
		}
		if done > 0 {
			p.logger.Info("group compacted", "group", k, "compactions", done, "duration", time.Since(start).Round(time.Millisecond))
		}
	}
	return nil
}

// badBlocksError says a plan's blocks failed to read and were marked no-compact.
type badBlocksError struct{ ids []ulid.ULID }

func (e *badBlocksError) Error() string { return fmt.Sprintf("blocks %v fail to read", e.ids) }

// compactPlan compacts the planned blocks of a group into one block in the
// bucket and marks them for deletion.
func (p *pass) compactPlan(ctx context.Context, group string, plan []*block.Meta) error {
	start := time.Now()
	work := filepath.Join(p.c.dir, p.tenant)
	if err := os.RemoveAll(work); err != nil {
		return err
	}
	if err := os.MkdirAll(work, 0o755); err != nil {
		return err
	}
	defer os.RemoveAll(work)

	ids := make([]ulid.ULID, len(plan))
	var srcBytes int64
	for i, m := range plan {
		ids[i] = m.ULID
		srcBytes += m.BucketBytes()
	}
	mint, maxt := plan[0].MinTime, plan[0].MaxTime
	for _, m := range plan {
		mint, maxt = min(mint, m.MinTime), max(maxt, m.MaxTime)
	}
	log := p.logger.With("group", group, "blocks", len(plan), "mint", time.UnixMilli(mint).UTC().Format(time.RFC3339), "maxt", time.UnixMilli(maxt).UTC().Format(time.RFC3339))
	log.Info("compacting", "sources", ids, "bytes", srcBytes)

	dirs := make([]string, len(plan))
	var bad []ulid.ULID
	for i, m := range plan {
		dirs[i] = filepath.Join(work, m.ULID.String())
		if err := p.download(ctx, m, dirs[i]); err != nil {
			if !errors.Is(err, errBlockUnreadable) {
				return err
			}
			if err := p.markNoCompact(ctx, m.ULID, "missing-object", err); err != nil {
				return err
			}
			bad = append(bad, m.ULID)
		}
	}
	if len(bad) > 0 {
		return &badBlocksError{ids: bad}
	}

	lc, err := tsdb.NewLeveledCompactorWithOptions(ctx, nil, p.logger, p.c.cfg.ranges(), chunkenc.NewPool(), tsdb.LeveledCompactorOptions{
		MergeFunc:                   storage.NewCompactingChunkSeriesMerger(storage.ChainedSeriesMerge),
		EnableOverlappingCompaction: true,
	})
	if err != nil {
		return err
	}
	stopProgress := p.progress(log, start)
	res, err := lc.Compact(work, dirs, nil)
	stopProgress()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// Which block is at fault? Read each one whole; a block that fails
		// is marked no-compact and the group goes on without it.
		for i, d := range dirs {
			if verr := verifyBlock(d); verr != nil {
				if err := p.markNoCompact(ctx, plan[i].ULID, "block-read-failure", verr); err != nil {
					return err
				}
				bad = append(bad, plan[i].ULID)
			}
		}
		if len(bad) > 0 {
			return &badBlocksError{ids: bad}
		}
		return fmt.Errorf("compact %v: %w", ids, err)
	}
	if p.c.afterCompact != nil {
		p.c.afterCompact(work)
	}
	if len(res) == 0 { // no samples at all: nothing replaces them
		for _, m := range plan {
			if err := p.markDeleted(ctx, p.blocks[m.ULID], "compacted", "compacted: no samples"); err != nil {
				return err
			}
		}
		return nil
	}
	first := plan[0].GPUStore
	ds := block.Downsample{Resolution: first.Downsample.Resolution, KeptCounts: first.Downsample.Resolution != block.ResolutionRaw}
	for _, m := range plan { // a folded block merged with others: the result is folded
		ds.FoldedLabels = append(ds.FoldedLabels, m.GPUStore.Downsample.FoldedLabels...)
		ds.KeptCounts = ds.KeptCounts && m.GPUStore.Downsample.KeptCounts // so are its counts
	}
	slices.Sort(ds.FoldedLabels)
	ds.FoldedLabels = slices.Compact(ds.FoldedLabels)
	types, err := p.typesOf(ctx, plan)
	if err != nil {
		return err
	}
	meta, resBytes, err := p.uploadResult(ctx, filepath.Join(work, res[0].String()), first.Labels, ds, block.SourceCompactor, sourceRanges(plan), types)
	if err != nil {
		return err
	}
	bm := meta.BlockMeta
	for _, m := range plan {
		if err := p.markDeleted(ctx, p.blocks[m.ULID], "compacted", fmt.Sprintf("compacted into %s", bm.ULID)); err != nil {
			return err
		}
	}
	took := time.Since(start)
	p.c.m.compactions.WithLabelValues(p.tenant).Inc()
	p.c.m.compactedBlocks.WithLabelValues(p.tenant).Add(float64(len(plan)))
	p.c.m.readBytes.WithLabelValues(p.tenant).Add(float64(srcBytes))
	p.c.m.writtenBytes.WithLabelValues(p.tenant).Add(float64(resBytes))
	p.c.m.samples.WithLabelValues(p.tenant).Add(float64(bm.Stats.NumSamples))
	p.c.m.duration.Observe(took.Seconds())
	log.Info("compacted", "block", bm.ULID, "level", bm.Compaction.Level, "samples", bm.Stats.NumSamples, "series", bm.Stats.NumSeries, "bytes", resBytes, "duration", took.Round(time.Millisecond))
	return nil
}

// uploadResult uploads a block the pass wrote into dir (a compaction's or a
// downsampling's result; its metric types, then its files, meta.json last)
// with the group's labels, the given resolution and source, and records it
// in the pass. It returns the meta and the block's bytes.
func (p *pass) uploadResult(ctx context.Context, dir string, labels map[string]string, ds block.Downsample, source string, ranges []block.SourceRange, types block.Types) (*block.Meta, int64, error) {
	bm, err := block.ReadLocalMeta(dir)
	if err != nil {
		return nil, 0, err
	}
	if labels == nil {
		labels = map[string]string{}
	}
	meta := &block.Meta{BlockMeta: bm, GPUStore: block.GPUStoreMeta{
		Version: block.MetaVersion, Tenant: p.tenant, Labels: labels,
		Downsample: ds, Source: source, SourceRanges: ranges,
	}}
	if err := p.held.Check(ctx); err != nil {
		return nil, 0, err
	}
	if err := block.WriteTypes(ctx, p.c.bkt, p.tenant, bm.ULID, types); err != nil {
		return nil, 0, err
	}
	encoding := block.EncodingNone
	if ds.Resolution != block.ResolutionRaw {
		encoding = p.c.encoding
	}
	if err := block.UploadEncoded(ctx, p.c.bkt, dir, meta, encoding); err != nil {
		return nil, 0, fmt.Errorf("upload %s block %s: %w", source, bm.ULID, err)
	}
	size := meta.BucketBytes()
	p.blocks[bm.ULID] = &blockState{id: bm.ULID, meta: meta, hasMeta: true}
	p.cov = nil // the new block may cover more
	p.c.mtx.Lock()
	p.c.metas[p.tenant][bm.ULID] = meta
	p.c.mtx.Unlock()
	return meta, size, nil
}

// typesOf returns the union of the blocks' metric types (pkg/block.Types),
// the newest block's where they differ. A types object that does not parse
// is left out: its block's metrics are typed by name.
func (p *pass) typesOf(ctx context.Context, metas []*block.Meta) (block.Types, error) {
	byAge := slices.SortedFunc(slices.Values(metas), func(a, b *block.Meta) int {
		return cmp.Or(cmp.Compare(a.MaxTime, b.MaxTime), a.ULID.Compare(b.ULID))
	})
	var out block.Types
	for _, m := range byAge {
		t, err := block.ReadTypes(ctx, p.c.bkt, p.tenant, m.ULID)
		if errors.Is(err, block.ErrBadTypes) {
			p.logger.Warn("metric types of block do not parse; its metrics are typed by name", "block", m.ULID, "err", err)
			continue
		}
		if err != nil {
			return nil, err
		}
		out = out.Merge(t)
	}
	return out, nil
}

// progress logs every 30s while a compaction runs.
func (p *pass) progress(log *slog.Logger, start time.Time) func() {
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(30 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				log.Info("compaction in progress", "elapsed", time.Since(start).Round(time.Second))
			}
		}
	}()
	return func() { close(done) }
}

// errBlockUnreadable marks download errors that are the block's fault.
var errBlockUnreadable = errors.New("block unreadable")

// download copies a block's files and its TSDB meta.json into dir.
func (p *pass) download(ctx context.Context, m *block.Meta, dir string) error {
	return block.Download(ctx, p.c.bkt, m, dir, errBlockUnreadable)
}

// verifyBlock reads a local block whole: every series of the index and
// every sample of its chunks. It returns the first read error.
func verifyBlock(dir string) (err error) {
	defer func() {
		if r := recover(); r != nil { // a corrupt block must not take the process down
			err = fmt.Errorf("reading block panicked: %v", r)
		}
	}()
	b, err := tsdb.OpenBlock(nil, dir, nil, nil)
	if err != nil {
		return err
	}
	defer b.Close()
	ir, err := b.Index()
	if err != nil {
		return err
	}
	defer ir.Close()
	cr, err := b.Chunks()
	if err != nil {
		return err
	}
	defer cr.Close()
	name, value := index.AllPostingsKey()
	ps, err := ir.Postings(context.Background(), name, value)
	if err != nil {
		return err
	}
	var (
		sb   labels.ScratchBuilder
		chks []chunks.Meta
		it   chunkenc.Iterator
	)
	for ps.Next() {
		if err := ir.Series(ps.At(), &sb, &chks); err != nil {
			return fmt.Errorf("series %d: %w", ps.At(), err)
		}
		for _, cm := range chks {
			c, iter, err := cr.ChunkOrIterable(cm)
			if err != nil {
				return fmt.Errorf("chunk of series %s: %w", sb.Labels(), err)
			}
			if c != nil {
				it = c.Iterator(it)
			} else {
				it = iter.Iterator(it)
			}
			for it.Next() != chunkenc.ValNone {
			}
			if err := it.Err(); err != nil {
				return fmt.Errorf("chunk of series %s: %w", sb.Labels(), err)
			}
		}
	}
	return ps.Err()
}

func shortDuration(d time.Duration) string {
	if d%(24*time.Hour) == 0 {
		return fmt.Sprintf("%dd", d/(24*time.Hour))
	}
	return d.String()
}
