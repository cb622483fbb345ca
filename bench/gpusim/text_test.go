package gpusim

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func parseText(t testing.TB, page []byte) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(page))
	if err != nil {
		t.Fatalf("parse page: %v", err)
	}
	return fams
}

var dtoTypes = map[MetricType]dto.MetricType{Counter: dto.MetricType_COUNTER, Gauge: dto.MetricType_GAUGE, Histogram: dto.MetricType_HISTOGRAM}

// The whole 1024-GPU page parses with Prometheus' own text parser, every
// family with its catalogue type and help, and the same number of series as
// the model holds.
func TestMetricsPageParsesFullCluster(t *testing.T) {
	c := newTestCluster(t, Config{Seed: 1})
	c.Step(t0.Add(5 * time.Hour))
	page := c.AppendText(nil)
	fams := parseText(t, page)
	series := 0
	for name, mf := range fams {
		d, ok := LookupMetric(name)
		if !ok {
			t.Errorf("page has unknown family %s", name)
			continue
		}
		if mf.GetType() != dtoTypes[d.Type] {
			t.Errorf("%s parsed as %s, catalogue %s", name, mf.GetType(), d.Type)
		}
		if mf.GetHelp() != d.Help {
			t.Errorf("%s help %q, catalogue %q", name, mf.GetHelp(), d.Help)
		}
		for _, m := range mf.Metric {
			if h := m.GetHistogram(); h != nil {
				series += len(h.Bucket) + 2 // +Inf is folded into count by the parser
				continue
			}
			series++
		}
	}
	if got := c.SeriesCount(); series < got-got/50 || series > got {
		t.Errorf("page holds %d series, model %d", series, got)
	}
	if n := len(fams["DCGM_FI_DEV_GPU_TEMP"].Metric); n != 1024 {
		t.Errorf("%d GPU temperature series, want 1024", n)
	}
	t.Logf("1024-GPU page: %d bytes, %d series", len(page), c.SeriesCount())
}

func TestHandlerPages(t *testing.T) {
	now := t0.Add(time.Hour)
	c := newTestCluster(t, Config{Nodes: 2, Seed: 2, FaultOrigin: t0, Faults: []Fault{{Kind: FaultNodeDown, At: 2 * time.Hour, Duration: time.Hour, Node: "gpu-node-002"}}})
	srv := httptest.NewServer(NewHandler(c, HandlerOptions{Now: func() time.Time { return now }}))
	defer srv.Close()
	get := func(path string) (int, string, string) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
	}
	code, ct, body := get("/node/gpu-node-001/metrics")
	if code != 200 || ct != TextContentType {
		t.Fatalf("node page: %d %q", code, ct)
	}
	fams := parseText(t, []byte(body))
	if len(fams["DCGM_FI_DEV_GPU_TEMP"].Metric) != 8 || strings.Contains(body, "gpu-node-002") {
		t.Errorf("node page does not hold exactly gpu-node-001's 8 GPUs")
	}
	if _, ok := fams["kube_node_status_condition"]; ok {
		t.Errorf("node page carries kube-state-metrics")
	}
	_, _, body = get("/cluster/metrics")
	if fams := parseText(t, []byte(body)); len(fams["kube_node_status_condition"].Metric) != 6 {
		t.Errorf("cluster page: %d node conditions, want 6", len(fams["kube_node_status_condition"].Metric))
	}
	_, _, body = get("/metrics")
	if fams := parseText(t, []byte(body)); len(fams["DCGM_FI_DEV_GPU_TEMP"].Metric) != 16 {
		t.Errorf("cluster-wide page: %d GPU temperatures, want 16", len(fams["DCGM_FI_DEV_GPU_TEMP"].Metric))
	}
	if code, _, _ := get("/node/gpu-node-009/metrics"); code != http.StatusNotFound {
		t.Errorf("unknown node: %d", code)
	}
	if _, _, body := get("/sd"); !strings.Contains(body, `"/node/gpu-node-002/metrics"`) {
		t.Errorf("sd: %s", body)
	}
	now = t0.Add(150 * time.Minute)
	if code, _, _ := get("/node/gpu-node-002/metrics"); code != http.StatusServiceUnavailable {
		t.Errorf("down node page: %d, want 503", code)
	}
	if _, _, body := get("/metrics"); strings.Contains(body, `Hostname="gpu-node-002"`) {
		t.Errorf("down node's series on the cluster page")
	}
}

// Every page a scrape reads has each series once: Prometheus drops the
// duplicates of a scrape ("duplicate sample for timestamp"). The nccl-tests
// results of several blocks of nodes are told apart by the Pushgateway's
// grouping key (job, instance), which it exposes as labels whether or not
// the simulator adds target labels.
func TestPagesHaveUniqueSeries(t *testing.T) {
	c := newTestCluster(t, Config{Nodes: 24, Seed: 1, FaultOrigin: t0, Faults: []Fault{{Kind: FaultMIG, At: 0, Duration: time.Hour, Node: "3", GPU: 1}}})
	c.Step(t0.Add(10 * time.Minute))
	pages := map[string][]byte{"/metrics": c.AppendText(nil), "/cluster/metrics": c.AppendClusterScopeText(nil)}
	for i := range c.nodes {
		pages["/node/"+c.nodes[i].hostname+"/metrics"], _ = c.AppendNodeText(nil, i)
	}
	for path, page := range pages {
		seen := map[string]bool{}
		for _, line := range strings.Split(string(page), "\n") {
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			id := line[:strings.LastIndexByte(line, ' ')]
			if seen[id] {
				t.Errorf("%s: series %s twice", path, id)
			}
			seen[id] = true
		}
	}
	fams := parseText(t, pages["/cluster/metrics"])
	for _, m := range fams["nccl_bandwidth_gbps"].Metric {
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["job"] != "nccl-tests" || !strings.HasPrefix(labels["instance"], "gpu-node-") {
			t.Errorf("nccl-tests result without its Pushgateway grouping key: %v", labels)
		}
	}
}
