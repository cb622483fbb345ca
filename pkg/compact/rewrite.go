package compact

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/thanos-io/objstore"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/rewrite"
)

// Rewritten is what RewriteBlock did to a bucket block.
type Rewritten struct {
	// New is the block that replaced the old one; nil when nothing of the
	// old one was left, or nothing changed (Changed false).
	New *block.Meta
	// DroppedSeries counts the series left out wholly.
	DroppedSeries int
	// Changed: the old block lost something and is marked for deletion.
	Changed bool
}

// RewriteBlock replaces a block of the bucket with a rewrite of it
// (pkg/rewrite, Replacement lineage) and marks the old one for deletion,
// while held is the tenant's lease. src is the block downloaded into a
// local directory, possibly with tombstones written into it (they are
// applied). When the rewrite leaves out no series and tombstoned is false,
// nothing changes in the bucket (Changed false). The new
// block keeps the old one's encoding, metric types and gpustore section,
// so readers and the compactor take it for the old one.
func RewriteBlock(ctx context.Context, bkt objstore.Bucket, held *Held, tenant string, m *block.Meta, src string, tombstoned bool, o rewrite.Options, logger *slog.Logger) (Rewritten, error) {
	dst := filepath.Join(filepath.Dir(src), "rewritten")
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return Rewritten{}, err
	}
	defer os.RemoveAll(dst)
	o.Lineage = rewrite.Replacement
	res, err := rewrite.Block(ctx, logger, src, dst, o)
	if err != nil {
		return Rewritten{}, err
	}
	if res.DroppedSeries == 0 && !tombstoned {
		return Rewritten{}, nil
	}
	out := Rewritten{DroppedSeries: res.DroppedSeries, Changed: true}
	details := "rewritten: no series left"
	if res.Meta != nil {
		nm := &block.Meta{BlockMeta: *res.Meta, GPUStore: m.GPUStore}
		nm.GPUStore.Files = nil
		types, err := block.ReadTypes(ctx, bkt, tenant, m.ULID)
		if err != nil && !errors.Is(err, block.ErrBadTypes) {
			return Rewritten{}, err
		}
		if err := held.Check(ctx); err != nil {
			return Rewritten{}, err
		}
		if len(types) > 0 {
			if err := block.WriteTypes(ctx, bkt, tenant, nm.ULID, types); err != nil {
				return Rewritten{}, err
			}
		}
		if err := block.UploadEncoded(ctx, bkt, res.Dir, nm, block.EncodingsOf(m)); err != nil { // as the old block
			return Rewritten{}, err
		}
		out.New = nm
		details = "rewritten into " + nm.ULID.String()
	}
	if err := held.Check(ctx); err != nil {
		return Rewritten{}, err
	}
	if err := block.WriteDeletionMark(ctx, bkt, tenant, m.ULID, details, time.Now()); err != nil {
		return Rewritten{}, fmt.Errorf("mark block %s for deletion: %w", m.ULID, err)
	}
	return out, nil
}
