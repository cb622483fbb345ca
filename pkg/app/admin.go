package app

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/gpustore/gpustore/pkg/deletion"
	"github.com/gpustore/gpustore/pkg/query"
)

// tsdbAdmin is the query API's admin operations (query.Admin) on this
// process's tenant TSDBs and the bucket: a deletion is recorded in the
// bucket first (pkg/deletion: the bucket store applies it to every query of
// the tenant's bucket blocks from then on, the compactor rewrites the
// blocks), then applied to the tenant's head and local blocks as
// tombstones, and the tenant's results cache generation moves on.
type tsdbAdmin struct {
	a *App

	mtx  sync.Mutex
	gens map[string]uint64 // deletions made through this process, per tenant
}

var _ query.Admin = (*tsdbAdmin)(nil)

func (t *tsdbAdmin) DeleteSeries(ctx context.Context, tenantID string, selectors []string, mint, maxt int64) error {
	now := time.Now()
	// A deletion is of the samples stored until now: samples written later
	// (a series that comes back) are kept, and the compactor knows which
	// blocks may hold deleted ones (deletion.go in pkg/compact).
	maxt = min(maxt, now.UnixMilli())
	if mint > maxt {
		return nil // nothing stored yet in the range
	}
	req, err := deletion.New(selectors, mint, maxt, now)
	if err != nil {
		return err
	}
	// Whatever happens next, no cached answer of before is served again.
	defer t.bump(tenantID)
	if t.a.Bucket != nil {
		if err := deletion.Write(ctx, t.a.Bucket, tenantID, req); err != nil {
			return err
		}
		if t.a.BucketStore != nil {
			t.a.BucketStore.AddDeletion(tenantID, req)
		}
	}
	if db := t.a.DBs.Existing(tenantID); db != nil {
		for _, ms := range req.Matchers() {
			if err := db.Delete(ctx, mint, maxt, ms...); err != nil {
				return fmt.Errorf("delete series of tenant %q: %w", tenantID, err)
			}
		}
	}
	t.a.Logger.Info("series deleted", "tenant", tenantID, "request", req.ID, "selectors", selectors, "mint", mint, "maxt", maxt)
	return nil
}

func (t *tsdbAdmin) CleanTombstones(_ context.Context, tenantID string) error {
	db := t.a.DBs.Existing(tenantID)
	if db == nil {
		return nil
	}
	if err := db.CleanTombstones(); err != nil {
		return fmt.Errorf("clean tombstones of tenant %q: %w", tenantID, err)
	}
	return nil
}

// Snapshot writes <tenant's TSDB>/snapshots/<name>, as Prometheus writes
// <data>/snapshots/<name>.
func (t *tsdbAdmin) Snapshot(_ context.Context, tenantID string, skipHead bool) (string, error) {
	db := t.a.DBs.Existing(tenantID)
	if db == nil {
		return "", query.ErrNoTenantData
	}
	name := fmt.Sprintf("%s-%016x", time.Now().UTC().Format("20060102T150405Z0700"), rand.Uint64())
	dir := filepath.Join(t.a.DBs.TenantDir(tenantID), "snapshots", name)
	if err := db.Snapshot(dir, !skipHead); err != nil {
		return "", fmt.Errorf("snapshot of tenant %q: %w", tenantID, err)
	}
	return name, nil
}

func (t *tsdbAdmin) bump(tenantID string) {
	t.mtx.Lock()
	defer t.mtx.Unlock()
	if t.gens == nil {
		t.gens = map[string]uint64{}
	}
	t.gens[tenantID]++
}

// Generation names the deletions the tenant's answers reflect: those made
// here and those the bucket store learnt from the bucket (made through
// another process).
func (t *tsdbAdmin) Generation(tenantID string) string {
	t.mtx.Lock()
	n := t.gens[tenantID]
	t.mtx.Unlock()
	gen := strconv.FormatUint(n, 10)
	if t.a.BucketStore != nil {
		if reqs := t.a.BucketStore.Deletions(tenantID); len(reqs) > 0 {
			gen += "." + reqs[len(reqs)-1].ID.String() + "." + strconv.Itoa(len(reqs))
		}
	}
	return gen
}
