// The replacement phase of a pass: blocks another block replaces are
// marked for deletion.

package compact

import (
	"context"
	"fmt"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/storage/bucketindex"
)

// markReplaced marks for deletion each complete block that another
// complete, unmarked block replaces, by the rule readers hide blocks by
// (bucketindex.Replaced): the block the compactor keeps is the one readers
// read.
func (p *pass) markReplaced(ctx context.Context) error {
	var live []*block.Meta
	for _, id := range p.sortedIDs() {
		if b := p.blocks[id]; b.live() {
			live = append(live, b.meta)
		}
	}
	replaced := bucketindex.Replaced(live)
	for _, m := range live {
		by, ok := replaced[m.ULID]
		if !ok {
			continue
		}
		if err := p.markDeleted(ctx, p.blocks[m.ULID], "replaced", fmt.Sprintf("replaced by %s", by)); err != nil {
			return err
		}
	}
	return nil
}
