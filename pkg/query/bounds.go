package query

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/grafana/dskit/tenant"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/util/gate"

	"github.com/gpustore/gpustore/pkg/limits"
	"github.com/gpustore/gpustore/pkg/limits/querylimit"
)

// Why PromQL is bounded before it is parsed: the parser's time grows with
// the square of an expression's nesting, and the formatter's
// (format_query) and parse_query's answer faster still. Before, a
// format_query of 2,000 nested parentheses took 15 s, a parse_query of
// 20,000 took 20 s and 5.5 GB, and an instant query of 100,000 ran 120 s past
// a 5 s query.timeout: none of it inside the query's deadline or the
// engine's concurrency limit. An operator chain (a + a + ... + a) nests as
// deep as parentheses do, and costs the same.
//
// So every request carrying PromQL (query, match[]) passes admit, in front
// of everything that parses it (the subquery-steps bound, the resolution
// middleware, the query frontend, the v1 handler and its engine):
//
//  1. its expressions' length and nesting are checked by a scan that builds
//     nothing (exprDeeperThan): past query.max_expression_bytes or
//     query.max_expression_depth the answer is 400 bad_data naming the bound;
//  2. it takes one of query.max_concurrency slots, waiting at most until
//     query.timeout from its arrival (503 timeout) or until its client
//     leaves; the deadline stays on the request, so parsing, waiting and
//     evaluating together fit in query.timeout;
//  3. its subqueries' steps are bounded (checkSubquerySteps).

// Defaults of the bounds. A dashboard's variable expanded to every GPU
// UUID of a 1,024-GPU cluster is about 41 KiB; the deepest tree among the
// GPU rule pack's and the shipped dashboards' expressions is 19 levels
// (TestExpressionDepthBoundsTheParsedTree). Just inside 128 levels the
// slowest shapes cost format_query, parse_query and an instant query 2-30
// ms (TestExpressionsAtTheBoundsAreCheap); at 1,000 the formatter alone
// takes 1-7 s.
const (
	defaultMaxExpressionBytes = 256 << 10
	defaultMaxExpressionDepth = 128
)

// errExpressionBounds wraps the error of an expression past a bound.
var errExpressionBounds = errors.New("expression too large")

// checkExprBounds reports an expression longer than maxBytes or nesting
// deeper than maxDepth, naming the bound.
func checkExprBounds(q string, maxBytes, maxDepth int) error {
	if len(q) > maxBytes {
		return fmt.Errorf("%w: %d bytes, more than query.max_expression_bytes (%d)", errExpressionBounds, len(q), maxBytes)
	}
	if exprDeeperThan(q, maxDepth) {
		return fmt.Errorf("%w: it nests more than query.max_expression_depth (%d) levels (brackets and operators)", errExpressionBounds, maxDepth)
	}
	return nil
}

// exprDeeperThan reports whether the syntax tree PromQL would parse q into
// may be deeper than limit, without parsing q.
func exprDeeperThan(q string, limit int) bool { return depthBound(q, limit) > limit }

// depthBound is at least the depth of the syntax tree PromQL would parse q
// into, or limit+1 as soon as it passes limit, without parsing q.
//
// It reads q with PromQL's own lexer (parser.Lex, the one ParseExpr runs,
// with the same default options), so strings, comments (ended at \r as at
// \n), matchers and escapes are what the parser sees, and it stops where
// the parser stops, at the lexer's first error. A scan of its own once
// ended comments at \n alone: "#\r" hid 3,000 levels from it.
//
// On a path from the root to a leaf, every node but the leaf stands on a
// token of its own: a bracket (parentheses, a function call, an
// aggregation, a range, a subquery) or an operator (binary or unary). So
// within one bracket a path passes at most that bracket's operators and
// then one bracket nested in it: the bound of a bracket is its operators
// plus the bound of its deepest nested bracket plus one. A range or
// subquery bracket wraps the expression before it ((x)[1h:1m] is a
// subquery of a parenthesis of x), so one that follows a closing bracket
// starts from that bracket's bound. Label matchers ({...}: their = and !=
// are not operators) count nothing, nor does @ (a modifier of its
// selector). Unbalanced brackets are bounded the same way; the parser
// rejects them afterwards. The scan stops as soon as what is open passes
// the limit: it costs one pass of the lexer over q and one small frame per
// open bracket up to the limit.
func depthBound(q string, limit int) int {
	type level struct {
		ops, deepest int
		braces       bool
	}
	stack := make([]level, 1, 16)
	pathOps := 0     // the operators of every open bracket
	lastClosed := -1 // the bound of the bracket just closed, while nothing else followed
	lex := parser.Lex(q)
	var it parser.Item
	for {
		lex.NextItem(&it)
		if it.Typ == parser.EOF || it.Typ == parser.ERROR {
			break
		}
		if it.Typ == parser.COMMENT { // the parser skips them: (x) # c\n[5m:] is a subquery of (x)
			continue
		}
		top := &stack[len(stack)-1]
		closed := lastClosed
		lastClosed = -1
		switch typ := it.Typ; {
		case typ == parser.LEFT_PAREN || typ == parser.LEFT_BRACKET || typ == parser.LEFT_BRACE:
			l := level{braces: typ == parser.LEFT_BRACE}
			if typ == parser.LEFT_BRACKET && closed >= 0 {
				l.deepest = closed
			}
			stack = append(stack, l)
		case typ == parser.RIGHT_PAREN || typ == parser.RIGHT_BRACKET || typ == parser.RIGHT_BRACE:
			if len(stack) > 1 {
				stack = stack[:len(stack)-1]
				pathOps -= top.ops
				parent := &stack[len(stack)-1]
				lastClosed = top.ops + top.deepest + 1
				parent.deepest = max(parent.deepest, lastClosed)
			}
		case top.braces:
		case typ.IsOperator() && typ != parser.AT:
			top.ops++
			pathOps++
		}
		// What is open now lies on one path: the final bound is at least this.
		if pathOps+stack[len(stack)-1].deepest+len(stack) > limit {
			return limit + 1
		}
	}
	for len(stack) > 1 { // unclosed brackets close at the end
		top := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		parent := &stack[len(stack)-1]
		parent.deepest = max(parent.deepest, top.ops+top.deepest+1)
	}
	return min(stack[0].ops+stack[0].deepest+1, limit+1)
}

// admission bounds the requests that carry PromQL (see the top of this
// file).
type admission struct {
	maxBytes, maxDepth int
	timeout            time.Duration
	slots              *gate.Gate
	// limits are the tenants' (nil: none); tenantSlots bound each
	// tenant's queries running at once.
	limits      TenantLimits
	tenantSlots *tenantSlots
}

func newAdmission(c Config, l TenantLimits) *admission {
	return &admission{maxBytes: c.MaxExpressionBytes, maxDepth: c.MaxExpressionDepth,
		timeout: time.Duration(c.Timeout), slots: gate.New(c.MaxConcurrency),
		limits: l, tenantSlots: newTenantSlots()}
}

// tenantLimits are the limits of the request's tenant (the tenant
// middleware runs first).
func (ad *admission) tenantLimits(ctx context.Context) (string, limits.QueryLimits) {
	if ad.limits == nil {
		return "", limits.QueryLimits{}
	}
	id, err := tenant.TenantID(ctx)
	if err != nil {
		return "", limits.QueryLimits{}
	}
	return id, ad.limits.QueryLimits(id)
}

// promQLParams are the parameters of the query API that hold PromQL.
var promQLParams = []string{"query", "match[]"}

func (ad *admission) admit(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := r.ParseForm(); err != nil {
			writeError(w, http.StatusBadRequest, "bad_data", fmt.Errorf("error parsing form values: %w", err))
			return
		}
		var exprs []string
		for _, p := range promQLParams {
			exprs = append(exprs, r.Form[p]...)
		}
		if len(exprs) == 0 {
			next.ServeHTTP(w, r)
			return
		}
		for _, q := range exprs {
			if err := checkExprBounds(q, ad.maxBytes, ad.maxDepth); err != nil {
				writeError(w, http.StatusBadRequest, "bad_data", err)
				return
			}
		}
		id, tl := ad.tenantLimits(r.Context())
		timeout := ad.timeout
		if tl.Timeout > 0 {
			timeout = min(timeout, tl.Timeout)
		}
		ctx, cancel := context.WithTimeout(r.Context(), timeout)
		defer cancel()
		// The tenant's own slot first: a tenant at its bound waits without
		// holding one of the process's, which the other tenants use.
		release, err := ad.tenantSlots.acquire(ctx, id, tl.MaxConcurrent)
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				writeError(w, http.StatusServiceUnavailable, "timeout", fmt.Errorf("query timed out waiting for one of tenant %q's %d max_concurrent_queries slots: %w", id, tl.MaxConcurrent, err))
			} else {
				writeError(w, statusClientClosedRequest, "canceled", fmt.Errorf("query canceled waiting for a slot: %w", err))
			}
			return
		}
		defer release()
		if err := ad.slots.Start(ctx); err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				writeError(w, http.StatusServiceUnavailable, "timeout", fmt.Errorf("query timed out waiting for one of query.max_concurrency slots: %w", err))
			} else {
				writeError(w, statusClientClosedRequest, "canceled", fmt.Errorf("query canceled waiting for a slot: %w", err))
			}
			return
		}
		defer ad.slots.Done()
		ctx = querylimit.With(ctx, querylimit.New(id, tl.MaxFetchedSeries, tl.MaxFetchedChunkBytes))
		r = r.WithContext(withMaxSamples(ctx, tl.MaxSamples))
		// A slot may be given to a request whose client has just left (the
		// gate picks at random when both are ready): nothing it parses is
		// wanted any more, and a parse cannot be stopped once begun.
		if clientLeft(w, r) {
			return
		}
		for _, q := range r.Form["query"] {
			if err := checkSubquerySteps(q); err != nil {
				writeError(w, http.StatusBadRequest, "bad_data", err)
				return
			}
		}
		if clientLeft(w, r) {
			return
		}
		next.ServeHTTP(w, r)
	})
}

// clientLeft answers a request whose context has ended, because its client
// left (499) or its query.timeout passed (503), and reports whether it did.
// PromQL's parser and formatter take no context: the handlers look between
// their steps instead.
func clientLeft(w http.ResponseWriter, r *http.Request) bool {
	err := r.Context().Err()
	switch {
	case err == nil:
		return false
	case errors.Is(err, context.DeadlineExceeded):
		writeError(w, http.StatusServiceUnavailable, "timeout", fmt.Errorf("query timed out before it was parsed: %w", err))
	default:
		writeError(w, statusClientClosedRequest, "canceled", fmt.Errorf("query canceled: %w", err))
	}
	return true
}

// statusClientClosedRequest is what Prometheus answers (nobody reads it) to
// a request whose client left.
const statusClientClosedRequest = 499

// maxSubquerySteps bounds the steps of one subquery. Prometheus' engine
// sizes and walks per-step statistics for each subquery without looking at
// the query's deadline, so one x[100y:1s] held a core long past
// query.timeout (TestSubqueryStepsBounded). 11,000 is the bound Prometheus
// puts on the points per series of a range query.
const maxSubquerySteps = 11_000

func checkSubquerySteps(q string) error {
	expr, err := parser.NewParser(parser.Options{}).ParseExpr(q)
	if err != nil {
		return nil // the API answers the parse error itself
	}
	var tooMany error
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		sq, ok := n.(*parser.SubqueryExpr)
		if !ok || tooMany != nil {
			return nil
		}
		step := sq.Step
		if step <= 0 {
			step = noStepSubqueryInterval
		}
		if steps := sq.Range / step; steps > maxSubquerySteps {
			tooMany = fmt.Errorf("subquery %s has %d steps, more than %d: use a coarser step or a shorter range", sq, steps, maxSubquerySteps)
		}
		return nil
	})
	return tooMany
}
