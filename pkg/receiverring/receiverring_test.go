package receiverring

import (
	"testing"
	"time"
)

type fixedLimits struct {
	series int
	window time.Duration
}

func (f fixedLimits) MaxActiveSeries(string) int            { return f.series }
func (f fixedLimits) MaxSeriesPerMetric(string) int         { return 0 }
func (f fixedLimits) MaxNewSeriesPerDay(string) int         { return 0 }
func (f fixedLimits) OutOfOrderWindow(string) time.Duration { return f.window }

// TestReplicaLimits: a receiver's out-of-order window is at least the remote
// timeout, and a tenant's max_active_series is shared by the receivers: each
// holds about RF/N of the series, so it gets RF/N of the limit (rounded up),
// the whole limit while the ring has no more receivers than RF.
func TestReplicaLimits(t *testing.T) {
	cfg := DefaultConfig()
	cfg.ReplicationFactor = 3
	cfg.RemoteTimeout = 0
	for _, c := range []struct {
		limit, receivers, want int
	}{
		{900, 0, 900}, // ring not known yet
		{900, 1, 900},
		{900, 3, 900},
		{900, 5, 540},
		{900, 10, 270},
		{10, 100, 1}, // rounded up, never 0 (0 would mean unlimited)
		{0, 5, 0},    // unlimited stays unlimited
	} {
		l := cfg.ReplicaLimits(fixedLimits{series: c.limit}, func(string) int { return c.receivers })
		if got := l.MaxActiveSeries("t"); got != c.want {
			t.Errorf("limit %d over %d receivers: %d per receiver, want %d", c.limit, c.receivers, got, c.want)
		}
	}
	if got := cfg.ReplicaLimits(fixedLimits{series: 900}, nil).MaxActiveSeries("t"); got != 900 {
		t.Errorf("without a receiver count: %d, want the whole limit", got)
	}

	if err := cfg.RemoteTimeout.Set("20s"); err != nil {
		t.Fatal(err)
	}
	l := cfg.ReplicaLimits(fixedLimits{window: 5 * time.Second}, nil)
	if got := l.OutOfOrderWindow("t"); got != 20*time.Second {
		t.Errorf("out-of-order window %s, want the remote timeout 20s", got)
	}
	if got := cfg.ReplicaLimits(fixedLimits{window: time.Minute}, nil).OutOfOrderWindow("t"); got != time.Minute {
		t.Errorf("out-of-order window %s, want the tenant's 1m", got)
	}
}
