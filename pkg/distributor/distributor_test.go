package distributor

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang/snappy"
	"github.com/grafana/dskit/kv"
	"github.com/grafana/dskit/kv/consul"
	"github.com/grafana/dskit/ring"
	"github.com/grafana/dskit/services"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"

	"github.com/gpustore/gpustore/internal/logging"
	"github.com/gpustore/gpustore/pkg/hatracker"
	"github.com/gpustore/gpustore/pkg/ingest"
	"github.com/gpustore/gpustore/pkg/limits"
	"github.com/gpustore/gpustore/pkg/receiverring"
	"github.com/gpustore/gpustore/pkg/tenancy"
	"github.com/gpustore/gpustore/pkg/tenantdb"
)

// receiver is a real receiver: the ingest handler in downstream mode over
// real TSDBs, served on loopback at the path distributors write to.
type receiver struct {
	c   *cluster
	id  string
	dbs *tenantdb.Manager
	srv *httptest.Server
}

// cluster is n receivers in a ring (in-memory KV) and a distributor in
// front of them, served like the distributor target serves it.
type cluster struct {
	receivers []*receiver
	front     *httptest.Server
	dist      *Distributor
	ingester  *ingest.Ingester
	ring      *ring.Ring
}

func newCluster(t *testing.T, n, rf int, ha *hatracker.Tracker) *cluster {
	t.Helper()
	return newShardedCluster(t, n, rf, ha, nil)
}

// clusterConfig is what a clusterOption changes: the distributor's ring
// configuration and the limits of the distributor's ingester (the
// receivers keep the default limits).
type clusterConfig struct {
	ring   receiverring.Config
	limits limits.Config
}

type clusterOption func(*clusterConfig)

// newShardedCluster is newCluster with tenants' shuffle shards; opts
// change the distributor's configuration.
func newShardedCluster(t *testing.T, n, rf int, ha *hatracker.Tracker, shard ShardSize, opts ...clusterOption) *cluster {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := clusterConfig{ring: receiverring.DefaultConfig(), limits: limits.DefaultConfig()}
	cfg.ring.ReplicationFactor = rf
	for _, o := range opts {
		o(&cfg)
	}
	lim, err := limits.New(limits.DefaultConfig(), logger, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	frontLim, err := limits.New(cfg.limits, logger, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{}
	var urls []string
	for i := range n {
		cfg := tenantdb.DefaultConfig()
		cfg.Dir = t.TempDir()
		dbs, err := tenantdb.NewManager(cfg, logger, prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		dbs.SetLimits(receiverring.DefaultConfig().ReplicaLimits(lim, nil))
		t.Cleanup(func() { _ = dbs.Close() })
		ing, err := ingest.New(ingest.DefaultConfig(), ingest.Deps{
			Tenants: tenancy.DefaultConfig(), DBs: dbs, Limits: lim, Downstream: true,
			Logger: logger, Registry: prometheus.NewRegistry(), Ready: func() error { return nil },
		})
		if err != nil {
			t.Fatal(err)
		}
		mux := http.NewServeMux()
		mux.Handle(receiverring.WritePath, ing)
		r := &receiver{c: c, id: fmt.Sprintf("r%d", i), dbs: dbs, srv: httptest.NewServer(mux)}
		t.Cleanup(r.srv.Close)
		c.receivers = append(c.receivers, r)
		urls = append(urls, r.srv.URL)
	}
	rg := newTestRing(t, urls, rf)
	c.ring = rg
	c.dist, err = New(cfg.ring, rg, shard, logger, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	c.ingester, err = ingest.New(ingest.DefaultConfig(), ingest.Deps{
		Tenants: tenancy.DefaultConfig(), Store: c.dist, Limits: frontLim, HA: ha,
		Logger: logger, Registry: prometheus.NewRegistry(), Ready: func() error { return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	c.front = httptest.NewServer(c.ingester)
	t.Cleanup(c.front.Close)
	return c
}

// newTestRing is a running ring (in-memory KV) of receivers at urls, 64
// evenly spread tokens each.
func newTestRing(t testing.TB, urls []string, rf int) *ring.Ring {
	t.Helper()
	desc := ring.NewDesc()
	n := len(urls)
	for i, u := range urls {
		tokens := make([]uint32, 0, 64)
		for j := range 64 {
			tokens = append(tokens, uint32(j*n+i)*(math.MaxUint32/uint32(64*n)))
		}
		desc.AddIngester(fmt.Sprintf("r%d", i), strings.TrimPrefix(u, "http://"), "", tokens, ring.ACTIVE, time.Now(), false, time.Time{}, nil)
	}
	return startRing(t, desc, rf)
}

// startRing runs a ring of replication factor rf over an in-memory KV
// holding desc.
func startRing(t testing.TB, desc *ring.Desc, rf int) *ring.Ring {
	t.Helper()
	logger := logging.GoKit(slog.New(slog.DiscardHandler))
	store, closer := consul.NewInMemoryClient(ring.GetCodec(), logger, nil)
	t.Cleanup(func() { _ = closer.Close() })
	if err := store.CAS(context.Background(), receiverring.Key, func(any) (any, bool, error) { return desc, true, nil }); err != nil {
		t.Fatal(err)
	}
	rg, err := ring.NewWithStoreClientAndStrategy(ring.Config{HeartbeatTimeout: time.Hour, ReplicationFactor: rf},
		receiverring.Name, receiverring.Key, store, ring.NewDefaultReplicationStrategy(), prometheus.NewRegistry(), logger)
	if err != nil {
		t.Fatal(err)
	}
	if err := services.StartAndAwaitRunning(context.Background(), rg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = services.StopAndAwaitTerminated(context.Background(), rg) })
	return rg
}

// write sends a remote write 1.0 request to the distributor.
func (c *cluster) write(t *testing.T, tenant string, series ...prompb.TimeSeries) (int, string) {
	t.Helper()
	b, err := (&prompb.WriteRequest{Timeseries: series}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return c.post(t, tenant, "application/x-protobuf", b)
}

func (c *cluster) post(t *testing.T, tenant, contentType string, body []byte) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, c.front.URL+"/api/v1/write", bytes.NewReader(snappy.Encode(nil, body)))
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("Content-Encoding", "snappy")
	if tenant != "" {
		req.Header.Set("X-Scope-OrgID", tenant)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(msg)
}

func gpuSeries(i int, samples ...prompb.Sample) prompb.TimeSeries {
	return prompb.TimeSeries{
		Labels: []prompb.Label{
			{Name: "__name__", Value: "DCGM_FI_DEV_GPU_TEMP"}, {Name: "gpu", Value: fmt.Sprint(i % 8)},
			{Name: "instance", Value: fmt.Sprintf("node-%03d", i/8)},
		},
		Samples: samples,
	}
}

// settle waits until the distributor's sends are done: a write is
// acknowledged at quorum, and the slowest replica's send may still run.
func (c *cluster) settle(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for c.dist.inflight.Load() > 0 {
		if time.Now().After(deadline) {
			t.Fatal("sends to receivers still running after 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// stored returns the float samples of every series of the tenant in r, by series.
func (r *receiver) stored(t *testing.T, tenant string) map[string][]prompb.Sample {
	t.Helper()
	r.c.settle(t)
	db := r.dbs.Existing(tenant)
	if db == nil {
		return nil
	}
	q, err := db.Querier(math.MinInt64, math.MaxInt64)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	out := map[string][]prompb.Sample{}
	ss := q.Select(context.Background(), false, nil, labels.MustNewMatcher(labels.MatchRegexp, "__name__", ".+"))
	for ss.Next() {
		s := ss.At()
		it := s.Iterator(nil)
		var got []prompb.Sample
		for vt := it.Next(); vt != chunkenc.ValNone; vt = it.Next() {
			if vt == chunkenc.ValFloat {
				ts, v := it.At()
				got = append(got, prompb.Sample{Timestamp: ts, Value: v})
			} else {
				got = append(got, prompb.Sample{Timestamp: it.AtT(), Value: math.NaN()}) // a histogram
			}
		}
		out[s.Labels().String()] = got
	}
	if err := ss.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestReplicatedToRF: every series is in exactly RF receivers' TSDBs, with
// every sample, and tenants stay apart.
func TestReplicatedToRF(t *testing.T) {
	c := newCluster(t, 4, 3, nil)
	const n = 200
	for step := range 3 {
		var series []prompb.TimeSeries
		for i := range n {
			series = append(series, gpuSeries(i, prompb.Sample{Timestamp: int64(1000 * (step + 1)), Value: float64(i + step)}))
		}
		if code, msg := c.write(t, "team-a", series...); code != http.StatusNoContent {
			t.Fatalf("write %d: %d %s", step, code, msg)
		}
	}
	if code, msg := c.write(t, "team-b", gpuSeries(0, prompb.Sample{Timestamp: 1000, Value: 42})); code != http.StatusNoContent {
		t.Fatalf("write team-b: %d %s", code, msg)
	}
	copies := map[string]int{}
	perReceiver := make([]int, len(c.receivers))
	for ri, r := range c.receivers {
		for ls, samples := range r.stored(t, "team-a") {
			copies[ls]++
			perReceiver[ri]++
			if len(samples) != 3 {
				t.Fatalf("receiver %s: series %s has %d samples, want 3: %v", r.id, ls, len(samples), samples)
			}
		}
		if got := r.stored(t, "team-b"); len(got) > 1 {
			t.Fatalf("receiver %s: team-b has %d series, want at most its 1", r.id, len(got))
		}
	}
	if len(copies) != n {
		t.Fatalf("%d distinct series stored, want %d", len(copies), n)
	}
	for ls, k := range copies {
		if k != 3 {
			t.Fatalf("series %s is in %d receivers, want 3", ls, k)
		}
	}
	for ri, k := range perReceiver {
		if k == 0 || k == n {
			t.Errorf("receiver %d holds %d of %d series: sharding does not spread", ri, k, n)
		}
	}
	t.Logf("series per receiver: %v", perReceiver)
}

// TestQuorum: with RF 3, one receiver down still acknowledges (2 of 3
// committed), two down is a 503 Prometheus retries, and data a quorum
// rejects (out of order) is a 400 with the receivers' reason.
func TestQuorum(t *testing.T) {
	c := newCluster(t, 3, 3, nil)
	const t0 = int64(3_600_000)
	if code, msg := c.write(t, "", gpuSeries(1, prompb.Sample{Timestamp: t0, Value: 1})); code != http.StatusNoContent {
		t.Fatalf("all up: %d %s", code, msg)
	}
	code, msg := c.write(t, "", gpuSeries(1, prompb.Sample{Timestamp: 1000, Value: 1}))
	// Beyond the receivers' out-of-order window the TSDB says too old.
	if code != http.StatusBadRequest || !strings.Contains(msg, "too_old") {
		t.Fatalf("an hour out of order: %d %s, want 400 naming too_old", code, msg)
	}

	c.receivers[0].srv.Close()
	if code, msg := c.write(t, "", gpuSeries(1, prompb.Sample{Timestamp: t0 + 1000, Value: 3})); code != http.StatusNoContent {
		t.Fatalf("one receiver down: %d %s, want 204", code, msg)
	}
	for _, r := range c.receivers[1:] {
		got := r.stored(t, "default")[labelsOf(gpuSeries(1))]
		// The rejected sample may be on the one replica it reached before
		// the newer one (the quorum rejected it; nothing promised it is absent).
		if len(got) > 0 && got[0].Timestamp == 1000 {
			got = got[1:]
		}
		if len(got) != 2 || got[0].Timestamp != t0 || got[1].Timestamp != t0+1000 {
			t.Fatalf("receiver %s: %v, want the samples at %d and %d", r.id, got, t0, t0+1000)
		}
	}
	c.receivers[1].srv.Close()
	code, msg = c.write(t, "", gpuSeries(1, prompb.Sample{Timestamp: t0 + 2000, Value: 4}))
	if code != http.StatusServiceUnavailable {
		t.Fatalf("two of three receivers down: %d %s, want 503", code, msg)
	}
	// Each write's result is counted: the self-alert GpustoreWriteQuorumLost
	// reads no_quorum.
	for result, want := range map[string]float64{"ok": 2, "rejected": 1, "no_quorum": 1} {
		if got := testutil.ToFloat64(c.dist.metrics.writes.WithLabelValues(result)); got != want {
			t.Errorf("gpustore_distributor_writes_total{result=%q} = %g, want %g", result, got, want)
		}
	}
}

func labelsOf(ts prompb.TimeSeries) string {
	b := labels.NewScratchBuilder(len(ts.Labels))
	for _, l := range ts.Labels {
		b.Add(l.Name, l.Value)
	}
	b.Sort()
	return b.Labels().String()
}

// TestSweptReferences: the ingester's series cache keeps references the
// distributor has forgotten (sweeps); its next writes resolve the series
// again from their labels and are stored.
func TestSweptReferences(t *testing.T) {
	c := newCluster(t, 3, 3, nil)
	for step := range 4 {
		if step == 2 {
			c.dist.Sweep() // marks every series unused
			c.dist.Sweep() // forgets them
			if got := len(c.dist.tenants["default"].byRef); got != 0 {
				t.Fatalf("%d references left after two sweeps without writes", got)
			}
		}
		var series []prompb.TimeSeries
		for i := range 20 {
			series = append(series, gpuSeries(i, prompb.Sample{Timestamp: int64(1000 * (step + 1)), Value: float64(step)}))
		}
		if code, msg := c.write(t, "", series...); code != http.StatusNoContent {
			t.Fatalf("step %d: %d %s", step, code, msg)
		}
	}
	for _, r := range c.receivers {
		for ls, s := range r.stored(t, "default") {
			if len(s) != 4 {
				t.Fatalf("receiver %s: %s has %d samples, want 4", r.id, ls, len(s))
			}
		}
	}
}

// TestHistogramsAndMetadata: native histograms and the metric families'
// metadata of a remote write 2.0 request reach the receivers.
func TestHistogramsAndMetadata(t *testing.T) {
	c := newCluster(t, 3, 3, nil)
	syms := writev2.NewSymbolTable()
	h := &histogram.Histogram{Count: 3, Sum: 1.5, Schema: 0, ZeroThreshold: 1e-128,
		PositiveSpans: []histogram.Span{{Offset: 0, Length: 2}}, PositiveBuckets: []int64{1, 1}}
	req := writev2.Request{Timeseries: []writev2.TimeSeries{{
		LabelsRefs: syms.SymbolizeLabels(labels.FromStrings("__name__", "nccl_allreduce_seconds", "job", "train"), nil),
		Histograms: []writev2.Histogram{writev2.FromIntHistogram(0, 1000, h)},
		Metadata:   writev2.Metadata{Type: writev2.Metadata_METRIC_TYPE_HISTOGRAM, HelpRef: syms.Symbolize("AllReduce time."), UnitRef: syms.Symbolize("seconds")},
	}}}
	req.Symbols = syms.Symbols()
	b, err := req.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if code, msg := c.post(t, "", "application/x-protobuf;proto=io.prometheus.write.v2.Request", b); code != http.StatusNoContent {
		t.Fatalf("write: %d %s", code, msg)
	}
	for _, r := range c.receivers {
		c.settle(t)
		db := r.dbs.Existing("default")
		if db == nil {
			t.Fatalf("receiver %s got nothing", r.id)
		}
		m, ok := db.Metadata.Get("nccl_allreduce_seconds")
		if !ok || m.Type != model.MetricTypeHistogram || m.Unit != "seconds" {
			t.Fatalf("receiver %s metadata: %+v %v, want histogram in seconds", r.id, m, ok)
		}
		q, err := db.Querier(0, 2000)
		if err != nil {
			t.Fatal(err)
		}
		ss := q.Select(context.Background(), false, nil, labels.MustNewMatcher(labels.MatchEqual, "__name__", "nccl_allreduce_seconds"))
		if !ss.Next() {
			t.Fatalf("receiver %s: histogram series missing", r.id)
		}
		it := ss.At().Iterator(nil)
		if it.Next() != chunkenc.ValHistogram {
			t.Fatalf("receiver %s: not a histogram", r.id)
		}
		if _, got := it.AtHistogram(nil); got.Count != 3 || got.Sum != 1.5 {
			t.Fatalf("receiver %s: histogram %v, want count 3 sum 1.5", r.id, got)
		}
		_ = q.Close()
	}
}

// TestHADedupOnce: the distributor elects one replica of an HA pair and
// removes the replica label before sharding, so both replicas' copies of a
// series hash to the same receivers and only the elected one is stored.
func TestHADedupOnce(t *testing.T) {
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	haCfg := hatracker.DefaultConfig()
	ha, err := hatracker.New(haCfg, kv.StoreConfig{}, logger, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	if err := services.StartAndAwaitRunning(context.Background(), ha); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = services.StopAndAwaitTerminated(context.Background(), ha) })
	c := newCluster(t, 4, 3, ha)
	replica := func(name string, ts int64, v float64) prompb.TimeSeries {
		s := gpuSeries(3, prompb.Sample{Timestamp: ts, Value: v})
		s.Labels = append(s.Labels, prompb.Label{Name: "cluster", Value: "gpu-a"}, prompb.Label{Name: "__replica__", Value: name})
		return s
	}
	now := time.Now().UnixMilli()
	for i, r := range []string{"p0", "p1", "p0", "p1"} {
		if code, msg := c.write(t, "", replica(r, now+int64(i/2)*1000, float64(i))); code != http.StatusNoContent {
			t.Fatalf("write %s: %d %s", r, code, msg)
		}
	}
	copies := 0
	for _, r := range c.receivers {
		for ls, s := range r.stored(t, "default") {
			copies++
			if strings.Contains(ls, "__replica__") {
				t.Fatalf("receiver %s stored the replica label: %s", r.id, ls)
			}
			if len(s) != 2 || s[0].Value != 0 || s[1].Value != 2 {
				t.Fatalf("receiver %s: %s = %v, want p0's samples 0 and 2 only", r.id, ls, s)
			}
		}
	}
	if copies != 3 {
		t.Fatalf("series stored in %d receivers, want 3", copies)
	}
}

var _ storage.AppendableV2 = (*tenant)(nil)

// TestReceiverTransportFaultsAreRetried: a receiver's 4xx that is not its
// ingester's judgement of the data (Go's 400 to plain HTTP sent to a TLS
// receiver, a 401 for ring credentials it does not know) is a transport or
// configuration fault: the distributor answers 503, which the sender
// retries, not 400, which makes it drop the data. Before, any 4xx from a
// quorum was passed on as 400.
func TestReceiverTransportFaultsAreRetried(t *testing.T) {
	unauthorized := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("WWW-Authenticate", `Basic realm="gpustore"`)
		http.Error(w, "Unauthorized", http.StatusUnauthorized)
	})
	for _, c := range []struct {
		name string
		tls  bool
		// handler replaces the receiver's handler; nil: kept
		handler http.Handler
	}{
		{"plain HTTP to TLS receivers", true, nil},
		{"receivers refusing the ring's credentials", false, unauthorized},
	} {
		t.Run(c.name, func(t *testing.T) {
			cl := newCluster(t, 3, 3, nil)
			for _, r := range cl.receivers {
				addr, h := r.srv.Listener.Addr().String(), r.srv.Config.Handler
				if c.handler != nil {
					h = c.handler
				}
				r.srv.Close()
				r.srv = httptest.NewUnstartedServer(h)
				_ = r.srv.Listener.Close()
				l, err := net.Listen("tcp", addr) // where the ring knows it
				if err != nil {
					t.Fatal(err)
				}
				r.srv.Listener = l
				if c.tls {
					r.srv.StartTLS()
				} else {
					r.srv.Start()
				}
				t.Cleanup(r.srv.Close)
			}
			code, msg := cl.write(t, "", gpuSeries(1, prompb.Sample{Timestamp: 3_600_000, Value: 1}))
			if code != http.StatusServiceUnavailable {
				t.Errorf("%d %s, want 503", code, msg)
			}
			t.Logf("%d %s", code, msg)
		})
	}
}

// TestShuffleShardWrites: a tenant with a shuffle shard has its series
// written to the receivers of its shard alone (dskit's ShuffleShard of the
// ring), each on RF of them; a tenant of size 0 spreads over every
// receiver; a size below RF is raised to RF; a size changed at run time
// applies to the next write.
func TestShuffleShardWrites(t *testing.T) {
	sizes := map[string]int{"noisy": 3, "wide": 4, "tiny": 1, "all": 0}
	var mtx sync.Mutex
	c := newShardedCluster(t, 8, 3, nil, func(tenant string) int {
		mtx.Lock()
		defer mtx.Unlock()
		return sizes[tenant]
	})
	const n = 120
	write := func(tenant string, ts int64) {
		t.Helper()
		var series []prompb.TimeSeries
		for i := range n {
			series = append(series, gpuSeries(i, prompb.Sample{Timestamp: ts, Value: float64(i)}))
		}
		if code, msg := c.write(t, tenant, series...); code != http.StatusNoContent {
			t.Fatalf("write %s: %d %s", tenant, code, msg)
		}
	}
	// holders are the receivers holding any of the tenant's series; every
	// series is on RF of them (at least, when written to two shards).
	holders := func(tenant string) []string {
		t.Helper()
		var ids []string
		copies := map[string]int{}
		for _, r := range c.receivers {
			got := r.stored(t, tenant)
			if len(got) > 0 {
				ids = append(ids, r.id)
			}
			for ls := range got {
				copies[ls]++
			}
		}
		if len(copies) != n {
			t.Fatalf("%s: %d series stored, want %d", tenant, len(copies), n)
		}
		for ls, k := range copies {
			if k != 3 && (k < 3 || tenant != "noisy") {
				t.Fatalf("%s: series %s on %d receivers, want 3", tenant, ls, k)
			}
		}
		slices.Sort(ids)
		return ids
	}
	shard := func(tenant string, size int) []string {
		rs, err := c.ring.ShuffleShard(tenant, size).GetAllHealthy(ring.Write)
		if err != nil {
			t.Fatal(err)
		}
		ids := make([]string, 0, len(rs.Instances))
		for _, in := range rs.Instances {
			ids = append(ids, in.Id)
		}
		slices.Sort(ids)
		return ids
	}
	for _, tenant := range []string{"noisy", "wide", "tiny", "all"} {
		write(tenant, 1000)
	}
	for _, c := range []struct {
		tenant string
		want   []string
	}{
		{"noisy", shard("noisy", 3)},
		{"wide", shard("wide", 4)},
		{"tiny", shard("tiny", 3)},
		{"all", []string{"r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7"}},
	} {
		if got := holders(c.tenant); !slices.Equal(got, c.want) {
			t.Errorf("%s's series are on %v, want its shard %v", c.tenant, got, c.want)
		}
	}
	// Grown at run time: the next write goes to the larger shard, which
	// holds the smaller one.
	mtx.Lock()
	sizes["noisy"] = 6
	mtx.Unlock()
	write("noisy", 2000)
	got, want := holders("noisy"), shard("noisy", 6)
	if len(got) < 5 || !slices.Equal(got, slices.DeleteFunc(slices.Clone(want), func(id string) bool { return !slices.Contains(got, id) })) {
		t.Errorf("noisy grown to 6: its series are on %v, want %v", got, want)
	}
	for _, id := range shard("noisy", 3) {
		if !slices.Contains(want, id) {
			t.Errorf("noisy's shard of 6 %v lacks %s of its shard of 3", want, id)
		}
	}
}

// BenchmarkRingOf is what shuffle sharding adds to every commit: finding
// the tenant's shard in a ring of 60 receivers of 128 tokens (dskit caches
// the shard until the ring changes), against the whole ring.
func BenchmarkRingOf(b *testing.B) {
	logger := slog.New(slog.DiscardHandler)
	desc := ring.NewDesc()
	gen := ring.NewRandomTokenGenerator()
	for i := range 60 {
		id := fmt.Sprintf("r%d", i)
		desc.AddIngester(id, id+":9201", "", gen.GenerateTokens(128, desc.GetTokens()), ring.ACTIVE, time.Now(), false, time.Time{}, nil)
	}
	rg := startRing(b, desc, 3)
	for rg.InstancesCount() != 60 {
		time.Sleep(time.Millisecond)
	}
	for _, size := range []int{0, 3, 12} {
		b.Run(fmt.Sprintf("shard=%d", size), func(b *testing.B) {
			d, err := New(receiverring.DefaultConfig(), rg, func(string) int { return size }, logger, prometheus.NewRegistry())
			if err != nil {
				b.Fatal(err)
			}
			keys := make([]uint32, 1000)
			for i := range keys {
				keys[i] = uint32(i) * 4_294_967
			}
			b.ReportAllocs()
			for b.Loop() {
				// Commit's ring work: the tenant's ring, then the replicas
				// of a request's 1000 series, as DoBatch finds them.
				r := d.ringOf("gpu-prod")
				var bufD []ring.InstanceDesc
				var bufH, bufZ []string
				for _, k := range keys {
					if _, err := r.Get(k, ring.Write, bufD, bufH, bufZ); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
