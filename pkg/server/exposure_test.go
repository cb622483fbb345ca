package server

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/grafana/dskit/services"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpustore/gpustore/pkg/auth"
	"github.com/gpustore/gpustore/pkg/tenancy"
)

// startRingServer runs a Server as a receiver of the ring registers its
// routes: /receiver/write (a write route) and /receiver/read (a plain one),
// both Internal, beside a public write route; each answers the tenant and
// identity it was given.
func startRingServer(t *testing.T, webConfig string, tenants tenancy.Config, peers []string) *Server {
	t.Helper()
	s, err := New(Config{ListenAddress: "127.0.0.1:0", WebConfigFile: webConfig}, Deps{
		Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry(),
		Ready: func() error { return nil }, Tenants: tenants, Peers: peers,
	})
	if err != nil {
		t.Fatal(err)
	}
	echo := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := tenants.FromRequest(r)
		if err != nil {
			http.Error(w, err.Error(), err.(*tenancy.Error).Status)
			return
		}
		who, _ := auth.IdentityFrom(r.Context())
		fmt.Fprintf(w, "tenant=%s identity=%s", id, who.Name())
	})
	s.Writes.Handle("/receiver/write", echo)
	s.Writes.Handle("/api/v1/write", echo)
	s.Mux.Handle("/receiver/read", echo)
	s.Internal("/receiver/write", "/receiver/read")
	if err := services.StartAndAwaitRunning(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = services.StopAndAwaitTerminated(context.Background(), s) })
	return s
}

// TestInternalRoutesTakeOnlyTheRingsIdentity: the ring's internal routes
// (a receiver's /receiver/write skips the distributors' rate limit and HA
// election; /receiver/read serves any tenant) refuse every tenant's
// identity. Without ring.peer_identities only an identity allowed "*"
// (what ring.client was documented to use) gets in; with them only they
// do, even with no entry in tenants.auth, and the tenant is the one the
// calling process names. Before, a tenant's identity wrote through
// /receiver/write for its own tenant, past its ingestion rate.
func TestInternalRoutesTakeOnlyTheRingsIdentity(t *testing.T) {
	file := filepath.Join(t.TempDir(), "web.yml")
	writeFile(t, file, fmt.Sprintf("basic_auth_users:\n  team-a-prom: %s\n  ops: %s\n  ring: %s\n",
		bcryptHash(t, "a"), bcryptHash(t, "o"), bcryptHash(t, "r")))
	tenants := tenancy.Config{Auth: map[string][]string{"team-a-prom": {"team-a"}, "ops": {tenancy.AnyTenant}}}
	pass := map[string]string{"team-a-prom": "a", "ops": "o", "ring": "r"}
	type want struct {
		code int
		body string
	}
	for _, c := range []struct {
		name  string
		peers []string
		want  map[string]want // user -> answer on both internal routes (tenant team-a)
	}{
		{"without ring.peer_identities", nil, map[string]want{
			"":            {http.StatusUnauthorized, ""},
			"team-a-prom": {http.StatusForbidden, ""},
			"ops":         {http.StatusOK, "tenant=team-a identity=ops"},
			"ring":        {http.StatusForbidden, ""},
		}},
		{"with ring.peer_identities", []string{"ring"}, map[string]want{
			"":            {http.StatusUnauthorized, ""},
			"team-a-prom": {http.StatusForbidden, ""},
			"ops":         {http.StatusForbidden, ""},
			"ring":        {http.StatusOK, "tenant=team-a identity=ring"},
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := startRingServer(t, file, tenants, c.peers)
			base := "http://" + s.Addr().String()
			for user, w := range c.want {
				for _, path := range []string{"/receiver/write", "/receiver/read"} {
					code, body := do(t, http.DefaultClient, base, call{method: http.MethodPost, path: path, user: user, pass: pass[user], tenant: "team-a"})
					if code != w.code || (w.body != "" && body != w.body) {
						t.Errorf("%s as %q: %d %q, want %d %q", path, user, code, strings.TrimSpace(body), w.code, w.body)
					}
				}
			}
			// The public write route is unchanged: the tenant's own
			// identity writes its tenant, the ring's is no tenant's.
			if code, body := do(t, http.DefaultClient, base, call{method: http.MethodPost, path: "/api/v1/write", user: "team-a-prom", pass: "a"}); code != http.StatusOK || body != "tenant=team-a identity=team-a-prom" {
				t.Errorf("public write as the tenant: %d %q", code, body)
			}
			if code, _ := do(t, http.DefaultClient, base, call{method: http.MethodPost, path: "/api/v1/write", user: "ring", pass: "r", tenant: "team-a"}); code != http.StatusForbidden {
				t.Errorf("public write as the ring's identity: %d, want 403 (it is no tenant's)", code)
			}
		})
	}
}

// logBuffer collects a logger's records.
type logBuffer struct {
	mtx sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mtx.Lock()
	defer b.mtx.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mtx.Lock()
	defer b.mtx.Unlock()
	return b.buf.String()
}

// TestOpenDefaultIsWarnedAbout: without a web config every route is open,
// as the embedded single-user default wants; gpustore says so at start, at
// warning level, naming the routes that act on the process (reload,
// profiles, every tenant's metrics) and how to close them. With a web
// config it does not.
func TestOpenDefaultIsWarnedAbout(t *testing.T) {
	start := func(webConfig string) string {
		var logs logBuffer
		s, err := New(Config{ListenAddress: "127.0.0.1:0", WebConfigFile: webConfig}, Deps{
			Logger: slog.New(slog.NewTextHandler(&logs, nil)), Registry: prometheus.NewRegistry(), Ready: func() error { return nil },
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := services.StartAndAwaitRunning(context.Background(), s); err != nil {
			t.Fatal(err)
		}
		if err := services.StopAndAwaitTerminated(context.Background(), s); err != nil {
			t.Fatal(err)
		}
		return logs.String()
	}
	var warning string
	for line := range strings.SplitSeq(start(""), "\n") {
		if strings.Contains(line, "level=WARN") && strings.Contains(line, "open") {
			warning = line
		}
	}
	if warning == "" {
		t.Fatal("no warning at start that every route is open")
	}
	for _, what := range []string{"POST /-/reload", "/debug/pprof/", "/metrics", "web.config.file", "basic_auth_users", "docs/security.md"} {
		if !strings.Contains(warning, what) {
			t.Errorf("the warning does not name %q: %s", what, warning)
		}
	}
	file := filepath.Join(t.TempDir(), "web.yml")
	writeFile(t, file, "basic_auth_users:\n  ops: "+bcryptHash(t, "o")+"\n")
	if logs := start(file); strings.Contains(logs, "level=WARN") {
		t.Errorf("a warning with a web config: %s", logs)
	}
}
