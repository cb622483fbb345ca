package app

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang/snappy"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/prompb"
)

// TestRolesThatWouldHideDataAreRefused: without the ring, a query or rules
// role without the ingest role in its process would answer without the
// newest data or write rule results nothing ships; gpustore refuses to start
// so, and says why. The targets that work still start and become ready.
func TestRolesThatWouldHideDataAreRefused(t *testing.T) {
	for _, c := range []struct{ target, want string }{
		{"query", "target query needs ingest in the same process (-target=all or -target=ingest,query)"},
		{"rules", "target rules needs ingest in the same process (-target=all or -target=ingest,rules)"},
		{"query,rules", "target rules needs ingest in the same process"},
	} {
		_, _, err := Load(flag.NewFlagSet("gpustore", flag.ContinueOnError), []string{"-target=" + c.target, "-storage.tsdb.path=" + t.TempDir()})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("-target=%s: %v, want an error saying %q", c.target, err, c.want)
		}
	}
	for _, target := range []string{All, Ingest, "ingest,query", "ingest,rules", "query,ingest,rules"} {
		t.Run(target, func(t *testing.T) {
			cfg, _, err := Load(flag.NewFlagSet("gpustore", flag.ContinueOnError), []string{
				"-target=" + target, "-storage.tsdb.path=" + t.TempDir(), "-web.listen-address=127.0.0.1:0"})
			if err != nil {
				t.Fatal(err)
			}
			a := startApp(t, cfg)
			resp, err := http.Get("http://" + a.Server.Addr().String() + "/-/ready")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("/-/ready: %d", resp.StatusCode)
			}
		})
	}
}

// TestRingRoles: with the ring, a distributor, a querier or a ruler runs
// alone (a distributor without the ring is refused), and -target=all on the ring is
// a distributor, a receiver and a querier in one process: a write goes
// through the ring to its own receiver and comes back through the query API.
func TestRingRoles(t *testing.T) {
	load := func(args ...string) (Config, error) {
		cfg, _, err := Load(flag.NewFlagSet("gpustore", flag.ContinueOnError), append([]string{
			"-storage.tsdb.path=" + t.TempDir(), "-web.listen-address=127.0.0.1:0"}, args...))
		return cfg, err
	}
	if _, err := load("-target=distributor"); err == nil || !strings.Contains(err.Error(), "target distributor needs the ring") {
		t.Errorf("distributor without the ring: %v, want refused", err)
	}
	for _, target := range []string{"distributor", "query", "distributor,query", "rules", "query,rules"} {
		if _, err := load("-target="+target, "-ring.enabled"); err != nil {
			t.Errorf("-target=%s -ring.enabled: %v", target, err)
		}
	}

	rulesDir := t.TempDir()
	rule := "groups:\n  - name: ring\n    interval: 1s\n    rules:\n      - record: gpu:temp:max\n        expr: max(DCGM_FI_DEV_GPU_TEMP)\n"
	if err := os.WriteFile(filepath.Join(rulesDir, "ring.yml"), []byte(rule), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := load("-ring.enabled", "-ring.store=inmemory", "-ring.replication-factor=1", "-ring.instance-id=solo",
		"-rules.dir="+rulesDir, "-rules.gpu-pack=false")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Rules.TenantPollInterval = model.Duration(200 * time.Millisecond) // the ruler sees it owns the rules soon
	a := startApp(t, cfg)
	base := "http://" + a.Server.Addr().String()
	now := time.Now().UnixMilli()
	var status int
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		// The receiver turns ACTIVE in the ring client's view within a poll.
		if status = postWrite(t, base, `DCGM_FI_DEV_GPU_TEMP{gpu="0"}`, now, 61); status == http.StatusNoContent {
			break
		}
	}
	if status != http.StatusNoContent {
		t.Fatalf("write through the ring: %d", status)
	}
	if got := instantValue(t, base, "DCGM_FI_DEV_GPU_TEMP"); got != "61" {
		t.Fatalf("query after a write through the ring: %q, want 61", got)
	}
	// Rule results go through the ring's write path (the ruler's own
	// distributor), from the one receiver that evaluates the rules.
	var recorded string
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if recorded = queryValue(base, "gpu:temp:max"); recorded != "" {
			break
		}
	}
	if recorded != "61" {
		t.Fatalf("recorded gpu:temp:max = %q, want 61", recorded)
	}
	if rulesSent(t, a) == 0 {
		t.Error("the rule results did not go through the distributors' write path")
	}
	if a.Ingester == nil || a.Distributor == nil || a.Lifecycler == nil {
		t.Fatal("-target=all on the ring runs a receiver, a distributor and a lifecycler")
	}
}

// postWrite sends one sample of one series (a PromQL selector's name and
// labels) as remote write 1.0 and returns the status.
func postWrite(t *testing.T, base, selector string, ts int64, v float64) int {
	t.Helper()
	name, rest, _ := strings.Cut(strings.TrimSuffix(selector, "}"), "{")
	ls := []prompb.Label{{Name: "__name__", Value: name}}
	for kv := range strings.SplitSeq(rest, ",") {
		if k, val, ok := strings.Cut(kv, "="); ok {
			ls = append(ls, prompb.Label{Name: k, Value: strings.Trim(val, `"`)})
		}
	}
	b, err := (&prompb.WriteRequest{Timeseries: []prompb.TimeSeries{{Labels: ls, Samples: []prompb.Sample{{Timestamp: ts, Value: v}}}}}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, base+"/api/v1/write", bytes.NewReader(snappy.Encode(nil, b)))
	req.Header.Set("Content-Type", "application/x-protobuf")
	req.Header.Set("Content-Encoding", "snappy")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// instantValue evaluates expr now and returns the value of its only result.
func instantValue(t *testing.T, base, expr string) string {
	t.Helper()
	resp, err := http.Get(base + "/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Data struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
		Warnings []string `json:"warnings"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	if len(out.Warnings) > 0 {
		t.Errorf("%s: warnings %v", expr, out.Warnings)
	}
	if len(out.Data.Result) != 1 {
		t.Fatalf("%s: %d results, want 1", expr, len(out.Data.Result))
	}
	s, _ := out.Data.Result[0].Value[1].(string)
	return s
}

// startApp starts gpustore with cfg and stops it when the test ends;
// before runs on the App before it starts (RecordFlags, as main does).
func startApp(t *testing.T, cfg Config, before ...func(*App)) *App {
	t.Helper()
	a, err := New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range before {
		f(a)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := a.Stop(); err != nil {
			t.Error(err)
		}
	})
	return a
}

// queryValue evaluates expr now and returns its only value, "" if none.
func queryValue(base, expr string) string {
	resp, err := http.Get(base + "/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var out struct {
		Data struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if json.NewDecoder(resp.Body).Decode(&out) != nil || len(out.Data.Result) != 1 {
		return ""
	}
	v, _ := out.Data.Result[0].Value[1].(string)
	return v
}

// rulesSent is gpustore_distributor_series_sent_total{stage="rules"}.
func rulesSent(t *testing.T, a *App) float64 {
	t.Helper()
	mfs, err := a.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "gpustore_distributor_series_sent_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "stage" && l.GetValue() == "rules" {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
