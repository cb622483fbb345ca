package query

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"testing"
)

type labelNamesAnswer struct {
	LabelValuesCountTotal int `json:"label_values_count_total"`
	LabelNamesCount       int `json:"label_names_count"`
	Cardinality           []struct {
		LabelName        string `json:"label_name"`
		LabelValuesCount int    `json:"label_values_count"`
	} `json:"cardinality"`
}

type labelValuesAnswer struct {
	SeriesCountTotal int `json:"series_count_total"`
	Labels           []struct {
		LabelName        string `json:"label_name"`
		LabelValuesCount int    `json:"label_values_count"`
		SeriesCount      int    `json:"series_count"`
		Cardinality      []struct {
			LabelValue  string `json:"label_value"`
			SeriesCount int    `json:"series_count"`
		} `json:"cardinality"`
	} `json:"labels"`
}

// getJSON asks path as tenant and decodes a 200 answer into v; it returns
// the status.
func (a *limitedAPI) getJSON(t *testing.T, tenant, path string, params url.Values, v any) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, a.srv.URL+path+"?"+params.Encode(), nil)
	req.Header.Set("X-Scope-OrgID", tenant)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}
	return resp.StatusCode
}

// TestCardinalityAPI: a tenant whose jobs put a new pod label on a DCGM
// metric's series finds the label and the metric that blew up with the
// cardinality API (Mimir's shapes), over its head and, for a time range,
// its blocks; another tenant sees only its own series.
func TestCardinalityAPI(t *testing.T) {
	const over = "overrides:\n  lab:\n    max_fetched_series_per_query: 100\n"
	a := newLimitedAPI(t, over, map[string]int{"gpu-prod": 4, "lab": 4}, nil) // 128 DCGM series each, 4 pods
	// 50 short jobs on node 0's GPU 0, each a new series of one metric.
	db := a.dbs.Existing("gpu-prod")
	app := db.Appender(context.Background())
	for job := range 50 {
		ls := dcgmSeries("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 0, 0, fmt.Sprintf("sweep-%02d", job))
		if _, err := app.Append(0, ls, a.now, 0.5); err != nil {
			t.Fatal(err)
		}
	}
	if err := app.Commit(); err != nil {
		t.Fatal(err)
	}
	dcgm := `{__name__=~"DCGM.*"}`

	var names labelNamesAnswer
	if code := a.getJSON(t, "gpu-prod", "/api/v1/cardinality/label_names", url.Values{"selector": {dcgm}, "limit": {"2"}}, &names); code != http.StatusOK {
		t.Fatalf("label_names: %d", code)
	}
	// 13 label names; values: UUID 32, gpu 8, device 8, Hostname, instance 4,
	// __name__ 5, pod 4+50, six of one value.
	if names.LabelNamesCount != 13 || names.LabelValuesCountTotal != 32+8+8+4+4+5+54+6 || len(names.Cardinality) != 2 ||
		names.Cardinality[0].LabelName != "pod" || names.Cardinality[0].LabelValuesCount != 54 ||
		names.Cardinality[1].LabelName != "UUID" || names.Cardinality[1].LabelValuesCount != 32 {
		t.Errorf("label_names: %+v", names)
	}

	var values labelValuesAnswer
	params := url.Values{"selector": {dcgm}, "limit": {"3"}, "label_names[]": {"pod", "__name__"}}
	if code := a.getJSON(t, "gpu-prod", "/api/v1/cardinality/label_values", params, &values); code != http.StatusOK {
		t.Fatalf("label_values: %d", code)
	}
	type vc = struct {
		LabelValue  string `json:"label_value"`
		SeriesCount int    `json:"series_count"`
	}
	if values.SeriesCountTotal != 178 || len(values.Labels) != 2 {
		t.Fatalf("label_values: %+v", values)
	}
	metric, pod := values.Labels[0], values.Labels[1]
	if metric.LabelName != "__name__" || metric.LabelValuesCount != 5 || metric.SeriesCount != 178 ||
		!reflect.DeepEqual(metric.Cardinality, []vc{{"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 50}, {"DCGM_FI_DEV_FB_USED", 32}, {"DCGM_FI_DEV_GPU_TEMP", 32}}) {
		t.Errorf("label_values of __name__: %+v", metric)
	}
	if pod.LabelName != "pod" || pod.LabelValuesCount != 54 || pod.SeriesCount != 178 ||
		!reflect.DeepEqual(pod.Cardinality, []vc{{"llm-train-0-worker-0", 32}, {"llm-train-0-worker-1", 32}, {"llm-train-1-worker-0", 32}}) {
		t.Errorf("label_values of pod: %+v", pod)
	}

	// A range before the sweep and before the head reads the blocks of that
	// range: the 128 series of the four training pods. (Where the head
	// begins depends on the minute of the hour the test runs at: blocks are
	// cut at 30-minute boundaries.)
	blocks := db.Blocks()
	if len(blocks) == 0 || db.Head().MinTime() <= blocks[0].Meta().MinTime {
		t.Fatalf("no block before the head (from %d)", db.Head().MinTime())
	}
	from := strconv.FormatInt(blocks[0].Meta().MinTime/1000, 10)
	to := strconv.FormatInt((db.Head().MinTime()-1)/1000, 10)
	params = url.Values{"selector": {dcgm}, "label_names[]": {"pod"}, "start": {from}, "end": {to}}
	values = labelValuesAnswer{}
	if code := a.getJSON(t, "gpu-prod", "/api/v1/cardinality/label_values", params, &values); code != http.StatusOK {
		t.Fatalf("label_values over a range: %d", code)
	}
	if values.SeriesCountTotal != 128 || len(values.Labels) != 1 || values.Labels[0].LabelValuesCount != 4 {
		t.Errorf("label_values over the blocks' range: %+v", values)
	}

	// Another tenant sees its own series; over a range, its query limit holds.
	values = labelValuesAnswer{}
	if code := a.getJSON(t, "lab", "/api/v1/cardinality/label_values", url.Values{"label_names[]": {"pod"}}, &values); code != http.StatusOK || values.SeriesCountTotal != 128 {
		t.Errorf("another tenant: %d %+v", code, values)
	}
	code, r := call(t, a.srv, http.MethodGet, "/api/v1/cardinality/label_names", url.Values{"start": {from}, "end": {to}}, "X-Scope-OrgID", "lab")
	if code != http.StatusUnprocessableEntity {
		t.Errorf("over the tenant's max_fetched_series_per_query: %d %q", code, r.Error)
	}

	for _, bad := range []url.Values{
		{"count_method": {"active"}}, {"limit": {"501"}}, {"limit": {"-1"}}, {"selector": {`{__name__=~"DCGM.*"`}},
		{"start": {"yesterday"}}, {"start": {"200"}, "end": {"100"}},
	} {
		if code, r := call(t, a.srv, http.MethodGet, "/api/v1/cardinality/label_names", bad, "X-Scope-OrgID", "gpu-prod"); code != http.StatusBadRequest || r.ErrorType != "bad_data" {
			t.Errorf("%v: %d %q", bad, code, r.Error)
		}
	}
	if code, _ := call(t, a.srv, http.MethodGet, "/api/v1/cardinality/label_values", url.Values{"selector": {dcgm}}, "X-Scope-OrgID", "gpu-prod"); code != http.StatusBadRequest {
		t.Errorf("label_values without label_names[]: %d", code)
	}
}
