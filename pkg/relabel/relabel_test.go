package relabel

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
)

var update = flag.Bool("update", false, "rewrite deploy/relabel/dcgm-preset*.yaml from the preset")

// The files users copy are exactly the rules the preset runs.
func TestPresetFilesMatchThePreset(t *testing.T) {
	for _, host := range []string{HostnameOld, HostnameNew} {
		path := filepath.Join("..", "..", "deploy", "relabel", "dcgm-preset-"+strings.ToLower(host[:1])+host[1:]+".yaml")
		if host == HostnameOld {
			path = filepath.Join("..", "..", "deploy", "relabel", "dcgm-preset.yaml")
		}
		want := DCGMPresetYAML(host)
		if *update {
			if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != want {
			t.Errorf("%s differs from DCGMPresetYAML(%q); run go test ./pkg/relabel -run TestPresetFiles -update", path, host)
		}
		if _, err := ParseConfigs(string(got)); err != nil {
			t.Errorf("%s: %v", path, err)
		}
	}
}

func process(t *testing.T, r *Rules, ls labels.Labels) (labels.Labels, bool) {
	t.Helper()
	lb := labels.NewBuilder(ls)
	keep := r.Process(lb)
	return lb.Labels(), keep
}

func mustRules(t *testing.T, cfg Config) *Rules {
	t.Helper()
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// The preset, rule by rule, for both host label directions.
func TestDCGMPreset(t *testing.T) {
	const host = "gpu-node-001"
	gpu := func(extra ...string) labels.Labels {
		return labels.FromStrings(append([]string{"__name__", "DCGM_FI_DEV_GPU_TEMP", "UUID", "GPU-1", "gpu", "0", "DCGM_FI_DRIVER_VERSION", "570.133.20"}, extra...)...)
	}
	want := func(extra ...string) labels.Labels {
		return labels.FromStrings(append([]string{"__name__", "DCGM_FI_DEV_GPU_TEMP", "UUID", "GPU-1", "gpu", "0"}, extra...)...)
	}
	for _, c := range []struct {
		name     string
		keepHost string
		in, want labels.Labels
	}{
		{"old exporter, keep Hostname", "Hostname", gpu("Hostname", host), want("Hostname", host)},
		{"new exporter, keep Hostname", "Hostname", gpu("hostname", host), want("Hostname", host)},
		{"both names, keep Hostname", "Hostname", gpu("Hostname", "x", "hostname", host), want("Hostname", host)},
		{"old exporter, keep hostname", "hostname", gpu("Hostname", host), want("hostname", host)},
		{"new exporter, keep hostname", "hostname", gpu("hostname", host), want("hostname", host)},
		{"default direction is Hostname", "", gpu("hostname", host), want("Hostname", host)},
		{"exported pod labels move where empty", "Hostname",
			gpu("Hostname", host, "exported_pod", "job-1-worker-0", "exported_namespace", "training", "exported_container", "pytorch"),
			want("Hostname", host, "pod", "job-1-worker-0", "namespace", "training", "container", "pytorch")},
		{"the target's own pod labels win", "Hostname",
			gpu("Hostname", host, "pod", "dcgm-exporter-abc", "namespace", "gpu-operator", "exported_pod", "job-1-worker-0", "exported_namespace", "training"),
			want("Hostname", host, "pod", "dcgm-exporter-abc", "namespace", "gpu-operator", "exported_pod", "job-1-worker-0", "exported_namespace", "training")},
		{"each label on its own", "Hostname",
			gpu("Hostname", host, "namespace", "gpu-operator", "exported_pod", "job-1-worker-0", "exported_namespace", "training"),
			want("Hostname", host, "pod", "job-1-worker-0", "namespace", "gpu-operator", "exported_namespace", "training")},
		{"other exporters' hostname untouched", "Hostname",
			labels.FromStrings("__name__", "node_load1", "hostname", host, "exported_pod", "p"),
			labels.FromStrings("__name__", "node_load1", "hostname", host, "exported_pod", "p")},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := mustRules(t, Config{Preset: PresetDCGM, DCGMHostnameLabel: c.keepHost})
			got, keep := process(t, r, c.in)
			if !keep {
				t.Fatal("series dropped")
			}
			if !labels.Equal(got, c.want) {
				t.Errorf("got %s, want %s", got, c.want)
			}
			wantHost := c.keepHost
			if wantHost == "" {
				wantHost = HostnameOld
			}
			if h, ok := r.DCGM(); !ok || h != wantHost {
				t.Errorf("DCGM() = %q, %v", h, ok)
			}
		})
	}
}

func TestNoRulesIsNil(t *testing.T) {
	r := mustRules(t, Config{DCGMHostnameLabel: "Hostname"})
	if !r.Empty() || r != nil {
		t.Fatalf("no preset and no rules: got %#v, want nil", r)
	}
	ls := labels.FromStrings("__name__", "x", "a", "b")
	if got, keep := process(t, r, ls); !keep || !labels.Equal(got, ls) {
		t.Fatalf("nil rules changed %s to %s (keep %v)", ls, got, keep)
	}
	if _, ok := r.DCGM(); ok {
		t.Fatal("nil rules say the dcgm preset is on")
	}
}

func TestInvalidRulesRejected(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		yaml string
		want string
	}{
		{cfg: Config{Preset: "nvidia"}, want: `ingest_preset "nvidia": unknown preset`},
		{cfg: Config{Preset: PresetDCGM, DCGMHostnameLabel: "host"}, want: `dcgm_hostname_label "host"`},
		{yaml: "- action: replace\n  source_labels: [a]\n", want: "requires 'target_label'"},
		{yaml: "- action: labeldrop\n  source_labels: [a]\n  regex: b\n", want: "labeldrop action requires only 'regex'"},
		{yaml: "- action: hashmod\n  target_label: a\n", want: "non-zero modulus"},
		{yaml: "- action: frobnicate\n", want: "unknown relabel action"},
		{yaml: "- action: keep\n  regex: '('\n", want: "error parsing regexp"},
		{yaml: "- action: keep\n  regexp: a\n", want: "field regexp not found"},
	} {
		cfg := c.cfg
		var err error
		if c.yaml != "" {
			cfg.MetricRelabelConfigs, err = ParseConfigs(c.yaml)
		}
		if err == nil {
			_, err = New(cfg)
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v %q: error %v, want one containing %q", c.cfg, c.yaml, err, c.want)
		}
	}
}

func TestFingerprint(t *testing.T) {
	load := func(preset, host, yaml string) string {
		t.Helper()
		cfgs, err := ParseConfigs(yaml)
		if err != nil {
			t.Fatal(err)
		}
		return mustRules(t, Config{Preset: preset, DCGMHostnameLabel: host, MetricRelabelConfigs: cfgs}).Fingerprint()
	}
	const rules = "- action: labeldrop\n  regex: pci_bus_id\n"
	a := load(PresetDCGM, "Hostname", rules)
	if b := load(PresetDCGM, "Hostname", rules); a != b {
		t.Error("the same rules loaded twice have different fingerprints")
	}
	for _, other := range []string{load("", "Hostname", rules), load(PresetDCGM, "hostname", rules), load(PresetDCGM, "Hostname", "- action: labeldrop\n  regex: device\n")} {
		if other == a {
			t.Error("different rules have the same fingerprint")
		}
	}
}

// dcgm-exporter 4.9's default metrics are stored under the names earlier
// exporters gave them, without either name of the driver label, and every
// unit change has its conversion (issue 39 item 3).
func TestDCGMPreset49(t *testing.T) {
	r := mustRules(t, Config{Preset: PresetDCGM, DCGMHostnameLabel: HostnameOld})
	in := labels.FromStrings("__name__", "DCGM_FI_DEV_SM_CLOCK_HERTZ", "UUID", "GPU-1", "gpu", "0", "hostname", "gpu-node-001", "DCGM_FI_SYSTEM_DRIVER_VERSION", "590.48.01")
	got, keep := process(t, r, in)
	want := labels.FromStrings("__name__", "DCGM_FI_DEV_SM_CLOCK", "UUID", "GPU-1", "gpu", "0", "Hostname", "gpu-node-001")
	if !keep || !labels.Equal(got, want) {
		t.Errorf("got %s (keep %v), want %s", got, keep, want)
	}
	seen, canonical := map[string]bool{}, map[string]bool{}
	for _, m := range Metrics49 {
		if seen[m.Name] || canonical[m.Canonical] {
			t.Errorf("%s → %s listed twice", m.Name, m.Canonical)
		}
		seen[m.Name], canonical[m.Canonical] = true, true
		got, _ := process(t, r, labels.FromStrings("__name__", m.Name, "UUID", "GPU-1"))
		if name := got.Get("__name__"); name != m.Canonical {
			t.Errorf("%s stored as %s, want %s", m.Name, name, m.Canonical)
		}
		mul, div, ok := DCGMUnitScale(m.Name)
		if ok != (m.Mul != 1 || m.Div != 1) || (ok && (mul != m.Mul || div != m.Div)) {
			t.Errorf("DCGMUnitScale(%s) = %v, %v, %v", m.Name, mul, div, ok)
		}
		if _, _, ok := DCGMUnitScale(m.Canonical); ok {
			t.Errorf("the canonical %s would be converted", m.Canonical)
		}
	}
	for name, want := range map[string]float64{
		"DCGM_FI_DEV_SM_CLOCK_HERTZ":          1980,  // 1980000000 Hz
		"DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL": 1.5e9, // 1.5e6 J in mJ
		"DCGM_FI_DEV_GPU_UTIL_RATIO":          37,    // 0.37
		"DCGM_FI_DEV_FB_USED_BYTES":           81559, // MiB
	} {
		in := map[string]float64{"DCGM_FI_DEV_SM_CLOCK_HERTZ": 1980e6, "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL": 1.5e6, "DCGM_FI_DEV_GPU_UTIL_RATIO": 0.37, "DCGM_FI_DEV_FB_USED_BYTES": 81559 << 20}[name]
		mul, div, _ := DCGMUnitScale(name)
		if got := in * mul / div; got != want {
			t.Errorf("%s: %v converts to %v, want %v exactly", name, in, got, want)
		}
	}
}
