// Package bucketstore serves queries from the blocks in the bucket without
// downloading them.
//
// A Store keeps, per tenant, the list of complete blocks in the bucket
// (those with a meta.json; partial uploads are never read), refreshed every
// sync_interval: new blocks appear, deleted ones go. A query opens, per block
// it overlaps, the TSDB's own block querier (tsdb.NewBlockQuerier) over a
// tsdb.BlockReader whose index and chunk readers fetch byte ranges of the
// block's objects through one PageCache of fixed-size pages, bounded by
// cache_size. So a query reads only the pages of the postings, series and
// chunks it touches, and its cache memory is bounded by configuration. Each
// block also keeps a small index header in memory (sampled postings offsets
// and symbol offsets, read once on first use and dropped after
// index_header_idle_timeout without queries).
package bucketstore

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"slices"
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
	"github.com/prometheus/prometheus/util/annotations"
	"github.com/thanos-io/objstore"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/blockquery"
	"github.com/gpustore/gpustore/pkg/deletion"
	"github.com/gpustore/gpustore/pkg/downsample"
	"github.com/gpustore/gpustore/pkg/readopts"
	"github.com/gpustore/gpustore/pkg/seriesset"
)

// Config is the bucket store's configuration.
type Config struct {
	// SyncInterval is how often the bucket is listed for new and deleted blocks.
	SyncInterval model.Duration `yaml:"sync_interval"`
	// CacheSize bounds, in bytes, the pages of index and chunk data held in memory.
	CacheSize int64 `yaml:"cache_size_bytes"`
	// PageSize is the size of a cached page and the unit of range requests.
	PageSize int64 `yaml:"page_size_bytes"`
	// IndexHeaderIdleTimeout drops a block's in-memory index header after
	// this long without a query (0 keeps them).
	IndexHeaderIdleTimeout model.Duration `yaml:"index_header_idle_timeout"`
	// BlockOpenConcurrency bounds how many blocks' index headers one query reads at once.
	BlockOpenConcurrency int `yaml:"block_open_concurrency"`
	// ReadaheadPages is the most pages a query reads ahead in one request
	// when it reads a block's series or chunks in order. Beyond the cache, a
	// query holds at most 2 × ReadaheadPages × PageSize per block it reads.
	ReadaheadPages int64 `yaml:"readahead_pages"`
	// BucketIndexEnabled syncs a tenant from its bucket index
	// (<tenant>/bucket-index.json.gz, written by the compactor) when it is
	// at most BucketIndexMaxStaleness old, instead of listing every object
	// of the tenant.
	BucketIndexEnabled      bool           `yaml:"bucket_index_enabled"`
	BucketIndexMaxStaleness model.Duration `yaml:"bucket_index_max_staleness"`
	// DeletionMarkDelay is how long a block marked for deletion stays
	// queryable after its mark was written.
	DeletionMarkDelay model.Duration `yaml:"deletion_mark_delay"`
}

// DefaultConfig: list every minute, 256 MiB of 32 KiB pages.
func DefaultConfig() Config {
	return Config{
		SyncInterval:           model.Duration(time.Minute),
		CacheSize:              256 << 20,
		PageSize:               32 << 10,
		IndexHeaderIdleTimeout: model.Duration(time.Hour),
		BlockOpenConcurrency:   16,
		ReadaheadPages:         4,
		// The compactor rewrites the index after every pass.
		BucketIndexEnabled:      true,
		BucketIndexMaxStaleness: model.Duration(time.Hour),
		DeletionMarkDelay:       model.Duration(time.Minute),
	}
}

// Validate checks the sizes.
func (c Config) Validate() error {
	if c.SyncInterval <= 0 {
		return errors.New("bucket store sync interval must be positive")
	}
	if c.PageSize < 512 {
		return fmt.Errorf("bucket store page size %d is below 512 bytes", c.PageSize)
	}
	if c.CacheSize < c.PageSize {
		return fmt.Errorf("bucket store cache size %d is smaller than one page (%d)", c.CacheSize, c.PageSize)
	}
	if c.ReadaheadPages < 1 {
		return errors.New("bucket store readahead must be at least one page")
	}
	if c.BucketIndexEnabled && c.BucketIndexMaxStaleness <= 0 {
		return errors.New("bucket store bucket index max staleness must be positive")
	}
	if c.DeletionMarkDelay < 0 {
		return errors.New("bucket store deletion mark delay must not be negative")
	}
	if c.BlockOpenConcurrency < 1 {
		return errors.New("bucket store block open concurrency must be at least 1")
	}
	return nil
}

// Store is the per-tenant view of the bucket's blocks.
type Store struct {
	cfg   Config
	bkt   objstore.BucketReader
	cache *PageCache
	// blockCache keeps the selectors queries resolved on blocks (nil: none).
	blockCache *blockquery.Cache
	logger     *slog.Logger
	m          *metrics

	syncMtx sync.Mutex // one sync at a time

	mtx     sync.RWMutex
	tenants map[string][]*bucketBlock // visible blocks, sorted by MinTime
	views   map[string]*tenantView
	dels    deletions // series deletions applied at query time (deletions.go)
}

// New returns a store over bkt; nothing is read before Sync.
func New(cfg Config, bkt objstore.BucketReader, logger *slog.Logger, reg prometheus.Registerer) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Store{
		cfg: cfg, bkt: bkt, logger: logger,
		cache:      NewPageCache(cfg.PageSize, cfg.CacheSize),
		blockCache: blockquery.NewCache(defaultBlockCacheSize, nil),
		tenants:    map[string][]*bucketBlock{}, views: map[string]*tenantView{},
	}
	s.m = newMetrics(s)
	if reg != nil {
		if err := reg.Register(s.m); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// SetBlockCache makes queries keep the selectors they resolve on a block in
// c (pkg/blockquery), in place of the store's own (of
// defaultBlockCacheSize); call it before the first query. nil: every
// select reads the block's index.
func (s *Store) SetBlockCache(c *blockquery.Cache) { s.blockCache = c }

// defaultBlockCacheSize bounds a store's own cache of resolved selectors:
// gpustore gives it the one it shares with the local TSDBs.
const defaultBlockCacheSize = 64 << 20

// blockQuerier is a querier of block b's samples in [lo, hi] for one
// query. The cache holds a selector's series over the whole block, so the
// view its index is read through covers the whole block and leaves no chunk
// out; the step windows a sparse select needs are applied to the cached
// series instead.
func (s *Store) blockQuerier(ctx context.Context, b *bucketBlock, lo, hi int64) (storage.Querier, error) {
	if s.blockCache == nil {
		return tsdb.NewBlockQuerier(newView(ctx, b, lo, hi), lo, hi)
	}
	v := newView(ctx, b, b.meta.MinTime, b.meta.MaxTime-1)
	var keep func(mint, maxt int64) bool
	if need := v.st.need; need != nil {
		v.st.need = nil
		early := max(b.meta.GPUStore.Downsample.Resolution-1, 0)
		keep = func(mint, maxt int64) bool { return need.overlaps(mint-early, maxt) }
	}
	return blockquery.NewQuerier(v, s.blockCache, lo, hi, blockquery.Options{Key: b.meta.ULID.String(), Keep: keep})
}

// CacheStats returns the page cache's counters.
func (s *Store) CacheStats() CacheStats { return s.cache.Stats() }

// Run syncs every SyncInterval until ctx ends (a dskit service's running
// function) and drops idle index headers.
func (s *Store) Run(ctx context.Context) error {
	t := time.NewTicker(time.Duration(s.cfg.SyncInterval))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if err := s.Sync(ctx); err != nil && ctx.Err() == nil {
				s.logger.Warn("bucket store sync failed; serving the blocks known so far", "err", err)
			}
			if d := time.Duration(s.cfg.IndexHeaderIdleTimeout); d > 0 {
				s.unloadIdle(time.Now().Add(-d))
			}
		}
	}
}

// Sync lists the bucket's tenants and their blocks.
func (s *Store) Sync(ctx context.Context) error {
	s.syncMtx.Lock()
	defer s.syncMtx.Unlock()
	start := time.Now()
	var tenants []string
	err := s.bkt.Iter(ctx, "", func(name string) error {
		if !strings.HasSuffix(name, "/") {
			return nil
		}
		t := strings.TrimSuffix(name, "/")
		if tenant.ValidTenantID(t) == nil {
			tenants = append(tenants, t)
		}
		return nil
	})
	if err != nil {
		s.m.syncFailures.Inc()
		return fmt.Errorf("list tenants in bucket: %w", err)
	}
	var errs []error
	for _, t := range tenants {
		if err := s.syncTenant(ctx, t); err != nil {
			errs = append(errs, err)
		}
	}
	// Tenants no longer in the bucket lose their blocks too.
	listed := map[string]bool{}
	for _, t := range tenants {
		listed[t] = true
	}
	s.mtx.RLock()
	var gone []string
	for t := range s.tenants {
		if !listed[t] {
			gone = append(gone, t)
		}
	}
	s.mtx.RUnlock()
	for _, t := range gone {
		if err := s.syncTenant(ctx, t); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		s.m.syncFailures.Inc()
		return errors.Join(errs...)
	}
	s.m.lastSync.SetToCurrentTime()
	s.m.syncDuration.Observe(time.Since(start).Seconds())
	return nil
}

// SyncTenant lists one tenant's blocks.
func (s *Store) SyncTenant(ctx context.Context, tenantID string) error {
	s.syncMtx.Lock()
	defer s.syncMtx.Unlock()
	return s.syncTenant(ctx, tenantID)
}

// Add makes a block just uploaded by this process's shipper visible at once,
// before the next listing.
func (s *Store) Add(meta block.Meta) error {
	if err := meta.Validate(); err != nil {
		return err
	}
	m := meta
	b, err := newBucketBlock(s.bkt, s.cache, s.cfg.ReadaheadPages, &m)
	if err != nil {
		return err
	}
	b.added = time.Now()
	s.mtx.Lock()
	defer s.mtx.Unlock()
	for _, o := range s.tenants[m.GPUStore.Tenant] {
		if o.meta.ULID == m.ULID {
			return nil
		}
	}
	blocks := append(slices.Clone(s.tenants[m.GPUStore.Tenant]), b)
	sortBlocks(blocks)
	s.tenants[m.GPUStore.Tenant] = blocks
	return nil
}

func sortBlocks(bs []*bucketBlock) {
	slices.SortFunc(bs, func(a, b *bucketBlock) int {
		if a.meta.MinTime != b.meta.MinTime {
			if a.meta.MinTime < b.meta.MinTime {
				return -1
			}
			return 1
		}
		return a.meta.ULID.Compare(b.meta.ULID)
	})
}

// Blocks returns the metas of the tenant's known blocks, oldest first.
func (s *Store) Blocks(tenantID string) []block.Meta {
	s.mtx.RLock()
	defer s.mtx.RUnlock()
	out := make([]block.Meta, 0, len(s.tenants[tenantID]))
	for _, b := range s.tenants[tenantID] {
		out = append(out, *b.meta)
	}
	return out
}

func (s *Store) unloadIdle(before time.Time) {
	s.mtx.RLock()
	defer s.mtx.RUnlock()
	for _, bs := range s.tenants {
		for _, b := range bs {
			b.unloadIfIdle(before)
		}
	}
}

// HasDownsampled reports whether the tenant has downsampled blocks.
func (s *Store) HasDownsampled(tenantID string) bool {
	s.mtx.RLock()
	defer s.mtx.RUnlock()
	for _, b := range s.tenants[tenantID] {
		if b.meta.GPUStore.Downsample.Resolution != block.ResolutionRaw {
			return true
		}
	}
	return false
}

// blocksFor returns the tenant's blocks overlapping [mint, maxt] that the
// caller does not serve itself (local), with the part of each to read.
func (s *Store) blocksFor(tenantID string, mint, maxt int64, local func(ulid.ULID) bool) ([]*bucketBlock, map[*bucketBlock]span) {
	s.mtx.RLock()
	defer s.mtx.RUnlock()
	var (
		out   []*bucketBlock
		parts map[*bucketBlock]span
	)
	for _, b := range s.tenants[tenantID] {
		// Block time ranges are half-open: [MinTime, MaxTime).
		if b.meta.MinTime > maxt || b.meta.MaxTime <= mint {
			continue
		}
		sp, ok := readSpan(b.meta, local)
		if !ok {
			continue
		}
		if sp != (span{b.meta.MinTime, b.meta.MaxTime}) {
			if parts == nil {
				parts = map[*bucketBlock]span{}
			}
			parts[b] = sp
		}
		out = append(out, b)
	}
	return out, parts
}

// readSpan is the part of a block to read when the caller serves the blocks
// local reports itself (the receiver's TSDB keeps its recent blocks after
// shipping them): none of a local block; of a raw block compacted from
// sources the caller partly holds, the span of the other sources, so that
// the recent hours are not read twice, from disk and from the compacted
// copy; the whole block otherwise (sources unknown). ok is false when
// nothing is left to read.
func readSpan(m *block.Meta, local func(ulid.ULID) bool) (_ span, ok bool) {
	whole := span{m.MinTime, m.MaxTime}
	if local == nil {
		return whole, true
	}
	if local(m.ULID) {
		return span{}, false
	}
	srcs := m.Sources()
	if srcs == nil || m.GPUStore.Downsample.Resolution != block.ResolutionRaw {
		return whole, true
	}
	out := span{math.MaxInt64, math.MinInt64}
	for _, r := range srcs {
		if !local(r.ULID) {
			out.from, out.to = min(out.from, r.MinTime), max(out.to, r.MaxTime)
		}
	}
	out.from, out.to = max(out.from, whole.from), min(out.to, whole.to)
	return out, out.from < out.to
}

// Querier returns a querier over the tenant's bucket blocks overlapping
// [mint, maxt], leaving out what the caller serves itself
// (opts.LocalBlocks: blocks still on local disk, see readSpan); its selects
// read each time range at the resolution opts allow (plan). It is a no-op
// querier when nothing is left to read.
func (s *Store) Querier(tenantID string, mint, maxt int64, opts readopts.ReadOptions) (downsample.Querier, error) {
	bs, parts := s.blocksFor(tenantID, mint, maxt, opts.LocalBlocks)
	if len(bs) == 0 {
		return downsample.NoopQuerier(), nil
	}
	return &querier{base: base{s: s, blocks: bs, parts: parts, mint: mint, maxt: maxt, dels: s.dels.over(tenantID, mint, maxt)}, opts: opts}, nil
}

// ChunkQuerier is Querier for chunk queries (remote read): raw blocks
// only, read whole (of opts, only LocalBlocks matters).
func (s *Store) ChunkQuerier(tenantID string, mint, maxt int64, opts readopts.ReadOptions) (storage.ChunkQuerier, error) {
	bs, parts := s.blocksFor(tenantID, mint, maxt, opts.LocalBlocks)
	bs = slices.DeleteFunc(bs, func(b *bucketBlock) bool {
		return b.meta.GPUStore.Downsample.Resolution != block.ResolutionRaw
	})
	if len(bs) == 0 {
		return storage.NoopChunkedQuerier(), nil
	}
	return &chunkQuerier{base: base{s: s, blocks: bs, parts: parts, mint: mint, maxt: maxt, dels: s.dels.over(tenantID, mint, maxt)}}, nil
}

type base struct {
	s          *Store
	blocks     []*bucketBlock
	parts      map[*bucketBlock]span // blocks read in part (readSpan)
	mint, maxt int64
	dels       []*deletion.Request // the tenant's series deletions (deletions.go)

	mtx     sync.Mutex
	closers []func() error
}

// readRange is the inclusive range of block b a select of [mint, maxt]
// reads: the part of b to read within it. (Select's mint and maxt are
// within the querier's range, but for the windows a plain selector's fill
// reads around a downsampled segment.)
func (q *base) readRange(b *bucketBlock, mint, maxt int64) (int64, int64) {
	sp, ok := q.parts[b]
	if !ok {
		sp = span{b.meta.MinTime, b.meta.MaxTime}
	}
	return max(mint, sp.from), min(maxt, sp.to-1)
}

// selected returns the blocks with something to read in the hinted range,
// with their index headers read (several blocks at once).
func (q *base) selected(ctx context.Context, blocks []*bucketBlock, mint, maxt int64) ([]*bucketBlock, error) {
	var bs []*bucketBlock
	for _, b := range blocks {
		if lo, hi := q.readRange(b, mint, maxt); lo > hi {
			continue
		}
		bs = append(bs, b)
	}
	sem := make(chan struct{}, q.s.cfg.BlockOpenConcurrency)
	errs := make([]error, len(bs))
	var wg sync.WaitGroup
	for i, b := range bs {
		if b.headerLoaded() {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			_, errs[i] = b.indexHeader(ctx)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	q.s.m.queriedBlocks.Observe(float64(len(bs)))
	return bs, nil
}

func (q *base) track(f func() error) {
	q.mtx.Lock()
	q.closers = append(q.closers, f)
	q.mtx.Unlock()
}

func (q *base) Close() error {
	q.mtx.Lock()
	defer q.mtx.Unlock()
	var errs []error
	for _, f := range q.closers {
		errs = append(errs, f())
	}
	q.closers = nil
	return errors.Join(errs...)
}

func hintRange(mint, maxt int64, hints *storage.SelectHints) (int64, int64) {
	if hints != nil && (hints.Start != 0 || hints.End != 0) {
		return max(mint, hints.Start), min(maxt, hints.End)
	}
	return mint, maxt
}

// querier reads each time range of a Select at the resolution its hints
// and the read's options allow (resolution.go): raw blocks as they are,
// downsampled blocks through pkg/downsample's views.
type querier struct {
	base
	opts readopts.ReadOptions
}

// viewOpts is how open reads downsampled blocks (downsample.Blocks): plain
// selectors' points in [from, to] (the blocks are read a window beyond,
// see selectSegment), approx why answers are approximate, the select's
// hints before they were narrowed to the segment, and the raw time whose
// samples are read elsewhere (finer blocks beside them).
type viewOpts struct {
	from, to  int64
	approx    string
	hints     *storage.SelectHints
	elsewhere []downsample.Span
}

// open returns a querier over blocks for [mint, maxt]: raw blocks as they
// are, downsampled blocks through one view of their resolution (so that a
// range function sees a series across the blocks' edges).
func (q *querier) open(ctx context.Context, blocks []*bucketBlock, mint, maxt int64, o viewOpts) (storage.Querier, error) {
	bs, err := q.selected(ctx, blocks, mint, maxt)
	if err != nil {
		return nil, err
	}
	qs := make([]storage.Querier, 0, len(bs))
	views := map[int64]*downsample.Blocks{}
	var order []int64
	fail := func(err error) (storage.Querier, error) {
		for _, o := range qs {
			_ = o.Close()
		}
		for _, v := range views {
			for _, p := range v.Parts {
				_ = p.Querier.Close()
				if p.Pairs != nil {
					_ = p.Pairs.Close()
				}
			}
		}
		return nil, err
	}
	for _, b := range bs {
		lo, hi := q.readRange(b, mint, maxt)
		bq, err := q.s.blockQuerier(ctx, b, lo, hi)
		if err != nil {
			return fail(err)
		}
		res := b.meta.GPUStore.Downsample.Resolution
		if res == block.ResolutionRaw {
			qs = append(qs, seriesset.SpanQuerier(downsample.NewRawQuerier(bq), lo, hi))
			continue
		}
		v := views[res]
		if v == nil {
			v = &downsample.Blocks{Resolution: res, From: o.from, To: o.to, Approximate: o.approx, Hints: o.hints, Elsewhere: o.elsewhere, AtSteps: q.opts.AtSteps}
			views[res] = v
			order = append(order, res)
		}
		p := downsample.Part{Querier: bq, Lo: lo, Hi: hi, KeptCounts: b.meta.GPUStore.Downsample.KeptCounts}
		// Counter pairs are read up to a window past hi (downsample's pairs.go).
		if _, wide := q.readRange(b, mint, maxt+min(res-1, math.MaxInt64-maxt)); wide > hi {
			if p.Pairs, err = q.s.blockQuerier(ctx, b, lo, wide); err != nil {
				_ = bq.Close()
				return fail(err)
			}
		}
		v.Parts = append(v.Parts, p)
	}
	for _, res := range order {
		v := views[res]
		slices.SortFunc(v.Parts, func(a, b downsample.Part) int { return cmp.Compare(a.Lo, b.Lo) })
		qs = append(qs, seriesset.SpanQuerier(downsample.NewQuerier(*v), v.Parts[0].Lo, v.Parts[len(v.Parts)-1].Hi))
	}
	return seriesset.NewMergeQuerier(qs, seriesset.MergeSpans), nil
}

// plan is the segments a select reads (planner.plan), and the folded
// labels it names (a matcher, its grouping, the query: then it reads raw
// data where there is any).
func (q *querier) plan(hints *storage.SelectHints, ms []*labels.Matcher) (segs []segment, named []string) {
	mint, maxt := hintRange(q.mint, q.maxt, hints)
	var forcedRaw []span
	if from := q.opts.LocalFrom; from != readopts.NoLocalFrom { // the caller serves it raw
		forcedRaw = []span{{from, math.MaxInt64}}
	}
	maxRes := downsample.MaxResolution(q.opts.MaxSourceResolution, hints)
	for _, l := range foldedLabels(q.blocks, mint, maxt) {
		if downsample.NamesFolded(q.opts.QueryLabels, []string{l}, hints, ms) {
			named = append(named, l)
		}
	}
	if len(named) > 0 {
		maxRes = block.ResolutionRaw // where raw has expired, the folded data still answers
	}
	return newPlanner(q.opts.AtSteps, hints, maxRes, forcedRaw).plan(q.blocks, mint, maxt), named
}

// Select reads each segment of the hinted range (plan) from its blocks and
// merges them.
func (q *querier) Select(ctx context.Context, sortSeries bool, hints *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
	segs, named := q.plan(hints, ms)
	lead := int64(0) // moved ranges begin up to a window earlier
	for _, sg := range segs {
		if sg.shift != nil {
			lead = max(lead, sg.res)
		}
	}
	ctx = withNeededWindows(ctx, sparseWindows(q.opts.AtSteps, hints, lead))
	sets := make([]storage.SeriesSet, 0, len(segs))
	for _, sg := range segs {
		for _, res := range resolutionsOf(sg.blocks) {
			set, err := q.selectSegment(ctx, sg, res, hints, ms)
			if err != nil {
				return storage.ErrSeriesSet(err)
			}
			sets = append(sets, set)
		}
	}
	var set storage.SeriesSet
	switch len(sets) {
	case 0:
		return storage.EmptySeriesSet()
	case 1:
		set = sets[0]
	default:
		set = seriesset.NewMergeSeriesSet(sets, seriesset.ChainedSeriesMerge)
	}
	if info := describe(segs); info != "" {
		set = withInfo{SeriesSet: set, info: info}
	}
	if info := describeFolded(segs, named); info != "" {
		set = withInfo{SeriesSet: set, info: info}
	}
	return deletion.Filter(set, q.dels)
}

// Folding says how the downsampled data a select reads was folded: the
// folded labels of the downsampled blocks its plan reads, and the metrics
// whose series those blocks folded (the metrics the select's matchers
// name there of which no series carries a folded label). A select that
// names a folded label reads raw data where there is any and is not folded
// (its answer says where the labels are gone: describeFolded).
func (q *querier) Folding(ctx context.Context, hints *storage.SelectHints, ms ...*labels.Matcher) (downsample.Folding, error) {
	var f downsample.Folding
	mint, maxt := hintRange(q.mint, q.maxt, hints)
	if len(foldedLabels(q.blocks, mint, maxt)) == 0 {
		return f, nil
	}
	segs, named := q.plan(hints, ms)
	if len(named) > 0 {
		return f, nil
	}
	ms = downsample.WithoutView(ms)
	for _, sg := range segs {
		for _, b := range sg.blocks {
			if len(b.meta.GPUStore.Downsample.FoldedLabels) == 0 || b.meta.GPUStore.Downsample.Resolution == block.ResolutionRaw {
				continue
			}
			g, err := q.folding(ctx, b, ms)
			if err != nil {
				return f, err
			}
			f.Merge(g)
		}
	}
	return f, nil
}

// folding is Folding for one downsampled block.
func (q *querier) folding(ctx context.Context, b *bucketBlock, ms []*labels.Matcher) (downsample.Folding, error) {
	f := downsample.Folding{Labels: b.meta.GPUStore.Downsample.FoldedLabels}
	if _, err := q.selected(ctx, []*bucketBlock{b}, b.meta.MinTime, b.meta.MaxTime-1); err != nil {
		return f, err
	}
	bq, err := tsdb.NewBlockQuerier(newView(ctx, b, b.meta.MinTime, b.meta.MaxTime-1), b.meta.MinTime, b.meta.MaxTime-1)
	if err != nil {
		return f, err
	}
	defer bq.Close()
	names, _, err := bq.LabelValues(ctx, model.MetricNameLabel, nil, ms...)
	if err != nil {
		return f, err
	}
	f.Metrics = map[string]bool{}
	for _, n := range names {
		f.Metrics[n] = true
	}
	for _, l := range f.Labels {
		with, _, err := bq.LabelValues(ctx, model.MetricNameLabel, nil, append(slices.Clip(ms), labels.MustNewMatcher(labels.MatchRegexp, l, ".+"))...)
		if err != nil {
			return f, err
		}
		for _, n := range with {
			delete(f.Metrics, n) // a series keeps the label: not folded
		}
	}
	return f, nil
}

// resolutionsOf lists the resolutions of blocks, coarsest first.
func resolutionsOf(bs []*bucketBlock) []int64 {
	var out []int64
	for _, b := range bs {
		if r := b.meta.GPUStore.Downsample.Resolution; !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	slices.Sort(out)
	slices.Reverse(out)
	return out
}

// selectSegment selects from a segment's blocks of resolution res over the
// segment's raw time, with hints narrowed to it (the TSDB's block querier
// reads the hinted range). A downsampled block's points are stored 1 ms
// before the raw time they stand for. A plain selector's downsampled
// blocks are read from one window earlier to one window later: the window
// before is what it shows until the segment's first window ends, the
// window after lets the fill repeat the last window up to the segment's
// end (a range ending inside a 1h window, e.g. a query frontend's day
// piece).
func (q *querier) selectSegment(ctx context.Context, sg segment, res int64, hints *storage.SelectHints, ms []*labels.Matcher) (storage.SeriesSet, error) {
	from, to := sg.from, sg.to-1
	if res != block.ResolutionRaw {
		from, to = from-1, to-1
	}
	readFrom, readTo := from, to
	var blocks []*bucketBlock
	for _, b := range sg.blocks {
		if b.meta.GPUStore.Downsample.Resolution == res {
			blocks = append(blocks, b)
		}
	}
	if res != block.ResolutionRaw && hints != nil && hints.Range == 0 {
		readFrom, readTo = from-res, to+res
		for _, b := range sg.group { // the blocks holding the windows before and after, if others
			if b.meta.GPUStore.Downsample.Resolution == res && b.meta.MinTime <= readTo && b.meta.MaxTime > readFrom && !slices.Contains(blocks, b) {
				blocks = append(slices.Clip(blocks), b)
			}
		}
	}
	v := viewOpts{from: from, to: to, hints: hints}
	if res == sg.res {
		v.approx = sg.approx
	}
	for _, b := range sg.blocks { // finer blocks read beside these (segment.blocks)
		if b.meta.GPUStore.Downsample.Resolution < res {
			c := covered(b.meta)
			v.elsewhere = append(v.elsewhere, downsample.Span{Lo: c.from, Hi: c.to - 1})
		}
	}
	m, err := q.open(ctx, blocks, readFrom, readTo, v)
	if err != nil {
		return nil, err
	}
	q.track(m.Close)
	if res != block.ResolutionRaw {
		q.s.m.downsampledSelects.WithLabelValues(downsample.ResolutionName(res)).Inc()
	}
	var h *storage.SelectHints
	if hints != nil {
		c := *hints
		c.Start, c.End = readFrom, readTo
		h = &c
	}
	// Always sorted: blocks' series come sorted anyway, and merging needs it.
	set := m.Select(ctx, true, h, ms...)
	if sg.shift != nil {
		set = downsample.ShiftSeries(set, sg.shift)
	}
	return set, nil
}

// foldedLabels lists the labels folded in the downsampled blocks that
// overlap [mint, maxt].
func foldedLabels(bs []*bucketBlock, mint, maxt int64) []string {
	var out []string
	for _, b := range bs {
		if b.meta.MinTime <= maxt && b.meta.MaxTime > mint {
			for _, l := range b.meta.GPUStore.Downsample.FoldedLabels {
				if !slices.Contains(out, l) {
					out = append(out, l)
				}
			}
		}
	}
	return out
}

// withInfo adds an info annotation to a series set.
type withInfo struct {
	storage.SeriesSet
	info string
}

func (w withInfo) Warnings() annotations.Annotations {
	a := w.SeriesSet.Warnings()
	return a.Add(fmt.Errorf("%w: %s", annotations.PromQLInfo, w.info))
}

func (q *querier) LabelValues(ctx context.Context, name string, hints *storage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	m, err := q.open(ctx, q.blocks, q.mint, q.maxt, viewOpts{from: q.mint, to: q.maxt})
	if err != nil {
		return nil, nil, err
	}
	defer m.Close()
	return m.LabelValues(ctx, name, hints, ms...)
}

func (q *querier) LabelNames(ctx context.Context, hints *storage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	m, err := q.open(ctx, q.blocks, q.mint, q.maxt, viewOpts{from: q.mint, to: q.maxt})
	if err != nil {
		return nil, nil, err
	}
	defer m.Close()
	return m.LabelNames(ctx, hints, ms...)
}

type chunkQuerier struct{ base }

func (q *chunkQuerier) open(ctx context.Context, mint, maxt int64) (storage.ChunkQuerier, error) {
	bs, err := q.selected(ctx, q.blocks, mint, maxt)
	if err != nil {
		return nil, err
	}
	qs := make([]storage.ChunkQuerier, 0, len(bs))
	for _, b := range bs {
		lo, hi := q.readRange(b, mint, maxt)
		bq, err := tsdb.NewBlockChunkQuerier(newView(ctx, b, lo, hi), lo, hi)
		if err != nil {
			for _, o := range qs {
				_ = o.Close()
			}
			return nil, err
		}
		qs = append(qs, bq)
	}
	return storage.NewMergeChunkQuerier(qs, nil, storage.NewCompactingChunkSeriesMerger(storage.ChainedSeriesMerge)), nil
}

func (q *chunkQuerier) Select(ctx context.Context, sortSeries bool, hints *storage.SelectHints, ms ...*labels.Matcher) storage.ChunkSeriesSet {
	mint, maxt := hintRange(q.mint, q.maxt, hints)
	m, err := q.open(ctx, mint, maxt)
	if err != nil {
		return storage.ErrChunkSeriesSet(err)
	}
	q.track(m.Close)
	return deletedChunks(m.Select(ctx, sortSeries, hints, ms...), q.dels)
}

func (q *chunkQuerier) LabelValues(ctx context.Context, name string, hints *storage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	m, err := q.open(ctx, q.mint, q.maxt)
	if err != nil {
		return nil, nil, err
	}
	defer m.Close()
	return m.LabelValues(ctx, name, hints, ms...)
}

func (q *chunkQuerier) LabelNames(ctx context.Context, hints *storage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	m, err := q.open(ctx, q.mint, q.maxt)
	if err != nil {
		return nil, nil, err
	}
	defer m.Close()
	return m.LabelNames(ctx, hints, ms...)
}

// metrics exports the store's state at scrape time.
type metrics struct {
	s             *Store
	syncFailures  prometheus.Counter
	tenantSyncs   *prometheus.CounterVec
	lastSync      prometheus.Gauge
	syncDuration  prometheus.Histogram
	queriedBlocks prometheus.Histogram
	// Selects reading downsampled blocks, by resolution.
	downsampledSelects *prometheus.CounterVec

	blocks, partial, hidden, headerBytes, syncSource, indexAge                *prometheus.Desc
	cacheBytes, cacheMax, hits, misses, evictions, fetched, decoded, requests *prometheus.Desc
}

func newMetrics(s *Store) *metrics {
	return &metrics{
		s: s,
		syncFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpustore_bucketstore_sync_failures_total", Help: "Listings of the bucket that failed.",
		}),
		tenantSyncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_bucketstore_tenant_syncs_total", Help: "Syncs of a tenant's blocks, by where they were learnt: the bucket index (index) or a listing of the tenant's objects (listing).",
		}, []string{"source"}),
		lastSync: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpustore_bucketstore_last_sync_timestamp_seconds", Help: "When the bucket was last listed successfully.",
		}),
		syncDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "gpustore_bucketstore_sync_duration_seconds", Help: "Time to list the bucket.",
			Buckets: prometheus.ExponentialBuckets(0.01, 4, 8),
		}),
		queriedBlocks: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "gpustore_bucketstore_queried_blocks", Help: "Bucket blocks read by one select.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 12),
		}),
		downsampledSelects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_bucketstore_downsampled_selects_total", Help: "Time ranges of selects read from downsampled blocks, by resolution.",
		}, []string{"resolution"}),
		blocks:      prometheus.NewDesc("gpustore_bucketstore_blocks", "Complete blocks of the tenant in the bucket.", []string{"tenant"}, nil),
		partial:     prometheus.NewDesc("gpustore_bucketstore_partial_blocks", "Block directories of the tenant without meta.json (uploading or crashed), never read.", []string{"tenant"}, nil),
		hidden:      prometheus.NewDesc("gpustore_bucketstore_hidden_blocks", "Blocks of the tenant in the bucket that queries do not read, by reason: deletion-mark, replaced (a visible compacted block holds their samples), bad-meta.", []string{"tenant", "reason"}, nil),
		syncSource:  prometheus.NewDesc("gpustore_bucketstore_sync_source", "1 for where the tenant's last sync learnt its blocks: index (the bucket index) or listing.", []string{"tenant", "source"}, nil),
		indexAge:    prometheus.NewDesc("gpustore_bucketstore_bucket_index_age_seconds", "Age of the bucket index the tenant's last sync used (tenants synced from the index only).", []string{"tenant"}, nil),
		headerBytes: prometheus.NewDesc("gpustore_bucketstore_index_header_bytes", "Estimated memory of the loaded index headers.", nil, nil),
		cacheBytes:  prometheus.NewDesc("gpustore_bucketstore_cache_bytes", "Bytes of index and chunk pages held by the cache.", nil, nil),
		cacheMax:    prometheus.NewDesc("gpustore_bucketstore_cache_max_bytes", "The cache's configured bound.", nil, nil),
		hits:        prometheus.NewDesc("gpustore_bucketstore_cache_hits_total", "Page reads served from the cache.", nil, nil),
		misses:      prometheus.NewDesc("gpustore_bucketstore_cache_misses_total", "Page reads that went to the bucket.", nil, nil),
		evictions:   prometheus.NewDesc("gpustore_bucketstore_cache_evictions_total", "Pages evicted to stay within the bound.", nil, nil),
		fetched:     prometheus.NewDesc("gpustore_bucketstore_fetched_bytes_total", "Bytes read from the bucket by queries (range requests).", nil, nil),
		decoded:     prometheus.NewDesc("gpustore_bucketstore_decoded_bytes_total", "Bytes decoded from the zstd frames of encoded block files (5m and 1h blocks) read by queries.", nil, nil),
		requests:    prometheus.NewDesc("gpustore_bucketstore_range_requests_total", "Range requests sent to the bucket by queries.", nil, nil),
	}
}

func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	m.syncFailures.Describe(ch)
	m.tenantSyncs.Describe(ch)
	m.lastSync.Describe(ch)
	m.syncDuration.Describe(ch)
	m.queriedBlocks.Describe(ch)
	m.downsampledSelects.Describe(ch)
	for _, d := range []*prometheus.Desc{m.blocks, m.partial, m.hidden, m.syncSource, m.indexAge, m.headerBytes, m.cacheBytes, m.cacheMax, m.hits, m.misses, m.evictions, m.fetched, m.decoded, m.requests} {
		ch <- d
	}
}

func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	m.syncFailures.Collect(ch)
	m.tenantSyncs.Collect(ch)
	m.lastSync.Collect(ch)
	m.syncDuration.Collect(ch)
	m.queriedBlocks.Collect(ch)
	m.downsampledSelects.Collect(ch)
	var header int64
	m.s.mtx.RLock()
	for t, bs := range m.s.tenants {
		ch <- prometheus.MustNewConstMetric(m.blocks, prometheus.GaugeValue, float64(len(bs)), t)
		for _, b := range bs {
			header += b.headerBytes()
		}
	}
	now := time.Now()
	for t, v := range m.s.views {
		ch <- prometheus.MustNewConstMetric(m.partial, prometheus.GaugeValue, float64(len(v.index.Partial)), t)
		for _, r := range []string{hiddenDeletionMark, hiddenReplaced, hiddenBadMeta} {
			ch <- prometheus.MustNewConstMetric(m.hidden, prometheus.GaugeValue, float64(v.hidden[r]), t, r)
		}
		ch <- prometheus.MustNewConstMetric(m.syncSource, prometheus.GaugeValue, 1, t, v.source)
		if v.source == sourceIndex {
			ch <- prometheus.MustNewConstMetric(m.indexAge, prometheus.GaugeValue, now.Sub(v.indexUpdated).Seconds(), t)
		}
	}
	m.s.mtx.RUnlock()
	st := m.s.cache.Stats()
	ch <- prometheus.MustNewConstMetric(m.headerBytes, prometheus.GaugeValue, float64(header))
	ch <- prometheus.MustNewConstMetric(m.cacheBytes, prometheus.GaugeValue, float64(st.Bytes))
	ch <- prometheus.MustNewConstMetric(m.cacheMax, prometheus.GaugeValue, float64(st.MaxBytes))
	ch <- prometheus.MustNewConstMetric(m.hits, prometheus.CounterValue, float64(st.Hits))
	ch <- prometheus.MustNewConstMetric(m.misses, prometheus.CounterValue, float64(st.Misses))
	ch <- prometheus.MustNewConstMetric(m.evictions, prometheus.CounterValue, float64(st.Evictions))
	ch <- prometheus.MustNewConstMetric(m.fetched, prometheus.CounterValue, float64(st.FetchedBytes))
	ch <- prometheus.MustNewConstMetric(m.decoded, prometheus.CounterValue, float64(st.DecodedBytes))
	ch <- prometheus.MustNewConstMetric(m.requests, prometheus.CounterValue, float64(st.Requests))
}

// RegisterFlags binds the bucket store's flags.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.Var(&c.SyncInterval, "bucket-store.sync-interval", "How often the bucket is listed for new and deleted blocks.")
	fs.Int64Var(&c.CacheSize, "bucket-store.cache-size", c.CacheSize, "Bytes of bucket index and chunk pages cached in memory (the bound of the query cache).")
	fs.Int64Var(&c.PageSize, "bucket-store.page-size", c.PageSize, "Size of a cached page and of the smallest range request, in bytes.")
	fs.Int64Var(&c.ReadaheadPages, "bucket-store.readahead-pages", c.ReadaheadPages, "Most pages one range request reads ahead when a query reads a block in order.")
	fs.BoolVar(&c.BucketIndexEnabled, "bucket-store.bucket-index.enabled", c.BucketIndexEnabled, "Sync a tenant's blocks from its bucket index (written by the compactor) instead of listing all its objects.")
	fs.Var(&c.BucketIndexMaxStaleness, "bucket-store.bucket-index.max-staleness", "List the tenant's objects instead of using a bucket index older than this.")
	fs.Var(&c.DeletionMarkDelay, "bucket-store.deletion-mark-delay", "How long a block marked for deletion stays queryable after its mark was written.")
	fs.Var(&c.IndexHeaderIdleTimeout, "bucket-store.index-header-idle-timeout", "Drop a block's in-memory index header after this long without queries (0: never).")
}
