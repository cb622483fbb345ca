// Command panelbench measures the dashboard panels of issue 42 on gpustore,
// VictoriaMetrics and Prometheus in one run, on the same bytes: each data set
// (GPUs × history at a 1 m scrape) is encoded once and written oldest first
// into a fresh instance of each system; gpustore is left to ship, compact and
// downsample until settled (compacted blocks in the bucket, the head's last
// hours), VictoriaMetrics is flushed; then every panel runs uncached
// (gpustore: Cache-Control: no-store; VictoriaMetrics: nocache=1) over 24 h
// at a 5 m step and 7 d at a 30 m step, one query at a time, and the table
// gives each panel's p50 and p99 per system and gpustore's ratio to
// VictoriaMetrics. Every panel's answer on gpustore is compared with
// Prometheus' (they must be equal, value for value).
//
// make bench-panels runs it; -work-dir with -keep keeps the data, and
// -reuse starts each system again on the data a kept run left (no
// backfill), to measure a new gpustore build on the same bytes.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gpustore/gpustore/bench/gpusim"
	"github.com/gpustore/gpustore/bench/load"
	"github.com/gpustore/gpustore/internal/testbin"
)

// Panels are the six panels of issue 42 (load.Issue42Panels).
var Panels = load.Issue42Panels

// Windows are the dashboard ranges and the steps the issue measures them at.
var Windows = []window{{"24h", 24 * time.Hour, 5 * time.Minute}, {"7d", 7 * 24 * time.Hour, 30 * time.Minute}}

type window struct {
	name string
	rng  time.Duration
	step time.Duration
}

type dataset struct {
	name     string // "64x7d"
	gpus     int
	history  time.Duration
	interval time.Duration
}

func parseDatasets(s string, interval time.Duration) ([]dataset, error) {
	var out []dataset
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		g, h, ok := strings.Cut(f, "x")
		gpus, err := strconv.Atoi(g)
		if !ok || err != nil || gpus < 8 || gpus%8 != 0 {
			return nil, fmt.Errorf("data set %q: want GPUSxHISTORY with GPUS a multiple of 8 (e.g. 64x7d)", f)
		}
		d, err := parseDays(h)
		if err != nil {
			return nil, fmt.Errorf("data set %q: %w", f, err)
		}
		out = append(out, dataset{name: f, gpus: gpus, history: d, interval: interval})
	}
	return out, nil
}

func parseDays(s string) (time.Duration, error) {
	if d, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(d)
		if err != nil || n <= 0 {
			return 0, fmt.Errorf("bad history %q", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	return time.ParseDuration(s)
}

type options struct {
	gpustoreBin, prometheusBin, vmBin string
	baseBin                           string // gpustore-base: another gpustore build on gpustore's data
	systems, datasets                 string
	interval                          time.Duration
	rounds, warmup                    int
	workDir                           string
	keep, reuse                       bool
	out                               string
	profile                           time.Duration
	gpustoreArgs                      string
	shards                            int
	params                            map[string]string
	compactTimeout                    time.Duration
}

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	var o options
	fs := flag.NewFlagSet("panelbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.gpustoreBin, "gpustore", "bin/gpustore", "gpustore binary.")
	fs.StringVar(&o.prometheusBin, "prometheus", "", "Prometheus binary (default: found as the tests find it: $GPUSTORE_TOOLS_DIR, ~/.cache/gpustore-tools/bin, $PATH).")
	fs.StringVar(&o.vmBin, "victoria-metrics", "", "VictoriaMetrics single-node binary (default: found as the tests find it: $GPUSTORE_TOOLS_DIR, ~/.cache/gpustore-tools/bin, $PATH).")
	fs.StringVar(&o.baseBin, "gpustore.base", "", "Another gpustore binary, run as the system gpustore-base on gpustore's data (after it, or on kept data with -reuse): a before and after in one run.")
	fs.StringVar(&o.systems, "systems", "gpustore,victoriametrics,prometheus", "Systems, in order.")
	fs.StringVar(&o.datasets, "datasets", "64x7d,512x1d", "Data sets: GPUSxHISTORY, comma-separated.")
	fs.DurationVar(&o.interval, "interval", time.Minute, "Scrape interval of the data sets.")
	fs.IntVar(&o.rounds, "rounds", 20, "Measured rounds of each window's panels.")
	fs.IntVar(&o.warmup, "warmup", 2, "Unmeasured rounds before them.")
	fs.StringVar(&o.workDir, "work-dir", "", "Directory for data and logs (default: a temporary one, removed unless -keep).")
	fs.BoolVar(&o.keep, "keep", false, "Keep the work directory.")
	fs.BoolVar(&o.reuse, "reuse", false, "Start each system on the data a previous -keep run left in -work-dir instead of writing it again.")
	fs.StringVar(&o.out, "out", "", "Also write the table to this file.")
	fs.DurationVar(&o.profile, "profile", 0, "After the measured rounds, this long a CPU profile of gpustore and VictoriaMetrics (Go pprof) while the panels run, per window, into the work directory.")
	fs.StringVar(&o.gpustoreArgs, "gpustore.args", "", "Extra space-separated flags for gpustore.")
	fs.IntVar(&o.shards, "shards", 4, "Requests in flight while writing.")
	gsParams := fs.String("gpustore.params", "", "Extra query parameters for gpustore (e.g. max_source_resolution=raw).")
	fs.DurationVar(&o.compactTimeout, "compact.timeout", 20*time.Minute, "Longest wait for gpustore to settle.")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	o.params = map[string]string{"gpustore": *gsParams}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "panelbench: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if o.reuse && o.workDir == "" {
		fmt.Fprintln(stderr, "panelbench: -reuse needs -work-dir")
		return 2
	}
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
	report, err := b.run(ctx)
	fmt.Fprint(stdout, report)
	if o.out != "" && report != "" {
		_ = os.WriteFile(o.out, []byte(report), 0o644)
	}
	if err != nil {
		log.Error("panelbench failed", "err", err)
		return 1
	}
	return 0
}

type bench struct {
	o       options
	log     *slog.Logger
	workDir string
	results []*result
	loadAvg []string
}

// result is one system's panels on one data set and window.
type result struct {
	dataset, window, system string
	step                    time.Duration
	panels                  []load.QueryStat
	cpu                     []time.Duration // the server's CPU time per query, by panel
	answers                 []answer
	err                     error
}

// state is what a kept run leaves beside each system's data, for -reuse.
type state struct {
	End     time.Time `json:"end"`
	Samples int64     `json:"samples"`
}

func (b *bench) run(ctx context.Context) (string, error) {
	o := b.o
	sets, err := parseDatasets(o.datasets, o.interval)
	if err != nil {
		return "", err
	}
	systems := strings.Split(o.systems, ",")
	for _, s := range systems {
		if _, err := os.Stat(b.bin(s)); err != nil {
			return "", fmt.Errorf("%s binary: %w", s, err)
		}
	}
	b.workDir = o.workDir
	if b.workDir == "" {
		if b.workDir, err = os.MkdirTemp("", "gpustore-panelbench-"); err != nil {
			return "", err
		}
		if !o.keep {
			defer os.RemoveAll(b.workDir)
		}
	}
	b.loadAvg = append(b.loadAvg, "start "+loadAvg())
	for _, ds := range sets {
		var plan *load.Plan
		end := time.Now().Add(-time.Minute).Truncate(time.Minute)
		for _, sys := range systems {
			dir := filepath.Join(b.workDir, ds.name, sys)
			st, reused := b.reused(dir, false)
			if sys == "gpustore-base" {
				dir = filepath.Join(b.workDir, ds.name, "gpustore")
				if st, reused = b.reused(dir, true); !reused {
					return b.report(), fmt.Errorf("gpustore-base runs on gpustore's data: none in %s", dir)
				}
			}
			if !reused {
				if plan == nil {
					if plan, err = b.plan(ctx, ds, end); err != nil {
						return "", err
					}
				}
				st = state{End: plan.Workload.End(), Samples: plan.Stats.Samples}
			}
			if err := b.system(ctx, ds, sys, dir, st, plan, reused); err != nil {
				b.log.Error("system failed", "dataset", ds.name, "system", sys, "err", err)
				b.results = append(b.results, &result{dataset: ds.name, system: sys, err: err})
			}
			if ctx.Err() != nil {
				return b.report(), ctx.Err()
			}
		}
		plan = nil
		runtime.GC()
		b.loadAvg = append(b.loadAvg, ds.name+" done "+loadAvg())
	}
	return b.report(), nil
}

func (b *bench) bin(system string) string {
	switch system {
	case "gpustore":
		return b.o.gpustoreBin
	case "gpustore-base":
		return b.o.baseBin
	case "prometheus":
		return b.o.prometheusBin
	case "victoriametrics":
		return b.o.vmBin
	}
	return "unknown system " + system
}

// reused reads the state a kept run left in dir.
func (b *bench) reused(dir string, always bool) (state, bool) {
	var st state
	if !b.o.reuse && !always {
		return st, false
	}
	raw, err := os.ReadFile(filepath.Join(dir, "state.json"))
	if err != nil || json.Unmarshal(raw, &st) != nil {
		return st, false
	}
	return st, true
}

func (b *bench) plan(ctx context.Context, ds dataset, end time.Time) (*load.Plan, error) {
	ticks := int(ds.history / ds.interval)
	wl := load.Workload{
		Cluster:  gpusim.Config{Name: "gpu-cluster-panels", Nodes: ds.gpus / 8, Seed: 1, TargetLabels: true},
		Start:    end.Add(-time.Duration(ticks-1) * ds.interval),
		Ticks:    ticks,
		Interval: ds.interval, Protocol: gpusim.Protocol("1.0"), Shards: b.o.shards,
	}
	b.log.Info("encoding the data set once (sent byte for byte to every system)", "dataset", ds.name, "nodes", ds.gpus/8, "history", ds.history)
	p, err := load.BuildPlan(ctx, wl)
	if err != nil {
		return nil, fmt.Errorf("build %s: %w", ds.name, err)
	}
	b.log.Info("data set ready", "dataset", ds.name, "samples", p.Stats.Samples, "series", p.Stats.Series, "requests", p.Stats.Requests, "took", p.Stats.Took.Round(time.Millisecond))
	return p, nil
}

func (b *bench) newSystem(name, dir string) (*load.System, error) {
	addr, err := load.FreeAddr()
	if err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "data")
	var s *load.System
	switch name {
	case "gpustore", "gpustore-base":
		s = load.Gpustore(b.bin(name), data, addr)
		s.Args = append(s.Args, strings.Fields(b.o.gpustoreArgs)...)
	case "prometheus":
		cfg := filepath.Join(dir, "prometheus.yml")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		if err := load.WritePrometheusConfig(cfg); err != nil {
			return nil, err
		}
		s = load.Prometheus(b.o.prometheusBin, data, cfg, addr)
	case "victoriametrics":
		s = load.VictoriaMetrics(b.o.vmBin, data, addr)
	default:
		return nil, fmt.Errorf("unknown system %q", name)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	s.LogPath = filepath.Join(dir, name+".log")
	return s, nil
}

// system writes the data set into a fresh instance (or starts one on kept
// data), lets it settle, and measures every window's panels.
func (b *bench) system(ctx context.Context, ds dataset, name, dir string, st state, plan *load.Plan, reused bool) (err error) {
	if !reused {
		if err := os.RemoveAll(dir); err != nil {
			return err
		}
	}
	s, err := b.newSystem(name, dir)
	if err != nil {
		return err
	}
	defer func() {
		if serr := s.Stop(2 * time.Minute); serr != nil && err == nil {
			err = serr
		}
	}()
	if err := s.Start(); err != nil {
		return err
	}
	if err := s.WaitReady(ctx, 5*time.Minute); err != nil {
		return err
	}
	b.log.Info("started", "dataset", ds.name, "system", name, "pid", s.PID(), "reused", reused)
	if !reused {
		res, err := load.Run(ctx, load.DriverConfig{URL: s.WriteURL(), Protocol: plan.Workload.Protocol, PID: s.PID(),
			Logger: b.log.With("system", name, "dataset", ds.name), Progress: 15 * time.Second}, plan.Source())
		if err != nil {
			return fmt.Errorf("write: %w", err)
		}
		b.log.Info("written", "dataset", ds.name, "system", name, "result", res.String())
		if res.Samples != plan.Stats.Samples {
			return fmt.Errorf("write: %d of %d samples accepted", res.Samples, plan.Stats.Samples)
		}
	}
	if err := s.Flush(ctx); err != nil {
		return err
	}
	if _, _, err := load.WaitIdle(ctx, s.PID(), 0.1, 3*time.Second, 2*time.Minute); err != nil {
		return err
	}
	if !reused {
		if err := s.WaitCompacted(ctx, b.o.compactTimeout, func(m string) { b.log.Info("settling", "system", name, "state", m) }); err != nil {
			return err
		}
		raw, _ := json.Marshal(st)
		if err := os.WriteFile(filepath.Join(dir, "state.json"), raw, 0o644); err != nil {
			return err
		}
	} else if s.Compacts {
		time.Sleep(12 * time.Second) // two bucket-store syncs after the restart
	}
	for _, w := range Windows {
		if w.rng > ds.history {
			continue
		}
		r := &result{dataset: ds.name, window: w.name, system: name, step: w.step}
		b.results = append(b.results, r)
		cfg := load.QueryConfig{BaseURL: s.BaseURL(), Queries: Panels, End: st.End, Range: w.rng, Step: w.step,
			Params: withParams(s.QueryParams, b.o.params[name]), Headers: s.QueryHeaders}
		b.log.Info("panels", "dataset", ds.name, "system", name, "window", w.name, "rounds", b.o.rounds)
		if err := b.measurePanels(ctx, s, cfg, r); err != nil {
			r.err = err
			return err
		}
		if r.answers, err = answers(ctx, cfg); err != nil {
			return err
		}
		if b.o.profile > 0 && name != "prometheus" {
			if err := b.profileWindow(ctx, s, cfg, filepath.Join(b.workDir, fmt.Sprintf("%s-%s-%s.pprof", ds.name, name, w.name))); err != nil {
				b.log.Warn("profile failed", "system", name, "err", err)
			}
		}
	}
	return nil
}

// measurePanels runs each panel on its own, its warm-up rounds then its
// measured rounds, and takes the server's CPU time over the measured ones.
func (b *bench) measurePanels(ctx context.Context, s *load.System, cfg load.QueryConfig, r *result) error {
	var all []time.Duration
	for _, p := range cfg.Queries {
		c := cfg
		c.Queries = []load.Query{p}
		if b.o.warmup > 0 {
			c.Rounds, c.Warmup = b.o.warmup, -1
			if _, err := load.RunQueries(ctx, c); err != nil {
				return err
			}
		}
		p0, err := load.ReadProc(s.PID())
		if err != nil {
			return err
		}
		c.Rounds, c.Warmup = b.o.rounds, -1
		qr, err := load.RunQueries(ctx, c)
		if err != nil {
			return err
		}
		p1, err := load.ReadProc(s.PID())
		if err != nil {
			return err
		}
		st := qr.Queries[0]
		if st.Err != "" {
			r.err = fmt.Errorf("%s: %s", p.Panel, st.Err)
		}
		r.panels = append(r.panels, st)
		r.cpu = append(r.cpu, time.Duration(load.CPUSeconds(p1.CPUTicks-p0.CPUTicks)*float64(time.Second)/float64(b.o.rounds)))
		all = append(all, st.Latency.P50)
	}
	b.log.Info("panels done", "system", s.Name, "p50s", fmt.Sprint(all))
	return nil
}

func withParams(base url.Values, extra string) url.Values {
	out := url.Values{}
	for k, v := range base {
		out[k] = v
	}
	if extra != "" {
		q, _ := url.ParseQuery(extra)
		for k, v := range q {
			out[k] = v
		}
	}
	return out
}

// profileWindow runs the window's panels over and over while it takes a
// CPU profile of the system.
func (b *bench) profileWindow(ctx context.Context, s *load.System, cfg load.QueryConfig, path string) error {
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c := cfg
		c.Rounds, c.Warmup = 1, 0
		for pctx.Err() == nil {
			if _, err := load.RunQueries(pctx, c); err != nil {
				return
			}
		}
	}()
	defer wg.Wait()
	defer cancel()
	u := fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", s.BaseURL(), int(b.o.profile.Seconds()))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Timeout: b.o.profile + time.Minute}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profile: HTTP %d", resp.StatusCode)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := io.Copy(f, resp.Body); err != nil {
		return err
	}
	b.log.Info("profile written", "path", path)
	return nil
}

// answer is one panel's answer, canonical: series sorted by their labels,
// each with its points as the API wrote them.
type answer struct {
	series []string // "labels: t=v t=v ..."
	err    string
}

func answers(ctx context.Context, cfg load.QueryConfig) ([]answer, error) {
	out := make([]answer, len(cfg.Queries))
	end := cfg.End.Truncate(cfg.Step)
	start := end.Add(-cfg.Range).Truncate(cfg.Step)
	for i, q := range cfg.Queries {
		form := url.Values{}
		for k, v := range cfg.Params {
			form[k] = v
		}
		form.Set("query", q.Expr)
		form.Set("start", strconv.FormatInt(start.Unix(), 10))
		form.Set("end", strconv.FormatInt(end.Unix(), 10))
		form.Set("step", strconv.FormatFloat(cfg.Step.Seconds(), 'f', -1, 64))
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, cfg.BaseURL+"/api/v1/query_range", strings.NewReader(form.Encode()))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		for k, v := range cfg.Headers {
			req.Header[k] = v
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		var pr struct {
			Status string `json:"status"`
			Error  string `json:"error"`
			Data   struct {
				Result []struct {
					Metric map[string]string `json:"metric"`
					Values [][2]any          `json:"values"`
				} `json:"result"`
			} `json:"data"`
		}
		err = json.NewDecoder(resp.Body).Decode(&pr)
		resp.Body.Close()
		if err != nil || pr.Status != "success" {
			out[i].err = fmt.Sprintf("HTTP %d %v %s", resp.StatusCode, err, pr.Error)
			continue
		}
		for _, r := range pr.Data.Result {
			names := make([]string, 0, len(r.Metric))
			for n := range r.Metric {
				names = append(names, n)
			}
			sort.Strings(names)
			var sb strings.Builder
			for _, n := range names {
				fmt.Fprintf(&sb, "%s=%q,", n, r.Metric[n])
			}
			sb.WriteString(":")
			for _, v := range r.Values {
				fmt.Fprintf(&sb, " %v=%v", v[0], v[1])
			}
			out[i].series = append(out[i].series, sb.String())
		}
		sort.Strings(out[i].series)
	}
	return out, nil
}

// compare says how a's answer differs from b's ("" when equal).
func compare(a, b answer) string {
	if a.err != "" || b.err != "" {
		return fmt.Sprintf("errors: %q / %q", a.err, b.err)
	}
	if len(a.series) != len(b.series) {
		return fmt.Sprintf("%d series against %d", len(a.series), len(b.series))
	}
	diff := 0
	first := ""
	for i := range a.series {
		if a.series[i] != b.series[i] {
			if diff == 0 {
				first = firstDiff(a.series[i], b.series[i])
			}
			diff++
		}
	}
	if diff == 0 {
		return ""
	}
	return fmt.Sprintf("%d of %d series differ, first: %s", diff, len(a.series), first)
}

func firstDiff(a, b string) string {
	af, bf := strings.Fields(a), strings.Fields(b)
	for i := range min(len(af), len(bf)) {
		if af[i] != bf[i] {
			return af[i] + " ≠ " + bf[i]
		}
	}
	return fmt.Sprintf("%d points against %d", len(af), len(bf))
}

func (b *bench) find(ds, w, sys string) *result {
	for _, r := range b.results {
		if r.dataset == ds && r.window == w && r.system == sys {
			return r
		}
	}
	return nil
}

// report renders one table per data set and window, then the notes.
func (b *bench) report() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "# panelbench %s (%d CPUs; %d rounds after %d warm-up; load average %s)\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), runtime.NumCPU(), b.o.rounds, b.o.warmup, strings.Join(b.loadAvg, ", "))
	var notes []string
	type key struct{ ds, w string }
	var keys []key
	for _, r := range b.results {
		if r.window != "" && !slices.Contains(keys, key{r.dataset, r.window}) {
			keys = append(keys, key{r.dataset, r.window})
		}
	}
	for _, k := range keys {
		gs, vm, pr := b.find(k.ds, k.w, "gpustore"), b.find(k.ds, k.w, "victoriametrics"), b.find(k.ds, k.w, "prometheus")
		base := b.find(k.ds, k.w, "gpustore-base")
		step := time.Duration(0)
		for _, r := range []*result{gs, vm, pr, base} {
			if r != nil {
				step = r.step
			}
		}
		g, h, _ := strings.Cut(k.ds, "x")
		fmt.Fprintf(&sb, "## %s GPUs, %s of data at %s; %s window, step %s\n\n", g, h, b.o.interval, k.w, step)
		sb.WriteString("p50 / p99 latency (server CPU per query)\n\n| panel | gpustore | VictoriaMetrics | Prometheus |")
		if base != nil {
			sb.WriteString(" gpustore-base |")
		}
		sb.WriteString(" gpustore ÷ VM: p50 / p99 / CPU | answer vs Prometheus |\n|---|--:|--:|--:|")
		if base != nil {
			sb.WriteString("--:|")
		}
		sb.WriteString("--:|---|\n")
		for i, p := range Panels {
			cell := func(r *result) string {
				if r == nil || i >= len(r.panels) {
					return "—"
				}
				l := r.panels[i].Latency
				return fmt.Sprintf("%s / %s (%s)", ms(l.P50), ms(l.P99), ms(r.cpu[i]))
			}
			ratio := "—"
			if gs != nil && vm != nil && i < len(gs.panels) && i < len(vm.panels) {
				g, v := gs.panels[i].Latency, vm.panels[i].Latency
				ratio = fmt.Sprintf("%.2f / %.2f / %.2f", float64(g.P50)/float64(max(v.P50, 1)), float64(g.P99)/float64(max(v.P99, 1)),
					float64(gs.cpu[i])/float64(max(vm.cpu[i], 1)))
				if g.P50 <= v.P50 {
					ratio = "**" + ratio + "**"
				}
			}
			same := "—"
			if gs != nil && pr != nil && i < len(gs.answers) && i < len(pr.answers) {
				if d := compare(gs.answers[i], pr.answers[i]); d == "" {
					same = fmt.Sprintf("equal (%d series)", len(gs.answers[i].series))
				} else {
					same = "DIFFERENT: " + d
				}
			}
			if gs != nil && vm != nil && i < len(gs.answers) && i < len(vm.answers) && len(gs.answers[i].series) != len(vm.answers[i].series) {
				notes = append(notes, fmt.Sprintf("%s %s %q: VictoriaMetrics answered %d series, gpustore %d", k.ds, k.w, p.Panel, len(vm.answers[i].series), len(gs.answers[i].series)))
			}
			fmt.Fprintf(&sb, "| `%s` | %s | %s | %s |", p.Expr, cell(gs), cell(vm), cell(pr))
			if base != nil {
				fmt.Fprintf(&sb, " %s |", cell(base))
			}
			fmt.Fprintf(&sb, " %s | %s |\n", ratio, same)
		}
		sb.WriteString("\n")
	}
	for _, r := range b.results {
		if r.err != nil {
			notes = append(notes, fmt.Sprintf("%s %s %s: %v", r.dataset, r.window, r.system, r.err))
		}
	}
	if len(notes) > 0 {
		sb.WriteString("Notes:\n")
		for _, n := range notes {
			sb.WriteString("- " + n + "\n")
		}
	}
	return sb.String()
}

func ms(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 2, 64) + " ms" }

func loadAvg() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(raw))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
