package tenantdb

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/prometheus/model/labels"
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
		db.symbols.mtx.Lock()
		if !db.symbols.closed {
			db.symbols.rebuilds.Go(func() {
				defer db.symbols.rebuilding.Store(false)
				db.rebuildSymbols()
			})
		}
		db.symbols.mtx.Unlock()
	}
	return st
}

// rebuildSymbols rebuilds every head series' labels into a new table
// holding only their names and values, and makes it the current one.
func (db *DB) rebuildSymbols() {
	st := db.Head().RebuildSymbolTable(db.logger)
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
