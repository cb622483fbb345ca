package load

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Query is one dashboard panel's PromQL.
type Query struct {
	Dashboard, Panel, Expr string
}

// DashboardQueries returns the panels of the source document's Grafana
// dashboards (§3: cluster overview, node detail with the 8-GPU heatmap,
// training performance, NCCL/NVLink), for the node shown on the node-detail
// dashboard. The document's cluster-overview panels read recording rules
// (cluster:gpu_power_draw:sum, ...); a plain receiver has no rules, so their
// expressions are used instead. Its data-loading-ratio panel divides by the
// histogram training_iteration_time_seconds, which has no plain series: the
// mean iteration time from _sum/_count replaces it.
func DashboardQueries(node string) []Query {
	h := fmt.Sprintf("{Hostname=%q}", node)
	return []Query{
		{"cluster overview", "GPUs", `count(DCGM_FI_DEV_GPU_UTIL)`},
		{"cluster overview", "healthy GPUs", `count(DCGM_FI_DEV_GPU_UTIL) - count(DCGM_FI_DEV_XID_ERRORS > 0)`},
		{"cluster overview", "total power (kW)", `sum(DCGM_FI_DEV_POWER_USAGE) / 1000`},
		{"cluster overview", "average GPU utilisation", `avg(DCGM_FI_DEV_GPU_UTIL)`},
		{"cluster overview", "hottest GPU", `max(DCGM_FI_DEV_GPU_TEMP)`},
		{"cluster overview", "active training jobs", `count(kube_job_status_active{namespace="training"})`},
		{"cluster overview", "ECC SBE rate", `rate(DCGM_FI_DEV_ECC_SBE_VOL_TOTAL[5m])`},
		{"node detail", "8-GPU temperature heatmap", `DCGM_FI_DEV_GPU_TEMP` + h},
		{"node detail", "power", `DCGM_FI_DEV_POWER_USAGE` + h},
		{"node detail", "utilisation", `DCGM_FI_DEV_GPU_UTIL` + h},
		{"node detail", "framebuffer used %", `DCGM_FI_DEV_FB_USED` + h + ` / DCGM_FI_DEV_FB_TOTAL` + h + ` * 100`},
		{"node detail", "NVLink bandwidth", `rate(DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL` + h + `[5m])`},
		{"node detail", "PCIe TX", `DCGM_FI_PROF_PCIE_TX_BYTES` + h},
		{"training", "tokens/GPU/s", `training_tokens_per_second`},
		{"training", "MFU", `avg by (job_name) (training_mfu_percent)`},
		{"training", "iteration time p99", `histogram_quantile(0.99, sum by (le, job_name) (rate(training_iteration_time_seconds_bucket[5m])))`},
		{"training", "loss", `training_loss`},
		{"training", "gradient norm", `training_gradient_norm`},
		{"training", "data loading share %", `avg by (job_name) (training_data_load_time_seconds) / (sum by (job_name) (rate(training_iteration_time_seconds_sum[5m])) / sum by (job_name) (rate(training_iteration_time_seconds_count[5m]))) * 100`},
		{"NCCL", "NVLink CRC errors", `sum by (Hostname) (rate(DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL[5m]))`},
		{"NCCL", "PCIe replays", `sum by (Hostname) (rate(DCGM_FI_DEV_PCIE_REPLAY_COUNTER[5m]))`},
		{"NCCL", "NIC drops", `sum by (node) (rate(node_network_transmit_drop_total[5m]))`},
	}
}

// Issue42Panels are the six panels of issue 42, as Grafana's dcgm-exporter
// dashboards and the source document's overview draw them.
var Issue42Panels = []Query{
	{Dashboard: "overview", Panel: "avg util", Expr: `avg(DCGM_FI_DEV_GPU_UTIL)`},
	{Dashboard: "overview", Panel: "max temp by host", Expr: `max by (Hostname) (DCGM_FI_DEV_GPU_TEMP)`},
	{Dashboard: "overview", Panel: "power by host (energy rate)", Expr: `sum by (Hostname) (rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5m]))`},
	{Dashboard: "node", Panel: "power by GPU", Expr: `avg by (Hostname, gpu) (DCGM_FI_DEV_POWER_USAGE)`},
	{Dashboard: "node", Panel: "max temp over 1h", Expr: `max_over_time(DCGM_FI_DEV_GPU_TEMP[1h])`},
	{Dashboard: "overview", Panel: "p90 SM clock", Expr: `quantile(0.9, DCGM_FI_DEV_SM_CLOCK)`},
}

// GrafanaStep is the step Grafana's Prometheus data source would use for a
// panel over rng: about rng/250 points' worth, never below the data's
// scrape interval, rounded to whole seconds.
func GrafanaStep(rng, scrapeInterval time.Duration) time.Duration {
	step := (rng / 250).Round(time.Second)
	return max(step, scrapeInterval, time.Second)
}

// QueryConfig configures a query benchmark run.
type QueryConfig struct {
	// BaseURL is the Prometheus-compatible API root (http://127.0.0.1:9201).
	BaseURL string
	Queries []Query
	// End and Range define the window; Step 0 means GrafanaStep(Range,
	// ScrapeInterval). Start and end are aligned to the step, as Grafana does.
	End            time.Time
	Range          time.Duration
	Step           time.Duration
	ScrapeInterval time.Duration
	// Rounds is how many times the whole set runs after Warmup unmeasured
	// rounds (defaults 5 and 1). Queries run one at a time, like one
	// dashboard's panels loading in sequence.
	Rounds, Warmup int
	// Params are extra form parameters (VictoriaMetrics: nocache=1) and
	// Headers extra request headers (gpustore: Cache-Control: no-store).
	Params  url.Values
	Headers http.Header
	// Shift moves the window by this much each round (warm-up rounds
	// included), as a dashboard refreshed every Shift does; start and end
	// are aligned to the step after the shift, as Grafana does.
	Shift   time.Duration
	Tenant  string
	Timeout time.Duration // per query, default 2m
	Client  *http.Client
}

// QueryStat is one query's outcome over the measured rounds.
type QueryStat struct {
	Query
	Latency LatencySummary
	// Series and Points of the last answer: a sanity check that every system
	// answered the same question with comparable data.
	Series, Points int
	Err            string
}

// QueryResult is a query benchmark's outcome.
type QueryResult struct {
	Step    time.Duration
	Start   time.Time
	End     time.Time
	Latency LatencySummary // every measured query of every round
	Queries []QueryStat
	Errors  int
}

// RunQueries runs cfg.Queries as range queries and measures their latency.
func RunQueries(ctx context.Context, cfg QueryConfig) (QueryResult, error) {
	if cfg.Rounds <= 0 {
		cfg.Rounds = 5
	}
	if cfg.Warmup < 0 {
		cfg.Warmup = 0
	} else if cfg.Warmup == 0 {
		cfg.Warmup = 1
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Minute
	}
	if cfg.Client == nil {
		cfg.Client = http.DefaultClient
	}
	step := cfg.Step
	if step <= 0 {
		step = GrafanaStep(cfg.Range, cfg.ScrapeInterval)
	}
	end := cfg.End.Truncate(step)
	start := end.Add(-cfg.Range).Truncate(step)
	res := QueryResult{Step: step, Start: start, End: end, Queries: make([]QueryStat, len(cfg.Queries))}
	per := make([][]time.Duration, len(cfg.Queries))
	var all []time.Duration
	for round := 0; round < cfg.Warmup+cfg.Rounds; round++ {
		if cfg.Shift != 0 {
			end = cfg.End.Add(time.Duration(round) * cfg.Shift).Truncate(step)
			start = end.Add(-cfg.Range).Truncate(step)
			res.End = end
		}
		for i, q := range cfg.Queries {
			if err := ctx.Err(); err != nil {
				return res, err
			}
			took, series, points, err := rangeQuery(ctx, cfg, q.Expr, start, end, step)
			st := &res.Queries[i]
			st.Query = q
			if err != nil {
				st.Err = err.Error()
				if round >= cfg.Warmup {
					res.Errors++
				}
				continue
			}
			st.Series, st.Points = series, points
			if round >= cfg.Warmup {
				per[i] = append(per[i], took)
				all = append(all, took)
			}
		}
	}
	for i := range per {
		res.Queries[i].Latency = Summarize(per[i])
	}
	res.Latency = Summarize(all)
	return res, nil
}

// promResponse is the part of a Prometheus API answer the benchmark reads.
type promResponse struct {
	Status    string `json:"status"`
	ErrorType string `json:"errorType"`
	Error     string `json:"error"`
	Data      struct {
		ResultType string `json:"resultType"`
		Result     []struct {
			Values     []json.RawMessage `json:"values"`
			Histograms []json.RawMessage `json:"histograms"`
		} `json:"result"`
	} `json:"data"`
}

func rangeQuery(ctx context.Context, cfg QueryConfig, expr string, start, end time.Time, step time.Duration) (time.Duration, int, int, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	form := url.Values{}
	for k, v := range cfg.Params {
		form[k] = v
	}
	form.Set("query", expr)
	form.Set("start", strconv.FormatInt(start.Unix(), 10))
	form.Set("end", strconv.FormatInt(end.Unix(), 10))
	form.Set("step", strconv.FormatFloat(step.Seconds(), 'f', -1, 64))
	// POST with a form body, as Grafana's Prometheus data source does.
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(cfg.BaseURL, "/")+"/api/v1/query_range", strings.NewReader(form.Encode()))
	if err != nil {
		return 0, 0, 0, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if cfg.Tenant != "" {
		req.Header.Set("X-Scope-OrgID", cfg.Tenant)
	}
	for k, v := range cfg.Headers {
		req.Header[k] = v
	}
	t0 := time.Now()
	resp, err := cfg.Client.Do(req)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("query %q: %w", expr, err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	took := time.Since(t0)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("query %q: read answer: %w", expr, err)
	}
	var pr promResponse
	if err := json.Unmarshal(body, &pr); err != nil {
		return 0, 0, 0, fmt.Errorf("query %q: HTTP %d: %.200s", expr, resp.StatusCode, body)
	}
	if resp.StatusCode != http.StatusOK || pr.Status != "success" {
		return 0, 0, 0, fmt.Errorf("query %q: HTTP %d: %s: %s", expr, resp.StatusCode, pr.ErrorType, pr.Error)
	}
	points := 0
	for _, r := range pr.Data.Result {
		points += len(r.Values) + len(r.Histograms)
	}
	return took, len(pr.Data.Result), points, nil
}
