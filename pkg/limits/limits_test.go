package limits

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/grafana/dskit/services"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"

	"github.com/gpustore/gpustore/pkg/relabel"
)

func TestLoadKeepsDefaultsForUnsetFields(t *testing.T) {
	d := Defaults()
	f, err := Load(strings.NewReader("overrides:\n  gpu-prod:\n    max_active_series: 5\n    out_of_order_window: 1h\n"), d)
	if err != nil {
		t.Fatal(err)
	}
	l := f.Overrides["gpu-prod"]
	if l.MaxActiveSeries != 5 || l.OutOfOrderWindow != model.Duration(time.Hour) {
		t.Fatalf("override not applied: %+v", l)
	}
	if l.MaxLabelNamesPerSeries != d.MaxLabelNamesPerSeries || l.RateLimitStatusCode != d.RateLimitStatusCode || l.HAReplicaLabel != "__replica__" {
		t.Fatalf("defaults lost: %+v", l)
	}
}

func TestLoadRejectsBadOverrides(t *testing.T) {
	for _, bad := range []string{
		"overrides:\n  t:\n    max_activ_series: 5\n",         // typo: unknown field
		"overrides:\n  t:\n    rate_limit_status_code: 500\n", // neither 429 nor 503
		"overrides:\n  t:\n    ingestion_rate: 10\n    ingestion_burst_size: 0\n",
		"overrides:\n  t:\n    ha_replica_label: cluster\n",
		"overrides: [1, 2]\n",
	} {
		if _, err := Load(strings.NewReader(bad), Defaults()); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
}

func TestDefaultsFitDCGMExporter(t *testing.T) {
	// dcgm-exporter with Kubernetes mapping, MIG and Prometheus' target and
	// external labels: about 20 labels. Mimir's default of 30 is a known pain.
	if Defaults().MaxLabelNamesPerSeries < 40 {
		t.Fatal("default label limit below 40")
	}
	if err := Defaults().Validate(); err != nil {
		t.Fatal(err)
	}
}

// reloadGauge reads dskit runtimeconfig's
// runtime_config_last_reload_successful of the overrides file: 1 after a
// read that loaded, 0 after one that failed (the previous overrides stay).
func reloadGauge(t *testing.T, g prometheus.Gatherer) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "runtime_config_last_reload_successful" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "config" && l.GetValue() == "limits-overrides" {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatal("runtime_config_last_reload_successful{config=\"limits-overrides\"} is not registered")
	return 0
}

func waitFor(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The overrides file is re-read while gpustore runs: a good file applies
// (and notifies listeners); a broken one (bad YAML, a typo'd field, an
// invalid value) is read, reported, and changes nothing. Each broken case
// first waits for the failed read to show in the reload gauge, so "nothing
// changed" is checked after the file was read, not merely after a sleep.
func TestOverridesReload(t *testing.T) {
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
	write("overrides:\n  lab:\n    max_active_series: 100\n")
	cfg := DefaultConfig()
	cfg.OverridesFile = file
	cfg.ReloadPeriod = model.Duration(20 * time.Millisecond)
	reg := prometheus.NewRegistry()
	o, err := New(cfg, slog.New(slog.DiscardHandler), reg)
	if err != nil {
		t.Fatal(err)
	}
	if err := services.StartAndAwaitRunning(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = services.StopAndAwaitTerminated(context.Background(), o) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reloaded := o.Listen(ctx)

	if got := o.MaxActiveSeries("lab"); got != 100 {
		t.Fatalf("lab max_active_series at start = %d, want 100", got)
	}
	if got := o.MaxActiveSeries("prod"); got != Defaults().MaxActiveSeries {
		t.Fatalf("a tenant without overrides got %d", got)
	}

	for _, c := range []struct {
		name, good, broken string
		want               int
	}{
		{"bad YAML", "overrides:\n  lab:\n    max_active_series: 200\n", "overrides: [this is not a map\n", 200},
		{"unknown field", "overrides:\n  lab:\n    max_active_series: 300\n", "overrides:\n  lab:\n    max_activ_series: 5\n", 300},
		{"invalid value", "overrides:\n  lab:\n    max_active_series: 400\n", "overrides:\n  lab:\n    max_active_series: 1\n    rate_limit_status_code: 500\n", 400},
	} {
		want := c.want
		write(c.good)
		waitFor(t, c.name+": good file applied", func() bool { return o.MaxActiveSeries("lab") == want })
		select {
		case <-reloaded:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no reload notification for a good file", c.name)
		}
		if g := reloadGauge(t, reg); g != 1 {
			t.Fatalf("%s: reload gauge %v after a good file", c.name, g)
		}

		write(c.broken)
		waitFor(t, c.name+": broken file read (reload gauge 0)", func() bool { return reloadGauge(t, reg) == 0 })
		if got := o.MaxActiveSeries("lab"); got != want {
			t.Errorf("%s: a broken overrides file changed lab's max_active_series to %d, want %d kept", c.name, got, want)
		}
		if got := o.For("lab").RateLimitStatusCode; got != Defaults().RateLimitStatusCode {
			t.Errorf("%s: rate_limit_status_code %d", c.name, got)
		}
		select {
		case <-reloaded:
			t.Errorf("%s: listeners were told of a reload that failed", c.name)
		default:
		}
	}
}

func TestLoadRelabelRules(t *testing.T) {
	f, err := Load(strings.NewReader(`overrides:
  gpu-prod:
    ingest_preset: dcgm
    metric_relabel_configs:
      - action: labeldrop
        regex: pci_bus_id
  lab:
    dcgm_hostname_label: hostname
    ingest_preset: dcgm
  plain:
    max_active_series: 5
`), Defaults())
	if err != nil {
		t.Fatal(err)
	}
	prod, lab, plain := f.Overrides["gpu-prod"], f.Overrides["lab"], f.Overrides["plain"]
	if host, ok := prod.Relabel().DCGM(); !ok || host != "Hostname" {
		t.Errorf("gpu-prod: dcgm preset %v with host label %q, want on with Hostname (the default)", ok, host)
	}
	if n, want := len(prod.Relabel().Configs()), len(relabel.DCGMPreset("Hostname"))+1; n != want {
		t.Errorf("gpu-prod: %d rules, want the preset's and its own, %d", n, want)
	}
	if host, _ := lab.Relabel().DCGM(); host != "hostname" {
		t.Errorf("lab: host label %q, want hostname", host)
	}
	if !plain.Relabel().Empty() {
		t.Error("a tenant without rules has rules")
	}
	o, err := New(DefaultConfig(), slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	if d := o.For("anyone"); !d.Relabel().Empty() {
		t.Error("the defaults have rules")
	}
}

// Invalid rules are refused at load with an error naming the tenant and the rule.
func TestLoadRejectsBadRelabelRules(t *testing.T) {
	for _, c := range []struct{ file, want string }{
		{"overrides:\n  t:\n    ingest_preset: nvidia\n", `overrides of tenant "t": ingest_preset "nvidia": unknown preset`},
		{"overrides:\n  t:\n    ingest_preset: dcgm\n    dcgm_hostname_label: HOSTNAME\n", `dcgm_hostname_label "HOSTNAME"`},
		{"overrides:\n  t:\n    metric_relabel_configs:\n      - action: replace\n        source_labels: [a]\n", `overrides of tenant "t": metric_relabel_configs[0]: relabel configuration for replace action requires 'target_label' value`},
		{"overrides:\n  t:\n    metric_relabel_configs:\n      - action: keep\n        regex: '(['\n", "error parsing regexp"},
		{"overrides:\n  t:\n    metric_relabel_configs:\n      - action: keep\n        sourcelabels: [a]\n", "field sourcelabels not found"},
	} {
		_, err := Load(strings.NewReader(c.file), Defaults())
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want one containing %q", c.file, err, c.want)
		}
	}
	cfg := DefaultConfig()
	cfg.Defaults.IngestPreset = "nvidia"
	if _, err := New(cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry()); err == nil || !strings.Contains(err.Error(), "default limits") {
		t.Errorf("bad default preset: %v", err)
	}
}

// A reload with broken rules keeps the tenant's previous rules in force.
func TestOverridesReloadKeepsRelabelRules(t *testing.T) {
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
	const good = "overrides:\n  lab:\n    metric_relabel_configs:\n      - action: labeldrop\n        regex: pci_bus_id\n"
	write(good)
	cfg := DefaultConfig()
	cfg.OverridesFile = file
	cfg.ReloadPeriod = model.Duration(20 * time.Millisecond)
	reg := prometheus.NewRegistry()
	o, err := New(cfg, slog.New(slog.DiscardHandler), reg)
	if err != nil {
		t.Fatal(err)
	}
	if err := services.StartAndAwaitRunning(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = services.StopAndAwaitTerminated(context.Background(), o) })
	before := o.For("lab").Relabel()
	if before.Empty() {
		t.Fatal("lab has no rules after the first load")
	}
	write("overrides:\n  lab:\n    metric_relabel_configs:\n      - action: replace\n        source_labels: [a]\n")
	waitFor(t, "broken file read (reload gauge 0)", func() bool { return reloadGauge(t, reg) == 0 })
	if got := o.For("lab").Relabel(); got != before {
		t.Fatalf("a broken file replaced lab's rules (%v → %v)", before.Configs(), got.Configs())
	}
	write("overrides:\n  lab:\n    ingest_preset: dcgm\n")
	waitFor(t, "good file applied", func() bool { _, ok := o.For("lab").Relabel().DCGM(); return ok })
}
