package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	promapi "github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/resource"

	"github.com/gpustore/gpustore/internal/testbin"
)

// fanOut exports every collection to each exporter, so the stores are sent
// exactly the same points (two readers would each stamp their own times).
type fanOut []sdkmetric.Exporter

func (f fanOut) Temporality(k sdkmetric.InstrumentKind) metricdata.Temporality {
	return f[0].Temporality(k)
}

func (f fanOut) Aggregation(k sdkmetric.InstrumentKind) sdkmetric.Aggregation {
	return f[0].Aggregation(k)
}

func (f fanOut) Export(ctx context.Context, rm *metricdata.ResourceMetrics) error {
	var errs []error
	for _, e := range f {
		errs = append(errs, e.Export(ctx, rm))
	}
	return errors.Join(errs...)
}

func (f fanOut) ForceFlush(ctx context.Context) error {
	var errs []error
	for _, e := range f {
		errs = append(errs, e.ForceFlush(ctx))
	}
	return errors.Join(errs...)
}

func (f fanOut) Shutdown(ctx context.Context) error {
	var errs []error
	for _, e := range f {
		errs = append(errs, e.Shutdown(ctx))
	}
	return errors.Join(errs...)
}

func otlpExporter(t *testing.T, url, tenant string) sdkmetric.Exporter {
	t.Helper()
	opts := []otlpmetrichttp.Option{otlpmetrichttp.WithEndpointURL(url), otlpmetrichttp.WithCompression(otlpmetrichttp.GzipCompression)}
	if tenant != "" {
		opts = append(opts, otlpmetrichttp.WithHeaders(map[string]string{"X-Scope-OrgID": tenant}))
	}
	e, err := otlpmetrichttp.New(context.Background(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestRealOTelExporter: the OpenTelemetry Go SDK's OTLP/HTTP exporter sends
// GPU gauges, an energy counter, a classic and an exponential histogram,
// with resource attributes, to gpustore (tenant "otlp") and to a real
// Prometheus' OTLP receiver. Prometheus also remote-writes (2.0) what it
// received into gpustore's tenant "both", which the exporter writes too:
// the same GPU metrics by both protocols into one tenant. PromQL answers of
// both tenants equal Prometheus' own.
func TestRealOTelExporter(t *testing.T) {
	bin := testbin.Need(t, "prometheus")
	_, gsURL := startGpustore(t, nil)
	cfg := fmt.Sprintf(`global:
  evaluation_interval: 1s
remote_write:
  - url: %s/api/v1/write
    protobuf_message: io.prometheus.write.v2.Request
    headers:
      X-Scope-OrgID: both
    queue_config:
      batch_send_deadline: 500ms
`, gsURL)
	promURL := startPrometheus(t, bin, cfg, "--web.enable-otlp-receiver", "--enable-feature=metadata-wal-records")

	res := resource.NewSchemaless(
		attribute.String("service.name", "dcgm-exporter"),
		attribute.String("service.instance.id", "node-0:9400"),
		attribute.String("host.name", "node-0"),
		attribute.String("k8s.namespace.name", "gpu-operator"),
	)
	exp := fanOut{
		otlpExporter(t, gsURL+"/otlp/v1/metrics", "otlp"),
		otlpExporter(t, gsURL+"/api/v1/otlp/v1/metrics", "both"),
		otlpExporter(t, promURL+"/api/v1/otlp/v1/metrics", ""),
	}
	reader := sdkmetric.NewPeriodicReader(exp, sdkmetric.WithInterval(time.Second))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithResource(res), sdkmetric.WithReader(reader),
		sdkmetric.WithView(sdkmetric.NewView(sdkmetric.Instrument{Name: "inference.latency"},
			sdkmetric.Stream{Aggregation: sdkmetric.AggregationBase2ExponentialHistogram{MaxSize: 160, MaxScale: 20}})))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	m := mp.Meter("dcgm")
	temp, _ := m.Float64Gauge("DCGM_FI_DEV_GPU_TEMP", metric.WithDescription("GPU temperature (in C)."))
	energy, _ := m.Int64Counter("gpu.energy", metric.WithUnit("mJ"))
	iter, _ := m.Float64Histogram("training.iteration.time", metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(0.1, 0.25, 0.5, 1, 2, 5))
	lat, _ := m.Float64Histogram("inference.latency", metric.WithUnit("s"))

	ctx := context.Background()
	start := time.Now()
	for n := 0; time.Since(start) < 12*time.Second; n++ {
		for gpu := range 4 {
			a := metric.WithAttributes(attribute.String("gpu", fmt.Sprint(gpu)), attribute.String("UUID", fmt.Sprintf("GPU-%d", gpu)),
				attribute.String("modelName", "NVIDIA H100 80GB HBM3"))
			temp.Record(ctx, 50+float64((n+gpu*3)%30), a)
			energy.Add(ctx, int64(30_000+gpu*100), a)
		}
		for k := range 5 {
			iter.Record(ctx, 0.05+math.Mod(float64(n*5+k)*0.37, 3), metric.WithAttributes(attribute.String("rank", "0")))
			lat.Record(ctx, 0.001*float64(1+(n*5+k)%200), metric.WithAttributes(attribute.String("model", "llama")))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := mp.ForceFlush(ctx); err != nil {
		t.Fatalf("export: %v", err)
	}
	evalAt := time.Now().Add(-2 * time.Second).Truncate(time.Second)

	prom := promClient(t, promURL)
	queries := []string{
		`DCGM_FI_DEV_GPU_TEMP`,
		`rate(gpu_energy_mJ_total[5s])`,
		`histogram_quantile(0.9, sum by (le) (rate(training_iteration_time_seconds_bucket[5s])))`,
		`training_iteration_time_seconds_count`,
		`histogram_quantile(0.9, rate(inference_latency_seconds[5s]))`,
		`histogram_count(inference_latency_seconds)`,
		`target_info`,
		`DCGM_FI_DEV_GPU_TEMP * on (job, instance) group_left (host_name) target_info`,
	}
	// Tenant both was written by remote write 2.0 too (only Prometheus
	// sends 2.0 here), not by the exporter alone.
	waitFor(t, 30*time.Second, "remote write 2.0 into tenant both", func() error {
		resp, err := http.Get(gsURL + "/metrics")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if !strings.Contains(string(b), `gpustore_ingest_requests_total{code="204",protocol="2.0"}`) {
			return errors.New("no 2.0 write answered 204 yet")
		}
		return nil
	})
	for _, tenant := range []string{"otlp", "both"} {
		gs := promClientTenant(t, gsURL, tenant)
		for _, q := range queries {
			sameRange(t, prom, gs, q, promv1.Range{Start: evalAt.Add(-8 * time.Second), End: evalAt, Step: time.Second})
		}
	}
}

// promClientTenant is promClient for one tenant of gpustore.
func promClientTenant(t *testing.T, url, tenant string) promv1.API {
	t.Helper()
	c, err := promapi.NewClient(promapi.Config{Address: url, RoundTripper: tenantTransport(tenant)})
	if err != nil {
		t.Fatal(err)
	}
	return promv1.NewAPI(c)
}

type tenantTransport string

func (tt tenantTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-Scope-OrgID", string(tt))
	return http.DefaultTransport.RoundTrip(r)
}
