package limits

import (
	"bytes"
	"testing"
)

// FuzzLoadOverrides: the overrides file parser never panics, and whatever it
// accepts is a valid set of limits for every tenant it names (a broken file
// is refused as a whole and the previous one stays in force).
func FuzzLoadOverrides(f *testing.F) {
	for _, s := range []string{
		"",
		"overrides:\n  gpu-prod:\n    ingestion_rate: 2000000\n    max_active_series: 5000000\n",
		"overrides:\n  lab:\n    out_of_order_window: 1h\n    rate_limit_status_code: 429\n",
		"overrides:\n  a:\n    ingestion_rate: -1\n",
		"overrides:\n  a:\n    no_such_limit: 1\n",
		"overrides:\n  a: [1, 2]\n",
		"overrides: {a: {rate_limit_status_code: 418}}",
		"overrides:\n  a:\n    out_of_order_window: 10000000000000000000h\n",
		"overrides:\n  a:\n    ingest_preset: dcgm\n    metric_relabel_configs:\n      - action: labeldrop\n        regex: pci_bus_id\n",
		"overrides:\n  a:\n    metric_relabel_configs: [{action: replace, source_labels: [x]}]\n",
		"\xff\xfe",
		"overrides:\n  &x a: *x\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		out, err := Load(bytes.NewReader(b), Defaults())
		if err != nil {
			return
		}
		for tenant, l := range out.Overrides {
			if err := l.Validate(); err != nil {
				t.Fatalf("accepted invalid limits for %q: %v", tenant, err)
			}
		}
	})
}
