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
// For a tenant with relabel rules the key is still the hash of the labels as
// they arrive and the reference is that of the relabeled series, so the
// rules run once per series, not per sample; several incoming series may
// share a reference (that is what a rename for continuity is for).
//
// For series of a Prometheus HA pair the entry also holds the dedup state
// (haState): the newest committed sample's timestamp and which replica sent
// it, and the claims of requests in flight.
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
	ref atomic.Uint64 // storage.SeriesRef; 0: labels not resolved yet (a deduplicated replica's series)

	epoch atomic.Uint32
	// limitsGen is the tenant's label-limits generation the series' labels
	// were last validated (and relabeled) under (see tenantState.limitsGen).
	limitsGen atomic.Uint32
	// relabeled: ref is what the tenant's relabel rules made of the labels
	// (or refDropped), so a change of rules must resolve the series again.
	relabeled atomic.Bool
	// ha is the dedup state of an HA pair's series.
	ha haState
}

func (e *cacheEntry) seriesRef() storage.SeriesRef { return storage.SeriesRef(e.ref.Load()) }

// refDropped is the reference of a series the tenant's relabel rules drop:
// its samples are acknowledged and dropped on the cache hit. No TSDB
// reference is ever all ones (the head's are a counter from 1).
const refDropped = storage.SeriesRef(^uint64(0))

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

// getOrCreate returns the entry of a label set, creating an empty one (no
// reference yet) if there is none. An entry is never replaced while its
// series is cached: the HA state in it is shared by concurrent requests.
func (c *seriesCache) getOrCreate(h1, h2 uint64) *cacheEntry {
	if e := c.get(h1, h2); e != nil {
		return e
	}
	sh := &c.shards[h1%cacheShards]
	sh.mtx.Lock()
	defer sh.mtx.Unlock()
	if e := sh.m[h1]; e != nil && e.h2 == h2 {
		return e
	}
	e := &cacheEntry{h2: h2}
	e.epoch.Store(c.epoch.Load())
	sh.m[h1] = e // a different series with the same first hash is replaced
	return e
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
