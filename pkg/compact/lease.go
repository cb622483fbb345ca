package compact

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/thanos-io/objstore"

	"github.com/gpustore/gpustore/pkg/block"
)

// LeaseFilename is the object, beside a tenant's blocks, that names the
// compactor working on the tenant.
const LeaseFilename = "compactor-lease.json"

// ErrLeaseLost is returned (wrapped) when another compactor took the
// tenant's lease while this one worked.
var ErrLeaseLost = errors.New("compactor lease lost to another compactor")

// lease is the JSON shape of LeaseFilename.
type lease struct {
	Owner string `json:"owner"`
	// Nonce tells this acquisition from an earlier one of the same owner.
	Nonce   string    `json:"nonce"`
	Expires time.Time `json:"expires"`
	Renewed time.Time `json:"renewed"`
}

// BucketLease keeps one compactor per tenant at a time among processes that
// share a bucket. Object storage has no compare-and-swap, so the lease is
// taken by write-then-read-back:
//
//  1. read the lease; if another owner's lease has not expired, give up;
//  2. write our own (owner, fresh nonce, expiry now+TTL);
//  3. wait Settle, then read it back: the lease is ours only if our nonce is
//     still there (a competitor that wrote after us wins, and we give up).
//
// The holder renews it every TTL/3 and reads it back before every change to
// the bucket (upload, mark, delete), stopping at once if it lost it.
//
// Limits: on a strongly consistent store (S3 since 2020, the filesystem)
// two compactors hold the lease at once only if one's read-write gap in
// step 1–2 spans the other's whole settle wait, or if a holder stalls past
// the expiry (GC pause, suspended VM) between its check and its change.
// Neither loses or doubles data: the compactor's changes are idempotent (a
// result found by its sources is not compacted again, a duplicate result is
// marked for deletion, marks are kept once), so a race costs repeated work.
type BucketLease struct {
	bkt    objstore.Bucket
	owner  string
	ttl    time.Duration
	settle time.Duration
	now    func() time.Time
}

// NewBucketLease returns leases held as owner (unique per process; empty
// picks a random one).
func NewBucketLease(bkt objstore.Bucket, owner string, ttl, settle time.Duration) *BucketLease {
	if owner == "" {
		owner = randomID()
	}
	return &BucketLease{bkt: bkt, owner: owner, ttl: ttl, settle: settle, now: time.Now}
}

// Held is one acquired lease.
type Held struct {
	l      *BucketLease
	tenant string
	nonce  string
}

func leaseObject(tenant string) string { return tenant + "/" + LeaseFilename }

// Acquire takes the tenant's lease. It returns nil without error when another
// compactor holds it.
func (l *BucketLease) Acquire(ctx context.Context, tenant string) (*Held, error) {
	cur, err := l.read(ctx, tenant)
	if err != nil {
		return nil, err
	}
	if cur != nil && cur.Owner != l.owner && l.now().Before(cur.Expires) {
		return nil, nil
	}
	h := &Held{l: l, tenant: tenant, nonce: randomID()}
	if err := l.write(ctx, tenant, h.nonce); err != nil {
		return nil, err
	}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(l.settle):
	}
	if err := h.Check(ctx); err != nil {
		if errors.Is(err, ErrLeaseLost) {
			return nil, nil
		}
		return nil, err
	}
	return h, nil
}

// Check returns ErrLeaseLost unless the lease is still this holder's and
// unexpired.
func (h *Held) Check(ctx context.Context) error {
	cur, err := h.l.read(ctx, h.tenant)
	if err != nil {
		return err
	}
	if cur == nil || cur.Nonce != h.nonce {
		return fmt.Errorf("tenant %q: %w", h.tenant, ErrLeaseLost)
	}
	if !h.l.now().Before(cur.Expires) {
		return fmt.Errorf("tenant %q: lease expired at %s: %w", h.tenant, cur.Expires.Format(time.RFC3339), ErrLeaseLost)
	}
	return nil
}

// Renew extends the lease by the TTL if it is still held.
func (h *Held) Renew(ctx context.Context) error {
	if err := h.Check(ctx); err != nil {
		return err
	}
	return h.l.write(ctx, h.tenant, h.nonce)
}

// Release gives the lease up (if still held), so another compactor need not
// wait for the expiry.
func (h *Held) Release(ctx context.Context) error {
	if err := h.Check(ctx); err != nil {
		if errors.Is(err, ErrLeaseLost) {
			return nil
		}
		return err
	}
	return h.l.bkt.Delete(ctx, leaseObject(h.tenant))
}

// KeepAlive renews the lease every TTL/3 until ctx ends; it calls lost (once)
// when the lease is lost or cannot be renewed before it expires.
func (h *Held) KeepAlive(ctx context.Context, lost func(error)) {
	t := time.NewTicker(h.l.ttl / 3)
	defer t.Stop()
	lastOK := h.l.now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := h.Renew(ctx)
		if ctx.Err() != nil {
			return
		}
		switch {
		case err == nil:
			lastOK = h.l.now()
		case errors.Is(err, ErrLeaseLost) || h.l.now().Sub(lastOK) >= h.l.ttl:
			lost(err)
			return
		}
	}
}

func (l *BucketLease) read(ctx context.Context, tenant string) (*lease, error) {
	rc, err := block.ExpectMissing(l.bkt).Get(ctx, leaseObject(tenant))
	if err != nil {
		if l.bkt.IsObjNotFoundErr(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("read compactor lease of tenant %q: %w", tenant, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return nil, fmt.Errorf("read compactor lease of tenant %q: %w", tenant, err)
	}
	var cur lease
	if err := json.Unmarshal(b, &cur); err != nil {
		// A torn or foreign object: treat as free; the read-back decides.
		return nil, nil
	}
	return &cur, nil
}

func (l *BucketLease) write(ctx context.Context, tenant, nonce string) error {
	now := l.now()
	b, err := json.Marshal(lease{Owner: l.owner, Nonce: nonce, Expires: now.Add(l.ttl), Renewed: now})
	if err != nil {
		return err
	}
	if err := l.bkt.Upload(ctx, leaseObject(tenant), bytes.NewReader(b)); err != nil {
		return fmt.Errorf("write compactor lease of tenant %q: %w", tenant, err)
	}
	return nil
}

func randomID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
