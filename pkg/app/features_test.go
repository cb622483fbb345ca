package app

import (
	"encoding/json"
	"flag"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpustore/gpustore/pkg/ingest"
)

// statusGet GETs base+path and decodes the API's data into out.
func statusGet(t *testing.T, base, path string, out any) {
	t.Helper()
	resp, err := http.Get(base + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %d", path, resp.StatusCode)
	}
	env := struct{ Data any }{Data: out}
	if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// TestFeaturesSayWhatIsServed: /api/v1/features lists each API feature as
// served or not as its routes answer, in a process of every role and in a
// querier of the ring, which takes no writes. It said otlp_write_receiver
// false while both OTLP paths took data, and lifecycle true while /-/quit
// was 404 (Prometheus' lifecycle is /-/quit and /-/reload together).
func TestFeaturesSayWhatIsServed(t *testing.T) {
	for name, args := range map[string][]string{
		"all":           nil,
		"ring querier":  {"-target=query", "-ring.enabled", "-ring.store=inmemory", "-ring.instance-id=q"},
		"ingest, query": {"-target=ingest,query"},
	} {
		t.Run(name, func(t *testing.T) {
			cfg, _, err := Load(flag.NewFlagSet("gpustore", flag.ContinueOnError), append([]string{
				"-storage.tsdb.path=" + t.TempDir(), "-web.listen-address=127.0.0.1:0"}, args...))
			if err != nil {
				t.Fatal(err)
			}
			checkFeatures(t, "http://"+startApp(t, cfg).Server.Addr().String())
		})
	}
}

// checkFeatures compares what /api/v1/features says of the API features
// with routes with how those routes answer (404 or 405: not served).
func checkFeatures(t *testing.T, base string) {
	t.Helper()
	var features map[string]map[string]bool
	statusGet(t, base, "/api/v1/features", &features)
	served := func(method, path, contentType string) bool {
		req, _ := http.NewRequest(method, base+path, strings.NewReader(""))
		req.Header.Set("Content-Type", contentType)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode != http.StatusNotFound && resp.StatusCode != http.StatusMethodNotAllowed
	}
	routes := map[string][][3]string{
		"otlp_write_receiver":   {{http.MethodPost, ingest.OTLPPaths[0], "application/x-protobuf"}, {http.MethodPost, ingest.OTLPPaths[1], "application/x-protobuf"}},
		"remote_write_receiver": {{http.MethodPost, "/api/v1/write", "application/x-protobuf"}},
		"lifecycle":             {{http.MethodPost, "/-/quit", ""}, {http.MethodPost, "/-/reload", ""}},
		"admin":                 {{http.MethodPost, "/api/v1/admin/tsdb/snapshot", ""}, {http.MethodPost, "/api/v1/admin/tsdb/clean_tombstones", ""}},
	}
	for name, rs := range routes {
		on, ok := features["api"][name]
		if !ok {
			t.Errorf("/api/v1/features lists no api feature %q: %v", name, features["api"])
			continue
		}
		all := true
		for _, r := range rs {
			all = all && served(r[0], r[1], r[2])
		}
		if on != all {
			t.Errorf("/api/v1/features says %s is %v; its routes %v answer: %v", name, on, rs, all)
		}
	}
}

// TestStatusFlagsListEveryFlag: /api/v1/status/flags lists every flag with
// its value, as Prometheus' does (it listed only those given on the
// command line), the values the YAML file set included, and still shows
// no secret: not one given on the command line, nor one the YAML file set.
func TestStatusFlagsListEveryFlag(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "gpustore.yml")
	const secret = "yaml-s3cret"
	if err := os.WriteFile(file, []byte("rules:\n  alertmanager:\n    urls: [\"http://am:"+secret+"@127.0.0.1:1/\"]\nquery:\n  timeout: 90s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fs := flag.NewFlagSet("gpustore", flag.ContinueOnError)
	BindCommandFlags(fs)
	cfg, _, err := Load(fs, []string{"-config.file=" + file, "-storage.tsdb.path=" + filepath.Join(dir, "data"), "-web.listen-address=127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	a := startApp(t, cfg, func(a *App) { a.RecordFlags(fs) })
	var flags map[string]string
	statusGet(t, "http://"+a.Server.Addr().String(), "/api/v1/status/flags", &flags)
	n := 0
	fs.VisitAll(func(f *flag.Flag) {
		n++
		if _, ok := flags[f.Name]; !ok {
			t.Errorf("/api/v1/status/flags lacks %s", f.Name)
		}
	})
	if len(flags) != n {
		t.Errorf("/api/v1/status/flags lists %d flags, the command line has %d", len(flags), n)
	}
	for name, want := range map[string]string{"query.timeout": "1m30s", "query.max-concurrency": "20", "alertmanager.url": "http://am:xxxxx@127.0.0.1:1/"} {
		if flags[name] != want {
			t.Errorf("%s = %q, want %q", name, flags[name], want)
		}
	}
	for name, v := range flags {
		if strings.Contains(v, secret) {
			t.Errorf("%s shows the password the YAML file set: %q", name, v)
		}
	}
}
