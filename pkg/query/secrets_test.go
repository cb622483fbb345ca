package query

import (
	"maps"
	"testing"
)

// TestRedactFlags: a URL's password is redacted wherever it sits in a
// flag's value (one URL, a list of them, with or without a user name), the
// value of a flag named for a secret is hidden whole, and nothing else
// changes.
func TestRedactFlags(t *testing.T) {
	in := map[string]string{
		"alertmanager.url":        "http://am:p%40ss@am-0:9093/,https://am-1:9093,https://u:p,w@am-2/x",
		"rules.external-url":      "https://grafana.example.com:3000/",
		"memberlist.join":         "gpustore-0:7946,gpustore-1:7946",
		"web.listen-address":      ":9201",
		"storage.remote.token":    "abc",
		"some.password-file":      "/etc/pass",
		"memberlist.tls-key-path": "/etc/tls.key",
	}
	want := map[string]string{
		"alertmanager.url":        "http://am:xxxxx@am-0:9093/,https://am-1:9093,https://u:xxxxx@am-2/x",
		"rules.external-url":      "https://grafana.example.com:3000/",
		"memberlist.join":         "gpustore-0:7946,gpustore-1:7946",
		"web.listen-address":      ":9201",
		"storage.remote.token":    "<secret>",
		"some.password-file":      "<secret>",
		"memberlist.tls-key-path": "/etc/tls.key",
	}
	if got := redactFlags(in); !maps.Equal(got, want) {
		t.Errorf("redactFlags:\n got %v\nwant %v", got, want)
	}
}

// TestShortenRuleFiles: in a /api/v1/rules answer only the groups' files
// change: a path becomes the file's name, the embedded pack's names stay.
func TestShortenRuleFiles(t *testing.T) {
	in := `{"status":"success","data":{"groups":[{"name":"a","file":"/etc/gpustore/rules/team-a/gpu.yml","rules":[],"interval":60},` +
		`{"name":"b","file":"embedded:gpu-pack/gpu-alerts.yml","rules":[{"name":"x","health":"ok"}],"interval":60}]},"warnings":["w"]}`
	out, err := shortenRuleFiles([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"data":{"groups":[{"file":"gpu.yml","interval":60,"name":"a","rules":[]},` +
		`{"file":"embedded:gpu-pack/gpu-alerts.yml","interval":60,"name":"b","rules":[{"name":"x","health":"ok"}]}]},"status":"success","warnings":["w"]}`
	if string(out) != want {
		t.Errorf("got  %s\nwant %s", out, want)
	}
	if out, err := shortenRuleFiles([]byte(`{"status":"success","data":{"groups":[]}}`)); err != nil || string(out) != `{"data":{"groups":[]},"status":"success"}` {
		t.Errorf("no groups: %s %v", out, err)
	}
}
