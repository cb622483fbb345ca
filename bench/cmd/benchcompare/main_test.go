package main

import (
	"bytes"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpustore/gpustore/bench/load"
)

// The report is one table with a column per system and the notes under it;
// this renders it from made-up results (no servers).
func TestReport(t *testing.T) {
	o := options{ingestNodes: 128, ingestInterval: 15 * time.Second, ingestDuration: time.Hour, ingestShards: 4,
		bfNodes: 8, bfInterval: time.Minute, bfDuration: 7 * 24 * time.Hour, rounds: 5, warmup: 1, node: "gpu-node-003", protocol: "1.0", seed: 1}
	b := &bench{o: o, log: slog.New(slog.NewTextHandler(io.Discard, nil)), began: time.Now(), end: time.Now()}
	b.ingest = &load.Plan{Workload: load.Workload{MaxSamplesPerSend: 2000, Shards: 4}, Stats: load.GenStats{Samples: 1_000_000, Series: 50_000, SeriesPerTick: 48_000, Requests: 500}}
	b.ingestWL = b.ingest.Workload
	b.backfill = &load.Plan{Stats: load.GenStats{Samples: 2_000_000, Series: 9_000}}
	b.backfillWL = load.Workload{Interval: time.Minute}
	nq := len(load.DashboardQueries(o.node))
	qres := func(ms int, series int) load.QueryResult {
		qr := load.QueryResult{Latency: load.LatencySummary{N: nq * 5, P50: time.Duration(ms) * time.Millisecond, P99: time.Duration(10*ms) * time.Millisecond}}
		for range nq {
			qr.Queries = append(qr.Queries, load.QueryStat{Series: series})
		}
		return qr
	}
	b.results = []*sysResult{
		{name: "gpustore", version: "abc+tree", bucket: true, write: load.Result{Samples: 1_000_000, Wall: 2 * time.Second, Codes: map[int]int64{204: 500}},
			cpuSeconds: 1.5, hwm: 100 << 20, rssStart: 50 << 20, diskIngest: load.DiskUsage{Bytes: 8_000_000},
			bfWrite: load.Result{Samples: 2_000_000, Wall: 4 * time.Second}, diskBF: load.DiskUsage{Bytes: 4_000_000, Bucket: 1_500_000},
			queries: map[string]load.QueryResult{"1h": qres(10, 3), "24h": qres(20, 3), "7d": qres(100, 3)}},
		{name: "prometheus", version: "v0.316.0", write: load.Result{Samples: 1_000_000, Wall: 4 * time.Second, Codes: map[int]int64{204: 499, 503: 2}},
			cpuSeconds: 6, hwm: 200 << 20, diskIngest: load.DiskUsage{Bytes: 8_000_000},
			queries: map[string]load.QueryResult{"1h": qres(12, 4)}, queryErrs: 1},
	}
	out := b.report()
	for _, want := range []string{
		"| metric ", "gpustore abc+tree", "prometheus v0.316.0",
		"| ingest samples/s at saturation (1024 GPUs, 15s, 4 in flight) |",
		"500000", "250000", // samples/s
		"1.50", "6.00", // CPU-s per million
		"2.05", "4.10", // KiB per series: 100 MiB / 50,000
		"| disk bytes/sample, local TSDB, 1h of 1024 GPUs (stopped)",
		"query p50 / p99, 7d window (64 GPUs at 1m)", "100ms / 1.00s",
		"0, 0", "2, 1", // errors
		`1h "GPUs": series gpustore 3, prometheus 4`,
		"2000-sample requests",
		"Elapsed: ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	// The week on disk: 2.5 MB in gpustore's local TSDB and 1.5 MB in its
	// bucket for 2M samples; Prometheus has no bucket.
	for label, want := range map[string][]string{
		"disk bytes/sample, local TSDB, 7d of 64 GPUs at 1m (stopped)": {"1.25", "n/a"},
		"disk bytes/sample, bucket, 7d of 64 GPUs at 1m (stopped)":     {"0.75", "no bucket"},
		"disk bytes/sample, local TSDB, 1h of 1024 GPUs (stopped)":     {"8.00", "8.00"},
		"disk bytes/sample, bucket, 1h of 1024 GPUs (stopped)":         {"0.00", "no bucket"},
	} {
		if got := cellsOf(out, label); !slices.Equal(got, want) {
			t.Errorf("row %q = %q, want %q", label, got, want)
		}
	}
	// One table: every table line has the same number of cells.
	var cells int
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "|") {
			continue
		}
		n := strings.Count(line, "|")
		if cells == 0 {
			cells = n
		} else if n != cells {
			t.Errorf("ragged table line %q", line)
		}
	}
	if cells != 4 {
		t.Errorf("table has %d separators per line; want 4 (metric + 2 systems)", cells)
	}
}

// cellsOf returns the system cells of the table row labelled label.
func cellsOf(table, label string) []string {
	for _, line := range strings.Split(table, "\n") {
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) < 2 || strings.TrimSpace(cells[0]) != label {
			continue
		}
		var out []string
		for _, c := range cells[1:] {
			out = append(out, strings.TrimSpace(c))
		}
		return out
	}
	return nil
}

func TestFlagsRejectUnknownSystem(t *testing.T) {
	var stderr bytes.Buffer
	if code := run([]string{"-systems=gpustore,influx", "-gpustore=/nonexistent"}, io.Discard, &stderr); code == 0 {
		t.Fatal("want a failure")
	}
	if code := run([]string{"-backfill.duration=xyz"}, io.Discard, &stderr); code != 2 {
		t.Fatalf("bad duration: exit %d; want 2", code)
	}
}
