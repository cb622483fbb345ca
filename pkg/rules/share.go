package rules

import (
	"fmt"
	"log/slog"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/rules"
)

// What a tenant's rules cost, and what they share.
//
// Prometheus' rules.Manager builds each rule's labels and each alerting
// rule's annotations with labels.FromMap. In the dedupelabels build (the one
// gpustore ships, for its TSDB heads) every such set gets a symbol table of
// its own, made for 1,024 names: ~70 KiB for a set of two labels. The GPU
// pack's rules (a label set each, annotations too for an alert) thus cost
// a tenant 13-14 MiB, 14 GiB for 1,000 GPU tenants, almost all of it empty
// tables; 1.0 MiB with what follows (TestGPUTenantCost).
//
// So each tenant's rules keep their labels and annotations in one symbol
// table of the tenant's (ruleLabels, below), and every tenant's copy of
// the pack shares the pack's parsed expressions (packExprs). The table
// stays the tenant's own, not one for every tenant: Prometheus builds each
// alert's series labels (ALERTS, ALERTS_FOR_STATE) on the rule's labels, so
// the strings of a tenant's alerts (hosts, GPUs, pods) go into its rules'
// table and stay there, as they do in Prometheus, and must go with the
// tenant's, not pile up in a table of the process.

// ruleLabels is a rules.RuleDependencyController that, before Prometheus'
// own dependency analysis, rebuilds each rule the manager has just built
// with its labels and annotations in the tenant's one symbol table. The
// manager offers no other way in: LoadGroups makes the rules (FromMap)
// and passes the group's slice of them here before it makes the group of
// that slice, so the group runs the rebuilt rules and the first ones are
// garbage at once. TestGPUTenantCost fails if a Prometheus upgrade stops
// passing the group's own slice.
type ruleLabels struct {
	syms *labels.SymbolTable
	// What the manager's LoadGroups gives every alerting rule: the
	// tenant's external labels and the external URL (Ruler.load passes the
	// same to Update), and its logger with the alert's name.
	externalLabels labels.Labels
	externalURL    string
	logger         *slog.Logger
	// Prometheus' own analysis, run on the rebuilt rules.
	dependencies rules.RuleDependencyController
}

func newRuleLabels(externalLabels labels.Labels, externalURL string, logger *slog.Logger) *ruleLabels {
	return &ruleLabels{syms: labels.NewSymbolTable(), externalLabels: externalLabels, externalURL: externalURL,
		logger: logger, dependencies: prometheusDependencyAnalysis}
}

// AnalyseRules implements rules.RuleDependencyController.
func (c *ruleLabels) AnalyseRules(rs []rules.Rule) {
	for i, r := range rs {
		switch r := r.(type) {
		case *rules.AlertingRule:
			rs[i] = rules.NewAlertingRule(r.Name(), r.Query(), r.HoldDuration(), r.KeepFiringFor(),
				c.intern(r.Labels()), c.intern(r.Annotations()), c.externalLabels, c.externalURL,
				r.Restored(), c.logger.With("alert", r.Name()))
		case *rules.RecordingRule:
			rs[i] = rules.NewRecordingRule(r.Name(), r.Query(), c.intern(r.Labels()))
		}
	}
	c.dependencies.AnalyseRules(rs)
}

// intern is ls in the tenant's symbol table.
func (c *ruleLabels) intern(ls labels.Labels) labels.Labels {
	b := labels.NewScratchBuilderWithSymbolTable(c.syms, ls.Len())
	ls.Range(func(l labels.Label) { b.Add(l.Name, l.Value) })
	return b.Labels() // ls is sorted, and so is what was added
}

// prometheusDependencyAnalysis is Prometheus' own RuleDependencyController
// (which rules of a group read another's results, for concurrent
// evaluation), whose type is unexported: rules.NewManager fills it into
// the options it is given.
var prometheusDependencyAnalysis = func() rules.RuleDependencyController {
	o := &rules.ManagerOptions{Logger: slog.New(slog.DiscardHandler)}
	rules.NewManager(o)
	return o.RuleDependencyController
}()

// packExprs parses the pack's expressions once, for every tenant's copy of
// the pack to share: the rules only print them (evaluation parses the
// printed text again) and walk them (dependency analysis).
func packExprs(pack []ruleFile, p parser.Parser, logger *slog.Logger) (map[string]parser.Expr, error) {
	out := map[string]parser.Expr{}
	for _, f := range pack {
		rgs, errs := rulefmt.Parse(f.content, false, model.UTF8Validation, p, logger)
		if len(errs) > 0 {
			return nil, fmt.Errorf("%s: %w", f.name, errs[0])
		}
		for _, g := range rgs.Groups {
			for _, r := range g.Rules {
				e, err := p.ParseExpr(r.Expr)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", f.name, err)
				}
				out[r.Expr] = e
			}
		}
	}
	return out, nil
}
