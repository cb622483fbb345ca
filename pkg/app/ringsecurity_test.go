package app

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/golang/snappy"
	config_util "github.com/prometheus/common/config"
	"github.com/prometheus/prometheus/prompb"
	"golang.org/x/crypto/bcrypt"

	"github.com/gpustore/gpustore/internal/abuse"
	"github.com/gpustore/gpustore/pkg/tenancy"
)

// TestRingInternalRoutesRefuseTenants runs a ring (a distributor, a
// receiver and a querier in one process, over the in-memory KV) behind a
// web config with a tenant's Prometheus, an operator allowed every tenant
// and the ring's own identity. A tenant's identity cannot use the
// receiver's internal routes: /receiver/write would take its samples past
// the distributor's ingestion rate and HA election, /receiver/read,
// /receiver/metadata and /receiver/tenants would answer for any tenant.
// Its writes and queries through the public API still go through the ring,
// which calls the receiver as the ring's identity (ring.client): the
// operator's by default (an identity allowed "*", as ring.client was
// documented), or one of ring.peer_identities, which needs no tenant.
func TestRingInternalRoutesRefuseTenants(t *testing.T) {
	dir := t.TempDir()
	hash := func(p string) string {
		h, err := bcrypt.GenerateFromPassword([]byte(p), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		return string(h)
	}
	web := filepath.Join(dir, "web.yml")
	if err := os.WriteFile(web, fmt.Appendf(nil, "basic_auth_users:\n  team-a-prom: %s\n  ops: %s\n  ring: %s\n", hash("a"), hash("o"), hash("r")), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, clientUser, clientPass string
		peers                        []string
		refused                      []string // users refused on the internal routes
	}{
		{"ring.client as an identity allowed every tenant", "ops", "o", nil, []string{"team-a-prom", "ring"}},
		{"ring.client as a peer identity", "ring", "r", []string{"ring"}, []string{"team-a-prom", "ops"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, _, err := Load(flag.NewFlagSet("gpustore", flag.ContinueOnError), []string{
				"-storage.tsdb.path=" + t.TempDir(), "-web.listen-address=127.0.0.1:0", "-web.config.file=" + web,
				"-ring.enabled", "-ring.store=inmemory", "-ring.replication-factor=1", "-ring.instance-id=solo", "-rules.gpu-pack=false",
				"-ring.flush-on-shutdown=false"})
			if err != nil {
				t.Fatal(err)
			}
			cfg.Tenant.Auth = map[string][]string{"team-a-prom": {"team-a"}, "ops": {tenancy.AnyTenant}}
			cfg.Ring.Client.BasicAuth = &config_util.BasicAuth{Username: c.clientUser, Password: config_util.Secret(c.clientPass)}
			cfg.Ring.PeerIdentities = c.peers
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			a := startApp(t, cfg)
			base := "http://" + a.Server.Addr().String()
			now := time.Now().UnixMilli()

			var code int
			for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
				if code = writeAs(t, base+"/api/v1/write", "team-a-prom", "a", "", now, 71); code == http.StatusNoContent {
					break
				}
			}
			if code != http.StatusNoContent {
				t.Fatalf("the tenant's write through the ring: %d", code)
			}
			if got := queryAs(t, base, "team-a-prom", "a", "DCGM_FI_DEV_GPU_TEMP"); got != "71" {
				t.Fatalf("the tenant's query through the ring: %q, want 71", got)
			}

			users := map[string]string{"team-a-prom": "a", "ops": "o", "ring": "r"}
			for _, user := range c.refused {
				if code := writeAs(t, base+"/receiver/write", user, users[user], "team-a", now+1, 1e9); code != http.StatusForbidden {
					t.Errorf("/receiver/write as %s: %d, want 403", user, code)
				}
				read, _ := http.NewRequest(http.MethodPost, base+"/receiver/read", bytes.NewReader(abuse.ReadRequest("DCGM_FI_DEV_GPU_TEMP", now-60_000, now+1)))
				for _, req := range []*http.Request{
					read,
					mustRequest(t, http.MethodGet, base+"/receiver/metadata"),
					mustRequest(t, http.MethodGet, base+"/receiver/tenants"),
				} {
					req.SetBasicAuth(user, users[user])
					req.Header.Set(tenancy.OrgIDHeader, "team-a")
					if code := doCode(t, req); code != http.StatusForbidden {
						t.Errorf("%s %s as %s: %d, want 403", req.Method, req.URL.Path, user, code)
					}
				}
			}
			if got := queryAs(t, base, "team-a-prom", "a", "DCGM_FI_DEV_GPU_TEMP"); got != "71" {
				t.Errorf("after the refused writes: %q, want 71 (nothing written past the distributor)", got)
			}
		})
	}
}

// writeAs sends one sample of DCGM_FI_DEV_GPU_TEMP{gpu="0"} as remote write
// 1.0 to u with basic auth (and a tenant header unless empty).
func writeAs(t *testing.T, u, user, pass, tenant string, ts int64, v float64) int {
	t.Helper()
	b, err := (&prompb.WriteRequest{Timeseries: []prompb.TimeSeries{{
		Labels:  []prompb.Label{{Name: "__name__", Value: "DCGM_FI_DEV_GPU_TEMP"}, {Name: "gpu", Value: "0"}},
		Samples: []prompb.Sample{{Timestamp: ts, Value: v}},
	}}}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	req := mustRequest(t, http.MethodPost, u)
	req.Body = io.NopCloser(bytes.NewReader(snappy.Encode(nil, b)))
	req.Header.Set("Content-Type", "application/x-protobuf")
	req.Header.Set("Content-Encoding", "snappy")
	req.SetBasicAuth(user, pass)
	if tenant != "" {
		req.Header.Set(tenancy.OrgIDHeader, tenant)
	}
	return doCode(t, req)
}

// queryAs evaluates expr now with basic auth and returns its only value,
// "" if none.
func queryAs(t *testing.T, base, user, pass, expr string) string {
	t.Helper()
	req := mustRequest(t, http.MethodGet, base+"/api/v1/query?query="+url.QueryEscape(expr))
	req.SetBasicAuth(user, pass)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Data struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || len(out.Data.Result) != 1 {
		return ""
	}
	v, _ := out.Data.Result[0].Value[1].(string)
	return v
}

func mustRequest(t *testing.T, method, u string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func doCode(t *testing.T, req *http.Request) int {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL.Path, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}
