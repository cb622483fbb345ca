//go:build dedupelabels

package tenantdb

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/exemplar"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
)

// TestSymbolsRebuiltAfterChurn: a tenant's symbol table that has doubled
// with the names of series the head has since dropped (churned pods) is
// rebuilt with the live series' names only; every series reads back with
// its labels across the rebuild, and series built in the old table and in
// the new one live side by side.
func TestSymbolsRebuiltAfterChurn(t *testing.T) {
	m := newTestManager(t, nil)
	db, err := m.Get("team-a")
	if err != nil {
		t.Fatal(err)
	}
	db.symbols.rebuilds.Wait() // the rebuild every open starts
	st0 := db.Symbols()
	if st0 == nil {
		t.Fatal("no symbol table under the dedupelabels build")
	}
	ctx := context.Background()
	add := func(st *labels.SymbolTable, pod string, n int, ts int64) []string {
		b := labels.NewScratchBuilderWithSymbolTable(st, 3)
		app := db.Appender(ctx)
		var out []string
		for i := range n {
			b.Reset()
			b.Add(model.MetricNameLabel, "DCGM_FI_DEV_GPU_UTIL")
			b.Add("gpu", fmt.Sprint(i%8))
			b.Add("pod", fmt.Sprintf("%s-%d", pod, i))
			b.Sort()
			ls := b.Labels()
			if _, err := app.Append(0, ls, ts, float64(i)); err != nil {
				t.Fatal(err)
			}
			out = append(out, ls.String())
		}
		if err := app.Commit(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	read := func() []string {
		q, err := db.Querier(0, 1<<40)
		if err != nil {
			t.Fatal(err)
		}
		defer q.Close()
		ss := q.Select(ctx, true, nil, labels.MustNewMatcher(labels.MatchEqual, model.MetricNameLabel, "DCGM_FI_DEV_GPU_UTIL"))
		var out []string
		for ss.Next() {
			out = append(out, ss.At().Labels().String())
		}
		if err := ss.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}

	// 5,000 pods come and go: their names stay in the table.
	add(st0, "old", 5000, 1000)
	if err := db.Head().Truncate(2000); err != nil {
		t.Fatal(err)
	}
	if n := len(read()); n != 0 {
		t.Fatalf("%d old series left in the head after truncation", n)
	}
	live := add(st0, "live", 100, 3000)
	slices.Sort(live)
	if db.Symbols() != st0 { // the call that starts the rebuild still answers the old table
		t.Fatal("table swapped before its rebuild")
	}
	deadline := time.Now().Add(10 * time.Second)
	for db.Symbols() == st0 {
		if time.Now().After(deadline) {
			t.Fatalf("no rebuild after the table grew to %d symbols", st0.Len())
		}
		time.Sleep(10 * time.Millisecond)
	}
	st1 := db.Symbols()
	if st1.Len() >= 200 || st0.Len() < 5000 {
		t.Errorf("table of %d symbols rebuilt into %d: want the live series' names only (~100)", st0.Len(), st1.Len())
	}
	if got := read(); !slices.Equal(got, live) {
		t.Fatalf("after the rebuild the head reads %d series, want the %d live ones with their labels", len(got), len(live))
	}
	live = append(live, add(st1, "new", 100, 4000)...)
	slices.Sort(live)
	if got := read(); !slices.Equal(got, live) {
		t.Fatalf("series built in the old and new tables: read %d, want %d", len(got), len(live))
	}
}

// A reopened tenant hands out a table for its new series at once, while the
// replayed series' labels are rebuilt into one table in the background; the
// replayed series, those created during the rebuild and those after it read
// back with their labels.
func TestSymbolsAfterReplay(t *testing.T) {
	dir := t.TempDir()
	want := map[string][]string{}
	m := openManager(t, dir, false, slog.DiscardHandler)
	db, err := m.Get("team-a")
	if err != nil {
		t.Fatal(err)
	}
	appendRange(t, db, 100, 0, 1, want)
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}

	m = openManager(t, dir, false, slog.DiscardHandler)
	t.Cleanup(func() { _ = m.Close() })
	db = m.Existing("team-a")
	st := db.Symbols()
	if st == nil {
		t.Fatal("no symbol table right after the open")
	}
	add := func(st *labels.SymbolTable, pod string, ts int64) {
		b := labels.NewScratchBuilderWithSymbolTable(st, 2)
		b.Add(model.MetricNameLabel, "DCGM_FI_DEV_GPU_UTIL")
		b.Add("pod", pod)
		b.Sort()
		ls := b.Labels()
		app := db.Appender(context.Background())
		if _, err := app.Append(0, ls, ts, 1); err != nil {
			t.Fatal(err)
		}
		if err := app.Commit(); err != nil {
			t.Fatal(err)
		}
		want[ls.String()] = append(want[ls.String()], fmt.Sprintf("%d=1", ts))
	}
	add(st, "during", 60_000)
	db.symbols.rebuilds.Wait()
	// The rebuild usually swaps tables after "during" was built in the
	// first one, but may finish before the test took it (st is then the
	// rebuilt table): either way the current table must now hold the
	// replayed labels, __name__, gpu, node, the metric and the values 0–12.
	const replayedSymbols = 17
	rebuilt := db.Symbols()
	if rebuilt.Len() < replayedSymbols {
		t.Fatalf("the open's rebuild left a table of %d symbols, want the %d replayed ones at least (the same table as the open's: %v)", rebuilt.Len(), replayedSymbols, rebuilt == st)
	}
	add(rebuilt, "after", 75_000)
	sameSamples(t, "replayed and new series", dump(t, db), want)
}

// TestExemplarQueriesDuringSymbolRebuilds: exemplar queries and symbol
// table rebuilds (each open's, churn's) run at once and every query reads
// the exemplars; under the race detector (make test-race) it fails without
// symbols.exemplars: the TSDB's rebuild rewrites the exemplars' labels
// holding only their storage's read lock.
func TestExemplarQueriesDuringSymbolRebuilds(t *testing.T) {
	m, err := NewManager(Config{Dir: t.TempDir(), BlockDuration: DefaultConfig().BlockDuration, Retention: DefaultConfig().Retention, MaxExemplars: 1000}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	db, err := m.Get("traced")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixMilli()
	app := db.AppenderV2(context.Background())
	for i := range 50 {
		ls := labels.FromStrings("__name__", "training_step_seconds_bucket", "le", "0.5", "rank", fmt.Sprint(i))
		ex := []exemplar.Exemplar{{Labels: labels.FromStrings("trace_id", fmt.Sprintf("%016x", i)), Value: float64(i), Ts: now, HasTs: true}}
		if _, err := app.Append(0, ls, 0, now, 3, nil, nil, storage.AOptions{Exemplars: ex}); err != nil {
			t.Fatal(err)
		}
	}
	if err := app.Commit(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 20 {
			db.rebuildSymbols()
		}
	}()
	name := labels.MustNewMatcher(labels.MatchEqual, "__name__", "training_step_seconds_bucket")
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		q, err := db.ExemplarQuerier(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		res, err := q.Select(math.MinInt64, math.MaxInt64, []*labels.Matcher{name})
		if err != nil || len(res) != 50 {
			t.Fatalf("%d series of exemplars (%v), want 50", len(res), err)
		}
		for _, r := range res {
			if len(r.Exemplars) != 1 || r.Exemplars[0].Labels.Get("trace_id") != fmt.Sprintf("%016x", int(r.Exemplars[0].Value)) {
				t.Fatalf("exemplars of %s: %v", r.SeriesLabels, r.Exemplars)
			}
		}
	}
}
