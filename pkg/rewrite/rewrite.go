// Package rewrite writes a new TSDB block from an existing one, leaving out
// the series that match given matchers and the samples outside a time
// range, and applying the block's tombstones: Thanos' `tools bucket
// rewrite` and Prometheus' clean_tombstones, on one local block.
//
// The new block is written by the TSDB's own compactor (LeveledCompactor.
// Write over the source block seen through a filter), so its index and
// chunks are the TSDB's format and the samples are re-encoded only where a
// chunk is cut. Left-out series take nothing with them: they are not in the
// new index, and their label values are not in its symbol table (the use
// case includes removing personal data that a pod label carried).
//
// Callers: `gpustore tools bucket rewrite` (a block of the bucket, the old
// one marked for deletion), `tools bucket upload-blocks` and the block-upload
// API (a block cut at the compactor's largest range, tombstones applied);
// the compactor's series deletion is meant to call it too.
package rewrite

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/tsdb/index"
)

// Lineage says how the new block's compaction section relates to the
// source's.
type Lineage int

const (
	// Replacement keeps the source's level and compaction sources, with the
	// source as its parent: the new block stands for the same data (readers
	// hide the source once they see it, bucketindex.Replaced), so the
	// compactor neither compacts nor downsamples it again for its own sake.
	Replacement Lineage = iota
	// Piece makes a block of its own (level 1, its own ULID as its only
	// source) with the source as its parent: a part of the source's time
	// range, which must not stand for the whole.
	Piece
)

// Options say what the new block leaves out and what it is.
type Options struct {
	// Drop: a series matching every matcher of any one set is left out.
	Drop [][]*labels.Matcher
	// MinTime and MaxTime bound the new block, [MinTime, MaxTime); both 0:
	// the source's range. Samples outside are left out.
	MinTime, MaxTime int64
	// ULID of the new block; zero: a new one.
	ULID    ulid.ULID
	Lineage Lineage
}

// Result is the new block.
type Result struct {
	// Meta is the new block's meta.json; nil when nothing was left (every
	// series dropped or no sample in the range): no block was written.
	Meta *tsdb.BlockMeta
	// Dir is the new block's directory (dst/<ULID>); empty with Meta nil.
	Dir string
	// DroppedSeries counts the source's series left out by Drop.
	DroppedSeries int
}

// Block writes the block in src, filtered by o, as a new block into the
// directory dst (which must exist; the block goes to dst/<ULID>).
func Block(ctx context.Context, logger *slog.Logger, src, dst string, o Options) (Result, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	b, err := tsdb.OpenBlock(logger, src, nil, nil)
	if err != nil {
		return Result{}, fmt.Errorf("open block %s: %w", src, err)
	}
	defer b.Close()
	meta := b.Meta()
	mint, maxt := o.MinTime, o.MaxTime
	if mint == 0 && maxt == 0 {
		mint, maxt = meta.MinTime, meta.MaxTime
	}
	if mint >= maxt {
		return Result{}, fmt.Errorf("rewrite %s: empty range [%d, %d)", meta.ULID, mint, maxt)
	}

	fb := &filteredBlock{Block: b}
	var res Result
	if len(o.Drop) > 0 {
		if res.DroppedSeries, err = fb.dropMatching(ctx, o.Drop); err != nil {
			return Result{}, fmt.Errorf("rewrite %s: %w", meta.ULID, err)
		}
	}

	lc, err := tsdb.NewLeveledCompactorWithOptions(ctx, nil, logger, []int64{maxt - mint}, chunkenc.NewPool(), tsdb.LeveledCompactorOptions{})
	if err != nil {
		return Result{}, err
	}
	ids, err := lc.Write(dst, fb, mint, maxt, &meta)
	if err != nil {
		return Result{}, fmt.Errorf("rewrite %s: %w", meta.ULID, err)
	}
	if len(ids) == 0 {
		return res, nil
	}
	dir := filepath.Join(dst, ids[0].String())
	nm, err := readMeta(dir)
	if err != nil {
		return Result{}, err
	}
	if o.ULID != (ulid.ULID{}) && o.ULID != nm.ULID {
		want := filepath.Join(dst, o.ULID.String())
		if err := os.RemoveAll(want); err != nil {
			return Result{}, err
		}
		if err := os.Rename(dir, want); err != nil {
			return Result{}, fmt.Errorf("rename rewritten block: %w", err)
		}
		dir = want
		nm.ULID = o.ULID
	}
	switch o.Lineage {
	case Replacement:
		nm.Compaction.Level = max(1, meta.Compaction.Level)
		nm.Compaction.Sources = slices.Clone(meta.Compaction.Sources)
		if len(nm.Compaction.Sources) == 0 {
			nm.Compaction.Sources = []ulid.ULID{meta.ULID}
		}
		nm.Compaction.Hints = slices.Clone(meta.Compaction.Hints)
	case Piece:
		nm.Compaction.Level = 1
		nm.Compaction.Sources = []ulid.ULID{nm.ULID}
	}
	if err := writeMeta(dir, nm); err != nil {
		return Result{}, err
	}
	res.Meta, res.Dir = nm, dir
	return res, nil
}

// filteredBlock is a block whose index leaves out the dropped series (its
// postings skip them) and the symbols only they use.
type filteredBlock struct {
	*tsdb.Block
	drop    map[storage.SeriesRef]struct{}
	symbols []string // the kept series' symbols, sorted; nil: the block's own
}

func (f *filteredBlock) Index() (tsdb.IndexReader, error) {
	ir, err := f.Block.Index()
	if err != nil || f.drop == nil {
		return ir, err
	}
	return &filteredIndex{IndexReader: ir, f: f}, nil
}

// dropMatching finds the series to leave out and the symbols of the others.
func (f *filteredBlock) dropMatching(ctx context.Context, drop [][]*labels.Matcher) (int, error) {
	ir, err := f.Block.Index()
	if err != nil {
		return 0, err
	}
	defer ir.Close()
	f.drop = map[storage.SeriesRef]struct{}{}
	for _, ms := range drop {
		if len(ms) == 0 {
			return 0, errors.New("an empty matcher set would drop every series")
		}
		p, err := tsdb.PostingsForMatchers(ctx, ir, ms...)
		if err != nil {
			return 0, fmt.Errorf("find series matching %v: %w", ms, err)
		}
		for p.Next() {
			f.drop[p.At()] = struct{}{}
		}
		if err := p.Err(); err != nil {
			return 0, err
		}
	}
	if len(f.drop) == 0 {
		f.drop = nil // nothing to leave out: the block's own index
		return 0, nil
	}
	// The kept series' symbols. The index writer needs every symbol its
	// series use, and nothing else should go into the new block.
	syms := map[string]struct{}{}
	k, v := index.AllPostingsKey()
	all, err := ir.Postings(ctx, k, v)
	if err != nil {
		return 0, err
	}
	var (
		sb   labels.ScratchBuilder
		chks []chunks.Meta
	)
	for all.Next() {
		if _, ok := f.drop[all.At()]; ok {
			continue
		}
		if err := ir.Series(all.At(), &sb, &chks); err != nil {
			return 0, err
		}
		sb.Labels().Range(func(l labels.Label) {
			if _, ok := syms[l.Name]; !ok {
				syms[l.Name] = struct{}{}
			}
			if _, ok := syms[l.Value]; !ok {
				syms[l.Value] = struct{}{}
			}
		})
	}
	if err := all.Err(); err != nil {
		return 0, err
	}
	f.symbols = make([]string, 0, len(syms))
	for s := range syms {
		f.symbols = append(f.symbols, s)
	}
	slices.Sort(f.symbols)
	return len(f.drop), nil
}

type filteredIndex struct {
	tsdb.IndexReader
	f *filteredBlock
}

func (ix *filteredIndex) Symbols() index.StringIter { return index.NewStringListIter(ix.f.symbols) }

func (ix *filteredIndex) Postings(ctx context.Context, name string, values ...string) (index.Postings, error) {
	p, err := ix.IndexReader.Postings(ctx, name, values...)
	if err != nil {
		return nil, err
	}
	return &keptPostings{Postings: p, drop: ix.f.drop}, nil
}

func (ix *filteredIndex) SortedPostings(p index.Postings) index.Postings {
	return &keptPostings{Postings: ix.IndexReader.SortedPostings(p), drop: ix.f.drop}
}

// keptPostings skips the dropped series.
type keptPostings struct {
	index.Postings
	drop map[storage.SeriesRef]struct{}
}

func (p *keptPostings) Next() bool {
	for p.Postings.Next() {
		if _, ok := p.drop[p.Postings.At()]; !ok {
			return true
		}
	}
	return false
}

func (p *keptPostings) Seek(v storage.SeriesRef) bool {
	if !p.Postings.Seek(v) {
		return false
	}
	if _, ok := p.drop[p.Postings.At()]; !ok {
		return true
	}
	return p.Next()
}

func readMeta(dir string) (*tsdb.BlockMeta, error) {
	b, err := os.ReadFile(filepath.Join(dir, "meta.json"))
	if err != nil {
		return nil, err
	}
	var m tsdb.BlockMeta
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("parse %s: %w", filepath.Join(dir, "meta.json"), err)
	}
	return &m, nil
}

// writeMeta replaces dir's meta.json (a new file renamed over the old one).
func writeMeta(dir string, m *tsdb.BlockMeta) error {
	b, err := json.MarshalIndent(m, "", "\t")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "meta.json.tmp")
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, "meta.json"))
}
