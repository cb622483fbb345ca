package receivers

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/grafana/dskit/ring"
	"github.com/grafana/dskit/user"
	"github.com/oklog/ulid/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	config_util "github.com/prometheus/common/config"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/config"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/storage/remote"
	"github.com/prometheus/prometheus/util/annotations"

	"github.com/gpustore/gpustore/pkg/query"
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
	// Timeout bounds each request to a receiver; 0 is DefaultTimeout.
	Timeout time.Duration
	// MaxLookback, when not 0, skips the receivers for queries ending
	// before now-MaxLookback: receivers hold only recent data, older data
	// is in the bucket.
	MaxLookback time.Duration
}

// Source reads a tenant's data from every receiver of the ring, over remote
// read (ReadHandler on each receiver). It implements query.Source.
//
// Each series lives on replication-factor receivers, so every read asks all
// receivers the ring returns for reads and merges the answers: a series
// that several receivers hold comes out once, with the union of their
// samples (identical timestamps once). As many receivers as the ring
// tolerates (its MaxErrors, or MaxUnavailableZones with zone awareness) may
// fail: the answer, complete by the write quorum, carries a warning per
// failed receiver; more failures fail the read, so a query never silently
// answers with missing data.
type Source struct {
	cfg    SourceConfig
	ring   ring.ReadRing
	logger *slog.Logger

	mtx        sync.Mutex
	clients    map[string]*instanceClients // by address
	httpClient *http.Client                // plain requests (Tenants)

	requests  *prometheus.CounterVec
	duration  prometheus.Histogram
	tolerated prometheus.Counter
	replicas  struct{ identical, merged prometheus.Counter }
}

// instanceClients are the remote-read clients of one receiver.
type instanceClients struct {
	// samples asks for streamed XOR chunks (falling back to samples).
	samples *remote.Client
	// series asks for the SAMPLES response type only: with hints Func
	// "series" a receiver's TSDB then answers the series without reading
	// any chunk (its chunk querier, used for streamed chunks, ignores the
	// hint and would send every sample).
	series *remote.Client
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
		Help: "Answers of a series that several receivers held: read once as identical to another replica's chunks (identical), or merged sample by sample (merged).",
	}, []string{"how"})
	s := &Source{
		cfg:        cfg,
		ring:       r,
		logger:     logger,
		clients:    map[string]*instanceClients{},
		httpClient: hc,
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
	}
	s.replicas.identical = replicas.WithLabelValues("identical")
	s.replicas.merged = replicas.WithLabelValues("merged")
	// Both statuses exist from the start, so a rate of errors is 0, not
	// nothing, before the first failed read.
	s.requests.WithLabelValues("ok")
	s.requests.WithLabelValues("error")
	return s, nil
}

// Querier implements query.Source. local is about bucket blocks and means
// nothing here. It returns nil when the range ends before MaxLookback.
func (s *Source) Querier(tenant string, mint, maxt int64, _ func(ulid.ULID) bool) storage.Querier {
	if s.tooOld(maxt) {
		return nil
	}
	return &querier{s: s, tenant: tenant, mint: mint, maxt: maxt}
}

// ChunkQuerier implements query.Source. The remote-read client decodes the
// receivers' chunks into samples (which the merge needs anyway), so the
// merged series are encoded again.
func (s *Source) ChunkQuerier(tenant string, mint, maxt int64, _ func(ulid.ULID) bool) storage.ChunkQuerier {
	if s.tooOld(maxt) {
		return nil
	}
	return chunkQuerier{&querier{s: s, tenant: tenant, mint: mint, maxt: maxt}}
}

func (s *Source) tooOld(maxt int64) bool {
	return s.cfg.MaxLookback > 0 && maxt < time.Now().Add(-s.cfg.MaxLookback).UnixMilli()
}

type querier struct {
	s          *Source
	tenant     string
	mint, maxt int64
}

// Select reads the matching series from every receiver and merges them.
// hints Func "series" (Prometheus' series API) reads the series without
// their samples.
func (q *querier) Select(ctx context.Context, _ bool, hints *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
	pq, err := remote.ToQuery(q.mint, q.maxt, ms, hints)
	if err != nil {
		return storage.ErrSeriesSet(err)
	}
	sets, ws, err := q.s.read(ctx, q.tenant, pq, hints != nil && hints.Func == "series")
	if err != nil {
		return storage.ErrSeriesSet(err)
	}
	// Every set is sorted (see fetch), so the merge is always possible and
	// the result is sorted whatever the caller asked.
	return warningSet{storage.NewMergeSeriesSet(sets, 0, q.s.mergeReplicas), ws}
}

// LabelValues and LabelNames: remote read has no label API, so they select
// the series the matchers match in [mint, maxt] with hints Func "series"
// and collect their labels. Each receiver answers without reading samples,
// but every matching series' label set crosses the network once per
// replica: a label call without matchers lists every series of the tenant
// on every receiver, far more work than a TSDB's index lookup. Receivers
// hold only recent data, which bounds it.
func (q *querier) LabelValues(ctx context.Context, name string, hints *storage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	// Only series that have the label can contribute a value.
	ms = append(slices.Clip(ms), labels.MustNewMatcher(labels.MatchNotEqual, name, ""))
	return q.collect(ctx, hints, ms, func(ls labels.Labels, add func(string)) { add(ls.Get(name)) })
}

func (q *querier) LabelNames(ctx context.Context, hints *storage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	if len(ms) == 0 {
		ms = []*labels.Matcher{labels.MustNewMatcher(labels.MatchRegexp, labels.MetricName, ".+")}
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

func (c chunkQuerier) Select(ctx context.Context, sortSeries bool, hints *storage.SelectHints, ms ...*labels.Matcher) storage.ChunkSeriesSet {
	return storage.NewSeriesSetToChunkSet(c.q.Select(ctx, sortSeries, hints, ms...))
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

// read sends pq to every receiver the ring returns for reads (but Self),
// concurrently, and returns their answers, or an error when more of them
// failed than the replication tolerates.
func (s *Source) read(ctx context.Context, tenant string, pq *prompb.Query, seriesOnly bool) ([]storage.SeriesSet, annotations.Annotations, error) {
	rs, err := s.ring.GetReplicationSetForOperation(ring.Read)
	if err != nil {
		return nil, nil, fmt.Errorf("receivers: ring: %w (%w)", err, query.ErrUnavailable)
	}
	if len(rs.Instances) == 0 {
		return nil, nil, fmt.Errorf("receivers: no receiver in the ring (%w)", query.ErrUnavailable)
	}
	s.pruneClients(rs.Instances)
	ctx = user.InjectOrgID(ctx, tenant) // the tenant header, see tenantHeader

	sets := make([]storage.SeriesSet, len(rs.Instances))
	errs := make([]error, len(rs.Instances))
	var wg sync.WaitGroup
	for i, inst := range rs.Instances {
		if s.cfg.Self != "" && inst.Id == s.cfg.Self {
			continue // read from disk by the caller: an answer
		}
		wg.Go(func() { sets[i], errs[i] = s.fetch(ctx, inst, pq, seriesOnly) })
	}
	wg.Wait()

	var failed []failure
	var answered []storage.SeriesSet
	for i, inst := range rs.Instances {
		if errs[i] != nil {
			failed = append(failed, failure{inst, errs[i]})
		} else if sets[i] != nil {
			answered = append(answered, sets[i])
		}
	}
	if len(failed) == 0 {
		return answered, nil, nil
	}
	if !tolerable(rs, failed) {
		return nil, nil, &readError{rs: rs, failed: failed}
	}
	var ws annotations.Annotations
	for _, f := range failed {
		s.tolerated.Inc()
		// Debug: a receiver that is down fails every read until the ring
		// drops it; the counter and the query's warnings say it already.
		s.logger.Debug("receiver unavailable for a read, answering from its replicas", "receiver", f.inst.Id, "addr", f.inst.Addr, "err", f.err)
		ws.Add(fmt.Errorf("receiver %s (%s) unavailable: %w", f.inst.Id, f.inst.Addr, f.err))
	}
	return answered, ws, nil
}

// tolerable says whether the data is complete despite the failed receivers:
// the ring's read replication set says how many instances (or, with zone
// awareness, zones) may fail while every sample acknowledged by a write
// quorum is still on an instance that answered.
func tolerable(rs ring.ReplicationSet, failed []failure) bool {
	if !rs.ZoneAwarenessEnabled {
		return len(failed) <= rs.MaxErrors
	}
	zones := map[string]struct{}{}
	for _, f := range failed {
		zones[f.inst.Zone] = struct{}{}
	}
	return len(zones) <= rs.MaxUnavailableZones
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

// fetch reads pq from one receiver, whole: a receiver that fails half-way
// through its answer must count as failed before anything is merged, or
// the merge would already have passed on part of its data. The buffered
// answer is the receiver's encoded chunks (about 1-2 bytes a sample), which
// receivers' few recent hours keep small.
func (s *Source) fetch(ctx context.Context, inst ring.InstanceDesc, pq *prompb.Query, seriesOnly bool) (storage.SeriesSet, error) {
	start := time.Now()
	set, err := func() (storage.SeriesSet, error) {
		c, err := s.clientsOf(inst)
		if err != nil {
			return nil, err
		}
		rc := c.samples
		if seriesOnly {
			rc = c.series
		}
		ss, err := rc.Read(ctx, pq, true)
		if err != nil {
			return nil, err
		}
		return drain(ss)
	}()
	s.duration.Observe(time.Since(start).Seconds())
	status := "ok"
	if err != nil {
		status = "error"
	}
	s.requests.WithLabelValues(status).Inc()
	return set, err
}

// drain reads ss into memory. A streamed answer splits a series with many
// chunks over several frames, which arrive as consecutive series with the
// same labels: they are joined here into one receivedSeries, as the merge
// expects each series once per set.
func drain(ss storage.SeriesSet) (storage.SeriesSet, error) {
	var (
		out []storage.Series
		cur *receivedSeries
	)
	for ss.Next() {
		s := ss.At()
		lset := s.Labels()
		if cur != nil && labels.Equal(cur.lset, lset) {
			cur.parts = append(cur.parts, s)
			continue
		}
		cur = &receivedSeries{lset: lset, parts: []storage.Series{s}}
		out = append(out, cur)
	}
	if err := ss.Err(); err != nil {
		return nil, err
	}
	return &listSet{series: out, i: -1, ws: ss.Warnings()}, nil
}

// clientsOf returns the cached clients of inst's address, creating them on
// first use.
func (s *Source) clientsOf(inst ring.InstanceDesc) (*instanceClients, error) {
	s.mtx.Lock()
	defer s.mtx.Unlock()
	if c, ok := s.clients[inst.Addr]; ok {
		return c, nil
	}
	u, err := url.Parse(s.cfg.Scheme + "://" + inst.Addr + ReadPath)
	if err != nil {
		return nil, fmt.Errorf("receiver address %q: %w", inst.Addr, err)
	}
	c := &instanceClients{}
	if c.samples, err = s.newClient(inst.Id, u, nil); err != nil {
		return nil, err
	}
	if c.series, err = s.newClient(inst.Id, u, []prompb.ReadRequest_ResponseType{prompb.ReadRequest_SAMPLES}); err != nil {
		return nil, err
	}
	s.clients[inst.Addr] = c
	return c, nil
}

func (s *Source) newClient(name string, u *url.URL, types []prompb.ReadRequest_ResponseType) (*remote.Client, error) {
	rc, err := remote.NewReadClient(name, &remote.ClientConfig{
		URL:                   &config_util.URL{URL: u},
		Timeout:               model.Duration(s.cfg.Timeout),
		HTTPClientConfig:      s.cfg.Client,
		ChunkedReadLimit:      config.DefaultChunkedReadLimit,
		AcceptedResponseTypes: types, // nil: streamed chunks, else samples
	})
	if err != nil {
		return nil, fmt.Errorf("remote-read client of %s: %w", u, err)
	}
	c, ok := rc.(*remote.Client)
	if !ok {
		return nil, fmt.Errorf("remote-read client of %s: unexpected type %T", u, rc)
	}
	// The client's headers are fixed at creation; the tenant is per read.
	c.Client.Transport = tenantHeader{c.Client.Transport}
	return c, nil
}

// pruneClients drops the clients of addresses no longer in the ring (pods
// that were replaced), so the cache does not grow with every address a
// receiver ever had.
func (s *Source) pruneClients(insts []ring.InstanceDesc) {
	s.mtx.Lock()
	defer s.mtx.Unlock()
	if len(s.clients) <= len(insts) {
		return // nothing to prune in the usual case
	}
	for addr, c := range s.clients {
		if !slices.ContainsFunc(insts, func(i ring.InstanceDesc) bool { return i.Addr == addr }) {
			c.samples.Client.CloseIdleConnections()
			c.series.Client.CloseIdleConnections()
			delete(s.clients, addr)
		}
	}
}

// tenantHeader sets X-Scope-OrgID to the tenant of the request's context.
type tenantHeader struct{ next http.RoundTripper }

func (t tenantHeader) RoundTrip(r *http.Request) (*http.Response, error) {
	id, err := user.ExtractOrgID(r.Context())
	if err != nil {
		return nil, err
	}
	r = r.Clone(r.Context()) // a RoundTripper must not change its request
	r.Header.Set(tenancy.OrgIDHeader, id)
	return t.next.RoundTrip(r)
}

// listSet is a SeriesSet over series in memory.
type listSet struct {
	series []storage.Series
	i      int
	ws     annotations.Annotations
}

func (l *listSet) Next() bool                        { l.i++; return l.i < len(l.series) }
func (l *listSet) At() storage.Series                { return l.series[l.i] }
func (*listSet) Err() error                          { return nil }
func (l *listSet) Warnings() annotations.Annotations { return l.ws }

// warningSet adds the read's warnings (tolerated failures) to a set.
type warningSet struct {
	storage.SeriesSet
	ws annotations.Annotations
}

func (w warningSet) Warnings() annotations.Annotations {
	if len(w.ws) == 0 {
		return w.SeriesSet.Warnings()
	}
	ws := annotations.New().Merge(w.ws)
	return ws.Merge(w.SeriesSet.Warnings())
}
