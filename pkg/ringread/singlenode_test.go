package ringread

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/grafana/dskit/kv"
	"github.com/grafana/dskit/ring"
	"github.com/grafana/dskit/user"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/value"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/thanos-io/objstore"
	"github.com/thanos-io/objstore/providers/filesystem"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/downsample"
	"github.com/gpustore/gpustore/pkg/query"
	"github.com/gpustore/gpustore/pkg/readopts"
	"github.com/gpustore/gpustore/pkg/storage/bucketstore"
	"github.com/gpustore/gpustore/pkg/tenancy"
	"github.com/gpustore/gpustore/pkg/tenantdb"
)

// TestRingAnswersLikeSingleNode (issue 33): a query process reading a read
// quorum of the ring and the bucket answers every PromQL query exactly as
// one node holding every acknowledged sample does, through the hand-overs
// a ring goes through. The same simulated DCGM exporter data (real label
// shapes, a MIG instance that goes away with a staleness marker, an energy
// counter that resets) is written to one node and, as a distributor
// acknowledges writes, to a write quorum of each series' replicas:
//
//   - three receivers, RF 3; a random one misses a step's write now and
//     then (the write is acknowledged by the other two);
//   - the receivers cut blocks and ship them to a folder bucket (three
//     copies of every block, which they still hold);
//   - r2 is down: writes go to r0 and r1 alone; it restarts (replaying its
//     WAL) without what it missed;
//   - r3 joins with tokens of its own: series move to replica sets of
//     which it is part, with no history there;
//   - more blocks cut and shipped.
//
// and later the receivers' retention deletes their oldest blocks, whose
// samples the bucket then holds alone.
//
// Random range and instant queries (dashboard shapes, raw range selectors,
// timestamp(), random steps, offsets and ranges) then answer identically,
// with every receiver up and with one down (not yet noticed by the ring).
// Each read asks three of the four receivers at random, so over the
// queries every choice of quorum is read. Once every receiver has been
// read, the bucket reads none of the blocks the receivers hold.
func TestRingAnswersLikeSingleNode(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 33))
	ctx := context.Background()
	const tenant = "team-a"

	single := newBlockManager(t, t.TempDir())
	rs := make([]*receiver, 4)
	for i := range 3 {
		rs[i] = newShippingReceiver(t, fmt.Sprintf("r%d", i))
	}
	rg, store := newSpreadRing(t, rs[:3]...)

	bkt, err := filesystem.NewBucket(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	w := &quorumWriter{t: t, rng: rng, single: single, tenant: tenant, series: dcgmSeries()}
	const steps = 180
	w.t0 = time.Now().Add(-time.Duration(steps+20) * 15 * time.Second).Truncate(time.Minute).UnixMilli()

	w.write(0, 60, func(uint32) []*receiver { return rs[:3] })
	shipAll(t, bkt, tenant, rs[:3]...)
	w.write(60, 100, func(uint32) []*receiver { return rs[:2] }) // r2 down
	rs[2].restart(t)
	rs[3] = newShippingReceiver(t, "r3")
	joinRing(t, store, rg, rs[3], 4)
	w.write(100, steps, func(token uint32) []*receiver {
		set, err := rg.Get(token, ring.WriteNoExtend, nil, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		var out []*receiver
		for _, inst := range set.Instances {
			out = append(out, rs[inst.Id[1]-'0'])
		}
		return out
	})
	shipAll(t, bkt, tenant, rs...)

	bs, err := bucketstore.New(bucketstore.DefaultConfig(), bkt, quiet, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := bs.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	spy := &excludedBlocks{Store: bs}
	src, _ := newSource(t, rg, "")
	front := query.TenantQueryable{DBs: newManager(t), Receivers: src, ReceiversLookback: 24 * time.Hour, Sources: []query.Source{spy}}
	ref := query.TenantQueryable{DBs: single}
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 5e7, Timeout: time.Minute, LookbackDelta: 5 * time.Minute})
	qctx := user.InjectOrgID(ctx, tenant)
	end := w.t0 + steps*15_000

	compare := func(n int, when string) {
		t.Helper()
		for range n {
			q := newRandomQuery(rng, w.t0, end)
			want := q.run(t, qctx, engine, ref)
			got := q.run(t, qctx, engine, front)
			if got != want {
				t.Fatalf("%s: %s differs from the single node's\nring:\n%s\nsingle node:\n%s", when, q, got, want)
			}
		}
	}
	compare(60, "every receiver up")

	// Through the query API, whose engine runs range queries of many steps
	// as slices in parallel: the slices read the receivers once, and the
	// JSON answers are the single node's byte for byte.
	frontAPI := newAPI(t, query.Options{DBs: newManager(t), Receivers: src, ReceiversLookback: 24 * time.Hour, Sources: []query.Source{spy}})
	refAPI := newAPI(t, query.Options{DBs: single})
	for i := range 20 {
		r := model.Duration(time.Duration(1+rng.IntN(20)) * time.Minute).String()
		q := randomQuery{expr: strings.ReplaceAll(queryShapes[rng.IntN(len(queryShapes))], "$r", r), stepMilli: 15_000}
		q.start, q.end = w.t0+rng.Int64N(10*60_000), end-rng.Int64N(10*60_000) // at least 120 steps: sliced
		got, want := frontAPI.rangeQuery(t, q), refAPI.rangeQuery(t, q)
		if got != want {
			t.Fatalf("query API: %s differs from the single node's\nring:\n%s\nsingle node:\n%s", q, got, want)
		}
		if i == 0 {
			q.expr = `avg(DCGM_FI_DEV_GPU_UTIL)`
			asked := testutil.ToFloat64(src.requests.WithLabelValues("ok"))
			frontAPI.rangeQuery(t, q)
			if n := testutil.ToFloat64(src.requests.WithLabelValues("ok")) - asked; n != 3 {
				t.Errorf("a sliced query with one selector asked %v receivers, want one read quorum (3)", n)
			}
		}
	}
	if n := frontAPI.sliced(t); n == 0 {
		t.Error("no range query ran sliced")
	}

	// Every receiver has been read by now (each read leaves one of four
	// out at random): the bucket reads none of the blocks they hold.
	q, err := front.Querier(w.t0, end)
	if err != nil {
		t.Fatal(err)
	}
	ss := q.Select(qctx, false, nil, labels.MustNewMatcher(labels.MatchRegexp, model.MetricNameLabel, "DCGM_.+"))
	for ss.Next() {
	}
	if err := ss.Err(); err != nil {
		t.Fatal(err)
	}
	_ = q.Close()
	if held := len(bs.Blocks(tenant)); held == 0 || spy.last != held {
		t.Errorf("the bucket left out %d of its %d blocks, all held by receivers", spy.last, held)
	}

	// Remote read through the query process: the same raw samples, cut to
	// a range that cuts chunks.
	mint, maxt := w.t0+7*60_000+1234, end-3*60_000-17
	if got, want := rawChunks(t, qctx, front, mint, maxt), rawChunks(t, qctx, ref, mint, maxt); got != want {
		t.Errorf("chunk querier: ring\n%s\nsingle node:\n%s", got, want)
	}

	// Retention deletes the receivers' oldest blocks (the first 20 minutes):
	// their samples are now in the bucket only, and no receiver lists them.
	local := 0
	for _, r := range rs {
		r.restartWith(t, 15*time.Minute)
		local += len(r.dbs.Existing(tenant).Blocks())
	}
	if held := len(bs.Blocks(tenant)); local >= held {
		t.Fatalf("the receivers hold %d blocks after retention, the bucket %d", local, held)
	}
	compare(30, "old blocks in the bucket only")

	// r1 is killed: until the ring notices, reads that ask it fall back to
	// the receiver they left out.
	rs[1].srv.Close()
	compare(30, "r1 down")
}

// quorumWriter writes each step's samples to the single node and, as a
// distributor acknowledges them, to a write quorum of each series'
// replicas.
type quorumWriter struct {
	t      *testing.T
	rng    *rand.Rand
	single *tenantdb.Manager
	tenant string
	series []simSeries
	t0     int64
}

// simSeries is one simulated exporter series.
type simSeries struct {
	lset  labels.Labels
	token uint32
	value func(step int) (float64, bool) // false: no sample at this step
}

func (w *quorumWriter) write(from, to int, replicas func(token uint32) []*receiver) {
	w.t.Helper()
	for step := from; step < to; step++ {
		ts := w.t0 + int64(step)*15_000
		for _, s := range w.series {
			v, ok := s.value(step)
			if !ok {
				continue
			}
			appendOne(w.t, w.single, w.tenant, s.lset, ts, v)
			set := replicas(s.token)
			skip := -1
			if quorum := len(set)/2 + 1; quorum < len(set) && w.rng.IntN(60) == 0 {
				skip = w.rng.IntN(len(set)) // acknowledged by the others
			}
			for i, r := range set {
				if i != skip {
					appendOne(w.t, r.dbs, w.tenant, s.lset, ts, v)
				}
			}
		}
	}
}

func appendOne(t *testing.T, dbs *tenantdb.Manager, tenant string, ls labels.Labels, ts int64, v float64) {
	t.Helper()
	db, err := dbs.Get(tenant)
	if err != nil {
		t.Fatal(err)
	}
	app := db.Appender(context.Background())
	if _, err := app.Append(0, ls, ts, v); err != nil {
		t.Fatal(err)
	}
	if err := app.Commit(); err != nil {
		t.Fatal(err)
	}
}

// dcgmSeries are two nodes' worth of dcgm-exporter series: utilisation,
// temperature, energy (a counter, reset once by a driver reload) and Xid
// errors of 4 GPUs per node, and a MIG instance whose series end with a
// staleness marker when it is destroyed.
func dcgmSeries() []simSeries {
	var out []simSeries
	add := func(ls labels.Labels, value func(int) (float64, bool)) {
		h := xxhash.Sum64String(ls.String())
		out = append(out, simSeries{lset: ls, token: uint32(h ^ h>>32), value: value})
	}
	for h := range 2 {
		host := fmt.Sprintf("gpu-node-%03d", h)
		for g := range 4 {
			base := []string{"gpu", strconv.Itoa(g), "UUID", fmt.Sprintf("GPU-%04x-%d", h*16+g, g), "device", "nvidia" + strconv.Itoa(g),
				"modelName", "NVIDIA H100 80GB HBM3", "Hostname", host, "pci_bus_id", fmt.Sprintf("00000000:%02X:00.0", 0x18+g)}
			ls := func(name string, extra ...string) labels.Labels {
				return labels.FromStrings(append(append([]string{model.MetricNameLabel, name}, base...), extra...)...)
			}
			k := float64(h*4 + g)
			add(ls("DCGM_FI_DEV_GPU_UTIL"), func(s int) (float64, bool) { return float64((s*7 + int(k)*13) % 101), true })
			add(ls("DCGM_FI_DEV_GPU_TEMP"), func(s int) (float64, bool) { return 40 + 25*math.Sin(float64(s)/9+k), true })
			add(ls("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"), func(s int) (float64, bool) {
				if g == 1 && s >= 130 { // driver reloaded: the counter restarts
					return float64((s-130)*3100 + 17), true
				}
				return 1e9 + k*1e6 + float64(s*(3000+g*50)), true
			})
			add(ls("DCGM_FI_DEV_XID_ERRORS"), func(s int) (float64, bool) {
				if g == 2 && s >= 90 && s < 96 {
					return 79, true
				}
				return 0, true
			})
			if g == 3 {
				add(ls("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "GPU_I_PROFILE", "1g.10gb", "GPU_I_ID", "1"), func(s int) (float64, bool) {
					switch {
					case s < 120:
						return float64(s%17) / 16, true
					case s == 120:
						return math.Float64frombits(value.StaleNaN), true
					}
					return 0, false
				})
			}
		}
	}
	return out
}

// newBlockManager is a tenant database manager cutting blocks of ten
// minutes (receivers' of two hours, scaled down) and keeping them for
// retention (a day by default).
func newBlockManager(t *testing.T, dir string, retention ...time.Duration) *tenantdb.Manager {
	t.Helper()
	cfg := tenantdb.DefaultConfig()
	cfg.Dir = dir
	cfg.BlockDuration = model.Duration(10 * time.Minute)
	cfg.Retention = model.Duration(24 * time.Hour)
	if len(retention) > 0 {
		cfg.Retention = model.Duration(retention[0])
	}
	dbs, err := tenantdb.NewManager(cfg, quiet, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	if err := dbs.OpenExisting(context.Background()); err != nil {
		t.Fatal(err)
	}
	return dbs
}

// newShippingReceiver is a receiver whose databases cut blocks (see
// newBlockManager) and whose read handler can be restarted with them.
func newShippingReceiver(t *testing.T, id string) *receiver {
	t.Helper()
	r := &receiver{id: id, reads: map[string]int{}, dir: t.TempDir()}
	r.dbs = newBlockManager(t, r.dir)
	h := ReadHandler(r.dbs, tenancy.DefaultConfig(), quiet, prometheus.NewRegistry())
	r.handler.Store(&h)
	mux := http.NewServeMux()
	mux.Handle(ReadPath, http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		(*r.handler.Load()).ServeHTTP(w, req)
	}))
	r.srv = httptest.NewServer(mux)
	t.Cleanup(func() {
		r.srv.Close()
		_ = r.dbs.Close()
	})
	return r
}

// restart closes r's databases and opens them again from disk (WAL
// replay), as a receiver restarted with its data directory.
func (r *receiver) restart(t *testing.T) { r.restartWith(t, 24*time.Hour) }

// restartWith restarts r with a local retention.
func (r *receiver) restartWith(t *testing.T, retention time.Duration) {
	t.Helper()
	if err := r.dbs.Close(); err != nil {
		t.Fatal(err)
	}
	r.dbs = newBlockManager(t, r.dir, retention)
	h := ReadHandler(r.dbs, tenancy.DefaultConfig(), quiet, prometheus.NewRegistry())
	r.handler.Store(&h)
}

// shipAll cuts the receivers' heads into blocks and uploads every block
// each holds that the bucket does not have yet, as their shippers do.
func shipAll(t *testing.T, bkt objstore.Bucket, tenant string, rs ...*receiver) {
	t.Helper()
	ctx := context.Background()
	for _, r := range rs {
		db := r.dbs.Existing(tenant)
		if err := db.Compact(ctx); err != nil {
			t.Fatal(err)
		}
		for _, b := range db.Blocks() {
			m := b.Meta()
			if ok, err := bkt.Exists(ctx, tenant+"/"+m.ULID.String()+"/meta.json"); err != nil || ok {
				continue
			}
			meta := block.Meta{BlockMeta: m, GPUStore: block.GPUStoreMeta{Version: block.MetaVersion, Tenant: tenant, Labels: map[string]string{}, Source: block.SourceReceive}}
			if err := block.Upload(ctx, bkt, b.Dir(), meta); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// newSpreadRing registers the receivers in a ring whose tokens spread over
// the hash space (so that a receiver joining takes part of the series).
func newSpreadRing(t *testing.T, rs ...*receiver) (*ring.Ring, kv.Client) {
	t.Helper()
	rg, store := startRing(t, 3)
	for _, r := range rs {
		register(t, store, r)
	}
	waitRing(t, rg, len(rs))
	return rg, store
}

// register adds r, ACTIVE, with 8 tokens of its own spread over the ring.
func register(t *testing.T, store kv.Client, r *receiver) {
	t.Helper()
	i := uint32(r.id[1] - '0')
	tokens := make([]uint32, 8)
	for k := range tokens {
		tokens[k] = uint32(k)<<29 + i<<27 + 12345
	}
	addToRing(t, store, r.id, r.addr(), tokens)
}

// joinRing registers r and waits until the ring client lists n receivers.
func joinRing(t *testing.T, store kv.Client, rg *ring.Ring, r *receiver, n int) {
	t.Helper()
	register(t, store, r)
	waitRing(t, rg, n)
}

// excludedBlocks is the bucket store as a source, recording how many of
// the tenant's blocks the last querier left out as served elsewhere.
type excludedBlocks struct {
	*bucketstore.Store
	mtx  sync.Mutex
	last int
}

func (e *excludedBlocks) Querier(tenant string, mint, maxt int64, o readopts.ReadOptions) (downsample.Querier, error) {
	n := 0
	for _, m := range e.Blocks(tenant) {
		if o.Local(m.ULID) {
			n++
		}
	}
	e.mtx.Lock()
	e.last = n
	e.mtx.Unlock()
	return e.Store.Querier(tenant, mint, maxt, o)
}

// randomQuery is a dashboard-shaped query over a random window.
type randomQuery struct {
	expr                  string
	instant               bool
	start, end, stepMilli int64
}

func (q randomQuery) String() string {
	if q.instant {
		return fmt.Sprintf("%s at %d", q.expr, q.end)
	}
	return fmt.Sprintf("%s from %d to %d step %dms", q.expr, q.start, q.end, q.stepMilli)
}

var queryShapes = []string{
	`DCGM_FI_DEV_GPU_TEMP`,
	`DCGM_FI_DEV_GPU_UTIL{Hostname="gpu-node-001"}`,
	`avg(DCGM_FI_DEV_GPU_UTIL)`,
	`max by (Hostname) (DCGM_FI_DEV_GPU_TEMP)`,
	`sum by (Hostname) (rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[$r]))`,
	`increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="1"}[$r])`,
	`resets(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[$r])`,
	`max_over_time(DCGM_FI_DEV_GPU_TEMP[$r])`,
	`count_over_time(DCGM_FI_DEV_GPU_UTIL[$r])`,
	`count(DCGM_FI_DEV_XID_ERRORS > 0)`,
	`timestamp(DCGM_FI_DEV_GPU_UTIL)`,
	`changes(DCGM_FI_DEV_XID_ERRORS[$r])`,
	`DCGM_FI_PROF_GR_ENGINE_ACTIVE{GPU_I_PROFILE="1g.10gb"}`,
	`topk(3, DCGM_FI_DEV_GPU_TEMP)`,
	`DCGM_FI_DEV_GPU_UTIL offset $r`,
}

// Raw range selectors, asked as instant queries: every sample as stored.
var rawShapes = []string{
	`DCGM_FI_DEV_GPU_UTIL[$r]`,
	`DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[$r]`,
	`{__name__=~"DCGM_.+"}[$r]`,
}

func newRandomQuery(rng *rand.Rand, from, to int64) randomQuery {
	r := model.Duration(time.Duration(1+rng.IntN(20)) * time.Minute).String()
	if rng.IntN(4) == 0 {
		return randomQuery{
			expr:    strings.ReplaceAll(rawShapes[rng.IntN(len(rawShapes))], "$r", r),
			instant: true,
			end:     from + rng.Int64N(to-from+10*60_000),
		}
	}
	q := randomQuery{expr: strings.ReplaceAll(queryShapes[rng.IntN(len(queryShapes))], "$r", r)}
	steps := []int64{15_000, 30_000, 60_000, 37_000, 5_000}
	q.stepMilli = steps[rng.IntN(len(steps))]
	q.start = from - 5*60_000 + rng.Int64N(to-from)
	q.end = min(q.start+rng.Int64N(to-q.start+5*60_000), to+5*60_000)
	if rng.IntN(3) == 0 {
		q.instant = true
	}
	return q
}

// run evaluates q over qa and prints the answer exactly (floats in their
// shortest exact form).
func (q randomQuery) run(t *testing.T, ctx context.Context, engine *promql.Engine, qa storage.Queryable) string {
	t.Helper()
	var (
		qry promql.Query
		err error
	)
	if q.instant {
		qry, err = engine.NewInstantQuery(ctx, qa, nil, q.expr, time.UnixMilli(q.end))
	} else {
		qry, err = engine.NewRangeQuery(ctx, qa, nil, q.expr, time.UnixMilli(q.start), time.UnixMilli(q.end), time.Duration(q.stepMilli)*time.Millisecond)
	}
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	defer qry.Close()
	res := qry.Exec(ctx)
	if res.Err != nil {
		t.Fatalf("%s: %v", q, res.Err)
	}
	var b strings.Builder
	point := func(ts int64, f float64) { fmt.Fprintf(&b, " %d=%s", ts, strconv.FormatFloat(f, 'g', -1, 64)) }
	switch v := res.Value.(type) {
	case promql.Matrix:
		slices.SortFunc(v, func(a, b promql.Series) int { return labels.Compare(a.Metric, b.Metric) })
		for _, s := range v {
			b.WriteString(s.Metric.String())
			for _, p := range s.Floats {
				point(p.T, p.F)
			}
			b.WriteString("\n")
		}
	case promql.Vector:
		slices.SortFunc(v, func(a, b promql.Sample) int { return labels.Compare(a.Metric, b.Metric) })
		for _, s := range v {
			b.WriteString(s.Metric.String())
			point(s.T, s.F)
			b.WriteString("\n")
		}
	case promql.Scalar:
		point(v.T, v.V)
	default:
		t.Fatalf("%s: answer of type %s", q, parser.ValueType(res.Value.Type()))
	}
	return b.String()
}

// rawChunks prints every sample of the chunk querier's series.
func rawChunks(t *testing.T, ctx context.Context, qa storage.ChunkQueryable, mint, maxt int64) string {
	t.Helper()
	cq, err := qa.ChunkQuerier(mint, maxt)
	if err != nil {
		t.Fatal(err)
	}
	defer cq.Close()
	ss := storage.NewSeriesSetFromChunkSeriesSet(cq.Select(ctx, true, nil, labels.MustNewMatcher(labels.MatchRegexp, model.MetricNameLabel, ".+")))
	var b strings.Builder
	var it chunkenc.Iterator
	for ss.Next() {
		b.WriteString(ss.At().Labels().String())
		it = ss.At().Iterator(it)
		for it.Next() == chunkenc.ValFloat {
			ts, v := it.At()
			fmt.Fprintf(&b, " %d=%x", ts, math.Float64bits(v))
		}
		b.WriteString("\n")
	}
	if err := ss.Err(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// queryAPI is the query HTTP API over a queryable's parts.
type queryAPI struct {
	srv *httptest.Server
	reg *prometheus.Registry
}

func newAPI(t *testing.T, opts query.Options) *queryAPI {
	t.Helper()
	reg := prometheus.NewRegistry()
	opts.Config, opts.Tenants, opts.Logger, opts.Registry = query.DefaultConfig(), tenancy.DefaultConfig(), quiet, reg
	opts.Ready, opts.ActiveQueryDir = func() error { return nil }, t.TempDir()
	api, err := query.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	api.RegisterRoutes(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &queryAPI{srv: srv, reg: reg}
}

// rangeQuery returns the API's answer to q as a range query, as sent.
func (a *queryAPI) rangeQuery(t *testing.T, q randomQuery) string {
	t.Helper()
	form := url.Values{"query": {q.expr}, "start": {fmt.Sprint(float64(q.start) / 1000)}, "end": {fmt.Sprint(float64(q.end) / 1000)},
		"step": {fmt.Sprint(float64(q.stepMilli) / 1000)}}
	req, err := http.NewRequest(http.MethodPost, a.srv.URL+"/api/v1/query_range", strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set(tenancy.OrgIDHeader, "team-a")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %d %v %s", q, resp.StatusCode, err, body)
	}
	return string(body)
}

// sliced is how many range queries the API ran as slices.
func (a *queryAPI) sliced(t *testing.T) float64 {
	t.Helper()
	n, err := testutil.GatherAndCount(a.reg, "gpustore_query_range_sliced_total")
	if err != nil || n != 1 {
		t.Fatalf("sliced counter: %d %v", n, err)
	}
	mfs, err := a.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "gpustore_query_range_sliced_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}
