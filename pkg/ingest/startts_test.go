package ingest

import (
	"context"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/grafana/dskit/services"
	"github.com/prometheus/prometheus/model/labels"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/tsdbutil"
)

// storedPoint is a stored sample: its time and value, a histogram's count.
type storedPoint struct {
	T int64
	V float64
	H bool
}

// points returns the tenant's samples of series name: time, value (a
// histogram's count).
func (ti *testIngester) points(t *testing.T, tenant, name string) []storedPoint {
	t.Helper()
	q, err := ti.dbs.Existing(tenant).Querier(math.MinInt64, math.MaxInt64)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	var out []storedPoint
	ss := q.Select(context.Background(), false, nil, labels.MustNewMatcher(labels.MatchEqual, "__name__", name))
	for ss.Next() {
		it := ss.At().Iterator(nil)
		for vt := it.Next(); vt != chunkenc.ValNone; vt = it.Next() {
			switch vt {
			case chunkenc.ValFloat:
				ts, v := it.At()
				out = append(out, storedPoint{T: ts, V: v})
			default:
				ts, fh := it.AtFloatHistogram(nil)
				out = append(out, storedPoint{T: ts, V: fh.Count, H: true})
			}
		}
	}
	return out
}

// TestStartTimestampZeroSample: with a tenant's created_timestamp_zero_ingestion
// on, a remote-write 2.0 sample (float or histogram) carrying a start
// timestamp is stored with a zero at that timestamp before it, as Prometheus'
// created-timestamp-zero-ingestion stores it; a start timestamp not before
// the sample, or at or before what the series holds, adds nothing and is no
// error; the written-samples header counts the sender's samples only. Other
// tenants (the default) store the samples alone. There was no way to get
// the zero.
func TestStartTimestampZeroSample(t *testing.T) {
	overrides := filepath.Join(t.TempDir(), "overrides.yaml")
	if err := os.WriteFile(overrides, []byte("overrides:\n  ct:\n    created_timestamp_zero_ingestion: true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ti := newTestIngester(t, func(s *testSetup) { s.limits.OverridesFile = overrides })
	if err := services.StartAndAwaitRunning(t.Context(), ti.limits); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = services.StopAndAwaitTerminated(t.Context(), ti.limits) })
	now := nowMs()
	build := func() []byte {
		b := newV2Builder()
		b.add(writev2.TimeSeries{
			Samples: []writev2.Sample{
				{Value: 5, Timestamp: now - 50_000, StartTimestamp: now - 60_000}, // a new counter: zero at its start
				{Value: 9, Timestamp: now - 40_000, StartTimestamp: now - 60_000}, // same start: already there
				{Value: 2, Timestamp: now - 10_000, StartTimestamp: now - 20_000}, // a restart: zero at the new start
				{Value: 3, Timestamp: now, StartTimestamp: now},                   // start not before the sample
			},
			Metadata: writev2.Metadata{Type: writev2.Metadata_METRIC_TYPE_COUNTER},
		}, "__name__", "gpu_energy_joules_total", "gpu", "0")
		b.add(writev2.TimeSeries{
			Histograms: []writev2.Histogram{writev2.FromIntHistogram(now-30_000, now-25_000, tsdbutil.GenerateTestHistogram(3))},
		}, "__name__", "step_seconds", "rank", "0")
		return encodeV2(t, b.build())
	}
	for tenant, want := range map[string][]storedPoint{
		"ct":      {{now - 60_000, 0, false}, {now - 50_000, 5, false}, {now - 40_000, 9, false}, {now - 20_000, 0, false}, {now - 10_000, 2, false}, {now, 3, false}},
		"default": {{now - 50_000, 5, false}, {now - 40_000, 9, false}, {now - 10_000, 2, false}, {now, 3, false}},
	} {
		resp := ti.post(t, ctV2, build(), "X-Scope-OrgID", tenant)
		if resp.code != http.StatusNoContent || resp.header.Get(headerSamplesWritten) != "4" || resp.header.Get(headerHistogramsWritten) != "1" {
			t.Fatalf("%s: %d %s, samples written %q, histograms %q", tenant, resp.code, resp.body, resp.header.Get(headerSamplesWritten), resp.header.Get(headerHistogramsWritten))
		}
		if got := ti.points(t, tenant, "gpu_energy_joules_total"); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: stored %v, want %v", tenant, got, want)
		}
		h := ti.points(t, tenant, "step_seconds")
		wantH := 1
		if tenant == "ct" {
			wantH = 2
		}
		if len(h) != wantH || (wantH == 2 && (h[0].T != now-30_000 || h[0].V != 0)) {
			t.Errorf("%s: histogram samples %v, want %d (a zero at the start timestamp first)", tenant, h, wantH)
		}
	}
}
