package distributor

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/golang/snappy"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/prompb"
	"github.com/prometheus/prometheus/storage"

	"github.com/gpustore/gpustore/pkg/ingest"
	"github.com/gpustore/gpustore/pkg/limits"
	"github.com/gpustore/gpustore/pkg/receiverring"
	"github.com/gpustore/gpustore/pkg/tenancy"
)

// front is a distributor behind its ingest handler, as the distributor
// target serves it, writing to receivers that take every write unread (a
// 204 once the body is read): what is measured is the distributor's work.
type front struct {
	dist *Distributor
	ing  *ingest.Ingester
}

func newFront(tb testing.TB, maxSeries int) *front {
	tb.Helper()
	var urls []string
	for range 3 {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.WriteHeader(http.StatusNoContent)
		}))
		tb.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
	}
	rg := newTestRing(tb, urls, 3)
	logger := slog.New(slog.DiscardHandler)
	cfg := receiverring.DefaultConfig()
	cfg.DistributorSeriesCacheMaxSeries = maxSeries
	d, err := New(cfg, rg, nil, logger, prometheus.NewRegistry())
	if err != nil {
		tb.Fatal(err)
	}
	lim, err := limits.New(limits.DefaultConfig(), logger, prometheus.NewRegistry())
	if err != nil {
		tb.Fatal(err)
	}
	ing, err := ingest.New(ingest.DefaultConfig(), ingest.Deps{
		Tenants: tenancy.DefaultConfig(), Store: d, Limits: lim,
		Logger: logger, Registry: prometheus.NewRegistry(), Ready: func() error { return nil },
	})
	if err != nil {
		tb.Fatal(err)
	}
	return &front{dist: d, ing: ing}
}

func (f *front) post(tb testing.TB, body []byte) {
	req := httptest.NewRequest(http.MethodPost, "/api/v1/write", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/x-protobuf")
	req.Header.Set("Content-Encoding", "snappy")
	rec := httptest.NewRecorder()
	f.ing.ServeHTTP(rec, req)
	if rec.Code != http.StatusNoContent {
		tb.Fatalf("status %d: %s", rec.Code, rec.Body.String())
	}
}

// fleetRequest is request i of a fleet's scrape: 2,000 series (10 nodes of
// 8 GPUs, 25 metrics) with the 15 labels dcgm-exporter and Prometheus give
// a GPU metric, one sample each at ts, remote write 1.0, snappy.
func fleetRequest(i int, ts int64) []byte {
	var req prompb.WriteRequest
	for node := i * 10; node < i*10+10; node++ {
		for gpu := range 8 {
			for m := range 25 {
				kv := []string{
					"__name__", fmt.Sprintf("DCGM_FI_DEV_METRIC_%02d", m), "DCGM_FI_DRIVER_VERSION", "550.54.15",
					"Hostname", fmt.Sprintf("gpu-node-%05d", node), "UUID", fmt.Sprintf("GPU-%08x-1b2c-4d5e-8f90-%012x", node, gpu),
					"cluster", "gpu-cluster-prod-01", "container", "trainer", "device", fmt.Sprintf("nvidia%d", gpu),
					"gpu", fmt.Sprint(gpu), "instance", fmt.Sprintf("10.%d.%d.%d:9400", node/65536, node/256%256, node%256),
					"job", "dcgm-exporter", "modelName", "NVIDIA H100 80GB HBM3", "namespace", "training",
					"pci_bus_id", fmt.Sprintf("00000000:%02X:00.0", 0x18+gpu*0x10), "pod", fmt.Sprintf("llama-70b-worker-%d", node),
					"region", "us-east-1",
				}
				ts := prompb.TimeSeries{Samples: []prompb.Sample{{Timestamp: ts, Value: float64(node*200 + gpu*25 + m)}}}
				for j := 0; j < len(kv); j += 2 {
					ts.Labels = append(ts.Labels, prompb.Label{Name: kv[j], Value: kv[j+1]})
				}
				req.Timeseries = append(req.Timeseries, ts)
			}
		}
	}
	b, err := req.Marshal()
	if err != nil {
		panic(err)
	}
	return snappy.Encode(nil, b)
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkSeriesCache is the distributor's cost per sample of known series
// (the ingester's cache knows them), 20,000 active series written in turn
// in requests of 2,000 to three receivers: with every series cached, and
// with a bound far below the active series (1: every series over it, so
// each write resolves each series from its labels again and encodes them
// anew). The receivers read the body and answer: their cost is in the
// figures, the same in both. cpu-ns/sample ×1000 is CPU-ms per million
// samples. Run:
//
//	go test -run '^$' -bench SeriesCache -benchmem -benchtime 400x ./pkg/distributor
func BenchmarkSeriesCache(b *testing.B) {
	const requests = 10
	for _, c := range []struct {
		name  string
		bound int
	}{{"cached", 0}, {"over-bound", 1}} {
		b.Run(c.name, func(b *testing.B) {
			f := newFront(b, c.bound)
			start := time.Now().Add(-time.Hour).UnixMilli()
			for i := range requests {
				f.post(b, fleetRequest(i, start)) // the series are known from here on
			}
			f.dist.settle(b)
			// A ring of bodies at increasing timestamps, built before the timer.
			const ring = 40 * requests
			bodies := make([][]byte, ring)
			for i := range bodies {
				bodies[i] = fleetRequest(i%requests, start+int64(i/requests+1)*1000)
			}
			runtime.GC()
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := processCPU()
			for i := 0; i < b.N; i++ {
				f.post(b, bodies[i%ring])
			}
			f.dist.settle(b)
			b.StopTimer()
			samples := float64(b.N * 2000)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/samples, "ns/sample")
			b.ReportMetric(float64((processCPU()-cpu0).Nanoseconds())/samples, "cpu-ns/sample")
			b.ReportMetric(float64(f.dist.cached.Load()), "cached-series")
		})
	}
}

// settle waits until the distributor's sends are done.
func (d *Distributor) settle(tb testing.TB) {
	deadline := time.Now().Add(30 * time.Second)
	for d.inflight.Load() > 0 {
		if time.Now().After(deadline) {
			tb.Fatal("sends to receivers still running after 30s")
		}
		time.Sleep(time.Millisecond)
	}
}

var heapSeries = flag.Int("heap-series", 0, "TestSeriesCacheHeap: active series to write (0: the test is skipped)")

// TestSeriesCacheHeap measures the Go heap a distributor holds per active
// series, with no bound and a bound of a fifth of the series: the whole
// front's (its ingester's series cache included), and the distributor's
// cache alone (what forgetting it frees). Skipped unless -heap-series is
// given:
//
//	go test -count=1 -run SeriesCacheHeap -v ./pkg/distributor -heap-series=500000
func TestSeriesCacheHeap(t *testing.T) {
	n := *heapSeries
	if n == 0 {
		t.Skip("-heap-series not given")
	}
	requests := (n + 1999) / 2000
	for _, bound := range []int{0, n / 5} {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		f := newFront(t, bound)
		start := time.Now().Add(-time.Hour).UnixMilli()
		for i := range requests {
			f.post(t, fleetRequest(i, start))
		}
		f.dist.settle(t)
		runtime.GC()
		runtime.ReadMemStats(&after)
		cached := f.dist.cached.Load()
		for _, tn := range f.dist.tenants {
			tn.mtx.Lock()
			tn.byRef, tn.byHash = map[storage.SeriesRef]*series{}, map[uint64]storage.SeriesRef{}
			tn.mtx.Unlock()
		}
		var forgotten runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&forgotten)
		active := float64(requests * 2000)
		heap := float64(after.HeapAlloc) - float64(before.HeapAlloc)
		cache := float64(after.HeapAlloc) - float64(forgotten.HeapAlloc)
		t.Logf("bound %d: %.0f series, %d cached: front's heap +%.0f MiB (%.2f KiB per active series), the distributor's cache %.0f MiB (%.2f KiB per active series)",
			bound, active, cached, heap/(1<<20), heap/1024/active, cache/(1<<20), cache/1024/active)
		runtime.KeepAlive(f)
	}
}
