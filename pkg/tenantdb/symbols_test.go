//go:build dedupelabels

package tenantdb

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
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
