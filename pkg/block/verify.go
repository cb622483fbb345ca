package block

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/tsdb/index"
	"github.com/prometheus/prometheus/tsdb/tombstones"
)

// ErrInvalidBlock is wrapped by VerifyLocal's errors for a block that was
// read and is wrong (as opposed to one that could not be read at all): it
// will not get better by reading it again.
var ErrInvalidBlock = errors.New("invalid block")

// Verified is what VerifyLocal counted while reading a block whole.
type Verified struct {
	Meta    tsdb.BlockMeta
	Series  uint64
	Chunks  uint64
	Samples uint64
	// MinSample and MaxSample are the first and last sample times found
	// (0 when the block has no sample).
	MinSample, MaxSample int64
	// TombstonedSeries counts the series with deletion intervals: the
	// block's chunks still hold what they cover until it is rewritten.
	TombstonedSeries int
}

// VerifyLocal reads the local block directory dir whole and checks what the
// compactor and every reader rely on, without trusting the block:
//
//   - meta.json: version 1, a ULID (the directory's name, when the name is a
//     ULID), minTime before maxTime;
//   - the index: series in strictly increasing label order (so no series
//     twice), each series' labels sorted, unique, non-empty and valid;
//   - the chunks: every chunk decodes, its samples in strictly increasing
//     time order between the chunk's recorded first and last time, within
//     the block's [minTime, maxTime) range (the compactor's merge cuts
//     samples outside it: a block holding any would lose them), and a
//     series' chunks in time order without overlapping (the TSDB's block
//     reader and compactor expect them so);
//   - the meta's stats (series, chunks, samples), where recorded, are what
//     the block holds.
//
// It returns what it counted; the error of the first problem found wraps
// ErrInvalidBlock and names the series. A block that panics the TSDB's
// readers is an invalid block, not a crash.
func VerifyLocal(ctx context.Context, dir string) (v Verified, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %s: reading the block panicked: %v", ErrInvalidBlock, dir, r)
		}
	}()
	bm, err := ReadLocalMeta(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return v, fmt.Errorf("%w: %s has no meta.json", ErrInvalidBlock, dir)
		}
		return v, fmt.Errorf("%w: %w", ErrInvalidBlock, err)
	}
	v.Meta = bm
	invalid := func(format string, args ...any) error {
		return fmt.Errorf("%w: block %s: %s", ErrInvalidBlock, bm.ULID, fmt.Sprintf(format, args...))
	}
	if bm.Version != 1 {
		return v, invalid("meta.json version %d: only version 1 (Prometheus 2 and later) is read", bm.Version)
	}
	if bm.ULID == (ulid.ULID{}) {
		return v, fmt.Errorf("%w: %s: meta.json has no ULID", ErrInvalidBlock, dir)
	}
	if id, perr := ulid.ParseStrict(filepath.Base(dir)); perr == nil && id != bm.ULID {
		return v, invalid("meta.json names block %s but its directory is %s", bm.ULID, filepath.Base(dir))
	}
	if bm.MinTime >= bm.MaxTime {
		return v, invalid("minTime %d is not before maxTime %d", bm.MinTime, bm.MaxTime)
	}
	for _, f := range []string{IndexFilename, ChunksDirname} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return v, invalid("no %s: %v", f, err)
		}
	}
	b, err := tsdb.OpenBlock(nil, dir, nil, nil)
	if err != nil {
		return v, invalid("open: %v", err)
	}
	defer b.Close()
	ir, err := b.Index()
	if err != nil {
		return v, invalid("index: %v", err)
	}
	defer ir.Close()
	cr, err := b.Chunks()
	if err != nil {
		return v, invalid("chunks: %v", err)
	}
	defer cr.Close()
	tr, err := b.Tombstones()
	if err != nil {
		return v, invalid("tombstones: %v", err)
	}
	defer tr.Close()
	if err := tr.Iter(func(storage.SeriesRef, tombstones.Intervals) error { v.TombstonedSeries++; return nil }); err != nil {
		return v, invalid("tombstones: %v", err)
	}

	name, value := index.AllPostingsKey()
	ps, err := ir.Postings(ctx, name, value)
	if err != nil {
		return v, invalid("postings: %v", err)
	}
	var (
		sb      labels.ScratchBuilder
		chks    []chunks.Meta
		it      chunkenc.Iterator
		prev    labels.Labels
		prevRef storage.SeriesRef
		first   = true
		seen    bool // a sample was counted
	)
	for ps.Next() {
		if v.Series%1024 == 0 && ctx.Err() != nil {
			return v, ctx.Err()
		}
		ref := ps.At()
		if !first && ref <= prevRef {
			return v, invalid("postings out of order: series %d after %d", ref, prevRef)
		}
		if err := ir.Series(ref, &sb, &chks); err != nil {
			return v, invalid("series %d: %v", ref, err)
		}
		lset := sb.Labels()
		if err := checkLabels(lset); err != nil {
			return v, invalid("series %s: %v", lset, err)
		}
		if !first && labels.Compare(prev, lset) >= 0 {
			return v, invalid("series %s listed after %s: the index is not in label order (or holds a series twice)", lset, prev)
		}
		for i, cm := range chks {
			if cm.MinTime > cm.MaxTime {
				return v, invalid("series %s: chunk %d: first time %d after last time %d", lset, i, cm.MinTime, cm.MaxTime)
			}
			if cm.MinTime < bm.MinTime || cm.MaxTime >= bm.MaxTime {
				return v, invalid("series %s: chunk %d spans %s, outside the block's range %s", lset, i, span(cm.MinTime, cm.MaxTime+1), span(bm.MinTime, bm.MaxTime))
			}
			if i > 0 && cm.MinTime <= chks[i-1].MaxTime {
				return v, invalid("series %s: chunk %d (%s) overlaps or precedes chunk %d (%s)", lset, i, span(cm.MinTime, cm.MaxTime+1), i-1, span(chks[i-1].MinTime, chks[i-1].MaxTime+1))
			}
			n, err := checkChunk(cr, cm, &it)
			if err != nil {
				return v, invalid("series %s: chunk %d: %v", lset, i, err)
			}
			v.Samples += uint64(n)
			if !seen || cm.MinTime < v.MinSample {
				v.MinSample = cm.MinTime
			}
			if !seen || cm.MaxTime > v.MaxSample {
				v.MaxSample = cm.MaxTime
			}
			seen = true
			v.Chunks++
		}
		v.Series++
		prev, prevRef, first = lset.Copy(), ref, false
	}
	if err := ps.Err(); err != nil {
		return v, invalid("postings: %v", err)
	}
	s := bm.Stats
	if (s.NumSeries != 0 || s.NumSamples != 0) && (s.NumSeries != v.Series || s.NumSamples != v.Samples || (s.NumChunks != 0 && s.NumChunks != v.Chunks)) {
		return v, invalid("meta.json counts %d series, %d chunks, %d samples; the block holds %d, %d, %d", s.NumSeries, s.NumChunks, s.NumSamples, v.Series, v.Chunks, v.Samples)
	}
	return v, nil
}

// checkLabels checks one series' labels as the index gives them.
func checkLabels(lset labels.Labels) error {
	if lset.IsEmpty() {
		return errors.New("no labels")
	}
	var prev string
	first := true
	var err error
	lset.Range(func(l labels.Label) {
		switch {
		case err != nil:
		case !first && l.Name <= prev:
			err = fmt.Errorf("labels not sorted or %q twice", l.Name)
		case !model.UTF8Validation.IsValidLabelName(l.Name):
			err = fmt.Errorf("invalid label name %q", l.Name)
		case l.Value == "":
			err = fmt.Errorf("label %q has an empty value", l.Name)
		}
		prev, first = l.Name, false
	})
	return err
}

// checkChunk decodes a chunk whole and checks its samples' times against
// its meta. It returns the number of samples.
func checkChunk(cr tsdb.ChunkReader, cm chunks.Meta, it *chunkenc.Iterator) (int, error) {
	c, iterable, err := cr.ChunkOrIterable(cm)
	if err != nil {
		return 0, fmt.Errorf("read: %w", err)
	}
	if c != nil {
		*it = c.Iterator(*it)
	} else {
		*it = iterable.Iterator(*it)
	}
	n := 0
	var last int64
	for vt := (*it).Next(); vt != chunkenc.ValNone; vt = (*it).Next() {
		var t int64
		switch vt {
		case chunkenc.ValFloat:
			t, _ = (*it).At()
		case chunkenc.ValHistogram:
			t = (*it).AtT()
		case chunkenc.ValFloatHistogram:
			t = (*it).AtT()
		default:
			return n, fmt.Errorf("sample %d of unknown type %v", n, vt)
		}
		switch {
		case n == 0 && t != cm.MinTime:
			return n, fmt.Errorf("first sample at %d, the index says %d", t, cm.MinTime)
		case n > 0 && t <= last:
			return n, fmt.Errorf("sample at %d after one at %d: samples out of order", t, last)
		case t > cm.MaxTime:
			return n, fmt.Errorf("sample at %d after the chunk's last time %d", t, cm.MaxTime)
		}
		last = t
		n++
	}
	if err := (*it).Err(); err != nil {
		return n, fmt.Errorf("decode: %w", err)
	}
	if n == 0 {
		return 0, errors.New("empty chunk")
	}
	if last != cm.MaxTime {
		return n, fmt.Errorf("last sample at %d, the index says %d", last, cm.MaxTime)
	}
	if c != nil && c.NumSamples() != n {
		return n, fmt.Errorf("chunk says %d samples, holds %d", c.NumSamples(), n)
	}
	return n, nil
}

// span formats a half-open millisecond range for errors.
func span(mint, maxt int64) string {
	f := func(ms int64) string { return time.UnixMilli(ms).UTC().Format(time.RFC3339Nano) }
	return "[" + f(mint) + ", " + f(maxt) + ")"
}
