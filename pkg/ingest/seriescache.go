package ingest

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/prometheus/storage"
)

// seriesCache maps the identity of a label set as it arrives on the wire
// (two independent hashes of its label pairs) to the TSDB series reference it
// was stored under. A hit lets the write path append a sample without
// building, sorting or validating a labels.Labels: that is what makes known
// series cheap. Entries are tiny (no labels are kept); a reference the head
// has since garbage-collected is detected by the appender (it reports an
// invalid sample for an unknown reference and empty labels) and re-resolved.
type seriesCache struct {
	shards [cacheShards]cacheShard
	// epoch advances on every sweep; entries not touched for two epochs go.
	epoch atomic.Uint32
}

const cacheShards = 64

type cacheShard struct {
	mtx sync.RWMutex
	m   map[uint64]cacheEntry
}

type cacheEntry struct {
	h2    uint64
	ref   storage.SeriesRef
	epoch uint32
}

func newSeriesCache() *seriesCache {
	c := &seriesCache{}
	for i := range c.shards {
		c.shards[i].m = map[uint64]cacheEntry{}
	}
	return c
}

func (c *seriesCache) get(h1, h2 uint64) (storage.SeriesRef, bool) {
	sh := &c.shards[h1%cacheShards]
	sh.mtx.RLock()
	e, ok := sh.m[h1]
	sh.mtx.RUnlock()
	if !ok || e.h2 != h2 {
		return 0, false
	}
	if ep := c.epoch.Load(); e.epoch != ep {
		// Refresh the entry's epoch at most once per sweep period.
		sh.mtx.Lock()
		if cur, ok := sh.m[h1]; ok && cur.h2 == h2 {
			cur.epoch = ep
			sh.m[h1] = cur
		}
		sh.mtx.Unlock()
	}
	return e.ref, true
}

func (c *seriesCache) put(h1, h2 uint64, ref storage.SeriesRef) {
	sh := &c.shards[h1%cacheShards]
	sh.mtx.Lock()
	sh.m[h1] = cacheEntry{h2: h2, ref: ref, epoch: c.epoch.Load()}
	sh.mtx.Unlock()
}

func (c *seriesCache) drop(h1 uint64) {
	sh := &c.shards[h1%cacheShards]
	sh.mtx.Lock()
	delete(sh.m, h1)
	sh.mtx.Unlock()
}

// sweep removes entries not used since the previous sweep and starts a new
// epoch. Called periodically (every head block period is plenty): series
// that stopped arriving leave the cache as they leave the head.
func (c *seriesCache) sweep() (removed int) {
	old := c.epoch.Add(1) - 1
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mtx.Lock()
		for k, e := range sh.m {
			if e.epoch != old && e.epoch != old+1 {
				delete(sh.m, k)
				removed++
			}
		}
		sh.mtx.Unlock()
	}
	return removed
}

func (c *seriesCache) len() int {
	n := 0
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mtx.RLock()
		n += len(sh.m)
		sh.mtx.RUnlock()
	}
	return n
}
