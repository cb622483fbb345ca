package tenantdb

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
)

// BenchmarkHeadRead reads every sample of 256 DCGM series (32 GPUs × 8
// metrics) over two hours at 15 s from the head, as a query does
// (DB.Querier): the head's chunk reader is where the query's chunk bytes
// are counted.
func BenchmarkHeadRead(b *testing.B) {
	m := newBenchManager(b)
	db, err := m.Get("gpu-prod")
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now().Truncate(time.Minute).UnixMilli()
	from := now - 2*time.Hour.Milliseconds()
	for ts := from; ts <= now; ts += 15_000 {
		app := db.Appender(context.Background())
		for s := range 256 {
			ls := labels.FromStrings("__name__", fmt.Sprintf("DCGM_FI_DEV_%d", s%8), "UUID", fmt.Sprintf("GPU-%02d", s/8), "Hostname", fmt.Sprintf("node-%d", s/64))
			if _, err := app.Append(0, ls, ts, float64(ts/15_000%97)); err != nil {
				b.Fatal(err)
			}
		}
		if err := app.Commit(); err != nil {
			b.Fatal(err)
		}
	}
	all := labels.MustNewMatcher(labels.MatchRegexp, "__name__", "DCGM.*")
	var it chunkenc.Iterator
	for b.Loop() {
		q, err := db.Querier(from, now)
		if err != nil {
			b.Fatal(err)
		}
		ss := q.Select(context.Background(), false, nil, all)
		for ss.Next() {
			it = ss.At().Iterator(it)
			for it.Next() != chunkenc.ValNone {
			}
		}
		if err := ss.Err(); err != nil {
			b.Fatal(err)
		}
		_ = q.Close()
	}
}

func newBenchManager(b *testing.B) *Manager {
	cfg := DefaultConfig()
	cfg.Dir = b.TempDir()
	m, err := NewManager(cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = m.Close() })
	return m
}
