package queryfrontend

import (
	"testing"
	"time"
)

// BenchmarkDashboardRefresh: a 3-day panel at a Grafana step (range/250)
// over a real TSDB, as the API answers it without the frontend (direct),
// split by day without the cache (no-store), and refreshed with the window
// 30 s later each time through the cache (cached).
func BenchmarkDashboardRefresh(b *testing.B) {
	s := newStack(b, 3, nil)
	const q = `avg by (gpu) (rate(energy_total[5m]))`
	span := 72 * time.Hour
	step := (span / 250).Truncate(time.Second)
	run := func(b *testing.B, fn func(end time.Time) promAnswer) {
		end := s.now
		for b.Loop() {
			end = end.Add(30 * time.Second)
			if a := fn(end.Truncate(step)); a.Status != "success" {
				b.Fatal(a.Error)
			}
		}
	}
	b.Run("direct", func(b *testing.B) {
		run(b, func(end time.Time) promAnswer { return rangeQuery(b, s.direct, q, end.Add(-span), end, step) })
	})
	b.Run("split-no-store", func(b *testing.B) {
		run(b, func(end time.Time) promAnswer {
			return rangeQuery(b, s.front, q, end.Add(-span), end, step, "Cache-Control", "no-store")
		})
	})
	b.Run("cached", func(b *testing.B) {
		run(b, func(end time.Time) promAnswer { return rangeQuery(b, s.front, q, end.Add(-span), end, step) })
	})
}
