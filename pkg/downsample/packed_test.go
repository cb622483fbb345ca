package downsample

import (
	"context"
	"log/slog"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/value"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
)

// packedPoint is a point of a packed series as read back from a block.
type packedPoint struct {
	t     int64
	a     aggr
	stale bool
}

// readPacked reads every series of block b matching ms, keyed by labels,
// failing on anything but packed float histograms.
func readPacked(t *testing.T, b tsdb.BlockReader, ms ...*labels.Matcher) map[string][]packedPoint {
	t.Helper()
	q, err := tsdb.NewBlockQuerier(b, math.MinInt64, math.MaxInt64)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	out := map[string][]packedPoint{}
	ss := q.Select(context.Background(), true, nil, ms...)
	var it chunkenc.Iterator
	for ss.Next() {
		s := ss.At()
		it = s.Iterator(it)
		var pts []packedPoint
		for vt := it.Next(); vt != chunkenc.ValNone; vt = it.Next() {
			if vt != chunkenc.ValFloatHistogram {
				t.Fatalf("%s holds a %s sample, want packed float histograms", s.Labels(), vt)
			}
			ts, fh := it.AtFloatHistogram(nil)
			a, stale, err := unpackAggr(fh)
			if err != nil {
				t.Fatalf("%s at %d: %v", s.Labels(), ts, err)
			}
			pts = append(pts, packedPoint{ts, a, stale})
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
		out[s.Labels().String()] = pts
	}
	if err := ss.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func sameAggr(a, b aggr) bool {
	return sameFloat(a.count, b.count, 0) && sameFloat(a.sum, b.sum, 1e-12) && sameFloat(a.min, b.min, 0) && sameFloat(a.max, b.max, 0)
}

func checkPacked(t *testing.T, what string, got, want []packedPoint) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d points %+v, want %d %+v", what, len(got), got, len(want), want)
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.t != w.t || g.stale != w.stale || (!w.stale && !sameAggr(g.a, w.a)) {
			t.Errorf("%s: point %d = %+v, want %+v", what, i, g, w)
		}
	}
}

// Negative, NaN and ±Inf aggregates and staleness markers survive the
// packed encoding (which a TSDB head would refuse: negative "bucket counts")
// from raw to 5m and from 5m to 1h, with one series per raw gauge.
func TestPackedAggregatesRoundTrip(t *testing.T) {
	const m = int64(60_000)
	nan, inf, stale := math.NaN(), math.Inf(1), math.Float64frombits(value.StaleNaN)
	edge := rawSeries{lset: labels.FromStrings(model.MetricNameLabel, "edge_gauge", "gpu", "0")}
	for i, v := range []float64{
		-3, -7.5, nan, 2, -1, // (0, 5m]
		-1, -2, -3, -4, -5, // (5m, 10m]
		inf, 4, -inf, 0, 1, // (10m, 15m]
		nan, nan, stale, // (15m, 20m]: only NaN, then the series ends
	} {
		edge.ts = append(edge.ts, t0+int64(i+1)*m)
		edge.vs = append(edge.vs, v)
	}
	// It comes back: (25m, 30m], then ends with a marker alone in (30m, 35m].
	edge.ts = append(edge.ts, t0+26*m, t0+27*m, t0+32*m)
	edge.vs = append(edge.vs, 5, 6.5, stale)
	neg := rawSeries{lset: labels.FromStrings(model.MetricNameLabel, "neg_gauge", "gpu", "0")}
	for i := int64(1); i <= 24; i++ {
		neg.ts = append(neg.ts, t0+i*m)
		neg.vs = append(neg.vs, -float64(i)/4)
	}
	ctr := rawSeries{lset: labels.FromStrings(model.MetricNameLabel, "some_total", "gpu", "0"), counter: true,
		ts: []int64{t0 + m, t0 + 2*m, t0 + 7*m}, vs: []float64{1, 2, 3}}

	dir := t.TempDir()
	raw := writeRaw(t, filepath.Join(dir, "raw"), []rawSeries{edge, neg, ctr}, t0-Res1h, t0+2*Res1h)
	ctx := context.Background()
	id5, st5, err := Downsample(ctx, []tsdb.BlockReader{raw}, Config{SourceResolution: ResRaw, Resolution: Res5m,
		Mint: t0, Maxt: t0 + Res1h, Dir: filepath.Join(dir, "5m")})
	if err != nil {
		t.Fatal(err)
	}
	if st5.OutSeries != 3 {
		t.Errorf("5m block has %d series, want 3: one per raw series", st5.OutSeries)
	}
	b5 := openBlock(t, filepath.Join(dir, "5m", id5.String()))
	got := readPacked(t, b5, labels.MustNewMatcher(labels.MatchEqual, AggrLabel, AggrPacked))
	edgeKey := labels.NewBuilder(edge.lset).Set(AggrLabel, AggrPacked).Labels().String()
	negKey := labels.NewBuilder(neg.lset).Set(AggrLabel, AggrPacked).Labels().String()
	if len(got) != 2 {
		t.Fatalf("packed series %v, want %s and %s", got, edgeKey, negKey)
	}
	checkPacked(t, "edge_gauge 5m", got[edgeKey], []packedPoint{
		{t: t0 + 5*m - 1, a: aggr{5, nan, -7.5, 2}},
		{t: t0 + 10*m - 1, a: aggr{5, -15, -5, -1}},
		{t: t0 + 15*m - 1, a: aggr{5, nan, -inf, inf}},
		{t: t0 + 17*m - 1, a: aggr{2, nan, nan, nan}}, // at the last real sample: the window ends stale
		{t: t0 + 18*m - 1, stale: true},
		{t: t0 + 30*m - 1, a: aggr{2, 11.5, 5, 6.5}},
		{t: t0 + 32*m - 1, stale: true},
	})
	var want5 []packedPoint
	for w := int64(1); w <= 5; w++ {
		first, last := float64(5*(w-1)+1), float64(min(5*w, 24))
		want5 = append(want5, packedPoint{t: t0 + min(5*w*m, 24*m+1) - 1, a: aggr{
			count: last - first + 1, sum: -(first + last) * (last - first + 1) / 8, min: -last / 4, max: -first / 4,
		}})
	}
	want5[4].t = t0 + 25*m - 1
	checkPacked(t, "neg_gauge 5m", got[negKey], want5)

	id1, _, err := Downsample(ctx, []tsdb.BlockReader{b5}, Config{SourceResolution: Res5m, Resolution: Res1h,
		Mint: t0, Maxt: t0 + Res1h, Dir: filepath.Join(dir, "1h")})
	if err != nil {
		t.Fatal(err)
	}
	b1 := openBlock(t, filepath.Join(dir, "1h", id1.String()))
	got = readPacked(t, b1, labels.MustNewMatcher(labels.MatchEqual, AggrLabel, AggrPacked))
	checkPacked(t, "edge_gauge 1h", got[edgeKey], []packedPoint{
		{t: t0 + 30*m - 1, a: aggr{19, nan, -inf, inf}}, // the hour ends stale: at the last real point
		{t: t0 + 32*m - 1, stale: true},
	})
	checkPacked(t, "neg_gauge 1h", got[negKey], []packedPoint{{t: t0 + Res1h - 1, a: aggr{24, -75, -6, -0.25}}})

	// The views read the same through PromQL as raw data does.
	rawQ, q5, q1 := rawQueryable(raw), viewQueryable(Res5m, b5), viewQueryable(Res1h, b1)
	for _, qs := range []string{"min_over_time(neg_gauge[1h])", "max_over_time(neg_gauge[1h])", "sum_over_time(neg_gauge[1h])",
		"min_over_time(edge_gauge[1h])", "max_over_time(edge_gauge[1h])"} {
		want := rangeQuery(t, rawQ, qs, 5*time.Minute, t0+Res1h, t0+Res1h, Res1h)
		for name, q := range map[string]storage.Queryable{"5m": q5, "1h": q1} {
			compare(t, name+" "+qs, want, rangeQuery(t, q, qs, 5*time.Minute, t0+Res1h, t0+Res1h, Res1h), rounding)
		}
	}
}

// Packed points are not valid native histograms, which is why downsampled
// blocks are not written through a TSDB head.
func TestPackedPointsAreNotValidHistograms(t *testing.T) {
	if err := packAggr(aggr{count: 2, sum: -3, min: -2, max: -1}, nil).Validate(); err == nil {
		t.Fatal("a packed point with negative min and max validates; the head could write it")
	}
	var fh histogram.FloatHistogram
	if a, stale, err := unpackAggr(packedStale(&fh)); err != nil || !stale || a != (aggr{}) {
		t.Fatalf("stale packed point reads as %+v, stale %v, %v", a, stale, err)
	}
}

// oldLayout rewrites a block as blocks were written before the packed
// layout and pairs: one float series per gauge aggregate (count, sum, min,
// max, each with the staleness markers), a counter's kept samples one per
// point ("counter"). It keeps points in [mint, maxt).
func oldLayout(t *testing.T, dir string, b tsdb.BlockReader, mint, maxt int64) *tsdb.Block {
	t.Helper()
	w, err := tsdb.NewBlockWriter(slog.New(slog.DiscardHandler), dir, 4*span)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	app := w.Appender(context.Background())
	q, err := tsdb.NewBlockQuerier(b, math.MinInt64, math.MaxInt64)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	ss := q.Select(context.Background(), true, nil, labels.MustNewMatcher(labels.MatchRegexp, model.MetricNameLabel, ".+"))
	var it chunkenc.Iterator
	for ss.Next() {
		s := ss.At()
		it = s.Iterator(it)
		isPacked := s.Labels().Get(AggrLabel) == AggrPacked
		if s.Labels().Get(AggrLabel) == AggrPairs {
			kept := labels.NewBuilder(s.Labels()).Set(AggrLabel, AggrCounter).Labels()
			pi := pairsSeries{lset: kept, s: s, lo: mint, hi: maxt - 1}.Iterator(nil)
			for pi.Next() != chunkenc.ValNone {
				ts, v := pi.At()
				if _, err := app.Append(0, kept, ts, v); err != nil {
					t.Fatal(err)
				}
			}
			if err := pi.Err(); err != nil {
				t.Fatal(err)
			}
			continue
		}
		for vt := it.Next(); vt != chunkenc.ValNone; vt = it.Next() {
			if it.AtT() < mint || it.AtT() >= maxt {
				continue
			}
			if !isPacked {
				if vt != chunkenc.ValFloat {
					t.Fatalf("%s: %s sample", s.Labels(), vt)
				}
				ts, v := it.At()
				if _, err := app.Append(0, s.Labels(), ts, v); err != nil {
					t.Fatal(err)
				}
				continue
			}
			ts, fh := it.AtFloatHistogram(nil)
			a, isStale, err := unpackAggr(fh)
			if err != nil {
				t.Fatal(err)
			}
			for name, v := range map[string]float64{AggrCount: a.count, AggrSum: a.sum, AggrMin: a.min, AggrMax: a.max} {
				if isStale {
					v = math.Float64frombits(value.StaleNaN)
				}
				ls := labels.NewBuilder(s.Labels()).Set(AggrLabel, name).Labels()
				if _, err := app.Append(0, ls, ts, v); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if err := ss.Err(); err != nil {
		t.Fatal(err)
	}
	if err := app.Commit(); err != nil {
		t.Fatal(err)
	}
	id, err := w.Flush(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return openBlock(t, filepath.Join(dir, id.String()))
}

// fixtureQueries are the queries the property test checks, as run against
// a downsampled queryable (count/avg_over_time rewritten).
func fixtureQueries(t *testing.T, r int64) []string {
	rs := (time.Duration(r) * time.Millisecond).String()
	rs3 := (time.Duration(3*r) * time.Millisecond).String()
	qs := []string{
		"resets(counter_metric_total[" + rs + "])", "rate(counter_metric_total[" + rs + "])",
		"max_over_time(gauge_metric[" + rs + "])", "min_over_time(gauge_metric[" + rs + "])",
		"sum_over_time(gauge_metric[" + rs + "])", "gauge_metric", "avg(gauge_metric)", "max(gauge_metric)",
		"rate(gauge_metric[" + rs3 + "])", "max_over_time(gauge_metric[" + rs3 + "])",
	}
	for _, q := range []string{"count_over_time(gauge_metric[" + rs + "])", "avg_over_time(gauge_metric[" + rs + "])"} {
		rq, _, err := rewriteQuery(q)
		if err != nil {
			t.Fatal(err)
		}
		qs = append(qs, rq)
	}
	return qs
}

// sameAnswers runs qs over want and got at every multiple of res.
//
// Old layouts do not record the raw samples a counter's kept samples stand
// for: rate and increase over them where a series starts or ends inside a
// range may differ from raw's (and the packed blocks') answer, and then say
// they are approximate.
func sameAnswers(t *testing.T, what string, want, got storage.Queryable, res int64) {
	t.Helper()
	lb := time.Duration(res) * time.Millisecond
	for _, qs := range fixtureQueries(t, res) {
		w := rangeQuery(t, want, qs, lb, t0+3*res, t0+span, res)
		g, infos := rangeQueryInfos(t, got, qs, lb, t0+3*res, t0+span, res)
		if differ(w, g, rounding) && slices.ContainsFunc(infos, func(s string) bool { return strings.Contains(s, "approximate") }) {
			continue
		}
		compare(t, what+": "+qs, w, g, rounding)
	}
}

// differ says whether two answers differ anywhere (ok failing, or a point
// missing on either side).
func differ(want, got points, ok func(string, int64, float64, float64) bool) bool {
	for k, w := range want {
		if len(w) != len(got[k]) {
			return true
		}
		for ts, wv := range w {
			if gv, found := got[k][ts]; !found || !ok(k, ts, wv, gv) {
				return true
			}
		}
	}
	return len(want) != len(got)
}

// Buckets hold blocks written before the packed layout (four series per
// gauge). They answer as the packed blocks of the same data do, are
// downsampled to 1h, and mix with packed blocks in one query and in one 1h
// block.
func TestOldLayoutBlocksStillAnswer(t *testing.T) {
	f := newFixture(t, 7, 8)
	dir := t.TempDir()
	old5 := oldLayout(t, filepath.Join(dir, "old5m"), f.b5m, math.MinInt64, math.MaxInt64)
	sameAnswers(t, "old 5m vs packed 5m", f.ds5m, viewQueryable(Res5m, old5), Res5m)

	ctx := context.Background()
	id, _, err := Downsample(ctx, []tsdb.BlockReader{old5}, Config{SourceResolution: Res5m, Resolution: Res1h,
		Mint: t0, Maxt: t0 + span, Dir: filepath.Join(dir, "1h-from-old")})
	if err != nil {
		t.Fatal(err)
	}
	old1 := openBlock(t, filepath.Join(dir, "1h-from-old", id.String()))
	if n := len(readPacked(t, old1, labels.MustNewMatcher(labels.MatchEqual, AggrLabel, AggrPacked))); n != 0 {
		t.Errorf("1h from an old-layout block has %d packed series; old layout stays old", n)
	}
	sameAnswers(t, "1h from old 5m vs packed 1h", f.ds1h, viewQueryable(Res1h, old1), Res1h)

	// The first 3h in the old layout beside the packed block of the whole
	// span: the same windows in both layouts read once.
	split := t0 + 3*Res1h
	oldHalf := oldLayout(t, filepath.Join(dir, "oldhalf"), f.b5m, math.MinInt64, split)
	sameAnswers(t, "old and packed 5m of the same windows", f.ds5m, viewQueryable(Res5m, oldHalf, f.b5m), Res5m)
	// Downsampled together to 1h: the first 3h's windows in both layouts.
	id, _, err = Downsample(ctx, []tsdb.BlockReader{oldHalf, f.b5m}, Config{SourceResolution: Res5m, Resolution: Res1h,
		Mint: t0, Maxt: t0 + span, Dir: filepath.Join(dir, "1h-both")})
	if err != nil {
		t.Fatal(err)
	}
	both := openBlock(t, filepath.Join(dir, "1h-both", id.String()))
	sameAnswers(t, "1h from old and packed 5m", f.ds1h, viewQueryable(Res1h, both), Res1h)
	// Old 1h blocks early, packed late.
	id, _, err = Downsample(ctx, []tsdb.BlockReader{oldHalf}, Config{SourceResolution: Res5m, Resolution: Res1h,
		Mint: t0, Maxt: split, Dir: filepath.Join(dir, "1h-early")})
	if err != nil {
		t.Fatal(err)
	}
	early := openBlock(t, filepath.Join(dir, "1h-early", id.String()))
	id, _, err = Downsample(ctx, []tsdb.BlockReader{f.b5m}, Config{SourceResolution: Res5m, Resolution: Res1h,
		Mint: split, Maxt: t0 + span, Dir: filepath.Join(dir, "1h-late")})
	if err != nil {
		t.Fatal(err)
	}
	late := openBlock(t, filepath.Join(dir, "1h-late", id.String()))
	sameAnswers(t, "1h from old (early) and packed (late) 5m", f.ds1h, viewQueryable(Res1h, early, late), Res1h)
}

// The compactor merges overlapping downsampled blocks (a raw block that grew
// late samples is downsampled again) with the TSDB's compacting chunk
// merger: packed series merge like any other.
func TestVerticalCompactionOfPackedBlocks(t *testing.T) {
	f := newFixture(t, 11, 8)
	dir := t.TempDir()
	src := []tsdb.BlockReader{f.b5m}
	ctx := context.Background()
	var dirs []string
	for i, r := range [][2]int64{{t0, t0 + 4*Res1h}, {t0 + 2*Res1h, t0 + span}} {
		// Two 1h blocks of the same 5m block, overlapping in [2h, 4h).
		out := filepath.Join(dir, "1h", string(rune('a'+i)))
		id, _, err := Downsample(ctx, src, Config{SourceResolution: Res5m, Resolution: Res1h, Mint: r[0], Maxt: r[1], Dir: out})
		if err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, filepath.Join(out, id.String()))
	}
	lc, err := tsdb.NewLeveledCompactorWithOptions(ctx, nil, slog.New(slog.DiscardHandler), []int64{span}, nil, tsdb.LeveledCompactorOptions{
		MergeFunc:                   storage.NewCompactingChunkSeriesMerger(storage.ChainedSeriesMerge),
		EnableOverlappingCompaction: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	ids, err := lc.Compact(filepath.Join(dir, "merged"), dirs, nil)
	if err != nil || len(ids) != 1 {
		t.Fatalf("compact: %v %v", ids, err)
	}
	merged := openBlock(t, filepath.Join(dir, "merged", ids[0].String()))
	if got, want := merged.Meta().Stats.NumSeries, f.b1h.Meta().Stats.NumSeries; got != want {
		t.Errorf("merged block has %d series, the one-piece 1h block %d", got, want)
	}
	if got, want := merged.Meta().Stats.NumSamples, f.b1h.Meta().Stats.NumSamples; got != want {
		t.Errorf("merged block has %d samples, the one-piece 1h block %d: overlap not merged", got, want)
	}
	sameAnswers(t, "vertically compacted 1h vs one-piece 1h", f.ds1h, viewQueryable(Res1h, merged), Res1h)
}

// Plain selectors over 1h data at steps between windows (the fill) read the
// packed layout as they read the old one.
func TestPlainSelectorFillReadsPackedAsOld(t *testing.T) {
	f := newFixture(t, 7, 8)
	old1 := oldLayout(t, filepath.Join(t.TempDir(), "old1h"), f.b1h, math.MinInt64, math.MaxInt64)
	mk := func(b tsdb.BlockReader) storage.Queryable {
		return storage.QueryableFunc(func(mint, maxt int64) (storage.Querier, error) {
			q, err := tsdb.NewBlockQuerier(b, mint, maxt)
			if err != nil {
				return nil, err
			}
			return NewQuerier(Blocks{Parts: []Part{{Querier: q, Lo: mint, Hi: maxt}}, Resolution: Res1h, From: mint, To: math.MaxInt64, AtSteps: true}), nil
		})
	}
	for _, qs := range []string{"avg(gauge_metric)", "gauge_metric"} {
		want := rangeQuery(t, mk(old1), qs, 5*time.Minute, t0+17*60_000, t0+span, 37*60_000)
		got := rangeQuery(t, mk(f.b1h), qs, 5*time.Minute, t0+17*60_000, t0+span, 37*60_000)
		compare(t, qs, want, got, exact)
	}
}
