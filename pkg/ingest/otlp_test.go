package ingest

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/grafana/dskit/services"
	"github.com/prometheus/prometheus/storage"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/gpustore/gpustore/pkg/hatracker"
)

// gpuMetrics is an export of one GPU node as an OTel Collector's dcgm
// pipeline sends it: a resource (service, host, k8s attributes), a gauge
// per GPU, a cumulative counter, a classic and an exponential histogram,
// all at ts.
func gpuMetrics(ts time.Time, temp float64, energy int64) pmetric.Metrics {
	md := pmetric.NewMetrics()
	rm := md.ResourceMetrics().AppendEmpty()
	res := rm.Resource().Attributes()
	res.PutStr("service.name", "dcgm-exporter")
	res.PutStr("service.instance.id", "node-0:9400")
	res.PutStr("host.name", "node-0")
	res.PutStr("k8s.namespace.name", "gpu-operator")
	sm := rm.ScopeMetrics().AppendEmpty()
	sm.Scope().SetName("dcgm")
	now := pcommon.NewTimestampFromTime(ts)
	start := pcommon.NewTimestampFromTime(ts.Add(-time.Hour))

	g := sm.Metrics().AppendEmpty()
	g.SetName("DCGM_FI_DEV_GPU_TEMP")
	g.SetDescription("GPU temperature (in C).")
	gauge := g.SetEmptyGauge()
	for gpu := range 2 {
		dp := gauge.DataPoints().AppendEmpty()
		dp.SetTimestamp(now)
		dp.SetDoubleValue(temp + float64(gpu))
		dp.Attributes().PutStr("gpu", fmt.Sprint(gpu))
		dp.Attributes().PutStr("UUID", fmt.Sprintf("GPU-%d", gpu))
		dp.Attributes().PutStr("modelName", "NVIDIA H100 80GB HBM3")
	}

	c := sm.Metrics().AppendEmpty()
	c.SetName("gpu.energy")
	c.SetUnit("mJ")
	sum := c.SetEmptySum()
	sum.SetIsMonotonic(true)
	sum.SetAggregationTemporality(pmetric.AggregationTemporalityCumulative)
	cdp := sum.DataPoints().AppendEmpty()
	cdp.SetStartTimestamp(start)
	cdp.SetTimestamp(now)
	cdp.SetIntValue(energy)
	cdp.Attributes().PutStr("gpu", "0")

	h := sm.Metrics().AppendEmpty()
	h.SetName("training.iteration.time")
	h.SetUnit("s")
	hist := h.SetEmptyHistogram()
	hist.SetAggregationTemporality(pmetric.AggregationTemporalityCumulative)
	hdp := hist.DataPoints().AppendEmpty()
	hdp.SetStartTimestamp(start)
	hdp.SetTimestamp(now)
	hdp.ExplicitBounds().FromRaw([]float64{0.1, 0.5, 1})
	hdp.BucketCounts().FromRaw([]uint64{1, 2, 3, 4})
	hdp.SetCount(10)
	hdp.SetSum(12.5)

	e := sm.Metrics().AppendEmpty()
	e.SetName("inference.latency")
	e.SetUnit("s")
	eh := e.SetEmptyExponentialHistogram()
	eh.SetAggregationTemporality(pmetric.AggregationTemporalityCumulative)
	edp := eh.DataPoints().AppendEmpty()
	edp.SetStartTimestamp(start)
	edp.SetTimestamp(now)
	edp.SetScale(2)
	edp.SetZeroCount(1)
	edp.Positive().SetOffset(0)
	edp.Positive().BucketCounts().FromRaw([]uint64{1, 2, 3})
	edp.SetCount(7)
	edp.SetSum(3.5)
	return md
}

func otlpBody(t testing.TB, md pmetric.Metrics, asJSON bool) []byte {
	t.Helper()
	req := pmetricotlp.NewExportRequestFromMetrics(md)
	var b []byte
	var err error
	if asJSON {
		b, err = req.MarshalJSON()
	} else {
		b, err = req.MarshalProto()
	}
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func gzipped(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// postOTLP sends body to the OTLP path; headers are name, value pairs.
func (ti *testIngester) postOTLP(t testing.TB, contentType, encoding string, body []byte, headers ...string) response {
	t.Helper()
	mux := http.NewServeMux()
	ti.RegisterRoutes(mux)
	req := httptest.NewRequest(http.MethodPost, "/otlp/v1/metrics", bytes.NewReader(body))
	req.Header.Set("Content-Type", contentType)
	if encoding != "" {
		req.Header.Set("Content-Encoding", encoding)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, req)
	return response{rec.Code, rec.Body.String(), rec.Header()}
}

// otlpStatus is the google.rpc.Status of a failed protobuf answer.
func otlpStatus(t testing.TB, r response) *statuspb.Status {
	t.Helper()
	var s statuspb.Status
	if err := proto.Unmarshal([]byte(r.body), &s); err != nil {
		t.Fatalf("answer %d is not a google.rpc.Status: %v (%q)", r.code, err, r.body)
	}
	return &s
}

// partialSuccess is the partial_success of a 200 protobuf answer.
func partialSuccess(t testing.TB, r response) pmetricotlp.ExportPartialSuccess {
	t.Helper()
	resp := pmetricotlp.NewExportResponse()
	if err := resp.UnmarshalProto([]byte(r.body)); err != nil {
		t.Fatalf("answer is not an ExportMetricsServiceResponse: %v", err)
	}
	return resp.PartialSuccess()
}

// The series of an export are named and labeled as Prometheus' translator
// names them (suffixes, job/instance from the resource, target_info), the
// histograms are stored as such, and protobuf, JSON and gzip bodies store
// the same.
func TestOTLPStoresTranslatedSeries(t *testing.T) {
	ti := newTestIngester(t)
	ts := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	cases := []struct {
		tenant, ct, enc string
		body            []byte
	}{
		{"proto", otlpProtobuf, "", otlpBody(t, gpuMetrics(ts, 60, 1000), false)},
		{"json", otlpJSON, "", otlpBody(t, gpuMetrics(ts, 60, 1000), true)},
		{"gzip", otlpProtobuf, "gzip", gzipped(t, otlpBody(t, gpuMetrics(ts, 60, 1000), false))},
	}
	for _, c := range cases {
		r := ti.postOTLP(t, c.ct, c.enc, c.body, "X-Scope-OrgID", c.tenant)
		if r.code != http.StatusOK {
			t.Fatalf("%s: %d %q", c.tenant, r.code, r.body)
		}
	}
	want := map[string][]float64{
		`{UUID="GPU-0", __name__="DCGM_FI_DEV_GPU_TEMP", gpu="0", instance="node-0:9400", job="dcgm-exporter", modelName="NVIDIA H100 80GB HBM3"}`: {60},
		`{UUID="GPU-1", __name__="DCGM_FI_DEV_GPU_TEMP", gpu="1", instance="node-0:9400", job="dcgm-exporter", modelName="NVIDIA H100 80GB HBM3"}`: {61},
		`{__name__="gpu_energy_mJ_total", gpu="0", instance="node-0:9400", job="dcgm-exporter"}`:                                                   {1000},
		`{__name__="inference_latency_seconds", instance="node-0:9400", job="dcgm-exporter"}`:                                                      {-1},
		`{__name__="target_info", host_name="node-0", instance="node-0:9400", job="dcgm-exporter", k8s_namespace_name="gpu-operator"}`:             {1},
		`{__name__="training_iteration_time_seconds_count", instance="node-0:9400", job="dcgm-exporter"}`:                                          {10},
		`{__name__="training_iteration_time_seconds_sum", instance="node-0:9400", job="dcgm-exporter"}`:                                            {12.5},
	}
	for le, n := range map[string]float64{"0.1": 1, "0.5": 3, "1": 6, "+Inf": 10} {
		want[fmt.Sprintf(`{__name__="training_iteration_time_seconds_bucket", instance="node-0:9400", job="dcgm-exporter", le="%s"}`, le)] = []float64{n}
	}
	for _, c := range cases {
		got := ti.stored(t, c.tenant)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: stored\n%v\nwant\n%v", c.tenant, got, want)
		}
	}
	// The metadata goes to the tenant's store, by family.
	db := ti.dbs.Existing("proto")
	if m, ok := db.Metadata.Get("training_iteration_time_seconds"); !ok || m.Type != "histogram" || m.Unit != "seconds" {
		t.Errorf("metadata of the histogram family: %+v", m)
	}
}

// Bodies that are not an export request are refused whole with the 4xx
// the OTLP specification names (the exporter does not retry them) and a
// google.rpc.Status; nothing of them is stored.
func TestOTLPBadBodies(t *testing.T) {
	ti := newTestIngester(t, func(s *testSetup) {
		s.ingest.MaxRequestBytes = 1 << 20
		s.ingest.MaxDecodedBytes = 4 << 20
		s.ingest.MaxInflightBytes = 8 << 20
	})
	good := otlpBody(t, gpuMetrics(time.Now(), 60, 1000), false)
	bomb := gzipped(t, make([]byte, 64<<20)) // 64 MiB of zeros in ~64 KiB
	cases := []struct {
		name, ct, enc string
		body          []byte
		code          int
	}{
		{"truncated protobuf", otlpProtobuf, "", good[:len(good)-7], http.StatusBadRequest},
		{"protobuf sent as JSON", otlpJSON, "", good, http.StatusBadRequest},
		{"broken JSON", otlpJSON, "", []byte(`{"resourceMetrics":[{"resource":`), http.StatusBadRequest},
		{"JSON of the wrong shape", otlpJSON, "", []byte(`{"resourceMetrics":"gpu"}`), http.StatusBadRequest},
		{"text", "text/plain", "", good, http.StatusUnsupportedMediaType},
		{"snappy", otlpProtobuf, "snappy", good, http.StatusUnsupportedMediaType},
		{"corrupt gzip", otlpProtobuf, "gzip", good, http.StatusBadRequest},
		{"cut gzip", otlpProtobuf, "gzip", gzipped(t, good)[:40], http.StatusBadRequest},
		{"gzip bomb", otlpProtobuf, "gzip", bomb, http.StatusRequestEntityTooLarge},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := ti.postOTLP(t, c.ct, c.enc, c.body)
			if r.code != c.code {
				t.Fatalf("answered %d %q, want %d", r.code, r.body, c.code)
			}
			if r.header.Get("Retry-After") != "" {
				t.Errorf("a permanent failure carries Retry-After")
			}
			if c.ct != otlpJSON {
				if s := otlpStatus(t, r); s.Message == "" {
					t.Errorf("status without a message")
				}
			}
			if got := ti.stored(t, "default"); len(got) != 0 {
				t.Errorf("stored %v", got)
			}
		})
	}
	if b := ti.inflight.Bytes(); b != 0 {
		t.Errorf("%d bytes still held in flight", b)
	}
}

// A request whose data is partly rejected stores the rest and answers 200
// with partial_success counting and naming the rejected points; one whose
// data is all rejected answers 400.
func TestOTLPPartialSuccess(t *testing.T) {
	ti := newTestIngester(t)
	ts := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	if r := ti.postOTLP(t, otlpProtobuf, "", otlpBody(t, gpuMetrics(ts, 60, 1000), false)); r.code != http.StatusOK {
		t.Fatalf("%d %q", r.code, r.body)
	}
	// Older than what is stored: every float sample out of order.
	r := ti.postOTLP(t, otlpProtobuf, "", otlpBody(t, gpuMetrics(ts.Add(-time.Second), 70, 900), false))
	if r.code != http.StatusBadRequest || !strings.Contains(otlpStatus(t, r).Message, "out_of_order") {
		t.Fatalf("all out of order: %d %q", r.code, r.body)
	}

	// A delta counter beside a newer gauge: the tenant does not convert
	// deltas, so its points are rejected and the rest stored.
	md := gpuMetrics(ts.Add(time.Second), 65, 1100)
	sum := md.ResourceMetrics().At(0).ScopeMetrics().At(0).Metrics().At(1).Sum()
	sum.SetAggregationTemporality(pmetric.AggregationTemporalityDelta)
	r = ti.postOTLP(t, otlpProtobuf, "", otlpBody(t, md, false))
	if r.code != http.StatusOK {
		t.Fatalf("partial: %d %q", r.code, r.body)
	}
	ps := partialSuccess(t, r)
	if ps.RejectedDataPoints() != 1 || !strings.Contains(ps.ErrorMessage(), "delta") || !strings.Contains(ps.ErrorMessage(), "gpu.energy") {
		t.Errorf("partial success %d %q", ps.RejectedDataPoints(), ps.ErrorMessage())
	}
	got := ti.stored(t, "default")
	if v := got[`{UUID="GPU-0", __name__="DCGM_FI_DEV_GPU_TEMP", gpu="0", instance="node-0:9400", job="dcgm-exporter", modelName="NVIDIA H100 80GB HBM3"}`]; fmt.Sprint(v) != "[60 65]" {
		t.Errorf("gauge %v", v)
	}
	if v := got[`{__name__="gpu_energy_mJ_total", gpu="0", instance="node-0:9400", job="dcgm-exporter"}`]; fmt.Sprint(v) != "[1000]" {
		t.Errorf("counter %v: the delta point was stored", v)
	}
}

// writeOverrides starts an ingester whose limits overrides file holds yaml.
func overridesIngester(t *testing.T, yaml string, mutate ...func(*testSetup)) *testIngester {
	t.Helper()
	file := filepath.Join(t.TempDir(), "overrides.yaml")
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return newTestIngester(t, append([]func(*testSetup){func(s *testSetup) {
		s.limits.OverridesFile = file
	}}, mutate...)...)
}

// A tenant's OTLP settings in the limits overrides choose the translation:
// Prometheus' names and semantics (UTF-8 names kept, promoted resource
// attributes, no target_info), and delta sums converted to cumulative.
func TestOTLPTenantSettings(t *testing.T) {
	ti := overridesIngester(t, `
overrides:
  utf8:
    otlp:
      translation_strategy: NoUTF8EscapingWithSuffixes
      promote_resource_attributes: [k8s.namespace.name]
      disable_target_info: true
  delta:
    otlp:
      convert_delta_to_cumulative: true
`)
	startOverrides(t, ti)
	ts := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	if r := ti.postOTLP(t, otlpProtobuf, "", otlpBody(t, gpuMetrics(ts, 60, 1000), false), "X-Scope-OrgID", "utf8"); r.code != http.StatusOK {
		t.Fatalf("%d %q", r.code, r.body)
	}
	got := ti.stored(t, "utf8")
	if _, ok := got[`{__name__="gpu.energy_mJ_total", gpu="0", instance="node-0:9400", job="dcgm-exporter", "k8s.namespace.name"="gpu-operator"}`]; !ok {
		t.Errorf("UTF-8 name with the promoted attribute missing: %v", got)
	}
	for s := range got {
		if strings.Contains(s, "target_info") {
			t.Errorf("target_info stored with disable_target_info: %s", s)
		}
	}

	for k, v := range []int64{5, 7} {
		md := gpuMetrics(ts.Add(time.Duration(k)*time.Second), 60, v)
		sum := md.ResourceMetrics().At(0).ScopeMetrics().At(0).Metrics().At(1).Sum()
		sum.SetAggregationTemporality(pmetric.AggregationTemporalityDelta)
		sum.DataPoints().At(0).SetStartTimestamp(pcommon.NewTimestampFromTime(ts.Add(time.Duration(k-1) * time.Second)))
		if r := ti.postOTLP(t, otlpProtobuf, "", otlpBody(t, md, false), "X-Scope-OrgID", "delta"); r.code != http.StatusOK || partialSuccess(t, r).ErrorMessage() != "" {
			t.Fatalf("delta %d: %d %q", k, r.code, r.body)
		}
	}
	if v := ti.stored(t, "delta")[`{__name__="gpu_energy_mJ_total", gpu="0", instance="node-0:9400", job="dcgm-exporter"}`]; fmt.Sprint(v) != "[5 12]" {
		t.Errorf("delta counter stored as %v, want the running totals [5 12]", v)
	}
}

// An export goes through the tenant's limits like a remote write: the
// series per request, the ingestion rate (429 with Retry-After, which OTLP
// exporters retry), the relabel rules.
func TestOTLPLimitsAndRelabel(t *testing.T) {
	ti := overridesIngester(t, `
overrides:
  small:
    max_series_per_request: 3
  slow:
    ingestion_rate: 1
    ingestion_burst_size: 5
    rate_limit_status_code: 429
  relabeled:
    metric_relabel_configs:
      - action: labeldrop
        regex: modelName
      - source_labels: [__name__]
        regex: target_info
        action: drop
`)
	startOverrides(t, ti)
	body := otlpBody(t, gpuMetrics(time.Now().Add(-time.Minute), 60, 1000), false)
	r := ti.postOTLP(t, otlpProtobuf, "", body, "X-Scope-OrgID", "small")
	if r.code != http.StatusBadRequest || !strings.Contains(otlpStatus(t, r).Message, "max_series_per_request") || len(ti.stored(t, "small")) != 0 {
		t.Errorf("series per request: %d %q", r.code, r.body)
	}
	r = ti.postOTLP(t, otlpProtobuf, "", body, "X-Scope-OrgID", "slow")
	if r.code != http.StatusTooManyRequests || r.header.Get("Retry-After") == "" || len(ti.stored(t, "slow")) != 0 {
		t.Errorf("rate: %d %q Retry-After %q", r.code, r.body, r.header.Get("Retry-After"))
	}
	if r = ti.postOTLP(t, otlpProtobuf, "", body, "X-Scope-OrgID", "relabeled"); r.code != http.StatusOK {
		t.Fatalf("relabeled: %d %q", r.code, r.body)
	}
	for s := range ti.stored(t, "relabeled") {
		if strings.Contains(s, "modelName") || strings.Contains(s, "target_info") {
			t.Errorf("relabel rules not applied: %s", s)
		}
	}
}

// The two replicas of an HA pair (cluster and __replica__ as data point
// attributes, as a Collector pair adds them) are deduplicated: one copy of
// each series, without the replica label.
func TestOTLPHADedup(t *testing.T) {
	ti := newTestIngester(t, func(s *testSetup) {
		cfg := hatracker.DefaultConfig()
		cfg.Enabled = true
		s.ha = &cfg
	})
	ts := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	for k, replica := range []string{"a", "b"} {
		md := gpuMetrics(ts.Add(time.Duration(k)*time.Second), float64(60+k), 1000)
		md.ResourceMetrics().At(0).Resource().Attributes().PutStr("cluster", "gpu-east")
		ms := md.ResourceMetrics().At(0).ScopeMetrics().At(0).Metrics()
		for m := range ms.Len() {
			if ms.At(m).Type() == pmetric.MetricTypeGauge {
				for p := range ms.At(m).Gauge().DataPoints().Len() {
					a := ms.At(m).Gauge().DataPoints().At(p).Attributes()
					a.PutStr("cluster", "gpu-east")
					a.PutStr("__replica__", replica)
				}
			}
		}
		if r := ti.postOTLP(t, otlpProtobuf, "", otlpBody(t, md, false)); r.code != http.StatusOK || partialSuccess(t, r).ErrorMessage() != "" {
			t.Fatalf("replica %s: %d %q", replica, r.code, r.body)
		}
	}
	n := 0
	for s, v := range ti.stored(t, "default") {
		if strings.Contains(s, "DCGM_FI_DEV_GPU_TEMP") {
			n++
			if strings.Contains(s, "__replica__") || fmt.Sprint(v) == "[60 61]" || len(v) != 1 {
				t.Errorf("HA pair not deduplicated: %s %v", s, v)
			}
		}
	}
	if n != 2 {
		t.Errorf("%d GPU series, want 2", n)
	}
}

// A storage fault is answered 503 with Retry-After (OTLP exporters retry
// it; they do not retry the 500 remote write answers), nothing stored.
func TestOTLPStorageFaultIsRetried(t *testing.T) {
	ti := newTestIngester(t)
	var f *faultyAppendable
	ti.wrapAppendable(t, "default", func(a storage.AppendableV2) storage.AppendableV2 {
		f = newFaultyAppendable(a)
		return f
	})
	f.appendsBeforeFault.Store(3)
	r := ti.postOTLP(t, otlpProtobuf, "", otlpBody(t, gpuMetrics(time.Now(), 60, 1000), false))
	if r.code != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" || otlpStatus(t, r).Code != 14 {
		t.Fatalf("%d %q Retry-After %q", r.code, r.body, r.header.Get("Retry-After"))
	}
	if got := ti.stored(t, "default"); len(got) != 0 {
		t.Errorf("stored %v", got)
	}
}

// startOverrides runs the ingester's limits service (it loads the file).
func startOverrides(t *testing.T, ti *testIngester) {
	t.Helper()
	if err := services.StartAndAwaitRunning(t.Context(), ti.limits); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = services.StopAndAwaitTerminated(t.Context(), ti.limits) })
}

// Prometheus' translator writes a resource's target_info every half
// lookback delta from its earliest point to its latest: one point stamped
// in 1970 beside one of today would be twelve million samples, half a
// gigabyte of series before the store could count them. The translation
// stops at max_series_per_request (400) or once what it appended passes the
// in-flight bound (413), holding little.
func TestOTLPTargetInfoSpanIsBounded(t *testing.T) {
	ti := newTestIngester(t, func(s *testSetup) {
		s.ingest.MaxRequestBytes = 1 << 20
		s.ingest.MaxDecodedBytes = 4 << 20
		s.ingest.MaxInflightBytes = 8 << 20
	})
	md := gpuMetrics(time.Now(), 60, 1000)
	g := md.ResourceMetrics().At(0).ScopeMetrics().At(0).Metrics().At(0).Gauge()
	g.DataPoints().At(1).SetTimestamp(pcommon.Timestamp(time.Second))
	// Whichever bound it meets first: the series or the bytes they take.
	r := ti.postOTLP(t, otlpProtobuf, "", otlpBody(t, md, false))
	if msg := otlpStatus(t, r).Message; !(r.code == http.StatusBadRequest && strings.Contains(msg, "max_series_per_request")) &&
		!(r.code == http.StatusRequestEntityTooLarge && strings.Contains(msg, "max_inflight_bytes")) {
		t.Fatalf("%d %q", r.code, r.body)
	}
	if got := ti.stored(t, "default"); len(got) != 0 {
		t.Errorf("stored %d series", len(got))
	}
}

// TestOTLPRefusalsAreStatuses: what the server refuses on the OTLP paths
// before the handler (pkg/server's ErrorAnswerer: no or wrong credentials,
// the rate limit) is answered as every OTLP failure, a google.rpc.Status in
// the request's encoding, with its headers kept. Before, the 401 was text.
func TestOTLPRefusalsAreStatuses(t *testing.T) {
	for _, asJSON := range []bool{false, true} {
		req := httptest.NewRequest(http.MethodPost, "/otlp/v1/metrics", nil)
		req.Header.Set("Content-Type", contentType(asJSON))
		rec := httptest.NewRecorder()
		rec.Header().Set("WWW-Authenticate", `Basic realm="gpustore"`)
		otlpHandler{}.AnswerError(rec, req, http.StatusUnauthorized, "Unauthorized")
		var s statuspb.Status
		var err error
		if asJSON {
			err = protojson.Unmarshal(rec.Body.Bytes(), &s)
		} else {
			err = proto.Unmarshal(rec.Body.Bytes(), &s)
		}
		if err != nil || rec.Code != http.StatusUnauthorized || s.Code != 16 || s.Message != "Unauthorized" ||
			rec.Header().Get("Content-Type") != contentType(asJSON) || rec.Header().Get("WWW-Authenticate") == "" {
			t.Errorf("JSON %v: %d %q (%v), Content-Type %q", asJSON, rec.Code, rec.Body, err, rec.Header().Get("Content-Type"))
		}
	}
}
