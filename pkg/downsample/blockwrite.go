package downsample

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/tsdb/index"
	"github.com/prometheus/prometheus/tsdb/tombstones"
)

// blockWriter writes a downsampled block with the TSDB's own chunk and index
// writers rather than through a head: a head validates histograms, and
// packed points (packed.go) are float histograms whose "buckets" may be
// negative. Chunks are written as each output series is complete (encoded
// by storage.NewSeriesToChunkEncoder: 120 samples a chunk, a new chunk where
// the value type changes or a native histogram counter resets) into a
// scratch chunks directory, in input order. The index needs its series
// sorted by labels and their chunk references ascending, and the output
// order differs from the input order (AggrLabel sorts among the other
// labels), so finish copies the chunks in label order into the block's
// chunks directory while it writes the index; only labels and chunk
// references are held in memory.
type blockWriter struct {
	ctx    context.Context
	logger *slog.Logger
	id     ulid.ULID
	tmp    string // the block directory while it is written
	cw     *chunks.Writer
	series []indexEntry
	stats  tsdb.BlockStats
}

type indexEntry struct {
	lset labels.Labels
	chks []chunks.Meta // without data
}

// tmpSuffix is the TSDB's suffix of a block directory being created.
const tmpSuffix = ".tmp-for-creation"

// scratchChunks holds the chunks in input order until finish sorts them.
const scratchChunks = "chunks.unsorted"

func newBlockWriter(ctx context.Context, dir string, logger *slog.Logger) (*blockWriter, error) {
	id := ulid.Make()
	tmp := filepath.Join(dir, id.String()+tmpSuffix)
	if err := os.RemoveAll(tmp); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return nil, err
	}
	cw, err := chunks.NewWriter(filepath.Join(tmp, scratchChunks))
	if err != nil {
		os.RemoveAll(tmp)
		return nil, fmt.Errorf("chunk writer: %w", err)
	}
	return &blockWriter{ctx: ctx, logger: logger, id: id, tmp: tmp, cw: cw}, nil
}

// add writes the chunks of one series; samples are in time order.
func (w *blockWriter) add(lset labels.Labels, samples []outSample) error {
	if len(samples) == 0 {
		return nil
	}
	it := storage.NewSeriesToChunkEncoder(&bufSeries{lset: lset, samples: samples}).Iterator(nil)
	var chks []chunks.Meta
	for it.Next() {
		chks = append(chks, it.At())
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("encode %s: %w", lset, err)
	}
	if err := w.cw.WriteChunks(chks...); err != nil {
		return fmt.Errorf("write chunks of %s: %w", lset, err)
	}
	for i := range chks {
		n := uint64(chks[i].Chunk.NumSamples())
		w.stats.NumChunks++
		w.stats.NumSamples += n
		if chks[i].Chunk.Encoding() == chunkenc.EncXOR {
			w.stats.NumFloatSamples += n
		} else {
			w.stats.NumHistogramSamples += n
		}
		chks[i].Chunk = nil
	}
	w.series = append(w.series, indexEntry{lset: lset, chks: chks})
	return nil
}

// finish writes the index, tombstones and meta, and renames the directory to
// the block's ULID in dir. With no series it removes everything and returns
// the zero ULID.
func (w *blockWriter) finish(dir string, meta func(tsdb.BlockMeta) error) (ulid.ULID, error) {
	if err := w.cw.Close(); err != nil {
		return ulid.ULID{}, fmt.Errorf("close scratch chunks: %w", err)
	}
	if len(w.series) == 0 {
		return ulid.ULID{}, os.RemoveAll(w.tmp)
	}
	slices.SortFunc(w.series, func(a, b indexEntry) int { return labels.Compare(a.lset, b.lset) })
	syms := map[string]struct{}{}
	for _, s := range w.series {
		s.lset.Range(func(l labels.Label) {
			syms[l.Name] = struct{}{}
			syms[l.Value] = struct{}{}
		})
	}
	sorted := make([]string, 0, len(syms))
	for s := range syms {
		sorted = append(sorted, s)
	}
	slices.Sort(sorted)
	if err := w.writeSorted(sorted); err != nil {
		return ulid.ULID{}, err
	}
	if err := os.RemoveAll(filepath.Join(w.tmp, scratchChunks)); err != nil {
		return ulid.ULID{}, err
	}
	if _, err := tombstones.WriteFile(w.logger, w.tmp, tombstones.NewMemTombstones()); err != nil {
		return ulid.ULID{}, fmt.Errorf("tombstones: %w", err)
	}
	w.stats.NumSeries = uint64(len(w.series))
	if err := meta(tsdb.BlockMeta{ULID: w.id, Version: 1, Stats: w.stats}); err != nil {
		return ulid.ULID{}, err
	}
	final := filepath.Join(dir, w.id.String())
	if err := os.Rename(w.tmp, final); err != nil {
		return ulid.ULID{}, fmt.Errorf("rename block: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return w.id, nil
}

// writeSorted writes the index (symbols, then the series in w.series'
// order) and copies each series' chunks from the scratch directory into the
// block's chunks directory just before its index entry, so that chunk
// references ascend with the series.
func (w *blockWriter) writeSorted(symbols []string) (err error) {
	cr, err := chunks.NewDirReader(filepath.Join(w.tmp, scratchChunks), nil)
	if err != nil {
		return fmt.Errorf("read scratch chunks: %w", err)
	}
	defer cr.Close()
	cw, err := chunks.NewWriter(filepath.Join(w.tmp, "chunks"))
	if err != nil {
		return fmt.Errorf("chunk writer: %w", err)
	}
	defer func() {
		if cerr := cw.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close chunks: %w", cerr)
		}
	}()
	iw, err := index.NewWriter(w.ctx, filepath.Join(w.tmp, "index"))
	if err != nil {
		return fmt.Errorf("index writer: %w", err)
	}
	defer func() {
		if cerr := iw.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close index: %w", cerr)
		}
	}()
	for _, s := range symbols {
		if err := iw.AddSymbol(s); err != nil {
			return fmt.Errorf("index symbols: %w", err)
		}
	}
	for i, s := range w.series {
		for j := range s.chks {
			c, _, err := cr.ChunkOrIterable(s.chks[j])
			if err != nil {
				return fmt.Errorf("read scratch chunk of %s: %w", s.lset, err)
			}
			s.chks[j].Chunk = c
		}
		if err := cw.WriteChunks(s.chks...); err != nil {
			return fmt.Errorf("write chunks of %s: %w", s.lset, err)
		}
		for j := range s.chks {
			s.chks[j].Chunk = nil
		}
		if err := iw.AddSeries(storage.SeriesRef(i), s.lset, s.chks...); err != nil {
			return fmt.Errorf("index series %s: %w", s.lset, err)
		}
	}
	return nil
}

// abort removes the partly written block.
func (w *blockWriter) abort() {
	w.cw.Close()
	os.RemoveAll(w.tmp)
}

// outSample is one point of an output series: a float, a native histogram
// (kept samples of counters), or a packed aggregate (packed.go).
type outSample struct {
	t     int64
	kind  chunkenc.ValueType // ValFloat, ValHistogram or ValFloatHistogram
	f     float64
	h     *histogram.Histogram
	fh    *histogram.FloatHistogram
	a     aggr // packed when kind is ValFloatHistogram and fh is nil
	stale bool // a packed staleness marker
}

// bufSeries is an output series held in memory, for the chunk encoder.
type bufSeries struct {
	lset    labels.Labels
	samples []outSample
}

func (b *bufSeries) Labels() labels.Labels { return b.lset }
func (b *bufSeries) Iterator(chunkenc.Iterator) chunkenc.Iterator {
	return &bufIterator{samples: b.samples, i: -1}
}

type bufIterator struct {
	samples []outSample
	i       int
}

func (b *bufIterator) Next() chunkenc.ValueType {
	if b.i+1 >= len(b.samples) {
		b.i = len(b.samples)
		return chunkenc.ValNone
	}
	b.i++
	return b.samples[b.i].kind
}

func (b *bufIterator) Seek(t int64) chunkenc.ValueType {
	if b.i < 0 {
		b.i = 0
	}
	for ; b.i < len(b.samples); b.i++ {
		if b.samples[b.i].t >= t {
			return b.samples[b.i].kind
		}
	}
	return chunkenc.ValNone
}

func (b *bufIterator) At() (int64, float64) { s := &b.samples[b.i]; return s.t, s.f }

func (b *bufIterator) AtHistogram(h *histogram.Histogram) (int64, *histogram.Histogram) {
	s := &b.samples[b.i]
	if h == nil {
		return s.t, s.h.Copy()
	}
	s.h.CopyTo(h)
	return s.t, h
}

func (b *bufIterator) AtFloatHistogram(fh *histogram.FloatHistogram) (int64, *histogram.FloatHistogram) {
	s := &b.samples[b.i]
	switch {
	case s.h != nil:
		return s.t, s.h.ToFloat(fh)
	case s.fh != nil:
		if fh == nil {
			return s.t, s.fh.Copy()
		}
		s.fh.CopyTo(fh)
		return s.t, fh
	case s.stale:
		return s.t, packedStale(fh)
	}
	return s.t, packAggr(s.a, fh)
}

func (b *bufIterator) AtT() int64  { return b.samples[b.i].t }
func (b *bufIterator) AtST() int64 { return 0 }
func (b *bufIterator) Err() error  { return nil }
