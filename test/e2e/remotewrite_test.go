package e2e

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	promapi "github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"

	"github.com/gpustore/gpustore/internal/testbin"
)

// gpuPage serves a small dcgm-exporter-like page whose values change on
// every scrape: gauges that move, an energy counter that grows, and a
// training iteration-time histogram.
func gpuPage() http.Handler {
	var scrapes atomic.Int64
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		n := scrapes.Add(1)
		var b strings.Builder
		b.WriteString("# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).\n# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n")
		for node := 0; node < 2; node++ {
			for gpu := 0; gpu < 8; gpu++ {
				fmt.Fprintf(&b, "DCGM_FI_DEV_GPU_TEMP{gpu=\"%d\",UUID=\"GPU-%d-%d\",device=\"nvidia%d\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-%d\"} %d\n",
					gpu, node, gpu, gpu, node, 50+(int(n)+gpu*3+node)%30)
			}
		}
		b.WriteString("# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).\n# TYPE DCGM_FI_DEV_POWER_USAGE gauge\n")
		for node := 0; node < 2; node++ {
			for gpu := 0; gpu < 8; gpu++ {
				fmt.Fprintf(&b, "DCGM_FI_DEV_POWER_USAGE{gpu=\"%d\",Hostname=\"node-%d\"} %.3f\n", gpu, node, 300+100*math.Sin(float64(n)/3+float64(gpu)))
			}
		}
		b.WriteString("# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot (in mJ).\n# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n")
		for gpu := 0; gpu < 8; gpu++ {
			fmt.Fprintf(&b, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu=\"%d\",Hostname=\"node-0\"} %d\n", gpu, 1_000_000+n*int64(300_000+gpu*1000))
		}
		b.WriteString("# HELP training_iteration_time_seconds Time per training iteration.\n# TYPE training_iteration_time_seconds histogram\n")
		cum := 0.0
		for i, le := range []string{"0.1", "0.25", "0.5", "1", "2", "5", "10", "+Inf"} {
			cum += float64(n) * float64((i+1)%4)
			fmt.Fprintf(&b, "training_iteration_time_seconds_bucket{job_name=\"llama\",rank=\"0\",le=\"%s\"} %g\n", le, cum)
		}
		fmt.Fprintf(&b, "training_iteration_time_seconds_sum{job_name=\"llama\",rank=\"0\"} %g\ntraining_iteration_time_seconds_count{job_name=\"llama\",rank=\"0\"} %g\n", float64(n)*7.5, cum)
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = w.Write([]byte(b.String()))
	})
}

func promClient(t *testing.T, url string) promv1.API {
	t.Helper()
	c, err := promapi.NewClient(promapi.Config{Address: url})
	if err != nil {
		t.Fatal(err)
	}
	return promv1.NewAPI(c)
}

// canonical renders a query result in a stable form: series sorted, values
// exact (both sides hold the same float samples, so PromQL must agree to the bit).
func canonical(v model.Value) string {
	var lines []string
	switch r := v.(type) {
	case model.Vector:
		for _, s := range r {
			lines = append(lines, fmt.Sprintf("%s @%d = %s", s.Metric, s.Timestamp, s.Value))
		}
	case model.Matrix:
		for _, s := range r {
			var pts []string
			for _, p := range s.Values {
				pts = append(pts, fmt.Sprintf("%d:%s", p.Timestamp, p.Value))
			}
			lines = append(lines, fmt.Sprintf("%s %s", s.Metric, strings.Join(pts, " ")))
		}
	default:
		return v.String()
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// sameRange waits (30 s at most) until the range query q answers gpustore
// exactly as Prometheus, not empty.
func sameRange(t *testing.T, prom, gs promv1.API, q string, r promv1.Range) {
	t.Helper()
	ctx := context.Background()
	waitFor(t, 30*time.Second, "range "+q, func() error {
		pv, _, _, err := prom.QueryRange(ctx, q, r)
		if err != nil {
			return err
		}
		gv, _, _, err := gs.QueryRange(ctx, q, r)
		if err != nil {
			return err
		}
		if got, want := canonical(gv), canonical(pv); got != want || want == "" {
			return fmt.Errorf("gpustore:\n%s\nprometheus:\n%s", got, want)
		}
		return nil
	})
}

// TestRealPrometheusRemoteWrite: a real Prometheus scrapes GPU metrics and
// remote-writes them to gpustore (1.0, then 2.0); the same PromQL queries
// against Prometheus' own API and gpustore's return identical results.
func TestRealPrometheusRemoteWrite(t *testing.T) {
	bin := testbin.Need(t, "prometheus")
	for _, proto := range []string{"1.0", "2.0"} {
		t.Run("remote_write_"+proto, func(t *testing.T) {
			_, gsURL := startGpustore(t, nil)
			page := httptest.NewServer(gpuPage())
			defer page.Close()
			protoLine := ""
			if proto == "2.0" {
				protoLine = "    protobuf_message: io.prometheus.write.v2.Request\n"
			}
			cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: dcgm-exporter
    static_configs:
      - targets: [%q]
remote_write:
  - url: %s/api/v1/write
%s    queue_config:
      batch_send_deadline: 500ms
      max_samples_per_send: 500
    metadata_config:
      send_interval: 1s
`, strings.TrimPrefix(page.URL, "http://"), gsURL, protoLine)
			promURL := startPrometheus(t, bin, cfg, "--enable-feature=metadata-wal-records")
			prom, gs := promClient(t, promURL), promClient(t, gsURL)
			ctx := context.Background()

			// Let Prometheus scrape for a while.
			var evalAt time.Time
			waitFor(t, 60*time.Second, "15 scrapes in Prometheus", func() error {
				v, _, _, err := prom.Query(ctx, `count_over_time(DCGM_FI_DEV_GPU_TEMP{gpu="0",Hostname="node-0"}[1m])`, time.Now())
				if err != nil {
					return err
				}
				if vec, ok := v.(model.Vector); !ok || len(vec) != 1 || vec[0].Value < 15 {
					return fmt.Errorf("not yet: %v", v)
				}
				evalAt = time.Now().Add(-3 * time.Second).Truncate(time.Second)
				return nil
			})

			queries := []string{
				`DCGM_FI_DEV_GPU_TEMP`,
				`rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5s])`,
				`sum by (Hostname) (DCGM_FI_DEV_POWER_USAGE)`,
				`histogram_quantile(0.9, sum by (le) (rate(training_iteration_time_seconds_bucket[5s])))`,
				`up`,
			}
			// Remote write lags scraping by up to a batch deadline: poll
			// until gpustore has caught up to evalAt, then demand equality.
			for _, q := range queries {
				var want string
				waitFor(t, 30*time.Second, "instant "+q, func() error {
					pv, _, _, err := prom.Query(ctx, q, evalAt)
					if err != nil {
						return err
					}
					want = canonical(pv)
					gv, _, _, err := gs.Query(ctx, q, evalAt)
					if err != nil {
						return err
					}
					if got := canonical(gv); got != want || want == "" {
						return fmt.Errorf("gpustore:\n%s\nprometheus:\n%s", got, want)
					}
					return nil
				})
				sameRange(t, prom, gs, q, promv1.Range{Start: evalAt.Add(-10 * time.Second), End: evalAt, Step: time.Second})
			}

			// Series and label APIs agree too.
			pl, _, _, err := prom.LabelValues(ctx, "Hostname", nil, evalAt.Add(-time.Minute), evalAt)
			if err != nil {
				t.Fatal(err)
			}
			gl, _, _, err := gs.LabelValues(ctx, "Hostname", nil, evalAt.Add(-time.Minute), evalAt)
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(pl) != fmt.Sprint(gl) {
				t.Fatalf("label values: gpustore %v, prometheus %v", gl, pl)
			}

			// Metadata arrives over remote write (1.0: metadata messages;
			// 2.0: per-series metadata from the metadata WAL records).
			waitFor(t, 30*time.Second, "metadata", func() error {
				md, err := gs.Metadata(ctx, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "")
				if err != nil {
					return err
				}
				m := md["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]
				if len(m) != 1 || m[0].Type != "counter" || !strings.Contains(m[0].Help, "energy") {
					return fmt.Errorf("metadata %+v", md)
				}
				return nil
			})
		})
	}
}
