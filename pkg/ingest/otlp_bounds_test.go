package ingest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"

	"github.com/gpustore/gpustore/pkg/limits"
)

// histogramExport is an export of one classic histogram point with bounds
// explicit bounds and attrs attributes, from a training job's resource: the
// shape of issue 38's histogram bomb (20,000 bounds, 2,000 attributes).
func histogramExport(ts time.Time, bounds, attrs int) pmetric.Metrics {
	md := pmetric.NewMetrics()
	rm := md.ResourceMetrics().AppendEmpty()
	rm.Resource().Attributes().PutStr("service.name", "trainer")
	rm.Resource().Attributes().PutStr("service.instance.id", "trainer-0")
	sm := rm.ScopeMetrics().AppendEmpty()
	m := sm.Metrics().AppendEmpty()
	m.SetName("training.step.time")
	m.SetUnit("s")
	h := m.SetEmptyHistogram()
	h.SetAggregationTemporality(pmetric.AggregationTemporalityCumulative)
	dp := h.DataPoints().AppendEmpty()
	dp.SetStartTimestamp(pcommon.NewTimestampFromTime(ts.Add(-time.Hour)))
	dp.SetTimestamp(pcommon.NewTimestampFromTime(ts))
	b, c := make([]float64, bounds), make([]uint64, bounds+1)
	for i := range b {
		b[i] = float64(i+1) / 1000
		c[i] = uint64(i % 3)
	}
	dp.ExplicitBounds().FromRaw(b)
	dp.BucketCounts().FromRaw(c)
	dp.SetCount(uint64(bounds))
	dp.SetSum(float64(bounds) / 2)
	putAttributes(dp.Attributes(), "rank", attrs)
	return md
}

// putAttributes adds n attributes named prefix_0, prefix_1, ... to m.
func putAttributes(m pcommon.Map, prefix string, n int) {
	m.EnsureCapacity(m.Len() + n)
	for i := range n {
		m.PutStr(fmt.Sprintf("%s_%d", prefix, i), fmt.Sprintf("value-%d", i))
	}
}

// gaugeWithAttributes is gpuMetrics' export with n more attributes on
// its first gauge point, its scope or its resource (where: point, scope,
// resource).
func gaugeWithAttributes(ts time.Time, where string, n int) pmetric.Metrics {
	md := gpuMetrics(ts, 60, 1000)
	rm := md.ResourceMetrics().At(0)
	sm := rm.ScopeMetrics().At(0)
	switch where {
	case "point":
		putAttributes(sm.Metrics().At(0).Gauge().DataPoints().At(0).Attributes(), "pod_label", n)
	case "scope":
		putAttributes(sm.Scope().Attributes(), "scope_attr", n)
	case "resource":
		putAttributes(rm.Resource().Attributes(), "k8s.pod.label", n)
	}
	return md
}

// TestOTLPAttributeFloodsRefusedBeforeDecoding: a data point, scope or
// resource with more attributes than a series may have labels is answered
// 400 before pdata decodes the request. Before, Prometheus' translator
// spent time quadratic in a point's attributes: one point of 40,000 took
// 6.7 s, and a 297 KB gzipped export of 120,000 kept a core busy ~50 s
// after its client had gone. Attributes that never become labels (a scope's
// without promote_scope_metadata, a resource's without target_info or
// promotion) are not bounded, and points within the bound are stored.
func TestOTLPAttributeFloodsRefusedBeforeDecoding(t *testing.T) {
	ti := overridesIngester(t, `
overrides:
  scoped:
    otlp:
      promote_scope_metadata: true
  no-target-info:
    otlp:
      disable_target_info: true
`)
	startOverrides(t, ti)
	now := time.Now()
	bound := ti.limits.For("default").MaxLabelNamesPerSeries
	refused := []struct {
		name, tenant string
		md           pmetric.Metrics
	}{
		{"a gauge point of 5,000 attributes", "default", gaugeWithAttributes(now, "point", 5_000)},
		{"a histogram point of 1,000 attributes", "default", histogramExport(now, 10, 1_000)},
		{"a resource of 1,000 attributes, target_info on", "default", gaugeWithAttributes(now, "resource", 1_000)},
		{"a scope of 1,000 attributes, promoted", "scoped", gaugeWithAttributes(now, "scope", 1_000)},
	}
	for _, c := range refused {
		for _, asJSON := range []bool{false, true} {
			body := gzipped(t, otlpBody(t, c.md, asJSON))
			start := time.Now()
			r := ti.postOTLP(t, contentType(asJSON), "gzip", body, "X-Scope-OrgID", c.tenant)
			took := time.Since(start)
			msg := r.body
			if !asJSON && r.code == http.StatusBadRequest {
				msg = otlpStatus(t, r).Message
			}
			if r.code != http.StatusBadRequest || !strings.Contains(msg, "attributes") || !strings.Contains(msg, "max_label_names_per_series") || !strings.Contains(msg, "before decoding") {
				t.Errorf("%s (JSON %v, %d bytes gzipped): answered %d after %s: %.300q; want 400 naming the attribute bound, before decoding", c.name, asJSON, len(body), r.code, took.Round(time.Millisecond), msg)
			}
		}
		if got := ti.stored(t, c.tenant); len(got) != 0 {
			t.Errorf("%s: stored %d series", c.name, len(got))
		}
	}
	stored := []struct {
		name, tenant string
		md           pmetric.Metrics
	}{
		// gpu, UUID, modelName and the attributes, __name__, job, instance:
		// as many labels as a series may have.
		{"a gauge point with attributes up to the bound", "default", gaugeWithAttributes(now, "point", bound-6)},
		{"a scope of 1,000 attributes, not promoted", "default", gaugeWithAttributes(now.Add(time.Second), "scope", 1_000)},
		{"a resource of 200 attributes, no target_info", "no-target-info", gaugeWithAttributes(now, "resource", 200)},
	}
	for _, c := range stored {
		for _, asJSON := range []bool{false, true} {
			r := ti.postOTLP(t, contentType(asJSON), "", otlpBody(t, c.md, asJSON), "X-Scope-OrgID", c.tenant)
			if r.code != http.StatusOK {
				t.Errorf("%s (JSON %v): %d %.300q", c.name, asJSON, r.code, r.body)
			}
		}
	}
	if b := ti.inflight.Bytes(); b != 0 {
		t.Errorf("%d bytes still held in flight", b)
	}
}

// allocatedBy is what f allocates, in bytes (the whole process: tests of
// this package run one at a time).
func allocatedBy(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestOTLPTranslationHeldInFlight: what the translation of an export will
// allocate (series × labels, estimated from its shape before decoding) is
// held in ingest.max_inflight_bytes beside its bytes and pdata's objects.
// Before, four 33 KB exports of one histogram point of 20,000 bounds (and
// 2,000 attributes) took RSS from 0.4 to 2.6 GB outside the bound: the
// bound counted only the bytes and objects. Here one point of 20,000 bounds
// and 30 attributes (~50 MB to translate) meets a bound of 48 MiB: 413, as
// it could never be translated within it, and it allocates a fraction of
// what translating it would; a point of 2,000 bounds passes.
func TestOTLPTranslationHeldInFlight(t *testing.T) {
	ti := newTestIngester(t, func(s *testSetup) {
		s.ingest.MaxRequestBytes = 1 << 20
		s.ingest.MaxDecodedBytes = 8 << 20
		s.ingest.MaxInflightBytes = 48 << 20
	})
	now := time.Now()
	body := gzipped(t, otlpBody(t, histogramExport(now, 20_000, 30), false))
	var r response
	alloc := allocatedBy(func() { r = ti.postOTLP(t, otlpProtobuf, "gzip", body) })
	if r.code != http.StatusRequestEntityTooLarge || !strings.Contains(r.body, "max_inflight_bytes") || r.header.Get("Retry-After") != "" {
		t.Errorf("a %d-byte export of 20,000 buckets: answered %d %.300q; want 413 naming max_inflight_bytes", len(body), r.code, r.body)
	}
	if alloc > 16<<20 {
		t.Errorf("refusing it allocated %d MiB", alloc>>20)
	}
	t.Logf("a %d-byte export of 20,000 buckets: %d, allocated %.1f MiB", len(body), r.code, float64(alloc)/(1<<20))
	if got := ti.stored(t, "default"); len(got) != 0 {
		t.Errorf("stored %d series", len(got))
	}
	if r := ti.postOTLP(t, otlpProtobuf, "gzip", gzipped(t, otlpBody(t, histogramExport(now, 2_000, 30), false))); r.code != http.StatusOK {
		t.Errorf("an export of 2,000 buckets: %d %.300q", r.code, r.body)
	}
	if b := ti.inflight.Bytes(); b != 0 {
		t.Errorf("%d bytes still held in flight", b)
	}
}

// TestPooledRequestsKeepNoLargeBuffers: a large request's buffers (the
// body, inflated and translated, past maxPooledBuffer) and its views (the
// translator's series and symbols, the decoders' views of the body) are
// not kept in the pool for the next request, so the memory comes back once
// it is done. Before, 1.9 GB of four histogram exports stayed live after
// them in pooled buffers; here a 40,000-bucket export and a 150,000-entry
// metadata request left 28.5 MiB in the pooled state.
func TestPooledRequestsKeepNoLargeBuffers(t *testing.T) {
	// One P: the request's state goes back to the pool slot this test
	// takes it from.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	ti := newTestIngester(t, func(s *testSetup) {
		s.ingest.MaxRequestBytes = 16 << 20
		s.ingest.MaxDecodedBytes = 64 << 20
		s.ingest.MaxInflightBytes = 1 << 30
	})
	now := time.Now()
	if r := ti.postOTLP(t, otlpProtobuf, "gzip", gzipped(t, otlpBody(t, histogramExport(now, 15_000, 10), false))); r.code != http.StatusOK {
		t.Fatalf("an export of 15,000 buckets: %d %.300q", r.code, r.body)
	}
	if r := ti.post(t, ctV1, metadataRequest(t, 100_000, 16)); r.code != http.StatusNoContent && r.code != http.StatusBadRequest {
		t.Fatalf("a metadata request: %d %.300q", r.code, r.body)
	}
	rs := ti.pool.Get().(*requestState)
	defer ti.pool.Put(rs)
	largest, views := pooledBytes(rs)
	if largest > maxPooledBuffer || views > 1<<20 {
		t.Errorf("the pooled request state keeps a buffer of %.1f MiB and %.1f MiB of series and views after a large request", float64(largest)/(1<<20), float64(views)/(1<<20))
	}
	t.Logf("the pooled request state keeps a buffer of %.1f MiB at most and %.1f MiB of series and views", float64(largest)/(1<<20), float64(views)/(1<<20))
}

// pooledBytes is what a pooled request state keeps referenced: its
// largest buffer's capacity, and the translator's series and the decoders'
// views.
func pooledBytes(rs *requestState) (largest, views int) {
	largest = max(cap(rs.compressed), cap(rs.decoded), cap(rs.translated))
	views = cap(rs.v1.body) + cap(rs.v1.metadata)*24 + cap(rs.v2.body) + cap(rs.v2.symbols)*24
	if rs.otlp != nil {
		views += cap(rs.otlp.app.req.Timeseries) * int(unsafe.Sizeof(writev2.TimeSeries{}))
		for _, ts := range rs.otlp.app.req.Timeseries[:cap(rs.otlp.app.req.Timeseries)] {
			views += cap(ts.LabelsRefs) * 4
		}
		for _, s := range rs.otlp.app.symbols.Symbols() {
			views += len(s) + 16 + 32 // the string, its header, its map entry
		}
	}
	return largest, views
}

// TestOTLPShapeCoversTranslation: what the scan estimates the translation
// allocates covers what it does allocate, for histograms of many buckets
// and attributes, summaries and realistic exports, and stays within 4x of it
// for a DCGM export, so the in-flight bound does not refuse the traffic it
// is meant to let through. A translator upgrade that allocates more per
// series or label fails here.
func TestOTLPShapeCoversTranslation(t *testing.T) {
	now := time.Now()
	summary := pmetric.NewMetrics()
	sp := summary.ResourceMetrics().AppendEmpty().ScopeMetrics().AppendEmpty().Metrics().AppendEmpty()
	sp.SetName("rpc.latency")
	points := sp.SetEmptySummary().DataPoints()
	for p := range 200 {
		dp := points.AppendEmpty()
		dp.SetTimestamp(pcommon.NewTimestampFromTime(now))
		putAttributes(dp.Attributes(), fmt.Sprintf("method_%d", p), 5)
		for q := range 20 {
			v := dp.QuantileValues().AppendEmpty()
			v.SetQuantile(float64(q) / 20)
			v.SetValue(float64(q))
		}
	}
	dcgm, err := gunzipAll(benchBodyOTLP(benchSeries(), now.UnixMilli()))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		body []byte
	}{
		{"histogram, 20,000 bounds, 40 attributes", otlpBody(t, histogramExport(now, 20_000, 40), false)},
		{"histogram, 2,000 bounds, 48 attributes", otlpBody(t, histogramExport(now, 2_000, 48), false)},
		{"histogram, 10 bounds, no attributes", otlpBody(t, histogramExport(now, 10, 0), false)},
		{"summaries, 200 points of 20 quantiles", otlpBody(t, summary, false)},
		{"gauges, sums and histograms", otlpBody(t, gpuMetrics(now, 60, 1000), false)},
		{"DCGM", dcgm},
	}
	for _, c := range cases {
		shape, err := scanOTLP(c.body, false, otlpBoundsOf(limits.Defaults()))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		req := pmetricotlp.NewExportRequest()
		if err := req.UnmarshalProto(c.body); err != nil {
			t.Fatal(err)
		}
		tr := newOTLPTranslation()
		var body []byte
		got := allocatedBy(func() {
			body, err = tr.translate(t.Context(), req.Metrics(), limits.DefaultOTLP(), 5*time.Minute, 0, nil, nil)
		})
		if err != nil || len(body) == 0 {
			t.Fatalf("%s: %v", c.name, err)
		}
		est := shape.translationBytes()
		if int64(got) > est || (c.name == "DCGM" && est > 4*int64(got)) {
			t.Errorf("%s: the translation allocates %d bytes, estimated %d (%d series, %d labels)", c.name, got, est, shape.series, shape.labels)
		}
		t.Logf("%s: the translation allocates %d bytes, estimated %d (%.2fx; %d series, %d labels)", c.name, got, est, float64(est)/float64(got), shape.series, shape.labels)
	}
}

// TestOTLPTranslationStopsWhenTheClientLeaves: the translation watches the
// request's context: an export of 20,000 points whose client has gone is
// not translated. (Before, a point's attributes were not bounded, and one
// point of 120,000 kept a core busy ~50 s after its client had gone: the
// translator looks at the context between points.)
func TestOTLPTranslationStopsWhenTheClientLeaves(t *testing.T) {
	md := pmetric.NewMetrics()
	points := md.ResourceMetrics().AppendEmpty().ScopeMetrics().AppendEmpty().Metrics().AppendEmpty()
	points.SetName("DCGM_FI_DEV_GPU_TEMP")
	dps := points.SetEmptyGauge().DataPoints()
	for i := range 20_000 {
		dp := dps.AppendEmpty()
		dp.SetTimestamp(pcommon.NewTimestampFromTime(time.Now()))
		dp.Attributes().PutStr("gpu", fmt.Sprint(i))
	}
	ctx, leave := context.WithCancel(t.Context())
	leave()
	var spent int64 // what the series appended cost, counted by the translation
	count := func(n int64) error { spent = n; return nil }
	_, err := newOTLPTranslation().translate(ctx, md, limits.DefaultOTLP(), 5*time.Minute, 0, count, nil)
	// The translator looks every 128 points.
	if series := spent / (otlpSeriesBytes + 4*otlpLabelBytes); !errors.Is(err, context.Canceled) || series > 256 {
		t.Errorf("~%d of 20,000 series translated for a client that left: %v", series, err)
	}
}
