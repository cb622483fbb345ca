package block

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/common/model"
	"github.com/thanos-io/objstore"
)

// TypesFilename is an optional object of a raw block: the metric type of each
// metric family the block holds, from the tenant's metadata as remote write
// sent it (pkg/tenantdb's metadata store). The compactor downsamples counters
// and gauges differently and may run alone, with nothing but the bucket, so
// the types travel with the blocks: the shipper writes the object before
// meta.json, the compactor carries the union of its sources' into a
// compacted block. Blocks without it are typed by their metric names.
//
// It is an object of its own rather than a field of meta.json because
// meta.json is copied into the tenant's bucket index for every block: a few
// hundred families per block would make the index, which every bucket store
// holds in memory, many times larger.
const TypesFilename = "metric-types.json"

// TypesVersion is the version of the types object's format.
const TypesVersion = 1

// Types maps a metric family to its type.
type Types map[string]model.MetricType

type typesFile struct {
	Version int   `json:"version"`
	Types   Types `json:"types"`
}

// WriteTypes uploads the block's metric types. Callers write it before the
// block's meta.json, so that a complete block has it whole (an upload cut
// short in between is a partial block, uploaded again). Nothing is written
// for empty types.
func WriteTypes(ctx context.Context, bkt objstore.Bucket, tenant string, id ulid.ULID, types Types) error {
	if len(types) == 0 {
		return nil
	}
	b, err := json.Marshal(typesFile{Version: TypesVersion, Types: types})
	if err != nil {
		return err
	}
	name := ObjectName(tenant, id, TypesFilename)
	if err := bkt.Upload(ctx, name, bytes.NewReader(b)); err != nil {
		return fmt.Errorf("upload %s: %w", name, err)
	}
	return nil
}

// ErrBadTypes is wrapped by ReadTypes' error for a types object that does
// not parse: the block is then typed by names, like one without it.
var ErrBadTypes = errors.New("bad metric types object")

// ReadTypes returns the block's metric types, nil without error when it has
// none (written before types were recorded, or no metadata was sent).
func ReadTypes(ctx context.Context, bkt objstore.BucketReader, tenant string, id ulid.ULID) (Types, error) {
	name := ObjectName(tenant, id, TypesFilename)
	var f typesFile
	if ok, err := readJSON(ctx, bkt, name, &f, ErrBadTypes); !ok || err != nil {
		return nil, err
	}
	if f.Version != TypesVersion {
		return nil, fmt.Errorf("%w: %s has version %d, want %d", ErrBadTypes, name, f.Version, TypesVersion)
	}
	return f.Types, nil
}

// Merge adds the types of newer into t (newer wins where they differ: a
// family's type changed between the blocks) and returns t.
func (t Types) Merge(newer Types) Types {
	if t == nil && len(newer) > 0 {
		t = make(Types, len(newer))
	}
	for f, typ := range newer {
		t[f] = typ
	}
	return t
}

// Lookup returns the type of a family (the signature of
// downsample.TypeLookup).
func (t Types) Lookup(family string) (model.MetricType, bool) {
	typ, ok := t[family]
	return typ, ok
}
