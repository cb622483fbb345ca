// Package blockquery reads the series of an immutable TSDB block (a local
// block or one in the bucket) for a select, without the per-series index
// work and the iterator layers of the TSDB's own block querier.
//
// A dashboard asks the same selectors again and again over blocks that never
// change. The TSDB's block querier answers each select from the index anew:
// it walks the postings, decodes every matching series entry (labels from the
// symbol table, chunk metas), and skips the series with no chunk in the
// window only after all that; a 24 h panel over a churning GPU fleet walks
// thousands of series of a 2-day block that hold nothing that day. This
// package resolves a selector once per block (postings, labels, chunk metas
// as the index holds them, for the whole block) and keeps the result in a
// Cache bounded in bytes: VictoriaMetrics keeps its tag-filter and
// metric-name caches for the same reason. A later select only filters the
// cached series by time, in a tight loop over their chunk metas, and hands
// the engine series whose iterator reads the chunks one after another
// (flat.go), with no tombstone or trimming layer between the chunk's own
// iterator and the caller.
//
// Blocks with tombstones are read by the TSDB's own querier: deletions are
// its business.
package blockquery

import (
	"container/list"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/model/labels"
)

// chunkMeta is a chunk of a cached series: its reference in the block and
// its closed time range.
type chunkMeta struct {
	ref        uint64
	mint, maxt int64
}

// cachedSeries is a series of a block that a selector matches.
type cachedSeries struct {
	lset   labels.Labels
	chunks []chunkMeta // in time order
}

// entry is a selector resolved on a block: its series in label order.
type entry struct {
	key    string
	series []cachedSeries
	bytes  int64
	elem   *list.Element
}

// Cache keeps resolved selectors, least recently used first out, within a
// bound of estimated bytes. It is safe for concurrent use.
type Cache struct {
	maxBytes int64

	mtx   sync.Mutex
	bytes int64
	lru   *list.List // of *entry, most recently used at the front
	byKey map[string]*entry
	// syms is the symbol table of every cached series' labels (in a
	// dedupelabels build): labels of one table are equal when their
	// encodings are, which the merges of blocks ask for every series
	// (seriesset). It grows with every name and value cached; past
	// maxSymbols the cache starts over with a new one.
	syms *labels.SymbolTable

	hits, misses, evictions prometheus.Counter
	size                    prometheus.GaugeFunc
}

// NewCache returns a cache of at most maxBytes (estimated); 0 caches nothing
// (every select resolves its selector from the index). Its metrics are
// registered with reg when reg is not nil.
func NewCache(maxBytes int64, reg prometheus.Registerer) *Cache {
	c := &Cache{maxBytes: maxBytes, lru: list.New(), byKey: map[string]*entry{}, syms: labels.NewSymbolTable()}
	c.hits = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "gpustore_blockquery_cache_hits_total", Help: "Selects on an immutable block answered from the series cache.",
	})
	c.misses = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "gpustore_blockquery_cache_misses_total", Help: "Selects on an immutable block resolved from the block's index.",
	})
	c.evictions = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "gpustore_blockquery_cache_evictions_total", Help: "Resolved selectors dropped to stay within the cache's bound.",
	})
	c.size = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "gpustore_blockquery_cache_bytes", Help: "Estimated bytes of the resolved selectors the series cache holds.",
	}, func() float64 {
		c.mtx.Lock()
		defer c.mtx.Unlock()
		return float64(c.bytes)
	})
	if reg != nil {
		reg.MustRegister(c.hits, c.misses, c.evictions, c.size)
	}
	return c
}

func (c *Cache) get(key string) []cachedSeries {
	if c == nil || c.maxBytes <= 0 {
		return nil
	}
	c.mtx.Lock()
	defer c.mtx.Unlock()
	e, ok := c.byKey[key]
	if !ok {
		c.misses.Inc()
		return nil
	}
	c.hits.Inc()
	c.lru.MoveToFront(e.elem)
	return e.series
}

// put keeps series under key unless they alone exceed the bound.
func (c *Cache) put(key string, series []cachedSeries) {
	if c == nil || c.maxBytes <= 0 {
		return
	}
	e := &entry{key: key, series: series, bytes: estimate(key, series)}
	if e.bytes > c.maxBytes/4 {
		return // one selector may not push everything else out
	}
	c.mtx.Lock()
	defer c.mtx.Unlock()
	if old, ok := c.byKey[key]; ok { // resolved concurrently: keep one
		c.lru.MoveToFront(old.elem)
		return
	}
	e.elem = c.lru.PushFront(e)
	c.byKey[key] = e
	c.bytes += e.bytes
	for c.bytes > c.maxBytes {
		last := c.lru.Back().Value.(*entry)
		c.lru.Remove(last.elem)
		delete(c.byKey, last.key)
		c.bytes -= last.bytes
		c.evictions.Inc()
	}
}

// maxSymbols bounds the cache's symbol table: ~50 MB of strings and maps at
// the length of a pod name.
const maxSymbols = 1 << 20

// symbols returns the table to build cached labels in, a new one (and an
// empty cache) when the current one holds more than maxSymbols.
func (c *Cache) symbols() *labels.SymbolTable {
	c.mtx.Lock()
	defer c.mtx.Unlock()
	if c.syms.Len() > maxSymbols {
		c.syms = labels.NewSymbolTable()
		c.lru.Init()
		c.byKey = map[string]*entry{}
		c.bytes = 0
	}
	return c.syms
}

// estimate is the memory of an entry: its key, the series' label data and
// slice headers, and their chunk metas.
func estimate(key string, series []cachedSeries) int64 {
	n := int64(len(key)) + 128
	for i := range series {
		n += 64 + int64(series[i].lset.ByteSize()) + int64(len(series[i].chunks))*24
	}
	return n
}
