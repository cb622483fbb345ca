package app

import (
	"context"
	"flag"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestRolesThatWouldHideDataAreRefused: until scale-out, a query or rules
// role without the ingest role in its process would answer without the
// newest data or write rule results nothing ships; gpustore refuses to start
// so, and says why. The targets that work still start and become ready.
func TestRolesThatWouldHideDataAreRefused(t *testing.T) {
	for _, c := range []struct{ target, want string }{
		{"query", "target query needs ingest in the same process (-target=all or -target=ingest,query)"},
		{"rules", "target rules needs ingest in the same process (-target=all or -target=ingest,rules)"},
		{"query,rules", "target rules needs ingest in the same process"},
	} {
		_, _, err := Load(flag.NewFlagSet("gpustore", flag.ContinueOnError), []string{"-target=" + c.target, "-storage.tsdb.path=" + t.TempDir()})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("-target=%s: %v, want an error saying %q", c.target, err, c.want)
		}
	}
	for _, target := range []string{All, Ingest, "ingest,query", "ingest,rules", "query,ingest,rules"} {
		t.Run(target, func(t *testing.T) {
			cfg, _, err := Load(flag.NewFlagSet("gpustore", flag.ContinueOnError), []string{
				"-target=" + target, "-storage.tsdb.path=" + t.TempDir(), "-web.listen-address=127.0.0.1:0"})
			if err != nil {
				t.Fatal(err)
			}
			a, err := New(cfg, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := a.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := a.Stop(); err != nil {
					t.Error(err)
				}
			}()
			resp, err := http.Get("http://" + a.Server.Addr().String() + "/-/ready")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("/-/ready: %d", resp.StatusCode)
			}
		})
	}
}
