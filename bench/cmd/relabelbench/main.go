// Command relabelbench measures what the dcgm ingest preset saves on a
// simulated GPU cluster: it plays a day of the gpusim cluster (1024 GPUs by
// default, job churn, a rolling dcgm-exporter upgrade (Hostname → hostname)
// and a rolling driver upgrade) through remote write 2.0 into an in-process
// gpustore, once without relabeling and once with ingest_preset: dcgm, each
// in a fresh data directory, and prints per variant: series created, the
// head's peak series and the Go heap's peak after GC (the TSDB head and the
// ingest caches; sampled every simulated 2 h), series active at the end
// (a sample in the last 5 minutes), bytes per sample of the blocks cut, and
// the process CPU time (simulator and sender included). `make bench-relabel`
// runs it.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"

	"github.com/gpustore/gpustore/bench/gpusim"
	"github.com/gpustore/gpustore/pkg/app"
)

func main() {
	nodes := flag.Int("nodes", 128, "GPU nodes of the simulated cluster (8 GPUs each)")
	duration := flag.Duration("duration", 24*time.Hour, "simulated time")
	interval := flag.Duration("interval", 4*time.Minute, "scrape interval of the simulated Prometheus (4m keeps make bench-relabel under 5 minutes)")
	variants := flag.String("variants", "plain,dcgm", "comma-separated: plain (no rules), dcgm (ingest_preset: dcgm)")
	keep := flag.Bool("keep", false, "keep the data directories")
	flag.Parse()
	fmt.Printf("relabelbench: %d GPUs, %s simulated at a %s scrape interval; exporter upgrade rolling from %s, driver upgrade rolling from %s (each over %s)\n\n",
		*nodes*8, *duration, *interval, *duration/3, 2**duration/3, *duration/12)
	fmt.Printf("| variant | samples sent | series created | head series, peak | heap after GC, peak | active series at end | bytes/sample (blocks) | CPU s (sim + ingest) | wall s |\n|---|---|---|---|---|---|---|---|---|\n")
	// One simulated day for every variant, ending now (so the blocks and
	// the head are where a real day's would be).
	end := time.Now().Truncate(*interval)
	for _, v := range strings.Split(*variants, ",") {
		r, err := run(v, *nodes, end.Add(-*duration), end, *interval, *keep)
		if err != nil {
			fmt.Fprintf(os.Stderr, "relabelbench %s: %v\n", v, err)
			os.Exit(1)
		}
		fmt.Printf("| %s | %d | %d | %d | %.1f MiB | %d | %.2f | %.1f | %.1f |\n", v, r.sent, r.created, r.peakHead, float64(r.heap)/(1<<20), r.active, r.bytesPerSample, r.cpu.Seconds(), r.wall.Seconds())
	}
}

type result struct {
	sent, created, active, peakHead int64
	heap                            uint64
	bytesPerSample                  float64
	cpu, wall                       time.Duration
}

const tenant = "bench"

func run(variant string, nodes int, start, end time.Time, interval time.Duration, keep bool) (result, error) {
	duration := end.Sub(start)
	var r result
	overrides := "overrides: {}\n"
	switch variant {
	case "plain":
	case "dcgm":
		overrides = "overrides:\n  " + tenant + ":\n    ingest_preset: dcgm\n"
	default:
		return r, fmt.Errorf("unknown variant %q", variant)
	}
	dir, err := os.MkdirTemp("", "relabelbench-"+variant+"-")
	if err != nil {
		return r, err
	}
	if !keep {
		defer os.RemoveAll(dir)
	}
	ovFile := filepath.Join(dir, "overrides.yaml")
	if err := os.WriteFile(ovFile, []byte(overrides), 0o644); err != nil {
		return r, err
	}

	var faults []gpusim.Fault
	for n := 0; n < nodes; n++ {
		stagger := time.Duration(n) * (duration / 12) / time.Duration(nodes)
		faults = append(faults,
			gpusim.Fault{Kind: gpusim.FaultExporterUpgrade, At: duration/3 + stagger, Node: fmt.Sprint(n), GPU: -1},
			gpusim.Fault{Kind: gpusim.FaultDriverUpgrade, At: 2*duration/3 + stagger, Node: fmt.Sprint(n), GPU: -1})
	}
	sim, err := gpusim.New(gpusim.Config{Name: "gpu-cluster-prod-01", Nodes: nodes, Seed: 1, TargetLabels: true, Faults: faults, FaultOrigin: start})
	if err != nil {
		return r, err
	}

	cfg := app.DefaultConfig()
	cfg.Target = "ingest"
	cfg.Server.ListenAddress = "127.0.0.1:0"
	cfg.TSDB.Dir = filepath.Join(dir, "data")
	cfg.Limits.OverridesFile = ovFile
	cfg.Rules.GPUPack = false
	cfg.Shipper.Interval = model.Duration(time.Hour) // blocks stay local: counted once, where they were cut
	if err := cfg.Validate(); err != nil {
		return r, err
	}
	a, err := app.New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return r, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	if err := a.Start(ctx); err != nil {
		return r, err
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = a.Stop()
		}
	}()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	heap0 := ms.HeapAlloc

	snd, err := gpusim.NewSender(gpusim.SenderConfig{
		URL: "http://" + a.Server.Addr().String() + "/api/v1/write", Protocol: gpusim.ProtocolV2, Shards: 2, Tenant: tenant,
		ExternalLabels: []gpusim.Label{{Name: "cluster", Value: "gpu-cluster-prod-01"}, {Name: "__replica__", Value: "prometheus-0"}},
	})
	if err != nil {
		return r, err
	}
	cpu0, wall0 := processCPU(), time.Now()
	var sampleCPU time.Duration
	var buf []gpusim.Series
	nextPeak := start
	for ts := start; !ts.After(end); ts = ts.Add(interval) {
		buf = sim.AppendSamples(buf[:0], ts, gpusim.Replica{Name: "prometheus-0"})
		if err := snd.Send(ctx, buf); err != nil {
			return r, err
		}
		if !ts.Before(nextPeak) || !ts.Add(interval).Before(end) {
			c0 := processCPU()
			if err := r.samplePeaks(a.Registry, heap0); err != nil {
				return r, err
			}
			sampleCPU += processCPU() - c0
			nextPeak = nextPeak.Add(2 * time.Hour)
		}
	}
	st := snd.Stats()
	if st.DroppedSamples > 0 {
		return r, fmt.Errorf("the receiver refused %d samples: %+v", st.DroppedSamples, st)
	}
	r.sent = st.Samples
	r.cpu, r.wall = processCPU()-cpu0-sampleCPU, time.Since(wall0)

	if r.created, err = gauge(a.Registry, "prometheus_tsdb_head_series_created_total"); err != nil {
		return r, err
	}
	if r.active, err = activeSeries(a, end); err != nil {
		return r, err
	}
	stopped = true
	if err := a.Stop(); err != nil {
		return r, err
	}
	r.bytesPerSample, err = blockBytesPerSample(cfg.TSDB.Dir)
	return r, err
}

// samplePeaks notes the head's series and the heap after a GC, keeping the
// largest seen.
func (r *result) samplePeaks(g prometheus.Gatherer, heap0 uint64) error {
	n, err := gauge(g, "prometheus_tsdb_head_series")
	if err != nil {
		return err
	}
	r.peakHead = max(r.peakHead, n)
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	r.heap = max(r.heap, ms.HeapAlloc-min(ms.HeapAlloc, heap0))
	return nil
}

// activeSeries counts the tenant's series with a sample in the 5 minutes
// before end (what an instant query sees), independent of when the head
// last dropped series that ended.
func activeSeries(a *app.App, end time.Time) (int64, error) {
	db := a.DBs.Existing(tenant)
	if db == nil {
		return 0, fmt.Errorf("tenant %q has no database", tenant)
	}
	q, err := db.Querier(end.Add(-5*time.Minute).UnixMilli(), end.UnixMilli())
	if err != nil {
		return 0, err
	}
	defer q.Close()
	ss := q.Select(context.Background(), false, nil, labels.MustNewMatcher(labels.MatchRegexp, model.MetricNameLabel, ".+"))
	var n int64
	for ss.Next() {
		n++
	}
	return n, ss.Err()
}

// gauge reads the tenant's value of a TSDB metric (labelled tenant=…).
func gauge(g prometheus.Gatherer, name string) (int64, error) {
	mfs, err := g.Gather()
	if err != nil {
		return 0, err
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "tenant" && l.GetValue() == tenant {
					if c := m.GetCounter(); c != nil {
						return int64(c.GetValue()), nil
					}
					return int64(m.GetGauge().GetValue()), nil
				}
			}
		}
	}
	return 0, fmt.Errorf("%s{tenant=%q} not found", name, tenant)
}

// blockBytesPerSample is the bytes of every block under dir (index, chunks,
// meta) over the samples they hold, each block counted once.
func blockBytesPerSample(dir string) (float64, error) {
	var bytes, samples int64
	seen := map[string]bool{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "meta.json" {
			return err
		}
		blockDir := filepath.Dir(path)
		if seen[filepath.Base(blockDir)] {
			return nil
		}
		seen[filepath.Base(blockDir)] = true
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var meta struct {
			Stats struct {
				NumSamples int64 `json:"numSamples"`
			} `json:"stats"`
		}
		if err := json.Unmarshal(b, &meta); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		samples += meta.Stats.NumSamples
		return filepath.WalkDir(blockDir, func(_ string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			info, err := d.Info()
			if err == nil {
				bytes += info.Size()
			}
			return err
		})
	})
	if err != nil || samples == 0 {
		return 0, fmt.Errorf("blocks under %s: %d samples: %v", dir, samples, err)
	}
	return float64(bytes) / float64(samples), nil
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
