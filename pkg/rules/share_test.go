package rules

import (
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/rules"
)

// recordingAnalysis records the rules a RuleDependencyController leaves
// in the slices it is given.
type recordingAnalysis struct {
	inner rules.RuleDependencyController
	seen  []rules.Rule
}

func (r *recordingAnalysis) AnalyseRules(rs []rules.Rule) {
	r.inner.AnalyseRules(rs)
	r.seen = append(r.seen, rs...)
}

// TestPackRulesShareOneSymbolTable: the GPU pack loaded with a tenant's
// labels in one symbol table (share.go) and with the expressions parsed
// once for every tenant runs rules equal to those Prometheus' manager
// builds on its own (name, expression, labels, annotations, for,
// keep_firing_for, external labels in the alerts), and the groups run the
// rebuilt rules themselves: the rule manager passes each group's own slice
// of rules to the analysis (what share.go relies on; a Prometheus upgrade
// that stops doing so fails here, and TestGPUTenantCost in pkg/app).
func TestPackRulesShareOneSymbolTable(t *testing.T) {
	pack, err := packFiles()
	if err != nil {
		t.Fatal(err)
	}
	p := parser.NewParser(parser.Options{})
	logger := slog.New(slog.DiscardHandler)
	exprs, err := packExprs(pack, p, logger)
	if err != nil {
		t.Fatal(err)
	}
	ext := labels.FromStrings("region", "eu-1", "tenant", "team-a")
	const url = "https://gpustore.example.com"
	load := func(analysis rules.RuleDependencyController, shared map[string]parser.Expr) *rules.Manager {
		t.Helper()
		loader := &snapshotLoader{parser: p, logger: logger, files: map[string][]byte{}, shared: shared}
		var names []string
		for _, f := range pack {
			loader.files[f.name] = f.content
			names = append(names, f.name)
		}
		m := rules.NewManager(&rules.ManagerOptions{GroupLoader: loader, Parser: p, Logger: logger, RuleDependencyController: analysis})
		if err := m.Update(time.Minute, names, ext, url, nil); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { go m.Run(); m.Stop() })
		return m
	}
	rec := &recordingAnalysis{inner: newRuleLabels(ext, url, logger)}
	all := func(m *rules.Manager) []rules.Rule { // in the groups' order (Rules walks a map)
		var out []rules.Rule
		for _, g := range m.RuleGroups() {
			out = append(out, g.Rules()...)
		}
		return out
	}
	shared := all(load(rec, exprs))
	plain := all(load(nil, nil))
	if len(shared) != len(plain) || len(shared) < 100 {
		t.Fatalf("%d rules with shared labels, %d without", len(shared), len(plain))
	}
	parsedOnce := map[parser.Expr]bool{}
	for _, e := range exprs {
		parsedOnce[e] = true
	}
	for i, r := range shared {
		want := plain[i]
		if r.String() != want.String() || !labels.Equal(r.Labels(), want.Labels()) {
			t.Errorf("rule %d:\n%s\nwant\n%s", i, r.String(), want.String())
		}
		if a, ok := r.(*rules.AlertingRule); ok {
			w := want.(*rules.AlertingRule)
			if !labels.Equal(a.Annotations(), w.Annotations()) || a.HoldDuration() != w.HoldDuration() || a.KeepFiringFor() != w.KeepFiringFor() || a.Restored() != w.Restored() {
				t.Errorf("alerting rule %s differs from Prometheus' own", a.Name())
			}
		}
		if !slices.Contains(rec.seen, r) {
			t.Errorf("rule %s runs as the manager built it, not rebuilt with the tenant's symbol table", r.Name())
		}
		if !parsedOnce[r.Query()] {
			t.Errorf("rule %s parsed its expression again", r.Name())
		}
	}
}
