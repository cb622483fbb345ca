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
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/tsdbutil"
	"google.golang.org/protobuf/encoding/protowire"
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

// labelAppends counts the appends that name their series by labels, not
// by a reference alone (the series cache missed).
type labelAppends struct {
	storage.AppendableV2
	n *int
}

func (a labelAppends) AppenderV2(ctx context.Context) storage.AppenderV2 {
	return labelAppender{AppenderV2: a.AppendableV2.AppenderV2(ctx), n: a.n}
}

type labelAppender struct {
	storage.AppenderV2
	n *int
}

func (a labelAppender) Append(ref storage.SeriesRef, ls labels.Labels, st, t int64, v float64, h *histogram.Histogram, fh *histogram.FloatHistogram, opts storage.AOptions) (storage.SeriesRef, error) {
	if !ls.IsEmpty() {
		*a.n++
	}
	return a.AppenderV2.Append(ref, ls, st, t, v, h, fh, opts)
}

// TestStartTimestampZeroCachesSeries: a series whose first append is its
// created-timestamp zero is cached like any new series (counted in
// gpustore_ingest_series_created_total), so its next write appends it by
// reference. The zero's reference was not cached: the next write resolved
// the series from its labels again, and the series was not counted.
func TestStartTimestampZeroCachesSeries(t *testing.T) {
	ti := newTestIngester(t, func(s *testSetup) { s.limits.Defaults.CreatedTimestampZeroIngestion = true })
	var byLabels int
	ti.wrapAppendable(t, "default", func(a storage.AppendableV2) storage.AppendableV2 { return labelAppends{a, &byLabels} })
	now := nowMs()
	for i, ts := range []int64{now - 20_000, now - 10_000} {
		b := newV2Builder().add(writev2.TimeSeries{Samples: []writev2.Sample{{Value: float64(i + 1), Timestamp: ts, StartTimestamp: now - 30_000}}}, "__name__", "jobs_total")
		if resp := ti.post(t, ctV2, encodeV2(t, b.build())); resp.code != http.StatusNoContent {
			t.Fatalf("write %d: %d %s", i+1, resp.code, resp.body)
		}
		if i == 0 {
			if got := testutil.ToFloat64(ti.metrics.series.WithLabelValues("default")); got != 1 {
				t.Errorf("gpustore_ingest_series_created_total = %g after the first write, want 1", got)
			}
			byLabels = 0
		}
	}
	if byLabels != 0 {
		t.Errorf("the second write appended by labels %d times, want 0 (the series cached)", byLabels)
	}
	want := []storedPoint{{now - 30_000, 0, false}, {now - 20_000, 1, false}, {now - 10_000, 2, false}}
	if got := ti.points(t, "default", "jobs_total"); !reflect.DeepEqual(got, want) {
		t.Errorf("stored %v, want %v", got, want)
	}
}

// TestDownstreamStartTimestamps: a receiver (downstream) stores, best
// effort, the zero a distributor asks for with a 1.0 sample's or
// histogram's start timestamp (numbered as in 2.0), whatever its own
// created_timestamp_zero_ingestion says: the distributor applied the
// tenant's. A zero not in order is ignored and fails nothing. Anywhere
// else the field is unknown to 1.0 and skipped, as by a receiver of the
// previous version: the samples are stored, without zeros.
func TestDownstreamStartTimestamps(t *testing.T) {
	now := nowMs()
	st, t1, t2 := now-30_000, now-20_000, now-10_000
	startTS := func(field protowire.Number) []byte { // an unknown field to 1.0's generated code
		return protowire.AppendVarint(protowire.AppendTag(nil, field, protowire.VarintType), uint64(st))
	}
	request := func(ts int64, v float64) []byte {
		h := prompb.FromIntHistogram(ts, tsdbutil.GenerateTestHistogram(2))
		h.XXX_unrecognized = startTS(17)
		return encodeV1(t, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{
			v1Series([]prompb.Sample{{Value: v, Timestamp: ts, XXX_unrecognized: startTS(3)}}, "__name__", "jobs_total"),
			{Labels: []prompb.Label{{Name: "__name__", Value: "step_seconds"}}, Histograms: []prompb.Histogram{h}},
		}})
	}
	for _, c := range []struct {
		name      string
		setup     func(*testSetup)
		wantZeros bool
	}{
		{"receiver", func(s *testSetup) { s.downstream = true }, true},
		{"single node", func(s *testSetup) { s.limits.Defaults.CreatedTimestampZeroIngestion = true }, false},
	} {
		ti := newTestIngester(t, c.setup)
		for i, ts := range []int64{t1, t2} { // the second repeats the start: its zero is out of order
			if resp := ti.post(t, ctV1, request(ts, float64(i+1))); resp.code != http.StatusNoContent {
				t.Fatalf("%s: write %d: %d %s", c.name, i+1, resp.code, resp.body)
			}
		}
		want := []storedPoint{{t1, 1, false}, {t2, 2, false}}
		wantH := []int64{t1, t2}
		if c.wantZeros {
			want = append([]storedPoint{{st, 0, false}}, want...)
			wantH = append([]int64{st}, wantH...)
		}
		if got := ti.points(t, "default", "jobs_total"); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: stored %v, want %v", c.name, got, want)
		}
		var gotH []int64
		for _, p := range ti.points(t, "default", "step_seconds") {
			gotH = append(gotH, p.T)
		}
		if !reflect.DeepEqual(gotH, wantH) {
			t.Errorf("%s: histograms at %v, want %v", c.name, gotH, wantH)
		}
	}
}
