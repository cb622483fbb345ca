// Command benchcompare runs the same simulated GPU-cluster workload against
// gpustore, Prometheus (remote-write receiver mode) and single-node
// VictoriaMetrics, one after another, each on loopback with a fresh data
// directory, and prints one comparison table: ingest samples/s at
// saturation, CPU-seconds per million samples, peak RSS per active series,
// on-disk bytes per sample, and the latency of the source document's
// dashboard queries over 1h, 24h and 7d windows.
//
// `make bench-compare` builds gpustore and runs this; see bench/README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/common/model"

	"github.com/gpustore/gpustore/bench/gpusim"
	"github.com/gpustore/gpustore/bench/load"
	"github.com/gpustore/gpustore/internal/testbin"
)

type options struct {
	gpustoreBin, prometheusBin, vmBin string
	gpustoreVersion, promVersion      string
	vmVersion                         string
	systems                           string
	workDir                           string
	keep                              bool
	out                               string
	protocol                          string
	seed                              uint64

	ingestNodes    int
	ingestInterval time.Duration
	ingestDuration time.Duration
	ingestShards   int

	churnNodes, churnClusters int

	bfNodes    int
	bfInterval time.Duration
	bfDuration time.Duration
	bfShards   int

	rounds, warmup int
	node           string
	refresh        bool
	refreshShift   time.Duration
	gpustoreArgs   string
	idleTimeout    time.Duration
	compactTimeout time.Duration
	stopTimeout    time.Duration
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	var o options
	fs := flag.NewFlagSet("benchcompare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: benchcompare [flags]\n\nRuns the gpusim workload against gpustore, Prometheus and VictoriaMetrics, one after\nanother, and prints one comparison table. Flags:\n\n")
		fs.PrintDefaults()
	}
	fs.StringVar(&o.gpustoreBin, "gpustore", "bin/gpustore", "gpustore binary.")
	fs.StringVar(&o.prometheusBin, "prometheus", "", "Prometheus binary (default: found as the tests find it: $GPUSTORE_TOOLS_DIR, ~/.cache/gpustore-tools/bin, $PATH).")
	fs.StringVar(&o.vmBin, "victoria-metrics", "", "VictoriaMetrics single-node binary (default: found as the tests find it: $GPUSTORE_TOOLS_DIR, ~/.cache/gpustore-tools/bin, $PATH).")
	fs.StringVar(&o.gpustoreVersion, "gpustore.version", "tree", "Version shown for gpustore.")
	fs.StringVar(&o.promVersion, "prometheus.version", "", "Version shown for Prometheus.")
	fs.StringVar(&o.vmVersion, "victoria-metrics.version", "", "Version shown for VictoriaMetrics.")
	fs.StringVar(&o.systems, "systems", "gpustore,prometheus,victoriametrics", "Systems to run, in order.")
	fs.StringVar(&o.workDir, "work-dir", "", "Directory for data and logs (default: a new temporary directory, removed at the end unless -keep).")
	fs.BoolVar(&o.keep, "keep", false, "Keep the work directory (data directories and server logs).")
	fs.StringVar(&o.out, "out", "", "Also write the table and notes to this file.")
	fs.StringVar(&o.protocol, "protocol", "1.0", "Remote-write protocol (VictoriaMetrics v1.151 accepts only 1.0).")
	fs.Uint64Var(&o.seed, "sim.seed", 1, "Simulator seed.")
	fs.IntVar(&o.ingestNodes, "ingest.nodes", 128, "Nodes (8 GPUs each) of the saturation workload.")
	fs.DurationVar(&o.ingestInterval, "ingest.interval", 15*time.Second, "Scrape interval of the saturation workload.")
	fs.DurationVar(&o.ingestDuration, "ingest.duration", time.Hour, "Simulated history written at saturation (ending at the run's start).")
	fs.IntVar(&o.ingestShards, "ingest.shards", 4, "Requests in flight during the saturation phase.")
	fs.IntVar(&o.churnNodes, "churn.nodes", 32, "Nodes of each new cluster in the series-churn phase.")
	fs.IntVar(&o.churnClusters, "churn.clusters", 80, "Clusters whose first scrape the series-churn phase writes, every sample a new series (0 skips it; 80 × 32 nodes ≈ 1 M series).")
	fs.IntVar(&o.bfNodes, "backfill.nodes", 8, "Nodes of the slice backfilled for the 24h and 7d query windows.")
	fs.DurationVar(&o.bfInterval, "backfill.interval", time.Minute, "Scrape interval of the backfilled slice.")
	bfDur := fs.String("backfill.duration", "7d", "History of the slice to backfill (0 skips the 24h/7d query windows).")
	fs.IntVar(&o.bfShards, "backfill.shards", 4, "Requests in flight during the backfill.")
	fs.IntVar(&o.rounds, "query.rounds", 20, "Measured rounds of each window's query set (20 × 22 panels: a p99 over 440 answers, not one slow panel's worst of 5 rounds).")
	fs.IntVar(&o.warmup, "query.warmup", 1, "Unmeasured rounds before them.")
	fs.StringVar(&o.node, "query.node", "gpu-node-003", "Node of the node-detail dashboard.")
	fs.StringVar(&o.gpustoreArgs, "gpustore.args", "", "Extra space-separated flags for gpustore (e.g. -query.split-by-day=false).")
	fs.BoolVar(&o.refresh, "refresh", true, "Also measure gpustore's dashboard refresh pattern (panel set once, then -query.rounds rounds each shifted by -refresh.shift), results cache off and on.")
	fs.DurationVar(&o.refreshShift, "refresh.shift", 30*time.Second, "How far each refresh round moves the window.")
	fs.DurationVar(&o.idleTimeout, "idle.timeout", 60*time.Second, "Longest wait for a receiver to go idle after writing.")
	fs.DurationVar(&o.compactTimeout, "compact.timeout", 15*time.Minute, "Longest wait for gpustore to ship and compact the backfilled week.")
	fs.DurationVar(&o.stopTimeout, "stop.timeout", 60*time.Second, "Longest wait for a clean stop before SIGKILL.")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	d, err := model.ParseDuration(*bfDur)
	if err != nil {
		fmt.Fprintf(stderr, "benchcompare: -backfill.duration: %v\n", err)
		return 2
	}
	o.bfDuration = time.Duration(d)
	if o.prometheusBin == "" {
		o.prometheusBin = testbin.Lookup("prometheus")
	}
	if o.vmBin == "" {
		o.vmBin = testbin.Lookup("victoria-metrics")
	}

	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	b := &bench{o: o, log: log}
	if err := b.run(ctx, stdout); err != nil {
		log.Error("bench-compare failed", "err", err)
		return 1
	}
	return 0
}

type bench struct {
	o       options
	log     *slog.Logger
	workDir string
	began   time.Time
	end     time.Time

	ingest, backfill, churn       *load.Plan
	ingestWL, backfillWL, churnWL load.Workload
	results                       []*sysResult
	loadStart                     string
}

// window is one query window over one data set.
type window struct {
	name     string
	rng      time.Duration
	interval time.Duration // scrape interval of the data
}

type sysResult struct {
	name, version string
	err           error
	bucket        bool // keeps its bucket in its data directory (load.System.Bucket)

	write          load.Result
	cpuSeconds     float64 // receiver CPU from the first request to idle after the last
	cpuSendSeconds float64 // ... until the last answer only
	idleWait       time.Duration
	idle           bool
	rssStart, hwm  int64
	diskIngest     load.DiskUsage

	// The series-churn phase: every sample a new series.
	churnWrite load.Result
	churnCPU   float64
	churnHWM   int64

	bfWrite   load.Result
	bfCPU     float64
	bfHWM     int64
	diskBF    load.DiskUsage
	bfIdle    time.Duration
	queries   map[string]load.QueryResult
	queryErrs int
	// refresh holds the dashboard refresh pattern's rounds, keyed by
	// window + "/off" or "/on" (gpustore's results cache).
	refresh map[string]load.QueryResult
}

func (b *bench) run(ctx context.Context, stdout io.Writer) error {
	o := b.o
	b.began = time.Now()
	b.loadStart = loadAvg()
	if o.workDir == "" {
		dir, err := os.MkdirTemp("", "gpustore-bench-compare-")
		if err != nil {
			return err
		}
		b.workDir = dir
		if !o.keep {
			defer os.RemoveAll(dir)
		}
	} else {
		b.workDir = o.workDir
		if err := os.MkdirAll(b.workDir, 0o755); err != nil {
			return err
		}
	}
	var systems []string
	for _, s := range strings.Split(o.systems, ",") {
		if s = strings.TrimSpace(s); s != "" {
			systems = append(systems, s)
		}
	}
	for _, s := range systems {
		bin := map[string]string{"gpustore": o.gpustoreBin, "prometheus": o.prometheusBin, "victoriametrics": o.vmBin}[s]
		if bin == "" {
			return fmt.Errorf("unknown system %q (want gpustore, prometheus, victoriametrics)", s)
		}
		if _, err := os.Stat(bin); err != nil {
			return fmt.Errorf("%s binary: %w (make bench-compare installs it)", s, err)
		}
	}

	// One end instant for everything: every system gets the same samples.
	b.end = time.Now().Add(-time.Minute).Truncate(time.Minute)
	ticks := int(o.ingestDuration / o.ingestInterval)
	b.ingestWL = load.Workload{
		Cluster:  gpusim.Config{Name: "gpu-cluster-bench", Nodes: o.ingestNodes, Seed: o.seed, TargetLabels: true},
		Start:    b.end.Add(-time.Duration(ticks-1) * o.ingestInterval),
		Ticks:    ticks,
		Interval: o.ingestInterval, Protocol: gpusim.Protocol(o.protocol), Shards: o.ingestShards,
	}
	b.log.Info("bench-compare starting", "systems", strings.Join(systems, ","), "work_dir", b.workDir,
		"cpus", runtime.NumCPU(), "end", b.end.Format(time.RFC3339))
	b.log.Info("encoding the saturation workload once (sent byte-for-byte to every system)",
		"nodes", o.ingestNodes, "gpus", o.ingestNodes*8, "interval", o.ingestInterval, "history", o.ingestDuration)
	var err error
	if b.ingest, err = load.BuildPlan(ctx, b.ingestWL); err != nil {
		return fmt.Errorf("build saturation workload: %w", err)
	}
	st := b.ingest.Stats
	b.log.Info("saturation workload ready", "samples", st.Samples, "series", st.Series, "series_per_tick", st.SeriesPerTick,
		"requests", st.Requests, "body_bytes", st.Bytes, "took", st.Took.Round(time.Millisecond))
	if o.churnClusters > 0 {
		b.churnWL = load.Workload{
			Cluster:  gpusim.Config{Name: "gpu-cluster-churn", Nodes: o.churnNodes, Seed: o.seed, TargetLabels: true},
			Start:    b.end.Add(-time.Duration(o.churnClusters) * o.ingestInterval),
			Ticks:    o.churnClusters,
			Interval: o.ingestInterval, Protocol: gpusim.Protocol(o.protocol), Shards: o.ingestShards,
			NewClusterEachTick: true,
		}
		b.log.Info("encoding the series-churn workload once", "clusters", o.churnClusters, "nodes_each", o.churnNodes)
		if b.churn, err = load.BuildPlan(ctx, b.churnWL); err != nil {
			return fmt.Errorf("build series-churn workload: %w", err)
		}
		st := b.churn.Stats
		b.log.Info("series-churn workload ready", "samples", st.Samples, "series", st.Series, "requests", st.Requests,
			"body_bytes", st.Bytes, "took", st.Took.Round(time.Millisecond))
	}
	if o.bfDuration > 0 {
		bt := int(o.bfDuration / o.bfInterval)
		b.backfillWL = load.Workload{
			Cluster:  gpusim.Config{Name: "gpu-cluster-slice", Nodes: o.bfNodes, Seed: o.seed, TargetLabels: true},
			Start:    b.end.Add(-time.Duration(bt-1) * o.bfInterval),
			Ticks:    bt,
			Interval: o.bfInterval, Protocol: gpusim.Protocol(o.protocol), Shards: o.bfShards,
		}
		b.log.Info("encoding the backfill slice once", "nodes", o.bfNodes, "gpus", o.bfNodes*8, "interval", o.bfInterval, "history", o.bfDuration)
		if b.backfill, err = load.BuildPlan(ctx, b.backfillWL); err != nil {
			return fmt.Errorf("build backfill workload: %w", err)
		}
		st := b.backfill.Stats
		b.log.Info("backfill workload ready", "samples", st.Samples, "series", st.Series, "series_per_tick", st.SeriesPerTick,
			"requests", st.Requests, "body_bytes", st.Bytes, "took", st.Took.Round(time.Millisecond))
	}

	for i, name := range systems {
		b.log.Info(fmt.Sprintf("=== system %d/%d: %s", i+1, len(systems), name), "elapsed", time.Since(b.began).Round(time.Second))
		r := b.runSystem(ctx, name)
		b.results = append(b.results, r)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if r.err != nil {
			b.log.Error("system failed; continuing with the next", "system", name, "err", r.err)
		}
	}
	report := b.report()
	fmt.Fprint(stdout, report)
	if o.out != "" {
		if err := os.WriteFile(o.out, []byte(report), 0o644); err != nil {
			return err
		}
	}
	for _, r := range b.results {
		if r.err != nil {
			return fmt.Errorf("%s: %w", r.name, r.err)
		}
	}
	return nil
}

func (b *bench) newSystem(name, phase string) (*load.System, error) {
	addr, err := load.FreeAddr()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(b.workDir, name, phase)
	data := filepath.Join(dir, "data")
	var s *load.System
	switch name {
	case "gpustore":
		s = load.Gpustore(b.o.gpustoreBin, data, addr)
		s.Args = append(s.Args, strings.Fields(b.o.gpustoreArgs)...)
		s.Version = b.o.gpustoreVersion
	case "prometheus":
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		cfg := filepath.Join(dir, "prometheus.yml")
		if err := load.WritePrometheusConfig(cfg); err != nil {
			return nil, err
		}
		s = load.Prometheus(b.o.prometheusBin, data, cfg, addr)
		s.Version = b.o.promVersion
	case "victoriametrics":
		s = load.VictoriaMetrics(b.o.vmBin, data, addr)
		s.Version = b.o.vmVersion
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	s.LogPath = filepath.Join(dir, name+".log")
	return s, nil
}

// writeFresh starts a fresh instance of name for phase (its directory) and
// writes p into it as fast as it answers, logging as label. It returns the
// running instance, which the caller stops, and the process as it was
// before the first request. On error it has stopped the instance itself,
// and returns it (once created) only to be described.
func (b *bench) writeFresh(ctx context.Context, name, phase, label string, p *load.Plan, progress time.Duration) (*load.System, load.ProcSample, load.Result, error) {
	s, err := b.newSystem(name, phase)
	if err != nil {
		return nil, load.ProcSample{}, load.Result{}, err
	}
	p0, res, err := func() (load.ProcSample, load.Result, error) {
		if err := b.start(ctx, s); err != nil {
			return load.ProcSample{}, load.Result{}, err
		}
		p0, err := load.ReadProc(s.PID())
		if err != nil {
			return p0, load.Result{}, err
		}
		b.log.Info(label+": writing", "system", name, "samples", p.Stats.Samples, "series", p.Stats.Series, "shards", p.Workload.Shards)
		res, err := load.Run(ctx, load.DriverConfig{URL: s.WriteURL(), Protocol: p.Workload.Protocol, PID: s.PID(),
			Logger: b.log.With("system", name, "phase", label), Progress: progress}, p.Source())
		return p0, res, err
	}()
	if err != nil {
		_ = s.Stop(b.o.stopTimeout)
		return s, p0, res, err
	}
	b.log.Info(label+": done", "system", name, "result", res.String())
	return s, p0, res, nil
}

func (b *bench) start(ctx context.Context, s *load.System) error {
	if err := s.Start(); err != nil {
		return err
	}
	if err := s.WaitReady(ctx, 2*time.Minute); err != nil {
		return err
	}
	b.log.Info("started", "system", s.Name, "pid", s.PID(), "addr", s.Addr, "data", s.DataDir)
	return nil
}

func (b *bench) runSystem(ctx context.Context, name string) *sysResult {
	r := &sysResult{name: name, queries: map[string]load.QueryResult{}, refresh: map[string]load.QueryResult{}}
	if err := b.ingestPhase(ctx, name, r); err != nil {
		r.err = fmt.Errorf("saturation phase: %w", err)
		return r
	}
	if b.churn != nil {
		if err := b.churnPhase(ctx, name, r); err != nil {
			r.err = fmt.Errorf("series-churn phase: %w", err)
			return r
		}
	}
	if b.backfill != nil {
		if err := b.backfillPhase(ctx, name, r); err != nil {
			r.err = fmt.Errorf("backfill phase: %w", err)
		}
	}
	return r
}

// churnPhase writes the first scrape of many new clusters into a fresh
// instance, every sample a new series, as fast as it is taken: the cost of
// creating series (CPU per million, until idle) and the memory a million
// series take (peak RSS).
func (b *bench) churnPhase(ctx context.Context, name string, r *sysResult) (err error) {
	s, p0, res, err := b.writeFresh(ctx, name, "churn", "series churn", b.churn, 5*time.Second)
	if err != nil {
		return err
	}
	r.churnWrite = res
	defer func() {
		if serr := s.Stop(b.o.stopTimeout); serr != nil && err == nil {
			err = serr
		}
	}()
	if err := s.Flush(ctx); err != nil {
		return err
	}
	if _, _, err := load.WaitIdle(ctx, s.PID(), 0.1, 3*time.Second, b.o.idleTimeout); err != nil {
		return err
	}
	p1, err := load.ReadProc(s.PID())
	if err != nil {
		return err
	}
	r.churnCPU = load.CPUSeconds(p1.CPUTicks - p0.CPUTicks)
	r.churnHWM = p1.HWM
	b.log.Info("series churn: receiver", "system", name, "cpu_seconds", fmt.Sprintf("%.1f", r.churnCPU), "peak_rss", p1.HWM)
	return nil
}

// ingestPhase writes the full-cluster hour as fast as the system takes it,
// measures CPU and memory, queries the hour, stops the system and measures
// its data directory.
func (b *bench) ingestPhase(ctx context.Context, name string, r *sysResult) (err error) {
	s, p0, res, err := b.writeFresh(ctx, name, "ingest", "saturation", b.ingest, 5*time.Second)
	if s != nil {
		r.version, r.bucket = s.Version, s.Bucket
	}
	if err != nil {
		return err
	}
	r.rssStart, r.write = p0.RSS, res
	defer func() {
		if serr := s.Stop(b.o.stopTimeout); serr != nil && err == nil {
			err = serr
		}
	}()
	p1, err := load.ReadProc(s.PID())
	if err != nil {
		return err
	}
	if err := s.Flush(ctx); err != nil {
		return err
	}
	r.idleWait, r.idle, err = load.WaitIdle(ctx, s.PID(), 0.1, 3*time.Second, b.o.idleTimeout)
	if err != nil {
		return err
	}
	p2, err := load.ReadProc(s.PID())
	if err != nil {
		return err
	}
	r.cpuSendSeconds = load.CPUSeconds(p1.CPUTicks - p0.CPUTicks)
	r.cpuSeconds = load.CPUSeconds(p2.CPUTicks - p0.CPUTicks)
	r.hwm = p2.HWM
	b.log.Info("saturation: receiver", "system", name, "cpu_seconds", fmt.Sprintf("%.1f", r.cpuSeconds),
		"cpu_seconds_until_last_answer", fmt.Sprintf("%.1f", r.cpuSendSeconds), "idle_after", r.idleWait.Round(time.Millisecond),
		"went_idle", r.idle, "peak_rss", p2.HWM, "rss_at_start", p0.RSS)

	w := window{name: "1h", rng: time.Hour, interval: b.ingestWL.Interval}
	if err := b.queryWindow(ctx, s, r, w, "1h"); err != nil {
		return err
	}
	if err := s.Stop(b.o.stopTimeout); err != nil {
		return err
	}
	if r.diskIngest, err = load.DirUsage(s.DataDir); err != nil {
		return err
	}
	b.log.Info("saturation: disk after a clean stop", "system", name, "usage", r.diskIngest.String())
	return b.refreshPattern(ctx, s, r, []window{w})
}

// backfillPhase writes the slice's week oldest-first into a fresh instance,
// waits for it to settle, runs the 24h and 7d windows, stops it and measures
// its data directory.
func (b *bench) backfillPhase(ctx context.Context, name string, r *sysResult) (err error) {
	s, p0, res, err := b.writeFresh(ctx, name, "backfill", "backfill", b.backfill, 10*time.Second)
	if err != nil {
		return err
	}
	r.bfWrite = res
	defer func() {
		if serr := s.Stop(b.o.stopTimeout); serr != nil && err == nil {
			err = serr
		}
	}()
	if err := s.Flush(ctx); err != nil {
		return err
	}
	r.bfIdle, _, err = load.WaitIdle(ctx, s.PID(), 0.1, 3*time.Second, b.o.idleTimeout)
	if err != nil {
		return err
	}
	t0 := time.Now()
	if err := s.WaitCompacted(ctx, b.o.compactTimeout, func(msg string) { b.log.Info("backfill: compacting", "system", name, "state", msg) }); err != nil {
		return err
	}
	r.bfIdle += time.Since(t0)
	p1, err := load.ReadProc(s.PID())
	if err != nil {
		return err
	}
	r.bfCPU = load.CPUSeconds(p1.CPUTicks - p0.CPUTicks)
	r.bfHWM = p1.HWM
	b.log.Info("backfill: settled", "system", name, "waited", r.bfIdle.Round(time.Millisecond), "cpu_seconds", fmt.Sprintf("%.1f", r.bfCPU),
		"cpu_seconds_per_million", fmt.Sprintf("%.2f", r.bfCPU/(float64(max(r.bfWrite.Samples, 1))/1e6)), "peak_rss", r.bfHWM)
	for _, w := range []window{{name: "24h", rng: 24 * time.Hour}, {name: "7d", rng: 7 * 24 * time.Hour}} {
		if w.rng > b.o.bfDuration {
			continue
		}
		w.interval = b.backfillWL.Interval
		if err := b.queryWindow(ctx, s, r, w, w.name); err != nil {
			return err
		}
	}
	if err := s.Stop(b.o.stopTimeout); err != nil {
		return err
	}
	if r.diskBF, err = load.DirUsage(s.DataDir); err != nil {
		return err
	}
	b.log.Info("backfill: disk after a clean stop", "system", name, "usage", r.diskBF.String())
	var ws []window
	for _, w := range []window{{name: "24h", rng: 24 * time.Hour}, {name: "7d", rng: 7 * 24 * time.Hour}} {
		if w.rng <= b.o.bfDuration {
			w.interval = b.backfillWL.Interval
			ws = append(ws, w)
		}
	}
	return b.refreshPattern(ctx, s, r, ws)
}

// refreshPattern measures a dashboard being refreshed: the panel set runs
// once (unmeasured), then -query.rounds more times, each with the window
// moved on by -refresh.shift, first with gpustore's results cache bypassed
// (Cache-Control: no-store), then with it. gpustore is restarted on the
// same data (its data directory was measured already) with
// query.results-cache.max-freshness = (now - the data's end) + 10 m: the
// data ended when the bench began, so with the default 10 m every step
// would be old enough to cache; this way the newest 10 minutes of data are
// recomputed on every refresh, as on a live cluster.
func (b *bench) refreshPattern(ctx context.Context, prev *load.System, r *sysResult, ws []window) (err error) {
	if !b.o.refresh || prev.Name != "gpustore" || len(ws) == 0 {
		return nil
	}
	fresh := (time.Since(b.end) + 10*time.Minute).Truncate(time.Minute) + time.Minute
	s := load.Gpustore(b.o.gpustoreBin, prev.DataDir, prev.Addr)
	s.Version = prev.Version
	s.Args = append(append(s.Args, strings.Fields(b.o.gpustoreArgs)...), "-query.results-cache.max-freshness="+model.Duration(fresh).String())
	s.LogPath = strings.TrimSuffix(prev.LogPath, ".log") + "-refresh.log"
	defer func() {
		if serr := s.Stop(b.o.stopTimeout); serr != nil && err == nil {
			err = serr
		}
	}()
	if err := b.start(ctx, s); err != nil {
		return err
	}
	for _, w := range ws {
		for _, mode := range []struct {
			key     string
			headers http.Header
		}{{"off", http.Header{"Cache-Control": {"no-store"}}}, {"on", nil}} {
			b.log.Info("dashboard refresh", "system", s.Name, "window", w.name, "results_cache", mode.key, "shift", b.o.refreshShift, "rounds", b.o.rounds, "max_freshness", fresh)
			qr, err := load.RunQueries(ctx, load.QueryConfig{
				BaseURL: s.BaseURL(), Queries: load.DashboardQueries(b.o.node), End: b.end, Range: w.rng,
				ScrapeInterval: w.interval, Rounds: b.o.rounds, Warmup: 1, Shift: b.o.refreshShift, Headers: mode.headers,
			})
			if err != nil {
				return err
			}
			r.refresh[w.name+"/"+mode.key] = qr
			r.queryErrs += qr.Errors
			b.log.Info("dashboard refresh done", "system", s.Name, "window", w.name, "results_cache", mode.key, "step", qr.Step, "latency", qr.Latency.String())
		}
	}
	return nil
}

func (b *bench) queryWindow(ctx context.Context, s *load.System, r *sysResult, w window, key string) error {
	b.log.Info("queries", "system", s.Name, "window", w.name, "queries", len(load.DashboardQueries(b.o.node)), "rounds", b.o.rounds)
	qr, err := load.RunQueries(ctx, load.QueryConfig{
		BaseURL: s.BaseURL(), Queries: load.DashboardQueries(b.o.node), End: b.end, Range: w.rng,
		ScrapeInterval: w.interval, Rounds: b.o.rounds, Warmup: b.o.warmup, Params: s.QueryParams, Headers: s.QueryHeaders,
	})
	if err != nil {
		return err
	}
	r.queries[key] = qr
	r.queryErrs += qr.Errors
	for _, q := range qr.Queries {
		if q.Err != "" {
			b.log.Warn("query failed", "system", s.Name, "window", w.name, "panel", q.Panel, "err", q.Err)
		}
	}
	b.log.Info("queries done", "system", s.Name, "window", w.name, "step", qr.Step, "latency", qr.Latency.String())
	return nil
}

// report renders the table and its notes.
func (b *bench) report() string {
	o := b.o
	t := load.Table{Header: []string{"metric"}}
	for _, r := range b.results {
		h := r.name
		if r.version != "" {
			h += " " + r.version
		}
		t.Header = append(t.Header, h)
	}
	row := func(label string, f func(r *sysResult) string) {
		cells := []string{label}
		for _, r := range b.results {
			cells = append(cells, f(r))
		}
		t.AddRow(cells...)
	}
	ist := b.ingest.Stats
	ok := func(r *sysResult) bool { return r.write.Samples > 0 }
	row(fmt.Sprintf("ingest samples/s at saturation (%d GPUs, %s, %d in flight)", o.ingestNodes*8, fmtDays(o.ingestInterval), b.ingestWL.Shards), func(r *sysResult) string {
		if !ok(r) {
			return "n/a"
		}
		return fmt.Sprintf("%.0f", r.write.Rate())
	})
	row("write latency p50 / p99", func(r *sysResult) string {
		if !ok(r) {
			return "n/a"
		}
		return load.FmtDuration(r.write.Latency.P50) + " / " + load.FmtDuration(r.write.Latency.P99)
	})
	row("CPU-seconds per million samples", func(r *sysResult) string {
		if !ok(r) {
			return "n/a"
		}
		return fmt.Sprintf("%.2f", r.cpuSeconds/(float64(r.write.Samples)/1e6))
	})
	row(fmt.Sprintf("peak RSS per active series, KiB (%d series)", ist.Series), func(r *sysResult) string {
		if !ok(r) {
			return "n/a"
		}
		return fmt.Sprintf("%.2f", float64(r.hwm)/1024/float64(ist.Series))
	})
	row("peak RSS, MiB (RSS at start)", func(r *sysResult) string {
		if !ok(r) {
			return "n/a"
		}
		return fmt.Sprintf("%.0f (%.0f)", float64(r.hwm)/(1<<20), float64(r.rssStart)/(1<<20))
	})
	// Local storage and the bucket apart: gpustore's embedded bucket lies in
	// its data directory; local blocks stay only until their upload is
	// confirmed and they are past the local retention (6 h).
	diskRows := func(what string, samples func(r *sysResult) int64, u func(r *sysResult) load.DiskUsage) {
		row("disk bytes/sample, local TSDB, "+what, func(r *sysResult) string {
			if samples(r) == 0 || u(r).Bytes == 0 {
				return "n/a"
			}
			return fmt.Sprintf("%.2f", float64(u(r).Local())/float64(samples(r)))
		})
		row("disk bytes/sample, bucket, "+what, func(r *sysResult) string {
			if !r.bucket {
				return "no bucket"
			}
			if samples(r) == 0 || u(r).Bytes == 0 {
				return "n/a"
			}
			return fmt.Sprintf("%.2f", float64(u(r).Bucket)/float64(samples(r)))
		})
	}
	if b.churn != nil {
		cst := b.churn.Stats
		churned := func(r *sysResult) bool { return r.churnWrite.Samples > 0 }
		row(fmt.Sprintf("series churn: CPU-seconds per million samples, each a new series (%d clusters' first scrape)", o.churnClusters), func(r *sysResult) string {
			if !churned(r) {
				return "n/a"
			}
			return fmt.Sprintf("%.2f", r.churnCPU/(float64(r.churnWrite.Samples)/1e6))
		})
		row(fmt.Sprintf("series churn: peak RSS per series, KiB (%d series)", cst.Series), func(r *sysResult) string {
			if !churned(r) {
				return "n/a"
			}
			return fmt.Sprintf("%.2f (%.0f MiB)", float64(r.churnHWM)/1024/float64(cst.Series), float64(r.churnHWM)/(1<<20))
		})
	}
	diskRows(fmt.Sprintf("%s of %d GPUs (stopped)", fmtDays(o.ingestDuration), o.ingestNodes*8),
		func(r *sysResult) int64 { return r.write.Samples }, func(r *sysResult) load.DiskUsage { return r.diskIngest })
	if b.backfill != nil {
		bst := b.backfill.Stats
		diskRows(fmt.Sprintf("%s of %d GPUs at %s (stopped)", fmtDays(o.bfDuration), o.bfNodes*8, fmtDays(o.bfInterval)),
			func(r *sysResult) int64 { return r.bfWrite.Samples }, func(r *sysResult) load.DiskUsage { return r.diskBF })
		row(fmt.Sprintf("backfill samples/s (%d samples, oldest first)", bst.Samples), func(r *sysResult) string {
			if r.bfWrite.Samples == 0 {
				return "n/a"
			}
			return fmt.Sprintf("%.0f", r.bfWrite.Rate())
		})
	}
	nq := len(load.DashboardQueries(o.node))
	for _, w := range []struct{ key, label string }{
		{"1h", fmt.Sprintf("query p50 / p99, 1h window (%d GPUs at %s)", o.ingestNodes*8, fmtDays(o.ingestInterval))},
		{"24h", fmt.Sprintf("query p50 / p99, 24h window (%d GPUs at %s)", o.bfNodes*8, fmtDays(o.bfInterval))},
		{"7d", fmt.Sprintf("query p50 / p99, 7d window (%d GPUs at %s)", o.bfNodes*8, fmtDays(o.bfInterval))},
	} {
		if w.key != "1h" && (b.backfill == nil || o.bfDuration < map[string]time.Duration{"24h": 24 * time.Hour, "7d": 7 * 24 * time.Hour}[w.key]) {
			continue
		}
		row(w.label, func(r *sysResult) string {
			q, ok := r.queries[w.key]
			if !ok || q.Latency.N == 0 {
				return "n/a"
			}
			return load.FmtDuration(q.Latency.P50) + " / " + load.FmtDuration(q.Latency.P99)
		})
	}
	for _, key := range []string{"1h", "24h", "7d"} {
		for _, mode := range []string{"off", "on"} {
			label := fmt.Sprintf("dashboard refresh p50 / p99, %s window, +%s per round, gpustore results cache %s", key, fmtDays(o.refreshShift), mode)
			if !slices.ContainsFunc(b.results, func(r *sysResult) bool { _, ok := r.refresh[key+"/"+mode]; return ok }) {
				continue
			}
			row(label, func(r *sysResult) string {
				q, ok := r.refresh[key+"/"+mode]
				if !ok || q.Latency.N == 0 {
					return "—"
				}
				return load.FmtDuration(q.Latency.P50) + " / " + load.FmtDuration(q.Latency.P99)
			})
		}
	}
	row("errors (write answers ≠ 2xx, failed queries)", func(r *sysResult) string {
		var bad int64
		for _, res := range []load.Result{r.write, r.churnWrite, r.bfWrite} {
			for c, n := range res.Codes {
				if c/100 != 2 {
					bad += n
				}
			}
		}
		s := fmt.Sprintf("%d, %d", bad, r.queryErrs)
		if r.err != nil {
			s += " (run failed)"
		}
		return s
	})

	var sb strings.Builder
	fmt.Fprintf(&sb, "\n%s", t.String())
	fmt.Fprintf(&sb, "\nWorkload: gpusim seed %d, remote write %s, %d-sample requests, same bytes to every system, data ending %s.\n",
		o.seed, o.protocol, b.ingest.Workload.MaxSamplesPerSend, b.end.Format(time.RFC3339))
	fmt.Fprintf(&sb, "  saturation: %d GPUs (%d nodes) every %s for %s: %d samples, %d series (%d per scrape), %d requests, %d in flight, as fast as answered.\n",
		o.ingestNodes*8, o.ingestNodes, fmtDays(o.ingestInterval), fmtDays(o.ingestDuration), ist.Samples, ist.Series, ist.SeriesPerTick, ist.Requests, b.ingestWL.Shards)
	if b.churn != nil {
		cst := b.churn.Stats
		fmt.Fprintf(&sb, "  series churn: the first scrape of %d clusters of %d nodes (cluster label %s-<n>), written into a fresh instance as fast as answered: %d samples, each a new series; CPU until idle; peak RSS over the series written.\n",
			o.churnClusters, o.churnNodes, b.churnWL.Cluster.Name, cst.Samples)
	}
	if b.backfill != nil {
		bst := b.backfill.Stats
		fmt.Fprintf(&sb, "  query data: a %d-GPU slice (%d nodes) every %s for %s, backfilled oldest first into a fresh instance: %d samples, %d series.\n",
			o.bfNodes*8, o.bfNodes, fmtDays(o.bfInterval), fmtDays(o.bfDuration), bst.Samples, bst.Series)
	}
	fmt.Fprintf(&sb, "  queries: %d dashboard panels (source §3) as range queries, step ≈ range/250 (≥ scrape interval), %d measured rounds after %d warm-up, one at a time; VictoriaMetrics with nocache=1, gpustore with Cache-Control: no-store (its results cache bypassed; pieces still split by day).\n",
		nq, o.rounds, o.warmup)
	if o.refresh {
		fmt.Fprintf(&sb, "  dashboard refresh (gpustore only): the panel set once, then %d rounds each with the window %s later (aligned to the step), after a restart on the same data with max-freshness = (now - data end) + 10m so the newest 10 minutes of data are recomputed every round; cache off = Cache-Control: no-store.\n",
			o.rounds, fmtDays(o.refreshShift))
	}
	sb.WriteString("  CPU: receiver utime+stime (/proc/<pid>/stat) from the first request until it idles (<0.1 core for 3 s) after the last answer (and VictoriaMetrics' force_flush).\n")
	sb.WriteString("  peak RSS: VmHWM of the receiver after the saturation phase, divided by the distinct series written.\n")
	sb.WriteString("  disk: allocated bytes (du) of the data directory after a clean stop (SIGTERM), divided by the samples accepted; local TSDB = WAL, head chunks and local blocks; bucket = gpustore's embedded bucket (<data>/bucket): the shipped blocks, compacted (sources deleted at once in the bench); local blocks are kept 6 h past the newest sample.\n")
	for _, r := range b.results {
		fmt.Fprintf(&sb, "  %s disk: %s; %s.\n", r.name, r.diskIngest.String(), r.diskBF.String())
		if r.err != nil {
			fmt.Fprintf(&sb, "  %s FAILED: %v\n", r.name, r.err)
		}
	}
	sb.WriteString(b.mismatches())
	fmt.Fprintf(&sb, "  load average (1, 5, 15 min) at start %s, at end %s; %d CPUs.\n", b.loadStart, loadAvg(), runtime.NumCPU())
	fmt.Fprintf(&sb, "Elapsed: %s\n", time.Since(b.began).Round(time.Second))
	return sb.String()
}

// mismatches lists queries whose answers differ in series count between
// systems: a faster answer to a smaller question is no win.
func (b *bench) mismatches() string {
	var lines []string
	for _, key := range []string{"1h", "24h", "7d"} {
		qs := load.DashboardQueries(b.o.node)
		for i, q := range qs {
			counts := map[string]int{}
			var vals []int
			for _, r := range b.results {
				qr, ok := r.queries[key]
				if !ok || i >= len(qr.Queries) || qr.Queries[i].Err != "" {
					continue
				}
				counts[r.name] = qr.Queries[i].Series
				vals = append(vals, qr.Queries[i].Series)
			}
			sort.Ints(vals)
			if len(vals) > 1 && vals[0] != vals[len(vals)-1] {
				var parts []string
				for _, r := range b.results {
					if c, ok := counts[r.name]; ok {
						parts = append(parts, fmt.Sprintf("%s %d", r.name, c))
					}
				}
				lines = append(lines, fmt.Sprintf("  %s %q: series %s", key, q.Panel, strings.Join(parts, ", ")))
			}
		}
	}
	if len(lines) == 0 {
		return "  Every query returned the same number of series on every system.\n"
	}
	return "  Queries whose answers differ in series count between systems:\n" + strings.Join(lines, "\n") + "\n"
}

// fmtDays prints whole days as "7d" and whole hours or minutes as "1h",
// "30m" (Prometheus style) instead of Go's "1h0m0s".
func fmtDays(d time.Duration) string {
	switch {
	case d >= 24*time.Hour && d%(24*time.Hour) == 0:
		return fmt.Sprintf("%dd", d/(24*time.Hour))
	case d >= time.Hour && d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d >= time.Minute && d%time.Minute == 0:
		return fmt.Sprintf("%dm", d/time.Minute)
	}
	return d.String()
}

// loadAvg returns the first three fields of /proc/loadavg: the machine is
// shared, and other work on it shows in every number.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
