package bucketstore

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/util/annotations"
	"github.com/thanos-io/objstore"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/downsample"
	"github.com/gpustore/gpustore/pkg/readopts"
)

const hour = 60 * minute

// rawData is one raw series: floats (hs nil) or native histograms.
type rawData struct {
	lset labels.Labels
	ts   []int64
	fs   []float64
	hs   []*histogram.Histogram
}

// dsBucket builds a tenant's bucket as the compactor leaves it: raw blocks
// and the downsampled blocks standing for them, with the meta.json fields
// the planner reads (resolution, compaction sources and their ranges,
// external labels, folded labels). Blocks stay on local disk so that they
// can be compacted and downsampled.
type dsBucket struct {
	t      testing.TB
	bkt    objstore.Bucket
	tenant string
	dir    string
	local  map[ulid.ULID]string
	metas  map[ulid.ULID]block.Meta
	// localFrom, when set, is where queries say the receiver's local TSDB
	// serves raw data from (readopts.ReadOptions.LocalFrom).
	localFrom int64
	// types is the tenant's metric metadata the downsampler classifies by.
	types downsample.TypeLookup
	// oldCounts writes downsampled blocks' meta.json as gpustore did before
	// it recorded the raw samples kept counter samples stand for.
	oldCounts bool
}

func newDSBucket(t testing.TB) *dsBucket {
	return &dsBucket{t: t, bkt: objstore.NewInMemBucket(), tenant: "team-a", dir: t.TempDir(),
		local: map[ulid.ULID]string{}, metas: map[ulid.ULID]block.Meta{}}
}

// raw writes the samples of data in [mint, maxt) into one raw block of the
// group ext (external labels) and uploads it.
func (d *dsBucket) raw(ext map[string]string, mint, maxt int64, data []rawData) block.Meta {
	d.t.Helper()
	w, err := tsdb.NewBlockWriter(quietLogger(), filepath.Join(d.dir, "raw"), maxt-mint)
	if err != nil {
		d.t.Fatal(err)
	}
	defer w.Close()
	ctx := context.Background()
	app := w.Appender(ctx)
	n := 0
	// Half an hour of every series at a time: the head takes no sample
	// older than half the block's range before the newest one appended.
	next := make([]int, len(data))
	refs := make([]storage.SeriesRef, len(data))
	for from := mint; from < maxt; from += 30 * minute {
		for j, s := range data {
			i := next[j]
			for ; i < len(s.ts) && s.ts[i] < min(from+30*minute, maxt); i++ {
				if s.ts[i] < mint {
					continue
				}
				if s.hs != nil {
					refs[j], err = app.AppendHistogram(refs[j], s.lset, s.ts[i], s.hs[i], nil)
				} else {
					refs[j], err = app.Append(refs[j], s.lset, s.ts[i], s.fs[i])
				}
				if err != nil {
					d.t.Fatal(err)
				}
				if n++; n%20_000 == 0 { // keep the appender's batch small
					if err := app.Commit(); err != nil {
						d.t.Fatal(err)
					}
					app = w.Appender(ctx)
				}
			}
			next[j] = i
		}
	}
	if err := app.Commit(); err != nil {
		d.t.Fatal(err)
	}
	id, err := w.Flush(ctx)
	if err != nil {
		d.t.Fatal(err)
	}
	dir := filepath.Join(d.dir, "raw", id.String())
	bm, err := block.ReadLocalMeta(dir)
	if err != nil {
		d.t.Fatal(err)
	}
	// The block writer ends the block at its last sample + 1: the receiver's
	// blocks span their whole range.
	bm.MinTime, bm.MaxTime = mint, maxt
	return d.upload(dir, block.Meta{BlockMeta: bm, GPUStore: block.GPUStoreMeta{Labels: ext, Source: block.SourceReceive}})
}

// compact merges raw blocks into one with the TSDB's compactor, recording
// its sources' ranges as the compactor does.
func (d *dsBucket) compact(ms ...block.Meta) block.Meta {
	d.t.Helper()
	var dirs []string
	var ranges []block.SourceRange
	for _, m := range ms {
		dirs = append(dirs, d.local[m.ULID])
		ranges = append(ranges, m.Sources()...)
	}
	dir := compactBlocks(d.t.(*testing.T), filepath.Join(d.dir, "compacted"), dirs...)
	bm, err := block.ReadLocalMeta(dir)
	if err != nil {
		d.t.Fatal(err)
	}
	bm.MinTime, bm.MaxTime = ms[0].MinTime, ms[len(ms)-1].MaxTime
	return d.upload(dir, block.Meta{BlockMeta: bm, GPUStore: block.GPUStoreMeta{
		Labels: ms[0].GPUStore.Labels, Source: block.SourceCompactor, SourceRanges: ranges}})
}

// downsample writes the block of resolution res standing for the sources'
// windows in [mint, maxt) as the compactor does: from every input that
// holds samples of those windows (raw inputs may include the block after,
// for the sample at exactly maxt), with the sources' lineage.
func (d *dsBucket) downsample(res, mint, maxt int64, fold *downsample.Fold, sources []block.Meta, inputs ...block.Meta) block.Meta {
	d.t.Helper()
	var readers []tsdb.BlockReader
	var srcIDs []ulid.ULID
	for _, m := range sources {
		srcIDs = append(srcIDs, m.Compaction.Sources...)
	}
	from := inputs[0].GPUStore.Downsample.Resolution
	var folded []string
	for _, in := range inputs {
		b, err := tsdb.OpenBlock(nil, d.local[in.ULID], nil, nil)
		if err != nil {
			d.t.Fatal(err)
		}
		defer b.Close()
		readers = append(readers, b)
		folded = append(folded, in.GPUStore.Downsample.FoldedLabels...)
	}
	out := filepath.Join(d.dir, "ds")
	keptCounts := true
	for _, in := range inputs {
		keptCounts = keptCounts && in.GPUStore.Downsample.KeptCounts
	}
	cfg := downsample.Config{SourceResolution: from, Resolution: res, Mint: mint, Maxt: maxt, Dir: out,
		Tenant: d.tenant, Sources: srcIDs, Fold: fold, Folded: folded, Types: d.types, SourceKeptCounts: keptCounts}
	id, _, err := downsample.Downsample(context.Background(), readers, cfg)
	if err != nil || id == (ulid.ULID{}) {
		d.t.Fatalf("downsample to %s: %v (%s)", downsample.ResolutionName(res), err, id)
	}
	dir := filepath.Join(out, id.String())
	bm, err := block.ReadLocalMeta(dir)
	if err != nil {
		d.t.Fatal(err)
	}
	// As the compactor uploads it: no source ranges (compaction.sources and
	// parents say what it holds).
	return d.upload(dir, block.Meta{BlockMeta: bm, GPUStore: block.GPUStoreMeta{
		Labels: sources[0].GPUStore.Labels, Source: downsample.Source,
		Downsample: block.Downsample{Resolution: res, FoldedLabels: cfg.FoldedLabels(), KeptCounts: cfg.KeptCounts() && !d.oldCounts}}})
}

func (d *dsBucket) upload(dir string, m block.Meta) block.Meta {
	d.t.Helper()
	m.GPUStore.Version, m.GPUStore.Tenant = block.MetaVersion, d.tenant
	if m.GPUStore.Labels == nil {
		m.GPUStore.Labels = map[string]string{}
	}
	if err := block.Upload(context.Background(), d.bkt, dir, m); err != nil {
		d.t.Fatal(err)
	}
	files, err := block.LocalFiles(dir)
	if err != nil {
		d.t.Fatal(err)
	}
	m.GPUStore.Files = files
	d.local[m.ULID], d.metas[m.ULID] = dir, m
	return m
}

// delete removes a block from the bucket (retention or compaction done).
func (d *dsBucket) delete(m block.Meta) {
	d.t.Helper()
	if err := d.bkt.Delete(context.Background(), block.ObjectName(d.tenant, m.ULID, block.MetaFilename)); err != nil {
		d.t.Fatal(err)
	}
}

// noCompact marks a block no-compact.
func (d *dsBucket) noCompact(m block.Meta) {
	d.t.Helper()
	if err := block.WriteNoCompactMark(context.Background(), d.bkt, d.tenant, m.ULID, "test", "", time.Now()); err != nil {
		d.t.Fatal(err)
	}
}

func (d *dsBucket) store() *Store {
	d.t.Helper()
	return storeWith(d.t.(*testing.T), d.bkt, nil, nil)
}

// answer is a query's result: per series and step, the value; and the
// annotations.
type answer struct {
	points map[string]map[int64]float64
	annos  annotations.Annotations
}

func (a answer) infos() []string {
	var out []string
	for _, err := range a.annos {
		out = append(out, err.Error())
	}
	slices.Sort(out)
	return out
}

func (a answer) hasInfo(sub string) bool {
	return slices.ContainsFunc(a.infos(), func(s string) bool { return strings.Contains(s, sub) })
}

var testEngine = promql.NewEngine(promql.EngineOpts{MaxSamples: 50_000_000, Timeout: time.Minute,
	EnableAtModifier: true, EnableNegativeOffset: true})

// query runs a range query (step > 0) or an instant query (step 0, at end)
// over the tenant's blocks as the query API runs it: max_source_resolution
// res in the read's options, the query prepared (downsample.Prepare:
// rewritten, its labels and whether its selects are evaluated at the steps
// only).
func (d *dsBucket) query(s *Store, res int64, q string, start, end, step int64) answer {
	d.t.Helper()
	qb := storeQueryable(s, d.tenant, func(o *readopts.ReadOptions) {
		if d.localFrom != 0 {
			o.LocalFrom = d.localFrom
		}
	})
	return d.queryOn(context.Background(), qb, res, q, start, end, step)
}

// queryOn is query over any queryable that takes the read's options from
// the context (storeQueryable, query.TenantQueryable).
func (d *dsBucket) queryOn(ctx context.Context, qb storage.Queryable, res int64, q string, start, end, step int64) answer {
	d.t.Helper()
	pq, err := downsample.Prepare(q)
	if err != nil {
		d.t.Fatalf("%s: %v", q, err)
	}
	o := readopts.Default()
	o.MaxSourceResolution = res
	o.AtSteps = pq.AtSteps && step > 0
	o.QueryLabels = pq.Labels
	ctx = readopts.NewContext(ctx, o)
	var qry promql.Query
	if step > 0 {
		qry, err = testEngine.NewRangeQuery(ctx, qb, nil, pq.Query, time.UnixMilli(start), time.UnixMilli(end), time.Duration(step)*time.Millisecond)
	} else {
		qry, err = testEngine.NewInstantQuery(ctx, qb, nil, pq.Query, time.UnixMilli(end))
	}
	if err != nil {
		d.t.Fatalf("%s: %v", q, err)
	}
	defer qry.Close()
	r := qry.Exec(ctx)
	if r.Err != nil {
		d.t.Fatalf("%s: %v", q, r.Err)
	}
	out := answer{points: map[string]map[int64]float64{}, annos: r.Warnings}
	add := func(ls labels.Labels, t int64, v float64) {
		k := ls.String()
		if out.points[k] == nil {
			out.points[k] = map[int64]float64{}
		}
		out.points[k][t] = v
	}
	switch v := r.Value.(type) {
	case promql.Matrix:
		for _, s := range v {
			for _, p := range s.Floats {
				add(s.Metric, p.T, p.F)
			}
			for _, p := range s.Histograms {
				add(s.Metric, p.T, p.H.Sum)
			}
		}
	case promql.Vector:
		for _, s := range v {
			if s.H != nil {
				add(s.Metric, s.T, s.H.Sum)
			} else {
				add(s.Metric, s.T, s.F)
			}
		}
	default:
		d.t.Fatalf("%s: result %T", q, r.Value)
	}
	return out
}

// mismatch is a point where two answers differ.
type mismatch struct {
	series    string
	at        int64
	want, got float64
	wantOK    bool // want has the point
	gotOK     bool
}

func (m mismatch) String() string {
	switch {
	case !m.gotOK:
		return fmt.Sprintf("%s at %s: want %v, got nothing", m.series, fmtTime(m.at), m.want)
	case !m.wantOK:
		return fmt.Sprintf("%s at %s: want nothing, got %v", m.series, fmtTime(m.at), m.got)
	}
	return fmt.Sprintf("%s at %s: want %v, got %v (%+.3g %%)", m.series, fmtTime(m.at), m.want, m.got, 100*(m.got-m.want)/m.want)
}

// mismatches lists the points where got differs from want beyond the
// relative tolerance rel, and how many points want has.
func mismatches(want, got answer, rel float64) ([]mismatch, int) {
	var out []mismatch
	n := 0
	keys := map[string]bool{}
	for k := range want.points {
		keys[k] = true
	}
	for k := range got.points {
		keys[k] = true
	}
	for _, k := range slices.Sorted(mapKeys(keys)) {
		w, g := want.points[k], got.points[k]
		for _, ts := range slices.Sorted(mapKeys(w)) {
			n++
			wv := w[ts]
			if gv, ok := g[ts]; !ok || !closeTo(wv, gv, rel) {
				out = append(out, mismatch{series: k, at: ts, want: wv, got: gv, wantOK: true, gotOK: ok})
			}
		}
		for _, ts := range slices.Sorted(mapKeys(g)) {
			if _, ok := w[ts]; !ok {
				out = append(out, mismatch{series: k, at: ts, got: g[ts], gotOK: true})
			}
		}
	}
	return out, n
}

// diff is mismatches as text, at most max lines.
func diff(want, got answer, rel float64, max int) ([]string, int) {
	ms, n := mismatches(want, got, rel)
	var out []string
	for _, m := range ms[:min(len(ms), max)] {
		out = append(out, m.String())
	}
	if len(ms) > max {
		out = append(out, fmt.Sprintf("(%d more)", len(ms)-max))
	}
	return out, n
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func closeTo(a, b, rel float64) bool {
	if math.IsNaN(a) || math.IsNaN(b) {
		return math.IsNaN(a) && math.IsNaN(b)
	}
	return a == b || math.Abs(a-b) <= rel*math.Max(math.Abs(a), math.Abs(b))
}

func fmtTime(ms int64) string { return time.UnixMilli(ms).UTC().Format("15:04:05.000") }

// gpuSeries returns the series of a small GPU node as dcgm-exporter labels
// them, scraped every interval over [from, to): an energy counter (mJ,
// growing with power, reset once by a driver reload), a temperature gauge,
// and the same for two MIG instances (GPU_I_PROFILE, GPU_I_ID).
func gpuSeries(host string, gpus int, from, to, interval int64) []rawData {
	var out []rawData
	for g := range gpus {
		base := []string{"Hostname", host, "gpu", fmt.Sprint(g), "UUID", fmt.Sprintf("GPU-%s-%d", host, g),
			"device", fmt.Sprintf("nvidia%d", g), "modelName", "NVIDIA H100 80GB HBM3"}
		lsets := [][]string{base}
		if g == 0 {
			for i, prof := range []string{"1g.10gb", "3g.40gb"} {
				lsets = append(lsets, append(slices.Clone(base), "GPU_I_PROFILE", prof, "GPU_I_ID", fmt.Sprint(i+1)))
			}
		}
		for j, ls := range lsets {
			energy := rawData{lset: labels.FromStrings(append([]string{"__name__", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"}, ls...)...)}
			temp := rawData{lset: labels.FromStrings(append([]string{"__name__", "DCGM_FI_DEV_GPU_TEMP"}, ls...)...)}
			e := float64(g*1e9 + j*1e6)
			phase := int64(g*1_237+j*311) % interval
			for ts := from + phase; ts < to; ts += interval {
				power := 300 + 250*math.Sin(float64(ts)/float64(17*minute)+float64(g)) // W
				e += power * float64(interval)                                         // mJ
				if ts/interval%1_333 == int64(g+7*j) {
					e = power // the driver reloaded
				}
				energy.ts, energy.fs = append(energy.ts, ts), append(energy.fs, math.Round(e))
				temp.ts, temp.fs = append(temp.ts, ts), append(temp.fs, math.Round(40+power/10+float64(ts%7)))
			}
			out = append(out, energy, temp)
		}
	}
	return out
}

// storeQueryable reads the tenant's blocks in s as the query path does
// (query.TenantQueryable): each querier is opened on its first call, with
// the read's options in that call's context (readopts.NewContext), as
// local changes them (what the caller serves itself; nil: nothing).
func storeQueryable(s *Store, tenant string, local func(*readopts.ReadOptions)) storage.Queryable {
	return storage.QueryableFunc(func(mint, maxt int64) (storage.Querier, error) {
		return &lazyQuerier{open: func(ctx context.Context) (storage.Querier, error) {
			o := readopts.FromContext(ctx)
			if local != nil {
				local(&o)
			}
			return s.Querier(tenant, mint, maxt, o)
		}}, nil
	})
}

type lazyQuerier struct {
	open func(context.Context) (storage.Querier, error)
	once sync.Once
	q    storage.Querier
	err  error
}

func (l *lazyQuerier) get(ctx context.Context) (storage.Querier, error) {
	l.once.Do(func() { l.q, l.err = l.open(ctx) })
	return l.q, l.err
}

func (l *lazyQuerier) Select(ctx context.Context, sortSeries bool, hints *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
	q, err := l.get(ctx)
	if err != nil {
		return storage.ErrSeriesSet(err)
	}
	return q.Select(ctx, sortSeries, hints, ms...)
}

func (l *lazyQuerier) LabelValues(ctx context.Context, name string, hints *storage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	q, err := l.get(ctx)
	if err != nil {
		return nil, nil, err
	}
	return q.LabelValues(ctx, name, hints, ms...)
}

func (l *lazyQuerier) LabelNames(ctx context.Context, hints *storage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	q, err := l.get(ctx)
	if err != nil {
		return nil, nil, err
	}
	return q.LabelNames(ctx, hints, ms...)
}

func (l *lazyQuerier) Close() error {
	l.once.Do(func() { l.q = storage.NoopQuerier() }) // never opened
	if l.q == nil {
		return nil
	}
	return l.q.Close()
}

// mustQuerier is s.Querier with the default options and what the caller
// serves itself (local, nil: nothing).
func mustQuerier(t testing.TB, s *Store, tenant string, mint, maxt int64, local func(ulid.ULID) bool) storage.Querier {
	t.Helper()
	o := readopts.Default()
	o.LocalBlocks = local
	q, err := s.Querier(tenant, mint, maxt, o)
	if err != nil {
		t.Fatal(err)
	}
	return q
}
