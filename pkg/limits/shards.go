package limits

import (
	"sync"
	"time"
)

// IngestionShardSize is the tenant's shuffle shard size now (0: every
// receiver); distributors write the tenant's series to that shard.
func (o *Overrides) IngestionShardSize(tenant string) int { return o.For(tenant).IngestionShardSize }

// IngestionShardSizeSince is the shard a read of the tenant's receivers
// must cover to find what was written since: the largest of the shard
// sizes in force from since to now as this process saw them (0, every
// receiver, when any of them was 0). dskit's shuffle shards are nested (a
// tenant's shard of n receivers is part of its shard of n+1 in the same
// ring), so the largest covers every smaller one: after a shard shrinks,
// the receivers it dropped, which still hold the tenant's recent samples,
// are read until since passes the change.
//
// What the process saw: sizes are remembered from reloads of the overrides
// file, not from before the process started. A querier started shortly
// after a shard shrank reads only the new shard until the receivers it
// dropped have shipped their heads (docs/scale-out.md).
func (o *Overrides) IngestionShardSizeSince(tenant string, since time.Time) int {
	return o.shards.widest(tenant, o.IngestionShardSize(tenant), since)
}

// shardHistory remembers, per tenant, the shard sizes that reloads of the
// overrides file replaced and until when they were in force.
type shardHistory struct {
	mtx     sync.Mutex
	last    *overridesFile // the last file loaded; nil before the first
	changes map[string][]shardChange
}

type shardChange struct {
	size  int
	until time.Time
}

// shardHistoryKeep bounds how long a replaced size is remembered: longer
// than any lookback a read uses (the receivers' retention and a block).
const shardHistoryKeep = 7 * 24 * time.Hour

// loaded records the sizes that the file f, just loaded at now, replaces.
func (h *shardHistory) loaded(f *overridesFile, defaults Limits, now time.Time) {
	h.mtx.Lock()
	defer h.mtx.Unlock()
	prev := h.last
	h.last = f
	if prev == nil {
		return // the first load: what was in force before is not known
	}
	sizeIn := func(f *overridesFile, tenant string) int {
		if l, ok := f.Overrides[tenant]; ok {
			return l.IngestionShardSize
		}
		return defaults.IngestionShardSize
	}
	record := func(tenant string) {
		if old := sizeIn(prev, tenant); old != sizeIn(f, tenant) {
			if h.changes == nil {
				h.changes = map[string][]shardChange{}
			}
			h.changes[tenant] = append(h.changes[tenant], shardChange{size: old, until: now})
		}
	}
	for tenant := range prev.Overrides {
		record(tenant)
	}
	for tenant := range f.Overrides {
		if _, ok := prev.Overrides[tenant]; !ok {
			record(tenant)
		}
	}
	for tenant, cs := range h.changes {
		i := 0
		for i < len(cs) && now.Sub(cs[i].until) > shardHistoryKeep {
			i++
		}
		if i == len(cs) {
			delete(h.changes, tenant)
		} else {
			h.changes[tenant] = cs[i:]
		}
	}
}

// widest is the largest of current and the sizes in force after since (0
// wins: every receiver).
func (h *shardHistory) widest(tenant string, current int, since time.Time) int {
	h.mtx.Lock()
	defer h.mtx.Unlock()
	size := current
	for _, c := range h.changes[tenant] {
		if c.until.Before(since) {
			continue
		}
		if size == 0 || c.size == 0 {
			return 0
		}
		size = max(size, c.size)
	}
	return size
}
