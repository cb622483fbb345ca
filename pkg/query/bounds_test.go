package query

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"

	rulepack "github.com/gpustore/gpustore/deploy/rules"
	"github.com/gpustore/gpustore/internal/abuse"
)

// treeDepth is the depth of q's syntax tree as Prometheus parses it (a
// lone selector is 1).
func treeDepth(t *testing.T, q string) int {
	t.Helper()
	expr, err := parser.NewParser(parser.Options{}).ParseExpr(q)
	if err != nil {
		t.Fatalf("%q: %v", q, err)
	}
	depth := 0
	parser.Inspect(expr, func(_ parser.Node, path []parser.Node) error {
		depth = max(depth, len(path)+1)
		return nil
	})
	return depth
}

// realExpressions are the expressions users send: every rule of the GPU
// rule pack and every panel and variable query of the shipped dashboards
// (Grafana's variables replaced by values, as Grafana does before it
// sends them).
func realExpressions(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, name := range rulepack.Files() {
		b, err := fs.ReadFile(rulepack.FS, name)
		if err != nil {
			t.Fatal(err)
		}
		groups, errs := rulefmt.Parse(b, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
		if len(errs) > 0 {
			t.Fatalf("%s: %v", name, errs)
		}
		for _, g := range groups.Groups {
			for _, r := range g.Rules {
				out = append(out, r.Expr)
			}
		}
	}
	files, err := filepath.Glob("../../deploy/grafana/dashboards/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("dashboards: %v", err)
	}
	grafanaVar := regexp.MustCompile(`\$\{?(\w+)\}?`)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var walk func(any)
		walk = func(v any) {
			switch v := v.(type) {
			case map[string]any:
				for k, e := range v {
					if s, ok := e.(string); ok && k == "expr" && s != "" {
						out = append(out, grafanaVar.ReplaceAllStringFunc(s, func(m string) string {
							if strings.Contains(m, "__") {
								return "5m" // $__rate_interval, $__interval, $__range
							}
							return "gpu-node-1"
						}))
					}
					walk(e)
				}
			case []any:
				for _, e := range v {
					walk(e)
				}
			}
		}
		var d any
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		walk(d)
	}
	return out
}

// tricky are expressions whose text holds brackets and operators that are
// not the tree's (in strings, comments and matchers), and comments where the
// lexer ends them (at \r as at \n) or skips them (between a bracket and the
// range or subquery that follows it).
var tricky = []string{
	"#\r-(-(DCGM_FI_DEV_GPU_TEMP))",
	"up # a comment\r+ 1 # another\r\n* 2",
	"(DCGM_FI_DEV_GPU_TEMP) # hourly\n[1h:1m]",
	"max_over_time(abs(DCGM_FI_DEV_GPU_TEMP) #\r[10m:1m])",
	`DCGM_FI_DEV_XID_ERRORS{err_msg="((((((((- - - -))))))))"}`,
	`label_replace(up, "a", "((($1)))", "job", "(.*)")`,
	"up # ((((((((( and or unless\n+ 1",
	`count by (gpu_uuid) (DCGM_FI_DEV_GPU_UTIL{gpu=~"0|1|2", Hostname!="a-b-c"} >= 90 and on (gpu_uuid) DCGM_FI_DEV_GPU_TEMP > 80)`,
	"-(-(-1)) ^ 2 ^ -3",
	`max_over_time(rate(DCGM_FI_PROF_PCIE_TX_BYTES[5m] @ 1700000000)[1h:1m] offset -5m)`,
	"1e-3 * x unless y or z atan2 w",
	"label_join(up, `raw ( string`, \"a\\\"(\", \"job\")",
	`{__name__=~"DCGM_.+", gpu!~"(1|2)"} != bool 0`,
}

// TestExpressionDepthBoundsTheParsedTree: the depth counted before parsing
// is never below the depth of the tree Prometheus parses (so no expression
// slips past the bound), on the expressions users send, on text with
// brackets and operators in strings, comments and matchers, and on random
// compositions of every kind of node; and every real expression passes the
// default bound with room to spare.
func TestExpressionDepthBoundsTheParsedTree(t *testing.T) {
	check := func(q string) int {
		t.Helper()
		d := treeDepth(t, q)
		if !exprDeeperThan(q, d-1) {
			t.Errorf("%q: the parsed tree is %d deep, the bound before parsing says at most %d", q, d, d-1)
		}
		return d
	}
	real := realExpressions(t)
	if len(real) < 100 {
		t.Fatalf("only %d real expressions found", len(real))
	}
	deepest := 0
	for _, q := range real {
		deepest = max(deepest, check(q))
		if exprDeeperThan(q, defaultMaxExpressionDepth/4) {
			t.Errorf("a real expression counts deeper than a quarter of the default bound: %q", q)
		}
	}
	t.Logf("%d real expressions, the deepest tree %d levels", len(real), deepest)
	for _, q := range tricky {
		check(q)
	}
	rng := rand.New(rand.NewPCG(30, 2))
	valid := 0
	for range 3000 {
		q := randomExpr(rng, 12)
		if _, err := parser.NewParser(parser.Options{}).ParseExpr(q); err != nil {
			continue // a type error (an aggregation of a scalar, ...)
		}
		check(q)
		valid++
	}
	t.Logf("%d random expressions parsed and checked", valid)
	if valid < 1000 {
		t.Errorf("only %d of the random expressions parse", valid)
	}
}

// randomExpr composes a random PromQL expression of every kind of node, at
// most depth levels of composition.
func randomExpr(rng *rand.Rand, depth int) string {
	if depth == 0 || rng.IntN(4) == 0 {
		switch rng.IntN(3) {
		case 0:
			return `DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname=~"n(1|2)"}`
		case 1:
			return fmt.Sprint(rng.IntN(100))
		default:
			return `DCGM_FI_DEV_GPU_TEMP`
		}
	}
	sub := func() string { return randomExpr(rng, depth-1) }
	ops := []string{"+", "-", "*", "/", "%", "^", "==", "!=", ">", "<", ">=", "<=", "and", "or", "unless", "atan2"}
	switch rng.IntN(10) {
	case 0:
		return "(" + sub() + ")"
	case 1:
		op := ops[rng.IntN(len(ops))]
		if op == "and" || op == "or" || op == "unless" {
			return `DCGM_FI_DEV_GPU_UTIL ` + op + ` DCGM_FI_DEV_GPU_TEMP`
		}
		return sub() + " " + op + " " + sub()
	case 2:
		return "-" + sub()
	case 3:
		return "abs(" + sub() + ")"
	case 4:
		return "sum by (gpu) (" + sub() + ")"
	case 5:
		return "max_over_time((" + sub() + ")[10m:1m])"
	case 6:
		return "clamp(" + sub() + ", 0, 100)"
	case 7:
		return "sum_over_time(abs(" + sub() + ")[10m:1m] @ 1700000000)"
	case 8:
		return "max_over_time((-" + sub() + ")[10m:] offset 5m)"
	default:
		return "rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5m] offset 1m)"
	}
}

// TestParseBombsAnsweredAtOnce: the expressions that took the parser and
// formatter minutes and gigabytes (format_query of 2,000 nested parentheses:
// 15 s; parse_query of 20,000: 20 s and 5.5 GB; an instant query of 100,000:
// 120 s past a 5 s timeout; operator chains and nested calls, as deep without
// a parenthesis; a 1 MiB regular expression) are answered 400 bad_data
// naming the bound, on every route that parses PromQL, at once (well
// under a second on a quiet machine).
func TestParseBombsAnsweredAtOnce(t *testing.T) {
	h, _ := newTestAPIHandler(t, func(o *Options) { o.Config.Timeout = model.Duration(5 * time.Second) })
	base, _ := serveUnwaited(t, h)
	for _, a := range abuse.SendParseBombs(context.Background(), base, nil, 10*time.Second) {
		var r apiResponse
		_ = json.Unmarshal([]byte(a.Body), &r)
		switch {
		case a.Err != nil:
			t.Errorf("%s to %s: no answer after %s: %v", a.Bomb, a.Route, a.Took, a.Err)
		case a.Status != http.StatusBadRequest || r.ErrorType != "bad_data" || !strings.Contains(r.Error, "query.max_expression_"):
			t.Errorf("%s to %s: %d after %s, want 400 bad_data naming the bound: %.200s", a.Bomb, a.Route, a.Status, a.Took, a.Body)
		case a.Took > 3*time.Second:
			// Seconds, not milliseconds: under -race on two busy cores, a
			// 1 MiB body took 1.26 s to send and refuse; the bombs took
			// 15 to 120 s before the bounds.
			t.Errorf("%s to %s: answered after %s", a.Bomb, a.Route, a.Took)
		}
	}
}

// TestExpressionsAtTheBoundsAreCheap: the slowest routes (format_query,
// parse_query, an instant query) answer an expression just inside the
// default bounds, in each shape that nests, quickly: the bound is set where
// the super-linear costs are still small.
func TestExpressionsAtTheBoundsAreCheap(t *testing.T) {
	srv, _ := newTestAPI(t, nil)
	n := defaultMaxExpressionDepth - 2
	shapes := map[string]string{
		"parentheses":    strings.Repeat("(", n) + "DCGM_FI_DEV_GPU_TEMP" + strings.Repeat(")", n),
		"operator-chain": "DCGM_FI_DEV_GPU_TEMP" + strings.Repeat(" + DCGM_FI_DEV_GPU_TEMP", n-1),
		"nested-calls":   strings.Repeat("abs(", n) + "DCGM_FI_DEV_GPU_TEMP" + strings.Repeat(")", n),
		"nested-binary":  strings.Repeat("(DCGM_FI_DEV_GPU_TEMP + ", n/2) + "DCGM_FI_DEV_GPU_TEMP" + strings.Repeat(")", n/2),
	}
	for name, q := range shapes {
		if exprDeeperThan(q, defaultMaxExpressionDepth) {
			t.Fatalf("%s: not inside the bound", name)
		}
		for _, route := range []string{"/api/v1/format_query", "/api/v1/parse_query", "/api/v1/query"} {
			start := time.Now()
			code, r := call(t, srv, http.MethodPost, route, url.Values{"query": {q}})
			took := time.Since(start)
			if code != http.StatusOK {
				t.Errorf("%s to %s: %d %s", name, route, code, r.Error)
			}
			t.Logf("%-14s %-20s %s", name, route, took)
			if took > 2*time.Second {
				t.Errorf("%s to %s took %s", name, route, took)
			}
		}
	}
}

// TestParsingWaitsForASlotWithinTheTimeout: a request carrying PromQL
// takes one of query.max_concurrency slots before anything parses its
// expression, and its deadline (query.timeout) runs from its arrival: with
// the only slot held by a query that runs long, a format_query waits, is
// answered 503 once the timeout has passed, and a waiting client that leaves
// leaves nothing behind; once the slot is free, the same request is answered
// at once. Before, parsing ran outside both (format_query answered at once
// however busy the engine was).
func TestParsingWaitsForASlotWithinTheTimeout(t *testing.T) {
	src := newStallingSource()
	src.ignoreCancel = true
	h, _ := newTestAPIHandler(t, func(o *Options) {
		o.Config.MaxConcurrency = 1
		o.Config.Timeout = model.Duration(time.Second)
		o.Sources = []Source{src}
	})
	base, _ := serveUnwaited(t, h)
	held := make(chan struct{})
	go func() {
		defer close(held)
		resp, err := http.Get(base + "/api/v1/query?query=stall")
		if err == nil {
			resp.Body.Close()
		}
	}()
	select {
	case <-src.started:
	case <-time.After(10 * time.Second):
		t.Fatal("the long query never started")
	}
	format := base + "/api/v1/format_query?query=" + url.QueryEscape("sum(DCGM_FI_DEV_GPU_TEMP)")

	start := time.Now()
	resp, err := http.Get(format)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if took := time.Since(start); resp.StatusCode != http.StatusServiceUnavailable || took < 900*time.Millisecond || took > 5*time.Second {
		t.Errorf("format_query with the only slot held: %d after %s, want 503 after the 1 s timeout", resp.StatusCode, took)
	}

	http.DefaultClient.CloseIdleConnections()
	before := measure(t)
	for range 50 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, format, nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			t.Fatalf("format_query answered %d with the only slot held", resp.StatusCode)
		}
		cancel()
	}
	http.DefaultClient.CloseIdleConnections()
	if err := abuse.SettlesTo(before, 10, 5*time.Second); err != nil {
		t.Fatalf("clients that left while waiting for a slot: %v", err)
	}

	close(src.release)
	<-held
	start = time.Now()
	resp, err = http.Get(format)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if code, took := resp.StatusCode, time.Since(start); code != http.StatusOK || took > time.Second {
		t.Errorf("format_query with the slot free: %d after %s", code, took)
	}
}

// FuzzExpressionDepthBound: for any text Prometheus parses, the depth
// counted before parsing is at least the parsed tree's, so nothing deeper
// than query.max_expression_depth reaches the parser unnoticed. Each input
// is also checked behind a comment, and with a comment after each of its
// brackets, ended by each of the lexer's line endings (\n, \r, \r\n):
// comments are where a scan and the lexer disagreed (a comment ended at
// \r hid 3,000 levels).
func FuzzExpressionDepthBound(f *testing.F) {
	for _, q := range tricky {
		f.Add(q)
	}
	f.Add(`sum by (gpu) (rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{Hostname=~"n.*"}[5m])) / 1000`)
	f.Add(`(DCGM_FI_DEV_GPU_UTIL)[1h:1m]`)
	f.Add(`abs(-DCGM_FI_DEV_GPU_UTIL ^ 2)[30m:] offset 1m`)
	f.Add("sum(\r\tDCGM_FI_DEV_GPU_UTIL # (((\n) # )))\r")
	f.Fuzz(func(t *testing.T, q string) {
		if len(q) > 4096 {
			return
		}
		check := func(q string) {
			expr, err := parser.NewParser(parser.Options{}).ParseExpr(q)
			if err != nil {
				return
			}
			depth := 0
			parser.Inspect(expr, func(_ parser.Node, path []parser.Node) error {
				depth = max(depth, len(path)+1)
				return nil
			})
			if !exprDeeperThan(q, depth-1) {
				t.Fatalf("%q parses %d deep; the bound before parsing says at most %d", q, depth, depth-1)
			}
		}
		check(q)
		for _, eol := range []string{"\n", "\r", "\r\n"} {
			check("# ((( +" + eol + q)
			check(strings.NewReplacer("(", "( # - (((("+eol, ")", ") # ))"+eol).Replace(q))
		}
	})
}

// BenchmarkExpressionBound: what the bound's scan costs beside the parse it
// guards, on a dashboard panel's expression and on a variable expanded to
// the UUIDs of 1,024 GPUs (41 KiB).
func BenchmarkExpressionBound(b *testing.B) {
	var uuids []string
	for i := range 1024 {
		uuids = append(uuids, fmt.Sprintf("GPU-%08x-1111-2222-3333-444455556666", i))
	}
	for name, q := range map[string]string{
		"panel":     `sum by (Hostname) (rate(DCGM_FI_PROF_PCIE_TX_BYTES{Hostname=~"node-1|node-2", gpu=~".*"}[5m])) / on (Hostname) group_left count by (Hostname) (DCGM_FI_DEV_GPU_TEMP)`,
		"1024-gpus": `avg(DCGM_FI_DEV_GPU_UTIL{UUID=~"` + strings.Join(uuids, "|") + `"})`,
	} {
		b.Run(name+"/scan", func(b *testing.B) {
			b.SetBytes(int64(len(q)))
			for b.Loop() {
				if checkExprBounds(q, defaultMaxExpressionBytes, defaultMaxExpressionDepth) != nil {
					b.Fatal("refused")
				}
			}
		})
		b.Run(name+"/parse", func(b *testing.B) {
			b.SetBytes(int64(len(q)))
			p := parser.NewParser(parser.Options{})
			for b.Loop() {
				if _, err := p.ParseExpr(q); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestQueryWhoseClientLeftFreesItsSlot: a running query whose client
// leaves stops (its selects see the request's context end) and gives its
// slot back at once, long before query.timeout.
func TestQueryWhoseClientLeftFreesItsSlot(t *testing.T) {
	src := newStallingSource()
	h, _ := newTestAPIHandler(t, func(o *Options) {
		o.Config.MaxConcurrency = 1
		o.Config.Timeout = model.Duration(time.Minute)
		o.Sources = []Source{src}
	})
	base, _ := serveUnwaited(t, h)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/api/v1/query", strings.NewReader("query=stall"))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	select {
	case <-src.started:
	case <-time.After(10 * time.Second):
		t.Fatal("the query never started")
	}
	cancel()
	<-done
	start := time.Now()
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	req, _ := http.NewRequestWithContext(ctx2, http.MethodGet, base+"/api/v1/format_query?query=up", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("format_query after the client of the only running query left: %v (its slot was not given back)", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || time.Since(start) > time.Second {
		t.Errorf("format_query after the client of the only running query left: %d after %s", resp.StatusCode, time.Since(start))
	}
}

// TestFormatQueryWorkBounded: format_query's formatter writes every
// subtree out again at each level above it, so its work grows with depth ×
// length: just inside the depth and length bounds (126 levels over a 240 KiB
// selector) it took 2-4 s, uninterruptible, while the same text costs an
// instant query or parse_query well under a second. format_query refuses
// such text at once (400 bad_data naming its bound), the other routes
// still answer it, and a real panel's expression with a dashboard variable
// expanded to 1,024 GPUs is formatted.
func TestFormatQueryWorkBounded(t *testing.T) {
	srv, _ := newTestAPI(t, nil)
	n := defaultMaxExpressionDepth - 2
	regex := `DCGM_FI_DEV_GPU_TEMP{gpu=~"` + strings.Repeat("0|", 120<<10) + `1"}`
	matchers := `DCGM_FI_DEV_GPU_TEMP{` + strings.Repeat(`a="b",`, 40<<10) + `c="d"}`
	for name, q := range map[string]string{
		"deep-long-regex":    strings.Repeat("abs(", n) + regex + strings.Repeat(")", n),
		"deep-many-matchers": strings.Repeat("abs(", n) + matchers + strings.Repeat(")", n),
		"deep-long-chain":    strings.Repeat("(", n/2) + regex + strings.Repeat(" + x", n/2-2) + strings.Repeat(")", n/2),
	} {
		if err := checkExprBounds(q, defaultMaxExpressionBytes, defaultMaxExpressionDepth); err != nil {
			t.Fatalf("%s: not inside the bounds: %v", name, err)
		}
		start := time.Now()
		code, r := call(t, srv, http.MethodPost, "/api/v1/format_query", url.Values{"query": {q}})
		took := time.Since(start)
		if code != http.StatusBadRequest || r.ErrorType != "bad_data" || !strings.Contains(r.Error, "format_query") {
			t.Errorf("%s: format_query answered %d %s after %s, want 400 bad_data naming its bound", name, code, r.Error, took)
		}
		if took > time.Second {
			t.Errorf("%s: format_query answered after %s", name, took)
		}
		for _, route := range []string{"/api/v1/parse_query", "/api/v1/query"} {
			if code, r := call(t, srv, http.MethodPost, route, url.Values{"query": {q}}); code != http.StatusOK {
				t.Errorf("%s to %s: %d %s", name, route, code, r.Error)
			}
		}
	}
	var uuids []string
	for i := range 1024 {
		uuids = append(uuids, fmt.Sprintf("GPU-%08x-1111-2222-3333-444455556666", i))
	}
	panel := `sum by (Hostname) (rate(DCGM_FI_PROF_PCIE_TX_BYTES{UUID=~"` + strings.Join(uuids, "|") + `"}[5m])) / on (Hostname) group_left count by (Hostname) (DCGM_FI_DEV_GPU_TEMP{UUID=~"` + strings.Join(uuids, "|") + `"})`
	code, r := call(t, srv, http.MethodPost, "/api/v1/format_query", url.Values{"query": {panel}})
	if code != http.StatusOK || !strings.Contains(string(r.Data), "group_left") {
		t.Errorf("a panel over 1,024 GPUs (%d bytes): format_query answered %d %s", len(panel), code, r.Error)
	}
}

// TestAdmissionSkipsClientsThatLeft: a request whose client has left by the
// time it holds a slot is not passed on to be parsed (its parse and format
// could not be stopped once begun): it is answered 499 and gives its slot
// back. Before, a free slot and a client already gone were a coin toss
// (the gate's select), and half of them were parsed for nobody.
func TestAdmissionSkipsClientsThatLeft(t *testing.T) {
	cfg := DefaultConfig()
	ad := newAdmission(cfg, nil)
	passed := 0
	h := ad.admit(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { passed++ }))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 200 {
		req := httptest.NewRequest(http.MethodGet, "/api/v1/format_query?query=up", nil).WithContext(ctx)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != statusClientClosedRequest {
			t.Fatalf("answered %d to a client that had left", rec.Code)
		}
	}
	if passed > 0 {
		t.Errorf("%d of 200 requests whose client had left were passed on", passed)
	}
	// Every slot was given back.
	for range cfg.MaxConcurrency {
		if err := ad.slots.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}
