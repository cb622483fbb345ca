package auth

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// FuzzWebConfig: any web config file is either refused at load, or serves
// requests without panicking and never lets a request without credentials
// through when users are configured.
func FuzzWebConfig(f *testing.F) {
	for _, s := range []string{
		"",
		"basic_auth_users:\n  alice: $2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi\n",
		"http_server_config:\n  headers:\n    X-Frame-Options: deny\n",
		"http_server_config:\n  http2: false\n",
		"rate_limit:\n  burst: 1\n  interval: 1s\n",
		"tls_server_config:\n  cert_file: x\n",
		"tls_server_config:\n  min_version: TLS13\n  max_version: TLS12\n",
		"basic_auth_users:\n  alice: ''\n",
		"{{{",
	} {
		f.Add([]byte(s))
	}
	dir := f.TempDir()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		path := filepath.Join(dir, "web.yml")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		w, err := Load(path, logger, prometheus.NewRegistry())
		if err != nil {
			return
		}
		passed := false
		h := w.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { passed = true }))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/v1/query", nil))
		if len(w.cur.Load().cfg.Users) > 0 && passed {
			t.Fatal("a request without credentials passed with users configured")
		}
		if passed && rec.Code != http.StatusOK {
			t.Fatalf("passed with status %d", rec.Code)
		}
	})
}
