package gpusim

import (
	"math"
	"sort"
	"strings"
	"testing"
	"time"
)

// t0 is a fixed instant well after the default epoch.
var t0 = time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)

func newTestCluster(t testing.TB, cfg Config) *Cluster {
	t.Helper()
	if cfg.XidsPerGPUYear == 0 {
		cfg.XidsPerGPUYear = -1 // tests that want background Xids say so
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return c
}

// key renders a label set canonically (labels are sorted already).
func key(ls []Label) string {
	var b strings.Builder
	for _, l := range ls {
		b.WriteString(l.Name)
		b.WriteByte('=')
		b.WriteString(l.Value)
		b.WriteByte(',')
	}
	return b.String()
}

// find returns the series named name whose labels include every pair in kv.
func find(series []Series, name string, kv ...string) []Series {
	var out []Series
next:
	for _, s := range series {
		if s.Name() != name {
			continue
		}
		for i := 0; i+1 < len(kv); i += 2 {
			if s.Get(kv[i]) != kv[i+1] {
				continue next
			}
		}
		out = append(out, s)
	}
	return out
}

// value returns the single value of a selector, failing when it is not unique.
func value(t testing.TB, c *Cluster, at time.Time, name string, kv ...string) float64 {
	t.Helper()
	got := find(c.AppendSamples(nil, at, Replica{}), name, kv...)
	if len(got) != 1 {
		t.Fatalf("%s%v at %s: %d series, want 1", name, kv, at.Format(time.TimeOnly), len(got))
	}
	return got[0].V
}

func present(c *Cluster, at time.Time, name string, kv ...string) bool {
	return len(find(c.AppendSamples(nil, at, Replica{}), name, kv...)) > 0
}

// busyNode finds a node whose job runs through [from, to] and returns the
// node index and the job's slot.
func busyNode(t testing.TB, c *Cluster, from, to time.Time) (int, jobSlot) {
	t.Helper()
	a, b := c.secs(from), c.secs(to)
	for n := range c.nodes {
		g := &c.groups[n/groupSize]
		if g.window(a) != g.window(b) {
			continue
		}
		j := c.slotOf(n, g.window(a))
		if j.running(a) && j.running(b) {
			return n, j
		}
	}
	t.Fatalf("no node runs one job through %s..%s", from, to)
	return 0, jobSlot{}
}

func sameValue(a, b float64) bool {
	return a == b || (math.IsNaN(a) && math.IsNaN(b))
}

func sortedNames(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
