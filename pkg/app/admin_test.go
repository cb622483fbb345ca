package app

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/gpustore/gpustore/pkg/tenancy"
)

// TestAdminAPIForAdministratorsOnly: with --web.enable-admin-api, Prometheus'
// TSDB admin API answers an identity allowed every tenant, for the tenant
// its request names; a tenant's own identity is refused (403) and nothing
// is deleted. Without the flag the routes are 404, as a disabled admin API.
func TestAdminAPIForAdministratorsOnly(t *testing.T) {
	dir := t.TempDir()
	web := filepath.Join(dir, "web.yml")
	hash := func(p string) string {
		h, _ := bcrypt.GenerateFromPassword([]byte(p), bcrypt.MinCost)
		return string(h)
	}
	if err := os.WriteFile(web, fmt.Appendf(nil, "basic_auth_users:\n  team-a-prom: %s\n  ops: %s\n", hash("a"), hash("o")), 0o600); err != nil {
		t.Fatal(err)
	}
	start := func(args ...string) (*App, string) {
		cfg, _, err := Load(flag.NewFlagSet("gpustore", flag.ContinueOnError), append([]string{
			"-storage.tsdb.path=" + filepath.Join(t.TempDir(), "data"), "-web.listen-address=127.0.0.1:0", "-web.config.file=" + web}, args...))
		if err != nil {
			t.Fatal(err)
		}
		cfg.Tenant.Auth = map[string][]string{"team-a-prom": {"team-a"}, "ops": {tenancy.AnyTenant}}
		a, err := New(cfg, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := a.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = a.Stop() })
		return a, "http://" + a.Server.Addr().String()
	}
	do := func(base, method, path, user, pass, body string) (int, string) {
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
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
	del := url.Values{"match[]": {`{Hostname="node-1"}`}}.Encode()
	features := func(base string) bool {
		code, body := do(base, http.MethodGet, "/api/v1/features", "ops", "o", "")
		var f struct {
			Data map[string]map[string]bool `json:"data"`
		}
		if err := json.Unmarshal([]byte(body), &f); code != http.StatusOK || err != nil {
			t.Fatalf("/api/v1/features: %d %v", code, err)
		}
		return f.Data["api"]["admin"]
	}
	_, off := start()
	for _, p := range []string{"delete_series", "clean_tombstones", "snapshot"} {
		if code, body := do(off, http.MethodPost, "/api/v1/admin/tsdb/"+p, "ops", "o", del); code != http.StatusNotFound {
			t.Errorf("%s without --web.enable-admin-api: %d, want 404: %.200s", p, code, body)
		}
	}

	if features(off) {
		t.Error("/api/v1/features says admin without --web.enable-admin-api")
	}
	a, on := start("-web.enable-admin-api")
	if !features(on) {
		t.Error("/api/v1/features does not say admin with --web.enable-admin-api")
	}
	for _, p := range []string{"delete_series", "clean_tombstones", "snapshot"} {
		if code, body := do(on, http.MethodPost, "/api/v1/admin/tsdb/"+p, "team-a-prom", "a", del); code != http.StatusForbidden {
			t.Errorf("%s as a tenant's identity: %d, want 403: %.200s", p, code, body)
		}
		if code, body := do(on, http.MethodPost, "/api/v1/admin/tsdb/"+p, "nobody", "x", del); code != http.StatusUnauthorized {
			t.Errorf("%s unauthenticated: %d, want 401: %.200s", p, code, body)
		}
	}
	if code, body := do(on, http.MethodPost, "/api/v1/admin/tsdb/delete_series", "ops", "o", del); code != http.StatusNoContent {
		t.Errorf("delete_series as the operator: %d, want 204: %.200s", code, body)
	}
	if code, body := do(on, http.MethodPut, "/api/v1/admin/tsdb/clean_tombstones", "ops", "o", ""); code != http.StatusNoContent {
		t.Errorf("clean_tombstones as the operator: %d, want 204: %.200s", code, body)
	}
	if code, body := do(on, http.MethodPost, "/api/v1/admin/tsdb/snapshot", "ops", "o", ""); code != http.StatusNotFound {
		t.Errorf("snapshot of a tenant without data: %d, want 404: %.200s", code, body)
	}
	if _, err := a.DBs.Get("team-a"); err != nil {
		t.Fatal(err)
	}
	code, body := do(on, http.MethodPost, "/api/v1/admin/tsdb/snapshot", "ops", "o", "")
	var snap struct {
		Data struct{ Name string } `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &snap); code != http.StatusOK || err != nil || snap.Data.Name == "" {
		t.Fatalf("snapshot as the operator: %d %v: %.200s", code, err, body)
	}
	if _, err := os.Stat(filepath.Join(a.DBs.TenantDir("team-a"), "snapshots", snap.Data.Name)); err != nil {
		t.Errorf("the snapshot is not in the tenant's directory: %v", err)
	}
}

// The admin API is refused with the ring: a deletion would have to reach
// every receiver's head, which this process does not hold.
func TestAdminAPINotWithTheRing(t *testing.T) {
	_, _, err := Load(flag.NewFlagSet("gpustore", flag.ContinueOnError), []string{
		"-storage.tsdb.path=" + t.TempDir(), "-web.enable-admin-api", "-target=query", "-ring.enabled", "-ring.store=inmemory", "-ring.instance-id=q"})
	if err == nil || !strings.Contains(err.Error(), "web.enable-admin-api") {
		t.Fatalf("admin API with the ring: %v, want refused", err)
	}
}
