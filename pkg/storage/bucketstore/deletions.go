package bucketstore

import (
	"context"
	"sync"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/storage"

	"github.com/gpustore/gpustore/pkg/deletion"
)

// deletions are the tenants' series deletion requests (pkg/deletion), which
// queries apply to the bucket's blocks until the compactor has rewritten
// them (and after: a late-shipped block may still hold deleted samples).
// A tenant without requests reads its blocks as they are.
type deletions struct {
	mtx    sync.RWMutex
	tenant map[string][]*deletion.Request
}

func (d *deletions) of(tenantID string) []*deletion.Request {
	d.mtx.RLock()
	defer d.mtx.RUnlock()
	return d.tenant[tenantID]
}

// over returns the tenant's requests that delete samples in [mint, maxt]
// (widened by deletionMargin: a select may read a downsampled window or a
// lookback beyond its querier's range): a query of other times reads the
// blocks as they are.
func (d *deletions) over(tenantID string, mint, maxt int64) []*deletion.Request {
	var out []*deletion.Request
	for _, r := range d.of(tenantID) {
		if r.MinTime <= maxt+deletionMargin && r.MaxTime >= mint-deletionMargin {
			out = append(out, r)
		}
	}
	return out
}

const deletionMargin = 2 * 3600_000 // ms: more than the 1h window and a lookback

// sync reads the tenant's requests, those already known from memory.
func (d *deletions) sync(ctx context.Context, s *Store, tenantID string) error {
	known := map[ulid.ULID]*deletion.Request{}
	for _, r := range d.of(tenantID) {
		known[r.ID] = r
	}
	reqs, err := deletion.List(ctx, s.bkt, tenantID, known)
	if err != nil {
		return err
	}
	d.mtx.Lock()
	defer d.mtx.Unlock()
	if d.tenant == nil {
		d.tenant = map[string][]*deletion.Request{}
	}
	// A request added (AddDeletion) while the listing ran is kept.
	listed := map[ulid.ULID]bool{}
	for _, r := range reqs {
		listed[r.ID] = true
	}
	for _, r := range d.tenant[tenantID] {
		if !listed[r.ID] {
			reqs = append(reqs, r)
		}
	}
	if len(reqs) == 0 {
		delete(d.tenant, tenantID)
	} else {
		d.tenant[tenantID] = reqs
	}
	return nil
}

// AddDeletion applies a deletion request just written to the bucket by this
// process to every query from now on, before the next sync lists it.
func (s *Store) AddDeletion(tenantID string, r *deletion.Request) {
	d := &s.dels
	d.mtx.Lock()
	defer d.mtx.Unlock()
	if d.tenant == nil {
		d.tenant = map[string][]*deletion.Request{}
	}
	for _, have := range d.tenant[tenantID] {
		if have.ID == r.ID {
			return
		}
	}
	d.tenant[tenantID] = append(d.tenant[tenantID], r)
}

// Deletions returns the tenant's deletion requests known to the store.
func (s *Store) Deletions(tenantID string) []*deletion.Request { return s.dels.of(tenantID) }

// deletedChunks applies reqs to a chunk series set (remote read): through
// samples, for tenants with requests only.
func deletedChunks(ss storage.ChunkSeriesSet, reqs []*deletion.Request) storage.ChunkSeriesSet {
	if len(reqs) == 0 {
		return ss
	}
	return storage.NewSeriesSetToChunkSet(deletion.Filter(storage.NewSeriesSetFromChunkSeriesSet(ss), reqs))
}
