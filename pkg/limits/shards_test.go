package limits

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/grafana/dskit/services"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
)

// A tenant's ingestion_shard_size is reloaded at run time, and a read
// covering the time since a change still covers the size it replaced: a
// shard that shrank is read whole until the change is older than the read's
// lookback; one that moved to or from 0 (every receiver) is read everywhere.
func TestIngestionShardSizeReloadAndHistory(t *testing.T) {
	file := filepath.Join(t.TempDir(), "overrides.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(file+".tmp", []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(file+".tmp", file); err != nil {
			t.Fatal(err)
		}
	}
	write("overrides:\n  a:\n    ingestion_shard_size: 5\n  b:\n    ingestion_shard_size: 3\n")
	cfg := DefaultConfig()
	cfg.OverridesFile = file
	cfg.ReloadPeriod = model.Duration(20 * time.Millisecond)
	o, err := New(cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	if err := services.StartAndAwaitRunning(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = services.StopAndAwaitTerminated(context.Background(), o) })
	start := time.Now()
	if got := o.IngestionShardSize("a"); got != 5 {
		t.Fatalf("a's shard at start = %d, want 5", got)
	}
	// Nothing before the first load is known: no history yet.
	if got := o.IngestionShardSizeSince("a", start.Add(-time.Hour)); got != 5 {
		t.Fatalf("a's read shard at start = %d, want 5", got)
	}
	if got := o.IngestionShardSizeSince("c", start.Add(-time.Hour)); got != 0 {
		t.Fatalf("c (no override) read shard = %d, want 0 (every receiver)", got)
	}

	// a shrinks 5 -> 3, b leaves the file (back to the default 0), c
	// comes in with 4.
	write("overrides:\n  a:\n    ingestion_shard_size: 3\n  c:\n    ingestion_shard_size: 4\n")
	waitFor(t, "a's new shard", func() bool { return o.IngestionShardSize("a") == 3 })
	changed := time.Now()
	for _, c := range []struct {
		tenant      string
		now, within int
	}{
		{"a", 3, 5}, // the receivers the shrink dropped hold a's recent data
		{"b", 0, 0},
		{"c", 4, 0}, // c was on every receiver until now
	} {
		if got := o.IngestionShardSize(c.tenant); got != c.now {
			t.Errorf("%s's shard = %d, want %d", c.tenant, got, c.now)
		}
		if got := o.IngestionShardSizeSince(c.tenant, start.Add(-time.Hour)); got != c.within {
			t.Errorf("%s's shard to read over the change = %d, want %d", c.tenant, got, c.within)
		}
		// A read whose lookback starts after the change reads the new shard.
		if got := o.IngestionShardSizeSince(c.tenant, changed.Add(time.Second)); got != c.now {
			t.Errorf("%s's shard to read after the change = %d, want %d", c.tenant, got, c.now)
		}
	}
	// a grows 3 -> 6: the larger shard holds the smaller.
	write("overrides:\n  a:\n    ingestion_shard_size: 6\n  c:\n    ingestion_shard_size: 4\n")
	waitFor(t, "a's grown shard", func() bool { return o.IngestionShardSize("a") == 6 })
	if got := o.IngestionShardSizeSince("a", start.Add(-time.Hour)); got != 6 {
		t.Errorf("a's shard to read after growing = %d, want 6", got)
	}
}

func TestIngestionShardSizeMustNotBeNegative(t *testing.T) {
	l := Defaults()
	l.IngestionShardSize = -1
	if l.Validate() == nil {
		t.Fatal("a negative ingestion_shard_size validated")
	}
}
