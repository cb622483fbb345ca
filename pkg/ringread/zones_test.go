package ringread

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/grafana/dskit/kv/consul"
	"github.com/grafana/dskit/ring"
	"github.com/grafana/dskit/services"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpustore/gpustore/internal/logging"
	"github.com/gpustore/gpustore/pkg/query"
	"github.com/gpustore/gpustore/pkg/tenancy"
)

// TestReadsTolerateAZone: six receivers, two in each of three zones, hold
// their series as zone-aware distributors leave them: one copy per zone on
// one of the zone's receivers, and some series on only two zones (a write
// acknowledged at quorum). With both receivers of a zone down, a read over
// the zone-aware ring answers every sample (dskit's MaxUnavailableZones: a
// whole zone may fail), warning only about that zone's receivers; a second
// zone failing fails the read, naming the zones rule. The same ring read
// by instance count (zone awareness off) fails with the zone down: 2
// receivers of 6 is more than the 1 it tolerates.
func TestReadsTolerateAZone(t *testing.T) {
	ctx := context.Background()
	zones := []string{"zone-a", "zone-a", "zone-b", "zone-b", "zone-c", "zone-c"}
	var rs []*receiver
	for i := range zones {
		rs = append(rs, newReceiver(t, fmt.Sprintf("r%d", i), tenancy.DefaultConfig()))
	}
	value := func(g int) func(int) float64 { return func(i int) float64 { return float64(100*g + i) } }
	wantSeries := map[string]func(int) (float64, bool){}
	for g := range 6 {
		series := fmt.Sprintf(`gpu_util{gpu="%d"}`, g)
		// One receiver per zone; series 4 missed zone-b, series 5 zone-a.
		for z := range 3 {
			if g == 4 && z == 1 || g == 5 && z == 0 {
				continue
			}
			rs[2*z+(g+z)%2].write(t, "team-a", series, steps(0, nSteps-1), value(g))
		}
		wantSeries[series] = func(i int) (float64, bool) { return value(g)(i), true }
	}
	want := want(wantSeries)

	kit := logging.GoKit(quiet)
	store, closer := consul.NewInMemoryClient(ring.GetCodec(), kit, prometheus.NewRegistry())
	t.Cleanup(func() { _ = closer.Close() })
	for i, r := range rs {
		err := store.CAS(ctx, "receiver", func(in any) (any, bool, error) {
			d, _ := in.(*ring.Desc)
			if d == nil {
				d = ring.NewDesc()
			}
			d.AddIngester(r.id, r.addr(), zones[i], []uint32{uint32(i)*1_000_000 + 1}, ring.ACTIVE, time.Now(), false, time.Time{}, nil)
			return d, true, nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	source := func(zoneAware bool) *Source {
		cfg := ring.Config{HeartbeatTimeout: time.Hour, ReplicationFactor: 3, ZoneAwarenessEnabled: zoneAware}
		rg, err := ring.NewWithStoreClientAndStrategy(cfg, "receiver", "receiver", store, ring.NewDefaultReplicationStrategy(), prometheus.NewRegistry(), kit)
		if err != nil {
			t.Fatal(err)
		}
		if err := services.StartAndAwaitRunning(ctx, rg); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = services.StopAndAwaitTerminated(ctx, rg) })
		waitRing(t, rg, len(rs))
		src, _ := newSource(t, rg, "")
		return src
	}
	zoned, counted := source(true), source(false)

	got, ws, err := dump(ctx, zoned, "team-a", all)
	if err != nil || got != want || len(ws) > 0 {
		t.Fatalf("every receiver up: %v, warnings %v:\n%s\nwant:\n%s", err, ws, got, want)
	}

	// zone-c down, its receivers still healthy in the ring (their
	// heartbeats not yet timed out): asked, they fail, and the zones read
	// instead answer everything.
	rs[4].srv.Close()
	rs[5].srv.Close()
	warned := 0
	for range 10 {
		got, ws, err := dump(ctx, zoned, "team-a", all)
		if err != nil {
			t.Fatalf("zone-c down: %v", err)
		}
		if got != want {
			t.Fatalf("zone-c down:\n%s\nwant:\n%s", got, want)
		}
		for _, w := range ws.AsErrors() {
			warned++
			if !strings.Contains(w.Error(), "receiver r4 (") && !strings.Contains(w.Error(), "receiver r5 (") {
				t.Errorf("zone-c down: warning %v names a receiver that answered", w)
			}
		}
	}
	t.Logf("zone-c down: %d warnings over 10 reads", warned)
	if _, _, err := dump(ctx, counted, "team-a", all); err == nil || !strings.Contains(err.Error(), "at most 1 may") {
		t.Errorf("zone-c down, read by instance count: %v, want the read refused (2 receivers failed, 1 tolerated)", err)
	}

	// A receiver of zone-b too: two zones failing, more than RF 3 allows.
	rs[2].srv.Close()
	_, _, err = dump(ctx, zoned, "team-a", all)
	if err == nil || !strings.Contains(err.Error(), "in more zones than the 1 that may") || !errors.Is(err, query.ErrUnavailable) {
		t.Errorf("zone-c and r2 of zone-b down: %v, want a 503 saying more zones failed than the 1 that may", err)
	}
}
