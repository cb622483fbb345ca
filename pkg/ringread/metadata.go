package ringread

import (
	"context"
	"errors"
	"net/http"

	"github.com/prometheus/prometheus/model/metadata"

	"github.com/gpustore/gpustore/pkg/tenancy"
	"github.com/gpustore/gpustore/pkg/tenantdb"
)

// MetadataPath is where a receiver answers the metric metadata (type, help,
// unit per metric family) it holds for the requesting tenant, for
// /api/v1/metadata of query processes that hold none themselves.
const MetadataPath = "/receiver/metadata"

// MetadataHandler answers the tenant's metadata as a JSON object of family
// name to metadata.Metadata. The tenant comes from the request as for
// remote reads (ReadHandler).
func MetadataHandler(dbs *tenantdb.Manager, tenants tenancy.Config) http.Handler {
	return getOnly(func(w http.ResponseWriter, r *http.Request) {
		id, ok := requestTenant(w, r, tenants)
		if !ok {
			return
		}
		out := map[string]metadata.Metadata{}
		if db := dbs.Existing(id); db != nil {
			for _, fam := range db.Metadata.Families() {
				out[fam], _ = db.Metadata.Get(fam)
			}
		}
		writeJSON(w, out)
	})
}

// Metadata returns the tenant's metric metadata from every healthy receiver
// of the ring (but Self): for each family, the answer of one of them (every
// receiver of a family's series got the same metadata from the
// distributors). The error reports receivers that failed beside the others'
// answers; it alone when none answered.
func (s *Source) Metadata(ctx context.Context, tenant string) (map[string]metadata.Metadata, error) {
	out := map[string]metadata.Metadata{}
	err := askEach(ctx, s, MetadataPath, tenant, "reading metadata", func(a map[string]metadata.Metadata) {
		for fam, m := range a {
			if _, ok := out[fam]; !ok {
				out[fam] = m
			}
		}
	})
	if errors.Is(err, errNoAnswer) {
		return nil, err
	}
	return out, err
}
