// The ingest side's shapes: OTLP exports whose translation costs far more
// than their bytes, and remote write requests of metadata without end.

package abuse

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/golang/snappy"
	"github.com/prometheus/prometheus/prompb"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
)

// OTLPAttributeFlood is a gzipped OTLP/HTTP protobuf export of one gauge
// point with attrs attributes: Prometheus' translator builds its labels in
// time quadratic in their number (40,000 took 6.7 s of a core, a 297 KB
// export of 120,000 ~50 s).
func OTLPAttributeFlood(attrs int, ts time.Time) []byte {
	md := pmetric.NewMetrics()
	rm := md.ResourceMetrics().AppendEmpty()
	rm.Resource().Attributes().PutStr("service.name", "dcgm-exporter")
	m := rm.ScopeMetrics().AppendEmpty().Metrics().AppendEmpty()
	m.SetName("DCGM_FI_DEV_GPU_TEMP")
	dp := m.SetEmptyGauge().DataPoints().AppendEmpty()
	dp.SetTimestamp(pcommon.NewTimestampFromTime(ts))
	dp.SetDoubleValue(60)
	putAttributes(dp.Attributes(), attrs)
	return gzipExport(md)
}

// OTLPHistogram is a gzipped OTLP/HTTP protobuf export of one classic
// histogram point with bounds explicit bounds and attrs attributes: the
// translator makes a series of each bucket, each with every attribute (four
// 33 KB exports of 20,000 bounds and 2,000 attributes took RSS from 0.4 to
// 2.6 GB).
func OTLPHistogram(bounds, attrs int, ts time.Time) []byte {
	md := pmetric.NewMetrics()
	rm := md.ResourceMetrics().AppendEmpty()
	rm.Resource().Attributes().PutStr("service.name", "trainer")
	m := rm.ScopeMetrics().AppendEmpty().Metrics().AppendEmpty()
	m.SetName("training.step.time")
	h := m.SetEmptyHistogram()
	h.SetAggregationTemporality(pmetric.AggregationTemporalityCumulative)
	dp := h.DataPoints().AppendEmpty()
	dp.SetStartTimestamp(pcommon.NewTimestampFromTime(ts.Add(-time.Hour)))
	dp.SetTimestamp(pcommon.NewTimestampFromTime(ts))
	b, c := make([]float64, bounds), make([]uint64, bounds+1)
	for i := range b {
		b[i] = float64(i+1) / 1000
	}
	dp.ExplicitBounds().FromRaw(b)
	dp.BucketCounts().FromRaw(c)
	putAttributes(dp.Attributes(), attrs)
	return gzipExport(md)
}

func putAttributes(m pcommon.Map, n int) {
	m.EnsureCapacity(n)
	for i := range n {
		m.PutStr(fmt.Sprintf("k8s.pod.label.%d", i), fmt.Sprintf("value-%d", i))
	}
}

func gzipExport(md pmetric.Metrics) []byte {
	raw, err := pmetricotlp.NewExportRequestFromMetrics(md).MarshalProto()
	if err != nil {
		panic(err) // a valid message
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	_, _ = zw.Write(raw)
	_ = zw.Close()
	return buf.Bytes()
}

// PostOTLP sends a gzipped protobuf export to url with header (tenant,
// credentials) and returns the answer's status and body.
func PostOTLP(ctx context.Context, url string, body []byte, header http.Header) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	req.Header.Set("Content-Type", "application/x-protobuf")
	req.Header.Set("Content-Encoding", "gzip")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, b, err
}

// MetadataOnly is a snappy-compressed remote write 1.0 request of metadata
// alone (what Prometheus' send_metadata sends, without end here): metric
// families prefix0, prefix1, ... with help texts, about size bytes
// decoded. Five such requests of 4 MB took a server's heap from 17 to 466
// MB, and /api/v1/metadata then answered 270 MB.
func MetadataOnly(prefix string, size int) []byte {
	req := &prompb.WriteRequest{}
	help := strings.Repeat("h", 64)
	for i, n := 0, 0; n < size; i++ {
		m := prompb.MetricMetadata{Type: prompb.MetricMetadata_GAUGE, MetricFamilyName: fmt.Sprintf("%s%d", prefix, i), Help: help, Unit: "bytes"}
		req.Metadata = append(req.Metadata, m)
		n += m.Size() + 3
	}
	raw, err := req.Marshal()
	if err != nil {
		panic(err) // a valid message
	}
	return snappy.Encode(nil, raw)
}
