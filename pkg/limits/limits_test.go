package limits

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
)

func TestLoadKeepsDefaultsForUnsetFields(t *testing.T) {
	d := Defaults()
	f, err := Load(strings.NewReader("overrides:\n  gpu-prod:\n    max_active_series: 5\n    out_of_order_window: 1h\n"), d)
	if err != nil {
		t.Fatal(err)
	}
	l := f.Overrides["gpu-prod"]
	if l.MaxActiveSeries != 5 || l.OutOfOrderWindow != model.Duration(time.Hour) {
		t.Fatalf("override not applied: %+v", l)
	}
	if l.MaxLabelNamesPerSeries != d.MaxLabelNamesPerSeries || l.RateLimitStatusCode != d.RateLimitStatusCode || l.HAReplicaLabel != "__replica__" {
		t.Fatalf("defaults lost: %+v", l)
	}
}

func TestLoadRejectsBadOverrides(t *testing.T) {
	for _, bad := range []string{
		"overrides:\n  t:\n    max_activ_series: 5\n",         // typo: unknown field
		"overrides:\n  t:\n    rate_limit_status_code: 500\n", // neither 429 nor 503
		"overrides:\n  t:\n    ingestion_rate: 10\n    ingestion_burst_size: 0\n",
		"overrides:\n  t:\n    ha_replica_label: cluster\n",
		"overrides: [1, 2]\n",
	} {
		if _, err := Load(strings.NewReader(bad), Defaults()); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
}

func TestDefaultsFitDCGMExporter(t *testing.T) {
	// dcgm-exporter with Kubernetes mapping, MIG and Prometheus' target and
	// external labels: about 20 labels. Mimir's default of 30 is a known pain.
	if Defaults().MaxLabelNamesPerSeries < 40 {
		t.Fatal("default label limit below 40")
	}
	if err := Defaults().Validate(); err != nil {
		t.Fatal(err)
	}
}
