package ingest

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/golang/snappy"

	"github.com/gpustore/gpustore/pkg/hatracker"
	"github.com/gpustore/gpustore/pkg/relabel"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
	"github.com/prometheus/prometheus/storage"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
)

// dcgmLabels returns the label set dcgm-exporter (with Kubernetes mapping)
// and Prometheus' target labels give one GPU metric: 15 labels.
func dcgmLabels(metric string, node, gpu int) []string {
	return []string{
		"__name__", metric,
		"DCGM_FI_DRIVER_VERSION", "550.54.15",
		"Hostname", fmt.Sprintf("gpu-node-%03d", node),
		"UUID", fmt.Sprintf("GPU-%08x-1b2c-4d5e-8f90-%012x", node, gpu),
		"cluster", "gpu-cluster-prod-01",
		"container", "trainer",
		"device", fmt.Sprintf("nvidia%d", gpu),
		"gpu", fmt.Sprint(gpu),
		"instance", fmt.Sprintf("10.0.%d.%d:9400", node/256, node%256),
		"job", "dcgm-exporter",
		"modelName", "NVIDIA H100 80GB HBM3",
		"namespace", "training",
		"pci_bus_id", fmt.Sprintf("00000000:%02X:00.0", 0x18+gpu*0x10),
		"pod", fmt.Sprintf("llama-70b-worker-%d", node),
		"region", "us-east-1",
	}
}

var benchMetrics = []string{
	"DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE",
	"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL",
	"DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED",
	"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_VGPU_LICENSE_STATUS", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
	"DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES",
}

// benchSeries is 2,000 series (10 nodes × 8 GPUs × 25 metrics): one request
// of Prometheus' default max_samples_per_send.
func benchSeries() [][]string {
	var out [][]string
	for node := 0; node < 10; node++ {
		for gpu := 0; gpu < 8; gpu++ {
			for _, m := range benchMetrics {
				out = append(out, dcgmLabels(m, node, gpu))
			}
		}
	}
	return out
}

func benchBodyV1(series [][]string, ts int64) []byte {
	req := prompb.WriteRequest{}
	for i, kv := range series {
		req.Timeseries = append(req.Timeseries, v1Series([]prompb.Sample{{Timestamp: ts, Value: float64(i) + float64(ts%1000)/7}}, kv...))
	}
	b, _ := req.Marshal()
	return snappy.Encode(nil, b)
}

func benchBodyV2(series [][]string, ts int64) []byte {
	b := newV2Builder()
	for i, kv := range series {
		b.add(writev2.TimeSeries{Samples: []writev2.Sample{{Value: float64(i) + float64(ts%1000)/7, Timestamp: ts}}}, kv...)
	}
	raw, _ := b.build().Marshal()
	return snappy.Encode(nil, raw)
}

// processCPU is the process' user+system CPU time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkIngest measures the write path for known series (the steady
// state): snappy decode, protobuf walk, series-cache lookup, TSDB append and
// WAL commit, per sample. Run: go test -run XXX -bench Ingest -benchmem ./pkg/ingest
//
// The series carry a Prometheus HA pair's external labels (cluster,
// __replica__) as they would from a real sender; "ha-off" and "ha-on" run
// the same bodies with the HA tracker off and on (one replica elected).
func BenchmarkIngest(b *testing.B) {
	for _, c := range []struct {
		name string
		ct   string
		body func([][]string, int64) []byte
		ha   bool
	}{{"v1/ha-off", ctV1, benchBodyV1, false}, {"v1/ha-on", ctV1, benchBodyV1, true}, {"v2/ha-off", ctV2, benchBodyV2, false}, {"v2/ha-on", ctV2, benchBodyV2, true}} {
		b.Run(c.name, func(b *testing.B) {
			ti := newTestIngester(b, func(s *testSetup) {
				if c.ha {
					cfg := hatracker.DefaultConfig()
					s.ha = &cfg
				}
			})
			benchIngest(b, ti, c.ct, c.body, false)
		})
	}
}

// benchIngest posts a ring of 2,000-series requests (benchSeries with an HA
// pair's labels) at increasing timestamps and reports per-sample wall and
// CPU time. fresh: every request's series are new (a pod label changes with
// each request), so every series is built (and relabeled); otherwise the
// series are created before the timer starts and every request is known
// series (the steady state).
func benchIngest(b *testing.B, ti *testIngester, ct string, body func([][]string, int64) []byte, fresh bool) {
	series := benchSeries()
	for i := range series {
		series[i] = append(series[i], "__replica__", "prometheus-0")
	}
	// Samples 1 s apart starting 3 h ago: up to 10,000 requests stay
	// within the head's window and never reach the future bound.
	start := time.Now().Add(-3 * time.Hour).UnixMilli()
	post := func(body []byte) {
		if ct == otlpProtobuf {
			if r := ti.postOTLP(b, ct, "gzip", body); r.code != http.StatusOK {
				b.Fatalf("status %d: %s", r.code, r.body)
			}
			return
		}
		req := httptest.NewRequest(http.MethodPost, "/api/v1/write", bytes.NewReader(body))
		req.Header.Set("Content-Type", ct)
		req.Header.Set("Content-Encoding", "snappy")
		rec := httptest.NewRecorder()
		ti.ServeHTTP(rec, req)
		if rec.Code != http.StatusNoContent {
			b.Fatalf("status %d: %s", rec.Code, rec.Body.String())
		}
	}
	post(body(series, start)) // create the series: measure the known-series path
	// Bodies are prepared outside the timer, a ring of them at
	// increasing timestamps. With -benchtime=256x or less the ring
	// is built once, before the timer (and a CPU profile) starts.
	const ring = 256
	bodies := make([][]byte, 0, ring)
	podIdx := slices.Index(series[0], "pod") + 1
	fill := func(i int) {
		bodies = bodies[:0]
		for j := 0; j < ring; j++ {
			if fresh {
				for _, s := range series {
					s[podIdx] = fmt.Sprintf("job-%d-worker", i+j)
				}
			}
			bodies = append(bodies, body(series, start+int64(i+j+1)*1000))
		}
	}
	fill(0)
	// The garbage of building the bodies is collected before the timer
	// starts, so the CPU time measured is the ingester's own.
	runtime.GC()
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := processCPU()
	var fillCPU time.Duration
	for i := 0; i < b.N; i++ {
		if i > 0 && i%ring == 0 {
			b.StopTimer()
			c0 := processCPU()
			fill(i)
			runtime.GC()
			fillCPU += processCPU() - c0
			b.StartTimer()
		}
		post(bodies[i%ring])
	}
	b.StopTimer()
	samples := float64(b.N * len(series))
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/samples, "ns/sample")
	// CPU time of the whole process (GC and the TSDB's goroutines
	// included), steadier than wall time on a shared machine. ×1000 it is
	// the CPU milliseconds per million samples.
	b.ReportMetric(float64((processCPU()-cpu0-fillCPU).Nanoseconds())/samples, "cpu-ns/sample")
}

// BenchmarkIngestOTLP is BenchmarkIngest's DCGM workload (2,000 series a
// request, known series, HA off) sent as the OTel Collector would: an OTLP
// export, gzip, one resource per node (job and instance from service.name
// and service.instance.id), a gauge per metric with the other labels as
// data point attributes. Beside it, the same samples as remote write 2.0.
// The OTLP requests also carry a target_info sample per resource (10 more
// than the 2,000 counted). cpu-ns/sample ×1000 is CPU-ms per million
// samples. Run:
//
//	go test -run XXX -bench 'IngestOTLP' -benchtime 2000x ./pkg/ingest
func BenchmarkIngestOTLP(b *testing.B) {
	for _, c := range []struct {
		name string
		ct   string
		body func([][]string, int64) []byte
	}{{"rw2", ctV2, benchBodyV2}, {"otlp", otlpProtobuf, benchBodyOTLP}} {
		b.Run(c.name, func(b *testing.B) {
			benchIngest(b, newTestIngester(b), c.ct, c.body, false)
		})
	}
}

// benchBodyOTLP is benchBodyV2's samples as a gzipped OTLP export.
func benchBodyOTLP(series [][]string, ts int64) []byte {
	md := pmetric.NewMetrics()
	resources := map[string]pmetric.ScopeMetrics{}
	gauges := map[string]pmetric.Gauge{}
	for i, kv := range series {
		var name, job, instance string
		for k := 0; k+1 < len(kv); k += 2 {
			switch kv[k] {
			case "__name__":
				name = kv[k+1]
			case "job":
				job = kv[k+1]
			case "instance":
				instance = kv[k+1]
			}
		}
		sm, ok := resources[instance]
		if !ok {
			rm := md.ResourceMetrics().AppendEmpty()
			rm.Resource().Attributes().PutStr("service.name", job)
			rm.Resource().Attributes().PutStr("service.instance.id", instance)
			sm = rm.ScopeMetrics().AppendEmpty()
			resources[instance] = sm
		}
		g, ok := gauges[instance+name]
		if !ok {
			m := sm.Metrics().AppendEmpty()
			m.SetName(name)
			g = m.SetEmptyGauge()
			gauges[instance+name] = g
		}
		dp := g.DataPoints().AppendEmpty()
		dp.SetTimestamp(pcommon.Timestamp(ts * 1e6))
		dp.SetDoubleValue(float64(i) + float64(ts%1000)/7)
		for k := 0; k+1 < len(kv); k += 2 {
			if n := kv[k]; n != "__name__" && n != "job" && n != "instance" {
				dp.Attributes().PutStr(n, kv[k+1])
			}
		}
	}
	raw, _ := pmetricotlp.NewExportRequestFromMetrics(md).MarshalProto()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	_, _ = zw.Write(raw)
	_ = zw.Close()
	return buf.Bytes()
}

// twentyRules is a tenant's own rule set of the kind users write for
// dcgm-exporter: drop unused families, drop and rename labels, derive one.
const twentyRules = `
- {source_labels: [__name__], regex: 'DCGM_FI_DEV_VGPU_.+', action: drop}
- {source_labels: [__name__], regex: 'DCGM_FI_DEV_(ENC|DEC)_UTIL', action: drop}
- {source_labels: [__name__], regex: 'DCGM_FI_PROF_NVOFA_.+', action: drop}
- {source_labels: [namespace], regex: 'kube-system|monitoring', action: drop}
- {regex: 'pci_bus_id', action: labeldrop}
- {regex: 'device', action: labeldrop}
- {regex: 'region', action: labeldrop}
- {source_labels: [modelName], regex: 'NVIDIA (.+)', target_label: gpu_model, replacement: '$1'}
- {regex: 'modelName', action: labeldrop}
- {source_labels: [Hostname, gpu], separator: '/', target_label: gpu_id}
- {source_labels: [instance], regex: '([^:]+):.*', target_label: node_ip, replacement: '$1'}
- {regex: 'instance', action: labeldrop}
- {source_labels: [job], regex: 'dcgm-exporter', target_label: exporter, replacement: dcgm}
- {source_labels: [pod], regex: '(.+)-worker-\d+', target_label: training_job, replacement: '$1'}
- {source_labels: [container], regex: '', target_label: container, replacement: none}
- {source_labels: [namespace], regex: 'training', target_label: team, replacement: ml}
- {source_labels: [__name__], regex: 'DCGM_FI_DEV_(.+)', target_label: dcgm_field, replacement: '$1'}
- {regex: 'dcgm_field', action: labeldrop}
- {source_labels: [cluster], regex: '(.+)-prod-\d+', target_label: env, replacement: prod}
- {source_labels: [UUID], regex: 'GPU-(.{8}).*', target_label: uuid_short, replacement: '$1'}
`

// BenchmarkIngestRelabel is the ingest CPU cost of relabeling (v2, HA pair,
// the DCGM series of BenchmarkIngest): no rules, the dcgm preset (which
// also derives the driver info series, 1 per GPU and scrape), and 20 user
// rules; for known series (steady) and for series all new in each request
// (fresh: what relabeling costs per new series). cpu-ns/sample is CPU
// milliseconds per million samples. Run (make bench-relabel):
//
//	go test -run XXX -bench IngestRelabel -benchtime 200x ./pkg/ingest
func BenchmarkIngestRelabel(b *testing.B) {
	for _, fresh := range []bool{false, true} {
		mode := "steady"
		if fresh {
			mode = "fresh"
		}
		for _, c := range []struct{ name, preset, rules string }{{"none", "", ""}, {"dcgm", relabel.PresetDCGM, ""}, {"rules20", "", twentyRules}} {
			b.Run(mode+"/"+c.name, func(b *testing.B) {
				ti := newTestIngester(b, withRules(b, c.preset, c.rules), func(s *testSetup) {
					cfg := hatracker.DefaultConfig()
					s.ha = &cfg
				})
				benchIngest(b, ti, ctV2, benchBodyV2, fresh)
			})
		}
	}
}

// BenchmarkHeadNewSeries is the floor the Prometheus head sets under the
// write path for new series, the cost no receiver built on it can go below:
// the series of IngestRelabel/fresh (a new pod name in each request, one
// sample per series), their labels built before the timer in the tenant's
// symbol table, appended by reference 0 straight into the tenant's TSDB
// (gpustore's options) and committed, a request's worth per commit (the
// WAL's series and samples records included). Set beside
// IngestRelabel/fresh/none's cpu-ns/sample, cpu-ns/series shows what
// gpustore's own path adds; heap-B/series is what the head keeps of a
// series, label-B/series what its labels' data adds. Run after IngestRelabel, so that
// both find the process' memory already mapped (alone, the kernel's faults
// on fresh pages add 2-4 µs per series to cpu-ns/series; make bench-relabel):
//
//	go test -run XXX -bench 'IngestRelabel/fresh/none|HeadNewSeries' -benchtime 500x ./pkg/ingest
func BenchmarkHeadNewSeries(b *testing.B) {
	ti := newTestIngester(b)
	db, err := ti.dbs.Get("bench")
	if err != nil {
		b.Fatal(err)
	}
	series := benchSeries()
	podIdx := slices.Index(series[0], "pod") + 1
	start := time.Now().Add(-3 * time.Hour).UnixMilli()
	sb := labels.NewScratchBuilderWithSymbolTable(db.Symbols(), len(series[0])/2)
	build := func(i int) []labels.Labels {
		out := make([]labels.Labels, len(series))
		for j, kv := range series {
			kv[podIdx] = fmt.Sprintf("job-%d-worker", i)
			sb.Reset()
			for k := 0; k < len(kv); k += 2 {
				sb.Add(kv[k], kv[k+1])
			}
			sb.Sort()
			out[j] = sb.Labels()
		}
		return out
	}
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	h0 := heap()
	requests := make([][]labels.Labels, b.N)
	for i := range requests {
		requests[i] = build(i)
	}
	h1 := heap()
	b.ResetTimer()
	cpu0 := processCPU()
	for i, lsets := range requests {
		app := db.AppenderV2(context.Background())
		for j, ls := range lsets {
			if _, err := app.Append(0, ls, 0, start+int64(i)*1000, float64(j), nil, nil, storage.AOptions{}); err != nil {
				b.Fatal(err)
			}
		}
		if err := app.Commit(); err != nil {
			b.Fatal(err)
		}
	}
	cpu := processCPU() - cpu0
	b.StopTimer()
	n := float64(b.N * len(series))
	b.ReportMetric(float64(cpu.Nanoseconds())/n, "cpu-ns/series")
	b.ReportMetric(float64(heap()-h1)/n, "heap-B/series")
	// The head keeps its own copy of a labels.Labels (in memSeries, counted
	// above); of what the builder allocated it shares the data only.
	b.ReportMetric(float64(h1-h0)/n-float64(unsafe.Sizeof(labels.Labels{})), "label-B/series")
	if got := db.Head().NumSeries(); got != uint64(n) {
		b.Fatalf("head holds %d series, want %.0f", got, n)
	}
	runtime.KeepAlive(requests)
}
