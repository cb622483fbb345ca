// Command uploadbench measures bringing history into gpustore: it writes a
// history of the simulated GPU cluster (bench/gpusim: 1024 GPUs by default)
// as 2h TSDB blocks, as a Prometheus data directory holds them, uploads them
// with `gpustore tools bucket upload-blocks` (every block verified whole,
// then uploaded) into a bucket, and starts gpustore's query role on that
// bucket and waits until a query over the oldest and the newest hour of the
// history answers every series. It prints the samples and bytes, the
// upload's wall and CPU time, and the time from the upload's end until the
// history was queryable; with -compact, also one compactor pass over it
// (merging to 14d blocks and downsampling to 5m and 1h).
//
//	go run ./bench/cmd/uploadbench -nodes 128 -days 30          # the 30-day 1024-GPU history
//	go run ./bench/cmd/uploadbench -nodes 16 -days 2 -interval 1m  # a slice of it
//
// -objstore.config-file uploads to a real bucket (S3) instead of a folder.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/tsdb"
	"gopkg.in/yaml.v3"

	"github.com/gpustore/gpustore/bench/gpusim"
	"github.com/gpustore/gpustore/pkg/app"
	"github.com/gpustore/gpustore/pkg/compact"
	"github.com/gpustore/gpustore/pkg/storage/bucket"
	"github.com/gpustore/gpustore/pkg/tools"
)

func main() {
	nodes := flag.Int("nodes", 128, "GPU nodes of the simulated cluster (8 GPUs each)")
	days := flag.Float64("days", 30, "days of history")
	interval := flag.Duration("interval", 30*time.Second, "scrape interval of the history")
	dir := flag.String("dir", "", "working directory (default: a new temporary one, removed at the end)")
	objstoreFile := flag.String("objstore.config-file", "", "bucket to upload to (default: a FILESYSTEM bucket in the working directory)")
	doCompact := flag.Bool("compact", false, "also run one compactor pass over the uploaded history and time it")
	flag.Parse()
	if err := run(*nodes, *days, *interval, *dir, *objstoreFile, *doCompact); err != nil {
		fmt.Fprintln(os.Stderr, "uploadbench:", err)
		os.Exit(1)
	}
}

func cpu() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func run(nodes int, days float64, interval time.Duration, dir, objstoreFile string, doCompact bool) error {
	if dir == "" {
		d, err := os.MkdirTemp("", "uploadbench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	ctx := context.Background()
	end := time.Now().Add(-2 * time.Hour).Truncate(2 * time.Hour)
	start := end.Add(-time.Duration(days * float64(24*time.Hour))).Truncate(2 * time.Hour)
	fmt.Printf("uploadbench: %d GPUs, %s to %s at %s\n", nodes*8, start.UTC().Format(time.RFC3339), end.UTC().Format(time.RFC3339), interval)

	t0, c0 := time.Now(), cpu()
	blocksDir := filepath.Join(dir, "prometheus")
	samples, series, err := writeHistory(blocksDir, nodes, start, end, interval)
	if err != nil {
		return err
	}
	var blockBytes int64
	_ = filepath.Walk(blocksDir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			blockBytes += fi.Size()
		}
		return nil
	})
	fmt.Printf("history written: %d series, %d samples, %.1f MiB of blocks (%.2f bytes/sample) in %s (CPU %s)\n",
		series, samples, float64(blockBytes)/(1<<20), float64(blockBytes)/float64(samples), time.Since(t0).Round(time.Second), (cpu() - c0).Round(time.Second))

	bcfg := bucket.Config{Type: bucket.Filesystem, Config: map[string]any{"directory": filepath.Join(dir, "bucket")}}
	if objstoreFile == "" {
		objstoreFile = filepath.Join(dir, "objstore.yml")
		raw, _ := yaml.Marshal(map[string]any{"type": bcfg.Type, "config": bcfg.Config})
		if err := os.WriteFile(objstoreFile, raw, 0o644); err != nil {
			return err
		}
	} else {
		bcfg = bucket.Config{ConfigFile: objstoreFile}
	}
	t1, c1 := time.Now(), cpu()
	var out strings.Builder
	code := tools.Main([]string{"bucket", "upload-blocks", "--tenant=history", "--objstore.config-file=" + objstoreFile, blocksDir}, &tools.Env{Stdout: &out, Stderr: os.Stderr})
	upload, uploadCPU := time.Since(t1), cpu()-c1
	if code != 0 {
		return fmt.Errorf("upload-blocks: exit %d:\n%s", code, out.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	fmt.Printf("upload-blocks: %s\n", lines[len(lines)-1])
	fmt.Printf("upload (verify + upload): %s wall, %s CPU: %.0f samples/s, %.1f MiB/s\n", upload.Round(time.Millisecond), uploadCPU.Round(time.Millisecond),
		float64(samples)/upload.Seconds(), float64(blockBytes)/(1<<20)/upload.Seconds())

	// Queryable: gpustore's query role on the bucket answers the oldest
	// and newest hour of the history, every series.
	t2 := time.Now()
	cfg := app.DefaultConfig()
	cfg.Target = app.Ingest + "," + app.Query
	cfg.Server.ListenAddress = "127.0.0.1:0"
	cfg.TSDB.Dir = filepath.Join(dir, "gpustore")
	cfg.Bucket = bcfg
	cfg.BucketStore.SyncInterval = model.Duration(time.Second)
	cfg.Query.MaxSamples = 1 << 30
	cfg.Rules.GPUPack = false
	a, err := app.New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	if err := a.Start(ctx); err != nil {
		return err
	}
	defer func() { _ = a.Stop() }() // the run's figures are out; a failed stop changes none
	base := "http://" + a.Server.Addr().String()
	for _, at := range []time.Time{start.Add(time.Hour), end.Add(-time.Minute)} {
		for {
			n, err := count(base, `count({__name__=~".+"})`, at)
			if err == nil && n > 0 {
				fmt.Printf("  %s: %.0f series answered\n", at.UTC().Format(time.RFC3339), n)
				break
			}
			if time.Since(t2) > 10*time.Minute {
				return fmt.Errorf("history not queryable after 10 minutes: %v %v", n, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	fmt.Printf("queryable (oldest and newest hour answered) %s after the upload ended (gpustore started on the bucket, one bucket-store sync)\n", time.Since(t2).Round(time.Millisecond))

	if doCompact {
		t3, c3 := time.Now(), cpu()
		bkt, err := bucket.New(bcfg, dir, slog.New(slog.DiscardHandler), nil)
		if err != nil {
			return err
		}
		defer bkt.Close()
		ccfg := compact.DefaultConfig()
		ccfg.RetentionRaw, ccfg.Retention5m, ccfg.Retention1h = 0, 0, 0
		cmp, err := compact.New(ccfg, bkt, filepath.Join(dir, "compactor"), nil, slog.New(slog.DiscardHandler), nil)
		if err != nil {
			return err
		}
		if err := cmp.Start(ctx); err != nil {
			return err
		}
		for range 2 {
			if err := cmp.CompactAll(ctx); err != nil {
				return err
			}
		}
		fmt.Printf("compactor: two passes (merge to the 14d layout, downsample to 5m and 1h) in %s wall, %s CPU\n", time.Since(t3).Round(time.Second), (cpu() - c3).Round(time.Second))
	}
	return nil
}

// writeHistory writes the simulated cluster's samples from start to end
// into 2h blocks under dir, as a Prometheus data directory holds them.
func writeHistory(dir string, nodes int, start, end time.Time, interval time.Duration) (samples, series int, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, 0, err
	}
	c, err := gpusim.New(gpusim.Config{Nodes: nodes, TargetLabels: true, Epoch: start})
	if err != nil {
		return 0, 0, err
	}
	var (
		buf   []gpusim.Series
		sb    = labels.NewScratchBuilder(0)
		key   []byte
		lsets = map[string]labels.Labels{}
	)
	logger := slog.New(slog.DiscardHandler)
	for blk := start; blk.Before(end); blk = blk.Add(2 * time.Hour) {
		w, err := tsdb.NewBlockWriter(logger, dir, (2 * time.Hour).Milliseconds())
		if err != nil {
			return 0, 0, err
		}
		for ts := blk; ts.Before(blk.Add(2 * time.Hour)); ts = ts.Add(interval) {
			buf = c.AppendSamples(buf[:0], ts, gpusim.Replica{})
			app := w.Appender(context.Background())
			for i := range buf {
				sr := &buf[i]
				key = key[:0]
				for _, l := range sr.Labels {
					key = append(append(append(key, l.Name...), 0xff), l.Value...)
				}
				ls, ok := lsets[string(key)]
				if !ok {
					sb.Reset()
					for _, l := range sr.Labels {
						sb.Add(l.Name, l.Value)
					}
					sb.Sort()
					ls = sb.Labels()
					lsets[string(key)] = ls
				}
				if _, err := app.Append(0, ls, sr.T, sr.V); err != nil {
					return 0, 0, err
				}
				samples++
			}
			if err := app.Commit(); err != nil {
				return 0, 0, err
			}
		}
		if _, err := w.Flush(context.Background()); err != nil {
			return 0, 0, err
		}
		_ = w.Close()
		clear(lsets) // series of churned jobs do not pile up
	}
	return samples, countSeries(dir), nil
}

// countSeries is the largest series count of one block: the series a query
// at one time finds, about.
func countSeries(dir string) int {
	n := 0
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if m, err := tsdb.OpenBlock(nil, filepath.Join(dir, e.Name()), nil, nil); err == nil {
			n = max(n, int(m.Meta().Stats.NumSeries))
			m.Close()
		}
	}
	return n
}

// count evaluates expr at t for the tenant and returns its single value.
func count(base, expr string, t time.Time) (float64, error) {
	req, err := http.NewRequest(http.MethodGet, base+"/api/v1/query?query="+url.QueryEscape(expr)+"&time="+fmt.Sprint(t.Unix()), nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("X-Scope-OrgID", "history")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var r struct {
		Data struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return 0, err
	}
	if len(r.Data.Result) != 1 {
		return 0, fmt.Errorf("%d results", len(r.Data.Result))
	}
	s, _ := r.Data.Result[0].Value[1].(string)
	return strconv.ParseFloat(s, 64)
}
