package load

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/gpustore/gpustore/bench/gpusim"
	"github.com/gpustore/gpustore/pkg/app"
)

// startGpustore runs gpustore in-process on loopback with a fresh data
// directory. Rules are off (-target=ingest,query), as in bench-compare: the
// samples in the TSDB are then exactly the ones written.
func startGpustore(t *testing.T) string {
	t.Helper()
	cfg := app.DefaultConfig()
	cfg.Target = "ingest,query"
	cfg.Server.ListenAddress = "127.0.0.1:0"
	cfg.TSDB.Dir = t.TempDir()
	a, err := app.New(cfg, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Stop() })
	return "http://" + a.Server.Addr().String()
}

// rawSamples returns the series and samples a range selector holds at time
// at (an instant query of a matrix: the stored samples themselves).
func rawSamples(t *testing.T, base, selector string, at time.Time) (series, samples int) {
	t.Helper()
	resp, err := http.PostForm(base+"/api/v1/query", url.Values{"query": {selector}, "time": {strconv.FormatInt(at.Unix(), 10)}})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Values []json.RawMessage `json:"values"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	if out.Status != "success" || out.Data.ResultType != "matrix" {
		t.Fatalf("%s: status %s, type %s, error %q", selector, out.Status, out.Data.ResultType, out.Error)
	}
	for _, r := range out.Data.Result {
		samples += len(r.Values)
	}
	return len(out.Data.Result), samples
}

// A short run of the load driver against an in-process gpustore: every
// sample it reports accepted is queryable, and the dashboard queries run.
func TestDriverAgainstGpustore(t *testing.T) {
	base := startGpustore(t)
	end := time.Now().Add(-time.Minute).Truncate(15 * time.Second)
	w := Workload{
		Cluster: gpusim.Config{Name: "e2e", Nodes: 2, Seed: 5, TargetLabels: true},
		Start:   end.Add(-19 * 15 * time.Second), Ticks: 20, Interval: 15 * time.Second, Shards: 3,
	}
	p, err := BuildPlan(context.Background(), w)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(context.Background(), DriverConfig{URL: base + "/api/v1/write", Logger: quietLogger(), Progress: -1}, p.Source())
	if err != nil {
		t.Fatal(err)
	}
	if res.Samples != p.Stats.Samples || res.Rejected+res.Failed != 0 || res.Codes[204] != p.Stats.Requests {
		t.Fatalf("driver: %s; plan had %d samples in %d requests", res, p.Stats.Samples, p.Stats.Requests)
	}
	series, stored := rawSamples(t, base, `{cluster="e2e"}[1h]`, end)
	if int64(stored) != res.Samples {
		t.Fatalf("gpustore holds %d samples; the driver reported %d accepted", stored, res.Samples)
	}
	if series != p.Stats.Series {
		t.Fatalf("gpustore holds %d series; the plan wrote %d", series, p.Stats.Series)
	}

	// Same for the v2 protocol, into another cluster's series.
	w2 := w
	w2.Cluster.Name, w2.Protocol, w2.External = "e2e-v2", gpusim.ProtocolV2, nil
	p2, err := BuildPlan(context.Background(), w2)
	if err != nil {
		t.Fatal(err)
	}
	res2, err := Run(context.Background(), DriverConfig{URL: base + "/api/v1/write", Protocol: gpusim.ProtocolV2, Logger: quietLogger(), Progress: -1}, p2.Source())
	if err != nil {
		t.Fatal(err)
	}
	if res2.Samples != p2.Stats.Samples || res2.Rejected != 0 {
		t.Fatalf("driver (2.0): %s; plan had %d samples", res2, p2.Stats.Samples)
	}
	if _, got := rawSamples(t, base, `{cluster="e2e-v2"}[1h]`, end); int64(got) != res2.Samples {
		t.Fatalf("gpustore holds %d samples of the 2.0 run; the driver reported %d", got, res2.Samples)
	}

	qr, err := RunQueries(context.Background(), QueryConfig{BaseURL: base, Queries: DashboardQueries("gpu-node-001"),
		End: end, Range: 5 * time.Minute, ScrapeInterval: 15 * time.Second, Rounds: 1})
	if err != nil {
		t.Fatal(err)
	}
	if qr.Errors != 0 {
		for _, q := range qr.Queries {
			if q.Err != "" {
				t.Errorf("%s: %s", q.Panel, q.Err)
			}
		}
	}
	for _, q := range qr.Queries {
		switch q.Panel {
		case "GPUs", "8-GPU temperature heatmap", "hottest GPU":
			if q.Series == 0 || q.Points == 0 {
				t.Errorf("%s (%s): empty answer", q.Panel, q.Expr)
			}
		}
	}
	if qr.Latency.N != len(qr.Queries) {
		t.Errorf("measured %d queries; want %d", qr.Latency.N, len(qr.Queries))
	}
}
