package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	promapi "github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	"golang.org/x/crypto/bcrypt"

	"github.com/gpustore/gpustore/internal/testbin"
	"github.com/gpustore/gpustore/pkg/app"
	"github.com/gpustore/gpustore/pkg/block"
)

// mimirBackfill uploads block directories through Mimir's block-upload API
// sending exactly what `mimirtool backfill` (grafana/mimir
// pkg/mimirtool/client/backfill.go) sends, for machines where mimirtool is
// not installed: meta.json with a thanos.files list (meta.json, index,
// chunks/*, with sizes) to .../start, each file but meta.json to
// .../files?path=<query-escaped path> with its Content-Length, .../finish
// (again after a 429), then GET .../check until "complete" or "failed"; basic
// auth, X-Scope-OrgID and mimirtool's User-Agent on each. It returns what
// mimirtool's Backfill returns per block: nil, errConflict (409 on start:
// "already exists", not a failure) or the error.
func mimirBackfill(base, tenant, user, key string, blockDir string, sleep time.Duration) error {
	raw, err := os.ReadFile(filepath.Join(blockDir, "meta.json"))
	if err != nil {
		return err
	}
	var meta map[string]any
	if err := json.Unmarshal(raw, &meta); err != nil {
		return err
	}
	type file struct {
		RelPath   string `json:"rel_path"`
		SizeBytes int64  `json:"size_bytes,omitempty"`
	}
	files := []file{{RelPath: "meta.json"}}
	rels := []string{"index"}
	ents, err := os.ReadDir(filepath.Join(blockDir, "chunks"))
	if err != nil {
		return err
	}
	for _, e := range ents {
		rels = append(rels, path.Join("chunks", e.Name()))
	}
	for _, r := range rels {
		st, err := os.Stat(filepath.Join(blockDir, filepath.FromSlash(r)))
		if err != nil {
			return err
		}
		files = append(files, file{RelPath: r, SizeBytes: st.Size()})
	}
	thanos, _ := meta["thanos"].(map[string]any)
	if thanos == nil {
		thanos = map[string]any{"labels": nil, "downsample": map[string]any{"resolution": 0}, "source": ""}
	}
	thanos["files"] = files
	meta["thanos"] = thanos
	id := meta["ulid"].(string)
	do := func(method, p string, body io.Reader, n int64) (*http.Response, error) {
		req, err := http.NewRequest(method, base+p, body)
		if err != nil {
			return nil, err
		}
		if n >= 0 {
			req.ContentLength = n
		}
		req.Header.Add("User-Agent", "mimirtool/test")
		req.SetBasicAuth(user, key)
		req.Header.Add("X-Scope-OrgID", tenant)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode/100 != 2 {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
			resp.Body.Close()
			return resp, &statusError{resp.StatusCode, string(b)}
		}
		return resp, nil
	}
	prefix := path.Join("/api/v1/upload/block", url.PathEscape(id))
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(meta); err != nil {
		return err
	}
	resp, err := do(http.MethodPost, path.Join(prefix, "start"), &buf, int64(buf.Len()))
	if err != nil {
		return err
	}
	resp.Body.Close()
	for _, f := range files[1:] {
		fh, err := os.Open(filepath.Join(blockDir, filepath.FromSlash(f.RelPath)))
		if err != nil {
			return err
		}
		resp, err := do(http.MethodPost, path.Join(prefix, "files")+"?path="+url.QueryEscape(f.RelPath), fh, f.SizeBytes)
		fh.Close()
		if err != nil {
			return err
		}
		resp.Body.Close()
	}
	for {
		resp, err := do(http.MethodPost, path.Join(prefix, "finish"), nil, -1)
		if err == nil {
			resp.Body.Close()
			break
		}
		if se, ok := err.(*statusError); !ok || se.code != http.StatusTooManyRequests {
			return err
		}
		time.Sleep(sleep)
	}
	for {
		resp, err := do(http.MethodGet, path.Join(prefix, "check"), nil, -1)
		if err != nil {
			return err
		}
		var r struct {
			State string `json:"result"`
			Error string `json:"error"`
		}
		err = json.NewDecoder(resp.Body).Decode(&r)
		resp.Body.Close()
		if err != nil {
			return err
		}
		switch r.State {
		case "complete":
			return nil
		case "failed":
			return fmt.Errorf("block validation failed: %s", r.Error)
		}
		time.Sleep(sleep)
	}
}

type statusError struct {
	code int
	body string
}

func (e *statusError) Error() string { return fmt.Sprintf("status %d: %s", e.code, e.body) }

// backfill uploads the blocks with the real mimirtool when it is installed,
// else with mimirBackfill; it returns the output and whether every block
// succeeded or already existed.
func backfill(t *testing.T, base, tenant, user, key string, dirs ...string) (string, bool) {
	t.Helper()
	if bin := testbin.Lookup("mimirtool"); bin != "" {
		args := append([]string{"backfill", "--address=" + base, "--id=" + tenant, "--user=" + user, "--key=" + key, "--sleep-time=200ms"}, dirs...)
		out, err := exec.Command(bin, args...).CombinedOutput()
		return "mimirtool: " + string(out), err == nil
	}
	var out strings.Builder
	ok := true
	for _, d := range dirs {
		err := mimirBackfill(base, tenant, user, key, d, 200*time.Millisecond)
		if se, isStatus := err.(*statusError); isStatus && se.code == http.StatusConflict {
			fmt.Fprintf(&out, "%s: already exists\n", d)
			continue
		}
		if err != nil {
			ok = false
		}
		fmt.Fprintf(&out, "%s: %v\n", d, err)
	}
	return "mimirtool's requests: " + out.String(), ok
}

// TestMimirBlockUploadAPI: Mimir's block-upload API takes promtool's blocks
// as `mimirtool backfill` sends them (the real mimirtool where installed),
// only from an administrator's identity, into the tenant the request names;
// gpustore then answers over them as the Prometheus holding the same blocks
// does. A block uploaded again is "already exists" (409), a block that does
// not read fails its validation with the reason, and a block crossing the
// compactor's largest range is refused at start (422), as Mimir refuses it.
func TestMimirBlockUploadAPI(t *testing.T) {
	promBin := testbin.Need(t, "prometheus")
	h := makeHistory(time.Now().Add(-72 * time.Hour))
	blocks := promtoolBlocks(t, h, "")
	dirs, _ := filepath.Glob(filepath.Join(blocks, "01*"))
	slices.Sort(dirs)
	if len(dirs) < 10 {
		t.Fatalf("promtool wrote %d blocks", len(dirs))
	}

	dir := t.TempDir()
	hash := func(p string) string {
		b, err := bcrypt.GenerateFromPassword([]byte(p), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	web := filepath.Join(dir, "web.yml")
	if err := os.WriteFile(web, fmt.Appendf(nil, "basic_auth_users:\n  ops: %s\n  team-a: %s\n", hash("o"), hash("a")), 0o600); err != nil {
		t.Fatal(err)
	}
	s3 := startS3(t)
	_, gsURL := startGpustore(t, func(c *app.Config) {
		withBucket(s3)(c)
		c.Server.WebConfigFile = web
		c.Tenant.Auth = map[string][]string{"ops": {"*"}, "team-a": {"team-a"}}
		c.Query.MaxSourceResolution = "raw"
		c.Compact.Interval = model.Duration(time.Hour)
	})

	// A tenant's own identity may not upload, not even into its tenant.
	if out, ok := backfill(t, gsURL, "team-a", "team-a", "a", dirs[0]); ok || !strings.Contains(out, "403") {
		t.Fatalf("upload by the tenant's identity: %s", out)
	}
	// The administrator uploads every block into team-a.
	out, ok := backfill(t, gsURL, "team-a", "ops", "o", dirs...)
	if !ok {
		t.Fatalf("backfill: %s", out)
	}
	t.Log(out)

	pdir := t.TempDir()
	if err := os.CopyFS(filepath.Join(pdir, "data"), os.DirFS(blocks)); err != nil {
		t.Fatal(err)
	}
	promURL, _ := startPrometheusProc(t, promBin, pdir, "global: {}\n", "--storage.tsdb.retention.time=10y")
	gs := promClientTenantAuth(t, gsURL, "team-a", "team-a", "a")
	waitFor(t, 30*time.Second, "the uploaded blocks in the bucket store", func() error {
		v, _, _, err := gs.Query(context.Background(), "count(DCGM_FI_DEV_GPU_UTIL)", time.UnixMilli(h.end-1))
		if err != nil || v.String() == "" {
			return fmt.Errorf("%v %v", v, err)
		}
		return nil
	})
	compareHistory(t, "mimir-api", promClient(t, promURL), gs, h)

	// Again: every block exists; backfill does not fail for it.
	if out, ok := backfill(t, gsURL, "team-a", "ops", "o", dirs[3]); !ok || !strings.Contains(strings.ToLower(out), "already exists") {
		t.Errorf("a second upload: %s", out)
	}

	// A block whose chunks do not read fails validation, with the reason.
	bad := t.TempDir()
	if err := os.CopyFS(bad, os.DirFS(promtoolBlocks(t, makeHistory(time.Now().Add(-200*time.Hour)), ""))); err != nil {
		t.Fatal(err)
	}
	corruptOneChunkFile(t, bad)
	badDirs, _ := filepath.Glob(filepath.Join(bad, "01*"))
	slices.Sort(badDirs)
	var corrupt string
	for _, d := range badDirs {
		if _, err := block.VerifyLocal(context.Background(), d); err != nil {
			corrupt = d
		}
	}
	if out, ok := backfill(t, gsURL, "team-a", "ops", "o", corrupt); ok || !strings.Contains(out, "invalid block") {
		t.Errorf("a corrupt block: %s", out)
	}

	// A block over two of the compactor's 14d ranges is refused at start.
	long := promtoolBlocks(t, longHistory(), "18h")
	longDirs, _ := filepath.Glob(filepath.Join(long, "01*"))
	if len(longDirs) != 1 {
		t.Fatalf("promtool wrote %d blocks of the long history, want 1", len(longDirs))
	}
	if out, ok := backfill(t, gsURL, "team-a", "ops", "o", longDirs[0]); ok || !strings.Contains(out, "422") || !strings.Contains(out, "crosses a boundary") {
		t.Errorf("a block across a 14d boundary: %s", out)
	}
}

// longHistory is one series over the two hours around a 14d boundary that
// is not a multiple of 18h: promtool's 18h block holding them crosses it.
func longHistory() history {
	var h history
	const fortnight = 14 * 24 * 3600_000
	n := time.Now().Add(-40*24*time.Hour).UnixMilli()/fortnight + 1
	for n%3 == 0 { // 14d·n is a multiple of 18h only for n a multiple of 3
		n++
	}
	boundary := n * fortnight
	h.start, h.end = boundary-3600_000, boundary+3600_000
	var b bytes.Buffer
	b.WriteString("# TYPE across gauge\n")
	for ts := h.start; ts < h.end; ts += 60_000 {
		fmt.Fprintf(&b, "across 1 %s\n", secs(ts))
	}
	b.WriteString("# EOF\n")
	h.om = b.Bytes()
	return h
}

// promClientTenantAuth is promClientTenant with basic auth.
func promClientTenantAuth(t *testing.T, u, tenant, user, pass string) promv1.API {
	t.Helper()
	c, err := promapi.NewClient(promapi.Config{Address: u, RoundTripper: authTransport{tenant, user, pass}})
	if err != nil {
		t.Fatal(err)
	}
	return promv1.NewAPI(c)
}

type authTransport struct{ tenant, user, pass string }

func (a authTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-Scope-OrgID", a.tenant)
	r.SetBasicAuth(a.user, a.pass)
	return http.DefaultTransport.RoundTrip(r)
}
