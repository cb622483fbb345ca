package tenantdb

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/tsdb"
)

// testLimits are limits a test changes while the database runs, as the
// overrides file does.
type testLimits struct{ maxSeries, perMetric, perDay atomic.Int64 }

func (l *testLimits) MaxActiveSeries(string) int            { return int(l.maxSeries.Load()) }
func (l *testLimits) MaxSeriesPerMetric(string) int         { return int(l.perMetric.Load()) }
func (l *testLimits) MaxNewSeriesPerDay(string) int         { return int(l.perDay.Load()) }
func (l *testLimits) OutOfOrderWindow(string) time.Duration { return 0 }

// appendSeries appends one sample at ts to each of the series [from, to) in
// one request and commits; it returns the first append error.
func appendSeries(t *testing.T, db *DB, from, to int, ts int64) error {
	t.Helper()
	app := db.Appender(context.Background())
	for i := from; i < to; i++ {
		if _, err := app.Append(0, seriesLabels(i), ts, float64(i)); err != nil {
			_ = app.Rollback()
			return err
		}
	}
	return app.Commit()
}

// max_active_series rejects the series that would go past the limit and
// nothing else: samples of existing series keep coming in. A changed limit
// applies to the next new series, without a restart, and series restored
// from the WAL at start-up are never rejected (they are not new).
func TestMaxActiveSeries(t *testing.T) {
	lim := &testLimits{}
	lim.maxSeries.Store(3)
	dir := t.TempDir()
	open := func() *Manager {
		m := newTestManager(t, func(c *Config) { c.Dir = dir })
		m.SetLimits(lim)
		return m
	}
	m := open()
	db, err := m.Get("lab")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixMilli()
	if err := appendSeries(t, db, 0, 3, now); err != nil {
		t.Fatalf("3 series under a limit of 3: %v", err)
	}
	err = appendSeries(t, db, 3, 4, now)
	if !errors.Is(err, ErrMaxActiveSeries) {
		t.Fatalf("4th series under a limit of 3: %v, want ErrMaxActiveSeries", err)
	}
	if n := db.Head().NumSeries(); n != 3 {
		t.Fatalf("head has %d series after a rejected one, want 3", n)
	}
	if err := appendSeries(t, db, 0, 3, now+15_000); err != nil {
		t.Fatalf("samples of existing series at the limit: %v", err)
	}
	// Another tenant's limit is its own.
	other, err := m.Get("other")
	if err != nil {
		t.Fatal(err)
	}
	if err := appendSeries(t, other, 0, 3, now); err != nil {
		t.Fatalf("another tenant's first series: %v", err)
	}

	// Raised while running: the next series goes in.
	lim.maxSeries.Store(5)
	if err := appendSeries(t, db, 3, 5, now+15_000); err != nil {
		t.Fatalf("series 4 and 5 after raising the limit to 5: %v", err)
	}
	if err := appendSeries(t, db, 5, 6, now+15_000); !errors.Is(err, ErrMaxActiveSeries) {
		t.Fatalf("6th series under a limit of 5: %v", err)
	}
	// 0 is unlimited.
	lim.maxSeries.Store(0)
	if err := appendSeries(t, db, 5, 50, now+30_000); err != nil {
		t.Fatalf("unlimited: %v", err)
	}
	if n := db.Head().NumSeries(); n != 50 {
		t.Fatalf("head has %d series, want 50", n)
	}

	// Lowered below what the head holds, then restarted: the WAL replay
	// restores all 50 series, and only new series are refused.
	lim.maxSeries.Store(10)
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	m = open()
	db, err = m.Get("lab")
	if err != nil {
		t.Fatalf("reopen over the limit: %v", err)
	}
	if n := db.Head().NumSeries(); n != 50 {
		t.Fatalf("after WAL replay the head has %d series, want 50", n)
	}
	if err := appendSeries(t, db, 0, 50, now+45_000); err != nil {
		t.Fatalf("samples of replayed series over a lowered limit: %v", err)
	}
	if err := appendSeries(t, db, 50, 51, now+45_000); !errors.Is(err, ErrMaxActiveSeries) {
		t.Fatalf("new series over a lowered limit: %v", err)
	}
}

// gate is a deletion gate whose answers a test sets, as the shipper's
// MayDelete answers once an upload is confirmed.
type gate struct {
	mtx     sync.Mutex
	allowed map[ulid.ULID]bool
	asked   map[ulid.ULID]bool
}

func (g *gate) mayDelete(tenant string, id ulid.ULID) bool {
	g.mtx.Lock()
	defer g.mtx.Unlock()
	g.asked[id] = true
	return tenant == "t" && g.allowed[id]
}

func (g *gate) allow(id ulid.ULID) {
	g.mtx.Lock()
	defer g.mtx.Unlock()
	g.allowed[id] = true
}

// writeMinutes appends one series sampled every 15 s over [from, to) minutes
// and compacts what the head can hand to blocks.
func writeMinutes(t *testing.T, db *DB, from, to int) {
	t.Helper()
	for ts := int64(from) * 60_000; ts < int64(to)*60_000; ts += 15_000 {
		if err := appendSeries(t, db, 0, 1, ts); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Compact(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A local block past the retention stays on disk until the gate confirms
// its upload, then goes at the next reload; blocks the gate has not
// confirmed stay, however old.
func TestDeletionGateKeepsUnconfirmedBlocks(t *testing.T) {
	g := &gate{allowed: map[ulid.ULID]bool{}, asked: map[ulid.ULID]bool{}}
	m := newTestManager(t, func(c *Config) {
		c.BlockDuration = model.Duration(time.Minute)
		c.Retention = model.Duration(2 * time.Minute)
	})
	m.SetDeletionGate(g.mayDelete)
	db, err := m.Get("t")
	if err != nil {
		t.Fatal(err)
	}
	writeMinutes(t, db, 0, 10)
	blocks := db.Blocks()
	if len(blocks) < 6 {
		t.Fatalf("%d blocks after writing 10 one-minute ranges, want at least 6", len(blocks))
	}
	newest := blocks[len(blocks)-1].Meta().MaxTime
	var expired []tsdb.BlockMeta
	for _, b := range blocks {
		if newest-b.Meta().MaxTime >= (2 * time.Minute).Milliseconds() {
			expired = append(expired, b.Meta())
		}
	}
	if len(expired) < 3 {
		t.Fatalf("only %d of %d blocks are past the 2m retention: the test would prove nothing", len(expired), len(blocks))
	}
	onDisk := func(id ulid.ULID) bool {
		_, err := os.Stat(filepath.Join(m.TenantDir("t"), id.String()))
		return err == nil
	}
	for _, b := range expired {
		if !onDisk(b.ULID) {
			t.Fatalf("block %s past retention was deleted without the gate's consent", b.ULID)
		}
		g.mtx.Lock()
		asked := g.asked[b.ULID]
		g.mtx.Unlock()
		if !asked {
			t.Errorf("the gate was never asked about expired block %s", b.ULID)
		}
	}

	// The oldest block's upload is confirmed: the next reload deletes it, and
	// only it.
	g.allow(expired[0].ULID)
	writeMinutes(t, db, 10, 12)
	if onDisk(expired[0].ULID) {
		t.Fatalf("block %s past retention and confirmed is still on disk", expired[0].ULID)
	}
	for _, b := range expired[1:] {
		if !onDisk(b.ULID) {
			t.Fatalf("unconfirmed block %s was deleted", b.ULID)
		}
	}
	for _, b := range db.Blocks() {
		if b.Meta().ULID == expired[0].ULID {
			t.Fatal("the deleted block is still served")
		}
	}
}

// Without a gate (no shipper: the bucket is off) retention alone deletes.
func TestRetentionWithoutGate(t *testing.T) {
	m := newTestManager(t, func(c *Config) {
		c.BlockDuration = model.Duration(time.Minute)
		c.Retention = model.Duration(2 * time.Minute)
	})
	db, err := m.Get("t")
	if err != nil {
		t.Fatal(err)
	}
	writeMinutes(t, db, 0, 10)
	blocks := db.Blocks()
	if len(blocks) == 0 {
		t.Fatal("no blocks")
	}
	newest := blocks[len(blocks)-1].Meta().MaxTime
	for _, b := range blocks {
		if newest-b.Meta().MaxTime >= (2 * time.Minute).Milliseconds() {
			t.Fatalf("block %s past retention kept without a gate", b.Meta().ULID)
		}
	}
}
