package tenantdb

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
)

// logRecorder keeps the messages logged through it.
type logRecorder struct {
	mtx  *sync.Mutex
	msgs *[]string
}

func newLogRecorder() logRecorder { return logRecorder{mtx: &sync.Mutex{}, msgs: &[]string{}} }

func (logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (r logRecorder) Handle(_ context.Context, rec slog.Record) error {
	r.mtx.Lock()
	*r.msgs = append(*r.msgs, rec.Message)
	r.mtx.Unlock()
	return nil
}
func (r logRecorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r logRecorder) WithGroup(string) slog.Handler      { return r }

func (r logRecorder) logged(msg string) bool {
	r.mtx.Lock()
	defer r.mtx.Unlock()
	for _, m := range *r.msgs {
		if strings.Contains(m, msg) {
			return true
		}
	}
	return false
}

// openManager opens every tenant under dir, logging to h.
func openManager(t *testing.T, dir string, snapshot bool, h slog.Handler) *Manager {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Dir = dir
	cfg.MemorySnapshotOnShutdown = snapshot
	m, err := NewManager(cfg, slog.New(h), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	if err := m.OpenExisting(context.Background()); err != nil {
		t.Fatal(err)
	}
	return m
}

// appendRange appends series [0, series) at 15 s steps over [from, to)
// minutes, one commit (one acknowledged write) per step, and records what
// it acknowledged in want.
func appendRange(t *testing.T, db *DB, series, from, to int, want map[string][]string) {
	t.Helper()
	for ts := int64(from) * 60_000; ts < int64(to)*60_000; ts += 15_000 {
		app := db.Appender(context.Background())
		for i := range series {
			ls := labels.FromStrings("__name__", "DCGM_FI_DEV_GPU_TEMP", "gpu", fmt.Sprint(i%8), "node", fmt.Sprint(i/8))
			v := float64(ts/1000) + float64(i)/1000
			if _, err := app.Append(0, ls, ts, v); err != nil {
				t.Fatal(err)
			}
			want[ls.String()] = append(want[ls.String()], fmt.Sprintf("%d=%g", ts, v))
		}
		if err := app.Commit(); err != nil {
			t.Fatal(err)
		}
	}
}

// dump reads every sample of the tenant back.
func dump(t *testing.T, db *DB) map[string][]string {
	t.Helper()
	q, err := db.Querier(math.MinInt64, math.MaxInt64)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	out := map[string][]string{}
	ss := q.Select(context.Background(), false, nil, labels.MustNewMatcher(labels.MatchRegexp, "__name__", ".+"))
	for ss.Next() {
		s := ss.At()
		it := s.Iterator(nil)
		for it.Next() != chunkenc.ValNone {
			ts, v := it.At()
			out[s.Labels().String()] = append(out[s.Labels().String()], fmt.Sprintf("%d=%g", ts, v))
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := ss.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func equalSamples(got, want map[string][]string) bool {
	return maps.EqualFunc(got, want, func(a, b []string) bool { return strings.Join(a, ",") == strings.Join(b, ",") })
}

func sameSamples(t *testing.T, what string, got, want map[string][]string) {
	t.Helper()
	if !equalSamples(got, want) {
		n := func(m map[string][]string) (k int) {
			for _, s := range m {
				k += len(s)
			}
			return k
		}
		t.Fatalf("%s: read %d series and %d samples back, want %d and %d (or different values)", what, len(got), n(got), len(want), n(want))
	}
}

// killCopy copies a tenant's directory while its database is open: what a
// kill -9 leaves on disk (the WAL's acknowledged records are written to the
// file, not synced, at each commit; the page cache survives the process).
func killCopy(t *testing.T, from string) string {
	t.Helper()
	to := t.TempDir()
	if err := os.CopyFS(filepath.Join(to, "tenants"), os.DirFS(filepath.Join(from, "tenants"))); err != nil {
		t.Fatal(err)
	}
	return to
}

func hasSnapshot(t *testing.T, dir string) bool {
	t.Helper()
	snaps, err := filepath.Glob(filepath.Join(dir, "tenants", "team-a", "chunk_snapshot.*"))
	if err != nil {
		t.Fatal(err)
	}
	return len(snaps) > 0
}

// A clean close writes the head to a chunk snapshot and the next open loads
// it instead of replaying the WAL up to it, and keeps every acknowledged
// sample (m-mapped chunks, the open head chunks, series without chunks).
// A kill -9 after that restart replays the WAL written since the snapshot
// on top of it and keeps every sample too, as a kill -9 without any snapshot
// does.
func TestRestartsKeepEveryAcknowledgedSample(t *testing.T) {
	dir := t.TempDir()
	want := map[string][]string{}

	m := openManager(t, dir, true, slog.DiscardHandler)
	db, err := m.Get("team-a")
	if err != nil {
		t.Fatal(err)
	}
	// 45 minutes: 180 samples a series, more than one 120-sample chunk.
	appendRange(t, db, 200, 0, 45, want)

	// kill -9 before any clean stop: the WAL alone.
	killed := killCopy(t, dir)
	mk := openManager(t, killed, true, slog.DiscardHandler)
	sameSamples(t, "after a kill -9 (WAL replay)", dump(t, mk.Existing("team-a")), want)
	if err := mk.Close(); err != nil {
		t.Fatal(err)
	}

	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if !hasSnapshot(t, dir) {
		t.Fatal("a clean close wrote no chunk snapshot")
	}
	rec := newLogRecorder()
	m = openManager(t, dir, true, rec)
	if !rec.logged("Chunk snapshot loading time") || rec.logged("Failed to load chunk snapshot") {
		t.Fatal("the open after a clean close did not load its chunk snapshot")
	}
	db = m.Existing("team-a")
	sameSamples(t, "after a clean restart (snapshot)", dump(t, db), want)
	// The snapshot's series go through the series-limit callbacks as the WAL's do.
	if top, _ := db.TopMetrics(1); len(top) != 1 || top[0].Series != 200 {
		t.Fatalf("after a clean restart the per-metric counts are %v, want 200 series of DCGM_FI_DEV_GPU_TEMP", top)
	}

	// Writes after the snapshot's restart, new series among them, then a kill -9.
	appendRange(t, db, 300, 45, 50, want)
	killed = killCopy(t, dir)
	rec = newLogRecorder()
	mk = openManager(t, killed, true, rec)
	t.Cleanup(func() { _ = mk.Close() })
	if !rec.logged("Chunk snapshot loading time") {
		t.Error("the open after a kill -9 did not load the last clean close's snapshot")
	}
	sameSamples(t, "after a clean restart and a kill -9 (snapshot and WAL)", dump(t, mk.Existing("team-a")), want)
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
}
