package ingest

import (
	"math"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/golang/snappy"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
	"github.com/prometheus/prometheus/tsdb/tsdbutil"

	"github.com/gpustore/gpustore/pkg/tenancy"
)

func TestV1RoundTrip(t *testing.T) {
	ti := newTestIngester(t)
	now := nowMs()
	req := &prompb.WriteRequest{
		Timeseries: []prompb.TimeSeries{
			v1Series([]prompb.Sample{{Timestamp: now - 2000, Value: 71}, {Timestamp: now - 1000, Value: 72.5}},
				"__name__", "DCGM_FI_DEV_GPU_TEMP", "Hostname", "node-1", "gpu", "0"),
			// Unsorted labels are sorted, not rejected.
			v1Series([]prompb.Sample{{Timestamp: now, Value: 300}},
				"gpu", "1", "__name__", "DCGM_FI_DEV_POWER_USAGE", "Hostname", "node-1"),
		},
		Metadata: []prompb.MetricMetadata{{Type: prompb.MetricMetadata_GAUGE, MetricFamilyName: "DCGM_FI_DEV_GPU_TEMP", Help: "GPU temperature (in C).", Unit: "celsius"}},
	}
	resp := ti.post(t, ctV1, encodeV1(t, req))
	if resp.code != http.StatusNoContent {
		t.Fatalf("status %d: %s", resp.code, resp.body)
	}
	got := ti.stored(t, "default")
	want := map[string][]float64{
		`{Hostname="node-1", __name__="DCGM_FI_DEV_GPU_TEMP", gpu="0"}`:    {71, 72.5},
		`{Hostname="node-1", __name__="DCGM_FI_DEV_POWER_USAGE", gpu="1"}`: {300},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("stored %v, want %v", got, want)
	}
	md, ok := ti.dbs.Existing("default").Metadata.Get("DCGM_FI_DEV_GPU_TEMP")
	if !ok || md.Type != "gauge" || md.Unit != "celsius" || md.Help != "GPU temperature (in C)." {
		t.Fatalf("metadata %+v %v", md, ok)
	}

	// The same series again: served by the series cache, still stored right.
	req.Timeseries[0].Samples = []prompb.Sample{{Timestamp: now, Value: 73}}
	req.Timeseries[1].Samples = []prompb.Sample{{Timestamp: now + 1000, Value: 310}}
	if resp := ti.post(t, ctV1, encodeV1(t, req)); resp.code != http.StatusNoContent {
		t.Fatalf("status %d: %s", resp.code, resp.body)
	}
	got = ti.stored(t, "default")
	want[`{Hostname="node-1", __name__="DCGM_FI_DEV_GPU_TEMP", gpu="0"}`] = []float64{71, 72.5, 73}
	want[`{Hostname="node-1", __name__="DCGM_FI_DEV_POWER_USAGE", gpu="1"}`] = []float64{300, 310}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("stored %v, want %v", got, want)
	}
}

func TestV2RoundTripWithHistogramsExemplarsAndHeaders(t *testing.T) {
	ti := newTestIngester(t)
	now := nowMs()
	b := newV2Builder()
	b.add(writev2.TimeSeries{
		Samples:   []writev2.Sample{{Value: 1e6, Timestamp: now - 1000, StartTimestamp: now - 60000}, {Value: 2e6, Timestamp: now}},
		Exemplars: []writev2.Exemplar{{LabelsRefs: []uint32{b.ref("trace_id"), b.ref("abc123")}, Value: 2e6, Timestamp: now}},
		Metadata:  writev2.Metadata{Type: writev2.Metadata_METRIC_TYPE_COUNTER, HelpRef: b.ref("Total energy consumption since boot (in mJ)."), UnitRef: b.ref("")},
	}, "__name__", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Hostname", "node-2", "gpu", "3")
	h := tsdbutil.GenerateTestHistogram(1)
	fh := tsdbutil.GenerateTestFloatHistogram(2)
	b.add(writev2.TimeSeries{
		Histograms: []writev2.Histogram{writev2.FromIntHistogram(0, now-1000, h), writev2.FromFloatHistogram(0, now, fh)},
		Metadata:   writev2.Metadata{Type: writev2.Metadata_METRIC_TYPE_HISTOGRAM},
	}, "__name__", "training_iteration_time_seconds", "job_name", "llama", "rank", "0")
	resp := ti.post(t, ctV2, encodeV2(t, b.build()))
	if resp.code != http.StatusNoContent {
		t.Fatalf("status %d: %s", resp.code, resp.body)
	}
	for hdr, want := range map[string]string{headerSamplesWritten: "2", headerHistogramsWritten: "2", headerExemplarsWritten: "1"} {
		if got := resp.header.Get(hdr); got != want {
			t.Errorf("%s = %q, want %q", hdr, got, want)
		}
	}
	got := ti.stored(t, "default")
	want := map[string][]float64{
		`{Hostname="node-2", __name__="DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", gpu="3"}`: {1e6, 2e6},
		`{__name__="training_iteration_time_seconds", job_name="llama", rank="0"}`:      {-1, -1},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("stored %v, want %v", got, want)
	}
	md, ok := ti.dbs.Existing("default").Metadata.Get("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
	if !ok || md.Type != "counter" || md.Help != "Total energy consumption since boot (in mJ)." {
		t.Fatalf("metadata %+v", md)
	}
	if _, ok := ti.dbs.Existing("default").Metadata.Get("training_iteration_time_seconds"); !ok {
		t.Fatal("histogram metadata missing")
	}
	eq, err := ti.dbs.Existing("default").ExemplarQuerier(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	res, err := eq.Select(0, math.MaxInt64, []*labels.Matcher{labels.MustNewMatcher(labels.MatchEqual, "__name__", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 || len(res[0].Exemplars) != 1 || res[0].Exemplars[0].Labels.Get("trace_id") != "abc123" || res[0].Exemplars[0].Value != 2e6 {
		t.Fatalf("exemplars %+v", res)
	}
}

func TestTenantRouting(t *testing.T) {
	ti := newTestIngester(t)
	now := nowMs()
	body := encodeV1(t, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{
		v1Series([]prompb.Sample{{Timestamp: now, Value: 1}}, "__name__", "up"),
	}})
	for _, c := range []struct {
		headers []string
		tenant  string
	}{
		{nil, "default"},
		{[]string{tenancy.OrgIDHeader, "team-a"}, "team-a"},
		{[]string{tenancy.ThanosTenantHeader, "team-b"}, "team-b"},
		{[]string{tenancy.OrgIDHeader, "team-c", tenancy.ThanosTenantHeader, "team-b"}, "team-c"},
	} {
		if resp := ti.post(t, ctV1, body, c.headers...); resp.code != http.StatusNoContent {
			t.Fatalf("%v: status %d: %s", c.headers, resp.code, resp.body)
		}
		if got := ti.stored(t, c.tenant); len(got) != 1 {
			t.Fatalf("tenant %s has %v", c.tenant, got)
		}
	}
	if got := ti.dbs.Tenants(); !reflect.DeepEqual(got, []string{"default", "team-a", "team-b", "team-c"}) {
		t.Fatalf("tenants %v", got)
	}
	if resp := ti.post(t, ctV1, body, tenancy.OrgIDHeader, "../etc"); resp.code != http.StatusBadRequest {
		t.Fatalf("invalid tenant: status %d", resp.code)
	}

	// With a closed tenant list, others are refused and nothing is created.
	closed := newTestIngester(t, func(s *testSetup) { s.tenants.Allowed = []string{"gpu-prod"} })
	if resp := closed.post(t, ctV1, body, tenancy.OrgIDHeader, "stranger"); resp.code != http.StatusUnauthorized || !strings.Contains(resp.body, "unknown tenant") {
		t.Fatalf("unknown tenant: status %d %q", resp.code, resp.body)
	}
	if len(closed.dbs.Tenants()) != 0 {
		t.Fatalf("tenants created: %v", closed.dbs.Tenants())
	}
}

func TestBadInput(t *testing.T) {
	now := nowMs()
	good := v1Series([]prompb.Sample{{Timestamp: now, Value: 1}}, "__name__", "DCGM_FI_DEV_GPU_UTIL", "gpu", "0")
	goodKey := `{__name__="DCGM_FI_DEV_GPU_UTIL", gpu="0"}`

	for _, c := range []struct {
		name       string
		series     prompb.TimeSeries
		wantReason string
	}{
		{"no metric name", v1Series([]prompb.Sample{{Timestamp: now, Value: 1}}, "gpu", "1"), "no metric name"},
		{"empty label name", v1Series([]prompb.Sample{{Timestamp: now, Value: 1}}, "__name__", "x", "", "v"), "empty label name"},
		{"duplicate label name", v1Series([]prompb.Sample{{Timestamp: now, Value: 1}}, "__name__", "x", "gpu", "1", "gpu", "2"), `duplicate label name "gpu"`},
		{"invalid utf8 label", v1Series([]prompb.Sample{{Timestamp: now, Value: 1}}, "__name__", "x", "gpu", "\xff\xfe"), "not valid UTF-8"},
		{"too far in the future", v1Series([]prompb.Sample{{Timestamp: now + 3600_000, Value: 1}}, "__name__", "x"), "in the future"},
		{"too old", v1Series([]prompb.Sample{{Timestamp: now - 48*3600_000, Value: 1}}, "__name__", "DCGM_FI_DEV_GPU_UTIL", "gpu", "0"), "too_old: 1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ti := newTestIngester(t)
			// A first write makes the head's time range start now, so "too old" is old.
			ti.post(t, ctV1, encodeV1(t, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{good}}))
			good2 := good
			good2.Samples = []prompb.Sample{{Timestamp: now + 1000, Value: 2}}
			resp := ti.post(t, ctV1, encodeV1(t, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{c.series, good2}}))
			if resp.code != http.StatusBadRequest {
				t.Fatalf("status %d, want 400: %s", resp.code, resp.body)
			}
			if !strings.Contains(resp.body, c.wantReason) || !strings.Contains(resp.body, "the rest of the request was stored") {
				t.Fatalf("body %q does not say %q", resp.body, c.wantReason)
			}
			got := ti.stored(t, "default")
			if !reflect.DeepEqual(got[goodKey], []float64{1, 2}) {
				t.Fatalf("valid series of the request not stored: %v", got)
			}
		})
	}

	t.Run("out of order and duplicate counted, rest stored", func(t *testing.T) {
		ti := newTestIngester(t)
		s := v1Series([]prompb.Sample{{Timestamp: now, Value: 1}}, "__name__", "a")
		ti.post(t, ctV1, encodeV1(t, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{s}}))
		req := &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{
			v1Series([]prompb.Sample{{Timestamp: now - 5000, Value: 0}, {Timestamp: now - 4000, Value: 0}}, "__name__", "a"), // 2 out of order
			v1Series([]prompb.Sample{{Timestamp: now, Value: 99}}, "__name__", "a"),                                          // same time, other value
			v1Series([]prompb.Sample{{Timestamp: now, Value: 5}}, "__name__", "b"),
		}}
		resp := ti.post(t, ctV1, encodeV1(t, req))
		if resp.code != http.StatusBadRequest || !strings.Contains(resp.body, "3 samples rejected") ||
			!strings.Contains(resp.body, "out_of_order: 2") || !strings.Contains(resp.body, "duplicate_timestamp: 1") {
			t.Fatalf("status %d body %q", resp.code, resp.body)
		}
		got := ti.stored(t, "default")
		if !reflect.DeepEqual(got, map[string][]float64{`{__name__="a"}`: {1}, `{__name__="b"}`: {5}}) {
			t.Fatalf("stored %v", got)
		}
		// Resending an identical sample is not an error (Prometheus retries do this).
		if resp := ti.post(t, ctV1, encodeV1(t, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{s}})); resp.code != http.StatusNoContent {
			t.Fatalf("identical resend: %d %s", resp.code, resp.body)
		}
	})

	t.Run("corrupt snappy", func(t *testing.T) {
		ti := newTestIngester(t)
		if resp := ti.post(t, ctV1, []byte("definitely not snappy")); resp.code != http.StatusBadRequest || !strings.Contains(resp.body, "snappy") {
			t.Fatalf("status %d body %q", resp.code, resp.body)
		}
	})

	t.Run("corrupt protobuf stores nothing", func(t *testing.T) {
		ti := newTestIngester(t)
		raw, _ := (&prompb.WriteRequest{Timeseries: []prompb.TimeSeries{good, good}}).Marshal()
		raw = raw[:len(raw)-3] // truncate the second series
		for _, ct := range []string{ctV1, ctV2} {
			if resp := ti.post(t, ct, snappy.Encode(nil, raw)); resp.code != http.StatusBadRequest || !strings.Contains(resp.body, "malformed") {
				t.Fatalf("%s: status %d body %q", ct, resp.code, resp.body)
			}
		}
		if got := ti.stored(t, "default"); len(got) != 0 {
			t.Fatalf("stored from a corrupt request: %v", got)
		}
	})

	t.Run("v2 symbol out of range", func(t *testing.T) {
		ti := newTestIngester(t)
		req := &writev2.Request{Symbols: []string{"", "__name__", "x"}, Timeseries: []writev2.TimeSeries{
			{LabelsRefs: []uint32{1, 7}, Samples: []writev2.Sample{{Value: 1, Timestamp: now}}},
		}}
		if resp := ti.post(t, ctV2, encodeV2(t, req)); resp.code != http.StatusBadRequest || !strings.Contains(resp.body, "out of range") {
			t.Fatalf("status %d body %q", resp.code, resp.body)
		}
	})

	t.Run("v2 invalid labels: headers count only what was written", func(t *testing.T) {
		ti := newTestIngester(t)
		b := newV2Builder()
		b.add(writev2.TimeSeries{Samples: []writev2.Sample{{Value: 1, Timestamp: now}}}, "gpu", "0")
		b.add(writev2.TimeSeries{Samples: []writev2.Sample{{Value: 1, Timestamp: now}}}, "__name__", "ok")
		resp := ti.post(t, ctV2, encodeV2(t, b.build()))
		if resp.code != http.StatusBadRequest || resp.header.Get(headerSamplesWritten) != "1" {
			t.Fatalf("status %d written %q body %q", resp.code, resp.header.Get(headerSamplesWritten), resp.body)
		}
	})

	t.Run("body too large", func(t *testing.T) {
		ti := newTestIngester(t, func(s *testSetup) { s.ingest.MaxRequestBytes = 64 })
		big := make([]prompb.TimeSeries, 50)
		for i := range big {
			big[i] = good
		}
		if resp := ti.post(t, ctV1, encodeV1(t, &prompb.WriteRequest{Timeseries: big})); resp.code != http.StatusRequestEntityTooLarge {
			t.Fatalf("status %d", resp.code)
		}
	})

	t.Run("decoded body too large", func(t *testing.T) {
		ti := newTestIngester(t, func(s *testSetup) { s.ingest.MaxDecodedBytes = 100 })
		big := make([]prompb.TimeSeries, 50)
		for i := range big {
			big[i] = good
		}
		if resp := ti.post(t, ctV1, encodeV1(t, &prompb.WriteRequest{Timeseries: big})); resp.code != http.StatusRequestEntityTooLarge {
			t.Fatalf("status %d", resp.code)
		}
	})

	t.Run("unsupported content type and encoding", func(t *testing.T) {
		ti := newTestIngester(t)
		body := encodeV1(t, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{good}})
		for _, ct := range []string{"application/json", "application/x-protobuf;proto=io.prometheus.write.v3.Request", "text/plain"} {
			if resp := ti.post(t, ct, body); resp.code != http.StatusUnsupportedMediaType {
				t.Fatalf("%s: status %d", ct, resp.code)
			}
		}
		if resp := ti.post(t, ctV1, body, "Content-Encoding", "gzip"); resp.code != http.StatusUnsupportedMediaType {
			t.Fatalf("gzip: status %d", resp.code)
		}
	})

	t.Run("not ready is 503", func(t *testing.T) {
		ti := newTestIngester(t)
		ti.ready = func() error { return errNotReadyForTest }
		if resp := ti.post(t, ctV1, encodeV1(t, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{good}})); resp.code != http.StatusServiceUnavailable {
			t.Fatalf("status %d", resp.code)
		}
	})
}

var errNotReadyForTest = &tenancy.Error{Status: 503, Err: http.ErrServerClosed}

// A cached reference the head no longer knows (its series was garbage
// collected) must be re-resolved from the labels, not lose the sample.
func TestStaleCachedReference(t *testing.T) {
	ti := newTestIngester(t)
	now := nowMs()
	s := v1Series([]prompb.Sample{{Timestamp: now, Value: 1}}, "__name__", "DCGM_FI_DEV_GPU_UTIL", "gpu", "0")
	ti.post(t, ctV1, encodeV1(t, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{s}}))
	st, _ := ti.tenant("default")
	if st.cache.len() != 1 {
		t.Fatalf("cache has %d entries", st.cache.len())
	}
	staleCachedRefs(ti)
	s.Samples = []prompb.Sample{{Timestamp: now + 1000, Value: 2}}
	if resp := ti.post(t, ctV1, encodeV1(t, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{s}})); resp.code != http.StatusNoContent {
		t.Fatalf("status %d %s", resp.code, resp.body)
	}
	if got := ti.stored(t, "default")[`{__name__="DCGM_FI_DEV_GPU_UTIL", gpu="0"}`]; !reflect.DeepEqual(got, []float64{1, 2}) {
		t.Fatalf("stored %v", got)
	}
}

// staleCachedRefs makes every series reference the default tenant's cache
// holds one the head never handed out: as after the head GC'd the series.
func staleCachedRefs(ti *testIngester) {
	st, _ := ti.tenant("default")
	for i := range st.cache.shards {
		for _, e := range st.cache.shards[i].m {
			e.ref.Store(1 << 40)
		}
	}
}

func TestSeriesCacheSweep(t *testing.T) {
	c := newSeriesCache()
	c.getOrCreate(1, 10).ref.Store(100)
	c.getOrCreate(2, 20).ref.Store(200)
	c.sweep()
	if c.get(1, 10) == nil {
		t.Fatal("entry used in the previous epoch was dropped")
	}
	c.sweep()
	if c.get(2, 20) != nil {
		t.Fatal("entry unused for two sweeps survived")
	}
	if e := c.get(1, 10); e == nil || e.ref.Load() != 100 {
		t.Fatal("entry in use was dropped")
	}
	if c.get(1, 11) != nil {
		t.Fatal("second hash not checked")
	}
}

func TestParseContentType(t *testing.T) {
	for ct, want := range map[string]bool{
		"": false, "application/x-protobuf": false,
		"application/x-protobuf;proto=prometheus.WriteRequest":          false,
		"application/x-protobuf; proto=io.prometheus.write.v2.Request":  true,
		`application/x-protobuf;proto="io.prometheus.write.v2.Request"`: true,
	} {
		got, err := parseContentType(ct)
		if err != nil || got != want {
			t.Errorf("%q: got %v %v, want %v", ct, got, err, want)
		}
	}
}

// TestMaxTenantsAnswers429: a write of a new tenant past limits.max_tenants
// is answered 429 naming the limit (not retried by default: the tenant
// cannot fit until an operator raises it) and stores nothing, while the
// tenants already there keep writing.
func TestMaxTenantsAnswers429(t *testing.T) {
	ti := newTestIngester(t, func(s *testSetup) { s.limits.MaxTenants = 2 })
	body := encodeV1(t, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{
		v1Series([]prompb.Sample{{Timestamp: nowMs(), Value: 1}}, "__name__", "DCGM_FI_DEV_GPU_TEMP", "gpu", "0")}})
	for _, tenant := range []string{"gpu-prod", "lab"} {
		if r := ti.post(t, ctV1, body, "X-Scope-OrgID", tenant); r.code != http.StatusNoContent {
			t.Fatalf("tenant %s: %d %s", tenant, r.code, r.body)
		}
	}
	r := ti.post(t, ctV1, body, "X-Scope-OrgID", "intruder")
	if r.code != http.StatusTooManyRequests || !strings.Contains(r.body, "limits.max_tenants") {
		t.Errorf("a third tenant under max_tenants 2: %d %s", r.code, r.body)
	}
	if ti.dbs.Existing("intruder") != nil {
		t.Error("the refused tenant has a database")
	}
	body2 := encodeV1(t, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{
		v1Series([]prompb.Sample{{Timestamp: nowMs() + 1000, Value: 2}}, "__name__", "DCGM_FI_DEV_GPU_TEMP", "gpu", "0")}})
	if r := ti.post(t, ctV1, body2, "X-Scope-OrgID", "lab"); r.code != http.StatusNoContent {
		t.Errorf("an existing tenant at the limit: %d %s", r.code, r.body)
	}
}
