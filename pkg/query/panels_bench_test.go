package query

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/grafana/dskit/user"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/thanos-io/objstore/providers/filesystem"

	"github.com/gpustore/gpustore/bench/gpusim"
	"github.com/gpustore/gpustore/bench/load"
	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/blockquery"
	"github.com/gpustore/gpustore/pkg/tenantdb"
)

// panelData is a day and a bit of gpusim data at a 1 m scrape, laid out as
// a receiver that has run for a while holds it: the older hours as 2 h
// blocks in the bucket, the last hours in the tenant's local TSDB (local
// blocks and the head). A 24 h panel reads both.
type panelData struct {
	queryable TenantQueryable
	end       time.Time
	host      string // a node of the data, for the node panels
}

var (
	panelOnce sync.Once
	panels    panelData
	panelErr  error
)

const (
	panelNodes    = 8
	panelInterval = time.Minute
	panelBucketH  = 18 // hours in the bucket
	panelLocalH   = 8  // hours after them in the local TSDB
)

// benchPanelData builds the data once per process (a -count run reuses it).
func benchPanelData(b *testing.B) panelData {
	panelOnce.Do(func() { panels, panelErr = buildPanelData() })
	if panelErr != nil {
		b.Fatal(panelErr)
	}
	return panels
}

func buildPanelData() (panelData, error) {
	ctx := context.Background()
	// One folder, emptied at each process' start and left at its end (the
	// queryable reads it until then), as pkg/compact's benchmarks do.
	dir := filepath.Join(os.TempDir(), "gpustore-panels-bench")
	if err := os.RemoveAll(dir); err != nil {
		return panelData{}, err
	}
	logger := slog.New(slog.DiscardHandler)
	sim, err := gpusim.New(gpusim.Config{Nodes: panelNodes, TargetLabels: true})
	if err != nil {
		return panelData{}, err
	}
	const blockDur = 2 * time.Hour
	start := gpusim.DefaultEpoch.Truncate(blockDur).Add(blockDur)
	localFrom := start.Add(panelBucketH * time.Hour)
	end := localFrom.Add(panelLocalH * time.Hour)
	bkt, err := filesystem.NewBucket(filepath.Join(dir, "bucket"))
	if err != nil {
		return panelData{}, err
	}
	var buf []gpusim.Series
	lsets := map[string]labels.Labels{}
	appendStep := func(app storage.Appender, ts time.Time) error {
		buf = sim.AppendSamples(buf[:0], ts, gpusim.Replica{})
		for i := range buf {
			if _, err := app.Append(0, simLabels(lsets, &buf[i]), buf[i].T, buf[i].V); err != nil {
				return err
			}
		}
		return nil
	}
	for blk := start; blk.Before(localFrom); blk = blk.Add(blockDur) {
		w, err := tsdb.NewBlockWriter(logger, filepath.Join(dir, "blocks"), blockDur.Milliseconds())
		if err != nil {
			return panelData{}, err
		}
		for ts := blk; ts.Before(blk.Add(blockDur)); ts = ts.Add(panelInterval) {
			app := w.Appender(ctx)
			if err := appendStep(app, ts); err != nil {
				return panelData{}, err
			}
			if err := app.Commit(); err != nil {
				return panelData{}, err
			}
		}
		id, err := w.Flush(ctx)
		if err != nil {
			return panelData{}, err
		}
		_ = w.Close()
		bdir := filepath.Join(dir, "blocks", id.String())
		bm, err := block.ReadLocalMeta(bdir)
		if err != nil {
			return panelData{}, err
		}
		if err := shipReceived(ctx, bkt, bdir, bm, "bench"); err != nil {
			return panelData{}, err
		}
	}
	cfg := tenantdb.DefaultConfig()
	cfg.Dir = filepath.Join(dir, "local")
	cfg.BlockDuration = model.Duration(blockDur)
	dbs, err := tenantdb.NewManager(cfg, logger, prometheus.NewRegistry())
	if err != nil {
		return panelData{}, err
	}
	seriesCache := blockquery.NewCache(256<<20, nil)
	dbs.SetBlockCache(seriesCache)
	db, err := dbs.Get("bench")
	if err != nil {
		return panelData{}, err
	}
	for ts := localFrom; ts.Before(end); ts = ts.Add(panelInterval) {
		app := db.Appender(ctx)
		if err := appendStep(app, ts); err != nil {
			return panelData{}, err
		}
		if err := app.Commit(); err != nil {
			return panelData{}, err
		}
	}
	if err := db.Compact(ctx); err != nil { // cuts the older local hours into blocks
		return panelData{}, err
	}
	store, err := syncedStore(ctx, bkt)
	if err != nil {
		return panelData{}, err
	}
	store.SetBlockCache(seriesCache)
	return panelData{queryable: TenantQueryable{DBs: dbs, Sources: []Source{store}}, end: end.Add(-panelInterval), host: sim.Hostnames()[0]}, nil
}

// simLabels is s's label set, built once per series.
func simLabels(lsets map[string]labels.Labels, s *gpusim.Series) labels.Labels {
	var key []byte
	for _, l := range s.Labels {
		key = append(append(append(key, l.Name...), 0xff), l.Value...)
	}
	if ls, ok := lsets[string(key)]; ok {
		return ls
	}
	sb := labels.NewScratchBuilder(len(s.Labels))
	for _, l := range s.Labels {
		sb.Add(l.Name, l.Value)
	}
	sb.Sort()
	ls := sb.Labels()
	lsets[string(key)] = ls
	return ls
}

// BenchmarkPanels24h runs the bench dashboard's query set (bench/load) over
// the last 24 hours with Grafana's step, through the query path's merge of
// the bucket store and the local TSDB (TenantQueryable), as a single node
// answers a 24 h panel (the engine alone: no slicing, no results cache).
func BenchmarkPanels24h(b *testing.B) {
	d := benchPanelData(b)
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 200_000_000, Timeout: 10 * time.Minute, LookbackDelta: 5 * time.Minute})
	ctx := user.InjectOrgID(context.Background(), "bench")
	rng := 24 * time.Hour
	step := load.GrafanaStep(rng, panelInterval)
	qs := load.DashboardQueries(d.host)
	run := func(b *testing.B) {
		for _, dq := range qs {
			qry, err := engine.NewRangeQuery(ctx, d.queryable, nil, dq.Expr, d.end.Add(-rng), d.end, step)
			if err != nil {
				b.Fatal(err)
			}
			if r := qry.Exec(ctx); r.Err != nil {
				b.Fatalf("%s: %v", dq.Expr, r.Err)
			}
			qry.Close()
		}
	}
	run(b) // warm the caches
	c0 := processCPU()
	for b.Loop() {
		run(b)
	}
	perQuery := float64(b.N * len(qs))
	b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/perQuery, "ms/query")
	// On a shared machine the process' CPU time varies less than the wall
	// time (it includes the GC's).
	b.ReportMetric(float64((processCPU()-c0).Microseconds())/1000/perQuery, "cpu-ms/query")
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkSeries24h reads the 24 h of BenchmarkPanels24h's data of one
// metric (64 GPUs) through the query path's merge of the bucket and the
// local TSDB, without the engine and after the select: every sample
// (Next), and a Seek per Grafana step (as the engine's plain selectors
// do). It measures the iterators alone, which the engine's and the index's
// noise hide in BenchmarkPanels24h.
func BenchmarkSeries24h(b *testing.B) {
	d := benchPanelData(b)
	ctx := user.InjectOrgID(context.Background(), "bench")
	rng := 24 * time.Hour
	step := load.GrafanaStep(rng, panelInterval).Milliseconds()
	mint, maxt := d.end.Add(-rng).UnixMilli(), d.end.UnixMilli()
	q, err := d.queryable.Querier(mint, maxt)
	if err != nil {
		b.Fatal(err)
	}
	defer q.Close()
	ss := q.Select(ctx, true, &storage.SelectHints{Start: mint, End: maxt, Step: step},
		labels.MustNewMatcher(labels.MatchEqual, "__name__", "DCGM_FI_DEV_GPU_TEMP"))
	var series []storage.Series
	for ss.Next() {
		series = append(series, ss.At())
	}
	if err := ss.Err(); err != nil || len(series) == 0 {
		b.Fatalf("%d series, %v", len(series), err)
	}
	for _, mode := range []string{"next", "seek"} {
		b.Run(mode, func(b *testing.B) {
			var it chunkenc.Iterator
			samples := 0
			c0 := processCPU()
			for b.Loop() {
				for _, s := range series {
					it = s.Iterator(it)
					if mode == "next" {
						for it.Next() != chunkenc.ValNone {
							samples++
						}
						continue
					}
					for t := mint; t <= maxt && it.Seek(t) != chunkenc.ValNone; t += step {
						samples++
					}
				}
			}
			b.ReportMetric(float64((processCPU()-c0).Nanoseconds())/float64(samples), "cpu-ns/read")
		})
	}
}
