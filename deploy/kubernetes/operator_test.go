package kubernetes

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/common/promslog"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"
)

const operatorComponent = "components/prometheus-operator"

// Without the Prometheus Operator's CRDs, `kubectl apply -k` of an overlay
// fails on any object of its kinds: the overlays render none, and the
// Operator's objects come only with the opt-in component, where the
// PodMonitor scrapes every pod and the PrometheusRules carry every
// self-monitoring rule file, all in the namespace.
func TestOperatorKindsOptIn(t *testing.T) {
	for _, tc := range overlayCases {
		t.Run(filepath.Base(tc.overlay), func(t *testing.T) {
			for _, obj := range render(t, tc.overlay).all {
				if gvk := obj.GetObjectKind().GroupVersionKind(); gvk.Group == "monitoring.coreos.com" {
					t.Errorf("%s renders a %s: apply fails without the Prometheus Operator's CRDs; move it to %s", tc.overlay, gvk, operatorComponent)
				}
			}
			o := renderWith(t, tc.overlay, "components: [$HERE/"+operatorComponent+"]\n")
			checkNamespaces(t, o)
			checkPodMonitor(t, o)
			checkPrometheusRules(t, o)
		})
	}
}

// checkPrometheusRules checks that there is one PrometheusRule per
// self-monitoring rule file, with the file's groups: the rules parse with
// Prometheus' rulefmt and have the file's group and alert names.
func checkPrometheusRules(t *testing.T, o *objects) {
	t.Helper()
	files, _ := filepath.Glob(SelfRulesGlob)
	if len(files) == 0 || len(o.promRules) != len(files) {
		t.Fatalf("%d PrometheusRules for the %d files %s", len(o.promRules), len(files), SelfRulesGlob)
	}
	for i, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		want := parseRules(t, f, src)
		spec, err := yaml.Marshal(o.promRules[i].Spec)
		if err != nil {
			t.Fatal(err)
		}
		got := parseRules(t, "PrometheusRule "+o.promRules[i].Name, spec)
		g, w := ruleNames(got), ruleNames(want)
		for j := range max(len(g), len(w)) {
			if j >= len(g) || j >= len(w) || g[j] != w[j] {
				t.Errorf("PrometheusRule %s differs from %s at rule %d (%d rules, file %d): run `make manifests`", o.promRules[i].Name, f, j, len(g), len(w))
				break
			}
		}
	}
}

func parseRules(t *testing.T, what string, b []byte) *rulefmt.RuleGroups {
	t.Helper()
	rgs, errs := rulefmt.Parse(b, false, model.UTF8Validation, parser.NewParser(parser.Options{}), promslog.NewNopLogger())
	for _, e := range errs {
		t.Errorf("%s: %v", what, e)
	}
	if rgs == nil || len(rgs.Groups) == 0 {
		t.Fatalf("%s: no rule groups", what)
	}
	return rgs
}

// ruleNames lists group/alert (or group/record) with each rule's expression
// and for, in order.
func ruleNames(rgs *rulefmt.RuleGroups) []string {
	var n []string
	for _, g := range rgs.Groups {
		for _, r := range g.Rules {
			n = append(n, g.Name+"/"+r.Alert+r.Record+" "+r.Expr+" for "+r.For.String())
		}
	}
	return n
}

// The component's PrometheusRules are generated from deploy/rules/self: a
// rule file changed without `make manifests` fails here.
func TestPrometheusRulesGenerated(t *testing.T) {
	want, err := PrometheusRules(SelfRulesGlob)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(PrometheusRulesFile)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Errorf("%s is stale: run `make manifests` (go generate ./deploy/kubernetes)", PrometheusRulesFile)
	}
}
