package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang/snappy"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/prompb"
	"golang.org/x/crypto/bcrypt"

	"github.com/gpustore/gpustore/pkg/app"
	"github.com/gpustore/gpustore/pkg/compact"
)

// isolationTenant is what one tenant writes: names and values found nowhere
// in the other tenant's data, so a leak shows as a string in an answer.
type isolationTenant struct {
	user, tenant          string
	metric, value, label  string
	alert, group, record  string
	exemplarTrace, helpOf string
}

var (
	tenantA = isolationTenant{user: "alice", tenant: "team-a", metric: "a_secret_metric", value: "a-value", label: "a_only_label",
		alert: "AlertTeamA", group: "a-group", record: "a:secret:sum", exemplarTrace: "a-trace-id", helpOf: "help text of team a"}
	tenantB = isolationTenant{user: "bob", tenant: "team-b", metric: "b_secret_metric", value: "b-value", label: "b_only_label",
		alert: "AlertTeamB", group: "b-group", record: "b:secret:sum", exemplarTrace: "b-trace-id", helpOf: "help text of team b"}
)

func (it isolationTenant) markers() []string {
	return []string{it.metric, it.value, it.label, it.alert, it.group, it.record, it.exemplarTrace, it.helpOf}
}

// TestTenantIsolationEveryRoute: two tenants, each with its own basic-auth
// identity (tenants.auth), write distinct series, metadata, exemplars, HA
// elections and rules. Old samples are cut into minute blocks, shipped to the
// bucket, compacted there (both tenants) and dropped locally, so reads go
// through the bucket store's compacted blocks as well as the head. On every route gpustore serves, tenant A sees its own data and
// nothing of B's; naming B's tenant is 403 for reads and writes; and the
// process-wide routes are refused to both and open to an identity allowed "*".
func TestTenantIsolationEveryRoute(t *testing.T) {
	dir := t.TempDir()
	hash := func(p string) string {
		h, err := bcrypt.GenerateFromPassword([]byte(p), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		return string(h)
	}
	webFile := filepath.Join(dir, "web.yml")
	mustWrite(t, webFile, fmt.Sprintf("basic_auth_users:\n  alice: %s\n  bob: %s\n  ops: %s\n", hash("pa"), hash("pb"), hash("po")))
	for _, it := range []isolationTenant{tenantA, tenantB} {
		mustWrite(t, filepath.Join(dir, "rules", it.tenant, "rules.yml"), fmt.Sprintf(`groups:
  - name: %s
    interval: 1s
    rules:
      - record: %s
        expr: sum(%s)
      - alert: %s
        expr: vector(1)
        labels: {owner: %s}
`, it.group, it.record, it.metric, it.alert, it.value))
	}
	a, base := startGpustore(t, func(c *app.Config) {
		c.Server.WebConfigFile = webFile
		c.Tenant.Auth = map[string][]string{"alice": {"team-a"}, "bob": {"team-b"}, "ops": {"*"}}
		// Prometheus' own handlers that ask one fixed database would show
		// the default tenant to everybody: make that B.
		c.Tenant.DefaultTenant = "team-b"
		c.Rules.Dir = filepath.Join(dir, "rules")
		c.Rules.GPUPack = false
		c.Rules.TenantPollInterval = model.Duration(time.Second)
		c.TSDB.BlockDuration = model.Duration(time.Minute)
		c.TSDB.Retention = model.Duration(time.Minute)
		c.Shipper.Interval = model.Duration(500 * time.Millisecond)
		c.BucketStore.SyncInterval = model.Duration(time.Second)
		// The compactor (part of "all") merges the minute blocks into 4-minute
		// ones, so reads also go through compacted blocks of both tenants.
		c.Compact.Interval = model.Duration(time.Second)
		c.Compact.BlockRanges = compact.DurationList{model.Duration(time.Minute), model.Duration(4 * time.Minute)}
		c.Compact.LeaseSettle = model.Duration(100 * time.Millisecond)
	})
	pw := map[string]string{"alice": "pa", "bob": "pb", "ops": "po"}

	now := time.Now().UnixMilli() / 60_000 * 60_000
	start := now - 20*60_000
	for _, it := range []isolationTenant{tenantA, tenantB} {
		// No tenant header: the identity's single tenant.
		if code, body := isolationWrite(t, base, it.user, pw[it.user], "", it, start, now); code != http.StatusNoContent {
			t.Fatalf("%s writes: %d %s", it.user, code, body)
		}
	}
	// A write naming the other tenant is refused and stores nothing.
	intruder := tenantA
	intruder.metric, intruder.value = "intruder_metric", "intruder-value"
	if code, _ := isolationWrite(t, base, "alice", "pa", "team-b", intruder, start, now); code != http.StatusForbidden {
		t.Errorf("alice writing as team-b: %d, want 403", code)
	}
	if code, _ := isolationWrite(t, base, "nobody", "x", "", intruder, start, now); code != http.StatusUnauthorized {
		t.Errorf("unauthenticated write: %d, want 401", code)
	}

	waitFor(t, 2*time.Minute, "both tenants' old blocks in the bucket, compacted and gone locally, alerts firing", func() error {
		for _, it := range []isolationTenant{tenantA, tenantB} {
			compacted := 0
			for _, m := range a.BucketStore.Blocks(it.tenant) {
				if m.Compaction.Level > 1 {
					compacted++
				}
			}
			if compacted < 3 {
				return fmt.Errorf("%s: %d compacted blocks in the bucket", it.tenant, compacted)
			}
			if n := localBlocks(a, it.tenant); n > 3 {
				return fmt.Errorf("%s: %d local blocks", it.tenant, n)
			}
			code, body := isolationGet(t, base+"/api/v1/alerts", it.user, pw[it.user], "")
			if code != 200 || !strings.Contains(body, it.alert) {
				return fmt.Errorf("%s: alerts %d %.200s", it.tenant, code, body)
			}
		}
		return nil
	})

	rng := fmt.Sprintf("start=%d&end=%d", start/1000, now/1000)
	all := url.QueryEscape(`{__name__=~".+"}`)
	routes := []struct {
		path string
		want func(isolationTenant) string // what the tenant must see of its own
	}{
		{"/api/v1/query?query=" + all + fmt.Sprintf("&time=%d", (start+5*60_000)/1000), metricOf}, // from the bucket
		{"/api/v1/query?query=" + all + fmt.Sprintf("&time=%d", (now-30_000)/1000), metricOf},     // from the head
		{"/api/v1/query?query=" + url.QueryEscape("count by (__name__, secret) ({__name__=~\".+\"})"), valueOf},
		{"/api/v1/query_range?query=" + all + "&step=60&" + rng, metricOf},
		{"/api/v1/series?match[]=" + all + "&" + rng, valueOf},
		{"/api/v1/labels?" + rng, labelOf},
		{"/api/v1/label/__name__/values?" + rng, metricOf},
		{"/api/v1/label/secret/values?" + rng, valueOf},
		{"/api/v1/metadata", helpOf},
		{"/api/v1/query_exemplars?query=" + all + "&" + rng, traceOf},
		{"/api/v1/rules", func(it isolationTenant) string { return it.record }},
		{"/api/v1/alerts", func(it isolationTenant) string { return it.alert }},
		// The head holds the rule's output; the written series may already
		// be cut into a block.
		{"/api/v1/status/tsdb", func(it isolationTenant) string { return it.record }},
		{"/api/v1/status/tsdb/blocks", func(isolationTenant) string { return "blocks" }},
	}
	for _, pair := range [][2]isolationTenant{{tenantA, tenantB}, {tenantB, tenantA}} {
		me, other := pair[0], pair[1]
		for _, r := range routes {
			code, body := isolationGet(t, base+r.path, me.user, pw[me.user], "")
			if code != 200 {
				t.Errorf("%s GET %s: %d %.300s", me.user, r.path, code, body)
				continue
			}
			if want := r.want(me); !strings.Contains(body, want) {
				t.Errorf("%s GET %s: own data %q missing: %.400s", me.user, r.path, want, body)
			}
			for _, leak := range append(other.markers(), "intruder") {
				if strings.Contains(body, leak) {
					t.Errorf("%s GET %s shows %q of %s: %.400s", me.user, r.path, leak, other.tenant, body)
				}
			}
			// Naming the other tenant is refused.
			if code, body := isolationGet(t, base+r.path, me.user, pw[me.user], other.tenant); code != http.StatusForbidden {
				t.Errorf("%s GET %s as %s: %d %.200s, want 403", me.user, r.path, other.tenant, code, body)
			}
		}
		// Process-wide routes list every tenant: refused to tenant identities.
		for _, p := range []string{"/ha-tracker", "/metrics", "/api/v1/status/self_metrics", "/debug/pprof/heap"} {
			if code, _ := isolationGet(t, base+p, me.user, pw[me.user], ""); code != http.StatusForbidden {
				t.Errorf("%s GET %s: %d, want 403", me.user, p, code)
			}
		}
		if code := isolationPost(t, base+"/-/reload", me.user, pw[me.user]); code != http.StatusForbidden {
			t.Errorf("%s POST /-/reload: %d, want 403", me.user, code)
		}
	}
	// The operator identity ("*") sees both elections and may reload.
	code, body := isolationGet(t, base+"/ha-tracker", "ops", "po", "")
	if code != 200 || !strings.Contains(body, "team-a") || !strings.Contains(body, "team-b") {
		t.Errorf("ops GET /ha-tracker: %d %.300s", code, body)
	}
	if code := isolationPost(t, base+"/-/reload", "ops", "po"); code != http.StatusOK {
		t.Errorf("ops POST /-/reload: %d", code)
	}
	if code, body := isolationGet(t, base+"/debug/pprof/heap?debug=1", "ops", "po", ""); code != 200 || !strings.Contains(body, "heap profile") {
		t.Errorf("ops GET /debug/pprof/heap: %d %.200s", code, body)
	}
	for _, p := range []string{"/-/healthy", "/-/ready"} {
		if code, _ := isolationGet(t, base+p, "", "", ""); code != 200 {
			t.Errorf("probe %s without credentials: %d", p, code)
		}
	}
}

func metricOf(it isolationTenant) string { return it.metric }
func valueOf(it isolationTenant) string  { return it.value }
func labelOf(it isolationTenant) string  { return it.label }
func helpOf(it isolationTenant) string   { return it.helpOf }
func traceOf(it isolationTenant) string  { return it.exemplarTrace }

func mustWrite(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// isolationWrite sends the tenant's series every 15 s over [from, to), with
// metadata, an exemplar on the newest sample, and HA pair labels.
func isolationWrite(t *testing.T, base, user, pass, tenant string, it isolationTenant, from, to int64) (int, string) {
	t.Helper()
	ts := prompb.TimeSeries{Labels: []prompb.Label{
		{Name: "__name__", Value: it.metric}, {Name: "__replica__", Value: "replica-1"},
		{Name: it.label, Value: "x"}, {Name: "cluster", Value: "cluster-of-" + it.value}, {Name: "secret", Value: it.value},
	}}
	for ts0 := from; ts0 < to; ts0 += 15_000 {
		ts.Samples = append(ts.Samples, prompb.Sample{Timestamp: ts0, Value: float64(ts0 / 1000)})
	}
	last := ts.Samples[len(ts.Samples)-1]
	ts.Exemplars = []prompb.Exemplar{{Labels: []prompb.Label{{Name: "trace_id", Value: it.exemplarTrace}}, Value: last.Value, Timestamp: last.Timestamp}}
	req := &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{ts}, Metadata: []prompb.MetricMetadata{{
		MetricFamilyName: it.metric, Type: prompb.MetricMetadata_GAUGE, Help: it.helpOf,
	}}}
	raw, err := req.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	hreq, _ := http.NewRequest(http.MethodPost, base+"/api/v1/write", bytes.NewReader(snappy.Encode(nil, raw)))
	hreq.Header.Set("Content-Type", "application/x-protobuf")
	hreq.Header.Set("Content-Encoding", "snappy")
	hreq.SetBasicAuth(user, pass)
	if tenant != "" {
		hreq.Header.Set("X-Scope-OrgID", tenant)
	}
	resp, err := http.DefaultClient.Do(hreq)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func isolationGet(t *testing.T, u, user, pass, tenant string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	if user != "" {
		req.SetBasicAuth(user, pass)
	}
	if tenant != "" {
		req.Header.Set("X-Scope-OrgID", tenant)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func isolationPost(t *testing.T, u, user, pass string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, u, nil)
	req.SetBasicAuth(user, pass)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
