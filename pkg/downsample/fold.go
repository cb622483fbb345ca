package downsample

import (
	"cmp"
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
)

// Fold merges, when raw data is downsampled, the series of a metric that
// differ only in workload-attribution labels: dcgm-exporter labels a GPU's
// series with the pod using it, so every job on a GPU starts new series of
// every DCGM metric (a GPU that runs a job every two hours has a hundred
// series per metric per week). Raw data keeps them; the 5m and 1h data keeps
// one series per GPU (and per value of the labels not folded, such as
// namespace), which is what a month- or year-long panel shows, at a small
// fraction of the series. Queries that name a folded label read raw data
// where it exists (bucketstore); the block's meta.json lists the labels
// folded in it.
type Fold struct {
	// Labels folded, sorted.
	Labels []string
	// Metrics whose series are folded (anchored); nil: every metric.
	Metrics *regexp.Regexp
	metrics string // Metrics' expression, unanchored
}

// NewFold returns the fold of labelNames over the metrics matching the
// regular expression metrics ("" : every metric), or nil when labelNames is
// empty (folding off).
func NewFold(labelNames []string, metrics string) (*Fold, error) {
	var names []string
	for _, n := range labelNames {
		if n = strings.TrimSpace(n); n == "" {
			continue
		}
		if n == model.MetricNameLabel || n == AggrLabel {
			return nil, fmt.Errorf("downsample: cannot fold label %q", n)
		}
		names = append(names, n)
	}
	if len(names) == 0 {
		return nil, nil
	}
	slices.Sort(names)
	f := &Fold{Labels: slices.Compact(names), metrics: metrics}
	if metrics != "" {
		re, err := regexp.Compile("^(?:" + metrics + ")$")
		if err != nil {
			return nil, fmt.Errorf("downsample: fold metrics: %w", err)
		}
		f.Metrics = re
	}
	return f, nil
}

// folds says whether the series of metric name are folded.
func (f *Fold) folds(name string) bool {
	return f != nil && (f.Metrics == nil || f.Metrics.MatchString(name))
}

// notIn selects the metrics not named in names.
func notIn(names []string) *labels.Matcher {
	quoted := make([]string, len(names))
	for i, n := range names {
		quoted[i] = regexp.QuoteMeta(n)
	}
	return labels.MustNewMatcher(labels.MatchNotRegexp, model.MetricNameLabel, strings.Join(quoted, "|"))
}

// foldGroup is one output series of a folded metric: the member series (by
// source and index reference) whose labels without the folded ones are lset.
type foldGroup struct {
	lset    labels.Labels
	members []foldMember
}

type foldMember struct {
	src int
	ref storage.SeriesRef
}

// foldedSources reads the sources' indexes and chunks directly: a metric's
// series are grouped by their labels without the folded ones, and each group
// is merged into one series in time order before it is downsampled. Only
// one metric's references are held at a time, and one group's samples.
// Tombstones are not read: gpustore writes none (its admin API's deletes
// are off), and the compactor's blocks have none.
type foldedSources struct {
	irs []tsdb.IndexReader
	crs []tsdb.ChunkReader
}

func openFolded(sources []tsdb.BlockReader) (*foldedSources, error) {
	fs := &foldedSources{}
	for _, b := range sources {
		ir, err := b.Index()
		if err != nil {
			fs.close()
			return nil, err
		}
		fs.irs = append(fs.irs, ir)
		cr, err := b.Chunks()
		if err != nil {
			fs.close()
			return nil, err
		}
		fs.crs = append(fs.crs, cr)
	}
	return fs, nil
}

func (fs *foldedSources) close() {
	for _, ir := range fs.irs {
		_ = ir.Close()
	}
	for _, cr := range fs.crs {
		_ = cr.Close()
	}
}

// foldedNames returns the names of the sources' metrics whose series the
// fold merges: those it covers that are not counters (Classify, with the
// tenant's metadata). A counter is never folded. Two pods' series of one
// GPU's counter are each a run of the same device counter; merged, the
// series jumps across the time between them, when no pod of the group held
// the GPU, and increase() over a range that spans the gap counts what the
// GPU did meanwhile (its idle energy, for DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION)
// as the group's. A gauge's merged samples are the pods' own, nothing more.
func (cfg *Config) foldedNames(ctx context.Context, fs *foldedSources) ([]string, error) {
	var names []string
	for _, ir := range fs.irs {
		vs, err := ir.SortedLabelValues(ctx, model.MetricNameLabel, nil)
		if err != nil {
			return nil, fmt.Errorf("downsample: metric names: %w", err)
		}
		for _, v := range vs {
			if cfg.Fold.folds(v) && Classify(v, false, cfg.Types) == Gauge {
				names = append(names, v)
			}
		}
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

// downsampleFolded downsamples the series of the metrics names (foldedNames)
// of the sources in raw time [lo, hi] into w, folded.
func (cfg *Config) downsampleFolded(ctx context.Context, fs *foldedSources, names []string, w *writer, lo, hi int64, st *Stats) error {
	var (
		sb   = labels.NewScratchBuilder(16)
		lb   = labels.NewBuilder(labels.EmptyLabels())
		chks []chunks.Meta
		in   []sample
		buf  []outSample
		key  []byte
	)
	for _, name := range names {
		groups := map[string]*foldGroup{}
		var order []*foldGroup
		for i, ir := range fs.irs {
			p, err := ir.Postings(ctx, model.MetricNameLabel, name)
			if err != nil {
				return fmt.Errorf("downsample: postings of %s: %w", name, err)
			}
			for p.Next() {
				if err := ir.Series(p.At(), &sb, &chks); err != nil {
					return fmt.Errorf("downsample: series of %s: %w", name, err)
				}
				lset := sb.Labels()
				lb.Reset(lset)
				lb.Del(cfg.Fold.Labels...)
				k := lb.Labels()
				key = k.Bytes(key[:0])
				g := groups[string(key)]
				if g == nil {
					g = &foldGroup{lset: k}
					groups[string(key)] = g
					order = append(order, g)
				}
				g.members = append(g.members, foldMember{src: i, ref: p.At()})
			}
			if err := p.Err(); err != nil {
				return fmt.Errorf("downsample: postings of %s: %w", name, err)
			}
		}
		for _, g := range order {
			if err := ctx.Err(); err != nil {
				return err
			}
			var err error
			if in, buf, err = fs.merged(g, lo, hi, &sb, &chks, in[:0], buf[:0]); err != nil {
				return fmt.Errorf("downsample: read %s: %w", g.lset, err)
			}
			st.InSeries += int64(len(g.members))
			if err := cfg.series(w, g.lset, &bufIterator{samples: buf, i: -1}, 0, st); err != nil {
				return err
			}
			if err := w.flush(); err != nil {
				return err
			}
		}
	}
	return nil
}

// merged returns the samples of g's members in [lo, hi], in time order, one
// per timestamp (a GPU shared by two pods has the same sample in both
// series; a value wins over a staleness marker at the same time). A
// member's staleness marker (its pod ended) stays: where another member
// goes on in the same window the reducer ignores it, as it does any marker
// that is not a window's last point, and the counter functions skip it.
func (fs *foldedSources) merged(g *foldGroup, lo, hi int64, sb *labels.ScratchBuilder, chks *[]chunks.Meta, in []sample, out []outSample) ([]sample, []outSample, error) {
	var it chunkenc.Iterator
	for _, m := range g.members {
		if err := fs.irs[m.src].Series(m.ref, sb, chks); err != nil {
			return in, out, err
		}
		for _, c := range *chks {
			if c.MaxTime < lo || c.MinTime > hi {
				continue
			}
			chk, iterable, err := fs.crs[m.src].ChunkOrIterable(c)
			if err != nil {
				return in, out, err
			}
			if iterable != nil {
				it = iterable.Iterator(it)
			} else {
				it = chk.Iterator(it)
			}
			for vt := it.Next(); vt != chunkenc.ValNone; vt = it.Next() {
				if s := readSample(it, vt); s.t >= lo && s.t <= hi {
					in = append(in, s)
				}
			}
			if err := it.Err(); err != nil {
				return in, out, err
			}
		}
	}
	byTime := func(a, b sample) int { return cmp.Compare(a.t, b.t) }
	if !slices.IsSortedFunc(in, byTime) {
		// Stable: for equal times, the order members were listed in.
		slices.SortStableFunc(in, byTime)
	}
	lastStale := false // out's last point is a staleness marker
	for i := range in {
		s := &in[i]
		if n := len(out); n > 0 && out[n-1].t == s.t {
			if lastStale && !s.isStale() {
				out[n-1], lastStale = s.out(), false
			}
			continue
		}
		out, lastStale = append(out, s.out()), s.isStale()
	}
	return in, out, nil
}
