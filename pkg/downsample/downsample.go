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

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunkenc"

	"github.com/gpustore/gpustore/pkg/block"
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
	// Types looks up metric types in the tenant's metadata (optional; names decide without it).
	Types  TypeLookup
	Logger *slog.Logger
}

// Stats counts what one Downsample call read and wrote.
type Stats struct {
	InSeries, InSamples   int64
	OutSeries, OutSamples int64
}

// commitEvery bounds the samples held by one head appender transaction.
const commitEvery = 64 << 10

// Downsample reads the series of sources in the configured range and writes
// one block of cfg.Resolution into cfg.Dir, returning its ULID. The block's
// meta.json carries the gpustore section with downsample.resolution. When
// the range holds no sample it writes nothing and returns the zero ULID.
//
// Sources may overlap (they are merged as queries merge them, one sample per
// timestamp). The output is written through a TSDB head and the TSDB's own
// LeveledCompactor.Write, so it is a plain block with XOR chunks.
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
	headDir, err := os.MkdirTemp(cfg.Dir, ".downsample-head-")
	if err != nil {
		return ulid.ULID{}, st, fmt.Errorf("downsample: %w", err)
	}
	defer os.RemoveAll(headDir)
	hopts := tsdb.DefaultHeadOptions()
	hopts.ChunkRange = 2 * (cfg.Maxt - cfg.Mint) // nothing in [Mint, Maxt) is too old for the head
	hopts.ChunkDirRoot = headDir
	head, err := tsdb.NewHead(nil, logger, nil, nil, hopts, nil)
	if err != nil {
		return ulid.ULID{}, st, fmt.Errorf("downsample: new head: %w", err)
	}
	defer head.Close()
	if err := head.Init(math.MinInt64); err != nil {
		return ulid.ULID{}, st, fmt.Errorf("downsample: init head: %w", err)
	}

	queriers := make([]storage.Querier, 0, len(sources))
	var srcMetas []tsdb.BlockMeta
	for _, b := range sources {
		q, err := tsdb.NewBlockQuerier(b, lo, hi)
		if err != nil {
			for _, q := range queriers {
				q.Close()
			}
			return ulid.ULID{}, st, fmt.Errorf("downsample: open block %s: %w", b.Meta().ULID, err)
		}
		queriers = append(queriers, q)
		srcMetas = append(srcMetas, b.Meta())
	}
	q := storage.NewMergeQuerier(queriers, nil, storage.ChainedSeriesMerge)
	defer q.Close()

	w := &writer{ctx: ctx, head: head, app: head.Appender(ctx)}
	ss := q.Select(ctx, true, &storage.SelectHints{Start: lo, End: hi},
		labels.MustNewMatcher(labels.MatchRegexp, labels.MetricName, ".+"))
	var it chunkenc.Iterator
	for ss.Next() {
		if err := ctx.Err(); err != nil {
			w.app.Rollback()
			return ulid.ULID{}, st, err
		}
		s := ss.At()
		it = s.Iterator(it)
		st.InSeries++
		if err := cfg.series(w, s.Labels(), it, shift, &st); err != nil {
			w.app.Rollback()
			return ulid.ULID{}, st, err
		}
		if w.err != nil {
			w.app.Rollback()
			return ulid.ULID{}, st, w.err
		}
	}
	if err := ss.Err(); err != nil {
		w.app.Rollback()
		return ulid.ULID{}, st, fmt.Errorf("downsample: read sources: %w", err)
	}
	if err := w.app.Commit(); err != nil {
		return ulid.ULID{}, st, fmt.Errorf("downsample: commit: %w", err)
	}
	st.OutSeries, st.OutSamples = int64(head.NumSeries()), w.samples
	if w.samples == 0 {
		return ulid.ULID{}, st, nil
	}

	comp, err := tsdb.NewLeveledCompactorWithOptions(ctx, nil, logger, []int64{cfg.Maxt - cfg.Mint}, nil, tsdb.LeveledCompactorOptions{})
	if err != nil {
		return ulid.ULID{}, st, fmt.Errorf("downsample: compactor: %w", err)
	}
	ids, err := comp.Write(cfg.Dir, head, cfg.Mint, cfg.Maxt, nil)
	if err != nil {
		return ulid.ULID{}, st, fmt.Errorf("downsample: write block: %w", err)
	}
	if len(ids) == 0 {
		return ulid.ULID{}, st, nil
	}
	if err := cfg.writeMeta(filepath.Join(cfg.Dir, ids[0].String()), srcMetas); err != nil {
		return ulid.ULID{}, st, err
	}
	logger.Info("downsampled", "block", ids[0], "resolution", ResolutionName(cfg.Resolution),
		"mint", cfg.Mint, "maxt", cfg.Maxt, "in_series", st.InSeries, "in_samples", st.InSamples,
		"out_series", st.OutSeries, "out_samples", st.OutSamples)
	return ids[0], st, nil
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

// writeMeta adds the gpustore section (resolution, source) and the sources'
// lineage to the meta.json the TSDB wrote. The TSDB ignores the extra section.
func (cfg *Config) writeMeta(dir string, srcs []tsdb.BlockMeta) error {
	m, err := block.ReadLocalMeta(dir)
	if err != nil {
		return fmt.Errorf("downsample: %w", err)
	}
	m.Compaction.Sources = nil
	m.Compaction.Parents = nil
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
		Downsample: block.Downsample{Resolution: cfg.Resolution},
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

// ReadResolution returns gpustore.downsample.resolution of a local block
// directory's meta.json (0, raw, when the section is absent).
func ReadResolution(dir string) (int64, error) {
	b, err := os.ReadFile(filepath.Join(dir, block.MetaFilename))
	if err != nil {
		return 0, err
	}
	var m block.Meta
	if err := json.Unmarshal(b, &m); err != nil {
		return 0, fmt.Errorf("parse %s: %w", filepath.Join(dir, block.MetaFilename), err)
	}
	return m.GPUStore.Downsample.Resolution, nil
}

// series downsamples one input series into w.
func (cfg *Config) series(w *writer, lset labels.Labels, it chunkenc.Iterator, shift int64, st *Stats) error {
	var (
		reducers []*reducer
		counter  *counterSelector
		// Labels of the counter aggregate that native histograms go to
		// when they turn up in a series downsampled as a gauge.
		histLabels = labels.NewBuilder(lset).Set(AggrLabel, AggrCounter).Labels()
	)
	newReducer := func(ls labels.Labels, o op) *reducer {
		return &reducer{op: o, res: cfg.Resolution, emit: w.series(ls).appendFloat}
	}
	if cfg.SourceResolution == ResRaw {
		if lset.Has(AggrLabel) {
			return fmt.Errorf("downsample: raw series %s already has %s", lset, AggrLabel)
		}
		if Classify(lset.Get(labels.MetricName), lset.Has("quantile"), cfg.Types) == Gauge {
			b := labels.NewBuilder(lset)
			for _, a := range []struct {
				name string
				op   op
			}{{AggrCount, opCountSamples}, {AggrSum, opAdd}, {AggrMin, opMin}, {AggrMax, opMax}} {
				reducers = append(reducers, newReducer(b.Set(AggrLabel, a.name).Labels(), a.op))
			}
		}
	} else {
		switch a := lset.Get(AggrLabel); a {
		case AggrCount, AggrSum:
			reducers = []*reducer{newReducer(lset, opAdd)}
		case AggrMin:
			reducers = []*reducer{newReducer(lset, opMin)}
		case AggrMax:
			reducers = []*reducer{newReducer(lset, opMax)}
		case AggrCounter:
		default:
			return fmt.Errorf("downsample: series %s of a %s block has no known %s", lset, ResolutionName(cfg.SourceResolution), AggrLabel)
		}
	}
	err := cfg.feed(it, shift, st, reducers, func() *counterSelector {
		if counter == nil {
			out := w.series(histLabels)
			counter = &counterSelector{res: cfg.Resolution, emit: out.appendSample}
		}
		return counter
	})
	if counter != nil {
		counter.finish()
	}
	return err
}

// feed runs the series' points in (Mint, Maxt] (raw time) through the
// reducers (floats) or the counter selector (counter floats and histograms).
func (cfg *Config) feed(it chunkenc.Iterator, shift int64, st *Stats, reducers []*reducer, counter func() *counterSelector) error {
	for vt := it.Next(); vt != chunkenc.ValNone; vt = it.Next() {
		var s sample
		switch vt {
		case chunkenc.ValFloat:
			s.t, s.f = it.At()
		case chunkenc.ValHistogram:
			s.t, s.h = it.AtHistogram(nil)
		case chunkenc.ValFloatHistogram:
			s.t, s.fh = it.AtFloatHistogram(nil)
		}
		s.t += shift
		if s.t <= cfg.Mint || s.t > cfg.Maxt {
			continue
		}
		st.InSamples++
		if len(reducers) > 0 && !s.isHistogram() {
			for _, r := range reducers {
				r.add(s.t, s.f)
			}
			continue
		}
		counter().add(s)
	}
	for _, r := range reducers {
		r.flush()
	}
	return it.Err()
}

// writer appends output series to the head, committing now and then.
type writer struct {
	ctx     context.Context
	head    *tsdb.Head
	app     storage.Appender
	pending int
	samples int64
	err     error
}

type outSeries struct {
	w    *writer
	lset labels.Labels
	ref  storage.SeriesRef
}

func (w *writer) series(lset labels.Labels) *outSeries { return &outSeries{w: w, lset: lset} }

func (o *outSeries) appendFloat(t int64, v float64) {
	w := o.w
	if w.err != nil {
		return
	}
	ref, err := w.app.Append(o.ref, o.lset, t, v)
	o.done(ref, err, t)
}

func (o *outSeries) appendSample(s *sample) {
	if !s.isHistogram() {
		o.appendFloat(s.t-1, s.f)
		return
	}
	w := o.w
	if w.err != nil {
		return
	}
	ref, err := w.app.AppendHistogram(o.ref, o.lset, s.t-1, s.h, s.fh)
	o.done(ref, err, s.t-1)
}

func (o *outSeries) done(ref storage.SeriesRef, err error, t int64) {
	w := o.w
	if err != nil {
		w.err = fmt.Errorf("downsample: append %s at %d: %w", o.lset, t, err)
		return
	}
	o.ref = ref
	w.samples++
	w.pending++
	if w.pending >= commitEvery {
		if err := w.app.Commit(); err != nil {
			w.err = fmt.Errorf("downsample: commit: %w", err)
			return
		}
		w.app = w.head.Appender(w.ctx)
		w.pending = 0
	}
}
