package tenantdb

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
)

// openRecovering opens a manager on dir whose tenants' heads are set aside
// when their WAL holds anything to replay (aside "on"), or never ("off"). Its
// blocks are a minute long, so that the database loads the blocks a
// recovery adopts within seconds (BlockReloadInterval).
func openRecovering(t *testing.T, dir, aside string) *Manager {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Dir = dir
	cfg.BlockDuration = model.Duration(time.Minute)
	cfg.Retention = model.Duration(10000 * time.Hour)
	cfg.RecoverWALAside = aside
	cfg.RecoverAsideMinWALBytes = 1
	m, err := NewManager(cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	// Receivers in a ring always take samples out of order (the window is
	// widened to ring.remote_timeout): the crashed heads have a WBL.
	m.SetLimits(windowLimits{window: time.Hour})
	if err := m.OpenExisting(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// eventually polls until the tenant reads want back.
func eventually(t *testing.T, what string, db *DB, want map[string][]string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		got := dump(t, db)
		if equalSamples(got, want) {
			return
		}
		if time.Now().After(deadline) {
			sameSamples(t, what, got, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// crashed writes 100 series' samples of the first minute into a tenant,
// in order and out of order (all in its WAL and WBL), and returns a kill-like copy of the data directory, the
// acknowledged samples, and the manager, still open.
func crashed(t *testing.T) (killed string, want map[string][]string, m *Manager) {
	t.Helper()
	dir := t.TempDir()
	want = map[string][]string{}
	m = openRecovering(t, dir, "off")
	db, err := m.Get("team-a")
	if err != nil {
		t.Fatal(err)
	}
	appendRange(t, db, 100, 0, 1, want) // 4 samples a series
	// Then one out of order between each two, into the WBL and the
	// out-of-order head.
	app := db.Appender(context.Background())
	for i := range 100 {
		ls := labels.FromStrings("__name__", "DCGM_FI_DEV_GPU_TEMP", "gpu", fmt.Sprint(i%8), "node", fmt.Sprint(i/8))
		for ts := int64(7_500); ts < 45_000; ts += 15_000 {
			if _, err := app.Append(0, ls, ts, 0.5); err != nil {
				t.Fatal(err)
			}
			want[ls.String()] = append(want[ls.String()], fmt.Sprintf("%d=0.5", ts))
		}
	}
	if err := app.Commit(); err != nil {
		t.Fatal(err)
	}
	for _, s := range want {
		slices.SortFunc(s, func(a, b string) int { return cmp.Compare(sampleTime(a), sampleTime(b)) })
	}
	return killCopy(t, dir), want, m
}

// sampleTime is the time of a sample as dump prints it ("ts=value").
func sampleTime(s string) int64 {
	ts, _, _ := strings.Cut(s, "=")
	n, _ := strconv.ParseInt(ts, 10, 64)
	return n
}

func asideDirs(t *testing.T, tenantDir string) []string {
	t.Helper()
	d, err := filepath.Glob(filepath.Join(tenantDir, recoverDirPrefix+"*"))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// After a kill -9 the tenant opens with an empty head at once, takes
// writes (a retried request among them), and the crashed head's samples
// come back from blocks written in the background: every acknowledged
// sample reads back once, and nothing is left set aside.
func TestCrashedHeadRecoveredAside(t *testing.T) {
	killed, want, _ := crashed(t)
	mk := openRecovering(t, killed, "on")
	db := mk.Existing("team-a")
	if n := db.Head().NumSeries(); n != 0 {
		// Without recovery aside the open replays the WAL: 100 series.
		t.Fatalf("the open after a kill -9 replayed %d series before returning, want the head set aside", n)
	}
	if !mk.Recovering("team-a") {
		t.Fatal("the tenant does not report its recovery: a ring's reads would count its incomplete answers")
	}
	// A sender retries its last request (the samples at 45 s) and goes on.
	app := db.Appender(context.Background())
	for i := range 100 {
		ls := labels.FromStrings("__name__", "DCGM_FI_DEV_GPU_TEMP", "gpu", fmt.Sprint(i%8), "node", fmt.Sprint(i/8))
		if _, err := app.Append(0, ls, 45_000, 45+float64(i)/1000); err != nil {
			t.Fatal(err)
		}
	}
	if err := app.Commit(); err != nil {
		t.Fatal(err)
	}
	appendRange(t, db, 100, 1, 2, want)
	if got := dump(t, db); equalSamples(got, want) {
		t.Fatal("the new head alone reads every sample back: the test would not see a recovery")
	}
	eventually(t, "after a kill -9, recovered aside", db, want)
	for deadline := time.Now().Add(20 * time.Second); mk.Recovering("team-a"); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the tenant still reports a recovery after its samples came back")
		}
	}
	mk.recoveries.stop()
	if got := testutil.ToFloat64(mk.recoveries.pendingHeads); got != 0 {
		t.Errorf("%g recoveries pending after the samples came back", got)
	}
	if d := asideDirs(t, mk.TenantDir("team-a")); len(d) != 0 {
		t.Errorf("left set aside: %v", d)
	}
	if got := testutil.ToFloat64(mk.recoveries.failed); got != 0 {
		t.Errorf("%g recoveries failed", got)
	}
}

// A clean close writes a chunk snapshot at the WAL's end: the next open
// has nothing to replay and sets nothing aside, even at a threshold of one
// byte.
func TestCleanStopIsNotSetAside(t *testing.T) {
	dir := t.TempDir()
	want := map[string][]string{}
	m := openRecovering(t, dir, "on")
	db, err := m.Get("team-a")
	if err != nil {
		t.Fatal(err)
	}
	appendRange(t, db, 100, 0, 1, want)
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if n, err := walBytesToReplay(m.TenantDir("team-a")); err != nil || n != 0 {
		t.Fatalf("after a clean close the open would replay %d bytes of WAL (%v), want 0", n, err)
	}
	m = openRecovering(t, dir, "on")
	db = m.Existing("team-a")
	if n := db.Head().NumSeries(); n != 100 {
		t.Fatalf("the open after a clean close holds %d series, want the snapshot's 100", n)
	}
	sameSamples(t, "after a clean restart", dump(t, db), want)
	if d := asideDirs(t, m.TenantDir("team-a")); len(d) != 0 {
		t.Errorf("set aside after a clean close: %v", d)
	}
}

// A crash while a head was being set aside (some of its files moved into
// recover.<n>.tmp) leaves it whole again at the next open.
func TestInterruptedSetAsideIsUndone(t *testing.T) {
	killed, want, _ := crashed(t)
	tenant := filepath.Join(killed, "tenants", "team-a")
	tmp := filepath.Join(tenant, recoverDirPrefix+"1"+recoverTmpSuffix)
	if err := os.Mkdir(tmp, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(tenant, "wal"), filepath.Join(tmp, "wal")); err != nil {
		t.Fatal(err)
	}
	mk := openRecovering(t, killed, "off")
	sameSamples(t, "after an interrupted set-aside", dump(t, mk.Existing("team-a")), want)
	if d := asideDirs(t, tenant); len(d) != 0 {
		t.Errorf("left set aside: %v", d)
	}
}

// A crash during a recovery, after the set-aside head was written into
// blocks and its WAL removed but before the blocks moved, is finished by
// the next open: the blocks are adopted, even with recovery aside off.
func TestRecoveryFinishedAfterACrash(t *testing.T) {
	killed, want, m := crashed(t)
	tenant := filepath.Join(killed, "tenants", "team-a")
	aside, n, err := setHeadAside(tenant, 1)
	if err != nil || aside == "" {
		t.Fatalf("set aside %q (%d bytes of WAL): %v", aside, n, err)
	}
	if err := writeAsideBlocks(context.Background(), aside, m.asideOptions(time.Hour.Milliseconds()), slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	if files, err := headFiles(aside); err != nil || len(files) != 0 {
		t.Fatalf("the set-aside head's files %v (%v) are left after its blocks were written", files, err)
	}
	mk := openRecovering(t, killed, "off")
	eventually(t, "after a crash during a recovery", mk.Existing("team-a"), want)
	mk.recoveries.stop()
	if d := asideDirs(t, tenant); len(d) != 0 {
		t.Errorf("left set aside: %v", d)
	}
}

// A recovery that fails leaves the set-aside head where it is, counts the
// failure, and keeps the tenant recovering: its reads stay refused (its
// answers lack that head) until a restart recovers it.
func TestFailedRecoveryKeepsTheTenantRecovering(t *testing.T) {
	dir := t.TempDir()
	aside := filepath.Join(dir, "tenants", "team-a", recoverDirPrefix+"1")
	if err := os.MkdirAll(aside, 0o777); err != nil {
		t.Fatal(err)
	}
	// A WAL that is a file, not a directory: the set-aside head's open fails.
	if err := os.WriteFile(filepath.Join(aside, "wal"), []byte("not a WAL"), 0o644); err != nil {
		t.Fatal(err)
	}
	m := openRecovering(t, dir, "off")
	for deadline := time.Now().Add(20 * time.Second); testutil.ToFloat64(m.recoveries.failed) == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the recovery of a head whose WAL is a file did not fail")
		}
	}
	if !m.Recovering("team-a") || testutil.ToFloat64(m.recoveries.pendingHeads) != 1 {
		t.Errorf("after a failed recovery: recovering %v, %g pending, want true and 1", m.Recovering("team-a"), testutil.ToFloat64(m.recoveries.pendingHeads))
	}
	if d := asideDirs(t, filepath.Join(dir, "tenants", "team-a")); len(d) != 1 {
		t.Errorf("set aside after a failed recovery: %v, want the head left in place", d)
	}
}
