package downsample

import (
	"slices"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
)

// The labels a query depends on decide whether data folded over pod can
// answer it: a query that selects, groups, matches or relabels by pod must
// read raw data where it exists; one that only aggregates pods away can read
// the folded data.
func TestLabelsNamed(t *testing.T) {
	for q, want := range map[string][]string{
		`avg(DCGM_FI_DEV_GPU_UTIL)`:                                          nil,
		`max by (Hostname) (DCGM_FI_DEV_GPU_TEMP)`:                           {"Hostname"},
		`sum without (pod) (DCGM_FI_DEV_POWER_USAGE)`:                        nil,
		`DCGM_FI_DEV_GPU_UTIL{pod=~"train-.*"}`:                              {"pod"},
		`count by (pod) (DCGM_FI_DEV_GPU_UTIL > 0)`:                          {"pod"},
		`DCGM_FI_DEV_GPU_UTIL * on (UUID) group_left (pod) kube_pod_info`:    {"UUID", "pod"},
		`label_replace(DCGM_FI_DEV_GPU_UTIL, "job", "$1", "pod", "(.*)-.*")`: {"job", "pod"},
		`label_join(DCGM_FI_DEV_GPU_UTIL, "who", "/", "namespace", "pod")`:   {"who", "namespace", "pod"},
		`rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0"}[5m])`:            {"gpu"},
	} {
		pq, err := Prepare(q)
		if err != nil {
			t.Fatal(err)
		}
		got := pq.Labels
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s: named %q, want %q", q, got, want)
		}
	}
}

func TestNamesFolded(t *testing.T) {
	pod := []string{"pod"}
	m := func(n string) []*labels.Matcher {
		return []*labels.Matcher{labels.MustNewMatcher(labels.MatchEqual, model.MetricNameLabel, "DCGM_FI_DEV_GPU_UTIL"), labels.MustNewMatcher(labels.MatchRegexp, n, ".+")}
	}
	for _, c := range []struct {
		what   string
		query  []string // the labels the select's query names
		folded []string
		h      *storage.SelectHints
		ms     []*labels.Matcher
		want   bool
	}{
		{"nothing folded", nil, nil, nil, m("pod"), false},
		{"matcher on pod", nil, pod, nil, m("pod"), true},
		{"matcher on gpu", nil, pod, nil, m("gpu"), false},
		{"by (pod)", nil, pod, &storage.SelectHints{By: true, Grouping: pod}, m("gpu"), true},
		{"without (pod)", nil, pod, &storage.SelectHints{By: false, Grouping: pod}, m("gpu"), false},
		{"query names pod", []string{"UUID", "pod"}, pod, nil, m("gpu"), true},
	} {
		if got := NamesFolded(c.query, c.folded, c.h, c.ms); got != c.want {
			t.Errorf("%s: %v, want %v", c.what, got, c.want)
		}
	}
}

// Only a query whose selectors are all evaluated at the request's steps
// lets the bucket store read just the steps' windows.
func TestPrepareAtSteps(t *testing.T) {
	for q, want := range map[string]bool{
		`rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5m])`:                       true,
		`max_over_time(DCGM_FI_DEV_GPU_TEMP[10m] offset 1h) > 80`:              true,
		`max_over_time(rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5m])[1h:5m])`: false,
		`rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5m] @ 1767225600)`:          false,
		`rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5m] @ end())`:               false,
	} {
		pq, err := Prepare(q)
		if err != nil {
			t.Fatal(err)
		}
		if pq.AtSteps != want {
			t.Errorf("%s: AtSteps %v, want %v", q, pq.AtSteps, want)
		}
	}
}
