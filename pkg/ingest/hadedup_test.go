package ingest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grafana/dskit/kv"
	"github.com/grafana/dskit/kv/consul"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"

	"github.com/gpustore/gpustore/internal/logging"
	"github.com/gpustore/gpustore/pkg/hatracker"
)

// faultyAppendable wraps a tenant's real TSDB and injects a storage fault into
// the next request that arms it: an Append that fails after a number of good
// ones, or a Commit that fails (the TSDB's own Commit rolls back when its WAL
// write fails; the injected one does the same). TestStorageFaultIs500 covers
// a real WAL fault; this one makes the fault transient, so what the next
// request does can be checked.
type faultyAppendable struct {
	storage.AppendableV2
	appendsBeforeFault atomic.Int64 // >= 0: fail the Append after this many; -1: off
	failCommit         atomic.Bool
}

var errInjected = errors.New("injected storage fault")

func newFaultyAppendable(a storage.AppendableV2) *faultyAppendable {
	f := &faultyAppendable{AppendableV2: a}
	f.appendsBeforeFault.Store(-1)
	return f
}

func (f *faultyAppendable) AppenderV2(ctx context.Context) storage.AppenderV2 {
	return &faultyAppender{AppenderV2: f.AppendableV2.AppenderV2(ctx), f: f}
}

type faultyAppender struct {
	storage.AppenderV2
	f *faultyAppendable
}

func (a *faultyAppender) Append(ref storage.SeriesRef, ls labels.Labels, st, t int64, v float64, h *histogram.Histogram, fh *histogram.FloatHistogram, opts storage.AOptions) (storage.SeriesRef, error) {
	if n := a.f.appendsBeforeFault.Load(); n >= 0 {
		if n == 0 {
			a.f.appendsBeforeFault.Store(-1)
			return 0, errInjected
		}
		a.f.appendsBeforeFault.Store(n - 1)
	}
	return a.AppenderV2.Append(ref, ls, st, t, v, h, fh, opts)
}

func (a *faultyAppender) Commit() error {
	if a.f.failCommit.CompareAndSwap(true, false) {
		_ = a.AppenderV2.Rollback()
		return fmt.Errorf("write to WAL: %w", errInjected)
	}
	return a.AppenderV2.Commit()
}

// faultyKV is the real in-memory election store, except that elections of
// clusters named in failClusters fail as if the store were unreachable.
type faultyKV struct {
	kv.Client
	failCluster string
}

func (f faultyKV) CAS(ctx context.Context, key string, fn func(any) (any, bool, error)) error {
	if f.failCluster != "" && strings.HasSuffix(key, "/"+f.failCluster) {
		return errKVDown
	}
	return f.Client.CAS(ctx, key, fn)
}

// replicaValue marks which replica a stored sample came from: p0 sends the
// timestamp, p1 the timestamp plus a quarter.
func replicaValue(replica string, ms int64) float64 {
	if replica == "p1" {
		return float64(ms) + 0.25
	}
	return float64(ms)
}

func haSeries(replica string, ms int64, cluster string, n int) []prompb.TimeSeries {
	out := make([]prompb.TimeSeries, n)
	for i := range out {
		out[i] = v1Series([]prompb.Sample{{Timestamp: ms, Value: replicaValue(replica, ms)}},
			"__name__", "DCGM_FI_DEV_GPU_TEMP", "gpu", fmt.Sprint(i), "cluster", cluster, "__replica__", replica)
	}
	return out
}

// storedSamples returns the (t, v) samples of every series of the tenant.
func (ti *testIngester) storedSamples(t testing.TB, tenant string) map[string][][2]float64 {
	t.Helper()
	db := ti.dbs.Existing(tenant)
	if db == nil {
		return nil
	}
	q, err := db.Querier(math.MinInt64, math.MaxInt64)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	out := map[string][][2]float64{}
	ss := q.Select(context.Background(), true, nil, labels.MustNewMatcher(labels.MatchRegexp, model.MetricNameLabel, ".+"))
	for ss.Next() {
		it := ss.At().Iterator(nil)
		key := ss.At().Labels().String()
		for vt := it.Next(); vt != chunkenc.ValNone; vt = it.Next() {
			ts, v := it.At()
			out[key] = append(out[key], [2]float64{float64(ts), v})
		}
	}
	if err := ss.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// The sequence of issue 9: p0 writes t; p1 fills the gap at t+15s but its
// request fails with a 5xx after p1's sample was weighed; p0's sample at
// t+20s must then be stored. Before, p1's claim on the series stayed in the
// cache although nothing of it was stored, and p0's sample was answered 204
// and dropped: an acknowledged sample lost.
func TestHAClaimIsGivenBackWhenTheRequestFails(t *testing.T) {
	const energyKey = `{Hostname="node-1", __name__="DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", cluster="gpu-a", gpu="0"}`
	for _, tc := range []struct {
		name string
		// p1 returns p1's gap-fill request at ms, arming the fault it needs.
		p1   func(ti *testIngester, faults *faultyAppendable, ms int64) *prompb.WriteRequest
		want int
	}{
		{"rate limit 503", func(_ *testIngester, _ *faultyAppendable, ms int64) *prompb.WriteRequest {
			req := replicaRequest("p1", ms)
			// More samples than the burst: this request alone is over the rate.
			req.Timeseries = append(req.Timeseries, haSeries("p1", ms, "gpu-a", 5)...)
			return req
		}, http.StatusServiceUnavailable},
		{"storage fault while appending 500", func(_ *testIngester, faults *faultyAppendable, ms int64) *prompb.WriteRequest {
			faults.appendsBeforeFault.Store(1) // the energy sample is appended, the next one fails
			return replicaRequest("p1", ms)
		}, http.StatusInternalServerError},
		{"WAL fault at commit 500", func(_ *testIngester, faults *faultyAppendable, ms int64) *prompb.WriteRequest {
			faults.failCommit.Store(true)
			return replicaRequest("p1", ms)
		}, http.StatusInternalServerError},
		{"election store fault 500", func(_ *testIngester, _ *faultyAppendable, ms int64) *prompb.WriteRequest {
			req := replicaRequest("p1", ms)
			// A series of another cluster after the claimed one: its first
			// election needs the store, which is down for that cluster.
			req.Timeseries = append(req.Timeseries, haSeries("p1", ms, "gpu-down", 1)...)
			return req
		}, http.StatusInternalServerError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := &testClock{}
			start := time.Now().Add(-time.Hour).UnixMilli()
			clock.set(start)
			ti := newTestIngester(t, haSetup(clock), func(s *testSetup) {
				logger := slog.New(slog.NewTextHandler(io.Discard, nil))
				store, _ := consul.NewInMemoryClient(hatracker.Codec(), logging.GoKit(logger), nil)
				s.haKV = faultyKV{Client: store, failCluster: "gpu-down"}
				// Up to four samples a request fit the burst; the tracker's clock
				// also drives the rate limiter.
				s.limits.Defaults.IngestionRate, s.limits.Defaults.IngestionBurstSize = 1, 4
			})
			ti.now = clock.now
			faults := newFaultyAppendable(nil)
			ti.wrapAppendable(t, "default", func(a storage.AppendableV2) storage.AppendableV2 {
				faults.AppendableV2 = a
				return faults
			})
			post := func(req *prompb.WriteRequest) response {
				t.Helper()
				return ti.post(t, ctV1, encodeV1(t, req))
			}

			if resp := post(replicaRequest("p0", start)); resp.code != http.StatusNoContent {
				t.Fatalf("p0 at t: %d %s", resp.code, resp.body)
			}
			// p0 silent for 15 s: past the 10 s gap-fill delay, before the 30 s failover.
			clock.set(start + 15000)
			if resp := post(tc.p1(ti, faults, start+15000)); resp.code != tc.want {
				t.Fatalf("p1's gap fill at t+15s: %d %s, want %d", resp.code, resp.body, tc.want)
			}
			clock.set(start + 20000)
			if resp := post(replicaRequest("p0", start+20000)); resp.code != http.StatusNoContent {
				t.Fatalf("p0 at t+20s: %d %s", resp.code, resp.body)
			}
			got := ti.stored(t, "default")[energyKey]
			want := []float64{energy(start), energy(start + 20000)}
			if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
				t.Fatalf("stored %v, want p0's samples at t and t+20s %v: an acknowledged sample was lost", got, want)
			}
		})
	}
}

// Both replicas write the same series at the same moment, over and over,
// while the elected one comes back from a silence longer than the gap-fill
// delay. Whatever the interleaving: two stored samples of different replicas
// are never closer than gap_fill_after (docs/ingest.md's promise), and of each
// round's pair of samples at least one is stored (the other was answered 2xx
// as a duplicate, so it must be covered). 503 answers are retried, as
// Prometheus does.
func TestHAGapFillPromiseUnderConcurrency(t *testing.T) {
	clock := &testClock{}
	start := time.Now().Add(-2 * time.Hour).UnixMilli()
	clock.set(start)
	ti := newTestIngester(t, haSetup(clock))
	const (
		nSeries = 50
		rounds  = 40
		gap     = 10000
	)
	post := func(replica string, ms int64) {
		t.Helper()
		body := encodeV1(t, &prompb.WriteRequest{Timeseries: haSeries(replica, ms, "gpu-a", nSeries)})
		for try := 0; ; try++ {
			resp := ti.post(t, ctV1, body)
			if resp.code == http.StatusNoContent {
				return
			}
			if resp.code != http.StatusServiceUnavailable || try > 100 {
				t.Errorf("%s at %d: %d %s", replica, ms, resp.code, resp.body)
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	base := start
	for r := 0; r < rounds; r++ {
		clock.set(base)
		post("p0", base) // p0 alone
		// p0 silent for 15 s: p1 may fill (its sample 12 s after p0's), and
		// p0 comes back with its next sample at the same moment.
		clock.set(base + 15000)
		var wg sync.WaitGroup
		d0, d1 := time.Duration(rnd.IntN(300))*time.Microsecond, time.Duration(rnd.IntN(300))*time.Microsecond
		wg.Go(func() { time.Sleep(d1); post("p1", base+12000) })
		wg.Go(func() { time.Sleep(d0); post("p0", base+15000) })
		wg.Wait()
		base += 30000
	}
	if t.Failed() {
		return
	}
	got := ti.storedSamples(t, "default")
	if len(got) != nSeries {
		t.Fatalf("%d series stored, want %d", len(got), nSeries)
	}
	for key, samples := range got {
		byT := map[int64]bool{}
		for i, s := range samples {
			byT[int64(s[0])] = true
			if i == 0 {
				continue
			}
			prev := samples[i-1]
			if (s[1] != math.Trunc(s[1])) != (prev[1] != math.Trunc(prev[1])) && s[0]-prev[0] < gap {
				t.Fatalf("%s: samples of both replicas %g ms apart (at %d and %d), closer than gap_fill_after", key, s[0]-prev[0], int64(prev[0]), int64(s[0]))
			}
		}
		for r, b := int64(0), start; r < rounds; r, b = r+1, b+30000 {
			if !byT[b] {
				t.Fatalf("%s: p0's sample of round %d missing", key, r)
			}
			if !byT[b+12000] && !byT[b+15000] {
				t.Fatalf("%s: round %d: neither p1's gap fill nor p0's return stored, both were acknowledged", key, r)
			}
		}
	}
}
