package load

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpustore/gpustore/bench/gpusim"
)

// DriverConfig configures a write run.
type DriverConfig struct {
	// URL is the remote-write endpoint (http://127.0.0.1:9201/api/v1/write).
	URL      string
	Protocol gpusim.Protocol // must match the source's encoding; default 1.0
	Tenant   string          // X-Scope-OrgID when set
	// Rate is the target in samples/s; 0 sends as fast as the receiver
	// answers (one request in flight per shard).
	Rate float64
	// MaxSkew bounds how far (in sample time) one shard may run ahead of the
	// slowest: Prometheus' TSDB head rejects samples more than an hour older
	// than the newest it holds, so shards must advance together (default 10m).
	MaxSkew time.Duration
	// Timeout is the per-request timeout (default 30s).
	Timeout time.Duration
	// MaxRetries of one request on 5xx, 429 or a network error before it is
	// given up and its samples counted as failed (default 10).
	MaxRetries             int
	MinBackoff, MaxBackoff time.Duration // 30ms, 5s
	// Progress is how often progress is logged (default 10s; <0 never).
	Progress time.Duration
	Logger   *slog.Logger
	// PID, when set, is the receiver's process: progress lines show its CPU
	// use and RSS.
	PID    int
	Client *http.Client
}

// Result is what a write run measured.
type Result struct {
	Start time.Time
	Wall  time.Duration
	// Samples were acknowledged with a 2xx (for 2.0: as many as the
	// X-Prometheus-Remote-Write-Samples-Written header says).
	Samples int64
	// Rejected samples were in requests answered with a non-retryable 4xx
	// (or, for 2.0, acknowledged but not written); Failed ones in requests
	// given up after MaxRetries.
	Rejected, Failed int64
	Requests         int64 // HTTP attempts, retries included
	Retries          int64
	Bytes            int64 // request bodies acknowledged
	Codes            map[int]int64
	// Latency of every attempt that got an HTTP answer.
	Latency    LatencySummary
	FirstError string
}

// Rate is accepted samples per second of wall time.
func (r Result) Rate() float64 {
	if r.Wall <= 0 {
		return 0
	}
	return float64(r.Samples) / r.Wall.Seconds()
}

func (r Result) String() string {
	s := fmt.Sprintf("accepted %d samples in %s (%.0f samples/s), %d requests, %d retries, rejected %d, failed %d, codes %s, latency %s",
		r.Samples, r.Wall.Round(time.Millisecond), r.Rate(), r.Requests, r.Retries, r.Rejected, r.Failed, FormatCodes(r.Codes), r.Latency)
	if r.FirstError != "" {
		s += ", first error: " + r.FirstError
	}
	return s
}

type driver struct {
	cfg     DriverConfig
	src     Source
	lat     Latencies
	codes   Codes
	samples atomic.Int64
	sent    atomic.Int64 // samples handed to the pacer
	rej     atomic.Int64
	failed  atomic.Int64
	reqs    atomic.Int64
	retries atomic.Int64
	bytes   atomic.Int64
	start   time.Time

	errOnce  sync.Once
	firstErr string

	// Shard positions (MinT of the request a shard is sending or about to
	// send; MaxInt64 when done) for the skew bound.
	mu  sync.Mutex
	cv  *sync.Cond
	pos []int64
}

// Run sends everything src produces to cfg.URL and measures it. It returns
// when every shard is done or ctx ends (then with ctx's error and the partial
// result).
func Run(ctx context.Context, cfg DriverConfig, src Source) (Result, error) {
	if cfg.URL == "" {
		return Result{}, errors.New("driver: URL is required")
	}
	if cfg.Protocol == "" {
		cfg.Protocol = gpusim.ProtocolV1
	}
	if cfg.MaxSkew <= 0 {
		cfg.MaxSkew = 10 * time.Minute
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.MaxRetries == 0 {
		cfg.MaxRetries = 10
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 30 * time.Millisecond
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 5 * time.Second
	}
	if cfg.Progress == 0 {
		cfg.Progress = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Client == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = src.NumShards() + 2
		cfg.Client = &http.Client{Transport: tr}
	}
	d := &driver{cfg: cfg, src: src, pos: make([]int64, src.NumShards())}
	d.cv = sync.NewCond(&d.mu)
	for i := range d.pos {
		d.pos[i] = math.MinInt64 // unknown until the shard's first request
	}
	d.start = time.Now()

	stopProgress := make(chan struct{})
	progressDone := make(chan struct{})
	go d.progress(stopProgress, progressDone)

	var wg sync.WaitGroup
	for sh := 0; sh < src.NumShards(); sh++ {
		wg.Add(1)
		go func(sh int) {
			defer wg.Done()
			d.shard(ctx, sh)
		}(sh)
	}
	// A context cancelled while shards wait on the skew bound must wake them.
	stopWake := context.AfterFunc(ctx, func() {
		d.mu.Lock()
		d.cv.Broadcast()
		d.mu.Unlock()
	})
	wg.Wait()
	stopWake()
	close(stopProgress)
	<-progressDone

	res := Result{
		Start: d.start, Wall: time.Since(d.start), Samples: d.samples.Load(), Rejected: d.rej.Load(),
		Failed: d.failed.Load(), Requests: d.reqs.Load(), Retries: d.retries.Load(), Bytes: d.bytes.Load(),
		Codes: d.codes.Snapshot(), Latency: d.lat.Summary(), FirstError: d.firstErr,
	}
	return res, ctx.Err()
}

func (d *driver) shard(ctx context.Context, sh int) {
	defer d.setPos(sh, math.MaxInt64)
	for ctx.Err() == nil {
		// A shard waiting for a streamed source to produce its next request
		// is not behind anyone: it must not hold the others back (the
		// generator may be blocked on their full queues).
		d.setPos(sh, math.MaxInt64)
		r, ok := d.src.Next(ctx, sh)
		if !ok {
			return
		}
		d.setPos(sh, r.MinT)
		if !d.waitSkew(ctx, sh, r.MinT) || !d.pace(ctx, r.Samples) {
			return
		}
		d.send(ctx, r)
	}
}

func (d *driver) setPos(sh int, t int64) {
	d.mu.Lock()
	d.pos[sh] = t
	d.cv.Broadcast()
	d.mu.Unlock()
}

// waitSkew blocks while t is more than MaxSkew ahead of the slowest shard.
func (d *driver) waitSkew(ctx context.Context, sh int, t int64) bool {
	skew := d.cfg.MaxSkew.Milliseconds()
	d.mu.Lock()
	defer d.mu.Unlock()
	for ctx.Err() == nil {
		slowest := int64(math.MaxInt64)
		for i, p := range d.pos {
			if i != sh {
				slowest = min(slowest, p)
			}
		}
		if slowest == math.MinInt64 || slowest == math.MaxInt64 || t-slowest <= skew {
			return true
		}
		d.cv.Wait()
	}
	return false
}

// pace sleeps until n more samples fit the target rate.
func (d *driver) pace(ctx context.Context, n int) bool {
	if d.cfg.Rate <= 0 {
		return true
	}
	total := d.sent.Add(int64(n))
	due := d.start.Add(time.Duration(float64(total-int64(n)) / d.cfg.Rate * float64(time.Second)))
	if wait := time.Until(due); wait > 0 {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
	}
	return true
}

func (d *driver) send(ctx context.Context, r Request) {
	backoff := d.cfg.MinBackoff
	for attempt := 0; ; attempt++ {
		code, hdr, msg, took, err := d.post(ctx, r.Body)
		if ctx.Err() != nil {
			return
		}
		d.codes.Add(code)
		if err == nil {
			d.lat.Add(took)
		}
		retry := false
		switch {
		case err != nil:
			retry, msg = true, err.Error()
		case code/100 == 2:
			written := int64(r.Samples)
			if d.cfg.Protocol == gpusim.ProtocolV2 {
				if h := hdr.Get("X-Prometheus-Remote-Write-Samples-Written"); h != "" {
					if n, err := strconv.ParseInt(h, 10, 64); err == nil && n <= written {
						written = n
					}
				} else {
					written = 0 // Prometheus drops such a batch
					d.noteErr(fmt.Sprintf("HTTP %d without X-Prometheus-Remote-Write-Samples-Written", code))
				}
			}
			d.samples.Add(written)
			d.rej.Add(int64(r.Samples) - written)
			d.bytes.Add(int64(len(r.Body)))
			return
		case code/100 == 5, code == http.StatusTooManyRequests:
			retry = true
		}
		d.noteErr(fmt.Sprintf("HTTP %d: %s", code, msg))
		if !retry {
			d.rej.Add(int64(r.Samples))
			return
		}
		if attempt >= d.cfg.MaxRetries {
			d.failed.Add(int64(r.Samples))
			return
		}
		d.retries.Add(1)
		delay := backoff
		if ra := gpusim.RetryAfter(hdr); ra > 0 {
			delay = min(ra, d.cfg.MaxBackoff)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		backoff = min(2*backoff, d.cfg.MaxBackoff)
	}
}

func (d *driver) noteErr(s string) {
	d.errOnce.Do(func() {
		d.firstErr = s
		d.cfg.Logger.Warn("receiver answered with an error (first one; all are counted by code)", "url", d.cfg.URL, "error", s)
	})
}

func (d *driver) post(ctx context.Context, body []byte) (int, http.Header, string, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.cfg.URL, bytes.NewReader(body))
	if err != nil {
		return 0, nil, "", 0, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Content-Encoding", "snappy")
	req.Header.Set("User-Agent", "gpustore-loadgen/1.0")
	if d.cfg.Protocol == gpusim.ProtocolV2 {
		req.Header.Set("Content-Type", gpusim.ContentTypeV2)
		req.Header.Set("X-Prometheus-Remote-Write-Version", gpusim.VersionHeaderV2)
	} else {
		req.Header.Set("Content-Type", gpusim.ContentTypeV1)
		req.Header.Set("X-Prometheus-Remote-Write-Version", gpusim.VersionHeaderV1)
	}
	if d.cfg.Tenant != "" {
		req.Header.Set("X-Scope-OrgID", d.cfg.Tenant)
	}
	d.reqs.Add(1)
	t0 := time.Now()
	resp, err := d.cfg.Client.Do(req)
	if err != nil {
		return 0, nil, "", time.Since(t0), fmt.Errorf("post %s: %w", d.cfg.URL, err)
	}
	var msg []byte
	if resp.StatusCode/100 != 2 {
		msg, _ = io.ReadAll(io.LimitReader(resp.Body, 512))
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	return resp.StatusCode, resp.Header, string(bytes.TrimSpace(msg)), time.Since(t0), nil
}

func (d *driver) progress(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	if d.cfg.Progress < 0 {
		<-stop
		return
	}
	t := time.NewTicker(d.cfg.Progress)
	defer t.Stop()
	lastAt, lastN := d.start, int64(0)
	var lastProc ProcSample
	if d.cfg.PID > 0 {
		lastProc, _ = ReadProc(d.cfg.PID)
	}
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			n := d.samples.Load()
			args := []any{"accepted", n, "samples_per_sec", int64(float64(n-lastN) / now.Sub(lastAt).Seconds()),
				"requests", d.reqs.Load(), "rejected", d.rej.Load() + d.failed.Load()}
			if total := d.src.Total(); total > 0 {
				pct := 100 * float64(n+d.rej.Load()+d.failed.Load()) / float64(total)
				args = append(args, "percent", fmt.Sprintf("%.1f", pct))
				if pct > 0 && pct < 100 {
					eta := time.Duration(float64(now.Sub(d.start)) * (100 - pct) / pct)
					args = append(args, "eta", eta.Round(time.Second))
				}
			}
			if d.cfg.PID > 0 {
				if p, err := ReadProc(d.cfg.PID); err == nil {
					cores := CPUSeconds(p.CPUTicks-lastProc.CPUTicks) / p.At.Sub(lastProc.At).Seconds()
					args = append(args, "receiver_cpu_cores", fmt.Sprintf("%.2f", cores), "receiver_rss", fmtBytes(p.RSS))
					lastProc = p
				}
			}
			lastAt, lastN = now, n
			d.cfg.Logger.Info("write progress", args...)
		}
	}
}
