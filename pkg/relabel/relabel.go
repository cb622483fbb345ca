// Package relabel is a tenant's relabeling on ingest: Prometheus'
// metric_relabel_configs (model/relabel, the format users already write)
// applied to each series before it is stored, optionally after a preset of
// ordinary rules for a known exporter (the dcgm preset, see preset.go).
//
// Rules are compiled once when the limits overrides are loaded and shared,
// read-only, by every request of the tenant. A tenant without rules has a
// nil *Rules: the write path tests for nil and pays nothing else.
package relabel

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/relabel"
	"gopkg.in/yaml.v3"
)

// Config is what a tenant sets in the limits overrides.
type Config struct {
	// MetricRelabelConfigs are the tenant's own rules, applied after the preset.
	MetricRelabelConfigs []*relabel.Config
	// Preset names a rule preset ("" or PresetDCGM).
	Preset string
	// DCGMHostnameLabel is the host label name the dcgm preset keeps:
	// "Hostname" (dcgm-exporter up to 4.x, the rule pack's and dashboards'
	// name) or "hostname" (newer releases); the other one is renamed to it.
	DCGMHostnameLabel string
}

// Rules are one tenant's compiled relabeling. The zero of *Rules (nil) is
// "no rules": Process keeps every series unchanged.
type Rules struct {
	configs     []*relabel.Config // the preset's, then the tenant's
	dcgm        bool
	hostLabel   string
	fingerprint string
}

// New validates cfg and compiles its rules. It returns nil (no rules, no
// error) when cfg has neither a preset nor rules.
func New(cfg Config) (*Rules, error) {
	if cfg.Preset == "" && len(cfg.MetricRelabelConfigs) == 0 {
		return nil, nil
	}
	r := &Rules{}
	switch cfg.Preset {
	case "":
	case PresetDCGM:
		host, err := dcgmHostLabel(cfg.DCGMHostnameLabel)
		if err != nil {
			return nil, err
		}
		r.dcgm, r.hostLabel = true, host
		r.configs = append(r.configs, DCGMPreset(host)...)
	default:
		return nil, fmt.Errorf("ingest_preset %q: unknown preset (known: %q)", cfg.Preset, PresetDCGM)
	}
	for i, c := range cfg.MetricRelabelConfigs {
		if c == nil {
			return nil, fmt.Errorf("metric_relabel_configs[%d]: empty rule", i)
		}
		// A copy: Validate fills in the name validation scheme, and the
		// caller's config must stay as it was written.
		cp := *c
		if err := Validate(&cp); err != nil {
			return nil, fmt.Errorf("metric_relabel_configs[%d]: %w", i, err)
		}
		r.configs = append(r.configs, &cp)
	}
	r.fingerprint = fingerprint(cfg, r.hostLabel)
	return r, nil
}

// Validate checks one rule as Prometheus checks a metric_relabel_configs
// entry (UTF-8 label names, as Prometheus 3 accepts them).
func Validate(c *relabel.Config) error {
	if c.Regex.Regexp == nil {
		return errors.New("rule has no regex (build rules from relabel.DefaultRelabelConfig or YAML)")
	}
	return c.Validate(model.UTF8Validation)
}

// Empty reports whether r changes nothing (r is nil).
func (r *Rules) Empty() bool { return r == nil }

// Process applies the rules to the labels in lb; false means the series is
// dropped. lb is left with the relabeled labels.
func (r *Rules) Process(lb *labels.Builder) bool {
	if r == nil {
		return true
	}
	return relabel.ProcessBuilder(lb, r.configs...)
}

// Configs returns the compiled rules in the order they run (the preset's
// first); callers must not change them.
func (r *Rules) Configs() []*relabel.Config {
	if r == nil {
		return nil
	}
	return r.configs
}

// DCGM reports whether the dcgm preset is on, and the host label name it
// keeps. The preset's driver info series (DriverInfoMetric) is written by
// the ingester, as no relabel rule can make a new series.
func (r *Rules) DCGM() (hostLabel string, ok bool) {
	if r == nil || !r.dcgm {
		return "", false
	}
	return r.hostLabel, true
}

// Fingerprint identifies the rules' content: two loads of the same
// configuration have the same fingerprint, so a reload that left a
// tenant's rules alone does not make its series be relabeled again.
func (r *Rules) Fingerprint() string {
	if r == nil {
		return ""
	}
	return r.fingerprint
}

func fingerprint(cfg Config, host string) string {
	b, err := yaml.Marshal(cfg.MetricRelabelConfigs)
	if err != nil {
		// Cannot happen for configs that validated; fall back to a value
		// that never equals another load's, which only costs a relabel.
		b = fmt.Appendf(nil, "%p", cfg.MetricRelabelConfigs)
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00", cfg.Preset, host)
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// ParseConfigs reads a YAML list of rules (the metric_relabel_configs
// format) and validates them; for tests and tools.
func ParseConfigs(s string) ([]*relabel.Config, error) {
	var cfgs []*relabel.Config
	dec := yaml.NewDecoder(strings.NewReader(s))
	dec.KnownFields(true)
	if err := dec.Decode(&cfgs); err != nil {
		return nil, fmt.Errorf("parse relabel rules: %w", err)
	}
	for i, c := range cfgs {
		if c == nil {
			return nil, fmt.Errorf("rule %d: empty rule", i)
		}
		if err := Validate(c); err != nil {
			return nil, fmt.Errorf("rule %d: %w", i, err)
		}
	}
	return cfgs, nil
}
