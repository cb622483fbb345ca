package bucketstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/storage/bucketindex"
)

// Where a tenant's sync learnt its blocks.
const (
	sourceIndex   = "index"   // the compactor's bucket index, plus a listing of block directories
	sourceListing = "listing" // a full listing of the tenant's objects
)

// Why a complete block is not queried.
const (
	hiddenDeletionMark = "deletion-mark" // marked for deletion (compacted away, retention) for longer than the delay
	hiddenReplaced     = "replaced"      // a visible block holds all its samples (compacted from it)
	hiddenBadMeta      = "bad-meta"      // its meta.json is not valid
)

// tenantView is what the last sync of a tenant learnt.
type tenantView struct {
	index  *bucketindex.Index // the bucket as seen (never nil once synced)
	source string
	// indexUpdated is the bucket index's updated_at when source is index.
	indexUpdated time.Time
	hidden       map[string]int
}

// resolve returns the tenant's blocks and marks: from the bucket index when
// it is enabled, present and at most BucketIndexMaxStaleness old (with the
// block directories uploaded or deleted since brought in by a cheap listing),
// else from a listing of the tenant's objects (reading only what the previous
// view lacks).
func (s *Store) resolve(ctx context.Context, tenantID string, prev *bucketindex.Index) (*bucketindex.Index, string, time.Time, error) {
	if s.cfg.BucketIndexEnabled {
		x, err := bucketindex.Read(ctx, s.bkt, tenantID)
		switch {
		case err == nil && time.Since(x.UpdatedTime()) <= time.Duration(s.cfg.BucketIndexMaxStaleness):
			v, err := bucketindex.WithUnindexed(ctx, s.bkt, x, prev)
			if err != nil {
				return nil, "", time.Time{}, err
			}
			return v, sourceIndex, x.UpdatedTime(), nil
		case err == nil:
			s.logger.Debug("bucket index is stale, listing the tenant's blocks", "tenant", tenantID, "updated_at", x.UpdatedTime())
		case errors.Is(err, bucketindex.ErrNotFound):
		case ctx.Err() != nil:
			return nil, "", time.Time{}, ctx.Err()
		default:
			s.logger.Warn("bucket index unreadable, listing the tenant's blocks", "tenant", tenantID, "err", err)
		}
	}
	x, err := bucketindex.Update(ctx, s.bkt, tenantID, prev)
	if err != nil {
		return nil, "", time.Time{}, err
	}
	return x, sourceListing, time.Time{}, nil
}

// visible returns the blocks of metas a query reads, and how many are hidden
// for each reason: a block marked for deletion for at least
// DeletionMarkDelay, and a block whose samples another visible block holds
// (bucketindex.Replaced), so that a compacted block and its sources are
// never both read, whether or not the compactor got to mark the sources.
func (s *Store) visible(metas []*block.Meta, marks map[ulid.ULID]*block.DeletionMark, now time.Time) ([]*block.Meta, map[string]int) {
	hidden := map[string]int{}
	delay := time.Duration(s.cfg.DeletionMarkDelay)
	live := make([]*block.Meta, 0, len(metas))
	for _, m := range metas {
		if d, ok := marks[m.ULID]; ok && !now.Before(time.Unix(d.DeletionTime, 0).Add(delay)) {
			hidden[hiddenDeletionMark]++
			continue
		}
		live = append(live, m)
	}
	replaced := bucketindex.Replaced(live)
	out := live[:0:0]
	for _, m := range live {
		if _, ok := replaced[m.ULID]; ok {
			hidden[hiddenReplaced]++
			continue
		}
		out = append(out, m)
	}
	return out, hidden
}

func (s *Store) syncTenant(ctx context.Context, tenantID string) error {
	syncStart := time.Now()
	s.mtx.RLock()
	var prev *bucketindex.Index
	if v := s.views[tenantID]; v != nil {
		prev = v.index
	}
	known := map[ulid.ULID]*bucketBlock{}
	for _, b := range s.tenants[tenantID] {
		known[b.meta.ULID] = b
	}
	s.mtx.RUnlock()

	x, source, indexUpdated, err := s.resolve(ctx, tenantID, prev)
	if err != nil {
		return fmt.Errorf("sync blocks of tenant %q: %w", tenantID, err)
	}
	if err := s.dels.sync(ctx, s, tenantID); err != nil {
		return fmt.Errorf("sync blocks of tenant %q: %w", tenantID, err)
	}
	s.m.tenantSyncs.WithLabelValues(source).Inc()

	listed := map[ulid.ULID]struct{}{}
	for _, m := range x.Blocks {
		listed[m.ULID] = struct{}{}
	}
	vis, hidden := s.visible(x.Blocks, x.DeletionMarkMap(), time.Now())
	if len(x.Corrupted) > 0 {
		hidden[hiddenBadMeta] = len(x.Corrupted)
	}
	var (
		next []*bucketBlock
		errs []error
	)
	for _, m := range vis {
		if b, ok := known[m.ULID]; ok {
			next = append(next, b)
			continue
		}
		b, err := newBucketBlock(s.bkt, s.cache, s.cfg.ReadaheadPages, m)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		next = append(next, b)
	}

	s.mtx.Lock()
	// Blocks added (Add) after the sync began and not seen by it stay
	// until the next one.
	for _, b := range s.tenants[tenantID] {
		if _, ok := listed[b.meta.ULID]; !ok && b.added.After(syncStart) {
			next = append(next, b)
		}
	}
	sortBlocks(next)
	gone := s.tenants[tenantID]
	s.tenants[tenantID] = next
	s.views[tenantID] = &tenantView{index: x, source: source, indexUpdated: indexUpdated, hidden: hidden}
	s.mtx.Unlock()

	// Drop the cached pages of blocks no longer queried. A query that still
	// holds one reads it from the bucket again: a block is deleted only
	// after the compactor's delete delay, long after it is hidden here.
	stay := map[*bucketBlock]struct{}{}
	for _, b := range next {
		stay[b] = struct{}{}
	}
	drop := map[string]struct{}{}
	for _, b := range gone {
		if _, ok := stay[b]; !ok {
			for _, n := range b.objectNames() {
				drop[n] = struct{}{}
			}
		}
	}
	if len(drop) > 0 {
		s.cache.Drop(drop)
	}
	return errors.Join(errs...)
}
