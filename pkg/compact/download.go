// The download of a plan's blocks into the working directory, and their
// verification when the TSDB's compactor fails on them.

package compact

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/tsdb/index"

	"github.com/gpustore/gpustore/pkg/block"
)

// errBlockUnreadable marks download errors that are the block's fault.
var errBlockUnreadable = errors.New("block unreadable")

// downloadPlan downloads the plan's blocks into work, each into a
// directory named by its ULID, and returns the directories. Blocks whose
// objects are missing or do not match their meta.json are marked
// no-compact (a *badBlocksError), after every other block was tried.
func (p *pass) downloadPlan(ctx context.Context, work string, plan []*block.Meta) ([]string, error) {
	dirs := make([]string, len(plan))
	var bad []ulid.ULID
	for i, m := range plan {
		dirs[i] = filepath.Join(work, m.ULID.String())
		if err := p.download(ctx, m, dirs[i]); err != nil {
			if !errors.Is(err, errBlockUnreadable) {
				return nil, err
			}
			if err := p.markNoCompact(ctx, m.ULID, "missing-object", err); err != nil {
				return nil, err
			}
			bad = append(bad, m.ULID)
		}
	}
	if len(bad) > 0 {
		return nil, &badBlocksError{ids: bad}
	}
	return dirs, nil
}

// download copies a block's files and its TSDB meta.json into dir.
func (p *pass) download(ctx context.Context, m *block.Meta, dir string) error {
	return block.Download(ctx, p.c.bkt, m, dir, errBlockUnreadable)
}

// verifyBlock reads a local block whole: every series of the index and
// every sample of its chunks. It returns the first read error.
func verifyBlock(dir string) (err error) {
	defer func() {
		if r := recover(); r != nil { // a corrupt block must not take the process down
			err = fmt.Errorf("reading block panicked: %v", r)
		}
	}()
	b, err := tsdb.OpenBlock(nil, dir, nil, nil)
	if err != nil {
		return err
	}
	defer b.Close()
	ir, err := b.Index()
	if err != nil {
		return err
	}
	defer ir.Close()
	cr, err := b.Chunks()
	if err != nil {
		return err
	}
	defer cr.Close()
	name, value := index.AllPostingsKey()
	ps, err := ir.Postings(context.Background(), name, value)
	if err != nil {
		return err
	}
	var (
		sb   labels.ScratchBuilder
		chks []chunks.Meta
		it   chunkenc.Iterator
	)
	for ps.Next() {
		if err := ir.Series(ps.At(), &sb, &chks); err != nil {
			return fmt.Errorf("series %d: %w", ps.At(), err)
		}
		for _, cm := range chks {
			c, iter, err := cr.ChunkOrIterable(cm)
			if err != nil {
				return fmt.Errorf("chunk of series %s: %w", sb.Labels(), err)
			}
			if c != nil {
				it = c.Iterator(it)
			} else {
				it = iter.Iterator(it)
			}
			for it.Next() != chunkenc.ValNone {
			}
			if err := it.Err(); err != nil {
				return fmt.Errorf("chunk of series %s: %w", sb.Labels(), err)
			}
		}
	}
	return ps.Err()
}
