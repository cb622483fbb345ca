package ingest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/golang/snappy"
	"github.com/grafana/dskit/kv"
	"github.com/grafana/dskit/services"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"

	"github.com/gpustore/gpustore/pkg/hatracker"
	"github.com/gpustore/gpustore/pkg/limits"
	"github.com/gpustore/gpustore/pkg/tenancy"
	"github.com/gpustore/gpustore/pkg/tenantdb"
)

// testIngester is an Ingester over real per-tenant TSDBs in a temp dir.
type testIngester struct {
	*Ingester
	dbs *tenantdb.Manager
	reg *prometheus.Registry
	ha  *hatracker.Tracker
}

// testSetup is what a test may change before the ingester is built.
type testSetup struct {
	tsdb       tenantdb.Config
	ingest     Config
	tenants    tenancy.Config
	limits     limits.Config
	ha         *hatracker.Config // nil: no HA dedup
	clock      func() time.Time  // the HA tracker's clock; nil: wall clock
	haKV       kv.Client         // the HA tracker's KV client; nil: in-memory
	share      func() int        // Deps.RateShare
	downstream bool              // Deps.Downstream
}

func newTestIngester(t testing.TB, mutate ...func(*testSetup)) *testIngester {
	t.Helper()
	setup := testSetup{tsdb: tenantdb.DefaultConfig(), ingest: DefaultConfig(), tenants: tenancy.DefaultConfig(), limits: limits.DefaultConfig()}
	setup.tsdb.Dir = t.TempDir()
	for _, m := range mutate {
		m(&setup)
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg := prometheus.NewRegistry()
	lim, err := limits.New(setup.limits, logger, reg)
	if err != nil {
		t.Fatal(err)
	}
	dbs, err := tenantdb.NewManager(setup.tsdb, logger, reg)
	if err != nil {
		t.Fatal(err)
	}
	dbs.SetLimits(lim)
	dbs.SetMaxTenants(lim.MaxTenants())
	t.Cleanup(func() { _ = dbs.Close() })
	var ha *hatracker.Tracker
	if setup.ha != nil {
		var opts []hatracker.Option
		if setup.clock != nil {
			opts = append(opts, hatracker.WithClock(setup.clock))
		}
		if setup.haKV != nil {
			opts = append(opts, hatracker.WithKV(setup.haKV))
		}
		if ha, err = hatracker.New(*setup.ha, kv.StoreConfig{}, logger, reg, opts...); err != nil {
			t.Fatal(err)
		}
		if err := services.StartAndAwaitRunning(context.Background(), ha); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = services.StopAndAwaitTerminated(context.Background(), ha) })
	}
	ing, err := New(setup.ingest, Deps{Tenants: setup.tenants, DBs: dbs, Limits: lim, HA: ha, RateShare: setup.share, Downstream: setup.downstream, Logger: logger, Registry: reg, Ready: func() error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	return &testIngester{Ingester: ing, dbs: dbs, reg: reg, ha: ha}
}

type response struct {
	code   int
	body   string
	header http.Header
}

func (ti *testIngester) post(t testing.TB, contentType string, body []byte, headers ...string) response {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/api/v1/write", bytes.NewReader(body))
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set("Content-Encoding", "snappy")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	rec := httptest.NewRecorder()
	ti.ServeHTTP(rec, req)
	return response{rec.Code, rec.Body.String(), rec.Header()}
}

const (
	ctV1 = "application/x-protobuf"
	ctV2 = "application/x-protobuf;proto=io.prometheus.write.v2.Request"
)

func encodeV1(t testing.TB, req *prompb.WriteRequest) []byte {
	t.Helper()
	b, err := req.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return snappy.Encode(nil, b)
}

func encodeV2(t testing.TB, req *writev2.Request) []byte {
	t.Helper()
	b, err := req.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return snappy.Encode(nil, b)
}

// v1Series builds a 1.0 series from alternating label names and values, kept in the given order.
func v1Series(samples []prompb.Sample, kv ...string) prompb.TimeSeries {
	ts := prompb.TimeSeries{Samples: samples}
	for i := 0; i+1 < len(kv); i += 2 {
		ts.Labels = append(ts.Labels, prompb.Label{Name: kv[i], Value: kv[i+1]})
	}
	return ts
}

// v2Builder assembles a 2.0 request.
type v2Builder struct {
	st  writev2.SymbolsTable
	req writev2.Request
}

func newV2Builder() *v2Builder { return &v2Builder{st: writev2.NewSymbolTable()} }

func (b *v2Builder) add(ts writev2.TimeSeries, kv ...string) *v2Builder {
	for _, s := range kv {
		ts.LabelsRefs = append(ts.LabelsRefs, b.st.Symbolize(s))
	}
	b.req.Timeseries = append(b.req.Timeseries, ts)
	return b
}

func (b *v2Builder) ref(s string) uint32 { return b.st.Symbolize(s) }

func (b *v2Builder) build() *writev2.Request {
	b.req.Symbols = b.st.Symbols()
	return &b.req
}

// stored returns the float samples of every series of a tenant, by series string.
func (ti *testIngester) stored(t testing.TB, tenant string) map[string][]float64 {
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
	out := map[string][]float64{}
	ss := q.Select(context.Background(), true, nil, labels.MustNewMatcher(labels.MatchRegexp, model.MetricNameLabel, ".+"))
	for ss.Next() {
		s := ss.At()
		it := s.Iterator(nil)
		key := s.Labels().String()
		out[key] = out[key][:0:0]
		for vt := it.Next(); vt != chunkenc.ValNone; vt = it.Next() {
			switch vt {
			case chunkenc.ValFloat:
				_, v := it.At()
				out[key] = append(out[key], v)
			default:
				out[key] = append(out[key], -1) // histogram marker
			}
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := ss.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

var _ storage.SeriesRef

func nowMs() int64 { return time.Now().UnixMilli() }

// wrapAppendable replaces the appendable of a tenant's writes (to inject faults).
func (ti *testIngester) wrapAppendable(t testing.TB, tenant string, wrap func(storage.AppendableV2) storage.AppendableV2) {
	t.Helper()
	st, err := ti.tenant(tenant)
	if err != nil {
		t.Fatal(err)
	}
	st.appendable = wrap(st.appendable)
}

// metadataRequest is a remote write 1.0 request of metadata alone, as
// Prometheus sends it (send_metadata): families metric families named
// family_0, family_1, ..., each with a help text of help bytes.
func metadataRequest(t testing.TB, families, help int) []byte {
	t.Helper()
	req := &prompb.WriteRequest{Metadata: make([]prompb.MetricMetadata, 0, families)}
	text := strings.Repeat("h", help)
	for i := range families {
		req.Metadata = append(req.Metadata, prompb.MetricMetadata{Type: prompb.MetricMetadata_GAUGE, MetricFamilyName: fmt.Sprintf("family_%d", i), Help: text, Unit: "bytes"})
	}
	return encodeV1(t, req)
}
