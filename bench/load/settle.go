package load

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// WaitCompacted waits until a gpustore that ships and compacts has settled:
// the head has cut its blocks and none waits for upload; then two compaction
// passes (the first compacts and downsamples what was uploaded and marks the
// sources, the second deletes them with the bench's zero delete delay), two
// bucket-store syncs and a local block reload have happened. Queries then
// read the compacted blocks, and the disk holds one copy of the raw data
// (plus its 5m and 1h blocks). It is a no-op for systems without Compacts.
func (s *System) WaitCompacted(ctx context.Context, timeout time.Duration, progress func(string)) error {
	if !s.Compacts {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// Phases: 0 blocks to cut from the head or to upload; 1 waiting for two compaction passes; 2
	// waiting for two bucket-store syncs (one may have started before the
	// second pass ended and missed its deletions), and for the local TSDB's
	// block reload (once a minute) to drop the uploaded blocks past the
	// local retention.
	phase, mark := 0, 0.0
	var shipped time.Time
	var lastLog time.Time
	for {
		m, err := s.scrape(ctx)
		if err != nil {
			return err
		}
		passes := m.count("gpustore_compact_pass_duration_seconds")
		syncs := m.sum("gpustore_bucketstore_tenant_syncs_total")
		switch {
		case phase == 0 && m.max("gpustore_tsdb_head_span_seconds") <= headSpanCut && m.sum("gpustore_shipper_pending_blocks") == 0:
			phase, mark, shipped = 1, passes, time.Now()
		case phase == 1 && passes >= mark+2:
			phase, mark = 2, syncs
		case phase == 2 && syncs >= mark+2 && time.Since(shipped) > reloadInterval:
			return nil
		}
		if progress != nil && time.Since(lastLog) > 10*time.Second {
			lastLog = time.Now()
			progress(fmt.Sprintf("head span %.0fs, pending uploads %.0f, compactions %.0f, blocks compacted %.0f, blocks deleted %.0f",
				m.max("gpustore_tsdb_head_span_seconds"), m.sum("gpustore_shipper_pending_blocks"), m.sum("gpustore_compact_compactions_total"),
				m.sum("gpustore_compact_blocks_compacted_total"), m.sum("gpustore_compact_deleted_blocks_total")))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: compaction not settled (phase %d): %w", s.Name, phase, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

// headSpanCut is the head span (seconds) above which gpustore's TSDB still
// cuts blocks: 1.5 × the 2 h block duration.
const headSpanCut = 3 * 3600

// reloadInterval: the TSDB reloads its blocks, applying retention, every
// minute.
const reloadInterval = 65 * time.Second

// metricFamilies is one scrape of a system's /metrics.
type metricFamilies map[string]*struct{ sum, count, max float64 }

func (m metricFamilies) sum(name string) float64 {
	if f := m[name]; f != nil {
		return f.sum
	}
	return 0
}

func (m metricFamilies) max(name string) float64 {
	if f := m[name]; f != nil {
		return f.max
	}
	return 0
}

func (m metricFamilies) count(name string) float64 {
	if f := m[name]; f != nil {
		return f.count
	}
	return 0
}

func (s *System) scrape(ctx context.Context) (metricFamilies, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.Addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s /metrics: %w", s.Name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s /metrics: HTTP %d", s.Name, resp.StatusCode)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s /metrics: %w", s.Name, err)
	}
	out := metricFamilies{}
	for name, f := range fams {
		v := &struct{ sum, count, max float64 }{}
		for _, m := range f.GetMetric() {
			x := m.GetCounter().GetValue() + m.GetGauge().GetValue() + m.GetUntyped().GetValue()
			v.sum += x
			v.max = max(v.max, x)
			v.count += float64(m.GetHistogram().GetSampleCount())
		}
		out[name] = v
	}
	return out, nil
}
