package compact_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/grafana/dskit/services"
	"github.com/prometheus/common/model"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/compact"
	"github.com/gpustore/gpustore/pkg/downsample"
	"github.com/gpustore/gpustore/pkg/limits"
)

// TestDownsampledRetention: each resolution's retention deletes that
// resolution's blocks wholly older than it, from the bucket and from
// answers (raw 2d, 5m 4d, 1h 6d here: a block 7 days old is gone at every
// resolution, 5 days old answers from 1h data, 3 days old from 5m data,
// a day old from raw), and never leaves hours without data that a coarser
// resolution does not yet hold: a tenant whose receivers stopped a week ago
// has a newest 5m block that no 1h block covers (a block is downsampled
// once a newer one follows it), which stays past the 5m retention, as its
// newest raw block (never downsampled) stays past the raw retention.
func TestDownsampledRetention(t *testing.T) {
	store := startStore(t)
	bkt := openBucket(t, store)
	dir := t.TempDir()
	now := time.Now().Truncate(8 * time.Hour)
	ages := []time.Duration{7 * day, 5 * day, 3 * day, day, 2 * time.Hour}
	for _, age := range ages {
		upload(t, bkt, "ret", nil, smallBlocks(t, dir, now.Add(-age), 1)...)
	}
	// Two adjacent blocks in different 8h ranges (so not compacted together).
	upload(t, bkt, "stopped", nil, smallBlocks(t, dir, now.Add(-7*day-2*time.Hour), 2)...)

	cfg := testConfig()
	cfg.BlockRanges = compact.DurationList{model.Duration(2 * time.Hour), model.Duration(8 * time.Hour)}
	cfg.Downsample = true
	cfg.RetentionRaw, cfg.Retention5m, cfg.Retention1h = model.Duration(2*day), model.Duration(4*day), model.Duration(6*day)
	c, _ := newCompactor(t, cfg, bkt, nil)
	ageOf := func(m *block.Meta) time.Duration { return now.Sub(time.UnixMilli(m.MinTime)).Round(time.Hour) }
	left := func(tenant string) map[int64][]time.Duration {
		blocks, _ := byResolution(compactUntilStable(t, c, bkt, tenant))
		out := map[int64][]time.Duration{}
		for r, ms := range blocks {
			for _, m := range ms {
				out[r] = append(out[r], ageOf(m))
			}
			slices.Sort(out[r])
		}
		return out
	}
	for tenant, want := range map[string]map[int64][]time.Duration{
		"ret": {
			block.ResolutionRaw: {2 * time.Hour, day},
			downsample.Res5m:    {day, 3 * day},
			downsample.Res1h:    {3 * day, 5 * day},
		},
		"stopped": {
			block.ResolutionRaw: {7*day + 2*time.Hour - 2*time.Hour}, // the newest: never downsampled
			downsample.Res5m:    {7*day + 2*time.Hour},               // the newest 5m block: no 1h data yet
		},
	} {
		got := left(tenant)
		for _, r := range []int64{block.ResolutionRaw, downsample.Res5m, downsample.Res1h} {
			if fmt.Sprint(got[r]) != fmt.Sprint(want[r]) {
				t.Errorf("%s: %s blocks left of ages %v, want %v", tenant, downsample.ResolutionName(r), got[r], want[r])
			}
		}
	}

	// Answers: what each block's hours answer now, asked for raw data (the
	// bucket store reads the coarser data where raw data is gone).
	qa, qurl := startQuery(t, store.bucket())
	if err := qa.BucketStore.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		age  time.Duration
		from string // "": no answer; else the info the answer carries ("raw": none)
	}{{7 * day, ""}, {5 * day, "1h"}, {3 * day, "5m"}, {day, "raw"}} {
		start := now.Add(-c.age)
		got, infos := queryRange(t, qurl, "ret", "max_over_time(a_metric[1h])", start.Add(time.Hour), start.Add(2*time.Hour), time.Hour, "raw")
		what := fmt.Sprintf("the hours of the block %s old", c.age)
		switch {
		case c.from == "" && points(got) != 0:
			t.Errorf("%s: %d points answered, want none (past every retention)", what, points(got))
		case c.from != "" && len(got) != 4:
			t.Errorf("%s: %d series answered, want 4", what, len(got))
		case c.from == "raw" && len(infos) != 0:
			t.Errorf("%s: infos %q, want none (raw data)", what, infos)
		case c.from != "" && c.from != "raw" && !slices.ContainsFunc(infos, func(s string) bool { return strings.Contains(s, c.from+" data for") }):
			t.Errorf("%s: infos %q, want %s data", what, infos, c.from)
		}
	}
}

// TestTenantDownsampledRetention: a tenant's compactor_retention_5m and
// compactor_retention_1h in the limits overrides file replace the
// compactor's 5m and 1h retentions for its blocks, from the pass after the
// file is reloaded; other tenants keep the defaults. Only raw retention
// could be set per tenant.
func TestTenantDownsampledRetention(t *testing.T) {
	store := startStore(t)
	bkt := openBucket(t, store)
	dir := t.TempDir()
	now := time.Now().Truncate(8 * time.Hour)
	for _, tenant := range []string{"default-ret", "short-ret"} {
		for _, age := range []time.Duration{5 * day, 3 * day, day, 2 * time.Hour} {
			upload(t, bkt, tenant, nil, smallBlocks(t, dir, now.Add(-age), 1)...)
		}
	}
	overrides := filepath.Join(t.TempDir(), "overrides.yaml")
	if err := os.WriteFile(overrides, []byte("overrides:\n  short-ret:\n    compactor_retention_raw: 2d\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	lcfg := limits.DefaultConfig()
	lcfg.OverridesFile = overrides
	lcfg.ReloadPeriod = model.Duration(100 * time.Millisecond)
	lim, err := limits.New(lcfg, quiet(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := services.StartAndAwaitRunning(context.Background(), lim); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = services.StopAndAwaitTerminated(context.Background(), lim) }()

	cfg := testConfig()
	cfg.BlockRanges = compact.DurationList{model.Duration(2 * time.Hour), model.Duration(8 * time.Hour)}
	cfg.Downsample = true
	cfg.RetentionRaw, cfg.Retention5m, cfg.Retention1h = model.Duration(2*day), model.Duration(4*day), model.Duration(6*day)
	c, _ := newCompactor(t, cfg, bkt, lim)
	ageOf := func(m *block.Meta) time.Duration { return now.Sub(time.UnixMilli(m.MinTime)).Round(time.Hour) }
	left := func(tenant string) string {
		blocks, _ := byResolution(compactUntilStable(t, c, bkt, tenant))
		var out []string
		for _, r := range []int64{block.ResolutionRaw, downsample.Res5m, downsample.Res1h} {
			var ages []time.Duration
			for _, m := range blocks[r] {
				ages = append(ages, ageOf(m))
			}
			slices.Sort(ages)
			out = append(out, fmt.Sprintf("%s:%v", downsample.ResolutionName(r), ages))
		}
		return strings.Join(out, " ")
	}
	defaults := "raw:[2h0m0s 24h0m0s] 5m:[24h0m0s 72h0m0s] 1h:[72h0m0s 120h0m0s]"
	for _, tenant := range []string{"default-ret", "short-ret"} {
		if got := left(tenant); got != defaults {
			t.Fatalf("%s before the override: %s, want %s", tenant, got, defaults)
		}
	}
	if err := os.WriteFile(overrides, []byte("overrides:\n  short-ret:\n    compactor_retention_raw: 2d\n    compactor_retention_5m: 2d\n    compactor_retention_1h: 4d\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the overrides reloaded", func() error {
		if d := lim.CompactorRetention1h("short-ret"); d != 4*day {
			return fmt.Errorf("1h retention %s", d)
		}
		return nil
	})
	if got := left("default-ret"); got != defaults {
		t.Errorf("default-ret after short-ret's override: %s, want %s", got, defaults)
	}
	if got, want := left("short-ret"), "raw:[2h0m0s 24h0m0s] 5m:[24h0m0s] 1h:[72h0m0s]"; got != want {
		t.Errorf("short-ret with 5m 2d and 1h 4d: %s, want %s", got, want)
	}
}
