// Package deletion is the durable record of a tenant's series deletions in
// the bucket: what the admin API's delete_series asked for, kept where every
// process that reads or rewrites the tenant's blocks finds it.
//
// The head and local blocks of a receiver take a deletion as tombstones at
// once (tsdb.DB.Delete), but blocks already in the bucket (and the 5m and 1h
// copies the compactor made of them) are immutable objects that other
// processes read. So a deletion is also written as a request object,
// <tenant>/deletions/<ID>/request.json, which
//
//   - the bucket store applies at query time to the tenant's bucket blocks
//     (Filter), from the moment it learns it (at once in the process that
//     took the request, at its next sync elsewhere);
//   - the compactor applies to the blocks themselves, rewriting every block
//     that may hold deleted samples without them (pkg/compact, deletions.go),
//     after which the old blocks are deleted like any replaced block.
//
// Requests are never removed: a block shipped late by a receiver (cut
// before the deletion, uploaded after) is still found and rewritten, and
// the query-time filter keeps costing nothing for series that match none.
package deletion

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/tsdb/tombstones"
	"github.com/thanos-io/objstore"
)

// Dir is the directory of a tenant's deletion requests.
func Dir(tenant string) string { return tenant + "/deletions/" }

const (
	requestFile = "request.json"
	cutoffFile  = "cutoff.json"
)

// Request is one delete_series call: the series matching any of Selectors
// lose their samples in [MinTime, MaxTime] (milliseconds, inclusive, as
// Prometheus' tombstones).
type Request struct {
	ID        ulid.ULID `json:"id"`
	Selectors []string  `json:"selectors"`
	MinTime   int64     `json:"min_time"`
	MaxTime   int64     `json:"max_time"`
	// Created is when the request was accepted.
	Created time.Time `json:"created"`

	matchers [][]*labels.Matcher
}

// New returns a request for the selectors (PromQL series selectors, as
// delete_series' match[]) over [mint, maxt].
func New(selectors []string, mint, maxt int64, now time.Time) (*Request, error) {
	if len(selectors) == 0 {
		return nil, errors.New("no series selector")
	}
	if mint > maxt {
		return nil, fmt.Errorf("start %d after end %d", mint, maxt)
	}
	r := &Request{
		ID:        ulid.MustNew(ulid.Timestamp(now), rand.Reader),
		Selectors: selectors,
		MinTime:   mint,
		MaxTime:   maxt,
		Created:   now.UTC(),
	}
	if err := r.parse(); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *Request) parse() error {
	p := parser.NewParser(parser.Options{})
	r.matchers = r.matchers[:0]
	for _, s := range r.Selectors {
		ms, err := p.ParseMetricSelector(s)
		if err != nil {
			return fmt.Errorf("selector %q: %w", s, err)
		}
		r.matchers = append(r.matchers, ms)
	}
	return nil
}

// Matchers are the parsed selectors.
func (r *Request) Matchers() [][]*labels.Matcher { return r.matchers }

// Matches says whether the series lset is one the request deletes from.
func (r *Request) Matches(lset labels.Labels) bool {
	for _, ms := range r.matchers {
		if matchesAll(ms, lset) {
			return true
		}
	}
	return false
}

func matchesAll(ms []*labels.Matcher, lset labels.Labels) bool {
	for _, m := range ms {
		if !m.Matches(lset.Get(m.Name)) {
			return false
		}
	}
	return true
}

// Overlaps says whether [mint, maxt) (a block's range) holds samples the
// request deletes.
func (r *Request) Overlaps(mint, maxt int64) bool {
	return r.MinTime < maxt && r.MaxTime >= mint
}

// Intervals returns, for the series lset, the deleted intervals of the
// requests (nil: none of them deletes from it).
func Intervals(reqs []*Request, lset labels.Labels) tombstones.Intervals {
	var iv tombstones.Intervals
	for _, r := range reqs {
		if r.Matches(lset) {
			iv = iv.Add(tombstones.Interval{Mint: r.MinTime, Maxt: r.MaxTime})
		}
	}
	return iv
}

// Write stores the request in the tenant's directory of the bucket.
func Write(ctx context.Context, bkt objstore.Bucket, tenant string, r *Request) error {
	raw, err := json.Marshal(r)
	if err != nil {
		return err
	}
	name := Dir(tenant) + r.ID.String() + "/" + requestFile
	if err := bkt.Upload(ctx, name, bytes.NewReader(raw)); err != nil {
		return fmt.Errorf("write deletion request %s: %w", name, err)
	}
	return nil
}

// List reads the tenant's requests in the order they were made. known are
// requests read before (by ID): immutable, they are not read again.
func List(ctx context.Context, bkt objstore.BucketReader, tenant string, known map[ulid.ULID]*Request) ([]*Request, error) {
	var ids []ulid.ULID
	err := bkt.Iter(ctx, Dir(tenant), func(name string) error {
		id, err := ulid.ParseStrict(path.Base(strings.TrimSuffix(name, "/")))
		if err == nil {
			ids = append(ids, id)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list deletion requests of tenant %q: %w", tenant, err)
	}
	out := make([]*Request, 0, len(ids))
	for _, id := range ids {
		if r := known[id]; r != nil {
			out = append(out, r)
			continue
		}
		r, err := read(ctx, bkt, tenant, id)
		if err != nil {
			return nil, err
		}
		if r != nil {
			out = append(out, r)
		}
	}
	sortByID(out)
	return out, nil
}

func read(ctx context.Context, bkt objstore.BucketReader, tenant string, id ulid.ULID) (*Request, error) {
	name := Dir(tenant) + id.String() + "/" + requestFile
	rc, err := bkt.Get(ctx, name)
	if bkt.IsObjNotFoundErr(err) {
		return nil, nil // a directory whose request is not written (yet)
	}
	if err != nil {
		return nil, fmt.Errorf("read deletion request %s: %w", name, err)
	}
	defer rc.Close()
	var r Request
	if err := json.NewDecoder(rc).Decode(&r); err != nil {
		return nil, fmt.Errorf("deletion request %s: %w", name, err)
	}
	if r.ID != id {
		return nil, fmt.Errorf("deletion request %s names %s", name, r.ID)
	}
	if err := r.parse(); err != nil {
		return nil, fmt.Errorf("deletion request %s: %w", name, err)
	}
	return &r, nil
}

func sortByID(rs []*Request) {
	slices.SortFunc(rs, func(a, b *Request) int { return a.ID.Compare(b.ID) })
}

// Cutoff is the compactor's record of a request: every block of the
// tenant written before Time (by ULID) may hold deleted samples and is
// rewritten; blocks written after come from inputs already rewritten.
// The compactor sets it, under the tenant's lease, at the start of the
// first pass that sees the request: no pass that read blocks before the
// request was made can still be writing then.
type Cutoff struct {
	Time time.Time `json:"time"`
	// Checked are the blocks written before Time that the compactor has
	// rewritten, or found holding none of the request's samples.
	Checked []ulid.ULID `json:"checked,omitempty"`
}

// ReadCutoff returns the request's cutoff, or nil when none is set.
func ReadCutoff(ctx context.Context, bkt objstore.BucketReader, tenant string, id ulid.ULID) (*Cutoff, error) {
	name := Dir(tenant) + id.String() + "/" + cutoffFile
	rc, err := bkt.Get(ctx, name)
	if bkt.IsObjNotFoundErr(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	defer rc.Close()
	var c Cutoff
	if err := json.NewDecoder(rc).Decode(&c); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return &c, nil
}

// WriteCutoff stores the request's cutoff.
func WriteCutoff(ctx context.Context, bkt objstore.Bucket, tenant string, id ulid.ULID, c Cutoff) error {
	raw, err := json.Marshal(c)
	if err != nil {
		return err
	}
	name := Dir(tenant) + id.String() + "/" + cutoffFile
	if err := bkt.Upload(ctx, name, bytes.NewReader(raw)); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	return nil
}
