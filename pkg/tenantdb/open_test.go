package tenantdb

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/tsdb"
)

func newTestManager(t *testing.T, mutate func(*Config)) *Manager {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Dir = t.TempDir()
	if mutate != nil {
		mutate(&cfg)
	}
	m, err := NewManager(cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return m
}

// slowOpen makes the open of one tenant wait until release is closed, and
// counts the opens of every tenant. The open itself is the real tsdb.Open.
type slowOpen struct {
	tenant   string
	started  chan struct{} // closed when the slow tenant's first open begins
	release  chan struct{}
	fail     atomic.Pointer[error] // if set, the slow tenant's open returns it after release
	opens    sync.Map              // tenant → *atomic.Int32
	startOne sync.Once
}

func newSlowOpen(m *Manager, tenant string) *slowOpen {
	s := &slowOpen{tenant: tenant, started: make(chan struct{}), release: make(chan struct{})}
	m.openTSDB = func(dir string, l *slog.Logger, r prometheus.Registerer, opts *tsdb.Options) (*tsdb.DB, error) {
		id := filepath.Base(dir)
		n, _ := s.opens.LoadOrStore(id, new(atomic.Int32))
		n.(*atomic.Int32).Add(1)
		if id == s.tenant {
			s.startOne.Do(func() { close(s.started) })
			<-s.release
			if err := s.fail.Load(); err != nil {
				return nil, *err
			}
		}
		return openTSDB(dir, l, r, opts)
	}
	return s
}

func (s *slowOpen) count(tenant string) int32 {
	n, ok := s.opens.Load(tenant)
	if !ok {
		return 0
	}
	return n.(*atomic.Int32).Load()
}

// within fails the test if f does not return within d. It does not wait for
// a stuck f: the test's cleanup releases it.
func within(t *testing.T, d time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s blocked for %s while another tenant's database was opening", what, d)
	}
}

// waitWaiters waits until n Gets wait for the tenant's open in flight.
func waitWaiters(t *testing.T, m *Manager, tenant string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		m.mtx.RLock()
		var got int
		if op := m.opening[tenant]; op != nil {
			got = op.waiters
		}
		m.mtx.RUnlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d Gets wait for %s's open, want %d", got, tenant, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type getResult struct {
	db  *DB
	err error
}

// getConcurrently starts n Gets of tenant and returns their results' channel.
func getConcurrently(m *Manager, tenant string, n int) <-chan getResult {
	out := make(chan getResult, n)
	for range n {
		go func() {
			db, err := m.Get(tenant)
			out <- getResult{db, err}
		}()
	}
	return out
}

// Opening one tenant's database (a WAL replay: minutes for a big head) must
// not stall the queries and writes of the other tenants, and concurrent
// first writes of the opening tenant wait for that one open and share it.
func TestGetOpensOutsideTheManagerLock(t *testing.T) {
	m := newTestManager(t, nil)
	slow := newSlowOpen(m, "tenant-a")
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(slow.release) }) }
	t.Cleanup(release) // a failed assertion must not leave an open stuck

	b, err := m.Get("tenant-b")
	if err != nil {
		t.Fatal(err)
	}
	const n = 8
	results := getConcurrently(m, "tenant-a", n)
	<-slow.started

	const prompt = 2 * time.Second
	within(t, prompt, "Get of an open tenant", func() {
		if got, err := m.Get("tenant-b"); err != nil || got != b {
			t.Errorf("Get(tenant-b) = %p, %v; want %p", got, err, b)
		}
	})
	within(t, prompt, "Existing", func() {
		if m.Existing("tenant-b") != b {
			t.Error("Existing(tenant-b) lost the open database")
		}
		if m.Existing("tenant-a") != nil {
			t.Error("Existing(tenant-a) returned a database that is still opening")
		}
	})
	within(t, prompt, "Tenants", func() {
		if got := m.Tenants(); !slices.Equal(got, []string{"tenant-b"}) {
			t.Errorf("Tenants() = %v while tenant-a opens, want [tenant-b]", got)
		}
	})
	within(t, prompt, "Get of a new tenant", func() {
		if _, err := m.Get("tenant-c"); err != nil {
			t.Errorf("Get(tenant-c): %v", err)
		}
	})

	waitWaiters(t, m, "tenant-a", n-1) // the other Gets joined the open in flight
	release()
	var first *DB
	for range n {
		r := <-results
		if r.err != nil {
			t.Fatalf("Get(tenant-a): %v", r.err)
		}
		if first == nil {
			first = r.db
		}
		if r.db != first {
			t.Fatal("concurrent Gets of tenant-a returned different databases")
		}
	}
	if c := slow.count("tenant-a"); c != 1 {
		t.Fatalf("tenant-a opened %d times by %d concurrent Gets, want once", c, n)
	}
	if got, _ := m.Get("tenant-a"); got != first {
		t.Fatal("a later Get(tenant-a) returned another database")
	}
	if got := m.Tenants(); !slices.Equal(got, []string{"tenant-a", "tenant-b", "tenant-c"}) {
		t.Fatalf("Tenants() = %v", got)
	}
}

// Gets waiting on an open that fails all get its error, and the failure is
// not remembered: the next Get opens again.
func TestGetSharesAFailedOpenAndRetries(t *testing.T) {
	m := newTestManager(t, nil)
	slow := newSlowOpen(m, "tenant-a")
	boom := errors.New("disk on fire")
	slow.fail.Store(&boom)

	const n = 4
	results := getConcurrently(m, "tenant-a", n)
	<-slow.started
	waitWaiters(t, m, "tenant-a", n-1) // every other Get has joined the open
	close(slow.release)
	for range n {
		r := <-results
		if !errors.Is(r.err, boom) || r.db != nil {
			t.Fatalf("Get during a failing open = %v, %v; want the open's error", r.db, r.err)
		}
	}
	if c := slow.count("tenant-a"); c != 1 {
		t.Fatalf("a failing open ran %d times for %d concurrent Gets, want once", c, n)
	}
	if m.Existing("tenant-a") != nil || len(m.Tenants()) != 0 {
		t.Fatal("a failed open left a database behind")
	}

	slow.fail.Store(nil)
	db, err := m.Get("tenant-a")
	if err != nil || db == nil {
		t.Fatalf("Get after the failure was gone: %v", err)
	}
	if c := slow.count("tenant-a"); c != 2 {
		t.Fatalf("opens = %d, want 2 (the failure must not be cached)", c)
	}
}

// A real tsdb.Open failure registers some of the TSDB's metrics before it
// fails; the retry must not panic on a duplicate registration.
func TestGetRetriesARealOpenFailure(t *testing.T) {
	m := newTestManager(t, nil)
	dir := m.TenantDir("tenant-a")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// A file where the WAL directory belongs: tsdb.Open fails after it has
	// registered its lock-file and compactor metrics.
	wal := filepath.Join(dir, "wal")
	if err := os.WriteFile(wal, []byte("not a directory"), 0o644); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := m.Get("tenant-a"); err == nil {
			t.Fatal("Get with a broken WAL directory succeeded")
		}
	}
	if err := os.Remove(wal); err != nil {
		t.Fatal(err)
	}
	db, err := m.Get("tenant-a")
	if err != nil {
		t.Fatalf("Get once the WAL directory was repaired: %v", err)
	}
	app := db.Appender(t.Context())
	if _, err := app.Append(0, seriesLabels(0), 1000, 1); err != nil {
		t.Fatal(err)
	}
	if err := app.Commit(); err != nil {
		t.Fatal(err)
	}
}

// Close waits for an open in flight and closes what it opened: nothing is
// left holding the tenant's directory (its lock file) after Close returns.
func TestCloseWaitsForAnOpenInFlight(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Dir = t.TempDir()
	m, err := NewManager(cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	slow := newSlowOpen(m, "tenant-a")
	results := getConcurrently(m, "tenant-a", 1)
	<-slow.started

	closed := make(chan error, 1)
	go func() { closed <- m.Close() }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while tenant-a was still opening", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(slow.release)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if r := <-results; !errors.Is(r.err, ErrClosed) {
		t.Fatalf("Get racing Close = %v, %v; want ErrClosed", r.db, r.err)
	}
	if _, err := m.Get("tenant-a"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Get after Close: %v", err)
	}
	// The database opened under Close was closed: its directory can be
	// opened again (tsdb.Open takes the lock file).
	db, err := tsdb.Open(m.TenantDir("tenant-a"), nil, nil, tsdb.DefaultOptions(), nil)
	if err != nil {
		t.Fatalf("tenant-a's directory is still held after Close: %v", err)
	}
	_ = db.Close()
}

func seriesLabels(i int) labels.Labels {
	return labels.FromStrings("__name__", "DCGM_FI_DEV_GPU_TEMP", "gpu", strconv.Itoa(i))
}
