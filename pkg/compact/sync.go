// The sync phase of a pass: what the tenant's directory holds.

package compact

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/oklog/ulid/v2"
	"github.com/thanos-io/objstore"

	"github.com/gpustore/gpustore/pkg/block"
)

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
				// is whole uploads meta.json again (pkg/storage/shipper), and then
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
