package ingest

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
)

// TestMetadataIsBounded: a tenant's metadata is bounded in families
// (limits max_metadata_families) and in the length of each help and unit
// (max_metadata_length); family names must be valid metric names; what
// passes a bound is not stored and is answered 400 naming the bound, the
// rest of the request is stored. Before, five 4 MB metadata-only requests
// took the heap from 17 to 466 MB, and /api/v1/metadata then answered 270
// MB: every family was kept, whatever its help's length.
func TestMetadataIsBounded(t *testing.T) {
	ti := newTestIngester(t, func(s *testSetup) {
		s.limits.Defaults.MaxMetadataFamilies = 100
		s.limits.Defaults.MaxMetadataLength = 64
	})
	md := func() []string { return ti.dbs.Existing("default").Metadata.Families() }

	r := ti.post(t, ctV1, metadataRequest(t, 300, 20))
	if r.code != http.StatusBadRequest || !strings.Contains(r.body, "max_metadata_families") {
		t.Errorf("300 families past a bound of 100: %d %q", r.code, r.body)
	}
	if n := len(md()); n != 100 {
		t.Errorf("%d families stored, want the bound's 100", n)
	}
	// Families already stored are updated at the bound.
	if r := ti.post(t, ctV1, metadataRequest(t, 50, 30)); r.code != http.StatusNoContent {
		t.Errorf("50 known families again: %d %q", r.code, r.body)
	}
	if m, _ := ti.dbs.Existing("default").Metadata.Get("family_7"); len(m.Help) != 30 {
		t.Errorf("family_7's help was not updated: %q", m.Help)
	}

	ti2 := newTestIngester(t, func(s *testSetup) { s.limits.Defaults.MaxMetadataLength = 64 })
	bad := &prompb.WriteRequest{
		Timeseries: []prompb.TimeSeries{v1Series([]prompb.Sample{{Timestamp: nowMs(), Value: 1}}, "__name__", "DCGM_FI_DEV_GPU_TEMP", "gpu", "0")},
		Metadata: []prompb.MetricMetadata{
			{Type: prompb.MetricMetadata_GAUGE, MetricFamilyName: "DCGM_FI_DEV_GPU_TEMP", Help: "GPU temperature (in C)."},
			{Type: prompb.MetricMetadata_GAUGE, MetricFamilyName: "long_help", Help: strings.Repeat("h", 65)},
			{Type: prompb.MetricMetadata_GAUGE, MetricFamilyName: "long_unit", Unit: strings.Repeat("u", 65)},
			{Type: prompb.MetricMetadata_GAUGE, MetricFamilyName: "bad\xff\xfename"},
			{Type: prompb.MetricMetadata_GAUGE, MetricFamilyName: strings.Repeat("n", 2049)},
		},
	}
	r = ti2.post(t, ctV1, encodeV1(t, bad))
	if r.code != http.StatusBadRequest || !strings.Contains(r.body, "4 metadata") || !strings.Contains(r.body, "max_metadata_length") {
		t.Errorf("metadata past the length bound and of invalid names: %d %q", r.code, r.body)
	}
	if got := ti2.dbs.Existing("default").Metadata.Families(); fmt.Sprint(got) != "[DCGM_FI_DEV_GPU_TEMP]" {
		t.Errorf("families stored: %q", got)
	}
	if got := ti2.stored(t, "default"); len(got) != 1 {
		t.Errorf("the request's sample was not stored: %v", got)
	}

	// 2.0 carries metadata with every series: past the bound the samples
	// are stored and acknowledged, the metadata is not kept.
	b := newV2Builder()
	for i := range 5 {
		b.add(writev2.TimeSeries{Samples: []writev2.Sample{{Value: 1, Timestamp: nowMs()}},
			Metadata: writev2.Metadata{Type: writev2.Metadata_METRIC_TYPE_GAUGE, HelpRef: b.ref(strings.Repeat("h", 10))}},
			"__name__", fmt.Sprintf("v2_family_%d", i))
	}
	if r := ti.post(t, ctV2, encodeV2(t, b.build())); r.code != http.StatusNoContent || r.header.Get(headerSamplesWritten) != "5" {
		t.Errorf("2.0 series past the families bound: %d %q, %s samples written", r.code, r.body, r.header.Get(headerSamplesWritten))
	}
	if n := len(md()); n != 100 {
		t.Errorf("%d families stored after the 2.0 request, want 100", n)
	}
}

// TestMetadataCountsAgainstTheRateLimit: each metadata entry of a remote
// write 1.0 request counts as a sample against the tenant's ingestion
// rate. Before, metadata-only requests passed any rate.
func TestMetadataCountsAgainstTheRateLimit(t *testing.T) {
	ti := newTestIngester(t, func(s *testSetup) {
		s.limits.Defaults.IngestionRate = 10
		s.limits.Defaults.IngestionBurstSize = 100
	})
	if r := ti.post(t, ctV1, metadataRequest(t, 50, 10)); r.code != http.StatusNoContent {
		t.Fatalf("50 entries within the burst: %d %q", r.code, r.body)
	}
	r := ti.post(t, ctV1, metadataRequest(t, 80, 10))
	if r.code != http.StatusServiceUnavailable || !strings.Contains(r.body, "ingestion rate limit") || r.header.Get("Retry-After") == "" {
		t.Errorf("80 more entries past the burst: %d %q", r.code, r.body)
	}
}
