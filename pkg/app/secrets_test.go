package app

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/gpustore/gpustore/pkg/tenancy"
)

// TestStatusAnswersKeepSecrets: /api/v1/status/flags showed the
// Alertmanager URL with its password to every tenant (the start-up log
// redacts it). With tenants authenticated, the flags, the configuration and
// the runtime information are an operator's (an identity allowed "*"); a
// tenant's identity is refused them (403) and sees its rule groups' files
// by name, not where the server keeps them. No answer, the operator's
// included, holds the password.
func TestStatusAnswersKeepSecrets(t *testing.T) {
	dir := t.TempDir()
	rulesDir := filepath.Join(dir, "rules")
	if err := os.MkdirAll(filepath.Join(rulesDir, "team-a"), 0o755); err != nil {
		t.Fatal(err)
	}
	rule := "groups:\n  - name: team-a\n    rules:\n      - record: team:gpu_temp:max\n        expr: max(DCGM_FI_DEV_GPU_TEMP)\n"
	if err := os.WriteFile(filepath.Join(rulesDir, "team-a", "gpu.yml"), []byte(rule), 0o644); err != nil {
		t.Fatal(err)
	}
	web := filepath.Join(dir, "web.yml")
	hash := func(p string) string {
		h, _ := bcrypt.GenerateFromPassword([]byte(p), bcrypt.MinCost)
		return string(h)
	}
	if err := os.WriteFile(web, fmt.Appendf(nil, "basic_auth_users:\n  team-a-prom: %s\n  ops: %s\n", hash("a"), hash("o")), 0o600); err != nil {
		t.Fatal(err)
	}
	const secret = "am-s3cret"
	fs := flag.NewFlagSet("gpustore", flag.ContinueOnError)
	cfg, _, err := Load(fs, []string{
		"-storage.tsdb.path=" + filepath.Join(dir, "data"), "-web.listen-address=127.0.0.1:0", "-web.config.file=" + web,
		"-rules.dir=" + rulesDir, "-alertmanager.url=http://am-user:" + secret + "@127.0.0.1:1/"})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Tenant.Auth = map[string][]string{"team-a-prom": {"team-a"}, "ops": {tenancy.AnyTenant}}
	a, err := New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	a.RecordFlags(fs) // as main does
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Stop() })
	base := "http://" + a.Server.Addr().String()
	get := func(path, user, pass string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, base+path, nil)
		req.SetBasicAuth(user, pass)
		req.Header.Set(tenancy.OrgIDHeader, "team-a")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	status := []string{"/api/v1/status/flags", "/api/v1/status/config", "/api/v1/status/runtimeinfo"}
	for _, p := range status {
		if code, body := get(p, "team-a-prom", "a"); code != http.StatusForbidden {
			t.Errorf("%s as a tenant: %d, want 403: %.200s", p, code, body)
		}
		code, body := get(p, "ops", "o")
		if code != http.StatusOK {
			t.Errorf("%s as the operator: %d", p, code)
		}
		if strings.Contains(body, secret) {
			t.Errorf("%s shows the Alertmanager password: %.300s", p, body)
		}
	}
	// The same routes spelt otherwise reach the handler only as the
	// operator (the mux and the API's router redirect to the clean path).
	for _, p := range []string{"/api/v1/status/flags/", "/api/v1//status/flags", "/api/v1/status/./flags", "/api/v1/status/%66lags", "/api/v1/./status/config"} {
		if code, body := get(p, "team-a-prom", "a"); code == http.StatusOK || strings.Contains(body, "alertmanager") || strings.Contains(body, "yaml") {
			t.Errorf("%s as a tenant: %d %.200s", p, code, body)
		}
	}
	if _, body := get("/api/v1/status/flags", "ops", "o"); !strings.Contains(body, `"alertmanager.url":"http://am-user:xxxxx@127.0.0.1:1/"`) {
		t.Errorf("the operator's flags do not show the redacted Alertmanager URL: %.300s", body)
	}

	files := func(user, pass string) []string {
		code, body := get("/api/v1/rules", user, pass)
		if code != http.StatusOK {
			t.Fatalf("/api/v1/rules as %s: %d %s", user, code, body)
		}
		var r struct {
			Data struct {
				Groups []struct {
					File string `json:"file"`
				} `json:"groups"`
			} `json:"data"`
		}
		if err := json.Unmarshal([]byte(body), &r); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, g := range r.Data.Groups {
			out = append(out, g.File)
		}
		return out
	}
	tenantFiles := files("team-a-prom", "a")
	if len(tenantFiles) == 0 {
		t.Fatal("the tenant's rule group is not listed")
	}
	for _, f := range tenantFiles {
		if strings.Contains(f, rulesDir) || (f != "gpu.yml" && !strings.HasPrefix(f, "embedded:gpu-pack/")) {
			t.Errorf("a tenant is shown the rule file %q", f)
		}
	}
	if opsFiles := files("ops", "o"); !strings.Contains(strings.Join(opsFiles, " "), filepath.Join(rulesDir, "team-a", "gpu.yml")) {
		t.Errorf("the operator's rule files %v lack the file's path", opsFiles)
	}
}
