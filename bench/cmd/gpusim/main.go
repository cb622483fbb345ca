// Command gpusim simulates a GPU training cluster (dcgm-exporter,
// node-exporter, cAdvisor, kube-state-metrics and training-job metrics) and
// either serves it as /metrics pages for a real Prometheus, or plays a
// Prometheus HA pair writing it to a remote-write endpoint, in real time, as
// fast as the receiver accepts, or as a backfill of days of history.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/common/model"

	"github.com/gpustore/gpustore/bench/gpusim"
)

const usage = `gpusim simulates a GPU training cluster for gpustore.

Usage:
  gpusim serve    [flags]   serve /metrics pages for a real Prometheus to scrape
  gpusim write    [flags]   remote-write as a Prometheus HA pair (real time or --fast)
  gpusim backfill [flags]   remote-write days of history as fast as possible
  gpusim catalogue          print the metric catalogue (name, type, help)

Run "gpusim <command> -h" for the flags of a command.
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
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "serve":
		err = cmdServe(ctx, args)
	case "write":
		err = cmdWrite(ctx, args, false)
	case "backfill":
		err = cmdWrite(ctx, args, true)
	case "catalogue", "catalog":
		cmdCatalogue(os.Stdout)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(os.Stdout, usage)
	default:
		fmt.Fprintf(os.Stderr, "gpusim: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpusim: %v\n", err)
		return 1
	}
	return 0
}

// multiFlag collects a repeatable string flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, "; ") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// simFlags are the cluster and logging flags every command shares.
type simFlags struct {
	name         string
	nodes, gpus  int
	seed         uint64
	epoch        string
	xidsPerYear  float64
	nodeCPUs     int
	faultsFile   string
	faults       multiFlag
	logLevel     string
	logFormat    string
	targetLabels bool
	gpuModel     string
	recoveryName string
	xidWindow    time.Duration
}

func (f *simFlags) register(fs *flag.FlagSet, targetLabelsDefault bool) {
	fs.StringVar(&f.name, "cluster.name", "gpu-cluster-prod-01", "Cluster name, sent as the \"cluster\" external label.")
	fs.IntVar(&f.nodes, "cluster.nodes", 128, "Number of GPU nodes.")
	fs.IntVar(&f.gpus, "cluster.gpus-per-node", 8, "GPUs per node (1..8).")
	fs.Uint64Var(&f.seed, "sim.seed", 1, "Seed: same seed and time give the same state.")
	fs.StringVar(&f.epoch, "sim.epoch", gpusim.DefaultEpoch.Format(time.RFC3339), "Epoch (RFC 3339) that counters and job windows are anchored to. Replicas and reruns must share it.")
	fs.Float64Var(&f.xidsPerYear, "sim.xids-per-gpu-year", 0.02, "Background Xid events per GPU per year (negative: none). The Xid gauge keeps its last code.")
	fs.IntVar(&f.nodeCPUs, "sim.node-cpus", gpusim.HGXNodeCPUs, "Logical CPUs per node reported by node_cpu_seconds_total (8 modes each); the default is an 8-GPU HGX H100 server's (2 × 56 cores with SMT).")
	fs.StringVar(&f.gpuModel, "sim.gpu-model", gpusim.ModelH100, "GPU model: "+gpusim.ModelH100+" (NVLink4), "+gpusim.ModelB200+" (NVLink5: DCGM_FI_DEV_NVLINK_COUNT_* fields instead of the CRC/replay/recovery counters) or "+gpusim.ModelA100+" (NVLink3, PCIe Gen4).")
	fs.StringVar(&f.recoveryName, "dcgm.recovery-action-field", gpusim.RecoveryActionFieldDCGM45, "Name of DCGM field 1523 as the counters CSV gives it: "+gpusim.RecoveryActionFieldDCGM45+" (DCGM <= 4.5, dcgm-exporter 4.8.2) or "+gpusim.RecoveryActionFieldDCGM46+" (DCGM >= 4.6).")
	fs.DurationVar(&f.xidWindow, "dcgm.xid-count-window-size", 5*time.Minute, "Window of DCGM_EXP_XID_ERRORS_COUNT (dcgm-exporter's --xid-count-window-size).")
	fs.BoolVar(&f.targetLabels, "sim.target-labels", targetLabelsDefault, "Add job/instance labels and \"up\" series, as the scraping Prometheus would (on for write/backfill, off for serve).")
	fs.StringVar(&f.faultsFile, "faults.file", "", "YAML fault schedule (see README: faults: [{at, duration, kind, node, gpu, code, every, value}]).")
	fs.Var(&f.faults, "fault", "A fault, repeatable: kind=<"+kindList()+">,at=10m,duration=5m,node=gpu-node-003,gpu=2[,code=79][,every=1m][,value=86]. \"at\" is relative to the start of the run.")
	fs.StringVar(&f.logLevel, "log.level", "info", "Log level: debug, info, warn, error.")
	fs.StringVar(&f.logFormat, "log.format", "logfmt", "Log format: logfmt or json.")
}

func kindList() string {
	var s []string
	for _, k := range gpusim.FaultKinds {
		s = append(s, string(k))
	}
	return strings.Join(s, "|")
}

func (f *simFlags) logger() (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(f.logLevel)); err != nil {
		return nil, fmt.Errorf("--log.level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch f.logFormat {
	case "logfmt":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	}
	return nil, fmt.Errorf("--log.format %q: want logfmt or json", f.logFormat)
}

func (f *simFlags) config(origin time.Time) (gpusim.Config, error) {
	epoch, err := time.Parse(time.RFC3339, f.epoch)
	if err != nil {
		return gpusim.Config{}, fmt.Errorf("--sim.epoch: %w", err)
	}
	cfg := gpusim.Config{
		Name: f.name, Nodes: f.nodes, GPUsPerNode: f.gpus, Seed: f.seed, Epoch: epoch,
		FaultOrigin: origin, TargetLabels: f.targetLabels, XidsPerGPUYear: f.xidsPerYear, NodeCPUs: f.nodeCPUs,
		GPUModel: f.gpuModel, RecoveryActionField: f.recoveryName, XIDCountWindow: f.xidWindow,
	}
	if f.faultsFile != "" {
		data, err := os.ReadFile(f.faultsFile)
		if err != nil {
			return cfg, fmt.Errorf("read fault file: %w", err)
		}
		fl, err := gpusim.ParseFaultsYAML(data)
		if err != nil {
			return cfg, fmt.Errorf("%s: %w", f.faultsFile, err)
		}
		cfg.Faults = append(cfg.Faults, fl...)
	}
	for _, spec := range f.faults {
		ft, err := gpusim.ParseFaultSpec(spec)
		if err != nil {
			return cfg, fmt.Errorf("--fault: %w", err)
		}
		cfg.Faults = append(cfg.Faults, ft)
	}
	return cfg, nil
}

func newFlagSet(name, summary string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: gpusim %s [flags]\n\n%s\n\nFlags (one or two dashes):\n", name, summary)
		fs.PrintDefaults()
	}
	return fs
}

func cmdServe(ctx context.Context, args []string) error {
	fs := newFlagSet("serve", `Serves the simulated cluster in the Prometheus text format. Values are computed
for the wall-clock time of each scrape.
  /metrics                  the whole cluster on one page
  /node/<hostname>/metrics  one node (DCGM, node-exporter, cAdvisor, training ranks); 503 while down
  /cluster/metrics          kube-state-metrics
  /sd                       http_sd_configs target list for the per-node pages`)
	var sf simFlags
	sf.register(fs, false)
	listen := fs.String("web.listen-address", ":9400", "Address to listen on.")
	pages := fs.String("web.pages", "all", "Pages to serve: cluster (one /metrics), node (per-node pages), all.")
	if err := fs.Parse(args); err != nil {
		return err
	}
	log, err := sf.logger()
	if err != nil {
		return err
	}
	start := time.Now()
	cfg, err := sf.config(start)
	if err != nil {
		return err
	}
	cl, err := gpusim.New(cfg)
	if err != nil {
		return err
	}
	mode := gpusim.PageMode(*pages)
	if mode != gpusim.PagesAll && mode != gpusim.PagesCluster && mode != gpusim.PagesNode {
		return fmt.Errorf("--web.pages %q: want cluster, node or all", *pages)
	}
	cl.Step(start)
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", *listen, err)
	}
	srv := &http.Server{Handler: gpusim.NewHandler(cl, gpusim.HandlerOptions{Pages: mode}), ReadHeaderTimeout: 10 * time.Second}
	log.Info("serving simulated cluster", "addr", ln.Addr().String(), "cluster", cfg.Name, "nodes", cfg.Nodes,
		"gpus", cfg.Nodes*cfg.GPUsPerNode, "series", cl.SeriesCount(), "faults", len(cfg.Faults), "pages", mode)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}

// rwFlags are the remote-write flags.
type rwFlags struct {
	url, protocol, tenant string
	maxSamples, shards    int
	maxRetries            int
	retry429              bool
	timeout               time.Duration
	minBackoff            time.Duration
	maxBackoff            time.Duration
	metadataInterval      time.Duration
}

func (f *rwFlags) register(fs *flag.FlagSet, shardsDefault int) {
	fs.StringVar(&f.url, "remote-write.url", "", "Remote-write endpoint, e.g. http://127.0.0.1:9201/api/v1/write (required).")
	fs.StringVar(&f.protocol, "remote-write.protocol", "1.0", "Protocol: 1.0 (prometheus.WriteRequest) or 2.0 (io.prometheus.write.v2.Request).")
	fs.IntVar(&f.maxSamples, "remote-write.max-samples-per-send", 2000, "Samples per request.")
	fs.IntVar(&f.shards, "remote-write.shards", shardsDefault, "Requests in flight per replica.")
	fs.StringVar(&f.tenant, "remote-write.tenant", "", "Tenant sent as X-Scope-OrgID (none when empty).")
	fs.BoolVar(&f.retry429, "remote-write.retry-on-http-429", false, "Retry 429 answers (otherwise dropped like other 4xx).")
	fs.IntVar(&f.maxRetries, "remote-write.max-retries", 10, "Retries of one batch on 5xx/network errors before it is dropped.")
	fs.DurationVar(&f.timeout, "remote-write.timeout", 30*time.Second, "Request timeout.")
	fs.DurationVar(&f.minBackoff, "remote-write.min-backoff", 30*time.Millisecond, "First retry delay.")
	fs.DurationVar(&f.maxBackoff, "remote-write.max-backoff", 5*time.Second, "Largest retry delay.")
	fs.DurationVar(&f.metadataInterval, "remote-write.metadata-interval", time.Minute, "How often 1.0 metadata is sent (0: never; 2.0 sends it with every series).")
}

func (f *rwFlags) config(log *slog.Logger, cluster, replica string) (gpusim.SenderConfig, error) {
	if f.url == "" {
		return gpusim.SenderConfig{}, errors.New("--remote-write.url is required")
	}
	return gpusim.SenderConfig{
		URL: f.url, Protocol: gpusim.Protocol(f.protocol), MaxSamplesPerSend: f.maxSamples, Shards: f.shards,
		Tenant: f.tenant, RetryOn429: f.retry429, MinBackoff: f.minBackoff, MaxBackoff: f.maxBackoff,
		MaxRetries: f.maxRetries, Timeout: f.timeout, Logger: log.With("replica", replica),
		ExternalLabels: []gpusim.Label{{Name: "cluster", Value: cluster}, {Name: "__replica__", Value: replica}},
	}, nil
}

func cmdWrite(ctx context.Context, args []string, backfill bool) error {
	name, summary := "write", `Plays a Prometheus HA pair: each replica "scrapes" the simulated cluster every
--scrape.interval and remote-writes the samples with external labels
cluster=<name> and __replica__=<p0|p1>. Replica p1 lags p0 by --replica.lag
and sees slightly different gauge values; counters are identical. In real time
by default; --fast writes --duration of history ending now as fast as the
receiver accepts.`
	if backfill {
		name, summary = "backfill", `Writes --backfill.duration of history ending at --backfill.end, oldest first,
as fast as the receiver accepts, logging progress (percent, samples/s) and a
summary line at the end. One replica (p0) by default.`
	}
	fs := newFlagSet(name, summary)
	var sf simFlags
	sf.register(fs, true)
	var rf rwFlags
	shards := 1
	if backfill {
		shards = 4
	}
	rf.register(fs, shards)
	interval := fs.Duration("scrape.interval", 15*time.Second, "Scrape interval: one sample per series per interval.")
	replicas := 2
	if backfill {
		replicas = 1
	}
	nReplicas := fs.Int("replicas", replicas, "Number of HA replicas (1 or 2).")
	lag := fs.Duration("replica.lag", 300*time.Millisecond, "Timestamp lag of each further replica.")
	jitter := fs.Float64("replica.jitter", 0.001, "Relative jitter of continuous gauges per replica.")
	progress := fs.Duration("log.progress-interval", 10*time.Second, "How often progress is logged.")
	var fast *bool
	var duration, startFlag, bfDuration, bfEnd *string
	if backfill {
		bfDuration = fs.String("backfill.duration", "1d", "History to write (Prometheus duration: 90m, 7d, 2w).")
		bfEnd = fs.String("backfill.end", "now", "End of the history (RFC 3339 or now).")
	} else {
		fast = fs.Bool("fast", false, "Write as fast as the receiver accepts instead of in real time.")
		duration = fs.String("duration", "0s", "How long to run (real time; 0 = until interrupted) or how much history to write (--fast; default 1h).")
		startFlag = fs.String("start", "", "With --fast: first sample time (RFC 3339); default now - duration.")
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	log, err := sf.logger()
	if err != nil {
		return err
	}
	if *nReplicas < 1 || *nReplicas > 2 {
		return fmt.Errorf("--replicas %d: want 1 or 2", *nReplicas)
	}
	if *interval <= 0 {
		return fmt.Errorf("--scrape.interval must be positive")
	}
	opts := runOpts{interval: *interval, replicas: *nReplicas, lag: *lag, jitter: *jitter, progress: *progress, metadataInterval: rf.metadataInterval, backfill: backfill}
	now := time.Now()
	switch {
	case backfill:
		d, err := model.ParseDuration(*bfDuration)
		if err != nil {
			return fmt.Errorf("--backfill.duration: %w", err)
		}
		end := now
		if *bfEnd != "now" {
			if end, err = time.Parse(time.RFC3339, *bfEnd); err != nil {
				return fmt.Errorf("--backfill.end: %w", err)
			}
		}
		opts.end = end.Truncate(*interval)
		opts.start = opts.end.Add(-time.Duration(d))
	case *fast:
		d := time.Hour
		if *duration != "0s" && *duration != "0" {
			pd, err := model.ParseDuration(*duration)
			if err != nil {
				return fmt.Errorf("--duration: %w", err)
			}
			d = time.Duration(pd)
		}
		opts.start = now.Add(-d).Truncate(*interval)
		if *startFlag != "" {
			if opts.start, err = time.Parse(time.RFC3339, *startFlag); err != nil {
				return fmt.Errorf("--start: %w", err)
			}
		}
		opts.end = opts.start.Add(d)
	default:
		opts.realtime = true
		opts.start = now.Truncate(*interval).Add(*interval)
		if *duration != "0s" && *duration != "0" {
			pd, err := model.ParseDuration(*duration)
			if err != nil {
				return fmt.Errorf("--duration: %w", err)
			}
			opts.end = opts.start.Add(time.Duration(pd))
		}
	}
	origin := opts.start
	if opts.realtime {
		origin = now
	}
	cfg, err := sf.config(origin)
	if err != nil {
		return err
	}
	return run(ctx, log, cfg, &rf, opts)
}

type runOpts struct {
	start, end       time.Time // end zero: until interrupted
	interval         time.Duration
	realtime         bool
	backfill         bool
	replicas         int
	lag              time.Duration
	jitter           float64
	progress         time.Duration
	metadataInterval time.Duration
}

type replicaRun struct {
	name    string
	cluster *gpusim.Cluster
	sender  *gpusim.Sender
	simTime atomic.Int64 // last tick written, ms
	series  atomic.Int64 // series in the last tick
	ticks   atomic.Int64
	skipped atomic.Int64
	err     error
}

func run(ctx context.Context, log *slog.Logger, cfg gpusim.Config, rf *rwFlags, o runOpts) error {
	var reps []*replicaRun
	for i := 0; i < o.replicas; i++ {
		name := fmt.Sprintf("p%d", i)
		// Each replica has its own Cluster: the model is a pure function of
		// (seed, time), so both compute the same counters independently.
		cl, err := gpusim.New(cfg)
		if err != nil {
			return err
		}
		scfg, err := rf.config(log, cfg.Name, name)
		if err != nil {
			return err
		}
		snd, err := gpusim.NewSender(scfg)
		if err != nil {
			return err
		}
		reps = append(reps, &replicaRun{name: name, cluster: cl, sender: snd})
	}
	mode := "fast"
	if o.realtime {
		mode = "realtime"
	} else if o.backfill {
		mode = "backfill"
	}
	log.Info("starting remote write", "mode", mode, "url", rf.url, "protocol", rf.protocol, "cluster", cfg.Name,
		"nodes", cfg.Nodes, "gpus", cfg.Nodes*cfg.GPUsPerNode, "replicas", o.replicas, "interval", o.interval,
		"start", o.start.Format(time.RFC3339), "end", fmtEnd(o.end), "faults", len(cfg.Faults))
	began := time.Now()
	var wg sync.WaitGroup
	for i, r := range reps {
		wg.Add(1)
		go func(i int, r *replicaRun) {
			defer wg.Done()
			r.err = replicaLoop(ctx, log, r, time.Duration(i)*o.lag, o)
		}(i, r)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tick := time.NewTicker(o.progress)
	defer tick.Stop()
	var lastSamples int64
	lastAt := began
	for loop := true; loop; {
		select {
		case <-done:
			loop = false
		case now := <-tick.C:
			var samples int64
			minSim := int64(-1)
			for _, r := range reps {
				samples += r.sender.Stats().Samples
				if st := r.simTime.Load(); minSim < 0 || st < minSim {
					minSim = st
				}
			}
			rate := float64(samples-lastSamples) / now.Sub(lastAt).Seconds()
			lastSamples, lastAt = samples, now
			args := []any{"samples", samples, "samples_per_sec", int64(rate), "series", reps[0].series.Load()}
			if minSim > 0 {
				args = append(args, "sim_time", time.UnixMilli(minSim).UTC().Format(time.RFC3339))
			}
			if !o.end.IsZero() && !o.realtime {
				pct := 100 * float64(minSim-o.start.UnixMilli()) / float64(o.end.Sub(o.start).Milliseconds())
				args = append(args, "percent", fmt.Sprintf("%.1f", max(pct, 0)))
				if pct > 0 {
					eta := time.Duration(float64(now.Sub(began)) * (100 - pct) / pct).Round(time.Second)
					args = append(args, "eta", eta)
				}
			}
			log.Info("progress", args...)
		}
	}
	wall := time.Since(began)
	var tot gpusim.SenderStats
	var errs []error
	for _, r := range reps {
		s := r.sender.Stats()
		tot.Requests += s.Requests
		tot.Batches += s.Batches
		tot.Samples += s.Samples
		tot.Bytes += s.Bytes
		tot.Retries += s.Retries
		tot.Dropped4xx += s.Dropped4xx
		tot.DroppedSamples += s.DroppedSamples
		tot.Failed += s.Failed
		tot.MissingWritten += s.MissingWritten
		if r.err != nil && !errors.Is(r.err, context.Canceled) {
			errs = append(errs, fmt.Errorf("replica %s: %w", r.name, r.err))
		}
	}
	bps := 0.0
	if tot.Samples > 0 {
		bps = float64(tot.Bytes) / float64(tot.Samples)
	}
	log.Info(mode+" done", "samples", tot.Samples, "requests", tot.Requests, "batches", tot.Batches,
		"bytes", tot.Bytes, "bytes_per_sample", fmt.Sprintf("%.2f", bps), "wall", wall.Round(time.Millisecond),
		"samples_per_sec", int64(float64(tot.Samples)/wall.Seconds()), "retries", tot.Retries,
		"dropped_4xx", tot.Dropped4xx, "failed", tot.Failed, "missing_written_header", tot.MissingWritten,
		"dropped_samples", tot.DroppedSamples, "ticks", reps[0].ticks.Load(), "skipped_ticks", reps[0].skipped.Load())
	return errors.Join(errs...)
}

func fmtEnd(t time.Time) string {
	if t.IsZero() {
		return "until interrupted"
	}
	return t.Format(time.RFC3339)
}

func replicaLoop(ctx context.Context, log *slog.Logger, r *replicaRun, offset time.Duration, o runOpts) error {
	rep := gpusim.Replica{Name: r.name, Offset: offset, Jitter: o.jitter}
	buf := make([]gpusim.Series, 0, 1<<16)
	var lastMeta time.Time
	descs := metadataFamilies(r.cluster.Config().TargetLabels)
	for t := o.start; o.end.IsZero() || !t.After(o.end); t = t.Add(o.interval) {
		if o.realtime {
			// A replica cannot send samples from the future: wait for its
			// scrape instant, and skip ticks it fell behind on, as a
			// Prometheus whose scrapes overran would.
			wait := time.Until(t.Add(offset))
			if wait < -o.interval {
				behind := (-wait / o.interval) * o.interval
				t = t.Add(behind)
				r.skipped.Add(int64(behind / o.interval))
				wait = time.Until(t.Add(offset))
			}
			if wait > 0 {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(wait):
				}
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if o.metadataInterval > 0 && time.Since(lastMeta) >= o.metadataInterval {
			if err := r.sender.SendMetadata(ctx, descs); err != nil {
				log.Warn("metadata not accepted", "replica", r.name, "err", err)
			}
			lastMeta = time.Now()
		}
		buf = r.cluster.AppendSamples(buf[:0], t, rep)
		r.series.Store(int64(len(buf)))
		// As the Prometheus it plays: a staleness marker for each series
		// that vanished since the last scrape.
		buf = r.cluster.AppendStaleMarkers(buf, t, rep)
		if err := r.sender.Send(ctx, buf); err != nil {
			return err
		}
		r.simTime.Store(t.UnixMilli())
		r.ticks.Add(1)
	}
	return nil
}

func metadataFamilies(withUp bool) []*gpusim.MetricDesc {
	var out []*gpusim.MetricDesc
	for i := range gpusim.Catalogue {
		d := &gpusim.Catalogue[i]
		if d.Source == gpusim.SourcePrometheus && !withUp {
			continue
		}
		out = append(out, d)
	}
	return out
}

func cmdCatalogue(w io.Writer) {
	fmt.Fprintf(w, "%-58s %-9s %-18s %s\n", "NAME", "TYPE", "SOURCE", "HELP")
	for _, d := range gpusim.Catalogue {
		fmt.Fprintf(w, "%-58s %-9s %-18s %s\n", d.Name, d.Type, d.Source, d.Help)
	}
}
