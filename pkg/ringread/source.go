package ringread

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/golang/snappy"
	"github.com/grafana/dskit/ring"
	"github.com/oklog/ulid/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	config_util "github.com/prometheus/common/config"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/storage/remote"
	"github.com/prometheus/prometheus/util/annotations"

	"github.com/gpustore/gpustore/pkg/downsample"
	"github.com/gpustore/gpustore/pkg/limits/querylimit"
	"github.com/gpustore/gpustore/pkg/query"
	"github.com/gpustore/gpustore/pkg/readopts"
	"github.com/gpustore/gpustore/pkg/tenancy"
)

// DefaultTimeout bounds one remote read when SourceConfig.Timeout is 0 (the
// remote-read client needs a timeout: 0 would expire every request at once).
const DefaultTimeout = 2 * time.Minute

// SourceConfig configures how a query process reads the receivers.
type SourceConfig struct {
	// Client is the HTTP client configuration (TLS, basic auth, ...) used
	// towards every receiver.
	Client config_util.HTTPClientConfig
	// Scheme is "http" (the default when empty) or "https".
	Scheme string
	// Self is the ring instance ID of this process's own receiver, whose
	// data the caller already reads from disk; it is never asked, and
	// counts as answered. "" when the process runs no receiver.
	Self string
	// SelfRecovering reports whether Self is recovering the tenant's
	// crashed head (tenantdb.Manager.Recovering): its data on disk lacks
	// that head's samples, so it does not count as answered.
	SelfRecovering func(tenant string) bool
	// Timeout bounds each request to a receiver; 0 is DefaultTimeout.
	Timeout time.Duration
	// MaxLookback, when not 0, skips the receivers for queries ending
	// before now-MaxLookback: receivers hold only recent data, older data
	// is in the bucket.
	MaxLookback time.Duration
	// ShardSize, when set, is the shuffle shard a read of the tenant must
	// cover to find what was written since (limits.Overrides'
	// IngestionShardSizeSince: the largest shard size in force since; 0:
	// every receiver). Nil: every tenant is read from the whole ring.
	ShardSize func(tenant string, since time.Time) int
	// ShardLookback is how far back the receivers a tenant's shard held
	// are still read: those the shard had before a receiver joined the
	// ring (dskit's ShuffleShardWithLookback) or before its size changed.
	// It must cover what receivers hold that the bucket may not yet: their
	// heads (1.5 block durations) and the blocks not yet shipped.
	ShardLookback time.Duration
}

// Source reads a tenant's recent data from the ring's receivers, over
// Prometheus' remote read with streamed chunks (ReadHandler on each
// receiver). It implements query.Source.
//
// A read asks a read quorum of the ring, not every receiver: all healthy
// receivers but as many as the ring's MaxErrors tolerates (dskit's
// ring.DoUntilQuorum with request minimisation; with RF 3 and 3 receivers,
// 2 of them), and another one for each that fails. That answers
// completely because every acknowledged sample was written to a write
// quorum of the receivers then in its replica set (RF/2+1), more than the
// receivers left out. It holds however the ring changed since: a receiver
// that joined lately (tokens taken from others) or missed writes while it
// was down holds less, but the samples it lacks are on at least one other
// receiver that is read, since they still keep them (a leaving receiver
// ships its data to the bucket first, which is read too). Reading each
// series from a quorum of its current replica set only would not: after a
// receiver joins, restarts with fresh tokens or leaves, a series' current
// replicas need not be those that took its older samples (see
// docs/ring.md, Reads).
//
// Answers are held whole (a receiver that fails half-way must count as
// failed before anything is merged), as encoded chunks, and merged per
// series by replicaSet: chunks the replicas sent byte for byte are read
// once, never decoded here; only chunks that differ are merged sample by
// sample. More failures than MaxErrors fail the read, so a query never
// silently answers with missing data; a tolerated failure is a warning.
type Source struct {
	cfg    SourceConfig
	ring   ring.ReadRing
	logger *slog.Logger
	client *http.Client

	// served holds each receiver's local blocks per tenant as it last
	// reported them (LocalBlocksHeader), for the reads that leave it out
	// (see read).
	mtx    sync.Mutex
	served map[string]map[string][]ulid.ULID

	requests  *prometheus.CounterVec
	duration  prometheus.Histogram
	tolerated prometheus.Counter
	skipped   prometheus.Counter
	replicas  struct{ identical, merged prometheus.Counter }
	chunks    struct{ identical, merged prometheus.Counter }
}

// NewSource returns the receivers of r as a query source.
func NewSource(cfg SourceConfig, r ring.ReadRing, logger *slog.Logger, reg prometheus.Registerer) (*Source, error) {
	switch cfg.Scheme {
	case "":
		cfg.Scheme = "http"
	case "http", "https":
	default:
		return nil, fmt.Errorf("receivers: scheme %q: want http or https", cfg.Scheme)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.MaxLookback < 0 {
		return nil, fmt.Errorf("receivers: negative max lookback %s", cfg.MaxLookback)
	}
	if cfg.ShardSize != nil && cfg.ShardLookback <= 0 {
		return nil, fmt.Errorf("receivers: shuffle sharding needs a positive lookback, not %s", cfg.ShardLookback)
	}
	if err := cfg.Client.Validate(); err != nil {
		return nil, fmt.Errorf("receivers: http client: %w", err)
	}
	// Fail now rather than on the first query (unreadable TLS files, ...).
	hc, err := config_util.NewClientFromConfig(cfg.Client, "receivers")
	if err != nil {
		return nil, fmt.Errorf("receivers: http client: %w", err)
	}
	f := promauto.With(reg)
	replicas := f.NewCounterVec(prometheus.CounterOpts{
		Name: "gpustore_receivers_read_series_replicas_total",
		Help: "Answers of a series that several receivers sent: skipped whole as identical to another replica's chunks (identical), or of series some of whose chunks differed and were merged sample by sample (merged).",
	}, []string{"how"})
	chunks := f.NewCounterVec(prometheus.CounterOpts{
		Name: "gpustore_receivers_read_replica_chunks_total",
		Help: "Chunks of series that several receivers sent: dropped undecoded as identical to another replica's (identical), or decoded and merged sample by sample because the replicas' chunks differed (merged).",
	}, []string{"how"})
	s := &Source{
		cfg:    cfg,
		ring:   r,
		logger: logger,
		client: hc,
		served: map[string]map[string][]ulid.ULID{},
		requests: f.NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_receivers_read_requests_total",
			Help: "Remote reads sent to receivers, by status (ok, error).",
		}, []string{"status"}),
		duration: f.NewHistogram(prometheus.HistogramOpts{
			Name:    "gpustore_receivers_read_request_duration_seconds",
			Help:    "Duration of remote reads sent to receivers, including reading the whole answer.",
			Buckets: prometheus.DefBuckets,
		}),
		tolerated: f.NewCounter(prometheus.CounterOpts{
			Name: "gpustore_receivers_read_tolerated_failures_total",
			Help: "Receivers that failed a read the ring's replication tolerates (answered with a warning).",
		}),
		skipped: f.NewCounter(prometheus.CounterOpts{
			Name: "gpustore_receivers_read_skipped_total",
			Help: "Healthy receivers a read did not ask because a read quorum of the ring answered.",
		}),
	}
	s.replicas.identical = replicas.WithLabelValues("identical")
	s.replicas.merged = replicas.WithLabelValues("merged")
	s.chunks.identical = chunks.WithLabelValues("identical")
	s.chunks.merged = chunks.WithLabelValues("merged")
	// Both statuses exist from the start, so a rate of errors is 0, not
	// nothing, before the first failed read.
	s.requests.WithLabelValues("ok")
	s.requests.WithLabelValues("error")
	return s, nil
}

// Querier implements query.Source. The receivers hold raw data of their
// own: none of the request's options changes what they answer (the query
// path deduplicates replicas and chooses resolutions above them); each
// select tells opts.ServedBlocks which bucket blocks its answer covers. It
// is a no-op querier when the range ends before MaxLookback.
func (s *Source) Querier(tenant string, mint, maxt int64, opts readopts.ReadOptions) (downsample.Querier, error) {
	if s.tooOld(maxt) {
		return downsample.NoopQuerier(), nil
	}
	return &querier{s: s, tenant: tenant, mint: mint, maxt: maxt, served: opts.ServedBlocks}, nil
}

// ChunkQuerier implements query.Source: the series' chunks as the
// receivers sent them, those that differed between replicas merged and
// encoded again.
func (s *Source) ChunkQuerier(tenant string, mint, maxt int64, _ readopts.ReadOptions) (storage.ChunkQuerier, error) {
	if s.tooOld(maxt) {
		return storage.NoopChunkedQuerier(), nil
	}
	return chunkQuerier{&querier{s: s, tenant: tenant, mint: mint, maxt: maxt}}, nil
}

// HasDownsampled implements query.Source: receivers hold raw data only.
func (s *Source) HasDownsampled(string) bool { return false }

func (s *Source) tooOld(maxt int64) bool {
	return s.cfg.MaxLookback > 0 && maxt < time.Now().Add(-s.cfg.MaxLookback).UnixMilli()
}

type querier struct {
	downsample.NoFolding // receivers hold raw data only
	s                    *Source
	tenant               string
	mint, maxt           int64
	served               func([]ulid.ULID) // readopts.ReadOptions.ServedBlocks (nil: none)
}

// report tells the query path which bucket blocks a select's answers
// cover: the blocks the receivers that answered hold on their disks, and
// those of receivers left out of a read quorum, whose samples are on the
// receivers read.
func (q *querier) report(ids []ulid.ULID) {
	if q.served != nil && len(ids) > 0 {
		q.served(ids)
	}
}

// Select reads the matching series from a read quorum of the receivers
// and merges them; the set is sorted whatever the caller asked. hints
// Func "series" (Prometheus' series API) reads the series without their
// samples. The bucket blocks the answers cover are reported (report)
// before it returns.
func (q *querier) Select(ctx context.Context, _ bool, hints *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
	set, err := q.selectSet(ctx, hints, ms)
	if err != nil {
		return storage.ErrSeriesSet(err)
	}
	return set
}

func (q *querier) selectSet(ctx context.Context, hints *storage.SelectHints, ms []*labels.Matcher) (ringSeriesSet, error) {
	if sl, ok := query.SliceOf(ctx); ok && (hints == nil || hints.Func != "series") {
		return q.sharedSelect(ctx, sl, hints, ms)
	}
	res, err := q.read(ctx, q.mint, q.maxt, hints, ms)
	if err != nil {
		return nil, err
	}
	q.report(res.served)
	return newReplicaSet(res.answers, newLabelDecoder(res.syms), q.mint, q.maxt, res.warnings, q.s.count), nil
}

// mergedSelect is a select read and merged once for all the slices of a
// sliced range query, each of which cuts its own range.
type mergedSelect struct {
	series     []*ringSeries
	served     []ulid.ULID
	warnings   annotations.Annotations
	mint, maxt int64
}

// sharedSelect reads the select in a slice of a sliced range query
// (query.SliceOf): once for every slice, over what the whole query's
// select reads, merged once. A receiver's work for a select is mostly per
// series (its index, its chunks' headers), and so is the merge's (labels,
// comparing replicas' chunks): per slice, both would be repeated.
func (q *querier) sharedSelect(ctx context.Context, sl query.Slice, hints *storage.SelectHints, ms []*labels.Matcher) (ringSeriesSet, error) {
	mint, maxt := sl.Widen(q.mint, q.maxt)
	var wide *storage.SelectHints
	key := fmt.Sprint(q.tenant, "\xff", ms)
	if hints != nil {
		h := *hints
		h.Start, h.End = sl.Widen(h.Start, h.End)
		wide = &h
		key = fmt.Sprint(key, "\xff", h.Func, "\xff", h.Step, "\xff", h.Range, "\xff", h.Grouping, "\xff", h.By)
	}
	v, err := sl.Share(ctx, key, func() (any, error) {
		res, err := q.read(ctx, mint, maxt, wide, ms)
		if err != nil {
			return nil, err
		}
		set := newReplicaSet(res.answers, newLabelDecoder(res.syms), mint, maxt, nil, q.s.count)
		m := &mergedSelect{served: res.served, warnings: res.warnings, mint: mint, maxt: maxt}
		for set.Next() {
			m.series = append(m.series, set.cur)
		}
		return m, set.Err()
	})
	if err != nil {
		return nil, err
	}
	m := v.(*mergedSelect)
	if m.mint > q.mint || m.maxt < q.maxt {
		// Another slice's read does not cover this one's range (a
		// subquery's steps align differently): read it alone.
		res, err := q.read(ctx, q.mint, q.maxt, hints, ms)
		if err != nil {
			return nil, err
		}
		q.report(res.served)
		return newReplicaSet(res.answers, newLabelDecoder(res.syms), q.mint, q.maxt, res.warnings, q.s.count), nil
	}
	q.report(m.served)
	return &sliceSet{m: m, i: -1, mint: q.mint, maxt: q.maxt}, nil
}

// read reads the select over [mint, maxt] from a read quorum.
func (q *querier) read(ctx context.Context, mint, maxt int64, hints *storage.SelectHints, ms []*labels.Matcher) (readResult, error) {
	pq, err := remote.ToQuery(mint, maxt, ms, hints)
	if err != nil {
		return readResult{}, err
	}
	syms := labels.NewSymbolTable() // the select's labels share one
	res, err := q.s.read(ctx, q.tenant, pq, hints != nil && hints.Func == "series", syms)
	res.syms = syms
	if err == nil {
		err = countChunkBytes(ctx, res.answers)
	}
	return res, err
}

// countChunkBytes reports the chunk bytes the receivers sent (every
// replica's: what the query fetched) to the query's limiter
// (max_fetched_chunk_bytes_per_query).
func countChunkBytes(ctx context.Context, answers []*answer) error {
	l := querylimit.From(ctx)
	if l == nil {
		return nil
	}
	n := 0
	for _, a := range answers {
		for _, c := range a.chunks {
			n += len(c.data)
		}
	}
	return l.AddChunkBytes(n)
}

// count adds one select's replica statistics to the metrics.
func (s *Source) count(st replicaStats) {
	s.replicas.identical.Add(float64(st.identicalSeries))
	s.replicas.merged.Add(float64(st.mergedSeries))
	s.chunks.identical.Add(float64(st.identicalChunks))
	s.chunks.merged.Add(float64(st.mergedChunks))
}

// LabelValues and LabelNames: remote read has no label API, so they select
// the series the matchers match in [mint, maxt] with hints Func "series"
// and collect their labels. Each receiver answers without reading samples,
// but every matching series' label set crosses the network once per
// replica read: a label call without matchers lists every series of the
// tenant, far more work than a TSDB's index lookup. Receivers hold only
// recent data, which bounds it.
func (q *querier) LabelValues(ctx context.Context, name string, hints *storage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	// Only series that have the label can contribute a value.
	ms = append(slices.Clip(ms), labels.MustNewMatcher(labels.MatchNotEqual, name, ""))
	return q.collect(ctx, hints, ms, func(ls labels.Labels, add func(string)) { add(ls.Get(name)) })
}

func (q *querier) LabelNames(ctx context.Context, hints *storage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	if len(ms) == 0 {
		ms = []*labels.Matcher{labels.MustNewMatcher(labels.MatchRegexp, model.MetricNameLabel, ".+")}
	}
	return q.collect(ctx, hints, ms, func(ls labels.Labels, add func(string)) {
		ls.Range(func(l labels.Label) { add(l.Name) })
	})
}

// collect returns the sorted, unique strings pick takes from each series.
func (q *querier) collect(ctx context.Context, hints *storage.LabelHints, ms []*labels.Matcher, pick func(labels.Labels, func(string))) ([]string, annotations.Annotations, error) {
	ss := q.Select(ctx, true, &storage.SelectHints{Start: q.mint, End: q.maxt, Func: "series"}, ms...)
	seen := map[string]struct{}{}
	add := func(v string) { seen[v] = struct{}{} }
	for ss.Next() {
		pick(ss.At().Labels(), add)
	}
	if err := ss.Err(); err != nil {
		return nil, ss.Warnings(), err
	}
	out := make([]string, 0, len(seen))
	for v := range seen {
		out = append(out, v)
	}
	slices.Sort(out)
	if hints != nil && hints.Limit > 0 && len(out) > hints.Limit {
		out = out[:hints.Limit]
	}
	return out, ss.Warnings(), nil
}

func (*querier) Close() error { return nil }

type chunkQuerier struct{ q *querier }

func (c chunkQuerier) Select(ctx context.Context, _ bool, hints *storage.SelectHints, ms ...*labels.Matcher) storage.ChunkSeriesSet {
	set, err := c.q.selectSet(ctx, hints, ms)
	if err != nil {
		return storage.ErrChunkSeriesSet(err)
	}
	return chunkSet{set}
}

func (c chunkQuerier) LabelValues(ctx context.Context, name string, hints *storage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return c.q.LabelValues(ctx, name, hints, ms...)
}

func (c chunkQuerier) LabelNames(ctx context.Context, hints *storage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return c.q.LabelNames(ctx, hints, ms...)
}

func (chunkQuerier) Close() error { return nil }

// failure is a receiver that did not answer.
type failure struct {
	inst ring.InstanceDesc
	err  error
}

// readResult is what a read quorum of the receivers answered.
type readResult struct {
	answers  []*answer
	warnings annotations.Annotations
	// served are the bucket blocks whose samples need not be read from
	// the bucket: those the receivers that answered hold on their disks,
	// and those the receivers left out last reported (their samples are
	// on the receivers read, as every other sample of theirs).
	served []ulid.ULID
	syms   *labels.SymbolTable // the answers' labels'
}

// read sends pq to a read quorum of the receivers (see Source), never to
// Self, whose data the caller reads from disk, and returns their answers,
// or an error when more of them failed than the replication tolerates.
func (s *Source) read(ctx context.Context, tenant string, pq *prompb.Query, seriesOnly bool, syms *labels.SymbolTable) (readResult, error) {
	rs, err := s.ringOf(tenant).GetReplicationSetForOperation(ring.Read)
	if err != nil {
		return readResult{}, fmt.Errorf("receivers: ring: %w (%w)", err, query.ErrUnavailable)
	}
	if len(rs.Instances) == 0 {
		return readResult{}, fmt.Errorf("receivers: no receiver in the ring (%w)", query.ErrUnavailable)
	}
	s.forgetServed(rs.Instances)
	// Self answers (from disk) without being asked: one fewer to ask,
	// and as many may fail. Not while it recovers the tenant's crashed
	// head: then it is asked, refuses, and counts as failed.
	if s.cfg.Self != "" && (s.cfg.SelfRecovering == nil || !s.cfg.SelfRecovering(tenant)) {
		rs.Instances = slices.DeleteFunc(slices.Clone(rs.Instances), func(i ring.InstanceDesc) bool { return i.Id == s.cfg.Self })
	}
	if len(rs.Instances) == 0 {
		return readResult{}, nil
	}
	body, err := readRequest(pq, seriesOnly)
	if err != nil {
		return readResult{}, err
	}
	var (
		mtx    sync.Mutex
		failed []failure
	)
	type fetched struct {
		inst   string
		answer *answer
		blocks []ulid.ULID
	}
	got, err := ring.DoUntilQuorum(ctx, rs, ring.DoUntilQuorumConfig{MinimizeRequests: true},
		func(ctx context.Context, inst *ring.InstanceDesc) (fetched, error) {
			a, blocks, err := s.fetch(ctx, *inst, tenant, body, seriesOnly, syms)
			if err != nil {
				mtx.Lock()
				failed = append(failed, failure{*inst, err})
				mtx.Unlock()
			}
			return fetched{inst.Id, a, blocks}, err
		}, func(fetched) {})
	mtx.Lock()
	defer mtx.Unlock()
	if err != nil {
		if ctx.Err() != nil || len(failed) == 0 {
			return readResult{}, err
		}
		return readResult{}, &readError{rs: rs, failed: failed}
	}
	var res readResult
	answered := map[string]bool{}
	for _, f := range got {
		answered[f.inst] = true
		res.answers = append(res.answers, f.answer)
		res.served = append(res.served, f.blocks...)
		if !seriesOnly {
			s.remember(f.inst, tenant, f.blocks)
		}
	}
	for _, inst := range rs.Instances {
		if !answered[inst.Id] && !slices.ContainsFunc(failed, func(f failure) bool { return f.inst.Id == inst.Id }) {
			s.skipped.Inc()
			res.served = append(res.served, s.lastServed(inst.Id, tenant)...)
		}
	}
	for _, f := range failed {
		s.tolerated.Inc()
		// Debug: a receiver that is down fails every read until the ring
		// drops it; the counter and the query's warnings say it already.
		s.logger.Debug("receiver unavailable for a read, answering from its replicas", "receiver", f.inst.Id, "addr", f.inst.Addr, "err", f.err)
		res.warnings.Add(fmt.Errorf("receiver %s (%s) unavailable: %w", f.inst.Id, f.inst.Addr, f.err))
	}
	return res, nil
}

// ringOf is the part of the ring that can hold the tenant's recent data:
// with shuffle sharding, the receivers of its shard now and those it had
// within the lookback (dskit's ShuffleShardWithLookback over the widest
// shard size in force since; a receiver that joined within the lookback is
// read beside the one it took the tenant's series from), else the whole
// ring. A read quorum of that set finds every acknowledged sample: each was
// written to a write quorum of its replicas, all of them in the set.
func (s *Source) ringOf(tenant string) ring.ReadRing {
	if s.cfg.ShardSize == nil {
		return s.ring
	}
	now := time.Now()
	n := s.cfg.ShardSize(tenant, now.Add(-s.cfg.ShardLookback))
	if n <= 0 {
		return s.ring
	}
	return s.ring.ShuffleShardWithLookback(tenant, max(n, s.ring.ReplicationFactor()), s.cfg.ShardLookback, now)
}

// remember keeps the local blocks a receiver reported for a tenant, for
// the reads that leave it out.
func (s *Source) remember(inst, tenant string, blocks []ulid.ULID) {
	s.mtx.Lock()
	defer s.mtx.Unlock()
	byTenant := s.served[inst]
	if byTenant == nil {
		byTenant = map[string][]ulid.ULID{}
		s.served[inst] = byTenant
	}
	byTenant[tenant] = blocks
}

func (s *Source) lastServed(inst, tenant string) []ulid.ULID {
	s.mtx.Lock()
	defer s.mtx.Unlock()
	return s.served[inst][tenant]
}

// forgetServed drops the blocks of receivers no longer in the ring.
func (s *Source) forgetServed(insts []ring.InstanceDesc) {
	s.mtx.Lock()
	defer s.mtx.Unlock()
	if len(s.served) <= len(insts) {
		return
	}
	for id := range s.served {
		if !slices.ContainsFunc(insts, func(i ring.InstanceDesc) bool { return i.Id == id }) {
			delete(s.served, id)
		}
	}
}

// readError is a read that more receivers failed than the replication
// tolerates. It unwraps to each receiver's error, so a deadline is still
// recognised (errors.Is(err, context.DeadlineExceeded)).
type readError struct {
	rs     ring.ReplicationSet
	failed []failure
}

// Is makes the query API answer 503 (query.ErrUnavailable).
func (e *readError) Is(target error) bool { return target == query.ErrUnavailable }

func (e *readError) Error() string {
	var b strings.Builder
	if e.rs.ZoneAwarenessEnabled {
		fmt.Fprintf(&b, "receivers: %d of %d receivers failed, in more zones than the %d that may", len(e.failed), len(e.rs.Instances), e.rs.MaxUnavailableZones)
	} else {
		fmt.Fprintf(&b, "receivers: %d of %d receivers failed, at most %d may", len(e.failed), len(e.rs.Instances), e.rs.MaxErrors)
	}
	for i, f := range e.failed {
		sep := ": "
		if i > 0 {
			sep = "; "
		}
		fmt.Fprintf(&b, "%sreceiver %s (%s): %v", sep, f.inst.Id, f.inst.Addr, f.err)
	}
	return b.String()
}

func (e *readError) Unwrap() []error {
	errs := make([]error, len(e.failed))
	for i, f := range e.failed {
		errs[i] = f.err
	}
	return errs
}

// readRequest encodes pq as a remote-read request body: streamed XOR
// chunks, or for a series-only select the SAMPLES response type, for which
// a receiver's TSDB answers the series without reading a chunk (its chunk
// querier ignores the hint and would send every sample).
func readRequest(pq *prompb.Query, seriesOnly bool) ([]byte, error) {
	rt := prompb.ReadRequest_STREAMED_XOR_CHUNKS
	if seriesOnly {
		rt = prompb.ReadRequest_SAMPLES
	}
	req := &prompb.ReadRequest{Queries: []*prompb.Query{pq}, AcceptedResponseTypes: []prompb.ReadRequest_ResponseType{rt}}
	b, err := req.Marshal()
	if err != nil {
		return nil, fmt.Errorf("receivers: encode read request: %w", err)
	}
	return snappy.Encode(nil, b), nil
}

// Limits of a series-only (SAMPLES) answer, which comes in one piece.
const (
	maxSamplesAnswerBytes   = 256 << 20
	maxSamplesAnswerDecoded = 1 << 30
)

// fetch reads one receiver's answer whole, with the local blocks it
// reported (LocalBlocksHeader): a receiver that fails half-way through its
// answer must count as failed before anything is merged, or the merge
// would already have passed on part of its data. The buffered answer is
// the receiver's encoded chunks (about 1-2 bytes a sample), which
// receivers' few recent hours keep small.
func (s *Source) fetch(ctx context.Context, inst ring.InstanceDesc, tenant string, body []byte, seriesOnly bool, syms *labels.SymbolTable) (*answer, []ulid.ULID, error) {
	start := time.Now()
	a, blocks, err := func() (*answer, []ulid.ULID, error) {
		ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.cfg.Scheme+"://"+inst.Addr+ReadPath, bytes.NewReader(body))
		if err != nil {
			return nil, nil, err
		}
		req.Header.Set("Content-Encoding", "snappy")
		req.Header.Set("Content-Type", "application/x-protobuf")
		req.Header.Set("X-Prometheus-Remote-Read-Version", "0.1.0")
		req.Header.Set(tenancy.OrgIDHeader, tenant)
		resp, err := s.client.Do(req)
		if err != nil {
			return nil, nil, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
			return nil, nil, fmt.Errorf("receiver answered %s: %s", resp.Status, strings.TrimSpace(string(msg)))
		}
		if seriesOnly {
			a, err := readSamples(resp, syms)
			return a, nil, err
		}
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/x-streamed-protobuf; proto=prometheus.ChunkedReadResponse") {
			return nil, nil, fmt.Errorf("receiver answered content type %q, not streamed chunks", ct)
		}
		a, err := readChunkedAnswer(resp.Body)
		if err != nil {
			return nil, nil, fmt.Errorf("read streamed answer: %w", err)
		}
		return a, parseBlocks(resp.Header.Get(LocalBlocksHeader)), nil
	}()
	s.duration.Observe(time.Since(start).Seconds())
	status := "ok"
	if err != nil {
		status = "error"
	}
	s.requests.WithLabelValues(status).Inc()
	return a, blocks, err
}

// readSamples reads a SAMPLES answer (snappy-compressed ReadResponse).
func readSamples(resp *http.Response, syms *labels.SymbolTable) (*answer, error) {
	compressed, err := io.ReadAll(io.LimitReader(resp.Body, maxSamplesAnswerBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read answer: %w", err)
	}
	if len(compressed) > maxSamplesAnswerBytes {
		return nil, fmt.Errorf("answer larger than %d bytes", maxSamplesAnswerBytes)
	}
	if n, err := snappy.DecodedLen(compressed); err != nil {
		return nil, fmt.Errorf("answer: %w", err)
	} else if n > maxSamplesAnswerDecoded {
		return nil, fmt.Errorf("answer of %d bytes decoded, more than %d", n, maxSamplesAnswerDecoded)
	}
	b, err := snappy.Decode(nil, compressed)
	if err != nil {
		return nil, fmt.Errorf("answer: %w", err)
	}
	dec := newLabelDecoder(syms)
	a, err := readSamplesAnswer(b, dec)
	if err == nil {
		err = dec.err
	}
	return a, err
}

// parseBlocks parses LocalBlocksHeader; a malformed entry is left out
// (the bucket then reads that block too: more work, nothing lost).
func parseBlocks(h string) []ulid.ULID {
	if h == "" {
		return nil
	}
	var out []ulid.ULID
	for f := range strings.SplitSeq(h, ",") {
		if id, err := ulid.ParseStrict(strings.TrimSpace(f)); err == nil {
			out = append(out, id)
		}
	}
	return out
}
