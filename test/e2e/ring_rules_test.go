package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// TestRingRules: receivers running rules (-target=ingest,rules) share the
// rule groups out: each group is evaluated by exactly one receiver, its
// results go through the distributors' write path (replicated), and a
// recorded series reads back through the query process with one sample per
// evaluation, not one per receiver.
func TestRingRules(t *testing.T) {
	dir := writeRingRules(t)
	c := startRingWith(t, 3, "receiver:-target=ingest,rules", "receiver:-rules.dir="+dir, "receiver:-rules.gpu-pack=false")
	w := startRuleLoad(t, c)
	checkRulesShared(t, c, w, c.receivers, nil)
}

// TestRingRulers: rulers of their own (-target=rules, as the Kubernetes
// scaled overlay runs them) beside receivers that run no rules. They learn
// the tenant from the receivers (it holds no data on a ruler), so the GPU
// pack's groups are shared out with the tenant's own, each evaluated once;
// results read back through the query process. A ruler killed without
// leaving hands its groups to the other once its heartbeat times out.
func TestRingRulers(t *testing.T) {
	dir := writeRingRules(t)
	c := startRing(t, 3)
	var rulers []*ringProc
	for i := range 2 {
		r := c.add(fmt.Sprintf("ruler-%d", i), "", "rules")
		r.args = append(r.args, "-rules.dir="+dir, "-rules.tenant-poll-interval=1s")
		r.start()
		rulers = append(rulers, r)
	}
	for _, r := range rulers {
		r.waitReady()
	}
	w := startRuleLoad(t, c)
	pack := []string{"gpu_recording", "gpu_hardware_alerts"}
	checkRulesShared(t, c, w, rulers, pack)
	for _, r := range c.receivers {
		if n := len(ruleEvaluations(t, r.url())); n != 0 {
			t.Errorf("receiver %s (-target=ingest) evaluated %d rule groups", r.id, n)
		}
	}

	// ruler-1 dies: within the heartbeat timeout and a poll, ruler-0
	// evaluates every group.
	rulers[1].kill()
	want := append(slices.Clone(pack), ringGroupNames()...)
	slices.Sort(want)
	waitFor(t, ringHeartbeatTimeout+30*time.Second, "ruler-0 evaluating every group", func() error {
		var got []string
		for _, g := range loadedGroups(t, rulers[0].url()) {
			if slices.Contains(want, g) {
				got = append(got, g)
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			return fmt.Errorf("ruler-0 evaluates %v, want %v", got, want)
		}
		return nil
	})
	// Its groups had no evaluator from its death to the heartbeat timeout;
	// from then on one sample a second again.
	time.Sleep(5 * time.Second)
	checkRecorded(t, c, "after ruler-1 died")
}

// ringGroupNames are writeRingRules' group names.
func ringGroupNames() []string {
	var out []string
	for i := range ringRuleGroups {
		out = append(out, fmt.Sprintf("g%d", i))
	}
	return out
}

const ringRuleGroups = 6

// writeRingRules writes ringRuleGroups groups, each recording the number
// of GPUs every second, as the default tenant's rules; it returns the dir.
func writeRingRules(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	var b strings.Builder
	b.WriteString("groups:\n")
	for i := range ringRuleGroups {
		fmt.Fprintf(&b, "  - name: g%d\n    interval: 1s\n    rules:\n      - record: ring:gpus:count%d\n        expr: count(DCGM_FI_DEV_GPU_TEMP)\n", i, i)
	}
	if err := os.WriteFile(filepath.Join(dir, "ring.yml"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// startRuleLoad writes the GPU series through the front every 500 ms until
// the test ends.
func startRuleLoad(t *testing.T, c *ringCluster) *ringWriter {
	w := &ringWriter{t: t, url: c.front.url(), series: gpuSeries(), client: http.Client{Timeout: 30 * time.Second}}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for tick := time.NewTicker(500 * time.Millisecond); ; {
			select {
			case <-stop:
				tick.Stop()
				return
			case <-tick.C:
				w.send([]int64{time.Now().UnixMilli()})
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
	return w
}

// checkRulesShared: every group of writeRingRules' (and the named groups
// of the GPU pack) is evaluated by exactly one of evaluators, and each
// recorded series reads back through the query process with the number of
// GPUs and one sample per evaluation.
func checkRulesShared(t *testing.T, c *ringCluster, w *ringWriter, evaluators []*ringProc, pack []string) {
	t.Helper()
	gpus := 0
	for _, s := range w.series {
		if s.Labels[0].Value == "DCGM_FI_DEV_GPU_TEMP" {
			gpus++
		}
	}
	waitFor(t, 60*time.Second, "every group's recorded series", func() error {
		for i := range ringRuleGroups {
			v, _, err := ringQuery(c.front.url(), fmt.Sprintf("ring:gpus:count%d", i), time.Now())
			if err != nil {
				return err
			}
			vec, _ := v.(model.Vector)
			if len(vec) != 1 || int(vec[0].Value) != gpus {
				return fmt.Errorf("ring:gpus:count%d = %v, want %d", i, v, gpus)
			}
		}
		return nil
	})
	groups := append(slices.Clone(pack), ringGroupNames()...)
	waitFor(t, 30*time.Second, "every group on exactly one evaluator", func() error {
		by := map[string][]string{}
		for _, e := range evaluators {
			for _, g := range loadedGroups(t, e.url()) {
				by[g] = append(by[g], e.name)
			}
		}
		per := map[string]int{}
		for _, g := range groups {
			if got := by[g]; len(got) != 1 {
				return fmt.Errorf("group %s loaded by %v, want exactly one", g, got)
			}
			per[by[g][0]]++
		}
		t.Logf("groups per evaluator: %v", per)
		return nil
	})
	time.Sleep(5 * time.Second) // the last owner change's evaluations leave the 4 s window
	checkRecorded(t, c, "")
}

// checkRecorded: one sample per evaluation (1 s) of each recorded series,
// not one per evaluator: over 4 s 2 to 5 samples.
func checkRecorded(t *testing.T, c *ringCluster, when string) {
	t.Helper()
	now := time.Now()
	for i := range ringRuleGroups {
		v, _, err := ringQuery(c.front.url(), fmt.Sprintf("count_over_time(ring:gpus:count%d[4s])", i), now)
		if err != nil {
			t.Fatal(err)
		}
		if vec, _ := v.(model.Vector); len(vec) != 1 || vec[0].Value > 5 || vec[0].Value < 2 {
			raw, _, err := ringQuery(c.front.url(), fmt.Sprintf("ring:gpus:count%d[30s]", i), now)
			t.Errorf("%s: samples of ring:gpus:count%d over 4 s: %v, want 2-5 (one evaluator every second); the last 30 s before %v: %v %v", when, i, v, now.UnixMilli(), raw, err)
		}
	}
}

// loadedGroups lists the rule groups a process evaluates for the default
// tenant (its /api/v1/rules).
func loadedGroups(t *testing.T, base string) []string {
	t.Helper()
	resp, err := http.Get(base + "/api/v1/rules")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r struct {
		Data struct {
			Groups []struct{ Name string }
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, g := range r.Data.Groups {
		out = append(out, g.Name)
	}
	return out
}

// ruleEvaluations reads a receiver's prometheus_rule_evaluations_total by
// rule group name.
func ruleEvaluations(t *testing.T, base string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	if mf, ok := mfs["prometheus_rule_evaluations_total"]; ok {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "rule_group" {
					_, group, _ := strings.Cut(l.GetValue(), ";")
					out[group] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}
