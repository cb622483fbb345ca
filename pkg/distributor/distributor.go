// Package distributor is the write path in front of the ring of receivers.
//
// It is an ingest.Store: the distributor runs the same remote-write handler
// as a single node (pkg/ingest: decoding, HA dedup, relabeling, limits,
// validation), so all of that happens once, before the split; only where
// the data goes differs. Each request's series are sharded by a hash of
// tenant and labels (the HA replica label is already gone), sent as remote
// write 2.0 to the replication_factor receivers that own each series
// (dskit's ring.DoBatch), and the request is acknowledged once a quorum of
// receivers has committed every series to its WAL. A quorum that rejects
// the data (out of order, too old) makes a 400 the sender must not retry;
// too few receivers answering makes a 503 it retries.
package distributor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/golang/snappy"
	"github.com/grafana/dskit/ring"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	config_util "github.com/prometheus/common/config"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/exemplar"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/metadata"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"

	"github.com/gpustore/gpustore/pkg/ingest"
	"github.com/gpustore/gpustore/pkg/receiverring"
)

// Ring is what the distributor needs of dskit's ring.
type Ring interface {
	ring.DoBatchRing
}

// Distributor shards, replicates and forwards the writes of every tenant.
type Distributor struct {
	ring    Ring
	client  *http.Client
	scheme  string
	timeout time.Duration
	logger  *slog.Logger
	metrics *metrics
	// inflight counts the commits whose sends to receivers still run,
	// including those acknowledged at quorum while the last replica's send
	// goes on.
	inflight atomic.Int64

	mtx     sync.RWMutex
	tenants map[string]*tenant
}

// New returns a distributor writing to the receivers of r.
func New(cfg receiverring.Config, r Ring, logger *slog.Logger, reg prometheus.Registerer) (*Distributor, error) {
	client, err := config_util.NewClientFromConfig(cfg.Client, "distributor")
	if err != nil {
		return nil, fmt.Errorf("ring.client: %w", err)
	}
	return &Distributor{
		ring: r, client: client, scheme: cfg.Scheme, timeout: time.Duration(cfg.RemoteTimeout),
		logger: logger, metrics: newMetrics(reg), tenants: map[string]*tenant{},
	}, nil
}

// Tenant implements ingest.Store.
func (d *Distributor) Tenant(id string) (ingest.TenantStore, error) {
	d.mtx.RLock()
	t, ok := d.tenants[id]
	d.mtx.RUnlock()
	if ok {
		return t, nil
	}
	d.mtx.Lock()
	defer d.mtx.Unlock()
	if t, ok := d.tenants[id]; ok {
		return t, nil
	}
	t = &tenant{
		d: d, id: id, idHash: xxhash.Sum64String(id),
		byRef: map[storage.SeriesRef]*series{}, byHash: map[uint64]storage.SeriesRef{},
		meta: map[string]metadata.Metadata{},
	}
	d.tenants[id] = t
	return t, nil
}

// Sweep forgets the series no write used since the previous sweep: the
// ingester's series cache then resolves them again by their labels.
func (d *Distributor) Sweep() {
	d.mtx.RLock()
	defer d.mtx.RUnlock()
	for _, t := range d.tenants {
		t.sweep()
	}
}

// tenant holds the series references the ingester's cache uses for one
// tenant (the ingester appends a known series by reference alone, without
// building its labels) and the metadata of its metric families, which is
// sent with every series of the family so every receiver holding the series
// has it.
type tenant struct {
	d      *Distributor
	id     string
	idHash uint64

	mtx     sync.RWMutex
	byRef   map[storage.SeriesRef]*series
	byHash  map[uint64]storage.SeriesRef
	nextRef storage.SeriesRef
	meta    map[string]metadata.Metadata
}

type series struct {
	ref   storage.SeriesRef
	ls    labels.Labels
	hash  uint64
	token uint32
	used  atomic.Bool // since the last sweep
}

func (t *tenant) SetMetadata(family string, m metadata.Metadata) {
	t.mtx.RLock()
	old, ok := t.meta[family]
	t.mtx.RUnlock()
	if ok && old == m {
		return
	}
	t.mtx.Lock()
	t.meta[family] = m
	t.mtx.Unlock()
}

// metadataOf finds the metadata of the family a series belongs to.
func (t *tenant) metadataOf(name string) (metadata.Metadata, bool) {
	t.mtx.RLock()
	defer t.mtx.RUnlock()
	if m, ok := t.meta[name]; ok {
		return m, true
	}
	for _, suf := range []string{"_bucket", "_count", "_sum", "_created"} {
		if base, ok := strings.CutSuffix(name, suf); ok {
			if m, ok := t.meta[base]; ok && (m.Type != model.MetricTypeCounter || suf == "_created") {
				return m, true
			}
		}
	}
	return metadata.Metadata{}, false
}

// errUnknownRef makes the ingester resolve a series again from its labels,
// as it does when the TSDB garbage-collected a series.
var errUnknownRef = fmt.Errorf("%w: series reference forgotten by the distributor", tsdb.ErrInvalidSample)

// resolve finds (or creates) the series of ref or ls.
func (t *tenant) resolve(ref storage.SeriesRef, ls labels.Labels) (*series, error) {
	if ref != 0 {
		t.mtx.RLock()
		s, ok := t.byRef[ref]
		t.mtx.RUnlock()
		if ok {
			return s, nil
		}
		if ls.IsEmpty() {
			return nil, errUnknownRef
		}
	}
	if ls.IsEmpty() {
		return nil, fmt.Errorf("%w: no labels", tsdb.ErrInvalidSample)
	}
	h := ls.Hash()
	t.mtx.RLock()
	s, ok := t.byRef[t.byHash[h]]
	t.mtx.RUnlock()
	if ok && labels.Equal(s.ls, ls) {
		return s, nil
	}
	t.mtx.Lock()
	defer t.mtx.Unlock()
	if s, ok := t.byRef[t.byHash[h]]; ok && labels.Equal(s.ls, ls) {
		return s, nil
	}
	t.nextRef++
	// The token hashes tenant and labels: a series lands on the same
	// receivers whoever sends it, and tenants spread independently.
	x := h ^ t.idHash
	s = &series{ref: t.nextRef, ls: ls.Copy(), hash: h, token: uint32(x ^ x>>32)}
	t.byRef[s.ref] = s
	if _, taken := t.byHash[h]; !taken {
		t.byHash[h] = s.ref // a colliding second series is found by ref only
	}
	return s, nil
}

func (t *tenant) sweep() {
	t.mtx.Lock()
	defer t.mtx.Unlock()
	for ref, s := range t.byRef {
		if s.used.Swap(false) {
			continue
		}
		delete(t.byRef, ref)
		if t.byHash[s.hash] == ref {
			delete(t.byHash, s.hash)
		}
	}
}

// AppenderV2 implements storage.AppendableV2: one request's appends.
func (t *tenant) AppenderV2(ctx context.Context) storage.AppenderV2 {
	return &appender{t: t, ctx: ctx, index: map[storage.SeriesRef]int{}}
}

// appender gathers a request's samples per series until Commit sends them.
type appender struct {
	t       *tenant
	ctx     context.Context
	pending []pending
	index   map[storage.SeriesRef]int
}

type pending struct {
	s          *series
	samples    []writev2.Sample
	histograms []writev2.Histogram
	exemplars  []exemplar.Exemplar
}

func (a *appender) series(ref storage.SeriesRef, ls labels.Labels) (*pending, error) {
	s, err := a.t.resolve(ref, ls)
	if err != nil {
		return nil, err
	}
	s.used.Store(true)
	i, ok := a.index[s.ref]
	if !ok {
		i = len(a.pending)
		a.pending = append(a.pending, pending{s: s})
		a.index[s.ref] = i
	}
	return &a.pending[i], nil
}

func (a *appender) Append(ref storage.SeriesRef, ls labels.Labels, st, t int64, v float64, h *histogram.Histogram, fh *histogram.FloatHistogram, _ storage.AppendV2Options) (storage.SeriesRef, error) {
	p, err := a.series(ref, ls)
	if err != nil {
		return 0, err
	}
	// Histograms are copied: the ingester decodes the next request into
	// the same buffers while the slowest replica's send may still run.
	switch {
	case fh != nil:
		p.histograms = append(p.histograms, writev2.FromFloatHistogram(st, t, fh.Copy()))
	case h != nil:
		p.histograms = append(p.histograms, writev2.FromIntHistogram(st, t, h.Copy()))
	default:
		p.samples = append(p.samples, writev2.Sample{Value: v, Timestamp: t, StartTimestamp: st})
	}
	return p.s.ref, nil
}

// AppendExemplars implements storage.ExemplarAppenderV2.
func (a *appender) AppendExemplars(ref storage.SeriesRef, ls labels.Labels, es []exemplar.Exemplar) (storage.SeriesRef, error) {
	p, err := a.series(ref, ls)
	if err != nil {
		return 0, err
	}
	p.exemplars = append(p.exemplars, es...)
	return p.s.ref, nil
}

func (a *appender) Rollback() error {
	a.pending = nil
	return nil
}

// Commit sends every series to its receivers and returns once a quorum of
// each series' receivers committed it. The sends that are still running
// then (to the slowest replica) finish in the background, bounded by the
// remote timeout, so a fast answer does not cut the third copy short.
func (a *appender) Commit() error {
	if len(a.pending) == 0 {
		return nil
	}
	keys := make([]uint32, len(a.pending))
	for i := range a.pending {
		keys[i] = a.pending[i].s.token
	}
	d := a.t.d
	sendCtx, cancel := context.WithTimeout(context.WithoutCancel(a.ctx), d.timeout)
	d.inflight.Add(1)
	done := func() { cancel(); d.inflight.Add(-1) } // once every send has finished
	err := ring.DoBatchWithOptions(a.ctx, ring.Write, d.ring, keys, func(inst ring.InstanceDesc, idx []int) error {
		return a.send(sendCtx, inst, idx)
	}, ring.DoBatchOptions{Cleanup: done, IsClientError: isClientError})
	if err == nil {
		return nil
	}
	var re *receiverError
	if errors.As(err, &re) && isClientError(err) {
		return &statusError{status: http.StatusBadRequest, msg: "receivers rejected the data: " + re.Error()}
	}
	return &statusError{status: http.StatusServiceUnavailable, msg: "too few receivers took the write: " + err.Error()}
}

// send writes the series at idx to one receiver as remote write 2.0.
func (a *appender) send(ctx context.Context, inst ring.InstanceDesc, idx []int) error {
	d := a.t.d
	start := time.Now()
	body, n := a.request(idx)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.scheme+"://"+inst.Addr+receiverring.WritePath, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/x-protobuf;proto=io.prometheus.write.v2.Request")
	req.Header.Set("Content-Encoding", "snappy")
	req.Header.Set("X-Prometheus-Remote-Write-Version", "2.0.0")
	req.Header.Set("X-Scope-OrgID", a.t.id)
	resp, err := d.client.Do(req)
	if err != nil {
		d.metrics.requests.WithLabelValues("error").Inc()
		return &receiverError{addr: inst.Addr, id: inst.Id, msg: err.Error()}
	}
	defer resp.Body.Close()
	d.metrics.duration.Observe(time.Since(start).Seconds())
	d.metrics.requests.WithLabelValues(fmt.Sprintf("%dxx", resp.StatusCode/100)).Inc()
	if resp.StatusCode/100 == 2 {
		d.metrics.series.Add(float64(n))
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	return &receiverError{addr: inst.Addr, id: inst.Id, status: resp.StatusCode, msg: strings.TrimSpace(string(msg))}
}

// request encodes the series at idx, with their families' metadata.
func (a *appender) request(idx []int) ([]byte, int) {
	syms := writev2.NewSymbolTable()
	req := writev2.Request{Timeseries: make([]writev2.TimeSeries, 0, len(idx))}
	var refs []uint32
	for _, i := range idx {
		p := &a.pending[i]
		ts := writev2.TimeSeries{
			LabelsRefs: syms.SymbolizeLabels(p.s.ls, nil),
			Samples:    p.samples, Histograms: p.histograms,
		}
		for _, e := range p.exemplars {
			refs = syms.SymbolizeLabels(e.Labels, refs[:0])
			ts.Exemplars = append(ts.Exemplars, writev2.Exemplar{LabelsRefs: append([]uint32(nil), refs...), Value: e.Value, Timestamp: e.Ts})
		}
		if m, ok := a.t.metadataOf(p.s.ls.Get(labels.MetricName)); ok {
			ts.Metadata = writev2.Metadata{Type: writev2.FromMetadataType(m.Type), HelpRef: syms.Symbolize(m.Help), UnitRef: syms.Symbolize(m.Unit)}
		}
		req.Timeseries = append(req.Timeseries, ts)
	}
	req.Symbols = syms.Symbols()
	b, err := req.Marshal()
	if err != nil {
		panic(fmt.Sprintf("marshal remote write 2.0 request: %v", err)) // only fails on a programming error
	}
	return snappy.Encode(nil, b), len(idx)
}

// receiverError is a receiver's failure to take a write.
type receiverError struct {
	addr, id string
	status   int // 0: no answer
	msg      string
}

func (e *receiverError) Error() string {
	if e.status == 0 {
		return fmt.Sprintf("receiver %s (%s): %s", e.id, e.addr, e.msg)
	}
	return fmt.Sprintf("receiver %s (%s) answered %d: %s", e.id, e.addr, e.status, e.msg)
}

// isClientError: the receiver will never take this data (4xx but 429).
func isClientError(err error) bool {
	var re *receiverError
	return errors.As(err, &re) && re.status/100 == 4 && re.status != http.StatusTooManyRequests
}

// statusError carries the write's answer to the ingester (ingest.StatusError).
type statusError struct {
	status int
	msg    string
}

func (e *statusError) Error() string   { return e.msg }
func (e *statusError) HTTPStatus() int { return e.status }

type metrics struct {
	requests *prometheus.CounterVec
	duration prometheus.Histogram
	series   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	return &metrics{
		requests: f.NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_distributor_receiver_requests_total",
			Help: "Writes the distributor sent to receivers, by outcome (2xx, 4xx, 5xx, error: no answer).",
		}, []string{"status"}),
		duration: f.NewHistogram(prometheus.HistogramOpts{
			Name:                        "gpustore_distributor_receiver_request_duration_seconds",
			Help:                        "How long receivers took to commit a write.",
			NativeHistogramBucketFactor: 1.1, Buckets: prometheus.DefBuckets,
		}),
		series: f.NewCounter(prometheus.CounterOpts{
			Name: "gpustore_distributor_series_sent_total",
			Help: "Series the distributor's writes carried to receivers that took them, one per replica.",
		}),
	}
}
