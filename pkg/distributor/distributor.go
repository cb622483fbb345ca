// Package distributor is the write path in front of the ring of receivers.
//
// It is an ingest.Store: the distributor runs the same remote-write handler
// as a single node (pkg/ingest: decoding, HA dedup, relabeling, limits,
// validation), so all of that happens once, before the split; only where
// the data goes differs. Each request's series are sharded by a hash of
// tenant and labels (the HA replica label is already gone), sent as remote
// write 1.0 to the replication_factor receivers that own each series
// (dskit's ring.DoBatch), and the request is acknowledged once a quorum of
// receivers has committed every series to its WAL. A quorum that rejects
// the data (out of order, too old) makes a 400 the sender must not retry;
// too few receivers answering makes a 503 it retries.
//
// Created-timestamp zeros (created_timestamp_zero_ingestion) are best
// effort on the receivers as on a single node: a sample that gets one is
// forwarded with its start timestamp (see Append), and the receiver stores
// the zero if it is in order and ignores it if not.
package distributor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"slices"
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
	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/gpustore/gpustore/pkg/ingest"
	"github.com/gpustore/gpustore/pkg/receiverring"
)

// Ring is what the distributor needs of dskit's ring: batches of keys to
// their replicas, and tenants' shuffle shards.
type Ring interface {
	ring.DoBatchRing
	ShuffleShard(identifier string, size int) ring.ReadRing
}

// ShardSize is a tenant's shuffle shard size now (limits'
// ingestion_shard_size): 0 is every receiver.
type ShardSize func(tenant string) int

// Distributor shards, replicates and forwards the writes of every tenant.
type Distributor struct {
	ring    Ring
	shard   ShardSize // nil: every tenant on the whole ring
	client  *http.Client
	scheme  string
	timeout time.Duration
	logger  *slog.Logger
	metrics *metrics
	// inflight counts the commits whose sends to receivers still run,
	// including those acknowledged at quorum while the last replica's send
	// goes on.
	inflight atomic.Int64
	// maxSeries bounds cached, the series cached over all tenants (0: no
	// bound). Past it a new series is forwarded uncached (tenant.resolve).
	maxSeries int64
	cached    atomic.Int64

	mtx     sync.RWMutex
	tenants map[string]*tenant
}

// New returns a distributor writing to the receivers of r, each tenant to
// its shuffle shard of shard(tenant) receivers (shard nil: every tenant to
// the whole ring).
func New(cfg receiverring.Config, r Ring, shard ShardSize, logger *slog.Logger, reg prometheus.Registerer) (*Distributor, error) {
	client, err := config_util.NewClientFromConfig(cfg.Client, "distributor")
	if err != nil {
		return nil, fmt.Errorf("ring.client: %w", err)
	}
	maxSeries := int64(max(0, cfg.DistributorSeriesCacheMaxSeries))
	return &Distributor{
		ring: r, shard: shard, client: client, scheme: cfg.Scheme, timeout: time.Duration(cfg.RemoteTimeout),
		logger: logger, metrics: newMetrics(reg, maxSeries), maxSeries: maxSeries, tenants: map[string]*tenant{},
	}, nil
}

// admit takes a place in the series cache for a new series; false: the
// cache is full. The place is given back by release.
func (d *Distributor) admit() bool {
	if d.maxSeries == 0 {
		d.cached.Add(1)
		return true
	}
	for {
		n := d.cached.Load()
		if n >= d.maxSeries {
			return false
		}
		if d.cached.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

func (d *Distributor) release(n int) { d.cached.Add(-int64(n)) }

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
		meta:   map[string]*familyMetadata{},
		cached: d.metrics.cached.WithLabelValues(id), uncached: d.metrics.uncached.WithLabelValues(id),
		swept: d.metrics.swept.WithLabelValues(id),
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
//
// References are the ingester's only name for a series: it keeps every one
// it was handed (keyed by the labels it arrived with) until its own sweep,
// and appends by it with no labels. So a reference is never handed out
// twice, not after its series was swept, nor for a series forwarded
// uncached: lastRef only grows, and a tenant is never dropped and made
// anew (its references would start again at 1). A forgotten reference is
// then unknown here (errUnknownRef), never another series'.
type tenant struct {
	d      *Distributor
	id     string
	idHash uint64

	mtx     sync.RWMutex
	byRef   map[storage.SeriesRef]*series
	byHash  map[uint64]storage.SeriesRef
	lastRef atomic.Uint64
	meta    map[string]*familyMetadata
	// cached is len(byRef); uncached counts series forwarded uncached
	// because the distributor's cache was full; swept, those the sweeps
	// forgot.
	cached          prometheus.Gauge
	uncached, swept prometheus.Counter
	// metaGen advances with every metadata change; a series' cached
	// family (series.meta) of an older generation is looked up again.
	metaGen atomic.Uint64
}

type series struct {
	ref   storage.SeriesRef
	ls    labels.Labels
	name  string // the metric name, for its family's metadata
	hash  uint64
	token uint32
	used  atomic.Bool // since the last sweep
	// pbLabels are the labels as remote write 1.0 encodes them in a
	// TimeSeries, encoded once: a request is then mostly copies of these.
	pbLabels []byte
	meta     atomic.Pointer[seriesMeta]
}

// seriesMeta caches a series' family metadata (nil: none) as of a
// generation of the tenant's metadata.
type seriesMeta struct {
	gen uint64
	fm  *familyMetadata
}

func (t *tenant) SetMetadata(family string, m metadata.Metadata) {
	t.mtx.RLock()
	old, ok := t.meta[family]
	t.mtx.RUnlock()
	if ok && old.Metadata == m {
		return
	}
	t.mtx.Lock()
	t.meta[family] = &familyMetadata{Metadata: m, family: family}
	t.mtx.Unlock()
	t.metaGen.Add(1)
}

// familyOf is the metadata of the family of s, nil if none is known.
func (t *tenant) familyOf(s *series) *familyMetadata {
	gen := t.metaGen.Load()
	if c := s.meta.Load(); c != nil && c.gen == gen {
		return c.fm
	}
	fm := t.metadataOf(s.name)
	s.meta.Store(&seriesMeta{gen: gen, fm: fm})
	return fm
}

// familyMetadata is a family's metadata and the family's name.
type familyMetadata struct {
	metadata.Metadata
	family string
}

// metadataOf finds the metadata of the family a metric name belongs to.
func (t *tenant) metadataOf(name string) *familyMetadata {
	t.mtx.RLock()
	defer t.mtx.RUnlock()
	if m, ok := t.meta[name]; ok {
		return m
	}
	for _, suf := range []string{"_bucket", "_count", "_sum", "_created"} {
		if base, ok := strings.CutSuffix(name, suf); ok {
			if m, ok := t.meta[base]; ok && (m.Type != model.MetricTypeCounter || suf == "_created") {
				return m
			}
		}
	}
	return nil
}

// errUnknownRef makes the ingester resolve a series again from its labels,
// as it does when the TSDB garbage-collected a series.
var errUnknownRef = fmt.Errorf("%w: series reference forgotten by the distributor", tsdb.ErrInvalidSample)

// resolve finds (or creates) the series of ref or ls. A new series is
// cached while the distributor's cache has room. Past that it is forwarded
// uncached: the series lives as long as the request and its reference is
// unknown to the next one, which the ingester then resolves again from its
// labels. The series cached first stay (until a sweep forgets them) rather
// than making way: every active series is written every scrape interval, so
// with more active series than the bound, evicting the least recently used
// would evict each series before its next write (no write would find its
// series) and pay an eviction and an insertion for each.
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
	if !t.d.admit() {
		t.uncached.Inc()
		return t.newSeries(h, ls, false), nil
	}
	t.mtx.Lock()
	defer t.mtx.Unlock()
	if s, ok := t.byRef[t.byHash[h]]; ok && labels.Equal(s.ls, ls) {
		t.d.release(1) // another write created it meanwhile
		return s, nil
	}
	s = t.newSeries(h, ls, true)
	t.byRef[s.ref] = s
	if _, taken := t.byHash[h]; !taken {
		t.byHash[h] = s.ref // a colliding second series is found by ref only
	}
	t.cached.Inc()
	return s, nil
}

// newSeries makes the series of ls (of hash h) under a new reference. An
// uncached series keeps no labels: only its encoding and name are read. A
// cached one is made under t.mtx, an uncached one without it.
func (t *tenant) newSeries(h uint64, ls labels.Labels, cached bool) *series {
	// The token hashes tenant and labels: a series lands on the same
	// receivers whoever sends it, and tenants spread independently.
	x := h ^ t.idHash
	s := &series{ref: storage.SeriesRef(t.lastRef.Add(1)), hash: h, token: uint32(x ^ x>>32)}
	if cached {
		s.ls = ls.Copy()
		s.name = s.ls.Get(model.MetricNameLabel)
	} else {
		// The ingester may build the next series' labels in the same memory.
		s.name = strings.Clone(ls.Get(model.MetricNameLabel))
		// Its family is looked up once here, not by each replica's request.
		gen := t.metaGen.Load()
		s.meta.Store(&seriesMeta{gen: gen, fm: t.metadataOf(s.name)})
	}
	s.pbLabels = encodeLabels(ls)
	return s
}

func (t *tenant) sweep() {
	t.mtx.Lock()
	defer t.mtx.Unlock()
	n := len(t.byRef)
	for ref, s := range t.byRef {
		if s.used.Swap(false) {
			continue
		}
		delete(t.byRef, ref)
		if t.byHash[s.hash] == ref {
			delete(t.byHash, s.hash)
		}
	}
	removed := n - len(t.byRef)
	t.d.release(removed)
	t.cached.Sub(float64(removed))
	t.swept.Add(float64(removed))
}

// AppenderV2 implements storage.AppendableV2: one request's appends.
func (t *tenant) AppenderV2(ctx context.Context) storage.AppenderV2 {
	return &appender{t: t, ctx: ctx}
}

var _ ingest.ZeroAppender = (*appender)(nil)

// appender gathers a request's samples per series until Commit sends them.
// The ingester appends a series' samples one after the other, so they are
// kept in one slice per data type and each pending series is a range of
// it; a series met again later in the request gets a second range.
type appender struct {
	t          *tenant
	ctx        context.Context
	pending    []pending
	samples    []fwdSample
	histograms []writev2.Histogram // 1.0's Histogram and its start timestamp (see Append)
	exemplars  []prompb.Exemplar
}

// fwdSample is a float sample to forward; st is its start timestamp when it
// gets a created-timestamp zero, else 0.
type fwdSample struct {
	v     float64
	t, st int64
}

// pending is one series of the request and its ranges of the appender's
// slices (end-exclusive).
type pending struct {
	s                          *series
	samples, histograms, exems [2]int
	// zeroAt is the time of the created-timestamp zero the ingester just
	// asked for before the series' next sample (AppendZero; 0: none).
	zeroAt int64
}

// series returns the pending entry samples of ref (or ls) go to.
func (a *appender) series(ref storage.SeriesRef, ls labels.Labels) (*pending, error) {
	if n := len(a.pending); n > 0 && ref != 0 && a.pending[n-1].s.ref == ref {
		return &a.pending[n-1], nil
	}
	s, err := a.t.resolve(ref, ls)
	if err != nil {
		return nil, err
	}
	if n := len(a.pending); n > 0 && a.pending[n-1].s == s {
		return &a.pending[n-1], nil
	}
	s.used.Store(true)
	ns, nh, ne := len(a.samples), len(a.histograms), len(a.exemplars)
	a.pending = append(a.pending, pending{s: s, samples: [2]int{ns, ns}, histograms: [2]int{nh, nh}, exems: [2]int{ne, ne}})
	return &a.pending[len(a.pending)-1], nil
}

// AppendZero implements ingest.ZeroAppender: a created-timestamp zero at
// st, which the ingester asks for just before the sample whose start
// timestamp st is. It is best effort, stored only if in order. Forwarded as
// an ordinary sample it failed the write: the zero of a counter's every
// scrape after the first is older than the series' newest sample, and the
// receivers answered 400. Only a receiver can tell whether the zero is in
// order, so the zero is not sent itself: the sample after it is sent with
// its start timestamp (see Append), which tells the receiver to append the
// zero as a single node does, best effort.
func (a *appender) AppendZero(ref storage.SeriesRef, ls labels.Labels, st int64) (storage.SeriesRef, error) {
	p, err := a.series(ref, ls)
	if err != nil {
		return 0, err
	}
	p.zeroAt = st
	return p.s.ref, nil
}

// Append takes a sample or histogram. Its start timestamp st is sent only
// when AppendZero asked for a zero there (the receivers do not store it
// otherwise).
//
// The request stays remote write 1.0 (its encoding is cheap, see request),
// with the start timestamp where 2.0 numbers it: field 3 of a Sample, 17 of
// a Histogram (2.0's Histogram is 1.0's with that field). A receiver of
// the previous version skips the unknown field, as protobuf decoders do,
// and stores the sample without its zero: during a rolling upgrade zeros
// may be missing, and no write fails. A receiver reads the field only from
// a distributor (in downstream mode).
func (a *appender) Append(ref storage.SeriesRef, ls labels.Labels, st, t int64, v float64, h *histogram.Histogram, fh *histogram.FloatHistogram, _ storage.AppendV2Options) (storage.SeriesRef, error) {
	p, err := a.series(ref, ls)
	if err != nil {
		return 0, err
	}
	// The start timestamp goes only with the sample right after its zero.
	// A zero not followed by its sample (never, from the ingester) is
	// dropped: it is best effort.
	if st != p.zeroAt {
		st = 0
	}
	p.zeroAt = 0
	// Histograms are encoded now: the ingester decodes the next request
	// into the same buffers while the slowest replica's send may still run.
	switch {
	case fh != nil:
		a.histograms = append(a.histograms, writev2.FromFloatHistogram(st, t, fh.Copy()))
		p.histograms[1] = len(a.histograms)
	case h != nil:
		a.histograms = append(a.histograms, writev2.FromIntHistogram(st, t, h.Copy()))
		p.histograms[1] = len(a.histograms)
	default:
		a.samples = append(a.samples, fwdSample{v: v, t: t, st: st})
		p.samples[1] = len(a.samples)
	}
	return p.s.ref, nil
}

// AppendExemplars implements storage.ExemplarAppenderV2.
func (a *appender) AppendExemplars(ref storage.SeriesRef, ls labels.Labels, es []exemplar.Exemplar) (storage.SeriesRef, error) {
	p, err := a.series(ref, ls)
	if err != nil {
		return 0, err
	}
	for _, e := range es {
		pe := prompb.Exemplar{Value: e.Value, Timestamp: e.Ts}
		e.Labels.Range(func(l labels.Label) { pe.Labels = append(pe.Labels, prompb.Label{Name: l.Name, Value: l.Value}) })
		a.exemplars = append(a.exemplars, pe)
	}
	p.exems[1] = len(a.exemplars)
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
	err := ring.DoBatchWithOptions(a.ctx, ring.Write, d.ringOf(a.t.id), keys, func(inst ring.InstanceDesc, idx []int) error {
		return a.send(sendCtx, inst, idx)
	}, ring.DoBatchOptions{Cleanup: done, IsClientError: isClientError})
	if err == nil {
		d.metrics.writes.WithLabelValues(writeOK).Inc()
		return nil
	}
	var re *receiverError
	if errors.As(err, &re) && isClientError(err) {
		d.metrics.writes.WithLabelValues(writeRejected).Inc()
		return &statusError{status: http.StatusBadRequest, msg: "receivers rejected the data: " + re.Error()}
	}
	d.metrics.writes.WithLabelValues(writeNoQuorum).Inc()
	return &statusError{status: http.StatusServiceUnavailable, msg: "too few receivers took the write: " + err.Error()}
}

// ringOf is the part of the ring a tenant's series go to: its shuffle
// shard (dskit's ring.ShuffleShard, cached by the ring until it changes;
// with zones it takes receivers from each zone), or the whole ring. A shard
// smaller than the replication factor is raised to it: each series needs
// that many receivers.
func (d *Distributor) ringOf(tenant string) ring.DoBatchRing {
	if d.shard == nil {
		return d.ring
	}
	n := d.shard(tenant)
	if n <= 0 {
		return d.ring
	}
	return d.ring.ShuffleShard(tenant, max(n, d.ring.ReplicationFactor()))
}

// send writes the series at idx to one receiver (see request).
func (a *appender) send(ctx context.Context, inst ring.InstanceDesc, idx []int) error {
	d := a.t.d
	start := time.Now()
	enc := a.request(idx)
	body := enc.reader()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.scheme+"://"+inst.Addr+receiverring.WritePath, body)
	if err != nil {
		_ = body.Close()
		return err
	}
	req.ContentLength = int64(len(enc.compressed))
	req.Header.Set("Content-Type", "application/x-protobuf")
	req.Header.Set("Content-Encoding", "snappy")
	req.Header.Set("X-Prometheus-Remote-Write-Version", "0.1.0")
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
		d.metrics.series.Add(float64(len(idx)))
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	return &receiverError{addr: inst.Addr, id: inst.Id, status: resp.StatusCode, msg: strings.TrimSpace(string(msg)),
		judged: resp.Header.Get(ingest.AnswerHeader) != ""}
}

// request encodes the series at idx as a remote write 1.0 request, with
// their families' metadata, snappy-compressed. It is written with protowire
// rather than built as a prompb.WriteRequest: each series' labels were
// encoded once (series.pbLabels) and are copied, which takes a fraction of
// the CPU of encoding (or symbolizing, for 2.0) every label of every series
// for every replica.
func (a *appender) request(idx []int) *encoder {
	enc := encoders.Get().(*encoder)
	body := enc.body[:0]
	families := enc.families
	clear(families)
	for _, i := range idx {
		p := &a.pending[i]
		samples := a.samples[p.samples[0]:p.samples[1]]
		exemplars := a.exemplars[p.exems[0]:p.exems[1]]
		histograms := a.histograms[p.histograms[0]:p.histograms[1]]
		// The TimeSeries is written straight into the body: its size first.
		size := len(p.s.pbLabels)
		for _, smp := range samples {
			size += messageSize(sampleSize(smp))
		}
		for j := range exemplars {
			size += messageSize(exemplars[j].Size())
		}
		for j := range histograms {
			size += messageSize(histograms[j].Size())
		}
		body = protowire.AppendTag(body, 1, protowire.BytesType)
		body = protowire.AppendVarint(body, uint64(size))
		body = append(body, p.s.pbLabels...)
		for _, smp := range samples {
			body = protowire.AppendTag(body, 2, protowire.BytesType)
			body = protowire.AppendVarint(body, uint64(sampleSize(smp)))
			body = protowire.AppendTag(body, 1, protowire.Fixed64Type)
			body = protowire.AppendFixed64(body, math.Float64bits(smp.v))
			body = protowire.AppendTag(body, 2, protowire.VarintType)
			body = protowire.AppendVarint(body, uint64(smp.t))
			if smp.st != 0 {
				body = protowire.AppendTag(body, 3, protowire.VarintType)
				body = protowire.AppendVarint(body, uint64(smp.st))
			}
		}
		for j := range exemplars {
			body = appendMessage(body, 3, &exemplars[j])
		}
		for j := range histograms {
			body = appendMessage(body, 4, &histograms[j])
		}
		if fm := a.t.familyOf(p.s); fm != nil {
			families[fm] = struct{}{}
		}
	}
	for fm := range families {
		md := prompb.MetricMetadata{Type: prompb.FromMetadataType(fm.Type), MetricFamilyName: fm.family, Help: fm.Help, Unit: fm.Unit}
		body = appendMessage(body, 3, &md)
	}
	enc.body = body
	enc.compressed = snappy.Encode(enc.compressed[:cap(enc.compressed)], body)
	return enc
}

// sampleSize is the size of a Sample of s: value, timestamp and, with a
// zero before it, start_timestamp (see Append).
func sampleSize(s fwdSample) int {
	n := 1 + 8 + 1 + protowire.SizeVarint(uint64(s.t))
	if s.st != 0 {
		n += 1 + protowire.SizeVarint(uint64(s.st))
	}
	return n
}

// messageSize is the size of a message field of n bytes (tag, length, bytes).
func messageSize(n int) int { return 1 + protowire.SizeVarint(uint64(n)) + n }

type marshaler interface {
	Size() int
	MarshalToSizedBuffer([]byte) (int, error)
}

// appendMessage appends m as field num of the message in b.
func appendMessage(b []byte, num protowire.Number, m marshaler) []byte {
	n := m.Size()
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(n))
	b = slices.Grow(b, n)
	if _, err := m.MarshalToSizedBuffer(b[len(b) : len(b)+n]); err != nil {
		panic(fmt.Sprintf("marshal %T: %v", m, err)) // only fails on a programming error
	}
	return b[:len(b)+n]
}

// encodeLabels encodes ls as the labels field of a remote write 1.0
// TimeSeries, into one allocation of its size: a series forwarded uncached
// is encoded at every write.
func encodeLabels(ls labels.Labels) []byte {
	n := 0
	ls.Range(func(l labels.Label) { n += messageSize(labelSize(l)) })
	b := make([]byte, 0, n)
	ls.Range(func(l labels.Label) {
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(labelSize(l)))
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendString(b, l.Name)
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendString(b, l.Value)
	})
	return b
}

// labelSize is the size of a prompb.Label of l.
func labelSize(l labels.Label) int {
	return 1 + protowire.SizeBytes(len(l.Name)) + 1 + protowire.SizeBytes(len(l.Value))
}

// encoder is the scratch space of request and the request body it made;
// it goes back to the pool when the HTTP transport closes the body.
type encoder struct {
	body, compressed []byte
	families         map[*familyMetadata]struct{}
}

var encoders = sync.Pool{New: func() any { return &encoder{families: map[*familyMetadata]struct{}{}} }}

// reader returns the compressed body as one request's body.
func (e *encoder) reader() io.ReadCloser {
	return &requestBody{Reader: bytes.NewReader(e.compressed), enc: e}
}

type requestBody struct {
	*bytes.Reader
	enc    *encoder
	closed atomic.Bool
}

// Close is called by the transport (maybe more than once) when it no
// longer reads the body: only then may the encoder serve another request.
func (b *requestBody) Close() error {
	if !b.closed.Swap(true) {
		encoders.Put(b.enc)
	}
	return nil
}

// receiverError is a receiver's failure to take a write.
type receiverError struct {
	addr, id string
	status   int // 0: no answer
	msg      string
	// judged: the answer is the receiver's ingester's (ingest.AnswerHeader).
	judged bool
}

func (e *receiverError) Error() string {
	switch {
	case e.status == 0:
		return fmt.Sprintf("receiver %s (%s): %s", e.id, e.addr, e.msg)
	case e.status/100 == 4 && !e.judged:
		return fmt.Sprintf("receiver %s (%s) answered %d, not from its ingester: a transport or configuration fault (ring.scheme, ring.client's credentials, a proxy): %s", e.id, e.addr, e.status, e.msg)
	}
	return fmt.Sprintf("receiver %s (%s) answered %d: %s", e.id, e.addr, e.status, e.msg)
}

// isClientError: the receiver will never take this data: its ingester
// judged it and answered 4xx but 429. A 4xx from anything else on the way
// (plain HTTP to a TLS receiver, credentials it refuses) is a fault to
// retry: passed on as 400 it would make the sender drop its data.
func isClientError(err error) bool {
	var re *receiverError
	return errors.As(err, &re) && re.status/100 == 4 && re.status != http.StatusTooManyRequests && re.judged
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
	writes   *prometheus.CounterVec
	duration prometheus.Histogram
	series   prometheus.Counter
	// The series cache, by tenant.
	cached          *prometheus.GaugeVec
	uncached, swept *prometheus.CounterVec
}

// Outcomes of a distributor's write (gpustore_distributor_writes_total).
const (
	writeOK       = "ok"        // a quorum of every series' receivers committed it
	writeRejected = "rejected"  // a quorum rejected data (400, not retried)
	writeNoQuorum = "no_quorum" // too few receivers took some series (503, retried)
)

func newMetrics(reg prometheus.Registerer, maxSeries int64) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		requests: f.NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_distributor_receiver_requests_total",
			Help: "Writes the distributor sent to receivers, by outcome (2xx, 4xx, 5xx, error: no answer).",
		}, []string{"status"}),
		writes: f.NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_distributor_writes_total",
			Help: "Writes the distributor replicated, by result: ok (a quorum committed every series), rejected (a quorum rejected data: 400), no_quorum (too few receivers took some series: 503).",
		}, []string{"result"}),
		duration: f.NewHistogram(prometheus.HistogramOpts{
			Name:                        "gpustore_distributor_receiver_request_duration_seconds",
			Help:                        "How long receivers took to commit a write.",
			NativeHistogramBucketFactor: 1.1, Buckets: prometheus.DefBuckets,
		}),
		series: f.NewCounter(prometheus.CounterOpts{
			Name: "gpustore_distributor_series_sent_total",
			Help: "Series the distributor's writes carried to receivers that took them, one per replica.",
		}),
		cached: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpustore_distributor_cached_series",
			Help: "Series the distributor keeps cached (labels and their remote-write encoding), by tenant; all tenants' are bounded by ring.distributor_series_cache_max_series.",
		}, []string{"tenant"}),
		uncached: f.NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_distributor_uncached_series_total",
			Help: "Series forwarded uncached because the series cache was full, one per series and write: each such write resolved the series from its labels again.",
		}, []string{"tenant"}),
		swept: f.NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_distributor_series_cache_swept_total",
			Help: "Cached series forgotten by the sweep every block period (no write since the previous sweep).",
		}, []string{"tenant"}),
	}
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "gpustore_distributor_series_cache_max_series",
		Help: "The bound on the distributor's cached series over all tenants (ring.distributor_series_cache_max_series; 0: none).",
	}, func() float64 { return float64(maxSeries) })
	// Every result exists from the start: a rate over a counter that
	// appears with its first failure misses that failure.
	for _, r := range []string{writeOK, writeRejected, writeNoQuorum} {
		m.writes.WithLabelValues(r)
	}
	for _, s := range []string{"2xx", "4xx", "5xx", "error"} {
		m.requests.WithLabelValues(s)
	}
	return m
}
