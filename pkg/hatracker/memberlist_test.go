package hatracker

import (
	"context"
	"flag"
	"fmt"
	"testing"
	"time"

	"github.com/grafana/dskit/dns"
	"github.com/grafana/dskit/kv"
	"github.com/grafana/dskit/kv/memberlist"
	"github.com/grafana/dskit/services"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpustore/gpustore/internal/logging"
)

// startMemberlist starts a gossip KV on loopback that joins the given ports.
func startMemberlist(t *testing.T, name string, join ...int) *memberlist.KV {
	t.Helper()
	var cfg memberlist.KVConfig
	cfg.RegisterFlags(flag.NewFlagSet("", flag.ContinueOnError))
	cfg.NodeName = name
	cfg.TCPTransport.BindAddrs = []string{"127.0.0.1"}
	cfg.TCPTransport.BindPort = 0
	cfg.GossipInterval = 50 * time.Millisecond
	cfg.PushPullInterval = 200 * time.Millisecond
	cfg.Codecs = append(cfg.Codecs, Codec())
	for _, p := range join {
		cfg.JoinMembers = append(cfg.JoinMembers, fmt.Sprintf("127.0.0.1:%d", p))
	}
	logger := logging.GoKit(discard())
	reg := prometheus.NewRegistry()
	svc := memberlist.NewKVInitService(&cfg, logger, dns.NewProvider(dns.GolangResolverType, 0, logger, reg), reg)
	if err := services.StartAndAwaitRunning(context.Background(), svc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = services.StopAndAwaitTerminated(context.Background(), svc) })
	m, err := svc.GetMemberlistKV()
	if err != nil {
		t.Fatal(err)
	}
	if err := m.AwaitRunning(context.Background()); err != nil {
		t.Fatal(err)
	}
	return m
}

// Two receivers gossiping over memberlist on loopback agree on the elected
// replica: an election on one is seen by the other, which then drops the
// other replica's writes.
func TestMemberlistReceiversAgree(t *testing.T) {
	clock := newClock()
	kv1 := startMemberlist(t, "receiver-1")
	kv2 := startMemberlist(t, "receiver-2", kv1.GetListeningPort())
	cfg := testConfig()
	cfg.KVStore = "memberlist"
	newOn := func(m *memberlist.KV) *Tracker {
		tr, err := New(cfg, kv.StoreConfig{MemberlistKV: func() (*memberlist.KV, error) { return m, nil }}, discard(), prometheus.NewRegistry(), WithClock(clock.now))
		if err != nil {
			t.Fatal(err)
		}
		if err := services.StartAndAwaitRunning(context.Background(), tr); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = services.StopAndAwaitTerminated(context.Background(), tr) })
		return tr
	}
	a, b := newOn(kv1), newOn(kv2)

	mustAccept(t, a, "t", "gpu-a", "p0", true)
	// b learns a's election by gossip, without writing anything itself...
	deadline := time.Now().Add(10 * time.Second)
	for {
		if st := b.Statuses(); len(st) == 1 && st[0].Replica == "p0" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("receiver b never learned that p0 is elected")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// ... and then drops the other replica's writes and keeps p0's.
	mustAccept(t, b, "t", "gpu-a", "p1", false)
	mustAccept(t, b, "t", "gpu-a", "p0", true)

	// A failover decided on b reaches a.
	clock.advance(31 * time.Second)
	mustAccept(t, b, "t", "gpu-a", "p1", true)
	for {
		if st := a.Statuses(); len(st) == 1 && st[0].Replica == "p1" {
			break
		}
		if time.Now().After(deadline.Add(10 * time.Second)) {
			t.Fatal("receiver a never learned of the failover")
		}
		time.Sleep(20 * time.Millisecond)
	}
	mustAccept(t, a, "t", "gpu-a", "p0", false)
}

// TestMergeConcurrentElections: two processes that elected different
// replicas before gossip carried either choice converge on the first
// election whichever view merges into which (the replica already taking
// writes keeps the cluster); a failover (next term) wins over the election
// it replaced even though the latter was first.
func TestMergeConcurrentElections(t *testing.T) {
	first := ReplicaDesc{Replica: "p1", ElectedAt: 1000, ReceivedAt: 1500, Term: 1}
	second := ReplicaDesc{Replica: "p0", ElectedAt: 1015, ReceivedAt: 1600, Term: 1}
	failover := ReplicaDesc{Replica: "p0", ElectedAt: 40000, ReceivedAt: 40000, Term: 2}
	merge := func(a, b ReplicaDesc) string {
		if _, err := a.Merge(&b, false); err != nil {
			t.Fatal(err)
		}
		return a.Replica
	}
	if got := merge(first, second); got != "p1" {
		t.Errorf("first's view merging second's: %s, want p1 (elected first)", got)
	}
	if got := merge(second, first); got != "p1" {
		t.Errorf("second's view merging first's: %s, want p1 (elected first)", got)
	}
	if got := merge(first, failover); got != "p0" {
		t.Errorf("a failover merged into the election it replaced: %s, want p0", got)
	}
	if got := merge(failover, first); got != "p0" {
		t.Errorf("the replaced election merged into a failover: %s, want p0", got)
	}
}
