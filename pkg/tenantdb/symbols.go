package tenantdb

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/prometheus/prometheus/model/exemplar"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
)

// symbols is the symbol table a tenant's new series' labels are built in
// when gpustore is built with Prometheus' dedupelabels tag (as `make build`
// does): a label name or value is then stored once per tenant and each
// series holds varint references to it, instead of every series holding its
// own copy of its 15 DCGM label strings. Under the default build
// (stringlabels) the table is nil and nothing here costs anything.
//
// Series churn (pods, jobs) leaves names and values in the table that no
// live series uses; when the table has doubled since it was last built, the
// head's labels are rebuilt into a fresh one (tsdb.Head.RebuildSymbolTable)
// in the background, and builders move to it. Series created meanwhile keep
// the old table alive until they die or the next rebuild.
type symbols struct {
	cur        atomic.Pointer[labels.SymbolTable]
	builtLen   atomic.Int64 // the table's size when it was built
	rebuilding atomic.Bool

	mtx      sync.Mutex // orders starting a rebuild with Close
	closed   bool
	rebuilds sync.WaitGroup
	// exemplars orders rebuilds with exemplar queries: the TSDB's
	// RebuildSymbolTable rewrites the exemplar storage's labels holding
	// only that storage's read lock, which its queries take too (a data
	// race the race detector found between a rebuild and
	// TestV2RoundTripWithHistogramsExemplarsAndHeaders' query). A query
	// waits for a rebuild in flight, about a second at a million series.
	exemplars sync.RWMutex
}

// minSymbolsToRebuild keeps a small tenant from rebuilding at every doubling
// of a handful of symbols.
const minSymbolsToRebuild = 4096

// Symbols returns the table to build the tenant's new series' labels in
// (labels.ScratchBuilder.SetSymbolTable): nil under the default build. It
// starts a rebuild when the table has doubled since it was built.
func (db *DB) Symbols() *labels.SymbolTable {
	st := db.symbols.cur.Load()
	if st == nil {
		return nil
	}
	if n := int64(st.Len()); n > 2*max(db.symbols.builtLen.Load(), minSymbolsToRebuild/2) && db.symbols.rebuilding.CompareAndSwap(false, true) {
		db.startSymbolsRebuild()
	}
	return st
}

// initSymbols gives a just-opened tenant a table for its new series at once
// and rebuilds the replayed series' labels into one table in the
// background: done before the open returned, the rebuild held the receiver
// unready for 7 % of a 1 M-series replay's CPU (bench/RESULTS.md, issue 41
// item 1). Series created before the rebuild swaps tables keep the first one
// alive until they die or the next rebuild, as during any rebuild.
func (db *DB) initSymbols() {
	st := labels.NewSymbolTable()
	if st == nil {
		return // not a dedupelabels build
	}
	db.symbols.cur.Store(st)
	if db.Head().NumSeries() == 0 {
		return // a new tenant, or nothing replayed: no labels to move
	}
	db.symbols.rebuilding.Store(true)
	db.startSymbolsRebuild()
}

// startSymbolsRebuild runs rebuildSymbols in the background unless the
// database is closing; the caller has set symbols.rebuilding.
func (db *DB) startSymbolsRebuild() {
	db.symbols.mtx.Lock()
	defer db.symbols.mtx.Unlock()
	if db.symbols.closed {
		db.symbols.rebuilding.Store(false)
		return
	}
	db.symbols.rebuilds.Go(func() {
		defer db.symbols.rebuilding.Store(false)
		db.rebuildSymbols()
	})
}

// rebuildSymbols rebuilds every head series' labels into a new table
// holding only their names and values, and makes it the current one.
func (db *DB) rebuildSymbols() {
	db.symbols.exemplars.Lock()
	st := db.Head().RebuildSymbolTable(db.logger)
	db.symbols.exemplars.Unlock()
	if st == nil {
		return // not a dedupelabels build
	}
	db.symbols.builtLen.Store(int64(st.Len()))
	db.symbols.cur.Store(st)
}

// Close waits for a rebuild in flight, then closes the database.
func (db *DB) Close() error {
	db.symbols.mtx.Lock()
	db.symbols.closed = true
	db.symbols.mtx.Unlock()
	db.symbols.rebuilds.Wait()
	return db.DB.Close()
}

// ExemplarQuerier is the TSDB's, its queries ordered with the symbol
// table's rebuilds (symbols.exemplars).
func (db *DB) ExemplarQuerier(ctx context.Context) (storage.ExemplarQuerier, error) {
	q, err := db.DB.ExemplarQuerier(ctx)
	if err != nil {
		return nil, err
	}
	return exemplarQuerier{ExemplarQuerier: q, rebuilds: &db.symbols.exemplars}, nil
}

type exemplarQuerier struct {
	storage.ExemplarQuerier
	rebuilds *sync.RWMutex
}

func (q exemplarQuerier) Select(start, end int64, matchers ...[]*labels.Matcher) ([]exemplar.QueryResult, error) {
	q.rebuilds.RLock()
	defer q.rebuilds.RUnlock()
	return q.ExemplarQuerier.Select(start, end, matchers...)
}
