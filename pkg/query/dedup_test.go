package query

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/grafana/dskit/user"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"

	"github.com/gpustore/gpustore/pkg/tenantdb"
)

// Two replicas of an HA pair stored without ingest dedup: p0 has a
// 3-minute hole, p1 scrapes 300 ms later and its counter reads a little low
// (as a replica with a lagging exporter cache might), which a naive switch
// would turn into counter resets.
func TestQueryTimeDedup(t *testing.T) {
	dbs, db := tenantDB(t, tenantdb.DefaultConfig(), "t")
	start := time.Now().Add(-time.Hour).Truncate(time.Minute).UnixMilli()
	const step = 15000
	app := db.Appender(context.Background())
	for i := int64(0); i <= 80; i++ {
		ts := start + i*step
		for _, r := range []struct {
			name   string
			lag    int64
			offset float64
		}{{"p0", 0, 0}, {"p1", 300, -50}} {
			if r.name == "p0" && i >= 30 && i < 42 {
				continue // p0 down for 3 minutes
			}
			t := ts + r.lag
			for _, s := range []struct {
				lset labels.Labels
				v    float64
			}{
				{labels.FromStrings("__name__", "energy_total", "gpu", "0", "cluster", "a", "__replica__", r.name), 1e6 + 10*float64(t)/1000 + r.offset},
				{labels.FromStrings("__name__", "gpu_temp", "gpu", "0", "cluster", "a", "__replica__", r.name), 70},
			} {
				if _, err := app.Append(0, s.lset, t, s.v); err != nil {
					panic(err)
				}
			}
		}
	}
	if err := app.Commit(); err != nil {
		t.Fatal(err)
	}

	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 1e7, Timeout: time.Minute, LookbackDelta: 5 * time.Minute})
	q := TenantQueryable{DBs: dbs}
	run := func(ctx context.Context, expr string) promql.Matrix {
		t.Helper()
		qry, err := engine.NewRangeQuery(ctx, q, nil, expr, time.UnixMilli(start+5*60000), time.UnixMilli(start+80*step), 15*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		res := qry.Exec(ctx)
		if res.Err != nil {
			t.Fatal(res.Err)
		}
		m, err := res.Matrix()
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	plain := user.InjectOrgID(context.Background(), "t")
	dedup := withDedup(plain, []string{"__replica__"})

	if m := run(plain, `sum(gpu_temp)`); m[0].Floats[0].F != 140 {
		t.Fatalf("without dedup both replicas count: %v", m[0].Floats[0].F)
	}
	if m := run(dedup, `sum(gpu_temp)`); m[0].Floats[0].F != 70 {
		t.Fatalf("with dedup one replica counts: %v", m[0].Floats[0].F)
	}
	m := run(dedup, `energy_total`)
	if len(m) != 1 || m[0].Metric.Has("__replica__") {
		t.Fatalf("dedup result %v", m)
	}
	// The replicas disagree by 50 (5 s worth of increase); a switch may cost
	// at most one scrape interval's worth (150) of a window's increase.
	for _, c := range []struct {
		expr   string
		window float64
	}{{`rate(energy_total[1m])`, 60}, {`rate(energy_total[5m])`, 300}} {
		expr := c.expr
		m := run(dedup, expr)
		if len(m) != 1 {
			t.Fatalf("%s: %d series", expr, len(m))
		}
		for _, p := range m[0].Floats {
			if math.Abs(p.F-10) > 150/c.window {
				t.Errorf("%s at %s = %g, want 10 (no fake reset, no hole)", expr, time.UnixMilli(p.T).Format(time.TimeOnly), p.F)
			}
		}
	}
	if m := run(dedup, `resets(energy_total[20m])`); m[len(m)-1].Floats[len(m[0].Floats)-1].F != 0 {
		t.Fatalf("resets across the replica switch: %v", m)
	}
}

// fsample is a float sample for storage.NewListSeries.
type fsample struct {
	t int64
	f float64
}

func (s fsample) T() int64                      { return s.t }
func (s fsample) ST() int64                     { return 0 }
func (s fsample) F() float64                    { return s.f }
func (s fsample) H() *histogram.Histogram       { return nil }
func (s fsample) FH() *histogram.FloatHistogram { return nil }
func (s fsample) Type() chunkenc.ValueType      { return chunkenc.ValFloat }
func (s fsample) Copy() chunks.Sample           { return s }

// dedupOf merges replicas (in the order a sorted querier yields them: by
// replica name) of one series as the query path does, and returns what the
// merged series iterates.
func dedupOf(t testing.TB, replicas [][]fsample, fn string) []fsample {
	t.Helper()
	var series []storage.Series
	for i, r := range replicas {
		ss := make([]chunks.Sample, len(r))
		for j, s := range r {
			ss[j] = s
		}
		series = append(series, storage.NewListSeries(labels.FromStrings("__name__", "m", "__replica__", fmt.Sprintf("r%d", i)), ss))
	}
	set := dedupSeriesSet(&listSeriesSet{series: series, idx: -1}, []string{"__replica__"}, &storage.SelectHints{Func: fn})
	var out []fsample
	for set.Next() {
		it := set.At().Iterator(nil)
		for it.Next() == chunkenc.ValFloat {
			ts, v := it.At()
			out = append(out, fsample{ts, v})
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := set.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

const scrapeEvery = 15_000 // ms

// scrapes are a replica's samples every 15 s in [from, to), lag ms after the
// scrape slot; the value tells the replica and the slot apart.
func scrapes(replica int, from, to, lag int64) []fsample {
	var out []fsample
	for ts := from; ts < to; ts += scrapeEvery {
		out = append(out, fsample{ts + lag, float64(1000*replica) + float64(ts/scrapeEvery)})
	}
	return out
}

func join(parts ...[]fsample) []fsample { return slices.Concat(parts...) }

const minute = 60_000

// TestDedupReplicaLayouts: the merged series covers the union of the
// replicas' time ranges, whichever replica sorts first, and follows one
// replica between gaps (one sample per scrape, none counted twice).
func TestDedupReplicaLayouts(t *testing.T) {
	// r1 scrapes 300 ms after r0 in every case.
	for _, c := range []struct {
		name     string
		replicas [][]fsample
		want     []fsample
	}{{
		name:     "the replica that sorts first starts late",
		replicas: [][]fsample{scrapes(0, 120*minute, 240*minute, 0), scrapes(1, 0, 240*minute, 300)},
		want:     scrapes(1, 0, 240*minute, 300),
	}, {
		name:     "the replica that sorts last starts late",
		replicas: [][]fsample{scrapes(0, 0, 240*minute, 0), scrapes(1, 120*minute, 240*minute, 300)},
		want:     scrapes(0, 0, 240*minute, 0),
	}, {
		name:     "a replica ends early",
		replicas: [][]fsample{scrapes(0, 0, 120*minute, 0), scrapes(1, 0, 240*minute, 300)},
		want:     join(scrapes(0, 0, 120*minute, 0), scrapes(1, 120*minute, 240*minute, 300)),
	}, {
		name:     "the replica that starts late also ends early",
		replicas: [][]fsample{scrapes(0, 0, 240*minute, 0), scrapes(1, 60*minute, 120*minute, 300)},
		want:     scrapes(0, 0, 240*minute, 0),
	}, {
		name: "replicas alternate",
		replicas: [][]fsample{
			join(scrapes(0, 30*minute, 60*minute, 0), scrapes(0, 90*minute, 120*minute, 0)),
			join(scrapes(1, 0, 30*minute, 300), scrapes(1, 60*minute, 90*minute, 300)),
		},
		want: join(scrapes(1, 0, 30*minute, 300), scrapes(0, 30*minute, 60*minute, 0), scrapes(1, 60*minute, 90*minute, 300), scrapes(0, 90*minute, 120*minute, 0)),
	}, {
		name:     "replicas overlap only partly",
		replicas: [][]fsample{scrapes(0, 60*minute, 240*minute, 0), scrapes(1, 0, 180*minute, 300)},
		want:     join(scrapes(1, 0, 180*minute, 300), scrapes(0, 180*minute, 240*minute, 0)),
	}, {
		name:     "a lone first sample, then a gap",
		replicas: [][]fsample{join(scrapes(0, 0, scrapeEvery, 0), scrapes(0, 60*minute, 120*minute, 0)), scrapes(1, 0, 120*minute, 300)},
		want:     join(scrapes(0, 0, scrapeEvery, 0), scrapes(1, scrapeEvery, 120*minute, 300)),
	}, {
		name: "three replicas, each up for a stretch",
		replicas: [][]fsample{
			scrapes(0, 80*minute, 120*minute, 0),
			scrapes(1, 40*minute, 80*minute, 300),
			scrapes(2, 0, 40*minute, 7000),
		},
		want: join(scrapes(2, 0, 40*minute, 7000), scrapes(1, 40*minute, 80*minute, 300), scrapes(0, 80*minute, 120*minute, 0)),
	}} {
		t.Run(c.name, func(t *testing.T) {
			got := dedupOf(t, c.replicas, "")
			if !slices.Equal(got, c.want) {
				t.Fatalf("got %d samples %s, want %d %s", len(got), describeSamples(got), len(c.want), describeSamples(c.want))
			}
		})
	}
}

// describeSamples shows the stretches of a merged series: which replica
// (the value's thousands), from when to when.
func describeSamples(s []fsample) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		j := i
		for j+1 < len(s) && int(s[j+1].f)/1000 == int(s[i].f)/1000 && s[j+1].t-s[j].t <= 2*scrapeEvery {
			j++
		}
		fmt.Fprintf(&b, " r%d[%dms..%dms]x%d", int(s[i].f)/1000, s[i].t, s[j].t, j-i+1)
		i = j + 1
	}
	return b.String()
}

// referenceDedup is the rule of query-time dedup written as plainly as
// possible, with the scrapeEvery interval known rather than estimated: start on
// the replica with the earliest sample; stay on it while its next sample is
// within two intervals; across a gap take the earliest sample of any replica
// at least half an interval later (not the other replica's answer to the
// scrapeEvery just taken), except, for counters, one below the last value while
// the replica left behind still goes up.
func referenceDedup(replicas [][]fsample, interval int64, counter bool) []fsample {
	after := func(r []fsample, t int64) int { // index of the first sample at or after t
		i, _ := slices.BinarySearchFunc(r, t, func(s fsample, t int64) int { return cmp.Compare(s.t, t) })
		return i
	}
	earliest := func(pos []int) int {
		pick := -1
		for i, r := range replicas {
			if pos[i] < len(r) && (pick == -1 || r[pos[i]].t < replicas[pick][pos[pick]].t) {
				pick = i
			}
		}
		return pick
	}
	var out []fsample
	pos := make([]int, len(replicas))
	cur := earliest(pos)
	for cur != -1 {
		s := replicas[cur][pos[cur]]
		out = append(out, s)
		for i, r := range replicas {
			pos[i] = after(r, s.t+1)
		}
		next, ok := fsample{}, pos[cur] < len(replicas[cur])
		if ok {
			next = replicas[cur][pos[cur]]
		}
		if ok && next.t <= s.t+2*interval {
			continue
		}
		for i, r := range replicas {
			if i != cur {
				pos[i] = after(r, s.t+interval/2)
				for counter && ok && next.f >= s.f && pos[i] < len(r) && r[pos[i]].f < s.f {
					pos[i]++
				}
			}
		}
		cur = earliest(pos)
	}
	return out
}

// randomReplicas lays out 2 or 3 replicas of one series scraped every
// interval: each with its own lag, up and down in stretches, now and then
// missing one scrape. Each stretch holds at least two samples (a replica's
// interval is known from its own samples). Counter values grow at the same
// rate in every replica, each replica reading high or low by up to two
// intervals' increase, so that switching may look like a reset.
func randomReplicas(rng *rand.Rand, interval int64, counter bool) [][]fsample {
	slots := 20 + rng.Int64N(200)
	n := 2 + rng.IntN(2)
	out := make([][]fsample, n)
	for r := range out {
		lag := rng.Int64N(interval)
		if rng.IntN(4) == 0 {
			lag = 0 // scrapes at the same millisecond as another replica
		}
		bias := (rng.Float64()*2 - 1) * float64(2*interval) / 100 // up to two intervals' increase
		up := rng.IntN(3) > 0
		var run []fsample
		flush := func() {
			if len(run) >= 2 {
				out[r] = append(out[r], run...)
			}
			run = run[:0]
		}
		for slot := int64(0); slot < slots; slot++ {
			if rng.IntN(15) == 0 {
				up = !up
				if !up {
					flush()
				}
			}
			if !up {
				continue
			}
			if rng.IntN(25) == 0 { // one missed scrape
				flush()
				continue
			}
			ts := slot*interval + lag
			v := float64(rng.IntN(100))
			if counter {
				v = float64(ts)/100 + bias
			}
			run = append(run, fsample{ts, v})
		}
		flush()
	}
	return out
}

// TestDedupMatchesReferenceMerge compares the merge with the reference rule
// on random replica layouts, and checks the reference keeps its promise:
// every sample of any replica has a merged sample within one interval (the
// union of the replicas is covered), and no two merged samples are closer
// than half an interval (no scrapeEvery counted twice).
func TestDedupMatchesReferenceMerge(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 1))
	for i := range 400 {
		interval := []int64{10_000, 15_000, 30_000, 60_000}[rng.IntN(4)]
		counter := i%2 == 1
		replicas := randomReplicas(rng, interval, counter)
		fn := ""
		if counter {
			fn = "rate"
		}
		want := referenceDedup(replicas, interval, counter)
		got := dedupOf(t, replicas, fn)
		if !slices.Equal(got, want) {
			t.Fatalf("case %d (interval %d, counter %v): merged\n%v\nreference\n%v\nreplicas\n%v", i, interval, counter, got, want, replicas)
		}
		for j := 1; j < len(want); j++ {
			if want[j].t-want[j-1].t < interval/2 {
				t.Fatalf("case %d: reference merge has samples %v and %v", i, want[j-1], want[j])
			}
		}
		if counter {
			continue // the counter guard may skip a stretch that looks like a fake reset
		}
		for _, r := range replicas {
			for _, s := range r {
				j, _ := slices.BinarySearchFunc(want, s.t, func(o fsample, t int64) int { return cmp.Compare(o.t, t) })
				near := (j < len(want) && want[j].t-s.t <= interval) || (j > 0 && s.t-want[j-1].t <= interval)
				if !near {
					t.Fatalf("case %d: sample %v has no merged sample within %d ms\nreplicas %v\nmerged %v", i, s, interval, replicas, want)
				}
			}
		}
	}
}

// TestDedupTieIndependentOfSelectOrder: the engine selects unsorted, and the
// head returns series in the order they were created; replicas with samples
// at the same times still merge to the first replica by labels.
func TestDedupTieIndependentOfSelectOrder(t *testing.T) {
	dbs, db := tenantDB(t, tenantdb.DefaultConfig(), "t")
	start := time.Now().Add(-time.Hour).Truncate(time.Minute).UnixMilli()
	app := db.Appender(context.Background())
	for i := int64(0); i < 20; i++ {
		for _, r := range []struct {
			name string
			v    float64
		}{{"p1", 1}, {"p0", 2}} { // p1 created first
			if _, err := app.Append(0, labels.FromStrings("__name__", "x", "__replica__", r.name), start+i*15000, r.v); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := app.Commit(); err != nil {
		t.Fatal(err)
	}
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 1e7, Timeout: time.Minute, LookbackDelta: 5 * time.Minute})
	ctx := withDedup(user.InjectOrgID(context.Background(), "t"), []string{"__replica__"})
	qry, err := engine.NewRangeQuery(ctx, TenantQueryable{DBs: dbs}, nil, "x", time.UnixMilli(start), time.UnixMilli(start+19*15000), 15*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	m, err := qry.Exec(ctx).Matrix()
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 1 || len(m[0].Floats) != 20 {
		t.Fatalf("merged replicas: %v", m)
	}
	for _, p := range m[0].Floats {
		if p.F != 2 {
			t.Fatalf("at %d the merge took replica p1's %v, not p0's", p.T, p.F)
		}
	}
}

// tenantDB opens a tenant manager with cfg in a temporary directory (closed
// with the test) and the tenant's TSDB.
func tenantDB(t *testing.T, cfg tenantdb.Config, tenant string) (*tenantdb.Manager, *tenantdb.DB) {
	t.Helper()
	cfg.Dir = t.TempDir()
	dbs, err := tenantdb.NewManager(cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dbs.Close() })
	db, err := dbs.Get(tenant)
	if err != nil {
		t.Fatal(err)
	}
	return dbs, db
}
