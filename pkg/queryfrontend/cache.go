package queryfrontend

import (
	"container/list"
	"sync"
	"time"
)

// entry is the cached answer of one query for the steps [start, end] of
// one UTC day (one extent; a request that needs steps on either side
// computes only those and the entry grows).
type entry struct {
	key        string
	start, end int64 // first and last cached step, ms
	// layout fingerprints the blocks the day's answer was read from; an
	// entry whose day now reads other blocks (compaction, downsampling,
	// retention, upload, out-of-order blocks) is stale.
	layout uint64
	// oooWindow is the tenant's out-of-order window when the entry was
	// filled: if it grows, samples may land where the entry said final.
	oooWindow time.Duration
	answer    answer
	size      int64
}

// cache is a least-recently-used map of entries bounded by their
// estimated size.
type cache struct {
	mtx      sync.Mutex
	maxBytes int64
	bytes    int64
	ll       *list.List // front: most recently used
	items    map[string]*list.Element
	// onEvict is told of every entry dropped to make room.
	onEvict func()
}

func newCache(maxBytes int64, onEvict func()) *cache {
	return &cache{maxBytes: maxBytes, ll: list.New(), items: map[string]*list.Element{}, onEvict: onEvict}
}

func (c *cache) get(key string) *entry {
	c.mtx.Lock()
	defer c.mtx.Unlock()
	el, ok := c.items[key]
	if !ok {
		return nil
	}
	c.ll.MoveToFront(el)
	return el.Value.(*entry)
}

// put stores e (replacing the key's entry) and evicts the least recently
// used entries beyond the bound. An entry larger than the whole bound is
// not stored.
func (c *cache) put(e *entry) {
	e.size = sizeOf(e.answer) + int64(len(e.key)) + 128
	c.mtx.Lock()
	defer c.mtx.Unlock()
	if el, ok := c.items[e.key]; ok {
		c.bytes -= el.Value.(*entry).size
		c.ll.Remove(el)
		delete(c.items, e.key)
	}
	if e.size > c.maxBytes {
		return
	}
	c.items[e.key] = c.ll.PushFront(e)
	c.bytes += e.size
	for c.bytes > c.maxBytes {
		el := c.ll.Back()
		old := el.Value.(*entry)
		c.ll.Remove(el)
		delete(c.items, old.key)
		c.bytes -= old.size
		if c.onEvict != nil {
			c.onEvict()
		}
	}
}

// drop removes key's entry (it was found stale).
func (c *cache) drop(key string) {
	c.mtx.Lock()
	defer c.mtx.Unlock()
	if el, ok := c.items[key]; ok {
		c.bytes -= el.Value.(*entry).size
		c.ll.Remove(el)
		delete(c.items, key)
	}
}

// usage returns the cached bytes and entries.
func (c *cache) usage() (int64, int) {
	c.mtx.Lock()
	defer c.mtx.Unlock()
	return c.bytes, len(c.items)
}
