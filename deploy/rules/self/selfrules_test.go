package selfrules

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/common/promslog"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/notifier"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/rules"
	"github.com/prometheus/prometheus/tsdb"
	"gopkg.in/yaml.v3"

	"github.com/gpustore/gpustore/internal/testbin"
	"github.com/gpustore/gpustore/test/gpustoretest"
)

func ruleFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("gpustore-*.yml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no gpustore-*.yml rule files (%v)", err)
	}
	return files
}

func parseFiles(t *testing.T) map[string]*rulefmt.RuleGroups {
	t.Helper()
	p := parser.NewParser(parser.Options{})
	out := map[string]*rulefmt.RuleGroups{}
	for _, f := range ruleFiles(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		groups, errs := rulefmt.Parse(b, false, model.UTF8Validation, p, promslog.NewNopLogger())
		for _, e := range errs {
			t.Errorf("%s: %v", f, e)
		}
		if groups == nil || len(groups.Groups) == 0 {
			t.Fatalf("%s: no rule groups", f)
		}
		out[f] = groups
	}
	return out
}

var (
	severityOf = map[string]string{"P0": "critical", "P1": "warning", "P2": "info"}
	components = []string{"ingest", "ha", "ring", "tsdb", "shipper", "objstore", "bucketstore", "compactor", "ruler", "query", "resources"}
)

// Every alert follows the GPU pack's label scheme, so one Alertmanager
// routing tree serves both, and says what it means and what to do.
func TestAlertLabelsAndAnnotations(t *testing.T) {
	names := map[string]bool{}
	for f, groups := range parseFiles(t) {
		for _, g := range groups.Groups {
			for _, r := range g.Rules {
				if r.Alert == "" {
					t.Errorf("%s: group %s has a recording rule %s: self-monitoring holds alerts only", f, g.Name, r.Record)
					continue
				}
				if names[r.Alert] {
					t.Errorf("%s: alert %s defined twice", f, r.Alert)
				}
				names[r.Alert] = true
				if !strings.HasPrefix(r.Alert, "Gpustore") {
					t.Errorf("%s: alert %s: name must start with Gpustore", f, r.Alert)
				}
				sev, ok := severityOf[r.Labels["priority"]]
				if !ok || r.Labels["severity"] != sev {
					t.Errorf("%s: %s: priority %q with severity %q, want P0/critical, P1/warning or P2/info", f, r.Alert, r.Labels["priority"], r.Labels["severity"])
				}
				if r.Labels["category"] != "gpustore" {
					t.Errorf("%s: %s: category %q, want gpustore", f, r.Alert, r.Labels["category"])
				}
				if !slices.Contains(components, r.Labels["component"]) {
					t.Errorf("%s: %s: component %q, want one of %v", f, r.Alert, r.Labels["component"], components)
				}
				if r.Annotations["summary"] == "" || !strings.Contains(r.Annotations["description"], "Action:") {
					t.Errorf("%s: %s: needs a summary and a description with an Action:", f, r.Alert)
				}
			}
		}
	}
}

// unitTestFile is the part of promtool's unit test format this test reads.
type unitTestFile struct {
	RuleFiles []string `yaml:"rule_files"`
	Tests     []struct {
		AlertTest []struct {
			Alertname string `yaml:"alertname"`
			ExpAlerts []any  `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	} `yaml:"tests"`
}

func testFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("tests", "*.test.yml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no promtool unit tests in tests/ (%v)", err)
	}
	return files
}

// Every alert has a promtool unit test where it fires and one where it stays
// silent, and every rule file is covered by a test file.
func TestEveryAlertHasPositiveAndNegativeTests(t *testing.T) {
	alerts := map[string]bool{}
	for _, groups := range parseFiles(t) {
		for _, g := range groups.Groups {
			for _, r := range g.Rules {
				alerts[r.Alert] = true
			}
		}
	}
	firing, silent, covered := map[string]bool{}, map[string]bool{}, map[string]bool{}
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
			covered[filepath.Clean(filepath.Join(filepath.Dir(f), rf))] = true
		}
		for _, tc := range u.Tests {
			for _, a := range tc.AlertTest {
				if len(a.ExpAlerts) > 0 {
					firing[a.Alertname] = true
				} else {
					silent[a.Alertname] = true
				}
			}
		}
	}
	for _, f := range ruleFiles(t) {
		if !covered[f] {
			t.Errorf("%s is not in the rule_files of any test in tests/", f)
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

func TestPromtoolCheckRules(t *testing.T) {
	runPromtool(t, append([]string{"check", "rules", "--lint=all", "--lint-fatal"}, ruleFiles(t)...)...)
}

func TestPromtoolTestRules(t *testing.T) {
	runPromtool(t, append([]string{"test", "rules"}, testFiles(t)...)...)
}

// gpustoreMetricNames returns the gpustore_* names written as string literals
// in gpustore's non-test Go code: where every one of its metrics is declared.
func gpustoreMetricNames(t *testing.T) map[string]bool {
	t.Helper()
	lit := regexp.MustCompile(`"(gpustore_[a-z0-9_]+)"`)
	names := map[string]bool{}
	for _, root := range []string{"../../../pkg", "../../../cmd"} {
		err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range lit.FindAllSubmatch(b, -1) {
				names[string(m[1])] = true
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return names
}

// descRecorder records the name of every metric a collector describes, so
// vectors count before they have a child.
type descRecorder struct{ names map[string]bool }

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (r *descRecorder) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			r.names[m[1]] = true
		}
	}
	return nil
}

func (r *descRecorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = r.Register(c)
	}
}
func (r *descRecorder) Unregister(prometheus.Collector) bool { return true }

// prometheusMetricNames returns the names that the Prometheus components
// gpustore runs per tenant register: the TSDB (with its WAL), the rule
// manager and the notifier.
func prometheusMetricNames(t *testing.T) map[string]bool {
	t.Helper()
	rec := &descRecorder{names: map[string]bool{}}
	db, err := tsdb.Open(t.TempDir(), promslog.NewNopLogger(), rec, tsdb.DefaultOptions(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rules.NewGroupMetrics(rec)
	n := notifier.NewManager(&notifier.Options{Registerer: rec}, model.UTF8Validation, promslog.NewNopLogger())
	defer n.Stop()
	return rec.names
}

// Every metric an alert reads exists: gpustore's own are declared in its
// code, Prometheus' are registered by the Prometheus components gpustore
// runs, and every other one (Go runtime, process, dskit ring, objstore) is
// registered by a running gpustore with every role and the ring. An alert
// on a misspelt or renamed metric would never fire.
func TestAlertsUseExistingMetrics(t *testing.T) {
	own, prom := gpustoreMetricNames(t), prometheusMetricNames(t)
	running := gpustoretest.MetricNames(gpustoretest.Start(t, gpustoretest.Ring))
	known := map[string]bool{"up": true}
	for _, groups := range parseFiles(t) {
		for _, g := range groups.Groups {
			for _, r := range g.Rules {
				expr, err := parser.NewParser(parser.Options{}).ParseExpr(r.Expr)
				if err != nil {
					t.Fatalf("%s: %v", r.Alert, err)
				}
				for _, sel := range parser.ExtractSelectors(expr) {
					for _, m := range sel {
						if m.Name != model.MetricNameLabel {
							continue
						}
						name := m.Value
						switch {
						case known[name], own[name], prom[name], running[name]:
						case strings.HasPrefix(name, "gpustore_"):
							t.Errorf("%s reads %s, which no gpustore code declares", r.Alert, name)
						default:
							t.Errorf("%s reads %s, which neither a running gpustore nor the Prometheus TSDB, rule manager or notifier registers", r.Alert, name)
						}
					}
				}
			}
		}
	}
}

// runbookBase is where every alert's runbook_url points: its section of
// docs/runbook.md, on GitHub so that Alertmanager's and Grafana's links open.
const runbookBase = "https://github.com/gpustore/gpustore/blob/main/docs/runbook.md#"

// Every alert links its own section of docs/runbook.md, and the runbook has
// a section for every alert and none for an alert that does not exist.
func TestRunbookSections(t *testing.T) {
	b, err := os.ReadFile("../../../docs/runbook.md")
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string]bool{}
	for _, l := range strings.Split(string(b), "\n") {
		if name, ok := strings.CutPrefix(l, "### "); ok && strings.HasPrefix(name, "Gpustore") {
			sections[name] = true
		}
	}
	alerts := map[string]bool{}
	for f, groups := range parseFiles(t) {
		for _, g := range groups.Groups {
			for _, r := range g.Rules {
				alerts[r.Alert] = true
				// GitHub's anchor of a heading is its text in lower case.
				if want := runbookBase + strings.ToLower(r.Alert); r.Annotations["runbook_url"] != want {
					t.Errorf("%s: %s: runbook_url %q, want %q", f, r.Alert, r.Annotations["runbook_url"], want)
				}
				if !sections[r.Alert] {
					t.Errorf("docs/runbook.md has no section \"### %s\"", r.Alert)
				}
			}
		}
	}
	for s := range sections {
		if !alerts[s] {
			t.Errorf("docs/runbook.md has a section for %s, which is no alert", s)
		}
	}
}
