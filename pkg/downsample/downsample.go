package downsample

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/value"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunkenc"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/seriesset"
)

// Source is gpustore.source in the meta.json of a downsampled block.
const Source = "downsample"

// Config says what Downsample writes.
type Config struct {
	// SourceResolution is the resolution of the source blocks: ResRaw or Res5m.
	SourceResolution int64
	// Resolution is the resolution to write: Res5m (from raw) or Res1h (from raw or 5m).
	Resolution int64
	// Mint and Maxt, multiples of Resolution, select the windows ending in
	// (Mint, Maxt]; the block written covers [Mint, Maxt). From raw blocks
	// that means raw samples in (Mint, Maxt]: the sample at exactly Maxt
	// belongs to a raw block starting at Maxt, which must be among the sources.
	Mint, Maxt int64
	// Dir is where the block directory is created (the TSDB compactor's
	// atomic write: a temporary directory renamed to the ULID).
	Dir string
	// Tenant is recorded in meta.json (optional).
	Tenant string
	// Sources, when set, are recorded as meta.json's compaction.sources
	// instead of the union of every input's: the blocks whose samples the
	// written block stands for. A raw block that only lends the sample at
	// exactly Maxt (it starts at Maxt) is read but not a source, so that the
	// compactor does not count it as downsampled.
	Sources []ulid.ULID
	// Fold, when set, merges the series of raw metrics that differ only in
	// its labels (fold.go). Folded lists labels the sources have folded
	// already (5m data downsampled to 1h): meta.json records both.
	Fold   *Fold
	Folded []string
	// SourceKeptCounts says every source block (5m data downsampled to
	// 1h) records how many raw samples its counters' kept samples stand
	// for (block.Downsample.KeptCounts); raw sources always do.
	SourceKeptCounts bool
	// Types looks up metric types in the tenant's metadata (optional; names decide without it).
	Types  TypeLookup
	Logger *slog.Logger
}

// Stats counts what one Downsample call read and wrote.
type Stats struct {
	InSeries, InSamples   int64
	OutSeries, OutSamples int64
}

// Downsample reads the series of sources in the configured range and writes
// one block of cfg.Resolution into cfg.Dir, returning its ULID. The block's
// meta.json carries the gpustore section with downsample.resolution. When
// the range holds no sample it writes nothing and returns the zero ULID.
//
// Sources may overlap (they are merged as queries merge them, one sample per
// timestamp). The output is written with the TSDB's chunk and index writers
// (blockwrite.go): a plain TSDB block, XOR chunks for counters and float
// histogram chunks for packed gauges, in a directory renamed to its ULID
// once complete.
func Downsample(ctx context.Context, sources []tsdb.BlockReader, cfg Config) (ulid.ULID, Stats, error) {
	var st Stats
	if err := cfg.validate(); err != nil {
		return ulid.ULID{}, st, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	// Stored times of the input: raw samples in (Mint, Maxt]; downsampled
	// points stand for stored time + 1 ms.
	shift := int64(0)
	if cfg.SourceResolution != ResRaw {
		shift = 1
	}
	lo, hi := cfg.Mint+1-shift, cfg.Maxt-shift

	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return ulid.ULID{}, st, fmt.Errorf("downsample: %w", err)
	}
	bw, err := newBlockWriter(ctx, cfg.Dir, logger)
	if err != nil {
		return ulid.ULID{}, st, fmt.Errorf("downsample: %w", err)
	}

	queriers := make([]storage.Querier, 0, len(sources))
	var srcMetas []tsdb.BlockMeta
	for _, b := range sources {
		q, err := tsdb.NewBlockQuerier(b, lo, hi)
		if err != nil {
			for _, q := range queriers {
				q.Close()
			}
			bw.abort()
			return ulid.ULID{}, st, fmt.Errorf("downsample: open block %s: %w", b.Meta().ULID, err)
		}
		queriers = append(queriers, q)
		srcMetas = append(srcMetas, b.Meta())
	}
	q := seriesset.NewMergeQuerier(queriers, seriesset.ChainedSeriesMerge)
	defer q.Close()

	w := &writer{bw: bw}
	ms := []*labels.Matcher{labels.MustNewMatcher(labels.MatchRegexp, model.MetricNameLabel, ".+")}
	var (
		folded    *foldedSources
		foldNames []string
	)
	if cfg.Fold != nil && cfg.SourceResolution == ResRaw { // downsampled sources are folded or not already
		if folded, err = openFolded(sources); err != nil {
			bw.abort()
			return ulid.ULID{}, st, fmt.Errorf("downsample: %w", err)
		}
		defer folded.close()
		if foldNames, err = cfg.foldedNames(ctx, folded); err != nil {
			bw.abort()
			return ulid.ULID{}, st, err
		}
		if len(foldNames) > 0 {
			ms = append(ms, notIn(foldNames))
		}
	}
	ss := q.Select(ctx, true, &storage.SelectHints{Start: lo, End: hi}, ms...)
	var it chunkenc.Iterator
	for ss.Next() {
		if err := ctx.Err(); err != nil {
			bw.abort()
			return ulid.ULID{}, st, err
		}
		s := ss.At()
		it = s.Iterator(it)
		st.InSeries++
		err := cfg.series(w, s.Labels(), it, shift, &st)
		if err == nil {
			err = w.flush()
		}
		if err != nil {
			bw.abort()
			return ulid.ULID{}, st, err
		}
	}
	if err := ss.Err(); err != nil {
		bw.abort()
		return ulid.ULID{}, st, fmt.Errorf("downsample: read sources: %w", err)
	}
	if len(foldNames) > 0 {
		if err := cfg.downsampleFolded(ctx, folded, foldNames, w, lo, hi, &st); err != nil {
			bw.abort()
			return ulid.ULID{}, st, err
		}
	}
	st.OutSeries, st.OutSamples = int64(len(bw.series)), w.samples
	id, err := bw.finish(cfg.Dir, func(m tsdb.BlockMeta) error {
		m.MinTime, m.MaxTime = cfg.Mint, cfg.Maxt
		return cfg.writeMeta(bw.tmp, m, srcMetas)
	})
	if err != nil {
		bw.abort()
		return ulid.ULID{}, st, fmt.Errorf("downsample: write block: %w", err)
	}
	if id == (ulid.ULID{}) {
		return id, st, nil
	}
	logger.Info("downsampled", "block", id, "resolution", ResolutionName(cfg.Resolution),
		"mint", cfg.Mint, "maxt", cfg.Maxt, "in_series", st.InSeries, "in_samples", st.InSamples,
		"out_series", st.OutSeries, "out_samples", st.OutSamples)
	return id, st, nil
}

func (cfg *Config) validate() error {
	switch {
	case cfg.Resolution != Res5m && cfg.Resolution != Res1h:
		return fmt.Errorf("downsample: resolution %d ms is neither 5m nor 1h", cfg.Resolution)
	case cfg.SourceResolution != ResRaw && cfg.SourceResolution != Res5m:
		return fmt.Errorf("downsample: source resolution %d ms is neither raw nor 5m", cfg.SourceResolution)
	case cfg.SourceResolution >= cfg.Resolution:
		return fmt.Errorf("downsample: cannot go from %s to %s", ResolutionName(cfg.SourceResolution), ResolutionName(cfg.Resolution))
	case cfg.Mint >= cfg.Maxt || cfg.Mint%cfg.Resolution != 0 || cfg.Maxt%cfg.Resolution != 0:
		return fmt.Errorf("downsample: range [%d, %d) is empty or not aligned to %s", cfg.Mint, cfg.Maxt, ResolutionName(cfg.Resolution))
	case cfg.Dir == "":
		return errors.New("downsample: no output directory")
	}
	return nil
}

// writeMeta writes meta.json: m (ULID, range, stats), the sources' lineage
// and the gpustore section (resolution, source). The TSDB ignores the extra
// section.
func (cfg *Config) writeMeta(dir string, m tsdb.BlockMeta, srcs []tsdb.BlockMeta) error {
	m.Compaction.Level = 1
	seen := map[ulid.ULID]bool{}
	for _, s := range srcs {
		m.Compaction.Level = max(m.Compaction.Level, s.Compaction.Level)
		m.Compaction.Parents = append(m.Compaction.Parents, tsdb.BlockDesc{ULID: s.ULID, MinTime: s.MinTime, MaxTime: s.MaxTime})
		for _, id := range s.Compaction.Sources {
			if !seen[id] {
				seen[id] = true
				m.Compaction.Sources = append(m.Compaction.Sources, id)
			}
		}
	}
	if len(cfg.Sources) > 0 {
		m.Compaction.Sources = append([]ulid.ULID(nil), cfg.Sources...)
	}
	meta := block.Meta{BlockMeta: m, GPUStore: block.GPUStoreMeta{
		Version:    block.MetaVersion,
		Tenant:     cfg.Tenant,
		Downsample: block.Downsample{Resolution: cfg.Resolution, FoldedLabels: cfg.FoldedLabels(), KeptCounts: cfg.KeptCounts()},
		Source:     Source,
	}}
	b, err := json.MarshalIndent(meta, "", "\t")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, block.MetaFilename+".tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("downsample: write meta: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, block.MetaFilename)); err != nil {
		return fmt.Errorf("downsample: write meta: %w", err)
	}
	return nil
}

// FoldedLabels are the labels folded in the written block (meta.json's
// gpustore.downsample.folded_labels): the sources' and, from raw, the fold's.
func (cfg *Config) FoldedLabels() []string {
	out := slices.Clone(cfg.Folded)
	if cfg.Fold != nil && cfg.SourceResolution == ResRaw {
		out = append(out, cfg.Fold.Labels...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// KeptCounts says whether the written block records how many raw samples
// its counters' kept samples stand for (meta.json's
// gpustore.downsample.kept_counts): from raw data always, from 5m data when
// every source does.
func (cfg *Config) KeptCounts() bool {
	return cfg.SourceResolution == ResRaw || cfg.SourceKeptCounts
}

// series downsamples one input series into w: a raw gauge into one packed
// series (packed.go), a raw counter into kept samples (floats as "pairs",
// native histograms as "counter"); a downsampled series into the same
// aggregate at the coarser resolution (old-layout count/sum/min/max and
// float "counter" series stay in the old layout).
func (cfg *Config) series(w *writer, lset labels.Labels, it chunkenc.Iterator, shift int64, st *Stats) error {
	var (
		red     *reducer
		packed  bool // the input points are packed aggregates
		counter *counterSelector
		// Kept float samples go to pairs unless the input is an old-layout
		// counter series.
		floatsToPairs = true
		hist          *outSeries
		pairs         *pairWriter
	)
	keep := func(s *sample) {
		switch {
		case s.isHistogram() || !floatsToPairs:
			if hist == nil {
				hist = w.series(labels.NewBuilder(lset).Set(AggrLabel, AggrCounter).Labels())
			}
			hist.appendSample(s)
		default:
			if pairs == nil {
				pairs = &pairWriter{res: cfg.Resolution, out: w.series(labels.NewBuilder(lset).Set(AggrLabel, AggrPairs).Labels())}
			}
			pairs.add(s)
		}
	}
	packedReducer := func(ls labels.Labels) *reducer {
		out := w.series(ls)
		return &reducer{res: cfg.Resolution, emit: out.appendAggr, emitStale: out.appendPackedStale}
	}
	fieldReducer := func(field func(aggr) float64) *reducer {
		out := w.series(lset)
		return &reducer{res: cfg.Resolution,
			emit:      func(t int64, a aggr) { out.appendFloat(t, field(a)) },
			emitStale: func(t int64) { out.appendFloat(t, math.Float64frombits(value.StaleNaN)) }}
	}
	if cfg.SourceResolution == ResRaw {
		if lset.Has(AggrLabel) {
			return fmt.Errorf("downsample: raw series %s already has %s", lset, AggrLabel)
		}
		if Classify(lset.Get(model.MetricNameLabel), lset.Has("quantile"), cfg.Types) == Gauge {
			red = packedReducer(labels.NewBuilder(lset).Set(AggrLabel, AggrPacked).Labels())
		}
	} else {
		switch a := lset.Get(AggrLabel); a {
		case AggrPacked:
			red, packed = packedReducer(lset), true
		case AggrCount, AggrSum:
			red = fieldReducer(func(a aggr) float64 { return a.sum })
		case AggrMin:
			red = fieldReducer(func(a aggr) float64 { return a.min })
		case AggrMax:
			red = fieldReducer(func(a aggr) float64 { return a.max })
		case AggrCounter:
			floatsToPairs = false
		case AggrPairs:
			it = &pairIterator{it: it, lo: math.MinInt64, hi: math.MaxInt64}
		default:
			return fmt.Errorf("downsample: series %s of a %s block has no known %s", lset, ResolutionName(cfg.SourceResolution), AggrLabel)
		}
	}
	err := cfg.feed(it, shift, st, red, packed, func() *counterSelector {
		if counter == nil {
			counter = &counterSelector{res: cfg.Resolution, emit: keep}
		}
		return counter
	})
	if counter != nil {
		counter.finish()
	}
	if pairs != nil {
		pairs.flush()
	}
	if err != nil {
		return fmt.Errorf("downsample: read %s: %w", lset, err)
	}
	return nil
}

// feed runs the series' points in (Mint, Maxt] (raw time) through the
// reducer (gauge floats; packed points when packed) or the counter selector
// (counter floats and histograms).
func (cfg *Config) feed(it chunkenc.Iterator, shift int64, st *Stats, red *reducer, packed bool, counter func() *counterSelector) error {
	for vt := it.Next(); vt != chunkenc.ValNone; vt = it.Next() {
		s := readSample(it, vt)
		s.t += shift
		if p, ok := it.(*pairIterator); ok {
			s.drops = p.drops()
		} else if shift != 0 {
			s.drops = unknownDrops // kept samples one per point do not say
		}
		if s.t <= cfg.Mint || s.t > cfg.Maxt {
			continue
		}
		st.InSamples++
		switch {
		case red != nil && packed:
			if s.fh == nil {
				return fmt.Errorf("%s series holds a %s sample at %d", AggrPacked, vt, s.t-shift)
			}
			a, stale, err := unpackAggr(s.fh)
			if err != nil {
				return err
			}
			if stale {
				red.addStale(s.t)
			} else {
				red.add(s.t, a)
			}
		case red != nil && !s.isHistogram():
			if value.IsStaleNaN(s.f) {
				red.addStale(s.t)
			} else {
				red.add(s.t, rawAggr(s.f))
			}
		default:
			counter().add(s)
		}
	}
	if red != nil {
		red.flush()
	}
	return it.Err()
}

// writer collects the output series of one input series and writes them to
// the block when the input series is done.
type writer struct {
	bw      *blockWriter
	out     []*outSeries
	samples int64
	err     error
}

type outSeries struct {
	w       *writer
	lset    labels.Labels
	samples []outSample
}

func (w *writer) series(lset labels.Labels) *outSeries {
	o := &outSeries{w: w, lset: lset}
	w.out = append(w.out, o)
	return o
}

// flush writes the output series collected since the last flush.
func (w *writer) flush() error {
	defer func() { w.out = w.out[:0] }()
	if w.err != nil {
		return w.err
	}
	for _, o := range w.out {
		if err := w.bw.add(o.lset, o.samples); err != nil {
			return err
		}
		w.samples += int64(len(o.samples))
	}
	return nil
}

func (o *outSeries) append(s outSample) {
	if n := len(o.samples); n > 0 && o.samples[n-1].t >= s.t && o.w.err == nil {
		o.w.err = fmt.Errorf("downsample: %s: point at %d after one at %d", o.lset, s.t, o.samples[n-1].t)
	}
	o.samples = append(o.samples, s)
}

func (o *outSeries) appendFloat(t int64, v float64) {
	o.append(outSample{t: t, kind: chunkenc.ValFloat, f: v})
}

func (o *outSeries) appendAggr(t int64, a aggr) {
	o.append(outSample{t: t, kind: chunkenc.ValFloatHistogram, a: a})
}

func (o *outSeries) appendPackedStale(t int64) {
	o.append(outSample{t: t, kind: chunkenc.ValFloatHistogram, stale: true})
}

func (o *outSeries) appendSample(s *sample) {
	switch {
	case s.h != nil:
		o.append(outSample{t: s.t - 1, kind: chunkenc.ValHistogram, h: s.h})
	case s.fh != nil:
		o.append(outSample{t: s.t - 1, kind: chunkenc.ValFloatHistogram, fh: s.fh})
	default:
		o.appendFloat(s.t-1, s.f)
	}
}
