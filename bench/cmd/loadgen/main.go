// Command loadgen drives a Prometheus remote-write receiver (gpustore, or any
// other) with the gpusim GPU-cluster workload and measures it, and runs the
// source document's dashboard queries against a Prometheus-compatible API.
//
//	loadgen write --url=http://127.0.0.1:9201/api/v1/write --pid=$(pidof gpustore) --data-dir=./data
//	loadgen query --url=http://127.0.0.1:9201 --windows=1h,24h
//
// See bench/README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/common/model"

	"github.com/gpustore/gpustore/bench/gpusim"
	"github.com/gpustore/gpustore/bench/load"
)

const usage = `loadgen drives a remote-write receiver with the simulated GPU cluster and measures it.

Usage:
  loadgen write [flags]   write simulated history at a target rate or as fast as accepted;
                          report samples/s, latency, answers by code, receiver CPU, RSS, disk
  loadgen query [flags]   run the dashboard queries as range queries; report latency

Run "loadgen <command> -h" for the flags of a command.
`

func main() { os.Exit(exitCode()) }

// exitCode is main's body: it returns the exit code, so the deferred stop runs.
func exitCode() int {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "write":
		err = cmdWrite(ctx, log, args, os.Stdout)
	case "query":
		err = cmdQuery(ctx, log, args, os.Stdout)
	case "-h", "-help", "--help", "help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "loadgen: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "loadgen: %v\n", err)
		return 1
	}
	return 0
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func parseTime(s string, now time.Time) (time.Time, error) {
	if s == "" || s == "now" {
		return now, nil
	}
	return time.Parse(time.RFC3339, s)
}

// writeOpts are loadgen write's flags.
type writeOpts struct {
	url, protocol, tenant string
	cluster               string
	nodes, gpus           int
	seed                  uint64
	interval              time.Duration
	duration, end         string
	shards, maxPerSend    int
	rate                  float64
	pregenerate           bool
	pid                   int
	dataDir               string
	flushURL              string
	stopReceiver          bool
	idleTimeout           time.Duration
	progress              time.Duration
	timeout               time.Duration
	maxRetries            int
}

func cmdWrite(ctx context.Context, log *slog.Logger, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("write", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: loadgen write [flags]

Writes --duration of simulated history ending at --end, oldest first, one
replica (no __replica__ label: a fair comparison stores the same series
everywhere), at --rate samples/s or as fast as the receiver answers. Series are
sharded as Prometheus' queue manager does (one request in flight per shard, a
series always in the same shard), so each series arrives in time order.

With --pid, the receiver's CPU time (utime+stime from /proc/<pid>/stat) is
measured from the first request until it goes idle after the last, and its
peak RSS (VmHWM). With --data-dir, the directory's allocated bytes (du) per
accepted sample are reported after --flush-url is called and, with
--stop-receiver, after the receiver has exited on SIGTERM.

Flags:
`)
		fs.PrintDefaults()
	}
	var o writeOpts
	fs.StringVar(&o.url, "url", "http://127.0.0.1:9201/api/v1/write", "Remote-write endpoint.")
	fs.StringVar(&o.protocol, "protocol", "1.0", "Remote-write protocol: 1.0 or 2.0.")
	fs.StringVar(&o.tenant, "tenant", "", "X-Scope-OrgID (none when empty).")
	fs.StringVar(&o.cluster, "cluster.name", "gpu-cluster-bench", "Cluster name (the cluster external label).")
	fs.IntVar(&o.nodes, "cluster.nodes", 128, "Nodes (128 × 8 GPUs = 1024 GPUs).")
	fs.IntVar(&o.gpus, "cluster.gpus-per-node", 8, "GPUs per node.")
	fs.Uint64Var(&o.seed, "sim.seed", 1, "Simulator seed.")
	fs.DurationVar(&o.interval, "scrape.interval", 15*time.Second, "Scrape interval: one sample per series per interval.")
	fs.StringVar(&o.duration, "duration", "1h", "Simulated history to write (Prometheus duration: 30m, 1h, 7d).")
	fs.StringVar(&o.end, "end", "now", "Time of the last sample (RFC 3339 or now).")
	fs.IntVar(&o.shards, "shards", 4, "Requests in flight (series are sharded by label hash).")
	fs.IntVar(&o.maxPerSend, "max-samples-per-send", 2000, "Samples per request.")
	fs.Float64Var(&o.rate, "rate", 0, "Target samples/s (0: as fast as the receiver answers).")
	fs.BoolVar(&o.pregenerate, "pregenerate", true, "Encode every request before sending, so that generating the workload does not compete with the receiver for CPU (memory: ~32 bytes per 1.0 sample); false streams it.")
	fs.IntVar(&o.pid, "pid", 0, "Receiver's process id, for CPU and RSS (0: not measured).")
	fs.StringVar(&o.dataDir, "data-dir", "", "Receiver's data directory, for bytes per sample (empty: not measured).")
	fs.StringVar(&o.flushURL, "flush-url", "", "URL to GET before measuring the disk (VictoriaMetrics: http://127.0.0.1:8428/internal/force_flush).")
	fs.BoolVar(&o.stopReceiver, "stop-receiver", false, "Send SIGTERM to --pid and wait for it to exit before measuring --data-dir.")
	fs.DurationVar(&o.idleTimeout, "idle-timeout", time.Minute, "Longest wait for the receiver to go idle after the last answer.")
	fs.DurationVar(&o.progress, "progress", 10*time.Second, "Progress log interval.")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Second, "Request timeout.")
	fs.IntVar(&o.maxRetries, "max-retries", 10, "Retries of a request on 5xx, 429 or a network error.")
	if err := fs.Parse(args); err != nil {
		return err
	}
	d, err := model.ParseDuration(o.duration)
	if err != nil {
		return fmt.Errorf("--duration: %w", err)
	}
	end, err := parseTime(o.end, time.Now())
	if err != nil {
		return fmt.Errorf("--end: %w", err)
	}
	end = end.Truncate(o.interval)
	ticks := int(time.Duration(d) / o.interval)
	if ticks < 1 {
		ticks = 1
	}
	w := load.Workload{
		Cluster: gpusim.Config{Name: o.cluster, Nodes: o.nodes, GPUsPerNode: o.gpus, Seed: o.seed, TargetLabels: true},
		Start:   end.Add(-time.Duration(ticks-1) * o.interval), Ticks: ticks, Interval: o.interval,
		Protocol: gpusim.Protocol(o.protocol), MaxSamplesPerSend: o.maxPerSend, Shards: o.shards,
	}
	var src load.Source
	var stream *load.Stream
	var plan *load.Plan
	if o.pregenerate {
		log.Info("encoding the workload", "nodes", o.nodes, "gpus", o.nodes*o.gpus, "interval", o.interval, "history", o.duration)
		if plan, err = load.BuildPlan(ctx, w); err != nil {
			return err
		}
		st := plan.Stats
		log.Info("workload ready", "samples", st.Samples, "series", st.Series, "series_per_tick", st.SeriesPerTick,
			"requests", st.Requests, "body_bytes", st.Bytes, "took", st.Took.Round(time.Millisecond))
		src = plan.Source()
	} else {
		if stream, err = load.NewStream(ctx, w); err != nil {
			return err
		}
		src = stream
	}
	var p0 load.ProcSample
	if o.pid > 0 {
		if p0, err = load.ReadProc(o.pid); err != nil {
			return err
		}
	}
	log.Info("writing", "url", o.url, "protocol", o.protocol, "shards", o.shards, "rate", rateString(o.rate),
		"start", w.Start.Format(time.RFC3339), "end", end.Format(time.RFC3339))
	res, err := load.Run(ctx, load.DriverConfig{URL: o.url, Protocol: gpusim.Protocol(o.protocol), Tenant: o.tenant,
		Rate: o.rate, Timeout: o.timeout, MaxRetries: o.maxRetries, Progress: o.progress, Logger: log, PID: o.pid}, src)
	if err != nil {
		return err
	}
	var series int
	if stream != nil {
		st, err := stream.Stats()
		if err != nil {
			return err
		}
		series = st.Series
	} else {
		series = plan.Stats.Series
	}
	fmt.Fprintf(stdout, "write: %s\n", res)
	fmt.Fprintf(stdout, "write: %.0f samples/s accepted; latency p50 %s, p90 %s, p99 %s; answers %s; %d distinct series\n",
		res.Rate(), load.FmtDuration(res.Latency.P50), load.FmtDuration(res.Latency.P90), load.FmtDuration(res.Latency.P99),
		load.FormatCodes(res.Codes), series)
	if o.flushURL != "" {
		if err := get(ctx, o.flushURL); err != nil {
			return err
		}
	}
	if o.pid > 0 {
		waited, idle, err := load.WaitIdle(ctx, o.pid, 0.1, 3*time.Second, o.idleTimeout)
		if err != nil {
			return err
		}
		p1, err := load.ReadProc(o.pid)
		if err != nil {
			return err
		}
		cpu := load.CPUSeconds(p1.CPUTicks - p0.CPUTicks)
		perM := 0.0
		if res.Samples > 0 {
			perM = cpu / (float64(res.Samples) / 1e6)
		}
		fmt.Fprintf(stdout, "receiver: %.1f CPU-seconds (%.2f per million samples; idle %v after the last answer: %v), peak RSS %.0f MiB (%.2f KiB per series written)\n",
			cpu, perM, waited.Round(time.Millisecond), idle, float64(p1.HWM)/(1<<20), float64(p1.HWM)/1024/float64(max(series, 1)))
		if o.stopReceiver {
			if err := load.StopProcess(ctx, o.pid, time.Minute); err != nil {
				return err
			}
		}
	}
	if o.dataDir != "" {
		u, err := load.DirUsage(o.dataDir)
		if err != nil {
			return err
		}
		state := "receiver running"
		if o.stopReceiver {
			state = "receiver stopped"
		}
		per := func(b int64) float64 { return float64(b) / float64(max(res.Samples, 1)) }
		fmt.Fprintf(stdout, "disk: %.2f bytes per accepted sample in the local TSDB, %.2f in the embedded bucket (%s; %s)\n",
			per(u.Local()), per(u.Bucket), u, state)
	}
	return nil
}

func rateString(r float64) string {
	if r <= 0 {
		return "max"
	}
	return fmt.Sprintf("%.0f/s", r)
}

func get(ctx context.Context, u string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("flush %s: HTTP %d", u, resp.StatusCode)
	}
	return nil
}

func cmdQuery(ctx context.Context, log *slog.Logger, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("query", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: loadgen query [flags]

Runs the source document's dashboard panels (cluster overview, node detail,
training performance, NCCL) as range queries over each window ending at --end,
with Grafana's step (≈ range/250, at least --scrape.interval), one at a time,
--rounds times after --warmup unmeasured rounds, and prints per-panel and
per-window latency.

Flags:
`)
		fs.PrintDefaults()
	}
	base := fs.String("url", "http://127.0.0.1:9201", "Prometheus-compatible API root.")
	windows := fs.String("windows", "1h,24h,7d", "Comma-separated window lengths.")
	endFlag := fs.String("end", "now", "End of the windows (RFC 3339 or now).")
	interval := fs.Duration("scrape.interval", 15*time.Second, "Scrape interval of the data (smallest step).")
	rounds := fs.Int("rounds", 5, "Measured rounds.")
	warmup := fs.Int("warmup", 1, "Unmeasured rounds first.")
	node := fs.String("node", "gpu-node-003", "Node of the node-detail dashboard.")
	tenant := fs.String("tenant", "", "X-Scope-OrgID (none when empty).")
	panelSet := fs.String("panels", "dashboard", "Panel set: dashboard (the source document's dashboards) or issue42 (its six panels).")
	var params multiFlag
	fs.Var(&params, "param", "Extra query parameter k=v, repeatable (VictoriaMetrics: nocache=1).")
	if err := fs.Parse(args); err != nil {
		return err
	}
	end, err := parseTime(*endFlag, time.Now())
	if err != nil {
		return fmt.Errorf("--end: %w", err)
	}
	var panels []load.Query
	switch *panelSet {
	case "dashboard":
		panels = load.DashboardQueries(*node)
	case "issue42":
		panels = load.Issue42Panels
	default:
		return fmt.Errorf("--panels %q: want dashboard or issue42", *panelSet)
	}
	extra := url.Values{}
	for _, p := range params {
		k, v, ok := strings.Cut(p, "=")
		if !ok {
			return fmt.Errorf("--param %q: want k=v", p)
		}
		extra.Add(k, v)
	}
	summary := load.Table{Header: []string{"window", "step", "queries", "p50", "p90", "p99", "max", "errors"}}
	for _, ws := range strings.Split(*windows, ",") {
		d, err := model.ParseDuration(strings.TrimSpace(ws))
		if err != nil {
			return fmt.Errorf("--windows %q: %w", ws, err)
		}
		log.Info("querying", "window", ws, "rounds", *rounds)
		qr, err := load.RunQueries(ctx, load.QueryConfig{BaseURL: *base, Queries: panels, End: end,
			Range: time.Duration(d), ScrapeInterval: *interval, Rounds: *rounds, Warmup: *warmup, Params: extra, Tenant: *tenant})
		if err != nil {
			return err
		}
		per := load.Table{Header: []string{"panel (" + ws + ")", "series", "points", "p50", "p99", "error"}}
		for _, q := range qr.Queries {
			per.AddRow(q.Dashboard+": "+q.Panel, fmt.Sprint(q.Series), fmt.Sprint(q.Points),
				load.FmtDuration(q.Latency.P50), load.FmtDuration(q.Latency.P99), truncate(q.Err, 60))
		}
		fmt.Fprintf(stdout, "\n%s", per.String())
		l := qr.Latency
		summary.AddRow(ws, qr.Step.String(), fmt.Sprint(l.N), load.FmtDuration(l.P50), load.FmtDuration(l.P90),
			load.FmtDuration(l.P99), load.FmtDuration(l.Max), fmt.Sprint(qr.Errors))
	}
	fmt.Fprintf(stdout, "\n%s", summary.String())
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
