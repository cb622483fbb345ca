package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
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
	dir := t.TempDir()
	var b strings.Builder
	b.WriteString("groups:\n")
	const groups = 6
	for i := range groups {
		fmt.Fprintf(&b, "  - name: g%d\n    interval: 1s\n    rules:\n      - record: ring:gpus:count%d\n        expr: count(DCGM_FI_DEV_GPU_TEMP)\n", i, i)
	}
	if err := os.WriteFile(filepath.Join(dir, "ring.yml"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	c := startRingWith(t, 3, "receiver:-target=ingest,rules", "receiver:-rules.dir="+dir, "receiver:-rules.gpu-pack=false")
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
	defer func() { close(stop); <-done }()

	gpus := 0
	for _, s := range w.series {
		if s.Labels[0].Value == "DCGM_FI_DEV_GPU_TEMP" {
			gpus++
		}
	}
	// Every group's recorded series reads back with the right value.
	waitFor(t, 60*time.Second, "every group's recorded series", func() error {
		for i := range groups {
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
	time.Sleep(5 * time.Second)

	// Each group on exactly one receiver.
	evaluators := map[string][]string{}
	for _, r := range c.receivers {
		for group, n := range ruleEvaluations(t, "http://"+r.addr) {
			if n > 0 {
				evaluators[group] = append(evaluators[group], r.id)
			}
		}
	}
	perReceiver := map[string]int{}
	for i := range groups {
		g := fmt.Sprintf("g%d", i)
		got := evaluators[g]
		if len(got) != 1 {
			t.Errorf("group %s evaluated by %v, want exactly one receiver", g, got)
			continue
		}
		perReceiver[got[0]]++
	}
	t.Logf("groups per receiver: %v", perReceiver)

	// One sample per evaluation (1 s), not one per receiver: over 4 s at
	// most 5 samples of each recorded series.
	now := time.Now()
	for i := range groups {
		v, _, err := ringQuery(c.front.url(), fmt.Sprintf("count_over_time(ring:gpus:count%d[4s])", i), now)
		if err != nil {
			t.Fatal(err)
		}
		if vec, _ := v.(model.Vector); len(vec) != 1 || vec[0].Value > 5 || vec[0].Value < 2 {
			t.Errorf("samples of ring:gpus:count%d over 4 s: %v, want 2-5 (one receiver evaluating it every second)", i, v)
		}
	}
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
