package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grafana/dskit/user"
	"github.com/prometheus/common/model"
	"gopkg.in/yaml.v3"

	"github.com/gpustore/gpustore/bench/gpusim"
	"github.com/gpustore/gpustore/internal/testbin"
	"github.com/gpustore/gpustore/pkg/app"
)

// The simulated day (issue 31): gpusim produces every fault class it can
// on distinct GPUs and nodes of one cluster; gpustore stores the data and
// evaluates the real embedded GPU pack (rules.gpu_pack, unmodified); its
// notifier sends to a real Alertmanager started with the shipped
// deploy/compose/alertmanager config (routes, grouping and inhibit rules),
// whose receiver is a webhook the test records. The notifications must be
// exactly deploy/rules/testdata/notifications.yaml: every `notify` alert
// once (one firing episode, never resolved and fired again), nothing from
// `inhibited` or `silent`, nothing else.
//
// Why this proves the contract although a day takes a minute: time is
// simulated, not skipped. The ruler runs with rules.Config.ManualEvaluation,
// so nothing is evaluated on the wall clock; the test steps a simulated
// clock through the day in 15 s scrapes, writes each scrape's samples (and
// staleness markers) through gpustore's remote-write endpoint at their
// simulated time, and evaluates each of the tenant's rule groups with
// Prometheus' own (*rules.Group).Eval at its own slots (group interval and
// offset as the manager would run it). So `for`, `keep_firing_for`, ranges,
// offsets, ALERTS and the resend logic work on simulated time exactly as
// they do on the wall clock. Alertmanager cannot be given a clock, so the
// whole world runs `speedup` times faster than real: the simulated clock is
// paced at that rate, the shipped Alertmanager timers (group_wait,
// group_interval, repeat_interval) are divided by it, and a proxy between
// gpustore's notifier and Alertmanager maps the alerts' startsAt/endsAt
// from simulated to real time at the same rate. Alertmanager's grouping,
// deduplication, inhibition and resolution then see the ordering and
// overlaps the alerts would have in a real day.
//
// Three classes need more history than the paced day (an hour without a
// first step, `for: 30m`, Xids in three distinct hours): their cluster's
// data starts before the day and is written and evaluated unpaced first,
// its notifications dropped; their alerts fall due in the paced part (see
// dayHistoryCluster).
//
// Classes the simulator cannot produce are listed by the test
// (dayUnsimulated, empty now); the test fails if a class of the yaml is
// neither simulated nor listed there.

// speedup is how much faster than real time the simulated day runs.
const speedup = 40

// dayUnsimulated are the classes of notifications.yaml that gpusim has no
// fault for yet.
var dayUnsimulated = []string{}

// The day's faults, keyed by the contract's class names. Faults start
// faultsAt into the day, after history (counters, jobs, the exporter's
// age) has built up; node 0 and 1 carry one GPU fault per GPU, nodes 2-5,
// 7 and 15 a node fault each, node 6 an ECC storm and PCIe replays, the
// training faults hit jobs from node 8 on. Faults that need another GPU
// model (or a job starting during the day) are in dayOtherClusters.
const (
	faultsAt = 12 * time.Minute
	dayLen   = 32 * time.Minute
	// dayHour is where in the day an hour starts; dayEpochAge how long the
	// simulated cluster has run when the day starts.
	dayHour     = 24 * time.Minute
	dayEpochAge = 10*24*time.Hour + 7*time.Hour
)

// dayTrainingFrom is the first node index the training faults may hit.
const dayTrainingFrom = 8

func dayFaults() map[string]gpusim.Fault {
	long := dayLen
	gpu := func(kind gpusim.FaultKind, node string, g, code int) gpusim.Fault {
		return gpusim.Fault{Kind: kind, At: faultsAt, Duration: long, Node: node, GPU: g, Code: code}
	}
	return map[string]gpusim.Fault{
		// gpusim's overheat drives the die to ~92 °C, past the H100's 87 °C.
		"at_operating_limit":        gpu(gpusim.FaultOverheat, "0", 0, 0),
		"hbm_overheat":              gpu(gpusim.FaultHBMOverheat, "0", 1, 0),
		"power_brake":               gpu(gpusim.FaultThrottle, "0", 2, 0),
		"hw_thermal_slowdown":       gpu(gpusim.FaultThrottleThermal, "0", 3, 0),
		"application_xid":           gpu(gpusim.FaultXid, "0", 4, 13),
		"xid_79_fallen_off_bus":     gpu(gpusim.FaultXid, "0", 5, 79),
		"nvlink_xid_74":             gpu(gpusim.FaultXid, "0", 6, 74),
		"ecc_dbe":                   gpu(gpusim.FaultECCDBE, "0", 7, 0),
		"recovery_action_reset":     gpu(gpusim.FaultRecoveryAction, "1", 0, 1),
		"recovery_action_drain_p2p": gpu(gpusim.FaultRecoveryAction, "1", 1, 3),
		"row_remap_failure":         gpu(gpusim.FaultRowRemapFailure, "1", 2, 0),
		"nvlink_crc":                gpu(gpusim.FaultNVLinkCRCBurst, "1", 3, 0),
		"nvlink_replay":             gpu(gpusim.FaultNVLinkReplay, "1", 4, 0),
		"mig_reconfigured":          gpu(gpusim.FaultMIG, "1", 5, 0),
		// 86 °C: above GPUTemperatureHigh's 85 °C, below the H100's 87 °C.
		"overheat": {Kind: gpusim.FaultOverheat, At: faultsAt, Duration: long, Node: "1", GPU: 6, Value: 86},
		// One 15 s scrape with the HW-slowdown bit.
		"pstate_change": {Kind: gpusim.FaultPStateChange, At: faultsAt, Duration: 15 * time.Second, Node: "1", GPU: 7},
		// 2 corrected errors a minute: past 10 in the hour 6 minutes in.
		"sbe_storm": {Kind: gpusim.FaultSBEStorm, At: faultsAt, Duration: long, Node: "6", GPU: 0, Value: 100}, // 6000 an hour: over GPUECCSingleBitErrorRate's 1000 within the day
		// 20 replays a minute: under an H100's Gen5 x16 limit of 31.
		"pcie_replays_under_limit": {Kind: gpusim.FaultPCIeReplays, At: faultsAt, Duration: long, Node: "6", GPU: 1, Value: 20},
		"exporter_upgrade":         {Kind: gpusim.FaultExporterUpgrade, At: faultsAt, Node: "2"},
		"node_down":                {Kind: gpusim.FaultNodeDown, At: faultsAt, Duration: long, Node: "3"},
		"exporter_crash":           {Kind: gpusim.FaultExporterCrash, At: faultsAt, Duration: long, Node: "4"},
		"exporter_hung":            {Kind: gpusim.FaultExporterHung, At: faultsAt, Duration: long, Node: "5"},
		// The last node of its block: the slots kept empty for the
		// autoscaler leave the training nodes' jobs alone.
		"node_removed": {Kind: gpusim.FaultNodeRemoved, At: faultsAt, Node: "15"},
		// 9 minutes in, when its companions' alerts fire (dayCompanions).
		"exporter_rollout": {Kind: gpusim.FaultExporterRestart, At: faultsAt + 9*time.Minute, Duration: 45 * time.Second, Node: "7", GPU: 0},
	}
}

// dayCompanions are faults that accompany a class's fault on its node and
// GPU, listed in the class's `notify`: the failed row remap of the
// exporter_upgrade node's GPU 0 starts 5 minutes before the upgrade renames
// Hostname to hostname, so its alert, firing and kept by keep_firing_for, must
// reach Alertmanager once, under one label set, across the upgrade (issue 31).
//
// The exporter_rollout node's GPU 0 logs NVLink CRC errors and runs at
// 86 °C from the faults' start, so NVLinkCRCErrors (for: 5m) and
// GPUTemperatureHigh (for: 2m) fire before its exporter's pod is replaced:
// both must stay one firing episode across the 45 s without series (issue
// 39 item 7).
func dayCompanions() []gpusim.Fault {
	upgrade := dayFaults()["exporter_upgrade"]
	rollout := dayFaults()["exporter_rollout"]
	return []gpusim.Fault{
		{Kind: gpusim.FaultRowRemapFailure, At: upgrade.At - 5*time.Minute, Duration: dayLen, Node: upgrade.Node, GPU: upgrade.GPU},
		{Kind: gpusim.FaultNVLinkCRCBurst, At: faultsAt, Duration: dayLen, Node: rollout.Node, GPU: rollout.GPU},
		{Kind: gpusim.FaultOverheat, At: faultsAt, Duration: dayLen, Node: rollout.Node, GPU: rollout.GPU, Value: 86},
	}
}

// dayCluster is one of the day's smaller clusters: the faults that need
// another GPU model, each in a cluster of its own (its own label cluster;
// hostnames like the main one's).
type dayCluster struct {
	cfg    gpusim.Config
	faults map[string]gpusim.Fault
}

func dayOtherClusters(day0 time.Time) []dayCluster {
	cluster := func(name, gpuModel string, seed uint64, faults map[string]gpusim.Fault) dayCluster {
		cfg := gpusim.Config{Name: name, Nodes: 2, Seed: seed, GPUModel: gpuModel, TargetLabels: true, XidsPerGPUYear: -1,
			Epoch: day0.Add(-dayEpochAge), FaultOrigin: day0}
		for _, n := range sortedKeys(faults) {
			cfg.Faults = append(cfg.Faults, faults[n])
		}
		return dayCluster{cfg: cfg, faults: faults}
	}
	return []dayCluster{
		// Seed 19: node 0's job starts between 1 and 12 minutes into the day
		// and runs past its end (the main cluster starts no job in the day).
		cluster("gpu-cluster-a100", gpusim.ModelA100, 19, map[string]gpusim.Fault{
			// 20 replays a minute: over an A100's Gen4 x16 limit of 16.
			"pcie_replays_over_limit": {Kind: gpusim.FaultPCIeReplays, At: faultsAt, Duration: dayLen, Node: "1", GPU: 0, Value: 20},
			// The job loads until 21 minutes into the day, then trains.
			"training_slow_start": {Kind: gpusim.FaultTrainingSlowStart, At: time.Minute, Duration: 20 * time.Minute, Node: "0"},
		}),
		// Seed 5: node 1's job runs from before the faults to past 31m.
		cluster("gpu-cluster-b200", gpusim.ModelB200, 5, map[string]gpusim.Fault{
			"nvlink5_symbol_errors": {Kind: gpusim.FaultNVLink5SymbolErrors, At: faultsAt, Duration: dayLen, Node: "1", GPU: 2},
			// An 18-minute checkpoint save of that job, from the faults'
			// start to 30m, GPUs in the checkpoint phase (issue 39: it
			// paged TrainingJobStalled P0).
			"training_checkpoint_pause": {Kind: gpusim.FaultTrainingPause, At: faultsAt, Duration: 18 * time.Minute, Node: "1"},
		}),
		defaultCounters(cluster("gpu-cluster-defaults", gpusim.ModelH100, 7, map[string]gpusim.Fault{
			// Between two scrapes, as a real burst is (it lasts 4 s): the
			// gauge goes from 0 straight to the burst's last code, 154.
			"ecc_dbe_default_counters": {Kind: gpusim.FaultECCDBE, At: faultsAt + 7*time.Second, Duration: dayLen, Node: "1", GPU: 0},
			// Node 0 (no job) is cordoned, drained and rebooted: down 6
			// of its 8 minutes.
			"planned_reboot": {Kind: gpusim.FaultMaintenanceReboot, At: faultsAt, Duration: 8 * time.Minute, Node: "0"},
		})),
	}
}

// defaultCounters makes a cluster's dcgm-exporters run dcgm-exporter's own
// default counters CSV (issue 39 item 2).
func defaultCounters(c dayCluster) dayCluster {
	c.cfg.Counters = gpusim.CountersDefault
	return c
}

// The history cluster carries the classes that need more history than the
// paced day: an hour without a first step, `for: 30m`, Xids in three
// distinct hours. Its data starts historyLen before the day and is written
// and evaluated unpaced (the backfill), with nothing reaching Alertmanager
// (the proxy drops it, as if Alertmanager were unreachable), so the paced
// part's Alertmanager timers are untouched; each alert falls due in the
// paced part and goes through Alertmanager as any other. Seed 323 with 3
// nodes places the jobs as the faults need (the test checks it):
//   - training_start_hang: node 0's single-node job starts ~50 minutes
//     before the day and loads until after it; TrainingJobNotStarting is
//     due an hour after its start, ~10 minutes into the day;
//   - idle_allocation: node 1's job runs through the day; its pod holds
//     GPU 3 unused from 25 minutes before the day, so GPUUtilizationLow
//     (`for: 30m`) is due ~5 minutes into the day;
//   - repeated_hardware_xids: GPU 5 of node 2 (in neither job) falls off
//     the bus (Xid 79, back after a 3-minute power cycle) in each of the
//     three hours that end dayHour into the day, all before the day; the
//     third hour bucket of GPURMACandidate's 1h subquery closes dayHour
//     into the day, so it is due at the health group's next evaluation,
//     long after the last Xid's P0 pages (muted with the backfill)
//     resolved.
const (
	historyLen  = 110 * time.Minute
	historyIdle = 25 * time.Minute
)

func dayHistoryCluster(day0 time.Time) dayCluster {
	end := dayLen + 10*time.Minute // past the day's end: nothing resolves in it
	faults := map[string]gpusim.Fault{
		"training_start_hang": {Kind: gpusim.FaultTrainingSlowStart, At: -time.Hour, Duration: time.Hour + end, Node: "0"},
		"idle_allocation":     {Kind: gpusim.FaultIdleAllocation, At: -historyIdle, Duration: historyIdle + end, Node: "1", GPU: 3},
	}
	// GPURMACandidate's hour buckets end dayHour-2h, dayHour-1h and
	// dayHour into the day. An Xid is recent (gpu:xid_errors:recent) for
	// up to 10 minutes: the first two come 11 minutes before their bucket
	// ends, the third 6 minutes into its bucket, so its pages resolve long
	// before the day.
	var xids []gpusim.Fault
	for _, at := range []time.Duration{dayHour - 2*time.Hour - 11*time.Minute, dayHour - time.Hour - 11*time.Minute, dayHour - time.Hour + 6*time.Minute} {
		xids = append(xids, gpusim.Fault{Kind: gpusim.FaultXid, Code: 79, At: at, Duration: 3 * time.Minute, Node: "2", GPU: 5})
	}
	faults["repeated_hardware_xids"] = xids[0]
	cfg := gpusim.Config{Name: "gpu-cluster-history", Nodes: 3, Seed: 323, TargetLabels: true, XidsPerGPUYear: -1,
		Epoch: day0.Add(-dayEpochAge), FaultOrigin: day0}
	for _, n := range sortedKeys(faults) {
		if n != "repeated_hardware_xids" {
			cfg.Faults = append(cfg.Faults, faults[n])
		}
	}
	cfg.Faults = append(cfg.Faults, xids...)
	return dayCluster{cfg: cfg, faults: faults}
}

// checkHistoryJobs fails unless the history cluster's jobs are where
// dayHistoryCluster's faults need them (a job ended by one of node 2's Xid
// 79s would not run on to the day's end), and returns the namespace and
// pod that hold the idle GPU and those of the job hung at its start.
func checkHistoryJobs(t *testing.T, cfg gpusim.Config, day0 time.Time) (namespace, pod, hangNamespace, hangPod string) {
	t.Helper()
	sim, err := gpusim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	podAt := func(node int, gpu string, d time.Duration) (ns, pod string) {
		for _, s := range sim.AppendSamples(nil, day0.Add(d), gpusim.Replica{}) {
			if s.Name() == "DCGM_FI_DEV_GPU_UTIL" && s.Get("Hostname") == sim.Hostnames()[node] && s.Get("gpu") == gpu {
				return s.Get("namespace"), s.Get("pod")
			}
		}
		return "", ""
	}
	_, before := podAt(0, "0", -55*time.Minute)
	hangNamespace, hang := podAt(0, "0", -45*time.Minute)
	if _, last := podAt(0, "0", dayLen); before != "" || hang == "" || last != hang {
		t.Fatalf("history node 0: pods %q, %q, %q at -55m, -45m and the day's end; want one job starting in between and running on", before, hang, last)
	}
	namespace, pod = podAt(1, "3", -historyIdle)
	if _, last := podAt(1, "3", dayLen); pod == "" || last != pod || jobOfPod(pod) == jobOfPod(hang) {
		t.Fatalf("history node 1 GPU 3: pods %q at -%s, %q at the day's end; want one pod of another job than node 0's %q holding it", pod, historyIdle, last, hang)
	}
	return namespace, pod, hangNamespace, hang
}

// The training faults, each on a job of its own from node dayTrainingFrom
// on (the cluster's jobs as cfg, with the day's other faults, places them):
//   - training_stall: a job running from before the faults to the day's
//     end stops iterating at faultsAt;
//   - straggler: the rank on GPU 2 of a job running from 3 minutes into
//     the day to its end iterates 1.5 times slower from 4 minutes on
//     (TrainingStraggler needs 10 minutes of mean and `for: 15m`).
func trainingFaults(t *testing.T, cfg gpusim.Config, day0 time.Time) map[string]gpusim.Fault {
	sim, err := gpusim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	taken := map[string]bool{}
	stall := jobNodeOf(t, sim, day0, taken, func(pod func(time.Duration) string) bool {
		return pod(faultsAt-time.Minute) != "" && pod(faultsAt-time.Minute) == pod(dayLen)
	})
	straggler := jobNodeOf(t, sim, day0, taken, func(pod func(time.Duration) string) bool {
		return pod(3*time.Minute) != "" && pod(3*time.Minute) == pod(dayLen)
	})
	return map[string]gpusim.Fault{
		"training_stall": {Kind: gpusim.FaultTrainingStall, At: faultsAt, Duration: dayLen, Node: stall},

		"straggler": {Kind: gpusim.FaultStraggler, At: 4 * time.Minute, Duration: dayLen, Node: straggler, GPU: 2, Value: 1.5},
	}
}

// contract is deploy/rules/testdata/notifications.yaml.
type contract struct {
	Classes []struct {
		Fault         string          `yaml:"fault"`
		Notifications int             `yaml:"notifications"`
		Notify        []contractAlert `yaml:"notify"`
		Inhibited     []contractAlert `yaml:"inhibited"`
		Silent        []string        `yaml:"silent"`
	} `yaml:"classes"`
}

type contractAlert struct {
	Alertname string `yaml:"alertname"`
	Priority  string `yaml:"priority"`
	Scope     string `yaml:"scope"`
	Xid       string `yaml:"xid"`
	Reason    string `yaml:"reason"`
	Counter   string `yaml:"counter"`
}

// simClock is the simulated time the day has reached, shared with the
// proxy that maps alert times to real time.
type simClock struct{ ms atomic.Int64 }

func (c *simClock) now() time.Time  { return time.UnixMilli(c.ms.Load()) }
func (c *simClock) set(t time.Time) { c.ms.Store(t.UnixMilli()) }
func (c *simClock) real(t time.Time) time.Time {
	return time.Now().Add(t.Sub(c.now()) / speedup)
}

// amTimeProxy forwards gpustore's notifier's POSTs to Alertmanager with
// startsAt/endsAt mapped from simulated to real time. While muted it
// accepts and drops them (the backfill's notifications).
func amTimeProxy(t *testing.T, clock *simClock, amURL string, muted *atomic.Bool) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if muted.Load() {
			_, _ = io.Copy(io.Discard, r.Body)
			return
		}
		var alerts []map[string]any
		if err := json.NewDecoder(r.Body).Decode(&alerts); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		for _, a := range alerts {
			for _, k := range []string{"startsAt", "endsAt"} {
				s, _ := a[k].(string)
				if s == "" {
					continue
				}
				ts, err := time.Parse(time.RFC3339Nano, s)
				if err != nil {
					http.Error(w, err.Error(), http.StatusBadRequest)
					return
				}
				a[k] = clock.real(ts).Format(time.RFC3339Nano)
			}
		}
		b, _ := json.Marshal(alerts)
		resp, err := http.Post(amURL+r.URL.Path, "application/json", bytes.NewReader(b))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	}))
}

// shippedAlertmanagerConfig is deploy/compose/alertmanager/alertmanager.yml
// with every receiver sending to hookURL and the route's timers divided by
// speedup. Routes, grouping and inhibit rules are the shipped ones.
func shippedAlertmanagerConfig(t *testing.T, hookURL string) string {
	t.Helper()
	b, err := os.ReadFile("../../deploy/compose/alertmanager/alertmanager.yml")
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	// Every route's timers, the sub-routes' too (the GPU route's group_wait).
	var scale func(route map[string]any)
	scale = func(route map[string]any) {
		for _, k := range []string{"group_wait", "group_interval", "repeat_interval"} {
			v, ok := route[k].(string)
			if !ok {
				continue
			}
			d, err := model.ParseDuration(v)
			if err != nil {
				t.Fatalf("route %s: %v", k, err)
			}
			route[k] = (d / speedup).String()
		}
		routes, _ := route["routes"].([]any)
		for _, r := range routes {
			scale(r.(map[string]any))
		}
	}
	scale(cfg["route"].(map[string]any))
	for _, r := range cfg["receivers"].([]any) {
		r.(map[string]any)["webhook_configs"] = []any{map[string]any{"url": hookURL, "send_resolved": true}}
	}
	if len(cfg["inhibit_rules"].([]any)) == 0 {
		t.Fatal("the shipped Alertmanager config has no inhibit rules")
	}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

func startAlertmanagerWith(t *testing.T, bin, cfg string) string {
	t.Helper()
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "alertmanager.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freePort(t)
	runProcess(t, "alertmanager", bin, dir,
		"--config.file="+cfgPath, "--storage.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--cluster.listen-address=", "--log.level=warn")
	url := "http://" + addr
	waitFor(t, 30*time.Second, "alertmanager ready", func() error {
		resp, err := http.Get(url + "/-/ready")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	})
	return url
}

// alertKey names a notified alert by what the contract scopes it with.
func alertKey(l map[string]string) string {
	k := l["alertname"] + " cluster=" + l["cluster"] + " node=" + l["node"]
	for _, n := range []string{"gpu", "xid", "reason", "counter", "namespace", "pod"} {
		if v := l[n]; v != "" {
			k += " " + n + "=" + v
		}
	}
	return k
}

func TestSimulatedDayNotifications(t *testing.T) {
	amBin := testbin.Need(t, "alertmanager")
	b, err := os.ReadFile("../../deploy/rules/testdata/notifications.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var c contract
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	// The day is the same whatever the wall clock says: it ends before now,
	// its simulated cluster's epoch (which places every job) is a fixed
	// time before it, and an hour starts dayHour into it (the hour buckets
	// of GPURMACandidate).
	day0 := time.Now().Add(-dayLen - time.Minute + dayHour).Truncate(time.Hour).Add(-dayHour)
	cfg := gpusim.Config{Name: "gpu-cluster-day", Nodes: 16, Seed: 3, TargetLabels: true, XidsPerGPUYear: -1,
		Epoch: day0.Add(-dayEpochAge), FaultOrigin: day0}
	faults := dayFaults()
	for _, n := range sortedKeys(faults) {
		cfg.Faults = append(cfg.Faults, faults[n])
	}
	cfg.Faults = append(cfg.Faults, dayCompanions()...)
	tf := trainingFaults(t, cfg, day0)
	for _, n := range sortedKeys(tf) {
		faults[n] = tf[n]
		cfg.Faults = append(cfg.Faults, tf[n])
	}
	// Each class's fault and the cluster it is in.
	others := dayOtherClusters(day0)
	history := dayHistoryCluster(day0)
	idleNamespace, idlePod, hangNamespace, hangPod := checkHistoryJobs(t, history.cfg, day0)
	others = append(others, history)
	clusterOf := map[string]string{}
	for n := range faults {
		clusterOf[n] = cfg.Name
	}
	cfgs := []gpusim.Config{cfg}
	for _, o := range others {
		for n, f := range o.faults {
			faults[n], clusterOf[n] = f, o.cfg.Name
		}
		cfgs = append(cfgs, o.cfg)
	}
	for _, cl := range c.Classes {
		_, simulated := faults[cl.Fault]
		switch listed := slices.Contains(dayUnsimulated, cl.Fault); {
		case !simulated && !listed:
			t.Errorf("class %s of notifications.yaml is neither simulated nor listed as unsimulated", cl.Fault)
		case simulated && listed:
			t.Errorf("class %s is simulated but listed as unsimulated", cl.Fault)
		}
	}

	hook := &webhook{} // every alert of every notification, in order
	hookSrv := httptest.NewServer(hook)
	defer hookSrv.Close()
	amURL := startAlertmanagerWith(t, amBin, shippedAlertmanagerConfig(t, hookSrv.URL+"/hook"))
	clock := &simClock{}
	var muted atomic.Bool
	muted.Store(true)
	proxy := amTimeProxy(t, clock, amURL, &muted)
	defer proxy.Close()

	const tenantID = "gpu-day"
	a, base := startGpustore(t, func(c *app.Config) {
		c.Rules.GPUPack = true
		c.Rules.ManualEvaluation = true
		c.Rules.TenantPollInterval = model.Duration(100 * time.Millisecond)
		c.Rules.Alertmanager.URLs = []string{proxy.URL}
		// The head accepts samples down to half its block range below its
		// newest one. The rules' first evaluations of the history run up
		// to ~90 minutes behind its newest sample (see the backfill): a 6h
		// block keeps their results in range (a 2h block takes an hour).
		c.TSDB.BlockDuration = model.Duration(6 * time.Hour)
	})

	// Every cluster's exporters are scraped at the same instants and sent
	// with its own `cluster` label, as each cluster's Prometheus would.
	type daySim struct {
		sim  *gpusim.Cluster
		snd  *gpusim.Sender
		buf  []gpusim.Series
		from time.Time // its first scrape
	}
	hosts := map[string][]string{}
	var sims []*daySim
	for _, cc := range cfgs {
		sim, err := gpusim.New(cc)
		if err != nil {
			t.Fatal(err)
		}
		hosts[cc.Name] = sim.Hostnames()
		snd, err := gpusim.NewSender(gpusim.SenderConfig{
			URL: base + "/api/v1/write", Tenant: tenantID,
			ExternalLabels: []gpusim.Label{{Name: "cluster", Value: cc.Name}},
			Logger:         slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
		})
		if err != nil {
			t.Fatal(err)
		}
		from := day0
		if cc.Name == history.cfg.Name {
			from = day0.Add(-historyLen)
		}
		sims = append(sims, &daySim{sim: sim, snd: snd, from: from})
	}
	ctx := context.Background()
	scrape := func(ts time.Time) {
		for _, d := range sims {
			if ts.Before(d.from) {
				continue
			}
			d.buf = d.sim.AppendSamples(d.buf[:0], ts, gpusim.Replica{})
			d.buf = d.sim.AppendStaleMarkers(d.buf, ts, gpusim.Replica{})
			if err := d.snd.Send(ctx, d.buf); err != nil {
				t.Fatalf("remote write at %s: %v", ts, err)
			}
		}
	}
	// The ruler gives a tenant the GPU pack once it holds GPU data of the
	// last 2 hours (wall clock); the history starts before that. So the
	// history is written up to a scrape in that window, and once
	// the pack is loaded its groups are evaluated from the history's start
	// up to there (a query at t reads no sample after t, so evaluating
	// behind the writes gives what evaluating with them gives), then in
	// step with the writes.
	start := day0.Add(-historyLen)
	written := start
	// (5 minutes into it: the ruler looks a moment later.)
	for ; written.Before(time.Now().Add(-2*time.Hour + 5*time.Minute)); written = written.Add(15 * time.Second) {
		scrape(written)
	}
	scrape(written)
	waitFor(t, 30*time.Second, "the GPU pack loaded for the tenant", func() error {
		if m := a.Ruler.Manager(tenantID); m == nil || len(m.RuleGroups()) == 0 {
			return fmt.Errorf("no rule groups yet")
		}
		return nil
	})
	groups := a.Ruler.Manager(tenantID).RuleGroups()
	next := make([]time.Time, len(groups))
	for i, g := range groups {
		next[i] = g.EvalTimestamp(start.UnixNano()).Add(g.Interval())
	}
	evalCtx := user.InjectOrgID(ctx, tenantID)
	// evalUpTo evaluates every group at each of its slots up to ts, in
	// time order.
	evalUpTo := func(ts time.Time) {
		for {
			i := -1
			for j := range groups {
				if !next[j].After(ts) && (i < 0 || next[j].Before(next[i])) {
					i = j
				}
			}
			if i < 0 {
				break
			}
			clock.set(next[i])
			groups[i].Eval(evalCtx, next[i])
			next[i] = next[i].Add(groups[i].Interval())
		}
		clock.set(ts)
	}
	step := func(ts time.Time) {
		scrape(ts)
		evalUpTo(ts)
	}

	// The backfill: the history cluster's hours before the day, unpaced,
	// its notifications dropped.
	backfillStart := time.Now()
	evalUpTo(written) // the evaluations behind the writes
	for ts := written.Add(15 * time.Second); ts.Before(day0); ts = ts.Add(15 * time.Second) {
		step(ts)
	}
	t.Logf("backfilled %s of history in %s (unpaced)", historyLen, time.Since(backfillStart).Round(100*time.Millisecond))
	// What the notifier still holds from the backfill may reach
	// Alertmanager from here on: alerts firing at the day's start (the
	// notifier resends them in the day anyway) and resolved ones that
	// Alertmanager never notified (it notifies a group only with firing
	// alerts in it).
	muted.Store(false)

	realStart := time.Now()
	paceStart := realStart
	var maxLag, lagged time.Duration
	for ts := day0; !ts.After(day0.Add(dayLen)); ts = ts.Add(15 * time.Second) {
		// Pace: simulated time runs at most speedup times faster than
		// real time. A step that overran (a busy machine) slows the day
		// down rather than being caught up in a burst: a burst would run
		// minutes of simulated time while a notification is on its way,
		// and the proxy would hand Alertmanager an alert whose endsAt
		// (4 minutes of simulated validity, 6 s real) had already passed
		// in real time, so an inhibiting alert (NodeUnreachable) counted
		// as resolved and what it inhibits was notified.
		due := paceStart.Add(ts.Sub(day0) / speedup)
		if d := time.Until(due); d > 0 {
			time.Sleep(d)
		} else {
			maxLag, lagged = max(maxLag, -d), lagged-d
			paceStart = paceStart.Add(-d)
		}
		step(ts)
	}
	t.Logf("simulated %s in %s (x%d; steps overran the pace by up to %s, %s in all, which slowed the day)", dayLen, time.Since(realStart).Round(time.Second), speedup, maxLag.Round(time.Millisecond), lagged.Round(time.Millisecond))
	// Alertmanager flushes what the last evaluations sent: two of its
	// (scaled) group intervals.
	time.Sleep(2 * 5 * time.Minute / speedup)

	// What the contract expects, with the day's node names and GPUs.
	want := map[string]bool{}
	classKeys := map[string][]string{} // the notify keys of each class that counts its notifications
	podScoped := map[string]bool{}
	for _, cl := range c.Classes {
		f, ok := faults[cl.Fault]
		if !ok {
			continue
		}
		var idx int
		if _, err := fmt.Sscan(f.Node, &idx); err != nil {
			t.Fatalf("fault %s: node %q: %v", cl.Fault, f.Node, err)
		}
		for _, e := range cl.Notify {
			l := map[string]string{"alertname": e.Alertname, "xid": e.Xid, "reason": e.Reason, "counter": e.Counter, "cluster": clusterOf[cl.Fault]}
			switch e.Scope {
			case "gpu":
				l["node"], l["gpu"] = hosts[clusterOf[cl.Fault]][idx], fmt.Sprint(f.GPU)
				if f.Kind == gpusim.FaultIdleAllocation {
					// The alert is about the allocation: it keeps its pod.
					l["namespace"], l["pod"] = idleNamespace, idlePod
				}
			case "node_gpus":
				// Every GPU of the node, held by the job's pod.
				for g := 0; g < 8; g++ {
					lg := map[string]string{"alertname": e.Alertname, "cluster": clusterOf[cl.Fault], "node": hosts[clusterOf[cl.Fault]][idx],
						"gpu": fmt.Sprint(g), "namespace": hangNamespace, "pod": hangPod}
					want[alertKey(lg)] = true
				}
				continue
			case "node":
				l["node"] = hosts[clusterOf[cl.Fault]][idx]
			case "pod":
				l["node"], l["cluster"] = "pod", ""
				podScoped[e.Alertname] = true
			}
			want[alertKey(l)] = true
			if cl.Notifications > 0 {
				classKeys[cl.Fault] = append(classKeys[cl.Fault], alertKey(l))
			}
		}
	}
	notificationsOf := map[string]int{}
	for _, cl := range c.Classes {
		notificationsOf[cl.Fault] = cl.Notifications
	}
	// What Alertmanager notified: firing episodes per alert, in order.
	hook.mu.Lock()
	got := slices.Clone(hook.alerts)
	hook.mu.Unlock()
	episodes := map[string]int{}
	firstPost := map[string]int{} // the notification an alert was first notified in
	pods := map[string][]string{}
	last := map[string]string{}
	for _, n := range got {
		k := alertKey(n.Labels)
		// A GPU or node alert carrying dcgm-exporter's host label changes
		// identity when an exporter upgrade renames it: resolved, and
		// notified again under the new name (alertKey, by node, would take
		// both for one alert). Training alerts keep their own targets' labels.
		for _, l := range []string{"Hostname", "hostname"} {
			if _, ok := n.Labels[l]; ok && !podScoped[n.Labels["alertname"]] {
				t.Errorf("%s notified with the exporter's %s label: %v", k, l, n.Labels)
			}
		}
		if podScoped[n.Labels["alertname"]] {
			// The alert is per pod: a stalled job pages once per rank, in
			// one Alertmanager notification (grouped by alertname). The
			// contract's one notification is one job: every pod notified
			// must be a rank of the same job.
			pods[n.Labels["alertname"]] = append(pods[n.Labels["alertname"]], n.Labels["namespace"]+"/"+jobOfPod(n.Labels["pod"]))
			k = alertKey(map[string]string{"alertname": n.Labels["alertname"], "node": "pod"})
		}
		if n.Status == "firing" && last[k] != "firing" {
			episodes[k]++
			if _, ok := firstPost[k]; !ok {
				firstPost[k] = n.Post
			}
		}
		last[k] = n.Status
	}
	var keys []string
	for k := range episodes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	t.Logf("notified: %s", strings.Join(keys, "; "))
	for name, ps := range pods {
		slices.Sort(ps)
		if ps = slices.Compact(ps); len(ps) > 1 {
			t.Errorf("%s notified for several jobs: %v", name, ps)
		}
	}
	for k := range want {
		switch n := episodes[k]; {
		case n == 0:
			t.Errorf("silent: %s never notified", k)
		case n > 1:
			t.Errorf("double page: %s notified %d times (resolved and fired again)", k, n)
		}
	}
	for _, k := range keys {
		if !want[k] {
			t.Errorf("notified but not in the contract: %s", k)
		}
	}
	// One GPU incident, one notification with all its facts: the class's
	// alerts were first notified in that many Alertmanager notifications.
	for class, ks := range classKeys {
		in := map[int][]string{}
		for _, k := range ks {
			if p, ok := firstPost[k]; ok {
				in[p] = append(in[p], k)
			}
		}
		if len(in) != notificationsOf[class] {
			t.Errorf("%s: its alerts came in %d notifications, want %d: %v", class, len(in), notificationsOf[class], in)
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// jobNodeOf returns the index (as gpusim.Fault.Node takes it) of the first
// node from dayTrainingFrom on whose GPU 0's pod, at offsets into the day,
// satisfies want, and whose job is not in taken (it adds it).
func jobNodeOf(t *testing.T, sim *gpusim.Cluster, day0 time.Time, taken map[string]bool, want func(pod func(time.Duration) string) bool) string {
	t.Helper()
	hosts := sim.Hostnames()
	for i := dayTrainingFrom; i < len(hosts); i++ {
		podAt := func(d time.Duration) string {
			for _, s := range sim.AppendSamples(nil, day0.Add(d), gpusim.Replica{}) {
				if s.Name() == "DCGM_FI_DEV_GPU_UTIL" && s.Get("Hostname") == hosts[i] && s.Get("gpu") == "0" {
					return s.Get("pod")
				}
			}
			return ""
		}
		if job := jobOfPod(podAt(dayLen)); !taken[job] && want(podAt) {
			taken[job] = true
			return fmt.Sprint(i)
		}
	}
	t.Fatalf("no node from %d on runs a job as the fault needs", dayTrainingFrom)
	return ""
}

// jobOfPod is the job of a Kubeflow-style rank pod (<job>-master-0,
// <job>-worker-<i>); other pods are their own job.
func jobOfPod(pod string) string {
	for _, role := range []string{"-master-", "-worker-", "-launcher-"} {
		if i := strings.LastIndex(pod, role); i > 0 {
			return pod[:i]
		}
	}
	return pod
}
