package load

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"time"
)

// Percentile returns the p-th percentile (0 < p ≤ 100) of sorted by the
// nearest-rank method: the smallest value with at least p% of the values at
// or below it. It returns 0 for no values.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

// Latencies collects durations; safe for concurrent use.
type Latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

// Add records one duration.
func (l *Latencies) Add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

// Summary sorts a copy of what was recorded and returns its percentiles.
func (l *Latencies) Summary() LatencySummary {
	l.mu.Lock()
	d := append([]time.Duration(nil), l.d...)
	l.mu.Unlock()
	return Summarize(d)
}

// LatencySummary is the distribution of a set of durations.
type LatencySummary struct {
	N                       int
	P50, P90, P99, Max, Avg time.Duration
}

// Summarize sorts d in place and summarises it.
func Summarize(d []time.Duration) LatencySummary {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	s := LatencySummary{N: len(d), P50: Percentile(d, 50), P90: Percentile(d, 90), P99: Percentile(d, 99)}
	if len(d) > 0 {
		s.Max = d[len(d)-1]
		var sum time.Duration
		for _, x := range d {
			sum += x
		}
		s.Avg = sum / time.Duration(len(d))
	}
	return s
}

func (s LatencySummary) String() string {
	return fmt.Sprintf("p50=%s p90=%s p99=%s max=%s (n=%d)", FmtDuration(s.P50), FmtDuration(s.P90), FmtDuration(s.P99), FmtDuration(s.Max), s.N)
}

// Codes counts answers by HTTP status; 0 stands for a request that got no
// answer (connection refused, reset, timeout). Safe for concurrent use.
type Codes struct {
	mu sync.Mutex
	m  map[int]int64
}

// Add counts one answer.
func (c *Codes) Add(code int) {
	c.mu.Lock()
	if c.m == nil {
		c.m = map[int]int64{}
	}
	c.m[code]++
	c.mu.Unlock()
}

// Snapshot returns a copy of the counts.
func (c *Codes) Snapshot() map[int]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[int]int64, len(c.m))
	for k, v := range c.m {
		out[k] = v
	}
	return out
}

// FormatCodes renders counts as "204:1200 400:3 neterr:1", codes ascending.
func FormatCodes(m map[int]int64) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	var parts []string
	for _, k := range keys {
		name := fmt.Sprint(k)
		if k == 0 {
			name = "neterr"
		}
		parts = append(parts, fmt.Sprintf("%s:%d", name, m[k]))
	}
	return strings.Join(parts, " ")
}

// FmtDuration prints a latency with 3 significant digits in a fitting unit.
func FmtDuration(d time.Duration) string {
	switch {
	case d <= 0:
		return "0"
	case d < time.Millisecond:
		return fmt.Sprintf("%.0fµs", float64(d)/float64(time.Microsecond))
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
	case d < 100*time.Millisecond:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	case d < time.Second:
		return fmt.Sprintf("%.0fms", float64(d)/float64(time.Millisecond))
	case d < 10*time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	}
	return fmt.Sprintf("%.1fs", d.Seconds())
}
