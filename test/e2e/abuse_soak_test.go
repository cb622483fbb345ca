package e2e

// The abuse soak: every workload of internal/abuse at once, round after
// round, against one gpustore process while a legitimate Prometheus sender
// writes. `make test` runs it for abuseSoakShort; `make soak`
// (GPUSTORE_SOAK=long) for abuseSoakLong; GPUSTORE_ABUSE_SOAK_DURATION (a Go
// duration) sets the abuse's length either way.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang/snappy"
	config_util "github.com/prometheus/common/config"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/prompb"
	"github.com/prometheus/prometheus/storage/remote"
	"golang.org/x/crypto/bcrypt"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/gpustore/gpustore/internal/abuse"
)

const (
	abuseSoakShort = 20 * time.Second
	abuseSoakLong  = 6 * time.Minute

	// The bounds the abuse meets, small enough that each matters.
	abuseMaxTenants = 8  // gpu-prod and lab, and room for 6 of the flood's
	abuseWriteSlots = 16 // a tenant's writes being stored: mallory's slow and trickled bodies are twice as many
	// The smallest bound allowed with these request sizes (1 MiB compressed
	// + 4 MiB decoded). Each slow or trickled body holds up to 32 KiB of it
	// (the first read buffer) until it is cut.
	abuseInflightBytes = 5 << 20
	abuseStallTimeout  = 2 * time.Second
	abuseReadSlots     = 4 // remote reads in progress
	abuseQuerySlots    = 4
	// The metric families whose metadata a tenant keeps: mallory's
	// metadata-only requests pass it in their first round.
	abuseMetadataFamilies = 2000

	// A resource is back when it is at most its baseline plus this, within
	// abuseSettleTime. The baseline is the highest reading of a quiet window
	// under the legitimate load (the heap in use swings with each GC cycle).
	abuseSettleTime = time.Minute
)

var abuseSlack = map[string]float64{
	"go_goroutines":                 10,
	"process_open_fds":              10,
	"go_memstats_heap_inuse_bytes":  32 << 20,
	"process_resident_memory_bytes": 64 << 20,
}

// abuseBoundCounters count what the bounds refused; the soak prints them.
var abuseBoundCounters = []string{"gpustore_server_write_requests_throttled_total", "gpustore_ingest_inflight_bytes_refused_requests_total",
	"gpustore_server_unauthorized_requests_total", "gpustore_server_password_checks_total", "gpustore_ingest_rejected_metadata_total"}

func abuseSoakDuration(t *testing.T) time.Duration {
	if v := os.Getenv("GPUSTORE_ABUSE_SOAK_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("GPUSTORE_ABUSE_SOAK_DURATION: %v", err)
		}
		return d
	}
	if soakConfig().long {
		return abuseSoakLong
	}
	return abuseSoakShort
}

// The identities of the web config and their tenants (tenants.auth).
const (
	legitUser   = "prometheus" // the legitimate sender: gpu-prod only
	tenantUser  = "mallory"    // a hostile tenant: lab only
	relayUser   = "relay"      // a relay that forwards for any tenant ("*"): it may create tenants
	opsUser     = "ops"        // the operator ("*"): reads /metrics
	grafanaUser = "grafana"    // a dashboard's reader of gpu-prod: its first request comes during a password flood
)

func abusePassword(user string) string { return user + "-s3cret" }

func basicAuthHeader(user string) http.Header {
	return http.Header{"Authorization": {"Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+abusePassword(user)))}}
}

// startAbuseTarget runs the gpustore binary with a web config (bcrypt at
// its default cost, as htpasswd -B makes it) and a tenant map, its limits
// at the abuse* bounds.
func startAbuseTarget(t *testing.T) *soakProc {
	t.Helper()
	dir := t.TempDir()
	var web, auth strings.Builder
	web.WriteString("basic_auth_users:\n")
	auth.WriteString("tenants:\n  auth:\n")
	for user, tenants := range map[string]string{legitUser: "[gpu-prod]", tenantUser: "[lab]", relayUser: `["*"]`, opsUser: `["*"]`, grafanaUser: "[gpu-prod]"} {
		h, err := bcrypt.GenerateFromPassword([]byte(abusePassword(user)), bcrypt.DefaultCost)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&web, "  %s: %s\n", user, h)
		fmt.Fprintf(&auth, "    %s: %s\n", user, tenants)
	}
	webFile, cfgFile := filepath.Join(dir, "web.yml"), filepath.Join(dir, "gpustore.yml")
	mustWrite(t, webFile, web.String())
	mustWrite(t, cfgFile, auth.String())
	p := &soakProc{t: t, bin: buildGpustore(t), dir: filepath.Join(dir, "data"), addr: freePort(t), args: []string{
		"-config.file=" + cfgFile, "-web.config.file=" + webFile,
		"-limits.max-tenants=" + strconv.Itoa(abuseMaxTenants),
		"-ingest.max-request-bytes=1048576", "-ingest.max-decoded-bytes=4194304", "-ingest.max-inflight-bytes=" + strconv.Itoa(abuseInflightBytes),
		"-web.max-concurrent-writes-per-tenant=" + strconv.Itoa(abuseWriteSlots), "-web.write-body-stall-timeout=" + abuseStallTimeout.String(),
		"-limits.max-metadata-families=" + strconv.Itoa(abuseMetadataFamilies),
		"-storage.remote.read-concurrent-limit=" + strconv.Itoa(abuseReadSlots),
		"-query.max-concurrency=" + strconv.Itoa(abuseQuerySlots), "-query.timeout=20s",
		"-query.max-expression-depth=128", "-query.max-expression-bytes=262144",
		// The GPU rule pack's groups first evaluate up to 5 minutes after a
		// tenant gets GPU data, each adding its share of the tenant's
		// ~12 MiB (bench/RESULTS.md, TestGPUTenantCost): growth after any
		// shorter baseline that is no abuse's. Off, the soak measures what
		// the abuse leaves.
		"-rules.gpu-pack=false",
	}}
	t.Cleanup(func() {
		if p.cmd != nil && p.cmd.ProcessState == nil {
			p.kill()
		}
		if t.Failed() {
			t.Logf("gpustore log:\n%.8000s", p.log.String())
		}
	})
	p.start()
	return p
}

// dcgmSoakSeries are dcgm-exporter's series of a 4-node, 32-GPU cluster
// with its labels as the exporter sets them (sorted, as Prometheus sends
// them); the last node's GPUs 0-3 are split into two MIG instances each.
func dcgmSoakSeries() [][]prompb.Label {
	metrics := []string{"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_FB_USED",
		"DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"}
	var out [][]prompb.Label
	for node := range 4 {
		host := fmt.Sprintf("gpu-node-%d", node)
		for gpu := range 8 {
			instances := []string{""}
			if node == 3 && gpu < 4 {
				instances = []string{"1", "2"}
			}
			for _, m := range metrics {
				for _, mig := range instances {
					ls := []prompb.Label{{Name: "__name__", Value: m}, {Name: "DCGM_FI_DRIVER_VERSION", Value: "570.124.06"},
						{Name: "Hostname", Value: host}, {Name: "UUID", Value: fmt.Sprintf("GPU-%08x-5e1a-4b7c-9d2e-3f4a5b6c7d8e", node*8+gpu)},
						{Name: "device", Value: fmt.Sprintf("nvidia%d", gpu)}, {Name: "gpu", Value: strconv.Itoa(gpu)},
						{Name: "instance", Value: host + ":9400"}, {Name: "job", Value: "dcgm-exporter"},
						{Name: "modelName", Value: "NVIDIA H100 80GB HBM3"}, {Name: "pci_bus_id", Value: fmt.Sprintf("00000000:%02X:00.0", 0x18+gpu)}}
					if mig != "" {
						ls = append(ls, prompb.Label{Name: "GPU_I_ID", Value: mig}, prompb.Label{Name: "GPU_I_PROFILE", Value: "3g.40gb"})
					}
					slices.SortFunc(ls, func(a, b prompb.Label) int { return strings.Compare(a.Name, b.Name) })
					out = append(out, ls)
				}
			}
		}
	}
	return out
}

func labelsKey(ls []prompb.Label) string {
	var b strings.Builder
	for _, l := range ls {
		b.WriteString(l.Name + "=" + l.Value + ",")
	}
	return b.String()
}

// legitValue encodes the series and the time: any sample read back can be
// checked. Below 2^53: exact through JSON.
func legitValue(series int, ts int64) float64 { return float64(series)*1e10 + float64(ts%1e10) }

// legitBatch is one request of a shard: a sample of each of its series at ts.
type legitBatch struct {
	shard int
	ts    int64
	acked bool
}

// legitSender is a Prometheus remote-write queue: shards that each send,
// every interval, a sample of their series through Prometheus' own client
// (storage/remote, with basic auth from its HTTP client config) and retry a
// batch as Prometheus does, 5xx and connection errors with backoff until it
// is acknowledged, and drop it on any 4xx (429 included: Prometheus retries
// it only with retry_on_http_429, off by default). A dropped batch is data
// lost: the soak's failure.
type legitSender struct {
	client   remote.WriteClient
	series   [][]prompb.Label
	shards   int
	interval time.Duration

	mtx        sync.Mutex
	batches    []legitBatch
	firstTry   int         // batches acknowledged at once
	afterRetry int         // batches acknowledged after retries
	failed     []string    // batches dropped: why
	answers    map[int]int // answers other than 2xx by status; 0: connection errors
	retries    int
}

func newLegitSender(t *testing.T, base string, series [][]prompb.Label) *legitSender {
	u, err := url.Parse(base + "/api/v1/write")
	if err != nil {
		t.Fatal(err)
	}
	c, err := remote.NewWriteClient("legit", &remote.ClientConfig{
		URL: &config_util.URL{URL: u}, Timeout: model.Duration(30 * time.Second),
		HTTPClientConfig: config_util.HTTPClientConfig{BasicAuth: &config_util.BasicAuth{Username: legitUser, Password: config_util.Secret(abusePassword(legitUser))}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return &legitSender{client: c, series: series, shards: 2, interval: time.Second, answers: map[int]int{}}
}

// run sends until stop is closed, then returns once every batch sent is
// acknowledged or dropped.
func (s *legitSender) run(stop <-chan struct{}) {
	var wg sync.WaitGroup
	for sh := range s.shards {
		wg.Go(func() {
			tick := time.NewTicker(s.interval)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				s.send(sh, time.Now().UnixMilli())
			}
		})
	}
	wg.Wait()
}

func (s *legitSender) encode(shard int, ts int64) []byte {
	req := &prompb.WriteRequest{}
	for i, ls := range s.series {
		if i%s.shards == shard {
			req.Timeseries = append(req.Timeseries, prompb.TimeSeries{Labels: ls, Samples: []prompb.Sample{{Timestamp: ts, Value: legitValue(i, ts)}}})
		}
	}
	raw, err := req.Marshal()
	if err != nil {
		panic(err) // a valid message
	}
	return snappy.Encode(nil, raw)
}

var httpStatusInError = regexp.MustCompile(`HTTP status (\d{3})`)

// send delivers one batch as a Prometheus shard does: retries block the
// shard (a later batch of its series would be out of order before it).
func (s *legitSender) send(shard int, ts int64) {
	body := s.encode(shard, ts)
	s.mtx.Lock()
	idx := len(s.batches)
	s.batches = append(s.batches, legitBatch{shard: shard, ts: ts})
	s.mtx.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	backoff := 30 * time.Millisecond // Prometheus' min_backoff; max_backoff 5s
	for attempt := 0; ; attempt++ {
		_, err := s.client.Store(ctx, body, attempt)
		s.mtx.Lock()
		if err == nil {
			s.batches[idx].acked = true
			if attempt == 0 {
				s.firstTry++
			} else {
				s.afterRetry++
			}
			s.mtx.Unlock()
			return
		}
		code := 0
		if m := httpStatusInError.FindStringSubmatch(err.Error()); m != nil {
			code, _ = strconv.Atoi(m[1])
		}
		s.answers[code]++
		var recoverable remote.RecoverableError
		if !errors.As(err, &recoverable) || ctx.Err() != nil {
			s.failed = append(s.failed, fmt.Sprintf("shard %d batch at %d, attempt %d: %v", shard, ts, attempt+1, err))
			s.mtx.Unlock()
			return
		}
		s.retries++
		s.mtx.Unlock()
		time.Sleep(backoff)
		backoff = min(2*backoff, 5*time.Second)
	}
}

// shardsAcked is how many shards have had a batch acknowledged: once all
// have, each of the sender's series exists.
func (s *legitSender) shardsAcked() int {
	s.mtx.Lock()
	defer s.mtx.Unlock()
	acked := map[int]bool{}
	for _, b := range s.batches {
		if b.acked {
			acked[b.shard] = true
		}
	}
	return len(acked)
}

func (s *legitSender) summary() string {
	s.mtx.Lock()
	defer s.mtx.Unlock()
	return fmt.Sprintf("batches %d (acknowledged at once %d, after retries %d, dropped %d), samples acknowledged %d, retries %d, answers other than 2xx %v",
		len(s.batches), s.firstTry, s.afterRetry, len(s.failed), (s.firstTry+s.afterRetry)*len(s.series)/s.shards, s.retries, s.answers)
}

// verify reads every sample of the sender's series back through the query
// API as the sender's identity and returns the acknowledged samples
// missing; a sample never sent or with another value is an error.
func (s *legitSender) verify(base string, header http.Header) (checked, lost int, err error) {
	s.mtx.Lock()
	batches := slices.Clone(s.batches)
	s.mtx.Unlock()
	if len(batches) == 0 {
		return 0, 0, errors.New("nothing was sent")
	}
	from, to := batches[0].ts, batches[0].ts
	sent := map[[2]int64]bool{} // shard, ts
	for _, b := range batches {
		from, to = min(from, b.ts), max(to, b.ts)
		sent[[2]int64{int64(b.shard), b.ts}] = true
	}
	byKey := map[string]int{}
	names := map[string]bool{}
	for i, ls := range s.series {
		byKey[labelsKey(ls)] = i
		for _, l := range ls {
			if l.Name == "__name__" {
				names[l.Value] = true
			}
		}
	}
	seen := map[[2]int64]bool{} // series, ts
	var errs []error
	for name := range names {
		got, qerr := queryMatrix(base, header, fmt.Sprintf("%s[%dms]", name, to-from+1), to)
		if qerr != nil {
			return 0, 0, qerr
		}
		for _, ser := range got {
			var ls []prompb.Label
			for n, v := range ser.Metric {
				ls = append(ls, prompb.Label{Name: string(n), Value: string(v)})
			}
			slices.SortFunc(ls, func(a, b prompb.Label) int { return strings.Compare(a.Name, b.Name) })
			i, ok := byKey[labelsKey(ls)]
			if !ok {
				errs = append(errs, fmt.Errorf("series %v was never sent", ser.Metric))
				continue
			}
			for _, p := range ser.Values {
				ts := int64(p.Timestamp)
				switch {
				case !sent[[2]int64{int64(i % s.shards), ts}]:
					errs = append(errs, fmt.Errorf("%v: sample at %d was never sent", ser.Metric, ts))
				case float64(p.Value) != legitValue(i, ts):
					errs = append(errs, fmt.Errorf("%v: sample at %d is %v, sent %v", ser.Metric, ts, p.Value, legitValue(i, ts)))
				}
				seen[[2]int64{int64(i), ts}] = true
			}
		}
	}
	for _, b := range batches {
		if !b.acked {
			continue
		}
		for i := b.shard; i < len(s.series); i += s.shards {
			checked++
			if !seen[[2]int64{int64(i), b.ts}] {
				lost++
			}
		}
	}
	if len(errs) > 5 {
		errs = append(errs[:5], fmt.Errorf("and %d more", len(errs)-5))
	}
	return checked, lost, errors.Join(errs...)
}

// queryMatrix runs an instant query of raw samples (no query-time
// deduplication, raw resolution) at ts (ms).
func queryMatrix(base string, header http.Header, expr string, ts int64) (model.Matrix, error) {
	q := url.Values{"dedup": {"false"}, "max_source_resolution": {"raw"}, "query": {expr}, "time": {fmt.Sprintf("%.3f", float64(ts)/1000)}}
	req, err := http.NewRequest(http.MethodGet, base+"/api/v1/query?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	maps.Copy(req.Header, header)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result model.Matrix `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return nil, fmt.Errorf("query %s: %s: %w", expr, resp.Status, err)
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("query %s: %s", expr, r.Error)
	}
	return r.Data.Result, nil
}

// abuseRun repeats the five workloads of internal/abuse and counts what
// they got.
type abuseRun struct {
	base  string // http://host:port
	addr  string
	evil  http.Header // mallory's credentials
	relay http.Header

	mtx       sync.Mutex
	rounds    map[string]int
	reads     int // remote reads abandoned
	bombs     int // bombs sent
	bombWorst time.Duration
	stalled   int                    // slow bodies sent
	trickled  int                    // trickled bodies sent (remote write and OTLP)
	flood     map[int]int            // the tenant flood's answers
	guesses   map[int]int            // the password flood's answers
	otlp      map[string]map[int]int // the OTLP bombs' answers, by bomb
	otlpWorst time.Duration
	metadata  map[int]int   // the metadata-only requests' answers
	firstUser time.Duration // grafana's first request, during a password flood
	problems  []string      // answers a workload must not get
}

func (r *abuseRun) problem(format string, args ...any) {
	r.mtx.Lock()
	defer r.mtx.Unlock()
	if len(r.problems) < 20 {
		r.problems = append(r.problems, fmt.Sprintf(format, args...))
	}
}

func (r *abuseRun) count(workload string, add func()) {
	r.mtx.Lock()
	defer r.mtx.Unlock()
	r.rounds[workload]++
	add()
}

// abandonedReads: 100 remote reads of the lab tenant's GPU data at once,
// their clients gone before the answer.
func (r *abuseRun) abandonedReads() {
	now := time.Now().UnixMilli()
	if err := abuse.AbandonedReads(r.addr, "/api/v1/read", abuse.ReadRequest("DCGM_FI_DEV_GPU_UTIL", now-600_000, now), r.evil, 100); err != nil {
		r.problem("abandoned reads: %v", err)
	}
	r.count("abandoned reads", func() { r.reads += 100 })
}

// parseBombs: every bomb on every PromQL route, each answered 400 at once.
func (r *abuseRun) parseBombs() {
	answers := abuse.SendParseBombs(context.Background(), r.base, r.evil, 30*time.Second)
	var worst time.Duration
	for _, a := range answers {
		worst = max(worst, a.Took)
		if a.Err != nil || a.Status != http.StatusBadRequest || a.Took > 5*time.Second {
			r.problem("parse bomb %s to %s: %d after %s (%v), want 400 at once: %.120s", a.Bomb, a.Route, a.Status, a.Took, a.Err, a.Body)
		}
	}
	r.count("parse bombs", func() { r.bombs += len(answers); r.bombWorst = max(r.bombWorst, worst) })
}

// tenantFlood: the relay writes a GPU sample for 50 new tenants, 8 at a
// time. Past max_tenants each is answered 429.
func (r *abuseRun) tenantFlood(round int) {
	body := dcgmSample(time.Now().UnixMilli())
	ans := abuse.TenantFlood(context.Background(), http.DefaultClient, r.base+"/api/v1/write", body, fmt.Sprintf("flood-%d-", round), 50, 8,
		func(req *http.Request) { maps.Copy(req.Header, r.relay) })
	r.count("tenant flood", func() {
		for code, n := range ans.ByCode {
			r.flood[code] += n
		}
	})
}

// slowBodies: mallory's remote writes that send their headers and a byte,
// twice as many as the tenant has write slots (they take none: a slot is
// taken once a body is read), held past the stall timeout, which cuts them.
func (r *abuseRun) slowBodies() {
	closeAll, err := abuse.SlowBodies(r.addr, nil, 2*abuseWriteSlots, r.evil)
	if err != nil {
		r.problem("slow bodies: %v", err)
		return
	}
	time.Sleep(abuseStallTimeout + time.Second)
	closeAll()
	r.count("slow bodies", func() { r.stalled += 2 * abuseWriteSlots })
}

// passwordFlood: 32 connections guess the legitimate sender's password for
// d, each guess a bcrypt check (401) or, past the checks that may wait,
// refused unchecked at once (503). With firstUser, grafana's first request
// comes a moment into the flood and must be answered within 10 s (retrying
// 503s, as a client does), not after the guesses queued before it.
func (r *abuseRun) passwordFlood(d time.Duration, firstUser bool) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 32}}
	defer client.CloseIdleConnections() // the attacker's connections are no server's footprint
	var first sync.WaitGroup
	if firstUser {
		first.Go(func() {
			time.Sleep(d / 4)
			start := time.Now()
			for {
				code, err := getStatus(r.base+"/api/v1/query?query=up", basicAuthHeader(grafanaUser))
				if code == http.StatusOK {
					r.mtx.Lock()
					r.firstUser = time.Since(start)
					r.mtx.Unlock()
					return
				}
				if (code != http.StatusServiceUnavailable && err == nil) || time.Since(start) > 10*time.Second {
					r.problem("grafana's first request during the password flood: %d (%v) after %s", code, err, time.Since(start))
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
	ans := abuse.PasswordFlood(ctx, client, r.base+"/api/v1/write", legitUser, 32)
	first.Wait()
	r.count("password flood", func() {
		for code, n := range ans.ByCode {
			r.guesses[code] += n
		}
	})
}

// otlpBombs: mallory's exports whose translation costs far more than their
// bytes: a point of 40,000 attributes and the histogram point of 20,000
// bounds and 2,000 attributes are refused 400 before decoding; one of
// 20,000 bounds and 30 attributes, whose translation passes the in-flight
// bound, 413. Each at once. An export with a wrong password is a 401
// google.rpc.Status.
func (r *abuseRun) otlpBombs() {
	now := time.Now()
	bombs := []struct {
		name string
		body []byte
		want int
	}{
		{"point of 40,000 attributes", abuse.OTLPAttributeFlood(40_000, now), http.StatusBadRequest},
		{"histogram of 20,000 bounds, 2,000 attributes", abuse.OTLPHistogram(20_000, 2_000, now), http.StatusBadRequest},
		{"histogram of 20,000 bounds, 30 attributes", abuse.OTLPHistogram(20_000, 30, now), http.StatusRequestEntityTooLarge},
	}
	answers := map[string]map[int]int{}
	var worst time.Duration
	for _, b := range bombs {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		start := time.Now()
		code, body, err := abuse.PostOTLP(ctx, r.base+"/otlp/v1/metrics", b.body, r.evil)
		took := time.Since(start)
		cancel()
		worst = max(worst, took)
		if answers[b.name] == nil {
			answers[b.name] = map[int]int{}
		}
		answers[b.name][code]++
		// 503 while other bodies hold the in-flight bound (the export's
		// own bytes are held before its shape is judged).
		if err != nil || (code != b.want && code != http.StatusServiceUnavailable) || took > 5*time.Second {
			r.problem("OTLP %s (%d bytes): %d after %s (%v), want %d at once: %.200s", b.name, len(b.body), code, took, err, b.want, body)
		}
	}
	wrong := http.Header{"Authorization": {"Basic " + base64.StdEncoding.EncodeToString([]byte(tenantUser+":wrong"))}}
	code, body, err := abuse.PostOTLP(context.Background(), r.base+"/otlp/v1/metrics", abuse.OTLPAttributeFlood(1, now), wrong)
	var st statuspb.Status
	if err != nil || code != http.StatusUnauthorized || proto.Unmarshal(body, &st) != nil || st.Code != 16 {
		r.problem("OTLP export with a wrong password: %d (%v) %q, want a 401 google.rpc.Status", code, err, body)
	}
	r.count("OTLP bombs", func() {
		for name, by := range answers {
			if r.otlp[name] == nil {
				r.otlp[name] = map[int]int{}
			}
			for c, n := range by {
				r.otlp[name][c] += n
			}
		}
		r.otlpWorst = max(r.otlpWorst, worst)
	})
}

// metadataFlood: mallory's metadata-only remote writes, two of ~512 KiB
// (~5,600 families) of new families each round: the first passes
// max_metadata_families and is answered 400 with the rest stored, the later
// ones 400 (or 503 while other bodies hold the in-flight bound).
func (r *abuseRun) metadataFlood(round int) {
	answers := map[int]int{}
	for k := range 2 {
		code, err := postWrite(r.base, r.evil, abuse.MetadataOnly(fmt.Sprintf("flood_%d_%d_", round, k), 512<<10))
		if err != nil || (code != http.StatusBadRequest && code != http.StatusNoContent && code != http.StatusServiceUnavailable) {
			r.problem("metadata-only write: %d (%v), want 400 past max_metadata_families", code, err)
		}
		answers[code]++
	}
	r.count("metadata flood", func() {
		for c, n := range answers {
			r.metadata[c] += n
		}
	})
}

// trickledBodies: mallory's remote writes and OTLP exports that trickle in
// a byte a second (under the stall timeout), twice as many of each as she
// has write slots: meanwhile her own writes go through, and every trickled
// body is cut within the stall timeout and a few seconds.
func (r *abuseRun) trickledBodies() {
	type trickle struct{ cut func() int }
	var ts []trickle
	var closers []func()
	defer func() {
		for _, c := range closers {
			c()
		}
	}()
	for _, path := range []string{"/api/v1/write", "/otlp/v1/metrics"} {
		hdr := r.evil.Clone()
		if path != "/api/v1/write" {
			hdr.Set("Content-Type", "application/x-protobuf")
		}
		cut, closeAll, err := abuse.TrickledBodies(r.addr, nil, path, 2*abuseWriteSlots, hdr, time.Second)
		if err != nil {
			r.problem("trickled bodies to %s: %v", path, err)
			return
		}
		ts = append(ts, trickle{cut})
		closers = append(closers, closeAll)
	}
	time.Sleep(500 * time.Millisecond)
	start := time.Now()
	for {
		code, err := postWrite(r.base, r.evil, dcgmSample(time.Now().UnixMilli()))
		if code == http.StatusNoContent {
			break
		}
		if time.Since(start) > 3*time.Second {
			r.problem("mallory's write while her bodies trickle in: %d (%v) for %s", code, err, time.Since(start))
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, tr := range ts {
		for tr.cut() < 2*abuseWriteSlots {
			if time.Since(start) > abuseStallTimeout+5*time.Second {
				r.problem("%d of %d trickled bodies cut %s after they began", tr.cut(), 2*abuseWriteSlots, time.Since(start))
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	r.count("trickled bodies", func() { r.trickled += 4 * abuseWriteSlots })
}

// repeat runs each workload in a loop of its own until ctx ends; a round
// under way finishes.
func (r *abuseRun) repeat(ctx context.Context) {
	var wg sync.WaitGroup
	loop := func(round func(i int)) {
		wg.Go(func() {
			for i := 1; ctx.Err() == nil; i++ {
				round(i)
			}
		})
	}
	loop(func(int) { r.abandonedReads(); time.Sleep(100 * time.Millisecond) })
	loop(func(int) { r.parseBombs() })
	loop(r.tenantFlood)
	loop(func(int) { r.slowBodies() })
	loop(func(int) { r.passwordFlood(3*time.Second, false) })
	loop(func(int) { r.otlpBombs(); time.Sleep(500 * time.Millisecond) })
	loop(func(i int) { r.metadataFlood(i); time.Sleep(500 * time.Millisecond) })
	loop(func(int) { r.trickledBodies() })
	wg.Wait()
}

func (r *abuseRun) summary() string {
	r.mtx.Lock()
	defer r.mtx.Unlock()
	return fmt.Sprintf("rounds %v; remote reads abandoned %d; parse bombs %d (slowest answer %s); slow bodies %d; trickled bodies %d; tenant flood answers %v; password guesses answers %v (grafana's first request during one: %s); OTLP bombs' answers %v (slowest %s); metadata-only writes' answers %v",
		r.rounds, r.reads, r.bombs, r.bombWorst.Round(time.Millisecond), r.stalled, r.trickled, r.flood, r.guesses, r.firstUser.Round(time.Millisecond),
		r.otlp, r.otlpWorst.Round(time.Millisecond), r.metadata)
}

// dcgmSample is a remote write 1.0 body of one dcgm-exporter sample at ts.
func dcgmSample(ts int64) []byte {
	raw, err := (&prompb.WriteRequest{Timeseries: []prompb.TimeSeries{{
		Labels: dcgmSoakSeries()[0], Samples: []prompb.Sample{{Timestamp: ts, Value: 42}},
	}}}).Marshal()
	if err != nil {
		panic(err) // a valid message
	}
	return snappy.Encode(nil, raw)
}

// getStatus GETs u with header (credentials) and returns the status.
func getStatus(u string, header http.Header) (int, error) {
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		return 0, err
	}
	maps.Copy(req.Header, header)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// metadataFamilies reads /api/v1/metadata as header's identity: the
// families it answers and the answer's size.
func metadataFamilies(base string, header http.Header) (int, int, error) {
	req, err := http.NewRequest(http.MethodGet, base+"/api/v1/metadata", nil)
	if err != nil {
		return 0, 0, err
	}
	maps.Copy(req.Header, header)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, 0, err
	}
	var r struct {
		Data map[string]json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return 0, len(b), fmt.Errorf("%s: %w", resp.Status, err)
	}
	return len(r.Data), len(b), nil
}

// postWrite sends a remote write 1.0 body with header (credentials).
func postWrite(base string, header http.Header, body []byte) (int, error) {
	req, err := http.NewRequest(http.MethodPost, base+"/api/v1/write", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	maps.Copy(req.Header, header)
	req.Header.Set("Content-Type", "application/x-protobuf")
	req.Header.Set("Content-Encoding", "snappy")
	req.Header.Set("X-Prometheus-Remote-Write-Version", "0.1.0")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// otherThan is the part of answers (by status) with none of codes.
func otherThan(answers map[int]int, codes ...int) map[int]int {
	out := maps.Clone(answers)
	for _, c := range codes {
		delete(out, c)
	}
	return out
}

// peaks records the highest reading of each resource while the abuse runs.
func watchPeaks(ctx context.Context, srv abuse.Server, peak map[string]float64, failures *atomic.Int64) {
	for ctx.Err() == nil {
		g, err := srv.Values(ctx, abuse.Resources...)
		if err != nil && ctx.Err() == nil {
			failures.Add(1)
		}
		for k, v := range g {
			peak[k] = max(peak[k], v)
		}
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// quietBaseline is the highest reading of each resource over a few seconds
// without abuse.
func quietBaseline(t *testing.T, srv abuse.Server) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for range 5 {
		g, err := srv.Values(context.Background(), abuse.Resources...)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range g {
			out[k] = max(out[k], v)
		}
		time.Sleep(500 * time.Millisecond)
	}
	return out
}

func resourcesTable(start, baseline, peak, after map[string]float64) string {
	var b strings.Builder
	for _, name := range abuse.Resources {
		unit, div := "", 1.0
		if strings.HasSuffix(name, "_bytes") {
			unit, div = " MiB", 1<<20
		}
		fmt.Fprintf(&b, "\n  %-30s start %8.1f  baseline %8.1f  peak %8.1f  after %8.1f  (slack %.0f)%s",
			name, start[name]/div, baseline[name]/div, peak[name]/div, after[name]/div, abuseSlack[name]/div, unit)
	}
	return b.String()
}

// TestSoakAbuse runs the abuse issues 30 and 38 found against one gpustore
// binary (web config with bcrypt users, a tenant map, its limits small
// enough to matter), all eight workloads at once and again for the soak's
// duration: remote reads abandoned by their clients, PromQL parse bombs on
// every route, a relay creating new tenants without end, a tenant's write
// bodies that stall in every write slot it has and more, its remote writes
// and OTLP exports that trickle in a byte a second, a flood of guesses at
// the legitimate sender's password (during the first of which a dashboard
// user makes its first request), OTLP exports of 40,000 attributes and of
// 20,000-bucket histograms, and metadata-only remote writes without end.
// Meanwhile a Prometheus remote-write client (Prometheus' own storage/remote
// code) writes dcgm-exporter series (MIG included) every second. Every
// batch of it must be acknowledged (at once, or after retries of 5xx), none
// dropped, and every acknowledged sample read back; /-/healthy answers
// throughout; each workload gets only the answers its bound gives; the
// tenant's metadata stays within its bound; and after the abuse the
// process's goroutines, open files, heap in use and resident memory are
// back within abuseSlack of the baseline within abuseSettleTime. The
// baseline is taken after one warm-up round, whose tenant flood fills
// max_tenants for good (tenants stay) and whose metadata fills
// max_metadata_families; the start figures, before it, are printed too.
func TestSoakAbuse(t *testing.T) {
	duration := abuseSoakDuration(t)
	p := startAbuseTarget(t)
	base := p.url()
	// The heap is read after a collection; the peak as it is.
	measure := abuse.Server{Base: base, Header: basicAuthHeader(opsUser), Collect: true}
	watch := abuse.Server{Base: base, Header: basicAuthHeader(opsUser)}
	r := &abuseRun{base: base, addr: p.addr, evil: basicAuthHeader(tenantUser), relay: basicAuthHeader(relayUser),
		rounds: map[string]int{}, flood: map[int]int{}, guesses: map[int]int{}, otlp: map[string]map[int]int{}, metadata: map[int]int{}}

	sender := newLegitSender(t, base, dcgmSoakSeries())
	stopSender := make(chan struct{})
	senderDone := make(chan struct{})
	go func() { defer close(senderDone); sender.run(stopSender) }()
	stopProbe := make(chan struct{})
	var probeFailures atomic.Int64
	probeDone := make(chan struct{})
	go func() {
		defer close(probeDone)
		for {
			select {
			case <-stopProbe:
				return
			case <-time.After(250 * time.Millisecond):
			}
			if err := statusOK(base + "/-/healthy"); err != nil {
				probeFailures.Add(1)
			}
		}
	}()
	// mallory's tenant has GPU data for the remote reads to stream.
	if code, err := postWrite(base, r.evil, dcgmSample(time.Now().UnixMilli())); code != http.StatusNoContent {
		t.Fatalf("mallory's write to lab: %d (%v)", code, err)
	}
	waitFor(t, 30*time.Second, "the sender's series", func() error {
		if n := sender.shardsAcked(); n < sender.shards {
			return fmt.Errorf("%d of %d shards acknowledged", n, sender.shards)
		}
		return nil
	})
	start := quietBaseline(t, measure)

	// Warm-up: one round of each workload. Its flood creates the tenants
	// max_tenants leaves room for; they stay.
	began := time.Now()
	r.abandonedReads()
	r.parseBombs()
	r.tenantFlood(0)
	r.slowBodies()
	r.passwordFlood(2*time.Second, true)
	r.otlpBombs()
	r.metadataFlood(0)
	r.trickledBodies()
	// The warm-up's connections and goroutines wind down before the
	// baseline is read (the resources settling: no event to wait for).
	time.Sleep(3 * time.Second)
	http.DefaultClient.CloseIdleConnections() // the workloads' connections are not the server's footprint
	baseline := quietBaseline(t, measure)
	saveHeapProfile(t, measure, "baseline")
	t.Logf("warm-up took %s: %s", time.Since(began).Round(time.Millisecond), r.summary())

	ctx, cancel := context.WithTimeout(context.Background(), duration)
	peak := maps.Clone(baseline)
	var watchFailures atomic.Int64
	watchDone := make(chan struct{})
	go func() { defer close(watchDone); watchPeaks(ctx, watch, peak, &watchFailures) }()
	r.repeat(ctx)
	cancel()
	<-watchDone
	abused := time.Since(began)
	http.DefaultClient.CloseIdleConnections()

	settleBegan := time.Now()
	after, settleErr := measure.SettlesTo(context.Background(), baseline, abuseSlack, abuseSettleTime)
	settled := time.Since(settleBegan)
	saveHeapProfile(t, measure, "after")
	close(stopSender)
	<-senderDone
	close(stopProbe)
	<-probeDone

	t.Logf("abuse for %s (warm-up included): %s", abused.Round(time.Second), r.summary())
	t.Logf("legitimate sender: %s", sender.summary())
	// A counter of labelled series has none until its bound is met once.
	bounds := map[string]float64{}
	for _, name := range abuseBoundCounters {
		if v, err := watch.Values(context.Background(), name); err == nil {
			bounds[name] = v[name]
		}
	}
	t.Logf("bounds met: %v", bounds)
	t.Logf("resources (baseline after the warm-up; settled in %s):%s", settled.Round(100*time.Millisecond), resourcesTable(start, baseline, peak, after))
	if settleErr != nil {
		t.Errorf("resources after the abuse: %v", settleErr)
	}
	if n := probeFailures.Load(); n > 0 {
		t.Errorf("/-/healthy failed %d times during the abuse", n)
	}
	if n := watchFailures.Load(); n > 0 {
		t.Errorf("/metrics failed %d times during the abuse", n)
	}
	if err := statusOK(base + "/-/ready"); err != nil {
		t.Errorf("/-/ready after the abuse: %v", err)
	}
	r.mtx.Lock()
	problems := slices.Clone(r.problems)
	flood, guesses := maps.Clone(r.flood), maps.Clone(r.guesses)
	r.mtx.Unlock()
	for _, pr := range problems {
		t.Error(pr)
	}
	// 503: the in-flight bound, while the other workloads' bodies hold it.
	if flood[http.StatusNoContent] != abuseMaxTenants-2 || flood[http.StatusTooManyRequests] == 0 || len(otherThan(flood, http.StatusNoContent, http.StatusTooManyRequests, http.StatusServiceUnavailable)) > 0 {
		t.Errorf("tenant flood answers: %v, want %d × 204 (max_tenants less gpu-prod and lab) and the rest 429 (or 503, the in-flight bound)", flood, abuseMaxTenants-2)
	}
	if guesses[http.StatusUnauthorized] == 0 || len(otherThan(guesses, http.StatusUnauthorized, http.StatusServiceUnavailable)) > 0 {
		t.Errorf("password flood answers: %v, want 401 (checked) and 503 (past the checks that may wait) only", guesses)
	}
	if n, size, err := metadataFamilies(base, r.evil); err != nil || n > abuseMetadataFamilies || size > 1<<20 {
		t.Errorf("lab's /api/v1/metadata: %d families in %d bytes (%v), want at most max_metadata_families (%d)", n, size, err, abuseMetadataFamilies)
	} else {
		t.Logf("lab's /api/v1/metadata: %d families in %d bytes", n, size)
	}
	sender.mtx.Lock()
	failed := slices.Clone(sender.failed)
	sender.mtx.Unlock()
	for i, f := range failed {
		if i == 5 {
			t.Errorf("and %d more batches dropped", len(failed)-5)
			break
		}
		t.Errorf("legitimate batch dropped: %s", f)
	}
	checked, lost, err := sender.verify(base, basicAuthHeader(legitUser))
	if err != nil {
		t.Error(err)
	}
	if lost > 0 || checked == 0 {
		t.Errorf("%d of %d acknowledged samples are not queryable", lost, checked)
	}
	t.Logf("acknowledged samples read back: %d of %d", checked-lost, checked)
}

// saveHeapProfile writes the server's heap profile to
// $GPUSTORE_ABUSE_PROFILES/heap-<name>.pb.gz when that is set: `go tool
// pprof -diff_base heap-baseline.pb.gz heap-after.pb.gz` shows what the
// abuse left behind.
func saveHeapProfile(t *testing.T, srv abuse.Server, name string) {
	dir := os.Getenv("GPUSTORE_ABUSE_PROFILES")
	if dir == "" {
		return
	}
	f, err := os.Create(filepath.Join(dir, "heap-"+name+".pb.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := srv.HeapProfile(context.Background(), f); err != nil {
		t.Error(err)
	}
}
