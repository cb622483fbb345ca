package ringread

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grafana/dskit/kv"
	"github.com/grafana/dskit/kv/consul"
	"github.com/grafana/dskit/ring"
	"github.com/grafana/dskit/services"
	"github.com/grafana/dskit/user"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/config"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/metadata"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/storage/remote"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/util/annotations"

	"github.com/gpustore/gpustore/internal/abuse"
	"github.com/gpustore/gpustore/internal/logging"
	"github.com/gpustore/gpustore/pkg/downsample"
	"github.com/gpustore/gpustore/pkg/limits/querylimit"
	"github.com/gpustore/gpustore/pkg/query"
	"github.com/gpustore/gpustore/pkg/readopts"
	"github.com/gpustore/gpustore/pkg/tenancy"
	"github.com/gpustore/gpustore/pkg/tenantdb"
)

var quiet = slog.New(slog.DiscardHandler)

// receiver is one real receiver: its own tenant databases behind
// ReadHandler on a real HTTP server.
type receiver struct {
	id  string
	dbs *tenantdb.Manager
	srv *httptest.Server
	// Reads answered, by response type ("chunked": streamed chunks,
	// "sampled": the SAMPLES type).
	mtx   sync.Mutex
	reads map[string]int
	// For receivers that restart (newShippingReceiver): their data
	// directory and the read handler of their current databases.
	dir     string
	handler atomic.Pointer[http.Handler]
}

func newReceiver(t *testing.T, id string, tenants tenancy.Config) *receiver {
	t.Helper()
	return newReceiverOn(t, id, tenants, newManager(t))
}

// newReceiverOn serves the tenant databases of dbs.
func newReceiverOn(t *testing.T, id string, tenants tenancy.Config, dbs *tenantdb.Manager) *receiver {
	t.Helper()
	r := &receiver{id: id, dbs: dbs, reads: map[string]int{}}
	mux := http.NewServeMux()
	read := ReadHandler(r.dbs, tenants, quiet, prometheus.NewRegistry())
	mux.Handle(ReadPath, http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		read.ServeHTTP(w, req)
		r.mtx.Lock()
		defer r.mtx.Unlock()
		switch ct := w.Header().Get("Content-Type"); {
		case strings.HasPrefix(ct, "application/x-streamed-protobuf; proto=prometheus.ChunkedReadResponse"):
			r.reads["chunked"]++
		case ct == "application/x-protobuf":
			r.reads["sampled"]++
		}
	}))
	mux.Handle(TenantsPath, TenantsHandler(r.dbs))
	mux.Handle(MetadataPath, MetadataHandler(r.dbs, tenants))
	r.srv = httptest.NewServer(mux)
	t.Cleanup(r.srv.Close)
	return r
}

// answered returns the reads r answered, by response type, since the last
// call.
func (r *receiver) answered() map[string]int {
	r.mtx.Lock()
	defer r.mtx.Unlock()
	out := r.reads
	r.reads = map[string]int{}
	return out
}

func newManager(t testing.TB) *tenantdb.Manager {
	t.Helper()
	cfg := tenantdb.DefaultConfig()
	cfg.Dir = t.TempDir()
	dbs, err := tenantdb.NewManager(cfg, quiet, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dbs.Close() })
	return dbs
}

func (r *receiver) addr() string { return r.srv.Listener.Addr().String() }

// write stores the samples at the steps of the tenant's series.
func (r *receiver) write(t *testing.T, tenant, series string, steps []int, value func(step int) float64) {
	t.Helper()
	db, err := r.dbs.Get(tenant)
	if err != nil {
		t.Fatal(err)
	}
	ls, err := parseSeries(series)
	if err != nil {
		t.Fatal(err)
	}
	app := db.Appender(context.Background())
	for _, i := range steps {
		if _, err := app.Append(0, ls, ts(i), value(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := app.Commit(); err != nil {
		t.Fatal(err)
	}
}

func parseSeries(s string) (labels.Labels, error) {
	// Only what the tests use: name{a="x",b="y"}.
	name, rest, _ := strings.Cut(s, "{")
	b := labels.NewBuilder(labels.EmptyLabels())
	b.Set(model.MetricNameLabel, name)
	for _, kv := range strings.Split(strings.TrimSuffix(rest, "}"), ",") {
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return labels.EmptyLabels(), fmt.Errorf("bad pair %q", kv)
		}
		b.Set(k, strings.Trim(v, `"`))
	}
	return b.Labels(), nil
}

// Samples every 15s over the last few minutes: receivers hold recent data.
var t0 = time.Now().Add(-10 * time.Minute).Truncate(time.Minute).UnixMilli()

const nSteps = 15

func ts(step int) int64 { return t0 + int64(step)*15_000 }

func steps(from, to int) []int { // [from, to]
	var s []int
	for i := from; i <= to; i++ {
		s = append(s, i)
	}
	return s
}

// cluster is three receivers in a ring with replication factor 3.
type cluster struct {
	rs   []*receiver
	ring *ring.Ring
}

// newCluster writes, for tenant team-a:
//   - gpu_util{gpu="0"} = 1 on all three receivers, identical;
//   - gpu_util{gpu="1"} = 10+step split so that every sample is on two
//     receivers and no receiver has them all (r0 0-9, r1 5-14, r2 0-4 and
//     10-14), as a write quorum of 2 out of 3 leaves them;
//   - gpu_temp{gpu="3"} = 70 on r1 and r2 (r0 missed every write);
//
// and for team-b gpu_util{gpu="9"} = 5 on r1 and r2: each sample is on a
// write quorum of its replicas, as the distributors leave them.
func newCluster(t *testing.T) *cluster {
	t.Helper()
	c := &cluster{}
	for i := range 3 {
		c.rs = append(c.rs, newReceiver(t, fmt.Sprintf("r%d", i), tenancy.DefaultConfig()))
	}
	one := func(int) float64 { return 1 }
	for _, r := range c.rs {
		r.write(t, "team-a", `gpu_util{gpu="0",host="a"}`, steps(0, nSteps-1), one)
	}
	ramp := func(i int) float64 { return 10 + float64(i) }
	c.rs[0].write(t, "team-a", `gpu_util{gpu="1",host="a"}`, steps(0, 9), ramp)
	c.rs[1].write(t, "team-a", `gpu_util{gpu="1",host="a"}`, steps(5, 14), ramp)
	c.rs[2].write(t, "team-a", `gpu_util{gpu="1",host="a"}`, append(steps(0, 4), steps(10, 14)...), ramp)
	for _, r := range c.rs[1:] {
		r.write(t, "team-a", `gpu_temp{gpu="3",host="b"}`, steps(0, nSteps-1), func(int) float64 { return 70 })
	}
	for _, r := range c.rs[1:] {
		r.write(t, "team-b", `gpu_util{gpu="9"}`, steps(0, nSteps-1), func(int) float64 { return 5 })
	}
	c.ring = newRing(t, 3, c.rs...)
	return c
}

// newRing registers the receivers, ACTIVE, in a dskit ring over an
// in-memory KV store and starts a ring client on it.
func newRing(t *testing.T, rf int, rs ...*receiver) *ring.Ring {
	t.Helper()
	rg, store := startRing(t, rf)
	for i, r := range rs {
		addToRing(t, store, r.id, r.addr(), []uint32{uint32(i)*1_000_000 + 1, uint32(i)*1_000_000 + 2})
	}
	waitRing(t, rg, len(rs))
	return rg
}

// startRing starts a ring client with the replication factor over a KV
// store of its own, empty.
func startRing(tb testing.TB, rf int) (*ring.Ring, kv.Client) {
	tb.Helper()
	ctx := context.Background()
	kit := logging.GoKit(quiet)
	store, closer := consul.NewInMemoryClient(ring.GetCodec(), kit, prometheus.NewRegistry())
	tb.Cleanup(func() { _ = closer.Close() })
	cfg := ring.Config{HeartbeatTimeout: time.Hour, ReplicationFactor: rf}
	rg, err := ring.NewWithStoreClientAndStrategy(cfg, "receiver", "receiver", store, ring.NewDefaultReplicationStrategy(), prometheus.NewRegistry(), kit)
	if err != nil {
		tb.Fatal(err)
	}
	if err := services.StartAndAwaitRunning(ctx, rg); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = services.StopAndAwaitTerminated(ctx, rg) })
	return rg, store
}

// addToRing registers a receiver, ACTIVE, with the tokens.
func addToRing(tb testing.TB, store kv.Client, id, addr string, tokens []uint32) {
	tb.Helper()
	err := store.CAS(context.Background(), "receiver", func(in any) (any, bool, error) {
		d, _ := in.(*ring.Desc)
		if d == nil {
			d = ring.NewDesc()
		}
		d.AddIngester(id, addr, "", tokens, ring.ACTIVE, time.Now(), false, time.Time{}, nil)
		return d, true, nil
	})
	if err != nil {
		tb.Fatal(err)
	}
}

// waitRing waits until the ring client lists n receivers (it learns the
// KV store's changes by watching it).
func waitRing(tb testing.TB, rg *ring.Ring, n int) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for rg.InstancesCount() != n {
		if time.Now().After(deadline) {
			tb.Fatalf("the ring lists %d receivers, want %d", rg.InstancesCount(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func newSource(t *testing.T, r ring.ReadRing, self string) (*Source, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	src, err := NewSource(SourceConfig{Self: self, Timeout: 10 * time.Second}, r, quiet, reg)
	if err != nil {
		t.Fatal(err)
	}
	return src, reg
}

var all = labels.MustNewMatcher(labels.MatchRegexp, model.MetricNameLabel, "gpu_.*")

// dump selects from a querier of the source (tenant in the context as the
// query path puts it) and prints each series with its samples.
func dump(ctx context.Context, src *Source, tenant string, ms ...*labels.Matcher) (string, annotations.Annotations, error) {
	q, err := src.Querier(tenant, ts(0), ts(nSteps-1), readopts.Default())
	if err != nil {
		return "", nil, err
	}
	defer q.Close()
	return dumpSet(q.Select(user.InjectOrgID(ctx, tenant), false, nil, ms...))
}

func dumpSet(ss storage.SeriesSet) (string, annotations.Annotations, error) {
	var b strings.Builder
	var it chunkenc.Iterator
	for ss.Next() {
		s := ss.At() // once, as PromQL does: a merge set merges at every At
		b.WriteString(s.Labels().String())
		it = s.Iterator(it)
		for it.Next() == chunkenc.ValFloat {
			t, v := it.At()
			fmt.Fprintf(&b, " %d=%g", (t-t0)/15_000, v)
		}
		b.WriteString("\n")
	}
	return b.String(), ss.Warnings(), ss.Err()
}

// want prints the expected series the way dump does.
func want(series map[string]func(int) (float64, bool)) string {
	names := make([]string, 0, len(series))
	for n := range series {
		names = append(names, n)
	}
	slices.Sort(names)
	var b strings.Builder
	for _, n := range names {
		ls, _ := parseSeries(n)
		b.WriteString(ls.String())
		for i := range nSteps {
			if v, ok := series[n](i); ok {
				fmt.Fprintf(&b, " %d=%g", i, v)
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

func constant(v float64) func(int) (float64, bool) {
	return func(int) (float64, bool) { return v, true }
}

var (
	wantTeamA = want(map[string]func(int) (float64, bool){
		`gpu_util{gpu="0",host="a"}`: constant(1),
		`gpu_util{gpu="1",host="a"}`: func(i int) (float64, bool) { return 10 + float64(i), true },
		`gpu_temp{gpu="3",host="b"}`: constant(70),
	})
	wantTeamB = want(map[string]func(int) (float64, bool){`gpu_util{gpu="9"}`: constant(5)})
)

// TestSelectMergesReplicas: a select asks a read quorum of the ring (2 of
// 3 receivers with RF 3), whichever two it picks, and answers every
// sample once.
func TestSelectMergesReplicas(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t)
	src, reg := newSource(t, c.ring, "")

	const reads = 30 // DoUntilQuorum picks the receivers at random: all pairs
	for range reads {
		got, ws, err := dump(ctx, src, "team-a", all)
		if err != nil {
			t.Fatal(err)
		}
		if got != wantTeamA {
			t.Fatalf("team-a:\n%s\nwant:\n%s", got, wantTeamA)
		}
		if len(ws) != 0 {
			t.Errorf("warnings with every receiver up: %v", ws)
		}
	}
	// Each read asked two receivers and left one out.
	if n := testutil.ToFloat64(src.requests.WithLabelValues("ok")); n != 2*reads {
		t.Errorf("ok requests: %v, want %d", n, 2*reads)
	}
	if n := testutil.ToFloat64(src.skipped); n != reads {
		t.Errorf("receivers left out: %v, want %d", n, reads)
	}
	asked := 0
	for _, r := range c.rs {
		got := r.answered()
		if got["sampled"] != 0 {
			t.Errorf("%s answered a select with samples: %v", r.id, got)
		}
		if got["chunked"] > 0 {
			asked++
		}
		if got["chunked"] == reads {
			t.Errorf("%s was asked by every read: the quorum is not spread", r.id)
		}
	}
	if asked != 3 {
		t.Errorf("%d receivers asked over %d reads, want all 3", asked, reads)
	}
	// gpu="0" is the same on every receiver: one of its two answers is
	// skipped whole by its chunks; gpu="1" differs on each, so both its
	// answers are merged (where their chunks differ) every time; gpu="3"
	// is identical where both r1 and r2 were read.
	if got := testutil.ToFloat64(src.replicas.identical); got < reads {
		t.Errorf("identical replicas skipped: %v, want at least %d", got, reads)
	}
	if got, want := testutil.ToFloat64(src.replicas.merged), 2.0*reads; got != want {
		t.Errorf("replica answers merged: %v, want %v", got, want)
	}
	if got := testutil.ToFloat64(src.chunks.merged); got < 2*reads {
		t.Errorf("replica chunks merged: %v, want at least %d", got, 2*reads)
	}

	// Tenants see only their own series.
	if got, _, err := dump(ctx, src, "team-b", all); err != nil || got != wantTeamB {
		t.Errorf("team-b: %v\n%s\nwant:\n%s", err, got, wantTeamB)
	}
	if got, _, err := dump(ctx, src, "team-c", all); err != nil || got != "" {
		t.Errorf("team-c (never wrote): %v\n%s", err, got)
	}

	// A matcher narrows the selection on every receiver.
	sel := labels.MustNewMatcher(labels.MatchEqual, "gpu", "1")
	wantOne := want(map[string]func(int) (float64, bool){
		`gpu_util{gpu="1",host="a"}`: func(i int) (float64, bool) { return 10 + float64(i), true },
	})
	if got, _, err := dump(ctx, src, "team-a", all, sel); err != nil || got != wantOne {
		t.Errorf("gpu=1: %v\n%s\nwant:\n%s", err, got, wantOne)
	}

	// The chunk querier (remote read through this process) is the same.
	cq := mustChunkQuerier(t, src, "team-a", ts(0), ts(nSteps-1))
	got, _, err := dumpSet(storage.NewSeriesSetFromChunkSeriesSet(cq.Select(user.InjectOrgID(ctx, "team-a"), true, nil, all)))
	if err != nil || got != wantTeamA {
		t.Errorf("chunk querier: %v\n%s\nwant:\n%s", err, got, wantTeamA)
	}
	if n, err := testutil.GatherAndCount(reg, "gpustore_receivers_read_request_duration_seconds"); err != nil || n != 1 {
		t.Errorf("duration histogram: %d, %v", n, err)
	}
}

// TestSelectCountsChunkBytes: the chunk bytes the receivers send count
// against the query's max_fetched_chunk_bytes_per_query (querylimit).
func TestSelectCountsChunkBytes(t *testing.T) {
	c := newCluster(t)
	src, _ := newSource(t, c.ring, "")
	ctx := querylimit.With(context.Background(), querylimit.New("team-a", 0, 10))
	if _, _, err := dump(ctx, src, "team-a", all); !querylimit.IsError(err) {
		t.Fatalf("a select of more than 10 bytes of chunks: %v, want the limit's error", err)
	}
	ctx = querylimit.With(context.Background(), querylimit.New("team-a", 0, 1<<20))
	if got, _, err := dump(ctx, src, "team-a", all); err != nil || got != wantTeamA {
		t.Fatalf("within the limit: %v\n%s", err, got)
	}
}

// TestSelfIsSkipped: the process's own receiver is read from disk by the
// caller, never over HTTP, and counts as answered: with RF 3 over three
// receivers, one other receiver completes the quorum.
func TestSelfIsSkipped(t *testing.T) {
	ctx := user.InjectOrgID(context.Background(), "team-a")
	c := newCluster(t)
	src, _ := newSource(t, c.ring, "r2")
	c.rs[2].srv.Close() // would fail if asked
	// As a process running a receiver reads: its own TSDB beside the ring.
	qa := query.TenantQueryable{DBs: c.rs[2].dbs, Receivers: src, ReceiversLookback: time.Hour}
	read := func() (string, annotations.Annotations, error) {
		q, err := qa.Querier(ts(0), ts(nSteps-1))
		if err != nil {
			t.Fatal(err)
		}
		defer q.Close()
		return dumpSet(q.Select(ctx, true, nil, all))
	}
	for range 6 {
		got, ws, err := read()
		if err != nil || got != wantTeamA || len(ws) != 0 {
			t.Fatalf("Self=r2: %v %v\n%s\nwant:\n%s", err, ws, got, wantTeamA)
		}
	}
	if n := testutil.ToFloat64(src.requests.WithLabelValues("ok")); n != 6 {
		t.Errorf("requests: %v, want one per read", n)
	}

	// Self down does not use up the tolerance: one more failure is fine.
	c.rs[0].srv.Close()
	for range 4 {
		if got, ws, err := read(); err != nil || got != wantTeamA || len(ws) > 1 {
			t.Errorf("Self=r2, r0 down: %v, warnings %v\n%s", err, ws, got)
		}
	}
}

// TestToleratesFailures: a receiver that fails is replaced by one the
// quorum left out; the read fails only when too few are left.
func TestToleratesFailures(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t)
	src, reg := newSource(t, c.ring, "")
	// Before the first read both statuses are there at 0: a rate of errors
	// (the operations dashboard's panel) is 0, not nothing.
	if n := testutil.CollectAndCount(reg, "gpustore_receivers_read_requests_total"); n != 2 {
		t.Fatalf("%d series of gpustore_receivers_read_requests_total before any read, want 2 (ok, error)", n)
	}

	// One receiver down of three with RF 3: every sample is still on one
	// that answers; when the read asked it, the answer says it is missing.
	c.rs[0].srv.Close()
	for range 10 {
		got, ws, err := dump(ctx, src, "team-a", all)
		if err != nil {
			t.Fatal(err)
		}
		if got != wantTeamA {
			t.Errorf("r0 down:\n%s\nwant:\n%s", got, wantTeamA)
		}
		if len(ws) > 1 || len(ws) == 1 && !strings.Contains(fmt.Sprint(ws.AsErrors()), "receiver r0 ("+c.rs[0].addr()+") unavailable") {
			t.Errorf("r0 down: warnings %v", ws)
		}
	}
	if n := testutil.ToFloat64(src.tolerated); n < 1 || n > 10 {
		t.Errorf("tolerated failures over 10 reads: %v", n)
	}

	// Label calls tolerate it the same way.
	for range 5 {
		names, ws, err := mustQuerier(t, src, "team-a", ts(0), ts(nSteps-1)).LabelNames(user.InjectOrgID(ctx, "team-a"), nil)
		if err != nil || !slices.Equal(names, []string{"__name__", "gpu", "host"}) || len(ws) > 1 {
			t.Errorf("LabelNames with r0 down: %v %v %v", names, ws, err)
		}
	}

	// Two down: data may be missing, so the read fails, naming both.
	c.rs[1].srv.Close()
	_, _, err := dump(ctx, src, "team-a", all)
	if err == nil {
		t.Fatal("r0 and r1 down: no error")
	}
	for _, s := range []string{"2 of 3 receivers failed, at most 1 may", "receiver r0 (" + c.rs[0].addr(), "receiver r1 (" + c.rs[1].addr()} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not contain %q", err, s)
		}
	}
	if !errors.Is(err, query.ErrUnavailable) {
		t.Errorf("error %v: not a 503", err)
	}
	if _, _, err := mustQuerier(t, src, "team-a", ts(0), ts(nSteps-1)).LabelValues(user.InjectOrgID(ctx, "team-a"), "gpu", nil); err == nil {
		t.Error("LabelValues with r0 and r1 down: no error")
	}
}

func TestLabels(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t)
	src, _ := newSource(t, c.ring, "")
	q := mustQuerier(t, src, "team-a", ts(0), ts(nSteps-1))
	actx := user.InjectOrgID(ctx, "team-a")

	for _, tc := range []struct {
		name  string // "" for LabelNames
		hints *storage.LabelHints
		ms    []*labels.Matcher
		want  []string
	}{
		{"", nil, nil, []string{"__name__", "gpu", "host"}},
		{"", nil, []*labels.Matcher{labels.MustNewMatcher(labels.MatchEqual, "host", "b")}, []string{"__name__", "gpu", "host"}},
		{"gpu", nil, nil, []string{"0", "1", "3"}},
		{"gpu", nil, []*labels.Matcher{labels.MustNewMatcher(labels.MatchEqual, "__name__", "gpu_util")}, []string{"0", "1"}},
		{"gpu", &storage.LabelHints{Limit: 2}, nil, []string{"0", "1"}},
		{"__name__", nil, nil, []string{"gpu_temp", "gpu_util"}},
		{"host", nil, []*labels.Matcher{labels.MustNewMatcher(labels.MatchEqual, "gpu", "3")}, []string{"b"}},
		{"nope", nil, nil, []string{}},
	} {
		var got []string
		var err error
		if tc.name == "" {
			got, _, err = q.LabelNames(actx, tc.hints, tc.ms...)
		} else {
			got, _, err = q.LabelValues(actx, tc.name, tc.hints, tc.ms...)
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("label %q %v: %v %v, want %v", tc.name, tc.ms, got, err, tc.want)
		}
	}

	// Tenants see only their own labels.
	qb := mustQuerier(t, src, "team-b", ts(0), ts(nSteps-1))
	if got, _, err := qb.LabelValues(user.InjectOrgID(ctx, "team-b"), "gpu", nil); err != nil || !slices.Equal(got, []string{"9"}) {
		t.Errorf("team-b gpu values: %v %v", got, err)
	}
	if got, _, err := qb.LabelNames(user.InjectOrgID(ctx, "team-b"), nil); err != nil || !slices.Equal(got, []string{"__name__", "gpu"}) {
		t.Errorf("team-b names: %v %v", got, err)
	}

	// The series API's select (Func "series") returns the series, each
	// once, without samples.
	got, _, err := dumpSet(q.Select(actx, true, &storage.SelectHints{Start: ts(0), End: ts(nSteps - 1), Func: "series"}, all))
	wantSeries := "{__name__=\"gpu_temp\", gpu=\"3\", host=\"b\"}\n{__name__=\"gpu_util\", gpu=\"0\", host=\"a\"}\n{__name__=\"gpu_util\", gpu=\"1\", host=\"a\"}\n"
	if err != nil || got != wantSeries {
		t.Errorf("series select: %v\n%s\nwant:\n%s", err, got, wantSeries)
	}

	// Label calls and the series select ask for samples, which a receiver
	// answers with series alone: its TSDB reads no chunk for them. Each
	// of the 11 asks two of the three receivers.
	sampled := 0
	for _, r := range c.rs {
		got := r.answered()
		sampled += got["sampled"]
		if got["chunked"] != 0 {
			t.Errorf("%s answered label calls with chunks: %v", r.id, got)
		}
	}
	if sampled != 2*11 {
		t.Errorf("label calls answered: %d, want %d", sampled, 2*11)
	}
}

// TestPromQL runs the engine over the query package's TenantQueryable with
// the receivers as its only source, as a query process without local data.
func TestPromQL(t *testing.T) {
	c := newCluster(t)
	src, _ := newSource(t, c.ring, "")
	qa := query.TenantQueryable{DBs: newManager(t), Sources: []query.Source{src}}
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 1e6, Timeout: time.Minute, LookbackDelta: 5 * time.Minute})
	ctx := user.InjectOrgID(context.Background(), "team-a")
	at := time.UnixMilli(ts(nSteps - 1))

	run := func(expr string) (float64, annotations.Annotations) {
		t.Helper()
		qry, err := engine.NewInstantQuery(ctx, qa, nil, expr, at)
		if err != nil {
			t.Fatal(err)
		}
		defer qry.Close()
		res := qry.Exec(ctx)
		if res.Err != nil {
			t.Fatalf("%s: %v", expr, res.Err)
		}
		v, err := res.Vector()
		if err != nil || len(v) != 1 {
			t.Fatalf("%s: %v %v", expr, v, err)
		}
		return v[0].F, res.Warnings
	}
	// Replicated samples count once: 15 + 15 distinct timestamps.
	if got, ws := run(`sum(count_over_time(gpu_util[1h]))`); got != 2*nSteps || len(ws) != 0 {
		t.Errorf("count: %v, want %d; warnings %v", got, 2*nSteps, ws)
	}
	// 1 + (10+14).
	if got, _ := run(`sum(gpu_util)`); got != 25 {
		t.Errorf("sum: %v, want 25", got)
	}

	c.rs[1].srv.Close()
	for range 5 {
		got, ws := run(`sum(count_over_time(gpu_util[1h]))`)
		if got != 2*nSteps || len(ws) > 1 || len(ws) == 1 && !strings.Contains(fmt.Sprint(ws.AsErrors()), "receiver r1") {
			t.Errorf("r1 down: count %v, warnings %v", got, ws)
		}
	}
}

func TestEmptyRing(t *testing.T) {
	ctx := context.Background()

	src, _ := newSource(t, newRing(t, 3), "")
	if _, _, err := dump(ctx, src, "team-a", all); err == nil || !strings.Contains(err.Error(), "empty ring") {
		t.Errorf("empty ring: %v", err)
	}
	if m, err := src.Metadata(ctx, "team-a"); err == nil || m != nil {
		t.Errorf("metadata of an empty ring: %v, %v; want nothing and an error", m, err)
	}
	if ts, err := src.Tenants(ctx); err == nil || ts != nil {
		t.Errorf("tenants of an empty ring: %v, %v; want nothing and an error", ts, err)
	}

	// The process's own receiver alone (a single node, replication factor
	// 1): nothing to ask, nothing missing.
	r := newReceiver(t, "r0", tenancy.DefaultConfig())
	src, _ = newSource(t, newRing(t, 1, r), "r0")
	if got, ws, err := dump(ctx, src, "team-a", all); err != nil || got != "" || len(ws) != 0 {
		t.Errorf("Self alone: %q %v %v", got, ws, err)
	}
	if m, err := src.Metadata(ctx, "team-a"); err != nil || len(m) != 0 {
		t.Errorf("metadata with Self alone: %v, %v; want none and no error", m, err)
	}
}

func TestMaxLookback(t *testing.T) {
	src, err := NewSource(SourceConfig{MaxLookback: time.Hour}, newRing(t, 3), quiet, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if q := mustQuerier(t, src, "team-a", now.Add(-3*time.Hour).UnixMilli(), now.Add(-2*time.Hour).UnixMilli()); q != downsample.NoopQuerier() {
		t.Error("querier for a range receivers no longer hold")
	}
	if q := mustChunkQuerier(t, src, "team-a", now.Add(-3*time.Hour).UnixMilli(), now.Add(-2*time.Hour).UnixMilli()); q != storage.NoopChunkedQuerier() {
		t.Error("chunk querier for a range receivers no longer hold")
	}
	if q := mustQuerier(t, src, "team-a", now.Add(-3*time.Hour).UnixMilli(), now.Add(-30*time.Minute).UnixMilli()); q == downsample.NoopQuerier() {
		t.Error("no querier for a recent range")
	}
}

func TestNewSourceConfig(t *testing.T) {
	if _, err := NewSource(SourceConfig{Scheme: "ftp"}, nil, quiet, nil); err == nil {
		t.Error("scheme ftp accepted")
	}
	src, err := NewSource(SourceConfig{}, nil, quiet, nil)
	if err != nil || src.cfg.Scheme != "http" || src.cfg.Timeout != DefaultTimeout {
		t.Errorf("defaults: %+v %v", src, err)
	}
}

// TestReadHandlerTenant: the handler answers a request without a usable
// tenant with tenancy's status, before reading anything.
func TestReadHandlerTenant(t *testing.T) {
	r := newReceiver(t, "r0", tenancy.Config{Allowed: []string{"team-a"}})
	for _, tc := range []struct {
		tenant string
		status int
	}{
		{"", http.StatusUnauthorized},       // no default tenant
		{"team-x", http.StatusUnauthorized}, // not allowed
		{"a/b", http.StatusBadRequest},      // invalid
		{"team-a", http.StatusBadRequest},   // valid tenant, empty body
	} {
		req, _ := http.NewRequest(http.MethodPost, r.srv.URL+ReadPath, nil)
		if tc.tenant != "" {
			req.Header.Set(tenancy.OrgIDHeader, tc.tenant)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Errorf("tenant %q: status %d, want %d", tc.tenant, resp.StatusCode, tc.status)
		}
	}
}

// TestReadHandlerBesideQueryAPI: a process running the query API (whose
// Prometheus handler registers remote-read metrics) and a receiver shares
// one registry.
func TestReadHandlerBesideQueryAPI(t *testing.T) {
	reg := prometheus.NewRegistry()
	dbs := newManager(t)
	remote.NewReadHandler(quiet, reg, query.TenantQueryable{DBs: dbs}, func() config.Config { return config.Config{} }, 0, 1, 1)
	ReadHandler(dbs, tenancy.DefaultConfig(), quiet, reg) // panics on a duplicate
	if n, err := testutil.GatherAndCount(reg, "gpustore_receiver_prometheus_remote_read_handler_queries"); err != nil || n != 1 {
		t.Errorf("read handler gauge: %d %v", n, err)
	}
}

// TestSplitSeriesJoined: a streamed answer splits a series with many
// chunks over frames (consecutive series with the same labels, as
// Prometheus' encoder writes them); the answer holds it once, with every
// chunk in order.
func TestSplitSeriesJoined(t *testing.T) {
	a := labels.FromStrings("__name__", "a")
	b := labels.FromStrings("__name__", "b")
	series := []storage.ChunkSeries{
		storage.NewListChunkSeriesFromSamples(a, chunks.GenerateSamples(0, 3), chunks.GenerateSamples(3, 3), chunks.GenerateSamples(6, 1)),
		storage.NewListChunkSeriesFromSamples(b, chunks.GenerateSamples(0, 2)),
	}
	var buf bytes.Buffer
	w := remote.NewChunkedWriter(&buf, flusher{})
	pool := &sync.Pool{}
	// A frame limit smaller than a chunk: one chunk per frame.
	if _, err := remote.StreamChunkedReadResponses(w, 0, &chunkSeriesList{series: series, i: -1}, nil, 1, pool); err != nil {
		t.Fatal(err)
	}
	ans, err := readChunkedAnswer(&buf)
	if err != nil {
		t.Fatal(err)
	}
	dec := newLabelDecoder(labels.NewSymbolTable())
	var got []string
	for i := range ans.series {
		s := &ans.series[i]
		rs := &ringSeries{lset: dec.labelsOf(s), chunks: s.chunks, mint: 0, maxt: 100}
		it := rs.Iterator(nil)
		n := 0
		for it.Next() != chunkenc.ValNone {
			n++
		}
		got = append(got, fmt.Sprintf("%s:%d chunks, %d samples", rs.lset.Get("__name__"), len(s.chunks), n))
	}
	if want := []string{"a:3 chunks, 7 samples", "b:1 chunks, 2 samples"}; !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

type flusher struct{}

type chunkSeriesList struct {
	series []storage.ChunkSeries
	i      int
}

func (l *chunkSeriesList) Next() bool                      { l.i++; return l.i < len(l.series) }
func (l *chunkSeriesList) At() storage.ChunkSeries         { return l.series[l.i] }
func (*chunkSeriesList) Err() error                        { return nil }
func (*chunkSeriesList) Warnings() annotations.Annotations { return nil }

func (flusher) Flush() {}

// TestTenants: a ruler learns the tenants with data from the receivers: the
// union of every receiver's (but its own), the others' when one is down,
// an error when none answers.
func TestTenants(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t) // team-a on r0..r2, team-b on r1 and r2
	c.rs[0].write(t, "team-c", `gpu_util{gpu="7"}`, steps(0, 1), func(int) float64 { return 1 })
	src, _ := newSource(t, c.ring, "")
	got, err := src.Tenants(ctx)
	if err != nil || !slices.Equal(got, []string{"team-a", "team-b", "team-c"}) {
		t.Fatalf("Tenants: %v, %v; want team-a, team-b, team-c", got, err)
	}
	self, _ := newSource(t, c.ring, "r0")
	if got, err := self.Tenants(ctx); err != nil || !slices.Equal(got, []string{"team-a", "team-b"}) {
		t.Errorf("Tenants with Self r0 (read from disk by the caller): %v, %v", got, err)
	}

	c.rs[2].srv.Close()
	got, err = src.Tenants(ctx)
	if !slices.Equal(got, []string{"team-a", "team-b", "team-c"}) || err == nil || !strings.Contains(err.Error(), "1 of 3 failed") {
		t.Errorf("r2 down: %v, %v; want the others' union and an error naming the failure", got, err)
	}
	c.rs[0].srv.Close()
	c.rs[1].srv.Close()
	if got, err := src.Tenants(ctx); err == nil || got != nil {
		t.Errorf("every receiver down: %v, %v; want an error", got, err)
	}

	rec := httptest.NewRecorder()
	TenantsHandler(newManager(t)).ServeHTTP(rec, httptest.NewRequest(http.MethodPost, TenantsPath, nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST %s: %d, want 405", TenantsPath, rec.Code)
	}
}

// TestMetadata: a query process without data of its own answers
// /api/v1/metadata from the receivers: each family once from whichever
// receivers hold it, only the asking tenant's, the others' answers when one
// is down, an error when none answers.
func TestMetadata(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t) // team-a on r0..r2, team-b on r1 and r2
	util := metadata.Metadata{Type: model.MetricTypeGauge, Help: "GPU utilization.", Unit: "percent"}
	temp := metadata.Metadata{Type: model.MetricTypeGauge, Help: "GPU temperature."}
	c.rs[0].dbs.Existing("team-a").Metadata.Set("gpu_util", util)
	c.rs[1].dbs.Existing("team-a").Metadata.Set("gpu_util", util)
	c.rs[2].dbs.Existing("team-a").Metadata.Set("gpu_temp", temp)
	c.rs[1].dbs.Existing("team-b").Metadata.Set("gpu_energy_total", metadata.Metadata{Type: model.MetricTypeCounter})
	src, _ := newSource(t, c.ring, "")

	got, err := src.Metadata(ctx, "team-a")
	if want := map[string]metadata.Metadata{"gpu_util": util, "gpu_temp": temp}; err != nil || !maps.Equal(got, want) {
		t.Fatalf("team-a: %v, %v; want %v", got, err, want)
	}
	if got, err := src.Metadata(ctx, "team-b"); err != nil || len(got) != 1 || got["gpu_energy_total"].Type != model.MetricTypeCounter {
		t.Errorf("team-b: %v, %v; want its counter only", got, err)
	}
	if got, err := src.Metadata(ctx, "team-c"); err != nil || len(got) != 0 {
		t.Errorf("team-c (never wrote): %v, %v", got, err)
	}

	c.rs[2].srv.Close()
	got, err = src.Metadata(ctx, "team-a")
	if err == nil || !strings.Contains(err.Error(), "1 of 3 failed") || !maps.Equal(got, map[string]metadata.Metadata{"gpu_util": util}) {
		t.Errorf("r2 down: %v, %v; want r0's and r1's answer and an error naming the failure", got, err)
	}
	c.rs[0].srv.Close()
	c.rs[1].srv.Close()
	if got, err := src.Metadata(ctx, "team-a"); err == nil || got != nil {
		t.Errorf("every receiver down: %v, %v; want an error", got, err)
	}

	rec := httptest.NewRecorder()
	MetadataHandler(newManager(t), tenancy.DefaultConfig()).ServeHTTP(rec, httptest.NewRequest(http.MethodPost, MetadataPath, nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST %s: %d, want 405", MetadataPath, rec.Code)
	}
}

// stalledReads is a queryable whose chunk selects hold their reader until
// release is closed or the read's context ends: remote reads that take
// long, holding the handler's slots.
type stalledReads struct {
	storage.SampleAndChunkQueryable
	release chan struct{}
	started chan struct{}
}

func (s stalledReads) ChunkQuerier(int64, int64) (storage.ChunkQuerier, error) {
	return stalledChunkQuerier{s}, nil
}

type stalledChunkQuerier struct{ s stalledReads }

func (q stalledChunkQuerier) Select(ctx context.Context, _ bool, _ *storage.SelectHints, _ ...*labels.Matcher) storage.ChunkSeriesSet {
	q.s.started <- struct{}{}
	select {
	case <-q.s.release:
	case <-ctx.Done():
	}
	return storage.EmptyChunkSeriesSet()
}

func (stalledChunkQuerier) LabelValues(context.Context, string, *storage.LabelHints, ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return nil, nil, nil
}

func (stalledChunkQuerier) LabelNames(context.Context, *storage.LabelHints, ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return nil, nil, nil
}

func (stalledChunkQuerier) Close() error { return nil }

// TestAbandonedReadsWhileSlotsAreTaken: with every read slot held by
// reads that run long, reads whose querier gave up (its query timed out)
// end at once rather than wait for a slot and then run for nobody: the
// receiver is back to its goroutines and open files within seconds.
func TestAbandonedReadsWhileSlotsAreTaken(t *testing.T) {
	q := stalledReads{release: make(chan struct{}), started: make(chan struct{}, 2*readConcurrency)}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: readHandler(q, tenancy.DefaultConfig(), nil, quiet, nil)}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() { _ = srv.Close() }) // not Shutdown: a failing test must not wait for its hung reads
	addr := lis.Addr().String()
	body := abuse.ReadRequest("DCGM_FI_DEV_GPU_UTIL", 0, 60_000)

	done := make(chan int, readConcurrency)
	for range readConcurrency {
		go func() {
			resp, err := http.Post("http://"+addr+ReadPath, "application/x-protobuf", bytes.NewReader(body))
			if err != nil {
				done <- 0
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			done <- resp.StatusCode
		}()
	}
	for range readConcurrency {
		select {
		case <-q.started:
		case <-time.After(10 * time.Second):
			t.Fatal("the long reads did not all start")
		}
	}
	before, err := abuse.Measure()
	if err != nil {
		t.Fatal(err)
	}
	if err := abuse.AbandonedReads(addr, ReadPath, body, nil, 500); err != nil {
		t.Fatal(err)
	}
	if err := abuse.SettlesTo(before, 10, 5*time.Second); err != nil {
		t.Fatalf("500 abandoned reads later: %v", err)
	}
	close(q.release)
	for range readConcurrency {
		if code := <-done; code != http.StatusOK {
			t.Errorf("a long read: %d, want 200", code)
		}
	}
}

// mustQuerier is src's querier with the default read options.
func mustQuerier(t testing.TB, src *Source, tenant string, mint, maxt int64) storage.Querier {
	t.Helper()
	q, err := src.Querier(tenant, mint, maxt, readopts.Default())
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// mustChunkQuerier is src's chunk querier with the default read options.
func mustChunkQuerier(t testing.TB, src *Source, tenant string, mint, maxt int64) storage.ChunkQuerier {
	t.Helper()
	q, err := src.ChunkQuerier(tenant, mint, maxt, readopts.Default())
	if err != nil {
		t.Fatal(err)
	}
	return q
}
