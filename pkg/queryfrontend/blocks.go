package queryfrontend

import (
	"github.com/oklog/ulid/v2"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/tenantdb"
)

// TenantBlocks lists a tenant's blocks as the query path reads them: the
// local TSDB's blocks, and the bucket's (bucket may be nil) that are not
// also local (pkg/query reads those from disk).
func TenantBlocks(dbs *tenantdb.Manager, bucket func(tenant string) []block.Meta) func(tenant string) []Block {
	return func(tenantID string) []Block {
		var out []Block
		local := map[ulid.ULID]bool{}
		if db := dbs.Existing(tenantID); db != nil {
			for _, b := range db.Blocks() {
				m := b.Meta()
				local[m.ULID] = true
				out = append(out, Block{ID: m.ULID, MinTime: m.MinTime, MaxTime: m.MaxTime, Local: true})
			}
		}
		if bucket != nil {
			for _, m := range bucket(tenantID) {
				if !local[m.ULID] {
					out = append(out, Block{ID: m.ULID, MinTime: m.MinTime, MaxTime: m.MaxTime})
				}
			}
		}
		return out
	}
}
