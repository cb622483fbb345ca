package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"gopkg.in/yaml.v3"

	"github.com/gpustore/gpustore/bench/gpusim"
	rulepack "github.com/gpustore/gpustore/deploy/rules"
	"github.com/gpustore/gpustore/internal/testbin"
	"github.com/gpustore/gpustore/pkg/app"
	"github.com/gpustore/gpustore/pkg/rules"
	"github.com/gpustore/gpustore/pkg/rules/xid"
)

// webhookAlert is one alert of an Alertmanager webhook notification.
type webhookAlert struct {
	// Post numbers the notification (webhook request) the alert came in,
	// from 1.
	Post        int               `json:"-"`
	Status      string            `json:"status"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	StartsAt    time.Time         `json:"startsAt"`
	EndsAt      time.Time         `json:"endsAt"`
}

// webhook collects what Alertmanager notifies.
type webhook struct {
	mu     sync.Mutex
	alerts []webhookAlert
	posts  int
}

func (h *webhook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var msg struct {
		Alerts []webhookAlert `json:"alerts"`
	}
	if err := json.NewDecoder(r.Body).Decode(&msg); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	h.mu.Lock()
	h.posts++
	for _, a := range msg.Alerts {
		a.Post = h.posts
		h.alerts = append(h.alerts, a)
	}
	h.mu.Unlock()
}

// find returns the first notified alert with that name and status whose
// labels include every pair of kv.
func (h *webhook) find(name, status string, kv ...string) (webhookAlert, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var seen []string
next:
	for _, a := range h.alerts {
		seen = append(seen, a.Labels["alertname"]+"/"+a.Labels["gpu"]+"/"+a.Status)
		if a.Labels["alertname"] != name || a.Status != status {
			continue
		}
		for i := 0; i+1 < len(kv); i += 2 {
			if a.Labels[kv[i]] != kv[i+1] {
				continue next
			}
		}
		return a, nil
	}
	return webhookAlert{}, fmt.Errorf("no %s %s %v alert yet (seen %v)", status, name, kv, seen)
}

// onGPU returns every notified alert on GPU gpu of node node ("" for any
// GPU of the node).
func (h *webhook) onGPU(node, gpu string) []webhookAlert {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []webhookAlert
	for _, a := range h.alerts {
		if a.Labels["node"] == node && (gpu == "" || a.Labels["gpu"] == gpu) {
			out = append(out, a)
		}
	}
	return out
}

// startAlertmanager runs the real Alertmanager on loopback (no cluster
// port) with every alert routed to hookURL, and returns its base URL.
func startAlertmanager(t *testing.T, bin, hookURL string) string {
	t.Helper()
	cfg := fmt.Sprintf(`route:
  receiver: hook
  group_by: [alertname, node, gpu]
  group_wait: 0s
  group_interval: 1s
  repeat_interval: 4h
receivers:
  - name: hook
    webhook_configs:
      - url: %s
        send_resolved: true
`, hookURL)
	return startAlertmanagerWith(t, bin, cfg)
}

// shortKeep lists the alerts whose keep_firing_for packCopy cuts to 3s (the
// test waits for GPUTemperatureHigh to resolve), with the shipped value.
var shortKeep = map[string]time.Duration{"GPUTemperatureHigh": 3 * time.Minute}

// shortFor lists the alerts whose `for` packCopy cuts to 3s, with the
// shipped value the test assumes. (GPUMissing has none: it fires at once
// for a GPU that logged Xid 79, as GPU 5 here does.)
var shortFor = map[string]time.Duration{
	"GPUTemperatureHigh":                     2 * time.Minute,
	"GPUMemoryTemperatureOverOperatingLimit": time.Minute,
}

// packCopy returns the shipped rule files gpu-alerts.yml and
// xid-catalog.yml with every group evaluated each second and the `for` of
// the alerts in shortFor cut to 3s. Expressions, labels and annotations are
// the shipped ones. Their group names are the pack's, so for the tenant they
// replace the pack's groups.
func packCopy(t *testing.T) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for _, name := range []string{"gpu-alerts.yml", "xid-catalog.yml"} {
		rgs := parsePackFile(t, name)
		shortened := 0
		for gi := range rgs.Groups {
			rgs.Groups[gi].Interval = model.Duration(time.Second)
			for ri := range rgs.Groups[gi].Rules {
				r := &rgs.Groups[gi].Rules[ri]
				if shipped, ok := shortKeep[r.Alert]; ok {
					if r.KeepFiringFor != model.Duration(shipped) {
						t.Fatalf("shipped %s has keep_firing_for: %s, the test assumes %s", r.Alert, r.KeepFiringFor, model.Duration(shipped))
					}
					r.KeepFiringFor = model.Duration(3 * time.Second)
				}
				if shipped, ok := shortFor[r.Alert]; ok {
					if r.For != model.Duration(shipped) {
						t.Fatalf("shipped %s has for: %s, the test assumes %s", r.Alert, r.For, model.Duration(shipped))
					}
					r.For = model.Duration(3 * time.Second)
					shortened++
				}
			}
		}
		if name == "gpu-alerts.yml" && shortened != len(shortFor) {
			t.Fatalf("gpu-alerts.yml has %d of the alerts %v", shortened, shortFor)
		}
		y, err := yaml.Marshal(rgs)
		if err != nil {
			t.Fatal(err)
		}
		out[name] = y
	}
	return out
}

// parsePackFile parses the shipped pack's rule file name.
func parsePackFile(t *testing.T, name string) *rulefmt.RuleGroups {
	t.Helper()
	b, err := fs.ReadFile(rulepack.FS, name)
	if err != nil {
		t.Fatal(err)
	}
	rgs, errs := rulefmt.Parse(b, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		t.Fatalf("%s: %v", name, errs)
	}
	return rgs
}

// packRecordExpr is the expression of the recording rule record in the
// shipped pack's file name.
func packRecordExpr(t *testing.T, name, record string) string {
	t.Helper()
	for _, g := range parsePackFile(t, name).Groups {
		for _, r := range g.Rules {
			if r.Record == record {
				return r.Expr
			}
		}
	}
	t.Fatalf("%s records no %s", name, record)
	return ""
}

// getJSON GETs path from gpustore as tenantID and decodes the answer.
func getJSON(t *testing.T, base, path, tenantID string, out any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Scope-OrgID", tenantID)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("GET %s: %v in %s", path, err, b)
	}
}

func hasKeys(t *testing.T, what string, m map[string]any, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if _, ok := m[k]; !ok {
			t.Errorf("%s has no %q: %v", what, k, m)
		}
	}
}

func metricsPage(t *testing.T, base string) string {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestRulesAlertToRealAlertmanager: simulated GPUs remote-write to gpustore,
// which evaluates the shipped GPU rules and sends alerts to a real
// Alertmanager. An overheating GPU pages GPUTemperatureHigh with the
// shipped rule's labels and is resolved when it cools down; an Xid 79 pages
// GPUXidError decoded from the Xid catalogue, then GPUMissing when the GPU
// falls off the bus. Each simulator fault of issue 17 (ECC DBE with its Xid
// burst, power brake 0x88, HW thermal slowdown 0x48, HBM overheat, an
// exporter upgrade renaming Hostname) brings its alert and no other.
// /api/v1/rules and /api/v1/alerts answer per tenant in Prometheus' shape,
// and a broken rule file on reload leaves the running rules alone.
func TestRulesAlertToRealAlertmanager(t *testing.T) {
	amBin := testbin.Need(t, "alertmanager")
	hook := &webhook{}
	hookSrv := httptest.NewServer(hook)
	defer hookSrv.Close()
	amURL := startAlertmanager(t, amBin, hookSrv.URL+"/hook")

	const tenantID = "gpu-prod"
	rulesDir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(rulesDir, tenantID), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range packCopy(t) {
		if err := os.WriteFile(filepath.Join(rulesDir, tenantID, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	_, base := startGpustore(t, func(c *app.Config) {
		c.Rules.Dir = rulesDir
		c.Rules.GPUPack = true // the tenant's copies replace two of the pack's groups
		c.Rules.EvaluationInterval = model.Duration(time.Second)
		c.Rules.TenantPollInterval = model.Duration(200 * time.Millisecond)
		c.Rules.ExternalLabels = map[string]string{"source": "gpustore-e2e"}
		c.Rules.Alertmanager.URLs = []string{amURL}
		// The simulator remote-writes no staleness markers (a scraping
		// Prometheus writes them when a series vanishes), so a vanished
		// series would stay visible for the default 5-minute lookback.
		// With samples every second, 15 s stands in for the markers.
		c.Query.LookbackDelta = model.Duration(15 * time.Second)
	})

	// Two simulated nodes (8 H100s each). On gpu-node-001: GPU 2 has been
	// overheating for 5 minutes and cools from start+12s; GPU 5 logs Xid 79
	// at start+15s (after the catalogue series exist), which is exported for
	// 30 s before the GPU falls off the bus (its series vanish) for good;
	// GPU 6 has an uncorrectable ECC error at start+30s (Xid 48, 63, 94, 45
	// a second apart; a row remap is pending from then on). The Xid 79 has
	// ended the node's job at start+20s (gpusim: a fatal GPU event kills the
	// job): a DBE in the same second as the job's end would first show on
	// the GPU's new, pod-less series and GPUECCDoubleBitError, which takes
	// increase() per series, would miss it (reported to the rule pack's
	// owners). GPU 3 is under an external power brake (throttle
	// reasons 0x88) and GPU 4 in a HW thermal slowdown (0x48) from start+5s;
	// GPU 1's memory (HBM) has been overheating for 2 minutes while its die
	// stays cool. gpu-node-002's dcgm-exporter is upgraded at start+20s to a
	// build that names the host label `hostname`: nothing may page for it.
	start := time.Now().Truncate(time.Second)
	simCfg := gpusim.Config{
		Name: "gpu-cluster-e2e", Nodes: 2, Seed: 1, TargetLabels: true, XidsPerGPUYear: -1,
		FaultOrigin: start.Add(-5 * time.Minute),
		Faults: []gpusim.Fault{
			{Kind: gpusim.FaultOverheat, At: 0, Duration: 5*time.Minute + 12*time.Second, Node: "0", GPU: 2},
			{Kind: gpusim.FaultXid, At: 5*time.Minute + 15*time.Second, Duration: time.Hour, Node: "0", GPU: 5, Code: 79},
			{Kind: gpusim.FaultECCDBE, At: 5*time.Minute + 30*time.Second, Duration: time.Minute, Node: "0", GPU: 6},
			{Kind: gpusim.FaultThrottle, At: 5*time.Minute + 5*time.Second, Duration: 10 * time.Minute, Node: "0", GPU: 3},
			{Kind: gpusim.FaultThrottleThermal, At: 5*time.Minute + 5*time.Second, Duration: 10 * time.Minute, Node: "0", GPU: 4},
			{Kind: gpusim.FaultHBMOverheat, At: 3 * time.Minute, Duration: 10 * time.Minute, Node: "0", GPU: 1},
			{Kind: gpusim.FaultExporterUpgrade, At: 5*time.Minute + 20*time.Second, Node: "1"},
		},
	}
	// The simulator is a pure function of time: check the premise first.
	dry, err := gpusim.New(simCfg)
	if err != nil {
		t.Fatal(err)
	}
	node, upgraded := dry.Hostnames()[0], dry.Hostnames()[1]
	temp := func(at time.Time) float64 {
		for _, s := range dry.AppendSamples(nil, at, gpusim.Replica{}) {
			if s.Name() == "DCGM_FI_DEV_GPU_TEMP" && s.Get("gpu") == "2" {
				return s.V
			}
		}
		t.Fatal("no GPU_TEMP of GPU 2")
		return 0
	}
	if v := temp(start); v <= 85 {
		t.Fatalf("simulated GPU 2 at %v°C at start, want > 85", v)
	}
	cooled := time.Duration(0)
	for d := 12 * time.Second; d <= 50*time.Second; d += time.Second {
		if temp(start.Add(d)) < 85 {
			cooled = d
			break
		}
	}
	if cooled == 0 {
		t.Fatal("simulated GPU 2 does not cool below 85°C within 50s")
	}
	t.Logf("GPU 2 of %s: %v°C at start, below 85°C from start+%s", node, temp(start), cooled)

	sim, err := gpusim.New(simCfg)
	if err != nil {
		t.Fatal(err)
	}
	snd, err := gpusim.NewSender(gpusim.SenderConfig{
		URL: base + "/api/v1/write", Tenant: tenantID,
		ExternalLabels: []gpusim.Label{{Name: "cluster", Value: "gpu-cluster-e2e"}},
		Logger:         slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var buf []gpusim.Series
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			buf = sim.AppendSamples(buf[:0], time.Now(), gpusim.Replica{})
			_ = snd.Send(ctx, buf)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	defer func() { cancel(); wg.Wait() }()

	// The catalogue is recorded before the Xid appears, so the alert's
	// annotations can decode it on its first evaluation.
	waitFor(t, 14*time.Second, "gpu:xid_catalog:info recorded", func() error {
		var res struct {
			Data struct{ Result []any }
		}
		getJSON(t, base, "/api/v1/query?query=gpu:xid_catalog:info", tenantID, &res)
		if n := len(res.Data.Result); n != len(xid.All()) {
			return fmt.Errorf("%d catalogue series, want %d", n, len(xid.All()))
		}
		return nil
	})

	// GPUTemperatureHigh reaches the webhook with the shipped rule's labels.
	var hot webhookAlert
	waitFor(t, 30*time.Second, "GPUTemperatureHigh firing at the webhook", func() error {
		hot, err = hook.find("GPUTemperatureHigh", "firing", "node", node)
		return err
	})
	for k, want := range map[string]string{
		"node": node, "gpu": "2", "severity": "info", "priority": "P2", "category": "hardware",
		"modelName": "NVIDIA H100 80GB HBM3", "cluster": "gpu-cluster-e2e",
		"source": "gpustore-e2e", "tenant": tenantID,
	} {
		if got := hot.Labels[k]; got != want {
			t.Errorf("GPUTemperatureHigh label %s = %q, want %q (labels %v)", k, got, want, hot.Labels)
		}
	}
	// node names the host: with the exporter's Hostname/hostname or its pod
	// address among the labels, an exporter upgrade would page again.
	for _, gone := range []string{"instance", "pod", "Hostname", "hostname"} {
		if _, ok := hot.Labels[gone]; ok {
			t.Errorf("GPUTemperatureHigh keeps label %s: %v", gone, hot.Labels)
		}
	}
	if s := hot.Annotations["summary"]; !strings.Contains(s, "Node "+node+" GPU 2 at ") {
		t.Errorf("GPUTemperatureHigh summary %q", s)
	}

	// GPUXidError for Xid 79, decoded from the catalogue.
	entry, ok := xid.Lookup(79)
	if !ok {
		t.Fatal("Xid 79 not in the catalogue")
	}
	var xa webhookAlert
	waitFor(t, 30*time.Second, "GPUXidError firing at the webhook", func() error {
		xa, err = hook.find("GPUXidError", "firing", "node", node, "gpu", "5")
		return err
	})
	for k, want := range map[string]string{
		"node": node, "gpu": "5", "xid": "79", "severity": entry.Severity(), "priority": string(entry.Priority),
		"category": "hardware", "tenant": tenantID,
	} {
		if got := xa.Labels[k]; got != want {
			t.Errorf("GPUXidError label %s = %q, want %q (labels %v)", k, got, want, xa.Labels)
		}
	}
	if s := xa.Annotations["summary"]; !strings.Contains(s, "Xid 79 "+entry.Mnemonic) || !strings.Contains(s, string(entry.Action)) {
		t.Errorf("GPUXidError summary %q does not decode Xid 79 (%s, %s)", s, entry.Mnemonic, entry.Action)
	}
	if d := xa.Annotations["description"]; !strings.Contains(d, entry.Meaning) || !strings.Contains(d, entry.Action.Detail()) {
		t.Errorf("GPUXidError description %q lacks the catalogue's meaning %q", d, entry.Meaning)
	}

	// The ECC DBE on GPU 6 pages P0 through GPUECCDoubleBitError, whatever
	// Xid the last-Xid gauge ends on (45, P2, after the burst).
	var dbe webhookAlert
	waitFor(t, 30*time.Second, "GPUECCDoubleBitError firing at the webhook", func() error {
		dbe, err = hook.find("GPUECCDoubleBitError", "firing", "node", node, "gpu", "6")
		return err
	})
	if dbe.Labels["priority"] != "P0" || dbe.Labels["severity"] != "critical" || dbe.Labels["node"] != node {
		t.Errorf("GPUECCDoubleBitError labels %v", dbe.Labels)
	}
	// The power brake on GPU 3 pages GPUThrottling for hw_power_brake and
	// hw_slowdown (0x88), P1, and not for a thermal reason.
	for _, reason := range []string{"hw_power_brake", "hw_slowdown"} {
		var th webhookAlert
		waitFor(t, 30*time.Second, "GPUThrottling "+reason+" firing at the webhook", func() error {
			th, err = hook.find("GPUThrottling", "firing", "node", node, "gpu", "3", "reason", reason)
			return err
		})
		if th.Labels["priority"] != "P1" || th.Labels["severity"] != "warning" {
			t.Errorf("GPUThrottling labels %v", th.Labels)
		}
	}
	// The HW thermal slowdown on GPU 4 (0x48) pages GPUThrottling for
	// hw_thermal_slowdown and hw_slowdown, and not for a power brake.
	for _, reason := range []string{"hw_thermal_slowdown", "hw_slowdown"} {
		waitFor(t, 30*time.Second, "GPUThrottling "+reason+" on GPU 4 firing at the webhook", func() error {
			_, err = hook.find("GPUThrottling", "firing", "node", node, "gpu", "4", "reason", reason)
			return err
		})
	}
	// GPU 1's hot HBM pages GPUMemoryTemperatureOverOperatingLimit (P1)
	// against the exported DCGM_FI_DEV_MEM_MAX_OP_TEMP, and no die
	// temperature alert.
	var hbm webhookAlert
	waitFor(t, 30*time.Second, "GPUMemoryTemperatureOverOperatingLimit firing at the webhook", func() error {
		hbm, err = hook.find("GPUMemoryTemperatureOverOperatingLimit", "firing", "node", node, "gpu", "1")
		return err
	})
	if hbm.Labels["priority"] != "P1" || hbm.Labels["severity"] != "warning" || hbm.Labels["UUID"] == "" {
		t.Errorf("GPUMemoryTemperatureOverOperatingLimit labels %v", hbm.Labels)
	}
	// GPU 5 falls off the bus 30 s after its Xid 79: its series vanish and
	// GPUMissing pages P0 while the node's other GPUs still report.
	var missing webhookAlert
	waitFor(t, 60*time.Second, "GPUMissing firing at the webhook", func() error {
		missing, err = hook.find("GPUMissing", "firing", "node", node, "gpu", "5")
		return err
	})
	if missing.Labels["priority"] != "P0" || missing.Labels["severity"] != "critical" || missing.Labels["UUID"] == "" || missing.Labels["modelName"] == "" {
		t.Errorf("GPUMissing labels %v", missing.Labels)
	}
	// The upgraded exporter of the second node really names the host
	// `hostname` now (the premise of the check below).
	var upg struct {
		Data struct{ Result []any }
	}
	getJSON(t, base, "/api/v1/query?query="+url.QueryEscape(fmt.Sprintf(`count(DCGM_FI_DEV_GPU_UTIL{hostname=%q})`, upgraded)), tenantID, &upg)
	if len(upg.Data.Result) != 1 {
		t.Errorf("no DCGM series of %s with label hostname after its exporter upgrade: %v", upgraded, upg.Data.Result)
	}
	// The simulator writes no staleness markers: for the 15 s lookback after
	// the upgrade (start+20s) the upgraded node's GPUs are there under both
	// names. The pack's GPU counts (their expressions, at start+25s) still
	// count each GPU once: 16, of which GPU 5 of the first node is out for
	// its Xid 79 (they counted 24 and 23 while they kept Hostname/hostname).
	for record, want := range map[string]string{"cluster:gpu_total:count": "16", "cluster:gpu_available:count": "15"} {
		var count struct {
			Data struct {
				Result []struct{ Value [2]any }
			}
		}
		at := fmt.Sprintf("%d", start.Add(25*time.Second).Unix())
		getJSON(t, base, "/api/v1/query?time="+at+"&query="+url.QueryEscape(packRecordExpr(t, "gpu-recording.yml", record)), tenantID, &count)
		if len(count.Data.Result) != 1 || count.Data.Result[0].Value[1] != want {
			t.Errorf("%s at start+25s = %v, want %s (each GPU of the upgraded node once)", record, count.Data.Result, want)
		}
	}
	// Each fault brought its own alerts and nothing else; GPUs 0 and 7 of
	// the first node and every GPU of the upgraded node stay quiet (a rule
	// keyed on Hostname would see eight GPUs go missing there).
	for _, gpu := range []string{"0", "1", "3", "4", "5", "6", "7"} {
		for _, a := range hook.onGPU(node, gpu) {
			name, reason, xidCode := a.Labels["alertname"], a.Labels["reason"], a.Labels["xid"]
			switch {
			case gpu == "1" && name == "GPUMemoryTemperatureOverOperatingLimit":
			// Hot HBM sets the SW thermal slowdown reason (NVML: memory at its
			// maximum operating temperature).
			case gpu == "1" && name == "GPUThrottling" && reason == "sw_thermal_slowdown":
			case gpu == "3" && name == "GPUThrottling" && (reason == "hw_power_brake" || reason == "hw_slowdown"):
			case gpu == "4" && name == "GPUThrottling" && (reason == "hw_thermal_slowdown" || reason == "hw_slowdown"):
			case gpu == "5" && name == "GPUXidError" && xidCode == "79":
			case gpu == "5" && name == "GPUMissing":
			case gpu == "6" && name == "GPUECCDoubleBitError":
			case gpu == "6" && name == "GPURowRemapPending":
			// The burst ends in Xid 154 with a GPU-reset recovery action
			// (issue 39): the action pages P0, and so does its 154.
			case gpu == "6" && name == "GPURecoveryActionRequired" && a.Labels["priority"] == "P0":
			case gpu == "6" && name == "GPUXidError" && xidCode == "154" && a.Labels["priority"] == "P0":
			case gpu == "6" && name == "GPUXidError" && a.Labels["priority"] == string(mustLookup(t, xidCode).Priority):
			default:
				t.Errorf("unexpected alert on GPU %s: %v", gpu, a.Labels)
			}
		}
	}
	for _, a := range hook.onGPU(upgraded, "") {
		t.Errorf("unexpected alert on %s, whose exporter was only upgraded: %v", upgraded, a.Labels)
	}

	// /api/v1/rules and /api/v1/alerts, Prometheus' JSON, per tenant.
	var rulesResp struct {
		Status string
		Data   struct{ Groups []map[string]any }
	}
	waitFor(t, 10*time.Second, "the tenant's groups", func() error {
		getJSON(t, base, "/api/v1/rules", tenantID, &rulesResp)
		var names []string
		for _, g := range rulesResp.Data.Groups {
			names = append(names, fmt.Sprintf("%s (%s)", g["name"], g["file"]))
		}
		slices.Sort(names)
		want := []string{
			"gpu_chargeback (" + rules.PackPrefix + "gpu-chargeback.yml)",
			"gpu_hardware_alerts (" + filepath.Join(rulesDir, tenantID, "gpu-alerts.yml") + ")",
			"gpu_health (" + rules.PackPrefix + "gpu-health.yml)",
			"gpu_recording (" + rules.PackPrefix + "gpu-recording.yml)",
			"gpu_xid_catalog (" + filepath.Join(rulesDir, tenantID, "xid-catalog.yml") + ")",
			"node_alerts (" + rules.PackPrefix + "node-alerts.yml)",
			"training_alerts (" + rules.PackPrefix + "training-alerts.yml)",
		}
		if !slices.Equal(names, want) {
			return fmt.Errorf("groups %v, want %v", names, want)
		}
		return nil
	})
	if rulesResp.Status != "success" {
		t.Errorf("/api/v1/rules status %q", rulesResp.Status)
	}
	foundHot := false
	for _, g := range rulesResp.Data.Groups {
		hasKeys(t, "group", g, "name", "file", "rules", "interval", "limit", "evaluationTime", "lastEvaluation")
		for _, ri := range g["rules"].([]any) {
			r := ri.(map[string]any)
			switch r["type"] {
			case "alerting":
				hasKeys(t, "alerting rule", r, "state", "name", "query", "duration", "keepFiringFor", "labels", "annotations", "alerts", "health", "evaluationTime", "lastEvaluation")
				if r["name"] == "GPUTemperatureHigh" {
					foundHot = true
					if r["duration"] != 3.0 || r["health"] != "ok" {
						t.Errorf("GPUTemperatureHigh rule %v", r)
					}
				}
			case "recording":
				hasKeys(t, "recording rule", r, "name", "query", "health", "evaluationTime", "lastEvaluation")
			default:
				t.Errorf("rule of type %v", r["type"])
			}
		}
	}
	if !foundHot {
		t.Error("GPUTemperatureHigh not in /api/v1/rules")
	}
	var alertsResp struct {
		Status string
		Data   struct{ Alerts []map[string]any }
	}
	getJSON(t, base, "/api/v1/alerts", tenantID, &alertsResp)
	var firing []string
	for _, a := range alertsResp.Data.Alerts {
		hasKeys(t, "alert", a, "labels", "annotations", "state", "activeAt", "value")
		lbls := a["labels"].(map[string]any)
		firing = append(firing, fmt.Sprintf("%s/%s/%s", lbls["alertname"], lbls["gpu"], a["state"]))
	}
	// GPU 5's Xid alert has resolved with its vanished series; GPUMissing
	// has taken over.
	for _, want := range []string{"GPUMissing/5/firing", "GPUECCDoubleBitError/6/firing"} {
		if !slices.Contains(firing, want) {
			t.Errorf("/api/v1/alerts of %s = %v, want %s", tenantID, firing, want)
		}
	}
	// Another tenant sees none of it.
	getJSON(t, base, "/api/v1/rules", "someone-else", &rulesResp)
	getJSON(t, base, "/api/v1/alerts", "someone-else", &alertsResp)
	if len(rulesResp.Data.Groups) != 0 || len(alertsResp.Data.Alerts) != 0 {
		t.Errorf("tenant someone-else sees %d groups and %d alerts", len(rulesResp.Data.Groups), len(alertsResp.Data.Alerts))
	}

	// GPU 2 cools down: the alert is resolved at the webhook.
	var resolved webhookAlert
	waitFor(t, 60*time.Second, "GPUTemperatureHigh resolved at the webhook", func() error {
		resolved, err = hook.find("GPUTemperatureHigh", "resolved")
		return err
	})
	if resolved.Labels["gpu"] != "2" || resolved.Labels["node"] != node || !resolved.EndsAt.After(resolved.StartsAt) {
		t.Errorf("resolved alert %+v", resolved)
	}
	t.Logf("GPUTemperatureHigh fired at %s, resolved at %s (start %s)", hot.StartsAt.Format(time.TimeOnly), resolved.EndsAt.Format(time.TimeOnly), start.Format(time.TimeOnly))

	// The rule managers' metrics are on /metrics, per tenant.
	page := metricsPage(t, base)
	for _, want := range []string{
		`gpustore_rules_config_last_reload_successful{tenant="gpu-prod"} 1`,
		`prometheus_rule_evaluations_total{rule_group="` + filepath.Join(rulesDir, tenantID, "gpu-alerts.yml") + `;gpu_hardware_alerts",tenant="gpu-prod"}`,
		`prometheus_rule_group_iterations_missed_total{rule_group="` + rules.PackPrefix + `gpu-recording.yml;gpu_recording",tenant="gpu-prod"}`,
		`prometheus_notifications_sent_total{alertmanager="` + amURL + `/api/v2/alerts",tenant="gpu-prod"}`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	// A broken rule file on reload: 500, gauge 0, the rules keep running.
	broken := filepath.Join(rulesDir, tenantID, "broken.yml")
	if err := os.WriteFile(broken, []byte("groups:\n  - name: broken\n    rules:\n      - alert: X\n        expr: rate(\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(base+"/-/reload", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusInternalServerError || !strings.Contains(string(body), "broken.yml") {
		t.Errorf("reload with a broken file: %d %s", resp.StatusCode, body)
	}
	if page := metricsPage(t, base); !strings.Contains(page, `gpustore_rules_config_last_reload_successful{tenant="gpu-prod"} 0`) {
		t.Error("reload gauge did not drop to 0")
	}
	getJSON(t, base, "/api/v1/rules", tenantID, &rulesResp)
	// One group per pack file (the tenant's two copies replace two of them).
	if want := len(rulepack.Files()); len(rulesResp.Data.Groups) != want {
		t.Errorf("after a failed reload the tenant has %d groups, want its previous %d", len(rulesResp.Data.Groups), want)
	}
	if err := os.Remove(broken); err != nil {
		t.Fatal(err)
	}
	resp, err = http.Post(base+"/-/reload", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("reload after the fix: %d", resp.StatusCode)
	}
}

// mustLookup returns the catalogue entry of an Xid code given as a label.
func mustLookup(t *testing.T, code string) xid.Entry {
	t.Helper()
	var c int
	if _, err := fmt.Sscan(code, &c); err != nil {
		t.Fatalf("xid label %q: %v", code, err)
	}
	e, ok := xid.Lookup(c)
	if !ok {
		t.Fatalf("Xid %d not in the catalogue", c)
	}
	return e
}

// dcgm-exporter 4.9 (issue 39 item 3) renames its default metrics to DCGM
// 4.7's names, changes their units and renames the driver label. A
// simulated cluster on dcgm-exporter's own default counters is upgraded to
// 4.9 half-way and written to two tenants: with the dcgm preset every GPU
// keeps its series under the earlier name and unit (count, values, a
// counter's increase across the upgrade, the driver info series), so the
// pack's inventory and dashboards go on; without it the earlier names end
// at the upgrade (every node would go DCGMExporterDown) and 4.9's values
// are in other units.
func TestDCGMPresetAcrossExporter49(t *testing.T) {
	const (
		gpus     = 16
		interval = 15 * time.Second
	)
	start := time.Now().Add(-40 * time.Minute).Truncate(time.Minute)
	upgrade, end := start.Add(15*time.Minute), start.Add(30*time.Minute)
	var faults []gpusim.Fault
	for _, n := range []string{"0", "1"} {
		faults = append(faults, gpusim.Fault{Kind: gpusim.FaultExporterUpgrade49, At: upgrade.Sub(start), Node: n, GPU: -1})
	}
	cfg := gpusim.Config{Name: "gpu-a", Nodes: 2, Seed: 7, TargetLabels: true, Counters: gpusim.CountersDefault,
		Faults: faults, FaultOrigin: start, Epoch: start.Add(-2 * time.Hour)}
	sim, err := gpusim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	overrides := filepath.Join(t.TempDir(), "overrides.yaml")
	if err := os.WriteFile(overrides, []byte("overrides:\n  preset:\n    ingest_preset: dcgm\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, base := startGpustore(t, func(c *app.Config) {
		c.Limits.OverridesFile = overrides
		c.Rules.GPUPack = false
	})
	ext := []gpusim.Label{{Name: "cluster", Value: "gpu-a"}}
	var buf []gpusim.Series
	for _, tenant := range []string{"preset", "plain"} {
		snd, err := gpusim.NewSender(gpusim.SenderConfig{URL: base + "/api/v1/write", Tenant: tenant, ExternalLabels: ext, MaxRetries: 3})
		if err != nil {
			t.Fatal(err)
		}
		for ts := start; !ts.After(end); ts = ts.Add(interval) {
			buf = sim.AppendSamples(buf[:0], ts, gpusim.Replica{})
			buf = sim.AppendStaleMarkers(buf, ts, gpusim.Replica{})
			if err := snd.Send(context.Background(), buf); err != nil {
				t.Fatal(err)
			}
		}
	}
	count := func(tenant, expr string, at time.Time) float64 {
		t.Helper()
		v := queryTenant(t, base, tenant, "count("+expr+")", at)
		if len(v) == 0 {
			return 0
		}
		return scalarOf(t, v, expr)
	}
	before, after := upgrade.Add(-time.Minute), end
	for _, name := range []string{"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_XID_ERRORS"} {
		for _, at := range []time.Time{before, after} {
			if got := count("preset", name, at); got != gpus {
				t.Errorf("with the preset count(%s) at %s = %v, want %d", name, at.Sub(start), got, gpus)
			}
		}
		if got := count("plain", name, after); got != 0 {
			t.Errorf("without the preset count(%s) after the upgrade = %v, want 0 (4.9 names it otherwise)", name, got)
		}
	}
	for _, r := range gpusim.Exporter49Names {
		if got := count("preset", r.Name, after); got != 0 {
			t.Errorf("with the preset %v series keep 4.9's name %s", got, r.Name)
		}
	}
	if got := count("preset", `{DCGM_FI_SYSTEM_DRIVER_VERSION!=""}`, after); got != 0 {
		t.Errorf("with the preset %v series keep 4.9's driver label", got)
	}
	if got := count("preset", "dcgm_gpu_driver_info", after); got != gpus {
		t.Errorf("with the preset %v driver info series after the upgrade, want %d", got, gpus)
	}
	// Every 4.9 value is stored in the earlier unit, exactly.
	stored := map[string]float64{}
	for _, s := range queryTenant(t, base, "preset", `{__name__=~"DCGM_FI_DEV_(SM_CLOCK|MEM_CLOCK|FB_USED|FB_FREE|GPU_UTIL|TOTAL_ENERGY_CONSUMPTION)", gpu="3"}`, after) {
		// The preset keeps the host label as Hostname (its default).
		stored[string(s.Metric["__name__"])+"/"+string(s.Metric["Hostname"])] = float64(s.Value)
	}
	checked := 0
	for _, s := range sim.AppendSamples(nil, after, gpusim.Replica{}) {
		if s.Get("gpu") != "3" {
			continue
		}
		for old, r := range gpusim.Exporter49Names {
			if r.Name != s.Name() {
				continue
			}
			got, ok := stored[old+"/"+s.Get("hostname")]
			if !ok {
				continue
			}
			checked++
			if want := s.V / r.Scale; math.Abs(got-want) > 1e-9*math.Max(1, math.Abs(want)) {
				t.Errorf("%s: stored %v, 4.9 sent %v %s: want %v", old, got, s.V, r.Name, want)
			}
		}
	}
	if checked != 2*6 {
		t.Errorf("compared %d stored values with 4.9's, want 12 (6 metrics, 2 nodes)", checked)
	}
	// A counter's increase across the upgrade is the simulator's, in mJ.
	energyAt := func(at time.Time) float64 {
		total := 0.0
		for _, s := range sim.AppendSamples(nil, at, gpusim.Replica{}) {
			switch s.Name() {
			case "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION":
				total += s.V
			case "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL":
				total += s.V * 1000
			}
		}
		return total
	}
	from, to := upgrade.Add(-5*time.Minute), upgrade.Add(5*time.Minute)
	truth := energyAt(to) - energyAt(from)
	expr := `sum(max by (UUID) (increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[10m])))`
	got := scalarOf(t, queryTenant(t, base, "preset", `sum(increase((max by (UUID) (DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION))[10m:15s]))`, to), expr)
	if rel := math.Abs(got-truth) / truth; rel > 0.05 {
		t.Errorf("with the preset the per-GPU energy increase over the upgrade is %.4g mJ, the simulator's %.4g (%.1f%% off)", got, truth, 100*rel)
	}
}
