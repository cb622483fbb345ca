package e2e

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/gpustore/gpustore/internal/testbin"
	"github.com/gpustore/gpustore/internal/testcerts"
)

// TestPrometheusRemoteWriteWithTLSAndBasicAuth: the real Prometheus, with
// the remote_write block docs/authentication.md documents (basic_auth with a
// password_file, tls_config with the CA and a client certificate), writes
// into the gpustore binary serving HTTPS with --web.config.file and
// tenants.auth; its samples land in the identity's tenant without any tenant
// header. A client doing what Grafana's data source does (basic auth, CA)
// reads them. Then the web config gains a user and gpustore gets SIGHUP: the
// new user is let in, Prometheus' open connections keep writing, and a
// broken edit followed by SIGHUP keeps the previous configuration.
func TestPrometheusRemoteWriteWithTLSAndBasicAuth(t *testing.T) {
	promBin := testbin.Need(t, "prometheus")
	bin := buildGpustore(t)
	began := time.Now()
	phase := func(what string) {
		t.Logf("%s: %s after gpustore started", what, time.Since(began).Round(100*time.Millisecond))
	}
	dir := t.TempDir()
	ca := testcerts.NewCA(t, "gpustore-e2e")
	srvPair := ca.Server(t, "gpustore")
	client := ca.Client(t, "prometheus-a")
	hash := func(p string) string {
		h, err := bcrypt.GenerateFromPassword([]byte(p), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		return string(h)
	}
	webFile := filepath.Join(dir, "web.yml")
	webConfig := func(users map[string]string) string {
		var b strings.Builder
		fmt.Fprintf(&b, "tls_server_config:\n  cert_file: %s\n  key_file: %s\n  client_ca_file: %s\n  client_auth_type: VerifyClientCertIfGiven\n  min_version: TLS12\nbasic_auth_users:\n",
			srvPair.CertFile, srvPair.KeyFile, ca.CertFile)
		for u, p := range users {
			fmt.Fprintf(&b, "  %s: %s\n", u, hash(p))
		}
		return b.String()
	}
	// ops (allowed "*") reads /metrics: it sees the reloads succeed or fail.
	mustWrite(t, webFile, webConfig(map[string]string{"prometheus-a": "secret-a", "ops": "secret-o"}))
	cfgFile := filepath.Join(dir, "gpustore.yml")
	mustWrite(t, cfgFile, "tenants:\n  auth:\n    prometheus-a: [gpu-prod]\n    grafana: [gpu-prod, lab]\n    ops: [\"*\"]\n")

	addr := freePort(t)
	var log bytes.Buffer
	cmd := exec.Command(bin, "-config.file="+cfgFile, "-web.config.file="+webFile, "-storage.tsdb.path="+filepath.Join(dir, "data"),
		"-web.listen-address="+addr, "-rules.gpu-pack=false", "-log.level=warn")
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("gpustore log:\n%s", log.String())
		}
	})
	base := "https://" + addr
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool}}}
	get := func(path, user, pass, tenant string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, base+path, nil)
		if user != "" {
			req.SetBasicAuth(user, pass)
		}
		if tenant != "" {
			req.Header.Set("X-Scope-OrgID", tenant)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	waitFor(t, time.Minute, "gpustore ready over TLS (probe without credentials)", func() error {
		if code, body := get("/-/ready", "", "", ""); code != 200 {
			return fmt.Errorf("%d %s", code, body)
		}
		return nil
	})
	phase("ready over TLS")

	exporter := httptest.NewServer(gpuPage())
	t.Cleanup(exporter.Close)
	pwFile := filepath.Join(dir, "gpustore-password")
	mustWrite(t, pwFile, "secret-a\n")
	promCfg := fmt.Sprintf(`global:
  scrape_interval: 1s
scrape_configs:
  - job_name: dcgm
    static_configs: [{targets: [%q]}]
remote_write:
  - url: %s/api/v1/write
    basic_auth:
      username: prometheus-a
      password_file: %s
    tls_config:
      ca_file: %s
      cert_file: %s
      key_file: %s
    queue_config: {batch_send_deadline: 1s, min_backoff: 100ms, max_backoff: 1s}
`, strings.TrimPrefix(exporter.URL, "http://"), base, pwFile, ca.CertFile, client.CertFile, client.KeyFile)
	startPrometheus(t, promBin, promCfg)

	count := func(user, pass, tenant string) (float64, int, string) {
		t.Helper()
		q := url.Values{"query": {"count(DCGM_FI_DEV_GPU_TEMP)"}}
		code, body := get("/api/v1/query?"+q.Encode(), user, pass, tenant)
		var r struct {
			Data struct {
				Result []struct {
					Value [2]any `json:"value"`
				} `json:"result"`
			} `json:"data"`
		}
		if code != 200 || json.Unmarshal([]byte(body), &r) != nil || len(r.Data.Result) == 0 {
			return 0, code, body
		}
		var v float64
		if _, err := fmt.Sscan(fmt.Sprint(r.Data.Result[0].Value[1]), &v); err != nil {
			t.Fatalf("count: %v in %s", err, body)
		}
		return v, code, body
	}
	waitFor(t, time.Minute, "Prometheus' samples in tenant gpu-prod", func() error {
		if v, code, body := count("prometheus-a", "secret-a", ""); v != 16 {
			return fmt.Errorf("%d %.200s", code, body)
		}
		return nil
	})
	phase("Prometheus' samples in gpu-prod")
	// Written into the identity's tenant, not the default one.
	if code, body := get("/api/v1/query?query=DCGM_FI_DEV_GPU_TEMP", "prometheus-a", "secret-a", "default"); code != http.StatusForbidden {
		t.Errorf("prometheus-a reading tenant default: %d %.200s, want 403", code, body)
	}
	if code, _ := get("/api/v1/query?query=up", "", "", ""); code != http.StatusUnauthorized {
		t.Errorf("query without credentials: %d, want 401", code)
	}
	// Grafana's user is not in the web config yet.
	if _, code, _ := count("grafana", "secret-g", "gpu-prod"); code != http.StatusUnauthorized {
		t.Errorf("grafana before reload: %d, want 401", code)
	}

	samples := func() float64 {
		v, _, _ := count("prometheus-a", "secret-a", "")
		q := url.Values{"query": {"count_over_time(DCGM_FI_DEV_GPU_TEMP{gpu=\"0\",Hostname=\"node-0\"}[10m])"}}
		_, body := get("/api/v1/query?"+q.Encode(), "prometheus-a", "secret-a", "")
		var r struct {
			Data struct {
				Result []struct {
					Value [2]any `json:"value"`
				} `json:"result"`
			} `json:"data"`
		}
		if json.Unmarshal([]byte(body), &r) != nil || len(r.Data.Result) == 0 || v == 0 {
			return 0
		}
		var n float64
		if _, err := fmt.Sscan(fmt.Sprint(r.Data.Result[0].Value[1]), &n); err != nil {
			t.Fatalf("%v in %s", err, body)
		}
		return n
	}
	before := samples()

	mustWrite(t, webFile, webConfig(map[string]string{"prometheus-a": "secret-a", "grafana": "secret-g", "ops": "secret-o"}))
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "grafana let in after SIGHUP", func() error {
		if v, code, body := count("grafana", "secret-g", "gpu-prod"); v != 16 {
			return fmt.Errorf("%d %.200s", code, body)
		}
		return nil
	})
	phase("grafana let in after SIGHUP")
	// Grafana's user has two tenants: without the header it must name one.
	if _, code, _ := count("grafana", "secret-g", ""); code != http.StatusBadRequest {
		t.Errorf("grafana without a tenant header: %d, want 400", code)
	}
	// A broken edit and SIGHUP: the previous configuration stays in force.
	mustWrite(t, webFile, "basic_auth_users: [not a map\n")
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the broken web config's reload to fail", func() error {
		code, body := get("/metrics", "ops", "secret-o", "")
		if code != http.StatusOK {
			return fmt.Errorf("/metrics: %d %.200s", code, body)
		}
		if !strings.Contains(body, "\ngpustore_server_web_config_last_reload_successful 0\n") {
			return fmt.Errorf("gpustore_server_web_config_last_reload_successful is not 0 yet")
		}
		return nil
	})
	phase("the broken web config's reload failed")
	if v, code, body := count("grafana", "secret-g", "gpu-prod"); v != 16 {
		t.Errorf("after a broken web config and SIGHUP: %d %.200s", code, body)
	}
	if code, _ := get("/api/v1/query?query=up", "", "", ""); code != http.StatusUnauthorized {
		t.Errorf("after a broken web config: query without credentials %d, want 401", code)
	}
	// Prometheus kept writing through both reloads.
	waitFor(t, 30*time.Second, "Prometheus still writing after the reloads", func() error {
		if n := samples(); n < before+3 {
			return fmt.Errorf("%v samples of one series, %v before the reloads", n, before)
		}
		return nil
	})
	phase("Prometheus still writing after the reloads")
	if cmd.ProcessState != nil {
		t.Fatal("gpustore exited")
	}
}
