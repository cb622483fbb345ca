package compose

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	amconfig "github.com/prometheus/alertmanager/config"
	"github.com/prometheus/alertmanager/pkg/labels"

	"github.com/gpustore/gpustore/internal/testbin"
)

const amConfigFile = "alertmanager/alertmanager.yml"

// externalLabels are added to every alert by the sender (the sending
// Prometheus's external labels, gpustore's tenant): present on both alerts of
// an inhibition or absent on both, so comparing them needs no matcher.
var externalLabels = []string{"cluster", "tenant"}

// requiresNonEmpty reports whether ms only match alerts that carry label.
func requiresNonEmpty(ms []*labels.Matcher, label string) bool {
	return slices.ContainsFunc(ms, func(m *labels.Matcher) bool {
		return m.Name == label && !m.Matches("")
	})
}

// Every inhibit rule compares only labels both of its sides must carry:
// Alertmanager counts a label missing on both alerts as equal, so
// `equal: [cluster, Hostname, gpu]` let any P0 without Hostname and gpu mute
// every P1/P2 without them too (disk full, every training alert).
func TestInhibitRulesCompareLabelsBothSidesCarry(t *testing.T) {
	cfg, err := amconfig.LoadFile(amConfigFile)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.InhibitRules) == 0 {
		t.Fatal("no inhibit rules")
	}
	for i, r := range cfg.InhibitRules {
		var compared []string
		for _, l := range r.Equal {
			if slices.Contains(externalLabels, l) {
				continue
			}
			compared = append(compared, l)
			if !requiresNonEmpty([]*labels.Matcher(r.SourceMatchers), l) || !requiresNonEmpty([]*labels.Matcher(r.TargetMatchers), l) {
				t.Errorf("inhibit rule %d compares %q but does not require it on both sides (source %v, target %v)", i, l, r.SourceMatchers, r.TargetMatchers)
			}
		}
		if len(compared) == 0 {
			t.Errorf("inhibit rule %d compares only external labels: it would mute across the whole cluster", i)
		}
	}
}

// alert is one alert as posted to and read back from Alertmanager's API v2.
type alert struct {
	Labels map[string]string `json:"labels"`
	Status struct {
		InhibitedBy []string `json:"inhibitedBy"`
	} `json:"status,omitempty"`
	Fingerprint string `json:"fingerprint,omitempty"`
}

func gpuAlert(name, prio, cluster, node, gpu, uuid string, extra ...string) map[string]string {
	l := map[string]string{
		"alertname": name, "priority": prio, "severity": map[string]string{"P0": "critical", "P1": "warning", "P2": "info"}[prio],
		"category": "hardware", "cluster": cluster, "tenant": "gpu-prod", "node": node,
		"gpu": gpu, "UUID": uuid, "pci_bus_id": "00000000:18:00.0", "device": "nvidia" + gpu,
		"modelName": "NVIDIA H100 80GB HBM3", "DCGM_FI_DRIVER_VERSION": "570.172.08", "job": "dcgm-exporter",
	}
	for i := 0; i+1 < len(extra); i += 2 {
		l[extra[i]] = extra[i+1]
	}
	return l
}

// inhibitionCase is an alert and whether the shipped rules must mute it.
type inhibitionCase struct {
	why       string
	labels    map[string]string
	inhibited bool
}

// The label sets are those the GPU rule pack gives its alerts
// (deploy/rules/tests: GPU alerts carry node and UUID and, since issue 31,
// never Hostname/hostname; node-scoped alerts node, training alerts the pod's
// labels), with gpustore's tenant and the sender's cluster.
func inhibitionCases() []inhibitionCase {
	const cl = "gpu-cluster-prod-01"
	return []inhibitionCase{
		// A GPU's P0 and the symptoms of the same GPU.
		{"source: Xid 79 on GPU 5", gpuAlert("GPUXidError", "P0", cl, "gpu-node-01", "5", "GPU-55555555-0000-4000-8000-000000000005", "xid", "79"), false},
		{"GPU 5 throttles because of its own fault", gpuAlert("GPUThrottling", "P1", cl, "gpu-node-01", "5", "GPU-55555555-0000-4000-8000-000000000005", "reason", "hw_slowdown"), true},
		{"GPU 5 runs hot", gpuAlert("GPUTemperatureHigh", "P2", cl, "gpu-node-01", "5", "GPU-55555555-0000-4000-8000-000000000005"), true},
		{"another GPU of the node is not muted", gpuAlert("GPUTemperatureHigh", "P2", cl, "gpu-node-01", "6", "GPU-66666666-0000-4000-8000-000000000006"), false},
		{"the same GPU's other P0 is not muted", gpuAlert("GPURecoveryActionRequired", "P0", cl, "gpu-node-01", "5", "GPU-55555555-0000-4000-8000-000000000005"), false},
		// Alerts without node/UUID: a P0 of that kind mutes nothing, and none of them is muted.
		{"source: a stalled training job (P0, no node/UUID)", map[string]string{"alertname": "TrainingJobStalled", "priority": "P0", "severity": "critical", "category": "application", "cluster": cl, "tenant": "gpu-prod", "namespace": "training", "pod": "llm-worker-3", "job_name": "llm-pretrain"}, false},
		{"a full disk elsewhere is not muted by it", map[string]string{"alertname": "NodeDiskFull", "priority": "P1", "severity": "warning", "category": "capacity", "cluster": cl, "tenant": "gpu-prod", "instance": "10.0.3.7:9100", "mountpoint": "/var/lib/kubelet", "node": "gpu-node-03"}, false},
		{"another job's slow data loading is not muted", map[string]string{"alertname": "DataLoadLatencyHigh", "priority": "P2", "severity": "info", "category": "performance", "cluster": cl, "tenant": "gpu-prod", "namespace": "training", "pod": "vit-worker-0"}, false},
		// A node that is down mutes all of it, P0s included.
		{"source: GPU 7 must drain peer-to-peer traffic (P1)", gpuAlert("GPURecoveryActionRequired", "P1", cl, "gpu-node-01", "7", "GPU-77777777-0000-4000-8000-000000000007"), false},
		{"the Xid 154 that announced it (ranked by the drain: P1)", gpuAlert("GPUXidError", "P1", cl, "gpu-node-01", "7", "GPU-77777777-0000-4000-8000-000000000007", "xid", "154"), true},
		{"another Xid of GPU 7 still notifies", gpuAlert("GPUXidError", "P1", cl, "gpu-node-01", "7", "GPU-77777777-0000-4000-8000-000000000007", "xid", "74"), false},
		{"another GPU's Xid 154 still notifies", gpuAlert("GPUXidError", "P1", cl, "gpu-node-01", "6", "GPU-66666666-0000-4000-8000-000000000006", "xid", "154"), false},
		{"source: gpu-node-02 is down", map[string]string{"alertname": "NodeUnreachable", "priority": "P0", "severity": "critical", "category": "infrastructure", "cluster": cl, "tenant": "gpu-prod", "job": "node-exporter", "instance": "10.0.2.9:9100", "node": "gpu-node-02"}, false},
		{"its GPUs go missing", gpuAlert("GPUMissing", "P0", cl, "gpu-node-02", "0", "GPU-02000000-0000-4000-8000-000000000000"), true},
		{"its exporter is down", map[string]string{"alertname": "DCGMExporterDown", "priority": "P1", "severity": "warning", "category": "infrastructure", "cluster": cl, "tenant": "gpu-prod", "node": "gpu-node-02"}, true},
		{"its disk alert", map[string]string{"alertname": "NodeDiskFull", "priority": "P1", "severity": "warning", "category": "capacity", "cluster": cl, "tenant": "gpu-prod", "instance": "10.0.2.9:9100", "mountpoint": "/", "node": "gpu-node-02"}, true},
		{"the same node name in another cluster is not muted", gpuAlert("GPUMissing", "P0", "gpu-cluster-lab", "gpu-node-02", "0", "GPU-02bbbbbb-0000-4000-8000-000000000000"), false},
		// The exporter of gpu-node-04 is down (P1): its GPUs' P1/P2 alerts
		// wait behind it, a P0 is not muted by it (issue 39: a GPU loss
		// reported at P1).
		{"source: gpu-node-04's exporter is down", map[string]string{"alertname": "DCGMExporterDown", "priority": "P1", "severity": "warning", "category": "infrastructure", "cluster": cl, "tenant": "gpu-prod", "node": "gpu-node-04"}, false},
		{"gpu-node-04's GPU runs hot", gpuAlert("GPUTemperatureHigh", "P2", cl, "gpu-node-04", "2", "GPU-04000000-0000-4000-8000-000000000002"), true},
		{"gpu-node-04's GPU going missing still pages (a P1 mutes no P0)", gpuAlert("GPUMissing", "P0", cl, "gpu-node-04", "1", "GPU-04000000-0000-4000-8000-000000000001"), false},
		{"gpu-node-05's GPU going missing still pages", gpuAlert("GPUMissing", "P0", cl, "gpu-node-05", "1", "GPU-05000000-0000-4000-8000-000000000001"), false},
		// gpu-node-06's exporter is down and the node shows a GPU lost (P0): it mutes all of the node's GPU alerts.
		{"source: gpu-node-06's exporter is down with a GPU lost", map[string]string{"alertname": "DCGMExporterDown", "priority": "P0", "severity": "critical", "category": "infrastructure", "cluster": cl, "tenant": "gpu-prod", "node": "gpu-node-06"}, false},
		{"gpu-node-06's GPU missing", gpuAlert("GPUMissing", "P0", cl, "gpu-node-06", "1", "GPU-06000000-0000-4000-8000-000000000001"), true},
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startAlertmanager runs the real Alertmanager with the shipped config on
// loopback (no cluster port) and returns its base URL.
func startAlertmanager(t *testing.T) string {
	t.Helper()
	bin := testbin.Need(t, "alertmanager")
	dir := t.TempDir()
	cfg, err := filepath.Abs(amConfigFile)
	if err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	testbin.Start(t, bin, "--config.file="+cfg, "--storage.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--cluster.listen-address=", "--log.level=warn")
	base := "http://" + addr
	poll(t, 30*time.Second, "alertmanager ready", func() error {
		resp, err := http.Get(base + "/-/ready")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	})
	return base
}

func poll(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func key(l map[string]string) string {
	var parts []string
	for k, v := range l {
		parts = append(parts, k+"="+v)
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// priorityRank orders the pack's priorities, most urgent first.
var priorityRank = map[string]int{"P0": 0, "P1": 1, "P2": 2}

// possiblePriorities returns the priorities ms lets an alert have: those
// its priority matchers accept, all three without one.
func possiblePriorities(ms []*labels.Matcher) []string {
	var out []string
	for _, p := range []string{"P0", "P1", "P2"} {
		ok := true
		for _, m := range ms {
			if m.Name == "priority" && !m.Matches(p) {
				ok = false
			}
		}
		if ok {
			out = append(out, p)
		}
	}
	return out
}

// packPriorities are the priorities each alert of the pack can carry that
// a source matcher on alertname narrows to (NodeUnreachable is P0 only).
var packPriorities = map[string][]string{"NodeUnreachable": {"P0"}}

// No inhibit rule lets an alert mute one that is more urgent: a P1
// DCGMExporterDown muting the P0 GPUMissing of the GPU whose loss hung the
// exporter reported that loss at P1 (issue 39). For every priority a
// rule's source can have, every priority its target can have is the same
// or lower.
func TestInhibitRulesNeverMuteAHigherPriority(t *testing.T) {
	cfg, err := amconfig.LoadFile(amConfigFile)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range cfg.InhibitRules {
		src := possiblePriorities([]*labels.Matcher(r.SourceMatchers))
		for _, m := range r.SourceMatchers {
			if m.Name == "alertname" && m.Type == labels.MatchEqual {
				if ps, ok := packPriorities[m.Value]; ok && len(src) == 3 {
					src = ps
				}
			}
		}
		for _, ps := range src {
			for _, pt := range possiblePriorities([]*labels.Matcher(r.TargetMatchers)) {
				if priorityRank[pt] < priorityRank[ps] {
					t.Errorf("inhibit rule %d (source %v, target %v) lets a %s mute a %s", i, r.SourceMatchers, r.TargetMatchers, ps, pt)
				}
			}
		}
	}
}

// The shipped inhibit rules, in the real Alertmanager: alerts with the pack's
// label shapes are posted; each is muted exactly when it should be.
func TestInhibitionInRealAlertmanager(t *testing.T) {
	base := startAlertmanager(t)
	cases := inhibitionCases()
	var post []alert
	for _, c := range cases {
		post = append(post, alert{Labels: c.labels})
	}
	body, err := json.Marshal(post)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(base+"/api/v2/alerts", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /api/v2/alerts: %d %s", resp.StatusCode, b)
	}
	// The inhibitor learns its sources asynchronously: wait until every
	// alert is listed and the answer stops changing against the cases.
	var got map[string]alert
	poll(t, 20*time.Second, "every posted alert listed with the expected inhibition", func() error {
		resp, err := http.Get(base + "/api/v2/alerts")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var listed []alert
		if err := json.NewDecoder(resp.Body).Decode(&listed); err != nil {
			return err
		}
		got = map[string]alert{}
		for _, a := range listed {
			got[key(a.Labels)] = a
		}
		for _, c := range cases {
			a, ok := got[key(c.labels)]
			if !ok {
				return fmt.Errorf("%s: not listed", c.why)
			}
			if (len(a.Status.InhibitedBy) > 0) != c.inhibited {
				return fmt.Errorf("%s (%s): inhibited by %v, want inhibited=%v", c.why, c.labels["alertname"], a.Status.InhibitedBy, c.inhibited)
			}
		}
		return nil
	})
}
