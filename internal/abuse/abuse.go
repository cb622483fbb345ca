// Package abuse holds the workloads of gpustore's abuse tests: what a
// hostile or careless client sends to take a server down. The unit tests of
// the packages that defend against them, and the soak's abuse run (make
// soak), call the same functions against a running server, so a defence is
// proven against the workload the soak repeats.
package abuse

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/golang/snappy"
	"github.com/prometheus/prometheus/prompb"
)

// ReadRequest is the body of a remote-read request, as Prometheus' remote
// read client sends it: a snappy-compressed prompb.ReadRequest selecting
// every series named metric over [from, to] (ms), accepting streamed chunks.
func ReadRequest(metric string, from, to int64) []byte {
	req := &prompb.ReadRequest{
		Queries: []*prompb.Query{{
			StartTimestampMs: from, EndTimestampMs: to,
			Matchers: []*prompb.LabelMatcher{{Type: prompb.LabelMatcher_EQ, Name: "__name__", Value: metric}},
		}},
		AcceptedResponseTypes: []prompb.ReadRequest_ResponseType{prompb.ReadRequest_STREAMED_XOR_CHUNKS},
	}
	b, err := req.Marshal()
	if err != nil {
		panic(err) // a fixed, valid message
	}
	return snappy.Encode(nil, b)
}

// AbandonedReads sends n remote-read requests (body, from ReadRequest) to
// addr (host:port) at path, each on a connection of its own, and once every
// request is sent closes every connection without reading an answer: the
// clients of a query that timed out, crashed or were killed. header adds
// headers to each request (tenant, basic auth). The connections are open
// together, so the server holds all n requests at once.
func AbandonedReads(addr, path string, body []byte, header http.Header, n int) error {
	var head bytes.Buffer
	fmt.Fprintf(&head, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/x-protobuf\r\nContent-Encoding: snappy\r\n"+
		"X-Prometheus-Remote-Read-Version: 0.1.0\r\nContent-Length: %d\r\n", path, addr, len(body))
	for k, vs := range header {
		for _, v := range vs {
			fmt.Fprintf(&head, "%s: %s\r\n", k, v)
		}
	}
	head.WriteString("\r\n")
	head.Write(body)
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for i := range n {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return fmt.Errorf("abandoned read %d: %w", i, err)
		}
		conns = append(conns, c)
		_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write(head.Bytes()); err != nil {
			return fmt.Errorf("abandoned read %d: %w", i, err)
		}
	}
	return nil
}

// Bomb is a PromQL expression whose cost to the parser, the formatter or
// the engine grows faster than its length.
type Bomb struct {
	Name  string
	Query string
}

// ParseBombs are the expressions that took minutes or gigabytes before
// gpustore bounded expressions: deep parentheses (format_query of 2,000
// levels took 15 s; parse_query of 20,000 took 20 s and 5.5 GB; an instant
// query of 100,000 ran 120 s past a 5 s timeout), long operator chains and
// nested function calls, which nest as deep without a single parenthesis;
// and the same nesting behind a comment that ends at a carriage return
// (PromQL ends a comment at \r as well as \n: a scan that ended it at \n
// alone saw nothing after it, and 3,000 levels were answered 200).
func ParseBombs() []Bomb {
	nest := func(open, leaf, close string, n int) string {
		return strings.Repeat(open, n) + leaf + strings.Repeat(close, n)
	}
	return []Bomb{
		{"parentheses-2000", nest("(", "DCGM_FI_DEV_GPU_UTIL", ")", 2000)},
		{"parentheses-20000", nest("(", "DCGM_FI_DEV_GPU_UTIL", ")", 20_000)},
		{"parentheses-100000", nest("(", "DCGM_FI_DEV_GPU_UTIL", ")", 100_000)},
		{"operator-chain-5000", "DCGM_FI_DEV_GPU_UTIL" + strings.Repeat(" + DCGM_FI_DEV_GPU_UTIL", 5000)},
		{"unary-minus-50000", strings.Repeat("-", 50_000) + "DCGM_FI_DEV_GPU_UTIL"},
		{"nested-calls-3000", nest("abs(", "DCGM_FI_DEV_GPU_UTIL", ")", 3000)},
		{"nested-binary-2000", nest("(DCGM_FI_DEV_GPU_UTIL + ", "DCGM_FI_DEV_GPU_UTIL", ")", 2000)},
		{"unclosed-100000", strings.Repeat("(", 100_000)},
		{"comment-cr-parentheses-3000", "#\r" + nest("(", "DCGM_FI_DEV_GPU_UTIL", ")", 3000)},
		{"comment-cr-operator-chain-5000", "DCGM_FI_DEV_GPU_UTIL # power\r" + strings.Repeat(" + DCGM_FI_DEV_GPU_UTIL", 5000)},
		{"long-1MiB", `DCGM_FI_DEV_GPU_UTIL{gpu=~"` + strings.Repeat("0|", 1<<19) + `1"}`},
	}
}

// BombRoutes are the query API's routes that parse PromQL, with the
// parameter each reads it from.
var BombRoutes = []struct{ Path, Param string }{
	{"/api/v1/format_query", "query"},
	{"/api/v1/parse_query", "query"},
	{"/api/v1/query", "query"},
	{"/api/v1/query_range", "query"},
	{"/api/v1/query_exemplars", "query"},
	{"/api/v1/series", "match[]"},
}

// Answer is what one bomb sent to one route got.
type Answer struct {
	Bomb, Route string
	Status      int
	Body        string // the start of the answer
	Took        time.Duration
	Err         error // no answer within the client's timeout
}

// SendParseBombs sends every bomb to every route of BombRoutes on base
// (http://host:port), as a form POST (a GET's URL could not hold the
// longest), and returns what each got. header adds headers (tenant, basic
// auth); timeout bounds each request.
func SendParseBombs(ctx context.Context, base string, header http.Header, timeout time.Duration) []Answer {
	now := time.Now().Unix()
	var out []Answer
	for _, b := range ParseBombs() {
		for _, rt := range BombRoutes {
			form := url.Values{rt.Param: {b.Query}, "time": {fmt.Sprint(now)},
				"start": {fmt.Sprint(now - 3600)}, "end": {fmt.Sprint(now)}, "step": {"60"}}
			a := Answer{Bomb: b.Name, Route: rt.Path}
			start := time.Now()
			a.Status, a.Body, a.Err = post(ctx, base+rt.Path, form, header, timeout)
			a.Took = time.Since(start)
			out = append(out, a)
		}
	}
	return out
}

func post(ctx context.Context, u string, form url.Values, header http.Header, timeout time.Duration) (int, string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, strings.NewReader(form.Encode()))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 512))
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, string(b), err
}

// OpenFDs counts this process's open file descriptors (Linux).
func OpenFDs() (int, error) {
	ents, err := os.ReadDir("/proc/self/fd")
	return len(ents), err
}

// Footprint is what a server in this process holds: goroutines and open
// files.
type Footprint struct{ Goroutines, FDs int }

// Measure returns this process's footprint now.
func Measure() (Footprint, error) {
	fds, err := OpenFDs()
	return Footprint{runtime.NumGoroutine(), fds}, err
}

// SettlesTo waits up to d until this process holds at most base plus slack
// goroutines and open files; the error says what it held last.
func SettlesTo(base Footprint, slack int, d time.Duration) error {
	var now Footprint
	var err error
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if now, err = Measure(); err == nil && now.Goroutines <= base.Goroutines+slack && now.FDs <= base.FDs+slack {
			return nil
		}
	}
	return fmt.Errorf("after %s: %d goroutines (baseline %d), %d open files (baseline %d)", d, now.Goroutines, base.Goroutines, now.FDs, base.FDs)
}

// ProcessGauges reads go_goroutines and process_open_fds from a gpustore's
// /metrics page (base: http://host:port): what a server in another process
// holds. header adds headers (an admin identity's basic auth).
func ProcessGauges(ctx context.Context, base string, header http.Header) (goroutines, fds float64, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return 0, 0, err
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("/metrics: %s", resp.Status)
	}
	found := 0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		for name, dst := range map[string]*float64{"go_goroutines ": &goroutines, "process_open_fds ": &fds} {
			if v, ok := strings.CutPrefix(line, name); ok {
				if _, err := fmt.Sscan(v, dst); err == nil {
					found++
				}
			}
		}
	}
	if found != 2 {
		return 0, 0, errors.Join(sc.Err(), errors.New("/metrics lacks go_goroutines or process_open_fds"))
	}
	return goroutines, fds, nil
}
