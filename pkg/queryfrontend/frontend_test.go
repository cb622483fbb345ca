package queryfrontend

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/thanos-io/objstore/providers/filesystem"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/compact"
	"github.com/gpustore/gpustore/pkg/downsample"
	"github.com/gpustore/gpustore/pkg/query"
	"github.com/gpustore/gpustore/pkg/storage/bucketstore"
	"github.com/gpustore/gpustore/pkg/tenancy"
	"github.com/gpustore/gpustore/pkg/tenantdb"
)

// stack is the query API twice over one set of real TSDBs: once behind the
// frontend (split and cached) and once as it is without it.
type stack struct {
	dbs           *tenantdb.Manager
	limits        *testLimits
	fe            *Frontend
	front, direct *httptest.Server
	now           time.Time // data ends here
	dataStart     time.Time
}

type testLimits struct {
	mtx sync.Mutex
	ooo time.Duration
}

func (l *testLimits) MaxActiveSeries(string) int    { return 0 }
func (l *testLimits) MaxSeriesPerMetric(string) int { return 0 }
func (l *testLimits) MaxNewSeriesPerDay(string) int { return 0 }
func (l *testLimits) OutOfOrderWindow(string) time.Duration {
	l.mtx.Lock()
	defer l.mtx.Unlock()
	return l.ooo
}

const testInterval = 30 * time.Second

// downsampledInfo starts the bucket store's info annotation on downsampled
// reads, approximateInfo the one on answers that are not raw's.
const (
	downsampledInfo = "gpustore: served from downsampled blocks"
	approximateInfo = "gpustore: approximate answer from downsampled data"
)

// newStack writes days of GPU-like series, ending now, into a real TSDB,
// and serves them through Prometheus' API and engine (pkg/query).
func newStack(t testing.TB, days int, mutate func(*Config, *Deps)) *stack {
	t.Helper()
	return newStackOOO(t, days, 0, mutate)
}

// newStackOOO is newStack with the tenant's out-of-order window set before
// its database opens.
func newStackOOO(t testing.TB, days int, ooo time.Duration, mutate func(*Config, *Deps)) *stack {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := tenantdb.DefaultConfig()
	cfg.Dir = t.TempDir()
	cfg.Retention = model.Duration(30 * 24 * time.Hour)
	dbs, err := tenantdb.NewManager(cfg, logger, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dbs.Close() })
	lim := &testLimits{ooo: ooo}
	dbs.SetLimits(lim)
	s := &stack{dbs: dbs, limits: lim, now: time.Now().Truncate(time.Second)}
	s.dataStart = s.now.Add(-time.Duration(days) * 24 * time.Hour)
	db, err := dbs.Get("default")
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	type series struct {
		ls  labels.Labels
		val float64
	}
	var ss []*series
	// An HA pair not deduplicated at ingest: the same scrapes, values
	// apart by replica (query-time dedup follows one replica).
	for _, r := range []string{"a", "b"} {
		ss = append(ss, &series{ls: labels.FromStrings("__name__", "ha_util", "__replica__", r, "gpu", "0")})
	}
	for g := 0; g < 4; g++ {
		gpu := fmt.Sprint(g)
		ss = append(ss,
			&series{ls: labels.FromStrings("__name__", "gpu_util", "gpu", gpu, "Hostname", "node-1")},
			&series{ls: labels.FromStrings("__name__", "energy_total", "gpu", gpu, "Hostname", "node-1")})
	}
	// Oldest first across all series: the head takes in-order samples only
	// within an hour of its newest.
	app := db.Appender(context.Background())
	n := 0
	for ts := s.dataStart; !ts.After(s.now); ts = ts.Add(testInterval) {
		for i, x := range ss {
			if i == 2 && ts.Unix()%(6*3600) < 1200 { // gaps: the series is absent 20 min every 6 h
				continue
			}
			if strings.HasSuffix(x.ls.Get("__name__"), "_total") {
				x.val += rng.Float64() * 100
				if rng.IntN(2000) == 0 {
					x.val = 0 // a counter reset
				}
			} else {
				x.val = math.Round(rng.Float64()*1000) / 10
			}
			if _, err := app.Append(0, x.ls, ts.UnixMilli(), x.val); err != nil {
				t.Fatal(err)
			}
			n++
		}
		if n > 20000 {
			if err := app.Commit(); err != nil {
				t.Fatal(err)
			}
			app, n = db.Appender(context.Background()), 0
		}
	}
	if err := app.Commit(); err != nil {
		t.Fatal(err)
	}
	// Cut the head's blocks now, not in the TSDB's background while a test
	// counts cache hits (each new block changes the layout under a day).
	if err := db.Compact(context.Background()); err != nil {
		t.Fatal(err)
	}

	fcfg := DefaultConfig()
	qcfg := query.DefaultConfig()
	deps := Deps{
		Logger: logger, Registry: prometheus.NewRegistry(), MaxConcurrency: qcfg.MaxConcurrency,
		LookbackDelta: time.Duration(qcfg.LookbackDelta), ReplicaLabels: qcfg.ReplicaLabels, MaxSourceResolution: qcfg.MaxSourceResolution,
		OutOfOrderWindow: lim.OutOfOrderWindow, Blocks: TenantBlocks(dbs, nil),
	}
	if mutate != nil {
		mutate(&fcfg, &deps)
	}
	qcfg.MaxConcurrency = deps.MaxConcurrency
	s.fe, err = New(fcfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	serve := func(frontend func(http.Handler) http.Handler) *httptest.Server {
		api, err := query.New(query.Options{
			Config: qcfg, Tenants: tenancy.DefaultConfig(), DBs: dbs, Logger: logger, Registry: prometheus.NewRegistry(),
			Ready: func() error { return nil }, ActiveQueryDir: t.TempDir(), Frontend: frontend,
		})
		if err != nil {
			t.Fatal(err)
		}
		mux := http.NewServeMux()
		api.RegisterRoutes(mux)
		srv := httptest.NewServer(mux)
		t.Cleanup(srv.Close)
		return srv
	}
	s.front, s.direct = serve(s.fe.Wrap), serve(nil)
	return s
}

type promAnswer struct {
	Status    string          `json:"status"`
	Data      json.RawMessage `json:"data"`
	ErrorType string          `json:"errorType"`
	Error     string          `json:"error"`
	Warnings  []string        `json:"warnings"`
	Infos     []string        `json:"infos"`
	code      int
}

func rangeQuery(t testing.TB, srv *httptest.Server, q string, start, end time.Time, step time.Duration, headers ...string) promAnswer {
	t.Helper()
	return rangeQueryForm(t, srv, rangeForm(q, start, end, step), headers...)
}

func rangeForm(q string, start, end time.Time, step time.Duration) url.Values {
	return url.Values{"query": {q}, "start": {fmt.Sprintf("%.3f", float64(start.UnixMilli())/1000)},
		"end": {fmt.Sprintf("%.3f", float64(end.UnixMilli())/1000)}, "step": {fmt.Sprint(step.Seconds())}}
}

func rangeQueryForm(t testing.TB, srv *httptest.Server, form url.Values, headers ...string) promAnswer {
	t.Helper()
	q := form.Get("query")
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/api/v1/query_range", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var a promAnswer
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		t.Fatalf("%s: not Prometheus' envelope: %v", q, err)
	}
	a.code = resp.StatusCode
	return a
}

// same reports how a (through the frontend) differs from b (the API as
// it is): the data must be byte for byte the same, the annotations the
// same set.
func same(a, b promAnswer) string {
	if a.code != b.code || a.Status != b.Status || a.ErrorType != b.ErrorType {
		return fmt.Sprintf("frontend %d %s %s %s, API %d %s %s %s", a.code, a.Status, a.ErrorType, a.Error, b.code, b.Status, b.ErrorType, b.Error)
	}
	if string(a.Data) != string(b.Data) {
		return fmt.Sprintf("data differs:\nfrontend %.600s\nAPI      %.600s", a.Data, b.Data)
	}
	sorted := func(s []string) []string { s = slices.Clone(s); slices.Sort(s); return s }
	// The bucket store's infos on downsampled reads say what each select
	// read: a piece after a split reads its own time ranges, and a cached
	// piece keeps the infos of the steps it was computed with (annotations
	// are a query's, not a step's). They may be there in the frontend's
	// answer and not in the API's, never the other way.
	downsampled := func(s []string) ([]string, [2]bool) {
		var has [2]bool
		s = slices.DeleteFunc(slices.Clone(s), func(x string) bool {
			for i, info := range []string{downsampledInfo, approximateInfo} {
				if strings.Contains(x, info) {
					has[i] = true
					return true
				}
			}
			return false
		})
		return s, has
	}
	aInfos, aDown := downsampled(a.Infos)
	bInfos, bDown := downsampled(b.Infos)
	if !slices.Equal(sorted(a.Warnings), sorted(b.Warnings)) || !slices.Equal(sorted(aInfos), sorted(bInfos)) ||
		bDown[0] && !aDown[0] || bDown[1] && !aDown[1] {
		return fmt.Sprintf("annotations differ: frontend %q %q, API %q %q", a.Warnings, a.Infos, b.Warnings, b.Infos)
	}
	return ""
}

func (s *stack) check(t testing.TB, q string, start, end time.Time, step time.Duration) promAnswer {
	t.Helper()
	got := rangeQuery(t, s.front, q, start, end, step)
	want := rangeQuery(t, s.direct, q, start, end, step)
	if d := same(got, want); d != "" {
		t.Errorf("%s [%s, %s] step %s: %s", q, start.UTC().Format(time.RFC3339), end.UTC().Format(time.RFC3339), step, d)
	}
	return got
}

var testQueries = []string{
	`gpu_util`,
	`sum(gpu_util)`,
	`avg by (gpu) (gpu_util)`,
	`rate(energy_total[5m])`,
	`sum by (Hostname) (increase(energy_total[1h]))`,
	`max_over_time(gpu_util[1h])`,
	`gpu_util offset 2h`,
	`max_over_time(rate(energy_total[5m])[30m:1m])`,
	`count(gpu_util > 50)`,
	`topk(2, gpu_util)`,
	`rate(gpu_util[5m])`,                // info: not a counter
	`histogram_quantile(0.9, gpu_util)`, // warning: no le label
	`scalar(sum(gpu_util))`,
	`time()`,
	`timestamp(gpu_util)`,
	`absent(gpu_util{gpu="0"})`,
	`resets(energy_total[6h])`,
}

var testSteps = []time.Duration{15 * time.Second, 30 * time.Second, time.Minute, 7 * time.Minute, 37 * time.Second, time.Hour, 77 * time.Minute, 5 * time.Hour}

// Through the frontend, cached or not, every answer is the API's own, byte
// for byte: random queries, ranges (across midnights or not), steps
// (dividing a day or not), aligned to the step or not; each asked twice
// (the second mostly from the cache) and again shifted by 30 s, as a
// dashboard refresh does.
func TestCachedAnswersEqualUncached(t *testing.T) {
	s := newStack(t, 3, nil)
	rng := rand.New(rand.NewPCG(12, 34))
	const cases = 48
	for i := 0; i < cases; i++ {
		q := testQueries[rng.IntN(len(testQueries))]
		step := testSteps[rng.IntN(len(testSteps))]
		span := time.Duration(rng.Int64N(int64(3*24*time.Hour))) + time.Minute
		if span/step > 11000 {
			span = step * 11000
		}
		end := s.now.Add(-time.Duration(rng.Int64N(int64(12 * time.Hour))))
		if rng.IntN(3) == 0 {
			end = s.now.Add(time.Minute) // into the fresh minutes
		}
		start := end.Add(-span)
		if rng.IntN(2) == 0 { // Grafana aligns to the step
			start, end = start.Truncate(step), end.Truncate(step)
		}
		s.check(t, q, start, end, step)
		s.check(t, q, start, end, step)
		s.check(t, q, start.Add(30*time.Second), end.Add(30*time.Second), step)
	}
	hits := testutil.ToFloat64(s.fe.hits.WithLabelValues("full")) + testutil.ToFloat64(s.fe.hits.WithLabelValues("partial"))
	if hits == 0 {
		t.Error("no piece was answered from the cache")
	}
	t.Logf("pieces %v, hits full %v partial %v, misses %v", testutil.ToFloat64(s.fe.pieces),
		testutil.ToFloat64(s.fe.hits.WithLabelValues("full")), testutil.ToFloat64(s.fe.hits.WithLabelValues("partial")), testutil.ToFloat64(s.fe.misses))
}

// Every step of a request is in exactly one piece, at the same instant,
// and no piece spans a UTC midnight: random starts (before the epoch too),
// ends and steps, most of which do not divide a day.
func TestSplitEachStepOnce(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for i := 0; i < 2000; i++ {
		step := rng.Int64N(3*dayMs/2) + 1
		if i%2 == 0 {
			step = rng.Int64N(3_600_000) + 1
		}
		start := rng.Int64N(40*dayMs) - 20*dayMs
		end := start + rng.Int64N(min(11000*step, 30*dayMs))
		var want []int64
		for ts := start; ts <= end; ts += step {
			want = append(want, ts)
		}
		var got []int64
		for _, p := range split(start, end, step) {
			if floorDiv(p.start, dayMs) != p.day || floorDiv(p.end, dayMs) != p.day || p.end < p.start {
				t.Fatalf("start %d end %d step %d: piece %+v not within its day", start, end, step, p)
			}
			for ts := p.start; ts <= p.end; ts += step {
				got = append(got, ts)
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("start %d end %d step %d: pieces evaluate %d steps, the request %d (first difference at %d)", start, end, step, len(got), len(want), firstDiff(got, want))
		}
	}
}

func firstDiff(a, b []int64) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// Across a midnight with a step that does not divide a day (7 min) and a
// start off the day's grid: every step once, as the unsplit query has it.
func TestMidnightSplit(t *testing.T) {
	s := newStack(t, 2, nil)
	midnight := s.now.Add(-6 * time.Hour).UTC().Truncate(24 * time.Hour)
	if midnight.Before(s.dataStart) {
		midnight = midnight.Add(24 * time.Hour)
	}
	start, end := midnight.Add(-3*time.Hour+13*time.Second), midnight.Add(5*time.Hour)
	for _, q := range []string{`timestamp(gpu_util)`, `sum(rate(energy_total[5m]))`} {
		a := s.check(t, q, start, end, 7*time.Minute)
		var d struct {
			Result []struct {
				Values [][2]any `json:"values"`
			} `json:"result"`
		}
		if err := json.Unmarshal(a.Data, &d); err != nil || len(d.Result) == 0 {
			t.Fatalf("%s: %v %s", q, err, a.Data)
		}
		last := d.Result[len(d.Result)-1].Values
		if want := int(end.Sub(start)/(7*time.Minute)) + 1; len(last) != want {
			t.Errorf("%s: %d points, want %d", q, len(last), want)
		}
	}
	if testutil.ToFloat64(s.fe.requests.WithLabelValues("split")) == 0 {
		t.Error("the request was not split")
	}
}

// Without a cache to fill (no-store), a request is split only into enough
// day pieces to gain from running them in parallel: a day-crossing 24 h
// panel is answered whole, a 3-day one split; both answer as the API does.
func TestUncachedSplitOnlyIntoManyPieces(t *testing.T) {
	s := newStack(t, 3, nil)
	const q = `avg by (gpu) (rate(energy_total[5m]))`
	end := s.now.UTC().Truncate(24 * time.Hour).Add(7 * time.Hour) // a 24 h range crosses one midnight
	if end.After(s.now) {
		end = end.Add(-24 * time.Hour)
	}
	for _, c := range []struct {
		span  time.Duration
		split bool
	}{{24 * time.Hour, false}, {60 * time.Hour, true}} {
		before := testutil.ToFloat64(s.fe.requests.WithLabelValues("split"))
		start := end.Add(-c.span)
		got := rangeQuery(t, s.front, q, start, end, 5*time.Minute, "Cache-Control", "no-store")
		if diff := same(got, rangeQuery(t, s.direct, q, start, end, 5*time.Minute)); diff != "" {
			t.Fatalf("%s: %s", c.span, diff)
		}
		if split := testutil.ToFloat64(s.fe.requests.WithLabelValues("split")) > before; split != c.split {
			t.Errorf("%s without the cache: split %v, want %v", c.span, split, c.split)
		}
	}
}

// Out-of-order samples written after an answer was cached show in the next
// answer: inside max freshness, and older than it but inside the tenant's
// out-of-order window (the frontend caches only steps older than both).
func TestOutOfOrderWritesAfterCaching(t *testing.T) {
	s := newStackOOO(t, 2, 30*time.Minute, nil)
	db, err := s.dbs.Get("default")
	if err != nil {
		t.Fatal(err)
	}
	start, end := s.now.Add(-26*time.Hour).Truncate(time.Minute), s.now.Truncate(time.Minute)
	for _, q := range []string{`count_over_time(gpu_util{gpu="1"}[1m])`, `sum(gpu_util)`} {
		s.check(t, q, start, end, time.Minute)
	}
	// Samples midway between existing ones (every testInterval back from
	// s.now, whatever its phase): out of order, never on an existing
	// sample's timestamp (a duplicate would not count; the old
	// wall-clock-aligned timestamps hit one when s.now's seconds were 15
	// or 45).
	app := db.Appender(context.Background())
	for _, age := range []time.Duration{7 * time.Minute, 25 * time.Minute} {
		ts := s.now.Add(-age + testInterval/2)
		if _, err := app.Append(0, labels.FromStrings("__name__", "gpu_util", "gpu", "1", "Hostname", "node-1"), ts.UnixMilli(), 1e6); err != nil {
			t.Fatalf("out-of-order append %s ago: %v", age, err)
		}
	}
	if err := app.Commit(); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{`count_over_time(gpu_util{gpu="1"}[1m])`, `sum(gpu_util)`} {
		a := s.check(t, q, start, end, time.Minute)
		// Two samples a minute, and one more in each of two minutes.
		if n := strings.Count(string(a.Data), `,"3"]`); strings.HasPrefix(q, "count") && n != 2 {
			t.Errorf("%s: %d minutes with an out-of-order sample, want 2", q, n)
		}
	}
}

// Warnings and infos of the pieces reach the answer, also from the cache.
func TestAnnotationsJoined(t *testing.T) {
	s := newStack(t, 2, nil)
	start, end := s.now.Add(-40*time.Hour), s.now
	for i := 0; i < 2; i++ {
		a := s.check(t, `histogram_quantile(0.9, gpu_util)`, start, end, 5*time.Minute)
		if len(a.Warnings) == 0 {
			t.Errorf("round %d: no warning", i)
		}
		a = s.check(t, `rate(gpu_util[5m])`, start, end, 5*time.Minute)
		if len(a.Infos) == 0 {
			t.Errorf("round %d: no info", i)
		}
	}
}

// The cache stays within max_size_bytes, evicting the least recently used
// pieces, and answers stay right.
func TestCacheSizeBound(t *testing.T) {
	const bound = 200 << 10
	s := newStack(t, 3, func(c *Config, _ *Deps) { c.ResultsCache.MaxSizeBytes = bound })
	for i, q := range testQueries {
		step := testSteps[i%3] * 2
		s.check(t, q, s.now.Add(-60*time.Hour).Truncate(step), s.now.Truncate(step), step)
		if b, _ := s.fe.cache.usage(); b > bound {
			t.Fatalf("cache holds %d bytes, bound %d", b, bound)
		}
	}
	if testutil.ToFloat64(s.fe.evictions) == 0 {
		t.Error("nothing was evicted")
	}
	if b, n := s.fe.cache.usage(); b == 0 || n == 0 {
		t.Errorf("cache empty: %d bytes, %d entries", b, n)
	}
}

// Requests the frontend must not take apart reach the API unchanged: @
// modifiers and negative offsets, stats, limit; errors are the API's.
func TestPassThrough(t *testing.T) {
	s := newStack(t, 2, nil)
	start, end := s.now.Add(-30*time.Hour), s.now
	for _, q := range []string{`gpu_util @ end()`, `sum(gpu_util @ start())`, `gpu_util offset -1h`, `max_over_time(gpu_util[1h:] @ end())`} {
		s.check(t, q, start, end, 10*time.Minute)
	}
	if n := testutil.ToFloat64(s.fe.requests.WithLabelValues("pass_" + string(passModifier))); n != 4 {
		t.Errorf("%v requests passed for @/offset, want 4", n)
	}
	s.check(t, `sum(`, start, end, 10*time.Minute)                         // 400 from the API
	s.check(t, `gpu_util`, end, start, 10*time.Minute)                     // end before start
	s.check(t, `gpu_util`, start.Add(-300*24*time.Hour), end, time.Second) // too many points
}

// Blocks cut from the head (or compacted, downsampled, deleted) change the
// layout under a cached day: the entry is dropped and computed again.
func TestBlocksChangeInvalidates(t *testing.T) {
	s := newStack(t, 2, nil)
	start, end := s.now.Add(-40*time.Hour).Truncate(time.Hour), s.now.Truncate(time.Hour)
	s.check(t, `sum(gpu_util)`, start, end, 10*time.Minute)
	db, err := s.dbs.Get("default")
	if err != nil {
		t.Fatal(err)
	}
	before := len(db.Blocks())
	// The TSDB may have cut its own blocks already: four more hours in the
	// head (after the queried range) make the next compaction cut one that
	// overlaps the newest cached day in any case.
	app := db.Appender(context.Background())
	for ts := s.now.Add(testInterval); ts.Before(s.now.Add(4 * time.Hour)); ts = ts.Add(testInterval) {
		if _, err := app.Append(0, labels.FromStrings("__name__", "other"), ts.UnixMilli(), 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := app.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := db.Compact(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(db.Blocks()) <= before {
		t.Fatalf("compaction cut no block (%d before, %d after)", before, len(db.Blocks()))
	}
	s.check(t, `sum(gpu_util)`, start, end, 10*time.Minute)
	if testutil.ToFloat64(s.fe.invalidations.WithLabelValues("blocks")) == 0 {
		t.Error("no cached day was invalidated by the new blocks")
	}
}

// Many dashboards at once, with fewer slots than pieces: answers stay
// right (run under -race by make test-race).
func TestConcurrentRequests(t *testing.T) {
	s := newStack(t, 3, func(_ *Config, d *Deps) { d.MaxConcurrency = 2 })
	var wg sync.WaitGroup
	for w := 0; w < 6; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := 0; i < 6; i++ {
				q := testQueries[rng.IntN(len(testQueries))]
				step := testSteps[rng.IntN(4)] * 4
				end := s.now.Add(-time.Duration(rng.IntN(20)) * 30 * time.Second).Truncate(step)
				s.check(t, q, end.Add(-50*time.Hour).Truncate(step), end, step)
			}
		}()
	}
	wg.Wait()
}

// Parameters that change the answer are part of the key: the same query
// with dedup off, another lookback or max_source_resolution is never
// answered from the other's cached pieces.
func TestKeySeparatesParameters(t *testing.T) {
	s := newStack(t, 2, nil)
	start, end := s.now.Add(-40*time.Hour).Truncate(10*time.Minute), s.now.Truncate(10*time.Minute)
	variants := []url.Values{{}, {"dedup": {"false"}}, {"lookback_delta": {"1s"}}, {"max_source_resolution": {"raw"}}, {"dedup": {"true"}}}
	answers := map[string]bool{}
	for round := 0; round < 2; round++ {
		for _, q := range []string{`ha_util`, `count(ha_util)`} {
			for _, v := range variants {
				form := rangeForm(q, start, end, 10*time.Minute)
				for k, vs := range v {
					form[k] = vs
				}
				got, want := rangeQueryForm(t, s.front, form), rangeQueryForm(t, s.direct, form)
				if d := same(got, want); d != "" {
					t.Errorf("round %d %s %v: %s", round, q, v, d)
				}
				answers[string(got.Data)] = true
			}
		}
	}
	if len(answers) < 4 { // dedup on/off and the 1 s lookback change both queries' answers
		t.Errorf("only %d different answers: the variants do not test the key", len(answers))
	}
	if testutil.ToFloat64(s.fe.hits.WithLabelValues("full")) == 0 {
		t.Error("the second round was not served from the cache")
	}
}

// newBucketStack writes 6 hours of two GPU series around midnight (day ±
// 3 h) into a TSDB with 30-minute blocks, ships the blocks to a
// filesystem bucket and serves them through the real bucket store only
// (the query role's local TSDB is empty). compactAll runs the real
// compactor (30m and 2h levels, downsampling) and syncs the store.
func newBucketStack(t *testing.T, midnight time.Time) (s *stack, compactAll func()) {
	ctx := context.Background()
	logger := slog.New(slog.DiscardHandler)
	t0 := midnight.Add(-3 * time.Hour)
	cfg := tenantdb.DefaultConfig()
	cfg.BlockDuration = model.Duration(30 * time.Minute)
	cfg.Retention = model.Duration(365 * 24 * time.Hour)
	cfg.Dir = t.TempDir()
	writer, err := tenantdb.NewManager(cfg, logger, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close()
	db, err := writer.Get("default")
	if err != nil {
		t.Fatal(err)
	}
	app := db.Appender(ctx)
	for ts := t0; ts.Before(t0.Add(6 * time.Hour)); ts = ts.Add(testInterval) {
		for _, gpu := range []string{"0", "1"} {
			v := float64(ts.Unix()/30%97) + float64(len(gpu))
			if _, err := app.Append(0, labels.FromStrings("__name__", "gpu_util", "gpu", gpu), ts.UnixMilli(), v); err != nil {
				t.Fatal(err)
			}
			if _, err := app.Append(0, labels.FromStrings("__name__", "energy_total", "gpu", gpu), ts.UnixMilli(), float64(ts.Unix()-t0.Unix())*(2+float64(len(gpu)))); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := app.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := db.Compact(ctx); err != nil {
		t.Fatal(err)
	}
	bkt, err := filesystem.NewBucket(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range db.Blocks() {
		meta := block.Meta{BlockMeta: b.Meta(), GPUStore: block.GPUStoreMeta{Version: block.MetaVersion, Tenant: "default", Labels: map[string]string{}, Source: block.SourceReceive}}
		if err := block.Upload(ctx, bkt, b.Dir(), meta); err != nil {
			t.Fatal(err)
		}
	}
	store, err := bucketstore.New(bucketstore.DefaultConfig(), bkt, logger, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Sync(ctx); err != nil {
		t.Fatal(err)
	}

	qdir := tenantdb.DefaultConfig()
	qdir.Dir = t.TempDir()
	dbs, err := tenantdb.NewManager(qdir, logger, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dbs.Close() })
	qcfg := query.DefaultConfig()
	fe, err := New(DefaultConfig(), Deps{Logger: logger, Registry: prometheus.NewRegistry(), MaxConcurrency: qcfg.MaxConcurrency,
		LookbackDelta: time.Duration(qcfg.LookbackDelta), ReplicaLabels: qcfg.ReplicaLabels, MaxSourceResolution: qcfg.MaxSourceResolution,
		Blocks: TenantBlocks(dbs, store.Blocks)})
	if err != nil {
		t.Fatal(err)
	}
	serve := func(frontend func(http.Handler) http.Handler) *httptest.Server {
		api, err := query.New(query.Options{Config: qcfg, Tenants: tenancy.DefaultConfig(), DBs: dbs, Logger: logger, Registry: prometheus.NewRegistry(),
			Ready: func() error { return nil }, ActiveQueryDir: t.TempDir(), Frontend: frontend, Sources: []query.Source{store}})
		if err != nil {
			t.Fatal(err)
		}
		mux := http.NewServeMux()
		api.RegisterRoutes(mux)
		srv := httptest.NewServer(mux)
		t.Cleanup(srv.Close)
		return srv
	}
	s = &stack{fe: fe, front: serve(fe.Wrap), direct: serve(nil), dbs: dbs, now: t0.Add(6 * time.Hour), dataStart: t0}
	compactAll = func() {
		ccfg := compact.DefaultConfig()
		ccfg.BlockRanges = compact.DurationList{model.Duration(30 * time.Minute), model.Duration(2 * time.Hour)}
		ccfg.LeaseSettle, ccfg.DeleteDelay = 0, 0
		c, err := compact.New(ccfg, bkt, t.TempDir(), nil, logger, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if err := c.CompactTenant(ctx, "default"); err != nil {
				t.Fatal(err)
			}
		}
		if err := store.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		res := map[int64]int{}
		for _, m := range store.Blocks("default") {
			res[m.GPUStore.Downsample.Resolution]++
		}
		if res[downsample.Res5m] == 0 || res[downsample.Res1h] == 0 {
			t.Fatalf("the compactor made no 5m or no 1h block: blocks by resolution %v", res)
		}
	}
	return s, compactAll
}

// A day cached while the bucket held raw blocks only is computed again
// once downsampled blocks appear: under max_source_resolution=auto a
// 30-minute step then reads 5m data (a plain selector becomes the window's
// average), and the cached raw answer would be stale.
func TestDownsampledBlocksInvalidate(t *testing.T) {
	midnight := time.Now().UTC().Truncate(24 * time.Hour).Add(-48 * time.Hour)
	s, compactAll := newBucketStack(t, midnight)
	start, end, step := midnight.Add(-24*time.Hour), midnight.Add(24*time.Hour), 30*time.Minute
	raw := s.check(t, `gpu_util`, start, end, step)
	s.check(t, `gpu_util`, start, end, step) // from the cache
	compactAll()
	down := s.check(t, `gpu_util`, start, end, step)
	if string(down.Data) == string(raw.Data) {
		t.Fatal("the answer did not change with 5m data: the test proves nothing")
	}
	if testutil.ToFloat64(s.fe.invalidations.WithLabelValues("blocks")) == 0 {
		t.Error("no cached day was invalidated")
	}
}

// Over compacted and downsampled bucket blocks (auto resolution: raw, 5m
// or 1h by step) the frontend's answers are the API's, across midnight:
// random queries, steps and ranges, each asked twice and shifted by 30 s.
func TestBucketAnswersEqualUncached(t *testing.T) {
	midnight := time.Now().UTC().Truncate(24 * time.Hour).Add(-48 * time.Hour)
	s, compactAll := newBucketStack(t, midnight)
	compactAll()
	queries := []string{`gpu_util`, `sum(gpu_util)`, `avg_over_time(gpu_util[30m])`, `max_over_time(gpu_util[1h])`,
		`count_over_time(gpu_util[1h])`, `rate(energy_total[30m])`, `sum(increase(energy_total[1h]))`, `min_over_time(gpu_util[2h:5m])`}
	steps := []time.Duration{time.Minute, 7 * time.Minute, 25 * time.Minute, 30 * time.Minute, 37 * time.Minute, time.Hour, 5 * time.Hour}
	rng := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 120; i++ {
		q := queries[rng.IntN(len(queries))]
		step := steps[rng.IntN(len(steps))]
		start := s.dataStart.Add(-time.Hour + time.Duration(rng.Int64N(int64(5*time.Hour))))
		end := start.Add(time.Duration(rng.Int64N(int64(6*time.Hour))) + step)
		if rng.IntN(2) == 0 {
			start, end = start.Truncate(step), end.Truncate(step)
		}
		s.check(t, q, start, end, step)
		s.check(t, q, start, end, step)
		s.check(t, q, start.Add(30*time.Second), end.Add(30*time.Second), step)
	}
}

// An answer read approximately from downsampled data (count_over_time of
// a counter sees only its kept samples) says so through the frontend, from
// the pieces it computes and again from the cache.
func TestApproximateInfoFromCache(t *testing.T) {
	midnight := time.Now().UTC().Truncate(24 * time.Hour).Add(-48 * time.Hour)
	s, compactAll := newBucketStack(t, midnight)
	compactAll()
	start, end, step := midnight.Add(-2*time.Hour), midnight.Add(2*time.Hour), time.Hour
	for round := range 2 {
		a := s.check(t, `count_over_time(energy_total[1h])`, start, end, step)
		if !slices.ContainsFunc(a.Infos, func(x string) bool { return strings.Contains(x, approximateInfo) }) {
			t.Errorf("round %d: no approximate info: %q", round, a.Infos)
		}
	}
	if testutil.ToFloat64(s.fe.hits.WithLabelValues("full")) == 0 {
		t.Error("the second round was not served from the cache")
	}
}

// The layout fingerprint changes with the blocks overlapping a day (a new,
// a deleted block, one leaving the local disk for the bucket only) and not
// with blocks outside it or with their order.
func TestLayout(t *testing.T) {
	id := func(n byte) (u ulid.ULID) { u[15] = n; return u }
	a := Block{ID: id(1), MinTime: 0, MaxTime: 100, Local: true}
	b := Block{ID: id(2), MinTime: 100, MaxTime: 200, Local: true}
	far := Block{ID: id(3), MinTime: 1000, MaxTime: 2000}
	base := layout([]Block{a, b}, 50, 150)
	for name, blocks := range map[string][]Block{
		"b deleted":        {a},
		"a bucket only":    {{ID: a.ID, MinTime: 0, MaxTime: 100}, b},
		"a compacted away": {{ID: id(4), MinTime: 0, MaxTime: 200}},
		"a new block":      {a, b, {ID: id(5), MinTime: 149, MaxTime: 150}},
	} {
		if layout(blocks, 50, 150) == base {
			t.Errorf("%s: same layout", name)
		}
	}
	if layout([]Block{b, far, a}, 50, 150) != base {
		t.Error("a block outside the range, or the order, changed the layout")
	}
	if layout([]Block{a, {ID: id(6), MinTime: 150, MaxTime: 160}}, 50, 149) != layout([]Block{a}, 50, 149) {
		t.Error("a block starting after the range changed the layout")
	}
}

// query.timeout bounds a split request as a whole: past it the answer is
// the API's timeout (503, errorType timeout), never a partial join.
func TestTimeoutBoundsWholeRequest(t *testing.T) {
	s := newStack(t, 3, func(_ *Config, d *Deps) { d.Timeout = time.Nanosecond })
	a := rangeQuery(t, s.front, `sum(rate(energy_total[5m]))`, s.now.Add(-70*time.Hour), s.now, time.Minute)
	if a.code != http.StatusServiceUnavailable || a.Status != "error" || a.ErrorType != "timeout" {
		t.Errorf("%d %s %s %s, want 503 timeout", a.code, a.Status, a.ErrorType, a.Error)
	}
}
