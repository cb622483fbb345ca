package downsample

import (
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/promql/parser/posrange"
)

// Rewrite makes count_over_time and avg_over_time exact over downsampled
// data. The engine counts and averages the points it is given, and a
// downsampled series has one point per window, so the functions are
// expressed through sums of explicit views, which NewQuerier (and
// NewRawQuerier, for raw sources of the same query) serve:
//
//	count_over_time(x[r]) → sum_over_time(x{__gpustore_aggr__="count"}[r])
//	avg_over_time(x[r])   → (sum_over_time(x{…="sum"}[r]) / sum_over_time(x{…="count"}[r]))
//
// Over raw data both forms give the same answer. Only range selectors are
// rewritten: over a subquery the functions already count and average the
// subquery's own points. Rewrite reports whether it changed anything; it
// modifies expr in place.
func Rewrite(expr parser.Expr) (parser.Expr, bool) {
	changed := false
	var walk func(e parser.Expr) parser.Expr
	walk = func(e parser.Expr) parser.Expr {
		switch n := e.(type) {
		case *parser.AggregateExpr:
			n.Expr = walk(n.Expr)
			if n.Param != nil {
				n.Param = walk(n.Param)
			}
		case *parser.BinaryExpr:
			n.LHS, n.RHS = walk(n.LHS), walk(n.RHS)
		case *parser.ParenExpr:
			n.Expr = walk(n.Expr)
		case *parser.UnaryExpr:
			n.Expr = walk(n.Expr)
		case *parser.SubqueryExpr:
			n.Expr = walk(n.Expr)
		case *parser.StepInvariantExpr:
			n.Expr = walk(n.Expr)
		case *parser.Call:
			for i, a := range n.Args {
				n.Args[i] = walk(a)
			}
			if len(n.Args) != 1 {
				break
			}
			ms, ok := n.Args[0].(*parser.MatrixSelector)
			if !ok {
				break
			}
			switch n.Func.Name {
			case "count_over_time":
				changed = true
				return sumOverTime(ms, ViewCount, n.PosRange)
			case "avg_over_time":
				changed = true
				return &parser.ParenExpr{Expr: &parser.BinaryExpr{
					Op:             parser.DIV,
					LHS:            sumOverTime(ms, ViewSum, n.PosRange),
					RHS:            sumOverTime(ms, ViewCount, n.PosRange),
					VectorMatching: &parser.VectorMatching{Card: parser.CardOneToOne},
				}, PosRange: n.PosRange}
			}
		}
		return e
	}
	return walk(expr), changed
}

// sumOverTime is sum_over_time over a copy of ms that reads view v.
func sumOverTime(ms *parser.MatrixSelector, v View, pos posrange.PositionRange) parser.Expr {
	vs := *ms.VectorSelector.(*parser.VectorSelector)
	vs.LabelMatchers = append(append([]*labels.Matcher{}, vs.LabelMatchers...),
		labels.MustNewMatcher(labels.MatchEqual, AggrLabel, string(v)))
	m := *ms
	m.VectorSelector = &vs
	return &parser.Call{Func: parser.Functions["sum_over_time"], Args: parser.Expressions{&m}, PosRange: pos}
}

// Prepared is what the bucket store needs to know of a query, from Prepare.
type Prepared struct {
	// Query is the query to run: Rewrite's, when Rewritten.
	Query     string
	Rewritten bool
	// Labels are the label names it uses (LabelsNamed), which decide
	// whether downsampled data whose series were folded (Fold) can answer.
	Labels []string
	// AtSteps: every selector is evaluated at the request's steps only (no
	// subquery, no @ modifier), so a select's hints say which times it reads
	// (see readopts.ReadOptions.AtSteps).
	AtSteps bool
}

// Prepare parses a query for the bucket store.
func Prepare(qs string) (Prepared, error) {
	expr, err := parser.NewParser(parser.Options{}).ParseExpr(qs)
	if err != nil {
		return Prepared{Query: qs}, err
	}
	p := Prepared{Query: qs, Labels: LabelsNamed(expr), AtSteps: true}
	parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
		switch n := node.(type) {
		case *parser.SubqueryExpr:
			p.AtSteps = false
		case *parser.VectorSelector:
			if n.Timestamp != nil || n.StartOrEnd != 0 {
				p.AtSteps = false
			}
		}
		return nil
	})
	if expr, p.Rewritten = Rewrite(expr); p.Rewritten {
		p.Query = expr.String()
	}
	return p, nil
}

// LabelsNamed lists the label names a query depends on besides the metric
// name: in its selectors' matchers, `by` groupings, vector matching (on,
// group_left/right) and the label arguments of label_replace, label_join and
// sort_by_label. A query that names none of the labels downsampling folded
// gets the same series from folded data as from raw data without them.
func LabelsNamed(expr parser.Expr) []string {
	seen := map[string]bool{}
	var out []string
	add := func(names ...string) {
		for _, n := range names {
			if n != model.MetricNameLabel && n != AggrLabel && !seen[n] {
				seen[n] = true
				out = append(out, n)
			}
		}
	}
	parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
		switch n := node.(type) {
		case *parser.VectorSelector:
			for _, m := range n.LabelMatchers {
				add(m.Name)
			}
		case *parser.AggregateExpr:
			if !n.Without {
				add(n.Grouping...)
			}
		case *parser.BinaryExpr:
			if vm := n.VectorMatching; vm != nil {
				if vm.On {
					add(vm.MatchingLabels...)
				}
				add(vm.Include...)
			}
		case *parser.Call:
			var args parser.Expressions // the arguments that are label names
			switch n.Func.Name {
			case "label_replace": // (v, dst, replacement, src, regex)
				args = parser.Expressions{n.Args[1], n.Args[3]}
			case "label_join": // (v, dst, separator, src...)
				args = append(parser.Expressions{n.Args[1]}, n.Args[3:]...)
			case "sort_by_label", "sort_by_label_desc": // (v, label...)
				args = n.Args[1:]
			}
			for _, a := range args {
				if s, ok := a.(*parser.StringLiteral); ok {
					add(s.Val)
				}
			}
		}
		return nil
	})
	return out
}
