package tenantdb

import (
	"context"
	"log/slog"
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
)

type windowLimits struct{ window time.Duration }

func (windowLimits) MaxActiveSeries(string) int              { return 0 }
func (windowLimits) MaxSeriesPerMetric(string) int           { return 0 }
func (windowLimits) MaxNewSeriesPerDay(string) int           { return 0 }
func (l windowLimits) OutOfOrderWindow(string) time.Duration { return l.window }

// TestFlushHeads: a receiver leaving the ring writes its whole head, in-order
// and out-of-order samples, into blocks of at most one block range each; the
// head is empty after, every sample reads back once, and a restart replays
// nothing (the WAL was truncated), so no sample is counted twice.
func TestFlushHeads(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Dir = t.TempDir()
	cfg.BlockDuration = model.Duration(time.Hour)
	open := func() *Manager {
		m, err := NewManager(cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		m.SetLimits(windowLimits{window: 3 * time.Hour})
		if err := m.OpenExisting(context.Background()); err != nil {
			t.Fatal(err)
		}
		return m
	}
	m := open()
	db, err := m.Get("team-a")
	if err != nil {
		t.Fatal(err)
	}
	const hour = int64(time.Hour / time.Millisecond)
	base := 100 * hour
	// 3 h of in-order samples every minute, then out-of-order ones in between.
	want := 0
	for ts := base; ts < base+3*hour; ts += 60_000 {
		if err := appendSeries(t, db, 0, 4, ts); err != nil {
			t.Fatal(err)
		}
		want += 4
	}
	for ts := base + 30_000; ts < base+2*hour; ts += 600_000 {
		if err := appendSeries(t, db, 0, 4, ts); err != nil {
			t.Fatalf("out-of-order sample: %v", err)
		}
		want += 4
	}
	if err := m.FlushHeads(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := db.Head().NumSeries(); n != 0 {
		t.Errorf("head holds %d series after the flush, want 0", n)
	}
	for _, b := range db.Blocks() {
		if d := b.Meta().MaxTime - b.Meta().MinTime; d > hour {
			t.Errorf("block %s spans %s, more than the block range", b.Meta().ULID, time.Duration(d)*time.Millisecond)
		}
	}
	if got := countSamples(t, db); got != want {
		t.Fatalf("%d samples in blocks after the flush, want %d", got, want)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	m = open()
	defer m.Close()
	db = m.Existing("team-a")
	// The WAL's last segment stays (the TSDB never deletes the one it
	// writes to) and its series records come back, empty: no sample may.
	hq, err := tsdb.NewBlockQuerier(tsdb.NewRangeHead(db.Head(), math.MinInt64, math.MaxInt64), math.MinInt64, math.MaxInt64)
	if err != nil {
		t.Fatal(err)
	}
	defer hq.Close()
	replayed := 0
	for ss := hq.Select(context.Background(), false, nil, labels.MustNewMatcher(labels.MatchRegexp, "__name__", ".+")); ss.Next(); {
		for it := ss.At().Iterator(nil); it.Next() != chunkenc.ValNone; {
			replayed++
		}
	}
	if replayed != 0 {
		t.Errorf("the restart replayed %d samples into the head: the WAL still held flushed samples", replayed)
	}
	if got := countSamples(t, db); got != want {
		t.Fatalf("%d samples after a restart, want %d", got, want)
	}
}

func countSamples(t *testing.T, db *DB) int {
	t.Helper()
	q, err := db.Querier(math.MinInt64, math.MaxInt64)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	n := 0
	ss := q.Select(context.Background(), false, nil, labels.MustNewMatcher(labels.MatchRegexp, "__name__", ".+"))
	for ss.Next() {
		it := ss.At().Iterator(nil)
		for it.Next() != chunkenc.ValNone {
			n++
		}
	}
	if err := ss.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}
