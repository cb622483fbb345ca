package hatracker

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grafana/dskit/kv/consul"
	"github.com/grafana/dskit/services"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/model"

	"github.com/gpustore/gpustore/internal/logging"
)

type fakeClock struct{ ms atomic.Int64 }

func (c *fakeClock) now() time.Time          { return time.UnixMilli(c.ms.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.ms.Add(d.Milliseconds()) }
func newClock() *fakeClock                   { c := &fakeClock{}; c.ms.Store(1_700_000_000_000); return c }
func discard() *slog.Logger                  { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
func testConfig() Config {
	return Config{Enabled: true, FailoverTimeout: model.Duration(30 * time.Second), UpdateTimeout: model.Duration(5 * time.Second), KVStore: "inmemory"}
}

func newTestTracker(t *testing.T, clock *fakeClock) (*Tracker, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	client, _ := consul.NewInMemoryClient(replicaCodec{}, logging.GoKit(discard()), nil)
	tr := newTracker(testConfig(), client, discard(), reg)
	tr.now = clock.now
	return tr, reg
}

func mustAccept(t *testing.T, tr *Tracker, tenant, cluster, replica string, want bool) {
	t.Helper()
	got, err := tr.Accept(context.Background(), tenant, cluster, replica)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("Accept(%s, %s, %s) = %v, want %v", tenant, cluster, replica, got, want)
	}
}

func TestElectionAndFailover(t *testing.T) {
	clock := newClock()
	tr, reg := newTestTracker(t, clock)

	mustAccept(t, tr, "t", "gpu-a", "p0", true)  // first writer is elected
	mustAccept(t, tr, "t", "gpu-a", "p1", false) // the other is dropped
	for i := 0; i < 10; i++ {                    // p0 keeps writing every 15 s: p1 never takes over
		clock.advance(15 * time.Second)
		mustAccept(t, tr, "t", "gpu-a", "p0", true)
		mustAccept(t, tr, "t", "gpu-a", "p1", false)
	}
	// p0 goes silent: p1 is still dropped until the failover timeout has passed.
	clock.advance(29 * time.Second)
	mustAccept(t, tr, "t", "gpu-a", "p1", false)
	clock.advance(1 * time.Second)
	mustAccept(t, tr, "t", "gpu-a", "p1", true)
	// p0 returns: now it is the one dropped.
	mustAccept(t, tr, "t", "gpu-a", "p0", false)
	clock.advance(10 * time.Second)
	mustAccept(t, tr, "t", "gpu-a", "p1", true)
	mustAccept(t, tr, "t", "gpu-a", "p0", false)

	if got := testutil.ToFloat64(tr.changes.WithLabelValues("t", "gpu-a")); got != 2 {
		t.Fatalf("elections %v, want 2", got)
	}
	if n, err := testutil.GatherAndCount(reg, "gpustore_ha_elected_replica"); err != nil || n != 1 {
		t.Fatalf("elected replica series %d %v, want 1 (the old one is deleted)", n, err)
	}
	if got := testutil.ToFloat64(tr.elected.WithLabelValues("t", "gpu-a", "p1")); got != 1 {
		t.Fatal("p1 not exported as elected")
	}
	st := tr.Statuses()
	if len(st) != 1 || st[0].Replica != "p1" || st[0].Cluster != "gpu-a" {
		t.Fatalf("statuses %+v", st)
	}
}

func TestClustersAndTenantsAreIndependent(t *testing.T) {
	clock := newClock()
	tr, _ := newTestTracker(t, clock)
	mustAccept(t, tr, "t1", "gpu-a", "p0", true)
	mustAccept(t, tr, "t1", "gpu-b", "p1", true)
	mustAccept(t, tr, "t2", "gpu-a", "p1", true)
	mustAccept(t, tr, "t1", "gpu-a", "p1", false)
	mustAccept(t, tr, "t1", "gpu-b", "p0", false)
	mustAccept(t, tr, "t2", "gpu-a", "p0", false)
	// A cluster that stops writing does not disturb others; a new cluster appears.
	clock.advance(time.Minute)
	mustAccept(t, tr, "t1", "gpu-c", "r2", true)
	mustAccept(t, tr, "t1", "gpu-b", "p0", true) // gpu-b's p1 went silent: p0 takes over
}

// Writes from both replicas at once, from many goroutines: exactly one
// replica is ever accepted while the elected one keeps writing.
func TestConcurrentReplicas(t *testing.T) {
	clock := newClock()
	tr, _ := newTestTracker(t, clock)
	var accepted [2]atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			replica := []string{"p0", "p1"}[g%2]
			for i := 0; i < 500; i++ {
				ok, err := tr.Accept(context.Background(), "t", "gpu-a", replica)
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					accepted[g%2].Add(1)
				}
			}
		}(g)
	}
	wg.Wait()
	if (accepted[0].Load() == 0) == (accepted[1].Load() == 0) {
		t.Fatalf("accepted p0=%d p1=%d: want exactly one replica", accepted[0].Load(), accepted[1].Load())
	}
}

// Two receivers sharing one KV store agree on the elected replica, and the
// second learns the first's election through the store.
func TestTwoReceiversShareTheElection(t *testing.T) {
	clock := newClock()
	client, _ := consul.NewInMemoryClient(replicaCodec{}, logging.GoKit(discard()), nil)
	a := newTracker(testConfig(), client, discard(), prometheus.NewRegistry())
	b := newTracker(testConfig(), client, discard(), prometheus.NewRegistry())
	a.now, b.now = clock.now, clock.now
	for _, tr := range []*Tracker{a, b} {
		if err := services.StartAndAwaitRunning(context.Background(), tr); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = services.StopAndAwaitTerminated(context.Background(), tr) })
	}
	mustAccept(t, a, "t", "gpu-a", "p0", true)
	mustAccept(t, b, "t", "gpu-a", "p1", false) // b sees a's election in the store
	mustAccept(t, b, "t", "gpu-a", "p0", true)
	clock.advance(31 * time.Second)
	mustAccept(t, b, "t", "gpu-a", "p1", true) // failover decided by b ...
	deadline := time.Now().Add(5 * time.Second)
	for { // ... reaches a through the watch
		ok, _ := a.Accept(context.Background(), "t", "gpu-a", "p0")
		if !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("receiver a never learned of the failover")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A receiver that never sees the elected replica's writes (the two replicas
// of a pair write to different distributors) knows them only as recorded in
// the shared store, once per update timeout: it must not take the replica
// for silent while a write may be unrecorded, or the other replica fills a
// gap there is not (and its samples are stored besides the elected one's).
func TestSilenceOfWritesSeenElsewhere(t *testing.T) {
	clock := newClock()
	cfg := testConfig() // failover 30 s, update 5 s
	cfg.KVStore = "memberlist"
	cfg.GapFillAfter = model.Duration(10 * time.Second)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	client, _ := consul.NewInMemoryClient(replicaCodec{}, logging.GoKit(discard()), nil)
	a := newTracker(cfg, client, discard(), prometheus.NewRegistry())
	b := newTracker(cfg, client, discard(), prometheus.NewRegistry())
	a.now, b.now = clock.now, clock.now
	for _, tr := range []*Tracker{a, b} {
		if err := services.StartAndAwaitRunning(context.Background(), tr); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = services.StopAndAwaitTerminated(context.Background(), tr) })
	}
	mustAccept(t, a, "t", "gpu-a", "p0", true) // recorded in the store now
	deadline := time.Now().Add(5 * time.Second)
	for len(b.Statuses()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("b never saw the election")
		}
		time.Sleep(10 * time.Millisecond)
	}
	clock.advance(4 * time.Second)
	mustAccept(t, a, "t", "gpu-a", "p0", true) // within the update timeout: not recorded
	clock.advance(7 * time.Second)
	// 11 s since the record, but p0 may have written until 5 s after it
	// unrecorded: b, which never saw p0's writes, and a alike (another
	// receiver might have taken some of them).
	for name, tr := range map[string]*Tracker{"a": a, "b": b} {
		if got := tr.Silence("t", "gpu-a"); got != 6*time.Second {
			t.Errorf("%s: silence %s 11 s after the store recorded p0, want 6 s", name, got)
		}
	}
	clock.advance(5 * time.Second)
	if got := b.Silence("t", "gpu-a"); got < time.Duration(cfg.GapFillAfter) {
		t.Errorf("16 s after the record, b's silence %s is still below the gap-fill delay", got)
	}

	// One process (in-memory store) sees every write: its silence is exact.
	one, _ := newTestTracker(t, clock)
	mustAccept(t, one, "t", "gpu-a", "p0", true)
	clock.advance(10 * time.Second)
	if got := one.Silence("t", "gpu-a"); got != 10*time.Second {
		t.Errorf("in-memory store: silence %s, want 10 s", got)
	}
}

func TestMergeConverges(t *testing.T) {
	x := &ReplicaDesc{Replica: "p0", ElectedAt: 10, ReceivedAt: 50}
	y := &ReplicaDesc{Replica: "p1", ElectedAt: 40, ReceivedAt: 40}
	x2, y2 := x.Clone().(*ReplicaDesc), y.Clone().(*ReplicaDesc)
	if _, err := x2.Merge(y, false); err != nil {
		t.Fatal(err)
	}
	if _, err := y2.Merge(x, false); err != nil {
		t.Fatal(err)
	}
	if *x2 != *y2 || x2.Replica != "p1" {
		t.Fatalf("merge does not converge: %+v vs %+v", x2, y2)
	}
}

func TestConfigValidate(t *testing.T) {
	c := testConfig()
	c.UpdateTimeout = c.FailoverTimeout
	if c.Validate() == nil {
		t.Fatal("update timeout equal to failover timeout accepted")
	}
	c = testConfig()
	c.KVStore = "memberlist"
	c.GapFillAfter = model.Duration(25 * time.Second) // + 5 s update = failover
	if c.Validate() == nil {
		t.Fatal("shared store: gap fill that cannot start before the failover accepted")
	}
	c.KVStore = "inmemory"
	if err := c.Validate(); err != nil {
		t.Fatalf("in-memory store, gap fill 25 s of 30: %v", err)
	}
}
