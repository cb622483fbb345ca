package gpusim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Protocol is a remote-write protocol version.
type Protocol string

// Remote-write protocols.
const (
	ProtocolV1 Protocol = "1.0"
	ProtocolV2 Protocol = "2.0"
)

// SenderConfig configures a Sender. Defaults follow Prometheus' queue_config.
type SenderConfig struct {
	URL      string
	Protocol Protocol // default 1.0
	// MaxSamplesPerSend caps a request (default 2000, Prometheus' default).
	MaxSamplesPerSend int
	// Shards is the number of requests in flight for one Send (default 1).
	Shards int
	// Tenant, when set, is sent as X-Scope-OrgID.
	Tenant string
	// RetryOn429 retries 429 answers like 5xx (Prometheus: retry_on_http_429);
	// otherwise they are dropped like other 4xx.
	RetryOn429 bool
	// MinBackoff and MaxBackoff bound the doubling retry delay (30ms, 5s).
	MinBackoff, MaxBackoff time.Duration
	// MaxRetries is how many times one batch is retried before it is dropped
	// (default 10; Prometheus retries forever, a load driver must not).
	MaxRetries int
	// Timeout is the per-request timeout (default 30s, remote_timeout).
	Timeout time.Duration
	// ExternalLabels are added to every series (cluster, __replica__).
	ExternalLabels []Label
	HTTPClient     *http.Client
	Logger         *slog.Logger
	UserAgent      string
}

// SenderStats counts what a Sender did. Batches are requests' worth of series.
type SenderStats struct {
	Requests       int64 // HTTP requests made, retries included
	Batches        int64 // batches acknowledged with 2xx
	Samples        int64 // samples in acknowledged batches
	Bytes          int64 // compressed body bytes of acknowledged batches
	Retries        int64
	Dropped4xx     int64 // batches dropped on a non-retryable 4xx
	DroppedSamples int64 // samples in dropped or failed batches
	Failed         int64 // batches dropped after MaxRetries
	// MissingWritten counts 2xx answers to 2.0 requests without
	// X-Prometheus-Remote-Write-Samples-Written: Prometheus treats those as
	// failed and drops the batch, so they are also counted as dropped.
	MissingWritten int64
}

// Sender posts series to a remote-write endpoint in batches, with retries.
type Sender struct {
	cfg    SenderConfig
	client *http.Client
	log    *slog.Logger
	shards []*Encoder

	requests, batches, samples, bytes, retries  atomic.Int64
	dropped4xx, droppedSamples, failed, missing atomic.Int64
	lastWarn                                    atomic.Int64
}

// NewSender validates cfg and returns a Sender.
func NewSender(cfg SenderConfig) (*Sender, error) {
	if cfg.URL == "" {
		return nil, errors.New("remote write: URL is required")
	}
	if cfg.Protocol == "" {
		cfg.Protocol = ProtocolV1
	}
	if cfg.Protocol != ProtocolV1 && cfg.Protocol != ProtocolV2 {
		return nil, fmt.Errorf("remote write: protocol %q is not 1.0 or 2.0", cfg.Protocol)
	}
	if cfg.MaxSamplesPerSend <= 0 {
		cfg.MaxSamplesPerSend = 2000
	}
	if cfg.Shards <= 0 {
		cfg.Shards = 1
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 30 * time.Millisecond
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 5 * time.Second
	}
	if cfg.MaxRetries == 0 {
		cfg.MaxRetries = 10
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.UserAgent == "" {
		cfg.UserAgent = "gpusim/1.0 (Prometheus remote-write simulator)"
	}
	s := &Sender{cfg: cfg, client: cfg.HTTPClient, log: cfg.Logger}
	if s.client == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = cfg.Shards + 2
		s.client = &http.Client{Transport: tr}
	}
	for i := 0; i < cfg.Shards; i++ {
		s.shards = append(s.shards, NewEncoder(cfg.ExternalLabels))
	}
	return s, nil
}

// Stats returns a snapshot of the counters.
func (s *Sender) Stats() SenderStats {
	return SenderStats{
		Requests: s.requests.Load(), Batches: s.batches.Load(), Samples: s.samples.Load(), Bytes: s.bytes.Load(),
		Retries: s.retries.Load(), Dropped4xx: s.dropped4xx.Load(), DroppedSamples: s.droppedSamples.Load(),
		Failed: s.failed.Load(), MissingWritten: s.missing.Load(),
	}
}

// Send splits series into batches of MaxSamplesPerSend and posts them, up to
// Shards at a time, returning when all are acknowledged or dropped. Dropped
// batches are counted and logged, not returned, as Prometheus does; the
// error is the context's when it ends first.
func (s *Sender) Send(ctx context.Context, series []Series) error {
	per := s.cfg.MaxSamplesPerSend
	nb := (len(series) + per - 1) / per
	batch := func(i int) []Series { return series[i*per : min((i+1)*per, len(series))] }
	if nb <= 1 || len(s.shards) == 1 {
		for i := 0; i < nb && ctx.Err() == nil; i++ {
			s.sendBatch(ctx, s.shards[0], batch(i))
		}
		return ctx.Err()
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for _, enc := range s.shards[:min(len(s.shards), nb)] {
		wg.Add(1)
		go func(enc *Encoder) {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= nb {
					return
				}
				s.sendBatch(ctx, enc, batch(i))
			}
		}(enc)
	}
	wg.Wait()
	return ctx.Err()
}

// SendMetadata posts a 1.0 metadata-only request for the given families (a
// no-op under 2.0, where metadata rides with each series).
func (s *Sender) SendMetadata(ctx context.Context, descs []*MetricDesc) error {
	if s.cfg.Protocol != ProtocolV1 || len(descs) == 0 {
		return nil
	}
	body := s.shards[0].EncodeV1Metadata(descs)
	status, _, msg, err := s.post(ctx, body)
	if err != nil {
		return fmt.Errorf("send metadata: %w", err)
	}
	if status/100 != 2 {
		return fmt.Errorf("send metadata: HTTP %d: %s", status, msg)
	}
	return nil
}

func (s *Sender) sendBatch(ctx context.Context, enc *Encoder, batch []Series) {
	var body []byte
	if s.cfg.Protocol == ProtocolV2 {
		body = enc.EncodeV2(batch)
	} else {
		body = enc.EncodeV1(batch)
	}
	backoff := s.cfg.MinBackoff
	for attempt := 0; ; attempt++ {
		status, hdr, msg, err := s.post(ctx, body)
		retry := false
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			retry = true
			msg = err.Error()
		case status/100 == 2:
			if s.cfg.Protocol == ProtocolV2 && hdr.Get("X-Prometheus-Remote-Write-Samples-Written") == "" {
				s.missing.Add(1)
				s.droppedSamples.Add(int64(len(batch)))
				s.warn("remote write 2.0: 2xx without X-Prometheus-Remote-Write-Samples-Written; Prometheus would drop this batch", "status", status)
				return
			}
			s.batches.Add(1)
			s.samples.Add(int64(len(batch)))
			s.bytes.Add(int64(len(body)))
			return
		case status/100 == 5, status == http.StatusTooManyRequests && s.cfg.RetryOn429:
			retry = true
		}
		if !retry {
			s.dropped4xx.Add(1)
			s.droppedSamples.Add(int64(len(batch)))
			s.warn("remote write: batch dropped (non-retryable)", "status", status, "samples", len(batch), "body", msg)
			return
		}
		if attempt >= s.cfg.MaxRetries {
			s.failed.Add(1)
			s.droppedSamples.Add(int64(len(batch)))
			s.warn("remote write: batch dropped after retries", "attempts", attempt+1, "status", status, "err", msg)
			return
		}
		s.retries.Add(1)
		delay := backoff
		if ra := RetryAfter(hdr); ra > 0 {
			delay = min(ra, s.cfg.MaxBackoff)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		backoff = min(2*backoff, s.cfg.MaxBackoff)
	}
}

func (s *Sender) post(ctx context.Context, body []byte) (int, http.Header, string, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.cfg.URL, bytes.NewReader(body))
	if err != nil {
		return 0, nil, "", fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Content-Encoding", "snappy")
	req.Header.Set("User-Agent", s.cfg.UserAgent)
	if s.cfg.Protocol == ProtocolV2 {
		req.Header.Set("Content-Type", ContentTypeV2)
		req.Header.Set("X-Prometheus-Remote-Write-Version", VersionHeaderV2)
	} else {
		req.Header.Set("Content-Type", ContentTypeV1)
		req.Header.Set("X-Prometheus-Remote-Write-Version", VersionHeaderV1)
	}
	if s.cfg.Tenant != "" {
		req.Header.Set("X-Scope-OrgID", s.cfg.Tenant)
	}
	s.requests.Add(1)
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, nil, "", fmt.Errorf("post %s: %w", s.cfg.URL, err)
	}
	defer resp.Body.Close()
	var msg []byte
	if resp.StatusCode/100 != 2 {
		msg, _ = io.ReadAll(io.LimitReader(resp.Body, 512))
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20)) // drain for keep-alive
	return resp.StatusCode, resp.Header, string(bytes.TrimSpace(msg)), nil
}

// warn logs at most once every 5 seconds per Sender.
func (s *Sender) warn(msg string, args ...any) {
	now := time.Now().UnixNano()
	last := s.lastWarn.Load()
	if now-last < int64(5*time.Second) || !s.lastWarn.CompareAndSwap(last, now) {
		return
	}
	s.log.Warn(msg, args...)
}

// RetryAfter is the delay a Retry-After header asks for (seconds or an
// HTTP date); 0 when absent or unparseable.
func RetryAfter(h http.Header) time.Duration {
	v := h.Get("Retry-After")
	if v == "" {
		return 0
	}
	if secs, err := strconv.Atoi(v); err == nil && secs > 0 {
		return time.Duration(secs) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return time.Until(t)
	}
	return 0
}
