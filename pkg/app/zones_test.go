package app

import (
	"flag"
	"strings"
	"testing"
)

// TestZoneAwarenessNeedsReceiverZones: with -ring.zone-awareness-enabled a
// receiver (ingest, all) refuses to start without -ring.instance-zone, and
// says which setting is missing; a distributor or querier needs no zone.
func TestZoneAwarenessNeedsReceiverZones(t *testing.T) {
	load := func(args ...string) error {
		_, _, err := Load(flag.NewFlagSet("gpustore", flag.ContinueOnError),
			append([]string{"-storage.tsdb.path=" + t.TempDir(), "-ring.enabled", "-ring.zone-awareness-enabled"}, args...))
		return err
	}
	for _, target := range []string{"ingest", "all", "ingest,rules"} {
		if err := load("-target=" + target); err == nil || !strings.Contains(err.Error(), "ring.instance_zone") {
			t.Errorf("-target=%s with zone awareness and no zone: %v, want an error naming ring.instance_zone", target, err)
		}
		if err := load("-target="+target, "-ring.instance-zone=zone-a"); err != nil {
			t.Errorf("-target=%s in zone-a: %v", target, err)
		}
	}
	for _, target := range []string{"distributor", "query", "distributor,query", "rules"} {
		if err := load("-target=" + target); err != nil {
			t.Errorf("-target=%s with zone awareness: %v (only receivers have a zone)", target, err)
		}
	}
}
