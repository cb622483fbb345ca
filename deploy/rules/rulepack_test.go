package rulepack

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/common/promslog"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"gopkg.in/yaml.v3"

	"github.com/gpustore/gpustore/internal/testbin"
)

// Files lists exactly the rule files of this folder, sorted, and the tests
// folder is not part of the pack.
func TestFilesMatchFolder(t *testing.T) {
	onDisk, err := filepath.Glob("*.yml")
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(onDisk)
	got := Files()
	if !slices.Equal(got, onDisk) {
		t.Fatalf("Files() = %v, folder has %v", got, onDisk)
	}
	for _, want := range []string{"gpu-alerts.yml", "gpu-recording.yml", "node-alerts.yml", "training-alerts.yml", "xid-catalog.yml"} {
		if !slices.Contains(got, want) {
			t.Errorf("Files() lacks %s", want)
		}
	}
	for _, f := range got {
		if strings.Contains(f, "/") {
			t.Errorf("Files() returned a nested path %q", f)
		}
	}
}

// parsePack parses every embedded rule file the way Prometheus' rule manager
// does (UTF-8 names, default PromQL parser, unknown fields rejected).
func parsePack(t *testing.T) map[string]*rulefmt.RuleGroups {
	t.Helper()
	p := parser.NewParser(parser.Options{})
	out := map[string]*rulefmt.RuleGroups{}
	for _, name := range Files() {
		b, err := fs.ReadFile(FS, name)
		if err != nil {
			t.Fatalf("read %s: %v", name, err)
		}
		groups, errs := rulefmt.Parse(b, false, model.UTF8Validation, p, promslog.NewNopLogger())
		for _, e := range errs {
			t.Errorf("%s: %v", name, e)
		}
		if groups == nil || len(groups.Groups) == 0 {
			t.Errorf("%s: no rule groups", name)
			continue
		}
		out[name] = groups
	}
	return out
}

func TestRuleFilesParse(t *testing.T) {
	parsePack(t)
}

var priorityOf = map[string]string{"critical": "P0", "warning": "P1", "info": "P2"}

// priorityFromExpr lists the alerts whose priority and severity depend on
// the value: GPUXidError takes them from the catalogue join,
// GPURecoveryActionRequired from the action (DCGM's health check fails a GPU
// on a reset or reboot, warns on a P2P drain).
var priorityFromExpr = map[string]bool{"GPUXidError": true, "GPURecoveryActionRequired": true}

// Every alert states its priority and severity consistently, names its
// category and has summary and description; the alerts of priorityFromExpr
// set priority and severity in their expression instead, so they must not
// hard-code them.
func TestAlertLabelsAndAnnotations(t *testing.T) {
	for file, groups := range parsePack(t) {
		for _, g := range groups.Groups {
			for _, r := range g.Rules {
				if r.Alert == "" {
					continue
				}
				if r.Labels["category"] == "" {
					t.Errorf("%s %s: no category label", file, r.Alert)
				}
				if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
					t.Errorf("%s %s: summary and description are required", file, r.Alert)
				}
				if !strings.Contains(r.Annotations["description"], "Action:") {
					t.Errorf("%s %s: description gives no action", file, r.Alert)
				}
				if priorityFromExpr[r.Alert] {
					if _, ok := r.Labels["severity"]; ok {
						t.Errorf("%s %s: severity must come from the expression", file, r.Alert)
					}
					if !strings.Contains(r.Expr, `"priority"`) || !strings.Contains(r.Expr, `"severity"`) {
						t.Errorf("%s %s: the expression sets no priority and severity", file, r.Alert)
					}
					continue
				}
				sev, prio := r.Labels["severity"], r.Labels["priority"]
				if want, ok := priorityOf[sev]; !ok || prio != want {
					t.Errorf("%s %s: severity %q with priority %q breaks the P0=critical, P1=warning, P2=info scheme", file, r.Alert, sev, prio)
				}
			}
		}
	}
}

// unitTestFile is the part of promtool's unit test format this test reads.
type unitTestFile struct {
	RuleFiles []string `yaml:"rule_files"`
	Tests     []struct {
		Name      string `yaml:"name"`
		AlertTest []struct {
			Alertname string `yaml:"alertname"`
			ExpAlerts []any  `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
		ExprTest []struct {
			Expr       string `yaml:"expr"`
			ExpSamples []any  `yaml:"exp_samples"`
		} `yaml:"promql_expr_test"`
	} `yaml:"tests"`
}

func testFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("tests", "*.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no promtool unit tests in tests/")
	}
	return files
}

// Every alert has a unit test where it fires and one where it does not, and
// every recorded series has a test with output and one without, so a rule
// cannot be shipped untested or tested only on its happy path.
func TestEveryRuleHasPositiveAndNegativeTests(t *testing.T) {
	alerts, records := map[string]bool{}, map[string]bool{}
	for _, groups := range parsePack(t) {
		for _, g := range groups.Groups {
			for _, r := range g.Rules {
				if r.Alert != "" {
					alerts[r.Alert] = true
				} else {
					records[r.Record] = true
				}
			}
		}
	}
	firing, silent := map[string]bool{}, map[string]bool{}
	output, empty := map[string]bool{}, map[string]bool{}
	for _, f := range testFiles(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var u unitTestFile
		if err := yaml.Unmarshal(b, &u); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, rf := range u.RuleFiles {
			if _, err := os.Stat(filepath.Join(filepath.Dir(f), rf)); err != nil {
				t.Errorf("%s: rule file %s: %v", f, rf, err)
			}
		}
		for _, tc := range u.Tests {
			for _, a := range tc.AlertTest {
				if len(a.ExpAlerts) > 0 {
					firing[a.Alertname] = true
				} else {
					silent[a.Alertname] = true
				}
			}
			for _, e := range tc.ExprTest {
				for rec := range records {
					if !regexp.MustCompile(`(^|[^a-zA-Z0-9_:])` + regexp.QuoteMeta(rec) + `($|[^a-zA-Z0-9_:])`).MatchString(e.Expr) {
						continue
					}
					if len(e.ExpSamples) > 0 {
						output[rec] = true
					} else {
						empty[rec] = true
					}
				}
			}
		}
	}
	for a := range alerts {
		if !firing[a] {
			t.Errorf("alert %s has no unit test where it fires", a)
		}
		if !silent[a] {
			t.Errorf("alert %s has no unit test where it stays silent", a)
		}
	}
	for r := range records {
		if !output[r] {
			t.Errorf("recording rule %s has no unit test with output", r)
		}
		if !empty[r] {
			t.Errorf("recording rule %s has no unit test without output", r)
		}
	}
}

func runPromtool(t *testing.T, args ...string) {
	t.Helper()
	bin := testbin.Need(t, "promtool")
	cmd := exec.Command(bin, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	t.Logf("promtool %s:\n%s", strings.Join(args, " "), out.String())
}

// The real promtool accepts every rule file, with duplicate rules fatal.
func TestPromtoolCheckRules(t *testing.T) {
	runPromtool(t, append([]string{"check", "rules", "--lint=all", "--lint-fatal"}, Files()...)...)
}

// The real promtool runs the unit tests in tests/.
func TestPromtoolTestRules(t *testing.T) {
	runPromtool(t, append([]string{"test", "rules"}, testFiles(t)...)...)
}
