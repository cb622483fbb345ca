package e2e

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/model"
)

// Zone-aware replication end to end (issue 41 item 2): six receivers, two
// in each of three zones, RF 3, a distributor+query process in front.

var ringZones = []string{"zone-a", "zone-b", "zone-c"}

// TestRingZoneDown: a writer remote-writes every 100 ms through the
// distributor while queries run in a loop; both receivers of one zone are
// killed (SIGKILL) at once mid-write and stay down. With zone awareness
// every series has one copy per zone, so
//   - before the kill each zone holds every series exactly once (the heads
//     of its receivers add up to the written series);
//   - every write is acknowledged the first time, while the zone's
//     receivers still look healthy in the ring (their sends fail) and after
//     their heartbeats time out (dskit leaves them out);
//   - every query answers in full meanwhile (warnings only name the killed
//     zone's receivers): reads tolerate one whole zone (dskit's
//     MaxUnavailableZones), not one receiver;
//   - afterwards, with the zone still down, the query process returns
//     exactly the acknowledged samples and counts each once.
//
// GPUSTORE_E2E_ZONE_AWARENESS=false runs the same test with the zones set
// but zone awareness off: dskit then places some series twice in the killed
// zone, and the test fails (writes refused, queries failing with 2 of 6
// receivers down). That is the control that shows the test can fail.
func TestRingZoneDown(t *testing.T) {
	zoneAware := os.Getenv("GPUSTORE_E2E_ZONE_AWARENESS") != "false"
	const n = 6
	flags := []string{fmt.Sprintf("-ring.zone-awareness-enabled=%v", zoneAware)}
	zoneOf := map[string]string{}
	for i := range n {
		id := fmt.Sprintf("r%d", i)
		zoneOf[id] = ringZones[i*len(ringZones)/n]
		flags = append(flags, id+":-ring.instance-zone="+zoneOf[id])
	}
	began := time.Now()
	c := startRingWith(t, n, flags...)
	t.Logf("%d receivers in %v (zone awareness %v), RF %d: started in %s", n, ringZones, zoneAware, ringRF, time.Since(began).Round(time.Millisecond))

	w := &ringWriter{t: t, url: c.front.url(), series: gpuSeries(), client: http.Client{Timeout: 30 * time.Second}}
	start := time.Now().UnixMilli()/100*100 + 100
	load := startRingLoad(t, w, 100*time.Millisecond)
	ql := startRingQueryLoop(t, c.front.url(), w, start, 30*time.Second)

	// One copy of each series per zone, by the receivers' own heads (an
	// error, not fatal: the control goes on to the kill).
	perZone := map[string]float64{}
	waitFor(t, 10*time.Second, fmt.Sprintf("%d copies of each series in the receivers' heads", ringRF), func() error {
		clear(perZone)
		var total float64
		for _, r := range c.receivers {
			v, err := ringMetric(r.url(), "gpustore_tsdb_head_series", map[string]string{"tenant": "default"})
			if err != nil {
				return err
			}
			perZone[zoneOf[r.id]] += v
			total += v
		}
		if total != float64(ringRF*len(w.series)) {
			return fmt.Errorf("%v series in the heads, want %d", total, ringRF*len(w.series))
		}
		return nil
	})
	for _, z := range ringZones {
		if perZone[z] != float64(len(w.series)) {
			t.Errorf("head series per zone %v, want each of the %d series once in every zone", perZone, len(w.series))
			break
		}
	}

	// The last zone's receivers, killed together mid-write.
	time.Sleep(2 * time.Second)
	var victims []*ringProc
	for _, r := range c.receivers {
		if zoneOf[r.id] == ringZones[len(ringZones)-1] {
			victims = append(victims, r)
		}
	}
	var wg sync.WaitGroup
	for _, r := range victims {
		wg.Go(r.kill)
	}
	wg.Wait()
	killedAt := time.Now()
	t.Logf("killed %s (%s) at %s", victims[0].id+", "+victims[1].id, ringZones[len(ringZones)-1], killedAt.Format(time.TimeOnly))

	// Writes and queries go on while the ring still counts the zone
	// healthy, and after its heartbeats time out.
	waitFor(t, ringHeartbeatTimeout+10*time.Second, "the killed zone UNHEALTHY in the ring", func() error {
		st, err := ringStates(c.front.url())
		if err != nil {
			return err
		}
		for _, r := range victims {
			if st[r.id] != "UNHEALTHY" {
				return fmt.Errorf("ring: %v", st)
			}
		}
		return nil
	})
	t.Logf("zone UNHEALTHY in the ring %s after the kill", time.Since(killedAt).Round(time.Millisecond))
	if zoneAware {
		// What an operator's alert on zones reads (docs/scale-out.md).
		dead := ringZones[len(ringZones)-1]
		waitFor(t, 5*time.Second, "the dead zone's receivers counted Unhealthy", func() error {
			v, err := ringMetric(c.front.url(), "ring_zone_members", map[string]string{"name": "receiver", "zone": dead, "state": "Unhealthy"})
			if err != nil || v != 2 {
				return fmt.Errorf(`ring_zone_members{name="receiver",zone=%q,state="Unhealthy"} = %v (%v), want 2`, dead, v, err)
			}
			return nil
		})
	}
	time.Sleep(2 * time.Second)
	ql.finish()
	load.finish()
	end := w.lastSent()
	load.report()
	ql.report()
	if f := w.failures(); len(f) > 0 {
		t.Errorf("%d writes refused with one zone of %d down (RF %d: a quorum is always in the other zones), e.g. %s", len(f), len(ringZones), ringRF, f[0])
	}
	for id := range ql.warnings {
		if zoneOf[id] != ringZones[len(ringZones)-1] {
			t.Errorf("a query warned that %s (%s) was unavailable: only the killed zone's receivers were down", id, zoneOf[id])
		}
	}

	// With the zone still down: exactly what was acknowledged, each sample
	// once (three copies were written, two read).
	v, ws, err := ringQuery(c.front.url(), ringRawExpr(start, end), time.UnixMilli(end))
	if err != nil {
		t.Fatalf("query with %s down: %v", ringZones[len(ringZones)-1], err)
	}
	for _, wn := range ws {
		if !strings.Contains(wn, victims[0].id) && !strings.Contains(wn, victims[1].id) {
			t.Errorf("query with the zone down: warning %q", wn)
		}
	}
	if d := w.exactDiff(v.(model.Matrix), start, end); d != "" {
		t.Errorf("with %s down the query process does not return exactly the acknowledged samples: %s", ringZones[len(ringZones)-1], d)
	}
	w.checkCount(c.front.url(), start, end)
	t.Logf("whole test %s", time.Since(began).Round(time.Millisecond))
}
