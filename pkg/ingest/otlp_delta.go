package ingest

import (
	"context"
	"fmt"
	"sync"

	"github.com/open-telemetry/opentelemetry-collector-contrib/processor/deltatocumulativeprocessor"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/processor"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/gpustore/gpustore/pkg/limits"
)

// deltaConverter adds a tenant's delta-temporality sums and histograms up
// into cumulative ones with the Collector's deltatocumulative processor,
// the one Prometheus runs for --enable-feature=otlp-deltatocumulative. Its
// running totals are per tenant, in memory: they start again from zero
// after a restart, as Prometheus' do, and a retried request is added twice
// (the processor keeps no idea of requests).
type deltaConverter struct {
	proc processor.Metrics
}

// convertedKey carries, through the processor, where its output goes.
type convertedKey struct{}

func newDeltaConverter(lim limits.Limits) (*deltaConverter, error) {
	fac := deltatocumulativeprocessor.NewFactory()
	cfg := fac.CreateDefaultConfig().(*deltatocumulativeprocessor.Config)
	if lim.MaxActiveSeries > 0 {
		// A stream per series at most: past it the processor drops new
		// streams' points rather than grow without bound.
		cfg.MaxStreams = lim.MaxActiveSeries
	}
	next, err := consumer.NewMetrics(func(ctx context.Context, md pmetric.Metrics) error {
		*ctx.Value(convertedKey{}).(*pmetric.Metrics) = md
		return nil
	})
	if err != nil {
		return nil, err
	}
	set := processor.Settings{
		ID:                component.NewID(fac.Type()),
		TelemetrySettings: component.TelemetrySettings{MeterProvider: noop.NewMeterProvider()},
	}
	proc, err := fac.CreateMetrics(context.Background(), set, cfg, next)
	if err != nil {
		return nil, err
	}
	if err := proc.Start(context.Background(), nil); err != nil {
		return nil, err
	}
	return &deltaConverter{proc: proc}, nil
}

// toCumulative returns md with its delta points made cumulative; points
// the processor cannot add up (out of order, past its stream limit) are
// left out, as in Prometheus.
func (d *deltaConverter) toCumulative(ctx context.Context, md pmetric.Metrics) (pmetric.Metrics, error) {
	out := pmetric.NewMetrics()
	if err := d.proc.ConsumeMetrics(context.WithValue(ctx, convertedKey{}, &out), md); err != nil {
		return pmetric.Metrics{}, err
	}
	return out, nil
}

// tenantDeltas is a tenant's delta converter, made on its first delta
// point.
type tenantDeltas struct {
	once sync.Once
	conv *deltaConverter
	err  error
}

// deltas returns the tenant's delta converter.
func (st *tenantState) deltas(lim limits.Limits) (*deltaConverter, error) {
	st.delta.once.Do(func() {
		st.delta.conv, st.delta.err = newDeltaConverter(lim)
		if st.delta.err != nil {
			st.delta.err = fmt.Errorf("start delta-to-cumulative conversion: %w", st.delta.err)
		}
	})
	return st.delta.conv, st.delta.err
}
