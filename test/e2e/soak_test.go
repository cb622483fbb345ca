package e2e

// Soak tests: the durability promises (an acknowledged write is durable; a
// bucket outage delays uploads but loses nothing) checked under continuous
// concurrent load, repeatedly. `make test` runs short versions; `make soak`
// (GPUSTORE_SOAK=long) runs them long and prints the figures.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/golang/snappy"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/prompb"
	"gopkg.in/yaml.v3"
)

// soakSettings are the short (make test) or long (make soak) parameters.
type soakSettings struct {
	long   bool
	series int // simulated GPU series, split over shards
	shards int // concurrent writers, like Prometheus' remote-write shards
	// pace is the real time one round (one simulated minute of samples from
	// every shard) takes at least: the load's rate.
	pace  time.Duration
	kills int // kill -9 and restarts in the kill test
	// outages of soakOutageMinutes simulated minutes in the outage test.
	outages int
}

func soakConfig() soakSettings {
	if os.Getenv("GPUSTORE_SOAK") == "long" {
		return soakSettings{long: true, series: 2048, shards: 8, pace: 250 * time.Millisecond, kills: 20, outages: 3}
	}
	return soakSettings{series: 512, shards: 4, pace: 200 * time.Millisecond, kills: 6, outages: 1}
}

const (
	soakStep          = 15_000 // ms between a series' samples
	soakRoundMs       = 60_000 // one round: a simulated minute
	soakBlock         = "5m"   // head block duration: head compactions every few seconds of load
	soakOutageMinutes = 30
)

var soakMetrics = []string{"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL",
	"DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_XID_ERRORS"}

// soakLoad writes a simulated cluster with several concurrent shards and
// records, per shard and round, what was sent and what was acknowledged.
// Values encode series and time, so any sample read back can be checked.
// Like Prometheus, a request answered 5xx or 429, or cut by a connection
// error, is retried until acknowledged; any other 4xx fails the test
// (the data would be dropped).
type soakLoad struct {
	t      *testing.T
	cfg    soakSettings
	url    string // base URL; fixed across restarts
	start  int64  // first sample timestamp (ms)
	series [][]prompb.Label
	byKey  map[string]int // label set -> series index

	mtx    sync.Mutex
	acked  [][]bool // [shard][round]
	sent   []int    // per shard: rounds sent at least once (acknowledged or not)
	rounds int      // rounds completed by every shard

	samplesAcked atomic.Int64
	oooRetries   atomic.Int64 // retries answered 400 out_of_order (see writeRound)
	requests     atomic.Int64
	retries      atomic.Int64
	codes        sync.Map // int -> *atomic.Int64
}

func newSoakLoad(t *testing.T, cfg soakSettings, url string, start int64) *soakLoad {
	l := &soakLoad{t: t, cfg: cfg, url: url, start: start, byKey: map[string]int{},
		acked: make([][]bool, cfg.shards), sent: make([]int, cfg.shards)}
	for i := range cfg.series {
		gpu := i / len(soakMetrics)
		ls := []prompb.Label{
			{Name: "__name__", Value: soakMetrics[i%len(soakMetrics)]},
			{Name: "Hostname", Value: fmt.Sprintf("node-%03d", gpu/8)},
			{Name: "UUID", Value: fmt.Sprintf("GPU-%03d-%d", gpu/8, gpu%8)},
			{Name: "gpu", Value: fmt.Sprint(gpu % 8)},
		}
		l.series = append(l.series, ls)
		l.byKey[soakKey(ls)] = i
	}
	return l
}

func soakKey(ls []prompb.Label) string {
	var b strings.Builder
	for _, l := range ls {
		b.WriteString(l.Name + "=" + l.Value + ",")
	}
	return b.String()
}

// soakValue is an integer below 2^53: exact through JSON.
func soakValue(series int, ts int64) float64 { return float64(int64(series)*10_000_000_000 + ts/1000) }

func (l *soakLoad) shardOf(series int) int { return series % l.cfg.shards }

// run writes rounds until ctx ends or the round would pass stop (sample time).
func (l *soakLoad) run(ctx context.Context, stop int64) {
	for r := 0; ctx.Err() == nil; r++ {
		if l.start+int64(r+1)*soakRoundMs > stop {
			return
		}
		began := time.Now()
		var wg sync.WaitGroup
		for sh := range l.cfg.shards {
			wg.Go(func() { l.writeRound(ctx, sh, r) })
		}
		wg.Wait()
		if ctx.Err() != nil {
			return
		}
		l.mtx.Lock()
		l.rounds = r + 1
		l.mtx.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(l.cfg.pace - time.Since(began)):
		}
	}
}

func (l *soakLoad) writeRound(ctx context.Context, sh, r int) {
	req := &prompb.WriteRequest{}
	samples := 0
	from := l.start + int64(r)*soakRoundMs
	for i, ls := range l.series {
		if l.shardOf(i) != sh {
			continue
		}
		ts := prompb.TimeSeries{Labels: ls}
		for t := from; t < from+soakRoundMs; t += soakStep {
			ts.Samples = append(ts.Samples, prompb.Sample{Timestamp: t, Value: soakValue(i, t)})
		}
		samples += len(ts.Samples)
		req.Timeseries = append(req.Timeseries, ts)
	}
	raw, err := req.Marshal()
	if err != nil {
		l.t.Error(err)
		return
	}
	body := snappy.Encode(nil, raw)
	l.mtx.Lock()
	l.sent[sh] = r + 1
	l.acked[sh] = append(l.acked[sh], false)
	l.mtx.Unlock()
	for attempt := 0; ctx.Err() == nil; attempt++ {
		if attempt > 0 {
			l.retries.Add(1)
			select {
			case <-ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
		code, msg, err := l.post(ctx, body)
		l.requests.Add(1)
		if err != nil {
			continue // killed or restarting: retry, as Prometheus does
		}
		c, _ := l.codes.LoadOrStore(code, new(atomic.Int64))
		c.(*atomic.Int64).Add(1)
		switch {
		case code/100 == 2:
			l.mtx.Lock()
			l.acked[sh][r] = true
			l.mtx.Unlock()
			l.samplesAcked.Add(int64(samples))
			return
		case code >= 500 || code == http.StatusTooManyRequests:
			continue
		case code == http.StatusBadRequest && attempt > 0 && strings.Contains(msg, "out_of_order"):
			// A retry of a request committed before a kill: the TSDB
			// recognises only a repeat of a series' newest sample, so the
			// earlier ones are out of order. Prometheus drops the batch;
			// that loses nothing only if the first attempt stored it all,
			// so its samples are checked as if acknowledged.
			l.mtx.Lock()
			l.acked[sh][r] = true
			l.mtx.Unlock()
			l.oooRetries.Add(1)
			return
		default:
			l.t.Errorf("shard %d round %d answered %d (%s): a 4xx drops the data", sh, r, code, msg)
			return
		}
	}
}

func (l *soakLoad) post(ctx context.Context, body []byte) (int, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, l.url+"/api/v1/write", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/x-protobuf")
	req.Header.Set("Content-Encoding", "snappy")
	req.Header.Set("X-Prometheus-Remote-Write-Version", "0.1.0")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	return resp.StatusCode, string(b), nil
}

func (l *soakLoad) codesString() string {
	var parts []string
	l.codes.Range(func(k, v any) bool {
		parts = append(parts, fmt.Sprintf("%d:%d", k, v.(*atomic.Int64).Load()))
		return true
	})
	slices.Sort(parts)
	return strings.Join(parts, " ")
}

// verify reads every sample back through the query API (head, local blocks
// and bucket store alike) and returns the acknowledged samples missing. Any
// sample of an unknown series, off the grid, from a round never sent, or
// with another value than sent is an error.
func (l *soakLoad) verify(url string) (lost int64, err error) {
	l.mtx.Lock()
	acked := make([][]bool, len(l.acked))
	for i := range l.acked {
		acked[i] = slices.Clone(l.acked[i])
	}
	sent := slices.Clone(l.sent)
	l.mtx.Unlock()
	maxRound := slices.Max(sent)
	end := l.start + int64(maxRound)*soakRoundMs - 1
	seen := make([]map[int64]bool, len(l.series))
	for i := range seen {
		seen[i] = map[int64]bool{}
	}
	var errs []error
	for _, m := range soakMetrics {
		got, qerr := soakRaw(url, m, l.start, end)
		if qerr != nil {
			return 0, qerr
		}
		for _, s := range got {
			var ls []prompb.Label
			for _, name := range []string{"__name__", "Hostname", "UUID", "gpu"} {
				ls = append(ls, prompb.Label{Name: name, Value: string(s.Metric[model.LabelName(name)])})
			}
			idx, ok := l.byKey[soakKey(ls)]
			if !ok || len(s.Metric) != 4 {
				errs = append(errs, fmt.Errorf("series %v was never sent", s.Metric))
				continue
			}
			for _, p := range s.Values {
				ts := int64(p.Timestamp)
				r := int((ts - l.start) / soakRoundMs)
				switch {
				case ts < l.start || (ts-l.start)%soakStep != 0 || r >= sent[l.shardOf(idx)]:
					errs = append(errs, fmt.Errorf("%v: sample at %d was never sent", s.Metric, ts))
				case float64(p.Value) != soakValue(idx, ts):
					errs = append(errs, fmt.Errorf("%v: sample at %d is %v, sent %v", s.Metric, ts, p.Value, soakValue(idx, ts)))
				case seen[idx][ts]:
					errs = append(errs, fmt.Errorf("%v: sample at %d returned twice", s.Metric, ts))
				}
				seen[idx][ts] = true
			}
		}
	}
	for idx := range l.series {
		for r, ok := range acked[l.shardOf(idx)] {
			if !ok {
				continue
			}
			for ts := l.start + int64(r)*soakRoundMs; ts < l.start+int64(r+1)*soakRoundMs; ts += soakStep {
				if !seen[idx][ts] {
					lost++
				}
			}
		}
	}
	if len(errs) > 5 {
		errs = append(errs[:5], fmt.Errorf("and %d more", len(errs)-5))
	}
	return lost, errors.Join(errs...)
}

// soakRaw returns every raw sample of metric in [from, to]: no query-time
// deduplication, raw resolution.
func soakRaw(base, metric string, from, to int64) (model.Matrix, error) {
	return queryMatrix(base, nil, fmt.Sprintf("%s[%dms]", metric, to-from+1), to)
}

// soakProc runs the gpustore binary on a fixed address and data directory,
// so the load's URL stays valid across kills.
type soakProc struct {
	t    *testing.T
	bin  string
	dir  string
	addr string
	args []string
	cmd  *exec.Cmd
	log  *bytes.Buffer
}

func (p *soakProc) start() time.Duration {
	p.t.Helper()
	p.log = &bytes.Buffer{}
	args := append([]string{"-storage.tsdb.path=" + p.dir, "-web.listen-address=" + p.addr, "-log.level=warn"}, p.args...)
	began := time.Now()
	p.cmd = exec.Command(p.bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	for {
		resp, err := http.Get("http://" + p.addr + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return time.Since(began)
			}
		}
		if time.Since(began) > 2*time.Minute {
			p.t.Fatalf("gpustore not ready after 2m: %v\n%s", err, p.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *soakProc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	_ = p.cmd.Wait()
}

func (p *soakProc) url() string { return "http://" + p.addr }

// metric sums every series of a metric on /metrics.
func (p *soakProc) metric(name string) (float64, error) {
	resp, err := http.Get(p.url() + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, m := range fams[name].GetMetric() {
		sum += m.GetGauge().GetValue() + m.GetCounter().GetValue()
	}
	return sum, nil
}

func dirSize(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// headCompacting says whether the TSDB is writing a block (Prometheus'
// compactor writes into <ulid>.tmp-for-creation and renames it when done).
func headCompacting(tenantDir string) bool {
	es, _ := os.ReadDir(tenantDir)
	for _, e := range es {
		if strings.HasSuffix(e.Name(), ".tmp-for-creation") {
			return true
		}
	}
	return false
}

// uploading says whether a block is partly in the bucket: its directory
// exists in versitygw's backend but meta.json (uploaded last) does not.
func uploading(bucketTenantDir string, done map[string]bool) bool {
	es, _ := os.ReadDir(bucketTenantDir)
	for _, e := range es {
		if !e.IsDir() || done[e.Name()] || len(e.Name()) != 26 {
			continue
		}
		if _, err := os.Stat(filepath.Join(bucketTenantDir, e.Name(), "meta.json")); err == nil {
			done[e.Name()] = true
			continue
		}
		return true
	}
	return false
}

func soakObjstoreFile(t *testing.T, s3 *objectStore) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "objstore.yml")
	raw, err := yaml.Marshal(map[string]any{"type": "S3", "config": s3.bucketConfig().Config})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// soakArgs: minute-scale blocks shipped fast. The load replays the last day
// faster than real time, so the GPU rule pack is off: its rules would write
// their results at the current time into the same tenant, and the head then
// refuses the replayed samples as too old (as Prometheus' head would).
func soakArgs(objstore string) []string {
	return []string{"-rules.gpu-pack=false", "-objstore.config-file=" + objstore, "-storage.tsdb.block-duration=" + soakBlock, "-storage.tsdb.retention.time=" + soakBlock,
		"-shipper.interval=200ms", "-shipper.min-backoff=100ms", "-shipper.max-backoff=1s", "-bucket-store.sync-interval=1s"}
}

// TestSoakKill9UnderLoad: concurrent shards write a simulated cluster without
// pause while gpustore (the binary, shipping minute-scale blocks to a real
// S3 server) is killed with SIGKILL again and again: at random moments,
// while the TSDB writes a block from the head, and while the shipper uploads
// one. After each restart the load goes on where it stood, retrying what was
// not acknowledged. At the end every acknowledged sample is queryable with
// its value, and nothing appears that was not sent.
func TestSoakKill9UnderLoad(t *testing.T) {
	cfg := soakConfig()
	s3 := startS3(t)
	p := &soakProc{t: t, bin: buildGpustore(t), dir: t.TempDir(), addr: freePort(t), args: soakArgs(soakObjstoreFile(t, s3))}
	t.Cleanup(func() {
		if p.cmd != nil && p.cmd.ProcessState == nil {
			p.kill()
		}
		if t.Failed() {
			t.Logf("gpustore log (last run):\n%.8000s", p.log.String())
		}
	})
	emptyStart := p.start() // the fixed cost of a start, without WAL

	now := time.Now().UnixMilli() / soakRoundMs * soakRoundMs
	start := now - 24*time.Hour.Milliseconds()
	load := newSoakLoad(t, cfg, p.url(), start)
	ctx, cancel := context.WithCancel(context.Background())
	loadDone := make(chan struct{})
	go func() { defer close(loadDone); load.run(ctx, now) }()

	tenantDir := filepath.Join(p.dir, "tenants", "default")
	bucketDir := filepath.Join(s3.dir, "data", s3Bucket, "default")
	uploaded := map[string]bool{}
	var (
		restarts            []time.Duration
		walBytes            []int64
		inCompaction, inUpl int
		targeted            = [3]int{}
	)
	for k := range cfg.kills {
		time.Sleep(time.Duration(500+rand.IntN(1500)) * time.Millisecond)
		// Every third kill waits for a head compaction, every third for an
		// upload in progress (up to 10s, then it kills anyway).
		mode := k % 3
		deadline := time.Now().Add(10 * time.Second)
		for mode != 0 && time.Now().Before(deadline) {
			if (mode == 1 && headCompacting(tenantDir)) || (mode == 2 && uploading(bucketDir, uploaded)) {
				targeted[mode]++
				break
			}
			time.Sleep(200 * time.Microsecond)
		}
		p.kill()
		if headCompacting(tenantDir) {
			inCompaction++
		}
		if uploading(bucketDir, uploaded) {
			inUpl++
		}
		wal := dirSize(filepath.Join(tenantDir, "wal"))
		d := p.start()
		restarts = append(restarts, d)
		walBytes = append(walBytes, wal)
	}
	time.Sleep(time.Second) // some load after the last restart
	cancel()
	<-loadDone
	if t.Failed() {
		return
	}

	// Everything acknowledged is there; once the shipper has caught up it is
	// also there through the bucket (local blocks past retention are gone).
	var lost int64
	var verr error
	waitFor(t, 2*time.Minute, "every acknowledged sample queryable", func() error {
		lost, verr = load.verify(p.url())
		if verr != nil {
			return nil // not a matter of waiting
		}
		if lost > 0 {
			return fmt.Errorf("%d acknowledged samples missing", lost)
		}
		return nil
	})
	if verr != nil {
		t.Fatal(verr)
	}
	var restartSum time.Duration
	var walSum int64
	for i := range restarts {
		restartSum += restarts[i]
		walSum += walBytes[i]
	}
	// The WAL here stays small (blocks are cut every few seconds); the
	// replay rate per GiB is measured by TestSoakWALReplay.
	t.Logf("kills survived %d (found mid head compaction %d, mid upload %d; targeted hits %d/%d), samples acknowledged %d, lost %d, "+
		"rounds %d, requests %d (retries %d, of which answered 400 out_of_order as already stored %d; answers %s), start on an empty directory %s, restart mean %s (max %s), WAL at kill mean %.1f MiB",
		len(restarts), inCompaction, inUpl, targeted[1], targeted[2], load.samplesAcked.Load(), lost, load.rounds, load.requests.Load(),
		load.retries.Load(), load.oooRetries.Load(), load.codesString(), emptyStart.Round(time.Millisecond), (restartSum / time.Duration(len(restarts))).Round(time.Millisecond),
		slices.Max(restarts).Round(time.Millisecond), float64(walSum)/float64(len(walBytes))/(1<<20))
	if load.samplesAcked.Load() == 0 {
		t.Fatal("nothing acknowledged: the load did not run")
	}
}

// TestSoakBucketOutageUnderLoad: the S3 server is killed for 30 minutes of
// simulated time while the load goes on. Ingest continues (every write is
// acknowledged), the shipper's backlog grows and is reported on /metrics,
// and once S3 is back every block is uploaded: the local blocks go, and
// every acknowledged sample is read back, now from the bucket.
func TestSoakBucketOutageUnderLoad(t *testing.T) {
	cfg := soakConfig()
	s3 := startS3(t)
	p := &soakProc{t: t, bin: buildGpustore(t), dir: t.TempDir(), addr: freePort(t), args: soakArgs(soakObjstoreFile(t, s3))}
	t.Cleanup(func() {
		if p.cmd != nil && p.cmd.ProcessState == nil {
			p.kill()
		}
		if t.Failed() {
			t.Logf("gpustore log:\n%.8000s", p.log.String())
		}
	})
	p.start()

	now := time.Now().UnixMilli() / soakRoundMs * soakRoundMs
	start := now - 24*time.Hour.Milliseconds()
	load := newSoakLoad(t, cfg, p.url(), start)
	ctx, cancel := context.WithCancel(context.Background())
	loadDone := make(chan struct{})
	go func() { defer close(loadDone); load.run(ctx, now) }()
	rounds := func() int {
		load.mtx.Lock()
		defer load.mtx.Unlock()
		return load.rounds
	}
	waitRounds := func(n int) {
		t.Helper()
		waitFor(t, 5*time.Minute, fmt.Sprintf("%d rounds of load", n), func() error {
			if r := rounds(); r < n {
				return fmt.Errorf("%d rounds", r)
			}
			return nil
		})
	}
	blockMin := 5
	waitRounds(3 * blockMin)
	var maxPending, maxAge float64
	for o := range cfg.outages {
		s3.stop()
		failuresBefore, _ := p.metric("gpustore_shipper_upload_failures_total")
		outageStart := rounds()
		for began := time.Now(); rounds() < outageStart+soakOutageMinutes; {
			if time.Since(began) > 5*time.Minute {
				t.Fatalf("outage %d: ingest stalled at round %d without S3", o, rounds())
			}
			if pend, err := p.metric("gpustore_shipper_pending_blocks"); err == nil {
				maxPending = max(maxPending, pend)
			}
			if age, err := p.metric("gpustore_shipper_oldest_pending_block_age_seconds"); err == nil {
				maxAge = max(maxAge, age)
			}
			time.Sleep(100 * time.Millisecond)
		}
		// 30 simulated minutes cut about six 5m blocks; the newest may still
		// be in the head, and on a busy machine the head may cut them a
		// little after the load wrote them (the load goes on meanwhile).
		waitFor(t, 30*time.Second, fmt.Sprintf("outage %d: the backlog reported", o), func() error {
			if pend, err := p.metric("gpustore_shipper_pending_blocks"); err != nil || pend < float64(soakOutageMinutes/blockMin-2) {
				return fmt.Errorf("%v blocks pending after %d simulated minutes without S3 (%v)", pend, soakOutageMinutes, err)
			}
			return nil
		})
		failures, _ := p.metric("gpustore_shipper_upload_failures_total")
		if failures <= failuresBefore {
			t.Errorf("outage %d: no upload failure reported (%v)", o, failures)
		}
		s3.start()
		waitFor(t, 2*time.Minute, "backlog uploaded", func() error {
			if pend, err := p.metric("gpustore_shipper_pending_blocks"); err != nil || pend > 0 {
				return fmt.Errorf("%v pending (%v)", pend, err)
			}
			return nil
		})
		waitRounds(rounds() + 2*blockMin)
	}
	cancel()
	<-loadDone
	if t.Failed() {
		return
	}
	// Every block but the head's newest is in the bucket; local ones past
	// retention are gone, so old samples are read from the bucket.
	var lost int64
	var verr error
	waitFor(t, 2*time.Minute, "every acknowledged sample queryable and local blocks shipped and dropped", func() error {
		if pend, err := p.metric("gpustore_shipper_pending_blocks"); err != nil || pend > 0 {
			return fmt.Errorf("%v pending (%v)", pend, err)
		}
		lost, verr = load.verify(p.url())
		if verr != nil {
			return nil
		}
		if lost > 0 {
			return fmt.Errorf("%d acknowledged samples missing", lost)
		}
		return nil
	})
	if verr != nil {
		t.Fatal(verr)
	}
	es, _ := os.ReadDir(filepath.Join(p.dir, "tenants", "default"))
	local := 0
	for _, e := range es {
		if e.IsDir() && len(e.Name()) == 26 {
			local++
		}
	}
	if local > 3 {
		t.Errorf("%d local blocks left after the backlog was uploaded", local)
	}
	// Ingest never depended on the bucket: no write failed.
	if c, ok := load.codes.Load(http.StatusInternalServerError); ok {
		t.Errorf("%d writes answered 500 during the load", c.(*atomic.Int64).Load())
	}
	t.Logf("outages %d of %d simulated minutes, samples acknowledged %d, lost %d, backlog max %v blocks (oldest %.0f s), rounds %d, requests %d (retries %d, answers %s)",
		cfg.outages, soakOutageMinutes, load.samplesAcked.Load(), lost, maxPending, maxAge, load.rounds, load.requests.Load(), load.retries.Load(), load.codesString())
}

// TestSoakWALReplay measures what a restart after kill -9 costs per GiB of
// WAL, on a WAL large enough to dominate the start (the kill test's WAL
// stays small: its blocks are cut every few seconds). The load fills a head
// of 2h blocks (nothing is cut, every sample stays in the WAL), gpustore is
// killed, and the restart is timed against a start on an empty directory;
// every acknowledged sample must be back.
func TestSoakWALReplay(t *testing.T) {
	cfg := soakConfig()
	cfg.pace, cfg.shards, cfg.series = 0, 8, 2048
	rounds := 60
	if cfg.long {
		cfg.series, rounds = 32768, 110
	}
	p := &soakProc{t: t, bin: buildGpustore(t), dir: t.TempDir(), addr: freePort(t),
		args: []string{"-rules.gpu-pack=false", "-shipper.enabled=false", "-storage.tsdb.block-duration=2h", "-storage.tsdb.retention.time=2h"}}
	t.Cleanup(func() {
		if p.cmd != nil && p.cmd.ProcessState == nil {
			p.kill()
		}
		if t.Failed() {
			t.Logf("gpustore log:\n%.8000s", p.log.String())
		}
	})
	emptyStart := p.start()
	now := time.Now().UnixMilli() / soakRoundMs * soakRoundMs
	start := now - int64(rounds+5)*soakRoundMs
	load := newSoakLoad(t, cfg, p.url(), start)
	began := time.Now()
	load.run(context.Background(), start+int64(rounds)*soakRoundMs)
	writeTime := time.Since(began)
	if t.Failed() {
		return
	}
	p.kill()
	tenantDir := filepath.Join(p.dir, "tenants", "default")
	if headCompacting(tenantDir) {
		t.Fatal("a block was being cut: the head must hold everything")
	}
	wal := dirSize(filepath.Join(tenantDir, "wal"))
	restart := p.start()
	lost, err := load.verify(p.url())
	if err != nil {
		t.Fatal(err)
	}
	if lost > 0 {
		t.Fatalf("%d acknowledged samples lost across kill -9", lost)
	}
	perGiB := (restart - emptyStart).Seconds() / (float64(wal) / (1 << 30))
	t.Logf("WAL replay: %d samples of %d series acknowledged in %s, WAL %.1f MiB, restart %s (empty start %s): %.1f s per GiB of WAL, lost %d",
		load.samplesAcked.Load(), cfg.series, writeTime.Round(time.Millisecond), float64(wal)/(1<<20), restart.Round(time.Millisecond),
		emptyStart.Round(time.Millisecond), perGiB, lost)
}
