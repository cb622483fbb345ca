package ingest

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/prometheus/storage"
)

// seriesCache maps the identity of a label set as it arrives on the wire
// (two independent hashes of its label pairs, see seriesKey) to the TSDB
// series reference it was stored under. A hit lets the write path append a
// sample without building, sorting or validating a labels.Labels: that is
// what makes known series cheap. Entries are small (no labels are kept); a
// reference the head has since garbage-collected is detected by the
// appender (it reports an invalid sample for an unknown reference and empty
// labels) and re-resolved.
//
// For series of a Prometheus HA pair the entry also holds the dedup state:
// the newest stored sample's timestamp and which replica sent it.
type seriesCache struct {
	shards [cacheShards]cacheShard
	// epoch advances on every sweep; entries not touched for two epochs go.
	epoch atomic.Uint32
}

const cacheShards = 64

type cacheShard struct {
	mtx sync.RWMutex
	m   map[uint64]*cacheEntry
}

type cacheEntry struct {
	h2  uint64
	ref storage.SeriesRef // 0: labels not resolved yet (a deduplicated replica's series)

	epoch atomic.Uint32
	// HA dedup state: newest sample stored and the HA pair (haTable index)
	// of the replica that sent it; 0 when no sample was stored yet.
	lastT    atomic.Int64
	lastPair atomic.Uint32
}

func newSeriesCache() *seriesCache {
	c := &seriesCache{}
	for i := range c.shards {
		c.shards[i].m = map[uint64]*cacheEntry{}
	}
	return c
}

// get returns the entry of a label set, or nil.
func (c *seriesCache) get(h1, h2 uint64) *cacheEntry {
	sh := &c.shards[h1%cacheShards]
	sh.mtx.RLock()
	e := sh.m[h1]
	sh.mtx.RUnlock()
	if e == nil || e.h2 != h2 {
		return nil
	}
	if ep := c.epoch.Load(); e.epoch.Load() != ep {
		e.epoch.Store(ep)
	}
	return e
}

// put records ref for the label set, keeping the dedup state of a previous
// entry of the same series, and returns the entry now in the cache.
func (c *seriesCache) put(h1, h2 uint64, ref storage.SeriesRef) *cacheEntry {
	sh := &c.shards[h1%cacheShards]
	e := &cacheEntry{h2: h2, ref: ref}
	e.epoch.Store(c.epoch.Load())
	sh.mtx.Lock()
	if old := sh.m[h1]; old != nil && old.h2 == h2 {
		e.lastT.Store(old.lastT.Load())
		e.lastPair.Store(old.lastPair.Load())
	}
	sh.m[h1] = e
	sh.mtx.Unlock()
	return e
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
			if ep := e.epoch.Load(); ep != old && ep != old+1 {
				delete(sh.m, k)
				removed++
			}
		}
		sh.mtx.Unlock()
	}
	return removed
}

// reset empties the cache (after the HA label names of the tenant changed).
func (c *seriesCache) reset() {
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mtx.Lock()
		sh.m = map[uint64]*cacheEntry{}
		sh.mtx.Unlock()
	}
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
