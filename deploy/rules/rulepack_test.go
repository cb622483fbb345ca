package rulepack

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	amconfig "github.com/prometheus/alertmanager/config"
	amlabels "github.com/prometheus/alertmanager/pkg/labels"
	"github.com/prometheus/common/model"
	"github.com/prometheus/common/promslog"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"gopkg.in/yaml.v3"

	"github.com/gpustore/gpustore/internal/testbin"
	"github.com/gpustore/gpustore/pkg/rules/xid"
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

var severityOf = map[string]string{"P0": "critical", "P1": "warning", "P2": "info"}

// priorityFromExpr lists the alerts whose priority and severity depend on
// the value: GPUXidError takes them from the catalogue join,
// GPURecoveryActionRequired from the action (DCGM's health check fails a GPU
// on a reset or reboot, warns on a P2P drain).
var priorityFromExpr = map[string]bool{"GPUXidError": true, "GPURecoveryActionRequired": true, "DCGMExporterDown": true}

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

// notificationsFile is the expected notifications per fault class: the
// contract of the simulated-day end-to-end test (issue 31).
const notificationsFile = "testdata/notifications.yaml"

type expectedAlert struct {
	Alertname string `yaml:"alertname"`
	Priority  string `yaml:"priority"`
	Scope     string `yaml:"scope"`
	Xid       string `yaml:"xid"`
	Reason    string `yaml:"reason"`
	Counter   string `yaml:"counter"`
}

// labels gives the alert the labels of its scope, as the pack's alerts
// carry them, with the sender's cluster and gpustore's tenant.
func (a expectedAlert) labels() model.LabelSet {
	l := model.LabelSet{"alertname": model.LabelValue(a.Alertname), "priority": model.LabelValue(a.Priority),
		"severity": model.LabelValue(severityOf[a.Priority]),
		"cluster":  "gpu-cluster-prod-01", "tenant": "gpu-prod"}
	switch a.Scope {
	case "gpu", "node_gpus":
		l["node"], l["UUID"], l["gpu"] = "gpu-node-01", "GPU-3f1c2a9e-8b7d-4e61-a0c5-1d2e3f4a5b60", "0"
	case "node":
		l["node"] = "gpu-node-01"
	case "pod":
		l["namespace"], l["pod"] = "training", "llm-pretrain-worker-0"
	}
	for k, v := range map[string]string{"xid": a.Xid, "reason": a.Reason, "counter": a.Counter} {
		if v != "" {
			l[model.LabelName(k)] = model.LabelValue(v)
		}
	}
	return l
}

type faultClass struct {
	Fault         string          `yaml:"fault"`
	What          string          `yaml:"what"`
	Notifications int             `yaml:"notifications"`
	Notify        []expectedAlert `yaml:"notify"`
	Inhibited     []expectedAlert `yaml:"inhibited"`
	Silent        []string        `yaml:"silent"`
}

// The expected notifications name alerts of the pack with the priority the
// pack gives them, and every alert they list as inhibited is muted by an
// inhibit rule of the shipped Alertmanager config whose source is one of the
// same fault's notifications (and is not muted itself).
func TestExpectedNotificationsMatchPackAndInhibition(t *testing.T) {
	b, err := os.ReadFile(notificationsFile)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Classes []faultClass `yaml:"classes"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("%s: %v", notificationsFile, err)
	}
	priorities := map[string]string{}
	for _, groups := range parsePack(t) {
		for _, g := range groups.Groups {
			for _, r := range g.Rules {
				if r.Alert != "" {
					priorities[r.Alert] = r.Labels["priority"]
				}
			}
		}
	}
	am, err := amconfig.LoadFile(filepath.Join("..", "compose", "alertmanager", "alertmanager.yml"))
	if err != nil {
		t.Fatal(err)
	}
	mutedBy := func(target expectedAlert, sources []expectedAlert) bool {
		tl := target.labels()
		for _, r := range am.InhibitRules {
			if !amlabels.Matchers(r.TargetMatchers).Matches(tl) {
				continue
			}
			// As Alertmanager's inhibitor: an alert matching both sides
			// is not muted by sources that match both sides too.
			twoSided := amlabels.Matchers(r.SourceMatchers).Matches(tl)
			for _, s := range sources {
				sl := s.labels()
				if !amlabels.Matchers(r.SourceMatchers).Matches(sl) || (twoSided && amlabels.Matchers(r.TargetMatchers).Matches(sl)) {
					continue
				}
				equal := true
				for _, l := range r.Equal {
					equal = equal && sl[model.LabelName(l)] == tl[model.LabelName(l)]
				}
				if equal {
					return true
				}
			}
		}
		return false
	}
	if len(doc.Classes) < 20 {
		t.Fatalf("%d fault classes: the file is not the contract", len(doc.Classes))
	}
	for _, c := range doc.Classes {
		if c.What == "" || len(c.Notify)+len(c.Silent) == 0 {
			t.Errorf("%s: no description, or neither notifications nor silent alerts", c.Fault)
		}
		if c.Notifications < 0 || c.Notifications > len(c.Notify) {
			t.Errorf("%s: %d notifications for %d notified alerts", c.Fault, c.Notifications, len(c.Notify))
		}
		for _, a := range append(slices.Clone(c.Notify), c.Inhibited...) {
			static, ok := priorities[a.Alertname]
			switch {
			case !ok:
				t.Errorf("%s: %s is not an alert of the pack", c.Fault, a.Alertname)
			case a.Alertname == "GPUXidError" && a.Xid == "154":
				// Ranked by the recovery action it announces, not by the catalogue.
				if _, ok := severityOf[a.Priority]; !ok {
					t.Errorf("%s: Xid 154 with priority %q", c.Fault, a.Priority)
				}
			case a.Alertname == "GPUXidError":
				want := string(xid.UnknownPriority)
				if code, err := strconv.Atoi(a.Xid); err == nil {
					if e, ok := xid.Lookup(code); ok {
						want = string(e.Priority)
					}
				}
				if a.Priority != want {
					t.Errorf("%s: Xid %s is paged %s, the fixture says %s", c.Fault, a.Xid, want, a.Priority)
				}
			case priorityFromExpr[a.Alertname]:
				if _, ok := severityOf[a.Priority]; !ok {
					t.Errorf("%s: %s with priority %q", c.Fault, a.Alertname, a.Priority)
				}
			case static != a.Priority:
				t.Errorf("%s: %s is %s in the pack, the fixture says %s", c.Fault, a.Alertname, static, a.Priority)
			}
			if !slices.Contains([]string{"gpu", "node_gpus", "node", "pod"}, a.Scope) {
				t.Errorf("%s: %s has scope %q", c.Fault, a.Alertname, a.Scope)
			}
		}
		for _, a := range c.Notify {
			if mutedBy(a, c.Notify) {
				t.Errorf("%s: %s is listed as a notification but another of the fault's alerts inhibits it", c.Fault, a.Alertname)
			}
		}
		for _, a := range c.Inhibited {
			if !mutedBy(a, c.Notify) {
				t.Errorf("%s: %s is listed as inhibited but no inhibit rule mutes it with this fault's notifications", c.Fault, a.Alertname)
			}
		}
		for _, name := range c.Silent {
			if _, ok := priorities[name]; !ok {
				t.Errorf("%s: silent %s is not an alert of the pack", c.Fault, name)
			}
		}
	}
}
