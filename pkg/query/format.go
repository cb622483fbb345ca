package query

import (
	"fmt"
	"net/http"

	"github.com/prometheus/prometheus/promql/parser"
)

// maxFormatWork bounds what format_query may cost, as an expression's
// depth (its bound before parsing, depthBound) times its length in bytes.
// Prometheus' formatter writes every subtree out again at each level above
// it (Pretty asks each node's String to decide whether it fits a line), so
// its work grows with depth × length, and nothing can stop it once it has
// begun: just inside query.max_expression_depth and
// query.max_expression_bytes (126 levels over a 240 KiB selector) it took
// 2-4 s, where an instant query of the same text parses in well under a
// second (TestFormatQueryWorkBounded). 2 Mi level-bytes is 8 levels of the
// longest expression, or 50 of a panel with a variable expanded to 1,024
// GPU UUIDs (41 KiB), whose real depth is 5 or so; at the bound the
// formatter's slowest shape (many matchers) took 0.2-0.3 s.
const maxFormatWork = 2 << 20

// formatQuery answers /api/v1/format_query as Prometheus' handler does (the
// expression as PromQL's formatter writes it, errors as 400 bad_data), in
// front of its formatter's cost: past maxFormatWork it answers 400, and a
// client that left while the expression was parsed is not formatted for.
// Admission has bounded the expression's length and depth and given the
// request a slot before this runs.
func formatQuery(maxDepth int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodPost {
			w.Header().Set("Allow", "GET, POST")
			http.Error(w, http.StatusText(http.StatusMethodNotAllowed), http.StatusMethodNotAllowed)
			return
		}
		q := r.FormValue("query")
		if depth := depthBound(q, maxDepth); depth*len(q) > maxFormatWork {
			writeError(w, http.StatusBadRequest, "bad_data", fmt.Errorf("%w: format_query formats at most %d level-bytes (an expression's depth times its length: the formatter writes each subtree again at every level above it), and this one is up to %d levels deep and %d bytes long", errExpressionBounds, maxFormatWork, depth, len(q)))
			return
		}
		expr, err := parser.NewParser(parser.Options{}).ParseExpr(q)
		if err != nil {
			writeError(w, http.StatusBadRequest, "bad_data", fmt.Errorf("invalid parameter %q: %w", "query", err))
			return
		}
		if clientLeft(w, r) {
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"status": "success", "data": expr.Pretty(0)})
	})
}
