package ingest

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/prometheus/storage/remote/otlptranslator/prometheusremotewrite"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/gpustore/gpustore/pkg/limits"
)

// OTLP/HTTP metrics ingest. An export request is read like a remote write
// (the same size and in-flight bounds, gzip instead of snappy), translated
// by Prometheus' own OTLP translator with the tenant's settings
// (limits.OTLP), and the series it yields are encoded as a remote-write 2.0
// request and stored by the same store step as remote write: rate limit,
// HA election, relabeling, label and series limits, one TSDB commit. So
// nothing about a tenant's data depends on the protocol it came by.
//
// Answers follow the OTLP specification's rules: 200 with an
// ExportMetricsServiceResponse (its partial_success naming what was
// rejected when some data was stored and some not), 400 with a
// google.rpc.Status when nothing of a request can ever be stored, and
// 429/502/503/504 (with Retry-After) for what the exporter should retry. A
// storage fault, 500 for remote write, is 503 here: OTLP exporters do not
// retry 500.

// OTLPPaths are Prometheus' OTLP metrics path and the one Mimir and the
// Collector's otlphttp exporter (endpoint + /v1/metrics) use.
var OTLPPaths = []string{"/api/v1/otlp/v1/metrics", "/otlp/v1/metrics"}

const (
	otlpProtobuf = "application/x-protobuf"
	otlpJSON     = "application/json"
)

// otlpHandler serves the OTLP paths with the Ingester's store.
type otlpHandler struct{ i *Ingester }

// AnswerError answers a request the server refused before it reached the
// handler (credentials, the rate limit: pkg/server's ErrorAnswerer) as every
// OTLP failure is answered, a google.rpc.Status in the request's encoding;
// the headers that go with it (WWW-Authenticate, Retry-After) are set.
func (otlpHandler) AnswerError(w http.ResponseWriter, r *http.Request, status int, msg string) {
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	writeOTLPStatus(w, status, 0, msg, mt == otlpJSON)
}

func (h otlpHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := h.i.now()
	status := h.serve(w, r)
	h.i.metrics.requests.WithLabelValues("otlp", strconv.Itoa(status)).Inc()
	h.i.metrics.duration.WithLabelValues("otlp").Observe(time.Since(start).Seconds())
}

func (h otlpHandler) serve(w http.ResponseWriter, r *http.Request) int {
	i := h.i
	asJSON, tenantID, err := i.checkOTLPRequest(w, r)
	if err != nil {
		return i.failOTLP(w, err, asJSON)
	}
	lim := i.limits.For(tenantID)
	rs := i.pool.Get().(*requestState)
	defer i.pool.Put(rs)
	defer i.releaseBuffers(rs)
	md, err := i.readOTLP(r, rs, asJSON, lim)
	if err != nil {
		if errors.Is(err, errTooManySeries) {
			if st, terr := i.tenant(tenantID); terr == nil {
				st.m.rejected(reasonTooManySeries).Add(float64(lim.MaxSeriesPerRequest))
			}
		}
		return i.failOTLP(w, err, asJSON)
	}
	st, err := i.tenant(tenantID)
	if err != nil {
		return i.failOTLP(w, tenantError(tenantID, err), asJSON)
	}
	body, conv, err := i.translateOTLP(r.Context(), st, rs, md, lim)
	if err != nil {
		return i.failOTLP(w, err, asJSON)
	}
	var stats *writeStats
	if body != nil {
		if stats, err = i.store(r.Context(), st, rs, body, true); err != nil {
			return i.failOTLP(w, err, asJSON)
		}
	} else {
		stats = &writeStats{}
	}
	return answerOTLP(w, stats, conv, asJSON)
}

// checkOTLPRequest checks method, readiness, content type and encoding,
// and the tenant, before the body is read.
func (i *Ingester) checkOTLPRequest(w http.ResponseWriter, r *http.Request) (asJSON bool, tenantID string, err error) {
	mt, _, perr := mime.ParseMediaType(r.Header.Get("Content-Type"))
	asJSON = perr == nil && mt == otlpJSON
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return asJSON, "", &httpError{status: http.StatusMethodNotAllowed, msg: "OTLP export takes POST"}
	}
	if err := i.ready(); err != nil {
		return asJSON, "", &httpError{status: http.StatusServiceUnavailable, retryAfter: 1, msg: fmt.Sprintf("not ready: %v", err)}
	}
	if perr != nil || (mt != otlpProtobuf && mt != otlpJSON) {
		return asJSON, "", &httpError{status: http.StatusUnsupportedMediaType,
			msg: fmt.Sprintf("unsupported Content-Type %q: OTLP/HTTP takes %s or %s", r.Header.Get("Content-Type"), otlpProtobuf, otlpJSON)}
	}
	switch enc := r.Header.Get("Content-Encoding"); enc {
	case "", "identity", "gzip":
	default:
		return asJSON, "", &httpError{status: http.StatusUnsupportedMediaType, msg: fmt.Sprintf("unsupported Content-Encoding %q: OTLP/HTTP bodies are gzip or not compressed", enc)}
	}
	tenantID, err = i.tenantOf(r)
	return asJSON, tenantID, err
}

// readOTLP reads, decompresses, judges (otlp_shape.go) and unmarshals the
// body. The compressed and decompressed bytes are held in the in-flight
// bound like a remote write's; a gzip stream that inflates past
// ingest.max_decoded_bytes is refused as it inflates, not after.
func (i *Ingester) readOTLP(r *http.Request, rs *requestState, asJSON bool, lim limits.Limits) (pmetric.Metrics, error) {
	buf, err := i.readRaw(r, rs)
	if err != nil {
		return pmetric.Metrics{}, err
	}
	gzipped := r.Header.Get("Content-Encoding") == "gzip"
	if gzipped {
		if buf, err = i.gunzip(rs, buf); err != nil {
			return pmetric.Metrics{}, err
		}
	}
	if err := i.holdOTLPShape(rs, buf, asJSON, gzipped, lim); err != nil {
		return pmetric.Metrics{}, err
	}
	req := pmetricotlp.NewExportRequest()
	if asJSON {
		err = req.UnmarshalJSON(buf)
	} else {
		err = req.UnmarshalProto(buf)
	}
	if err != nil {
		return pmetric.Metrics{}, &httpError{status: http.StatusBadRequest, msg: fmt.Sprintf("decode OTLP metrics export request: %v", err)}
	}
	return req.Metrics(), nil
}

// holdOTLPShape judges the export request's shape against the tenant's
// limits (otlp_shape.go) and holds in the in-flight bound, beside the
// body's bytes, the objects pdata will make of it and what its translation
// will allocate. A request that could never be decoded and translated
// within the bound is answered 413, which the exporter does not retry.
func (i *Ingester) holdOTLPShape(rs *requestState, body []byte, asJSON, inflated bool, lim limits.Limits) error {
	shape, err := scanOTLP(body, asJSON, otlpBoundsOf(lim))
	if err != nil {
		return err
	}
	if max := lim.MaxSeriesPerRequest; max > 0 && shape.series > int64(max) {
		return fmt.Errorf("%w: its data points make %d series, more than %d (limit max_series_per_request): refused before decoding", errTooManySeries, shape.series, max)
	}
	rs.objects, rs.translation = shape.objects, shape.translationBytes()
	// Whether it could ever fit counts the bytes this request needs (the
	// body as sent, the inflated one if it was gzipped, the objects and the
	// translation), not the capacity its pooled buffers kept from earlier
	// requests.
	rs.need = int64(len(rs.compressed)) + rs.objects
	if inflated {
		rs.need += int64(len(body))
	}
	if max := i.inflight.Max(); max > 0 && rs.need+rs.translation > max {
		return tooLarge("the export request of %d bytes decodes into ~%d bytes of objects and translates into ~%d bytes of series (%d series, %d labels), more than ingest.max_inflight_bytes (%d) holds: send smaller batches",
			len(body), shape.objects, shape.translationBytes(), shape.series, shape.labels, max)
	}
	return i.hold(rs, cap(rs.compressed)+cap(rs.decoded)+int(rs.objects+rs.translation))
}

// gunzip inflates body into rs.decoded, growing it (and what the request
// holds of the in-flight bound) as the bytes come.
func (i *Ingester) gunzip(rs *requestState, body []byte) ([]byte, error) {
	corrupt := func(err error) error {
		return &httpError{status: http.StatusBadRequest, msg: fmt.Sprintf("corrupt gzip body: %v", err)}
	}
	zr, err := gzip.NewReader(bytes.NewReader(body))
	if err != nil {
		return nil, corrupt(err)
	}
	out := rs.decoded[:0]
	lr := io.LimitReader(zr, i.cfg.MaxDecodedBytes+1)
	for {
		if len(out) == cap(out) {
			out = slices.Grow(out, max(cap(out), 4096))
			rs.decoded = out
			if err := i.hold(rs, cap(body)+cap(out)); err != nil {
				return nil, err
			}
		}
		n, err := lr.Read(out[len(out):cap(out)])
		out = out[:len(out)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, corrupt(err)
		}
	}
	rs.decoded = out
	if int64(len(out)) > i.cfg.MaxDecodedBytes {
		return nil, tooLarge("decompressed body exceeds the limit of %d bytes", i.cfg.MaxDecodedBytes)
	}
	return out, nil
}

// conversion is what the translation refused: whole metrics (delta
// temporality the tenant does not convert, names the strategy cannot
// build), which the answer names next to the store's rejections.
type conversion struct {
	rejectedPoints int
	err            error
}

// translateOTLP runs Prometheus' translator over md with the tenant's
// settings and returns the series as a remote-write 2.0 body (nil when
// nothing was translated).
func (i *Ingester) translateOTLP(ctx context.Context, st *tenantState, rs *requestState, md pmetric.Metrics, lim limits.Limits) ([]byte, conversion, error) {
	var conv conversion
	o, maxSeries := lim.OTLP, lim.MaxSeriesPerRequest
	if deltas := deltaPoints(md); deltas > 0 {
		if o.ConvertDeltaToCumulative {
			d, err := st.deltas(lim)
			if err == nil {
				md, err = d.toCumulative(ctx, md)
			}
			if err != nil {
				return nil, conv, fmt.Errorf("convert delta temporality to cumulative: %w", err)
			}
		} else {
			conv.rejectedPoints = deltas
		}
	}
	b := rs.otlp
	if b == nil {
		b = newOTLPTranslation()
		rs.otlp = b
	}
	// The estimate held covers the translation but for a resource's
	// target_info repeated over a long span; what it appends past the
	// estimate is held as it goes.
	base := cap(rs.compressed) + cap(rs.decoded) + int(rs.objects)
	grow := func(spent int64) error {
		if max := i.inflight.Max(); max > 0 && rs.need+spent > max {
			return tooLarge("the translation of the export request grew past %d bytes of series, more than ingest.max_inflight_bytes (%d) holds beside its body and objects: send smaller batches (or points of closer timestamps: a resource's target_info is repeated over their span)", spent, max)
		}
		return i.hold(rs, base+int(max(spent, rs.translation)))
	}
	body, err := b.translate(ctx, md, o, i.lookbackDelta, maxSeries, grow, rs.translated[:0])
	rs.translated = body
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return nil, conv, bodyCut(0, err)
	case errors.Is(err, errTooManySeries):
		st.m.rejected(reasonTooManySeries).Add(float64(maxSeries))
		return nil, conv, err
	case errors.As(err, new(*httpError)):
		return nil, conv, err // the in-flight bound, as the translation grew
	}
	conv.err = err
	if herr := i.hold(rs, base+cap(rs.translated)); herr != nil {
		return nil, conv, herr
	}
	if len(body) == 0 {
		return nil, conv, nil
	}
	return body, conv, nil
}

// deltaPoints counts the data points of delta-temporality sums and
// histograms, which the translator refuses unless they are converted.
func deltaPoints(md pmetric.Metrics) int {
	n := 0
	rms := md.ResourceMetrics()
	for a := range rms.Len() {
		sms := rms.At(a).ScopeMetrics()
		for b := range sms.Len() {
			ms := sms.At(b).Metrics()
			for c := range ms.Len() {
				m := ms.At(c)
				switch m.Type() {
				case pmetric.MetricTypeSum:
					if m.Sum().AggregationTemporality() == pmetric.AggregationTemporalityDelta {
						n += m.Sum().DataPoints().Len()
					}
				case pmetric.MetricTypeHistogram:
					if m.Histogram().AggregationTemporality() == pmetric.AggregationTemporalityDelta {
						n += m.Histogram().DataPoints().Len()
					}
				case pmetric.MetricTypeExponentialHistogram:
					if m.ExponentialHistogram().AggregationTemporality() == pmetric.AggregationTemporalityDelta {
						n += m.ExponentialHistogram().DataPoints().Len()
					}
				}
			}
		}
	}
	return n
}

// translatorSettings are Prometheus' translator settings for a tenant's
// OTLP configuration, as Prometheus' own OTLP handler derives them.
func translatorSettings(o limits.OTLP, lookbackDelta time.Duration) prometheusremotewrite.Settings {
	pc := o.Prometheus()
	return prometheusremotewrite.Settings{
		AddMetricSuffixes:                    pc.TranslationStrategy.ShouldAddSuffixes(),
		AllowUTF8:                            !pc.TranslationStrategy.ShouldEscape(),
		PromoteResourceAttributes:            prometheusremotewrite.NewPromoteResourceAttributes(pc),
		KeepIdentifyingResourceAttributes:    pc.KeepIdentifyingResourceAttributes,
		ConvertHistogramsToNHCB:              pc.ConvertHistogramsToNHCB,
		PromoteScopeMetadata:                 pc.PromoteScopeMetadata,
		DisableTargetInfo:                    o.DisableTargetInfo,
		LookbackDelta:                        lookbackDelta,
		LabelNameUnderscoreSanitization:      pc.LabelNameUnderscoreSanitization,
		LabelNamePreserveMultipleUnderscores: pc.LabelNamePreserveMultipleUnderscores,
	}
}

// answerOTLP answers a request whose data went through the store: 200
// when all was stored, 200 with partial_success when some was rejected, 400
// when all of it was.
func answerOTLP(w http.ResponseWriter, stats *writeStats, conv conversion, asJSON bool) int {
	rejected := stats.rejectedTotal() + conv.rejectedPoints
	var msgs []string
	if conv.rejectedPoints > 0 {
		msgs = append(msgs, fmt.Sprintf("%d data points of delta temporality rejected: this tenant does not convert delta to cumulative (limits otlp.convert_delta_to_cumulative)", conv.rejectedPoints))
	}
	if conv.err != nil {
		msgs = append(msgs, fmt.Sprintf("translation: %v", conv.err))
	}
	if len(stats.rejected) > 0 {
		msgs = append(msgs, stats.errorSummary())
	}
	stored := stats.samples + stats.histograms + stats.deduplicated + stats.relabelDropped - stats.derivedAcked
	if len(msgs) > 0 && stored == 0 {
		return writeOTLPStatus(w, http.StatusBadRequest, 0, joinMessages(msgs), asJSON)
	}
	resp := pmetricotlp.NewExportResponse()
	if len(msgs) > 0 {
		resp.PartialSuccess().SetRejectedDataPoints(int64(rejected))
		resp.PartialSuccess().SetErrorMessage(joinMessages(msgs))
	}
	var b []byte
	var err error
	if asJSON {
		b, err = resp.MarshalJSON()
	} else {
		b, err = resp.MarshalProto()
	}
	if err != nil {
		return writeOTLPStatus(w, http.StatusInternalServerError, 0, err.Error(), asJSON)
	}
	w.Header().Set("Content-Type", contentType(asJSON))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
	return http.StatusOK
}

func joinMessages(msgs []string) string {
	var b bytes.Buffer
	for k, m := range msgs {
		if k > 0 {
			b.WriteString("; ")
		}
		b.WriteString(m)
	}
	return b.String()
}

func contentType(asJSON bool) string {
	if asJSON {
		return otlpJSON
	}
	return otlpProtobuf
}

// failOTLP answers a failed request with the status remote write would
// get, moved to the codes OTLP exporters act on: a 500 (a fault of
// gpustore's own, or of a receiver behind it) is 503, which they retry.
func (i *Ingester) failOTLP(w http.ResponseWriter, err error, asJSON bool) int {
	status, retryAfter := i.classify(err)
	switch status {
	case http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		status, retryAfter = http.StatusServiceUnavailable, max(retryAfter, 1)
	case http.StatusTooManyRequests:
		retryAfter = max(retryAfter, 1)
	}
	return writeOTLPStatus(w, status, retryAfter, err.Error(), asJSON)
}

// writeOTLPStatus writes a failure as the OTLP specification asks: a
// google.rpc.Status message in the request's encoding.
func writeOTLPStatus(w http.ResponseWriter, status, retryAfter int, msg string, asJSON bool) int {
	s := &statuspb.Status{Code: grpcCode(status), Message: msg}
	var b []byte
	var err error
	if asJSON {
		b, err = protojson.Marshal(s)
	} else {
		b, err = proto.Marshal(s)
	}
	if err != nil {
		b = []byte(msg)
	}
	if retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
	}
	w.Header().Set("Content-Type", contentType(asJSON))
	w.WriteHeader(status)
	_, _ = w.Write(b)
	return status
}

// grpcCode is the gRPC status code of an HTTP answer, as the OTLP
// specification pairs them.
func grpcCode(status int) int32 {
	switch status {
	case http.StatusBadRequest, http.StatusUnsupportedMediaType, http.StatusMethodNotAllowed:
		return 3 // INVALID_ARGUMENT
	case http.StatusUnauthorized:
		return 16 // UNAUTHENTICATED
	case http.StatusForbidden:
		return 7 // PERMISSION_DENIED
	case http.StatusRequestEntityTooLarge, http.StatusTooManyRequests:
		return 8 // RESOURCE_EXHAUSTED
	case http.StatusServiceUnavailable:
		return 14 // UNAVAILABLE
	}
	return 2 // UNKNOWN
}
