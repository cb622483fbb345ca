package tenantdb

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/model/exemplar"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
)

// maxExemplarsOf reads the tenant's prometheus_tsdb_exemplar_max_exemplars:
// the size of its exemplar ring buffer.
func maxExemplarsOf(t *testing.T, reg *prometheus.Registry, tenant string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "prometheus_tsdb_exemplar_max_exemplars" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "tenant" && l.GetValue() == tenant {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no prometheus_tsdb_exemplar_max_exemplars of tenant %s", tenant)
	return 0
}

// TestExemplarBufferOnFirstExemplar: a tenant's exemplar ring buffer
// (tsdb.max_exemplars entries, ~7 MB at the default) is allocated at its
// first exemplar, not when its database opens; the exemplar that turned it
// on is kept, and after a restart the tenant's buffer is there again with
// the exemplars its WAL held, while a tenant that never sent one still has
// none.
func TestExemplarBufferOnFirstExemplar(t *testing.T) {
	dir := t.TempDir()
	reg := prometheus.NewRegistry()
	open := func() *Manager {
		reg = prometheus.NewRegistry()
		m, err := NewManager(Config{Dir: dir, BlockDuration: DefaultConfig().BlockDuration, Retention: DefaultConfig().Retention, MaxExemplars: 1000}, slog.New(slog.DiscardHandler), reg)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.OpenExisting(context.Background()); err != nil {
			t.Fatal(err)
		}
		return m
	}
	m := open()
	now := time.Now().UnixMilli()
	series := labels.FromStrings("__name__", "training_step_seconds_bucket", "le", "0.5", "rank", "0")
	for _, tenant := range []string{"plain", "traced"} {
		db, err := m.Get(tenant)
		if err != nil {
			t.Fatal(err)
		}
		if got := maxExemplarsOf(t, reg, tenant); got != 0 {
			t.Errorf("tenant %s: a buffer of %v exemplars before any exemplar", tenant, got)
		}
		var opts storage.AOptions
		if tenant == "traced" {
			opts.Exemplars = []exemplar.Exemplar{{Labels: labels.FromStrings("trace_id", "4bf92f3577b34da6"), Value: 0.42, Ts: now, HasTs: true}}
		}
		app := db.AppenderV2(context.Background())
		if _, err := app.Append(0, series, 0, now, 3, nil, nil, opts); err != nil {
			t.Fatal(err)
		}
		if err := app.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	check := func(when string) {
		t.Helper()
		if got := maxExemplarsOf(t, reg, "plain"); got != 0 {
			t.Errorf("%s: tenant without exemplars has a buffer of %v", when, got)
		}
		if got := maxExemplarsOf(t, reg, "traced"); got != 1000 {
			t.Errorf("%s: tenant with exemplars has a buffer of %v, want 1000", when, got)
		}
		q, err := m.Existing("traced").ExemplarQuerier(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		res, err := q.Select(math.MinInt64, math.MaxInt64, []*labels.Matcher{labels.MustNewMatcher(labels.MatchEqual, "__name__", "training_step_seconds_bucket")})
		if err != nil || len(res) != 1 || len(res[0].Exemplars) != 1 || res[0].Exemplars[0].Value != 0.42 {
			t.Errorf("%s: exemplars %v (%v), want the first one", when, res, err)
		}
	}
	check("after the first exemplar")
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	m = open()
	defer m.Close()
	check("after a restart")
}

// TestMaxTenants: past limits.max_tenants a new tenant is refused with an
// error naming the limit, the tenants already there keep working, and so it
// stays across restarts: every tenant on disk opens again (also past a
// lowered bound), a new one is still refused.
func TestMaxTenants(t *testing.T) {
	dir := t.TempDir()
	maxTenants := 3
	open := func() *Manager {
		m := newTestManager(t, func(c *Config) { c.Dir = dir })
		m.SetMaxTenants(maxTenants)
		if err := m.OpenExisting(context.Background()); err != nil {
			t.Fatal(err)
		}
		return m
	}
	m := open()
	for i := range 3 {
		if _, err := m.Get(fmt.Sprint("team-", i)); err != nil {
			t.Fatal(err)
		}
	}
	_, err := m.Get("team-3")
	if !errors.Is(err, ErrTooManyTenants) || !strings.Contains(err.Error(), "limits.max_tenants") {
		t.Fatalf("a fourth tenant under max_tenants 3: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "tenants", "team-3")); !os.IsNotExist(err) {
		t.Errorf("the refused tenant's directory: %v", err)
	}
	if _, err := m.Get("team-0"); err != nil {
		t.Errorf("an existing tenant at the limit: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}

	maxTenants = 2 // lowered below what is on disk
	m = open()
	if got := m.Tenants(); len(got) != 3 {
		t.Errorf("tenants opened after a restart: %v, want all 3 on disk", got)
	}
	if _, err := m.Get("team-4"); !errors.Is(err, ErrTooManyTenants) {
		t.Errorf("a new tenant after the restart: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	maxTenants = 0 // no bound
	m = open()
	if _, err := m.Get("team-4"); err != nil {
		t.Errorf("a new tenant without a bound: %v", err)
	}
}
