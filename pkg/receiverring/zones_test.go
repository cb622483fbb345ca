package receiverring

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/grafana/dskit/ring"
	"github.com/grafana/dskit/services"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// TestZonePlacement: six receivers registered by this package's own
// lifecycler, two in each of three zones, RF 3. With zone awareness every
// series' write replica set is one receiver in each zone (so a zone lost
// takes one copy of each series, never a quorum), and a read tolerates one
// whole zone failing (dskit's MaxUnavailableZones), not one receiver. The
// same ring read without zone awareness puts two copies of some series in
// one zone: what a zone's loss turns into lost quorums.
func TestZonePlacement(t *testing.T) {
	ctx := context.Background()
	cfg := DefaultConfig()
	cfg.Enabled, cfg.KVStore, cfg.ReplicationFactor, cfg.ZoneAwarenessEnabled = true, "inmemory", 3, true
	cfg.HeartbeatPeriod = model.Duration(time.Second)
	zoneOf := map[string]string{}
	var zoneC []*ring.BasicLifecycler
	for i, zone := range []string{"zone-a", "zone-a", "zone-b", "zone-b", "zone-c", "zone-c"} {
		c := cfg
		c.InstanceZone = zone
		c.InstanceID = fmt.Sprintf("r%d", i)
		c.InstanceAddr = fmt.Sprintf("127.0.0.1:%d", 10000+i)
		if err := c.ValidateReceiver(); err != nil {
			t.Fatal(err)
		}
		l, err := c.NewLifecycler(Receivers, c.InstanceAddr, nil, quiet, prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		if err := services.StartAndAwaitRunning(ctx, l); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = services.StopAndAwaitTerminated(ctx, l) })
		zoneOf[c.InstanceID] = zone
		if zone == "zone-c" {
			zoneC = append(zoneC, l)
		}
	}
	client := func(zoneAware bool) *ring.Ring {
		c := cfg
		c.ZoneAwarenessEnabled = zoneAware
		r, err := c.NewClient(Receivers, nil, quiet, prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		if err := services.StartAndAwaitRunning(ctx, r); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = services.StopAndAwaitTerminated(ctx, r) })
		deadline := time.Now().Add(10 * time.Second)
		for r.InstancesWithTokensCount() != len(zoneOf) {
			if time.Now().After(deadline) {
				t.Fatalf("the ring lists %d receivers with tokens, want %d", r.InstancesWithTokensCount(), len(zoneOf))
			}
			time.Sleep(10 * time.Millisecond)
		}
		return r
	}
	zoned, plain := client(true), client(false)
	if n := zoned.ZonesCount(); n != 3 {
		t.Fatalf("the ring has %d zones, want 3", n)
	}

	// The keys distributors shard by: random 32-bit hashes.
	rnd := rand.New(rand.NewPCG(1, 2))
	const keys = 20_000
	var sameZone int
	for range keys {
		key := rnd.Uint32()
		rs, err := zoned.Get(key, ring.Write, nil, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, inst := range rs.Instances {
			if inst.Zone != zoneOf[inst.Id] {
				t.Fatalf("%s registered in zone %q, want %q", inst.Id, inst.Zone, zoneOf[inst.Id])
			}
			seen[inst.Zone] = true
		}
		if len(rs.Instances) != 3 || len(seen) != 3 {
			t.Fatalf("key %d: replicas %v in zones %v, want one in each of the 3 zones", key, ids(rs.Instances), seen)
		}
		if rs.MaxErrors != 1 {
			t.Fatalf("key %d: a write tolerates %d failed replicas, want 1 (quorum 2 of 3)", key, rs.MaxErrors)
		}

		rs, err = plain.Get(key, ring.Write, nil, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		seen = map[string]bool{}
		for _, inst := range rs.Instances {
			seen[inst.Zone] = true
		}
		if len(seen) < 3 {
			sameZone++
		}
	}
	t.Logf("without zone awareness %d of %d keys had two replicas in one zone", sameZone, keys)
	if sameZone == 0 {
		t.Errorf("without zone awareness no key had two replicas in one zone: the contrast this test relies on is gone")
	}

	// Reads: the whole ring, and one zone may fail whole.
	rs, err := zoned.GetReplicationSetForOperation(ring.Read)
	if err != nil {
		t.Fatal(err)
	}
	if !rs.ZoneAwarenessEnabled || rs.MaxUnavailableZones != 1 || rs.MaxErrors != 0 || len(rs.Instances) != 6 {
		t.Errorf("read set: zone-aware %v, %d unavailable zones, %d errors, %d receivers; want zone-aware, 1 zone, 0 errors (zones, not receivers, are counted), 6",
			rs.ZoneAwarenessEnabled, rs.MaxUnavailableZones, rs.MaxErrors, len(rs.Instances))
	}
	if rs, err := plain.GetReplicationSetForOperation(ring.Read); err != nil || rs.ZoneAwarenessEnabled || rs.MaxErrors != 1 {
		t.Errorf("read set without zone awareness: %+v, %v; want 1 receiver tolerated", rs, err)
	}

	// Fewer zones than RF (dskit's rule: RF <= zones): zone-c's receivers
	// leave. A series then has one copy in each of the two zones left,
	// both needed for a write quorum (2 of RF 3): a zone down refuses
	// writes. Reads may miss a zone (every acknowledged sample is in both).
	for _, l := range zoneC {
		if err := services.StopAndAwaitTerminated(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for zoned.ZonesCount() != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d zones after zone-c left, want 2", zoned.ZonesCount())
		}
		time.Sleep(10 * time.Millisecond)
	}
	for range 1000 {
		rs, err := zoned.Get(rnd.Uint32(), ring.Write, nil, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(rs.Instances) != 2 || rs.Instances[0].Zone == rs.Instances[1].Zone || rs.MaxErrors != 0 {
			t.Fatalf("two zones, RF 3: replicas %v tolerating %d errors, want one per zone and none", ids(rs.Instances), rs.MaxErrors)
		}
	}
	if rs, err := zoned.GetReplicationSetForOperation(ring.Read); err != nil || rs.MaxUnavailableZones != 1 || len(rs.Instances) != 4 {
		t.Errorf("two zones, RF 3: read set %v with %d unavailable zones (%v), want 4 receivers, 1 zone", ids(rs.Instances), rs.MaxUnavailableZones, err)
	}
}

func ids(insts []ring.InstanceDesc) []string {
	var out []string
	for _, i := range insts {
		out = append(out, i.Id+"@"+i.Zone)
	}
	return out
}

// TestZoneConfig: zone awareness needs every receiver's zone (dskit would
// place a receiver without one in any zone), and processes that are not
// receivers need none; only the receivers' ring is zone-aware.
func TestZoneConfig(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Enabled, cfg.ZoneAwarenessEnabled = true, true
	if err := cfg.Validate(); err != nil {
		t.Fatalf("zone awareness on a process without a zone (a distributor, a querier): %v", err)
	}
	err := cfg.ValidateReceiver()
	if err == nil || !strings.Contains(err.Error(), "ring.instance_zone") {
		t.Errorf("a receiver with zone awareness and no zone: %v, want an error naming ring.instance_zone", err)
	}
	cfg.InstanceZone = "eu-west-1a"
	if err := cfg.ValidateReceiver(); err != nil {
		t.Error(err)
	}
}

// TestReplicaLimitsByZone: with zone awareness each zone holds one copy of
// every series, so a receiver's share of max_active_series is 1 over the
// receivers of its zone, however many zones there are.
func TestReplicaLimitsByZone(t *testing.T) {
	cfg := DefaultConfig()
	cfg.ZoneAwarenessEnabled = true
	for _, c := range []struct{ limit, inZone, want int }{
		{900, 0, 900}, {900, 1, 900}, {900, 2, 450}, {900, 4, 225}, {10, 3, 4},
	} {
		if got := cfg.ReplicaLimits(fixedLimits{series: c.limit}, func(string) int { return c.inZone }).MaxActiveSeries("t"); got != c.want {
			t.Errorf("limit %d, %d receivers in the zone: %d per receiver, want %d", c.limit, c.inZone, got, c.want)
		}
	}
}
