package queryfrontend

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/grafana/dskit/tenant"
	"github.com/oklog/ulid/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	v1 "github.com/prometheus/prometheus/web/api/v1"
)

// Block is a block a tenant's queries read: its ID, time range and whether
// the local TSDB serves it (else the bucket store).
type Block struct {
	ID               ulid.ULID
	MinTime, MaxTime int64
	Local            bool
}

// Deps wires the frontend to the query role.
type Deps struct {
	Logger   *slog.Logger
	Registry prometheus.Registerer
	// MaxConcurrency bounds the pieces running at once over all requests:
	// the query role's query.max-concurrency (see New for why this cannot
	// deadlock with the engine's own bound).
	MaxConcurrency int
	// The query role's defaults, which the API applies to requests that do
	// not say: they are part of the cache key.
	LookbackDelta       time.Duration
	ReplicaLabels       []string
	MaxSourceResolution string
	// OutOfOrderWindow is the tenant's out-of-order window (pkg/limits);
	// nil: none.
	OutOfOrderWindow func(tenant string) time.Duration
	// Blocks lists the blocks the tenant's queries read now (local TSDB
	// and bucket store). A cached day is used only while the blocks
	// overlapping what it reads are the same. nil: the data layout never
	// changes (tests of the head only).
	Blocks func(tenant string) []Block
	// Generation names the tenant's deletions (pkg/deletion): it is part of
	// the cache key, so an answer cached before a series deletion is never
	// served after it. nil: no deletions.
	Generation func(tenant string) string
	// Timeout bounds a split request as a whole (query.timeout); 0: none.
	Timeout time.Duration
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// Frontend splits and caches query_range requests (see the package doc).
type Frontend struct {
	cfg   Config
	deps  Deps
	cache *cache // nil: results cache off
	slots chan struct{}

	requests      *prometheus.CounterVec
	pieces        prometheus.Counter
	hits          *prometheus.CounterVec
	misses        prometheus.Counter
	invalidations *prometheus.CounterVec
	evictions     prometheus.Counter
}

// New builds a frontend. Pieces take a slot of deps.MaxConcurrency before
// they enter the API, and a piece holds no engine slot while it waits for
// one, nor does the request that split: the engine's own bound
// (query.max-concurrency slots of its active query tracker) is only ever
// waited for by a piece that already holds a frontend slot, so the two
// bounds cannot wait on each other. Other queries (instant queries,
// rules, unsplit requests) take only the engine's slot.
func New(cfg Config, deps Deps) (*Frontend, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.MaxConcurrency <= 0 {
		return nil, errors.New("query frontend: max concurrency must be positive")
	}
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	if deps.Now == nil {
		deps.Now = time.Now
	}
	reg := promauto.With(deps.Registry)
	f := &Frontend{
		cfg: cfg, deps: deps, slots: make(chan struct{}, deps.MaxConcurrency),
		requests: reg.NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_query_frontend_requests_total",
			Help: "query_range requests seen by the frontend, by how they were served (split, or passed through and why).",
		}, []string{"served"}),
		pieces: reg.NewCounter(prometheus.CounterOpts{
			Name: "gpustore_query_frontend_pieces_total",
			Help: "Sub-requests the frontend sent to the query API (day pieces and the parts of them the cache lacked).",
		}),
		hits: reg.NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_query_frontend_cache_hits_total",
			Help: "Day pieces answered from the results cache, wholly (full) or in part (partial: only the missing steps computed).",
		}, []string{"kind"}),
		misses: reg.NewCounter(prometheus.CounterOpts{
			Name: "gpustore_query_frontend_cache_misses_total",
			Help: "Day pieces with nothing usable in the results cache.",
		}),
		invalidations: reg.NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_query_frontend_cache_invalidations_total",
			Help: "Cached day pieces found stale, by reason (blocks: the blocks under the day changed; out_of_order_window: the tenant's window grew).",
		}, []string{"reason"}),
		evictions: reg.NewCounter(prometheus.CounterOpts{
			Name: "gpustore_query_frontend_cache_evictions_total",
			Help: "Cached day pieces evicted to stay within query.results-cache.max-size-bytes.",
		}),
	}
	if cfg.ResultsCache.Enabled {
		f.cache = newCache(int64(cfg.ResultsCache.MaxSizeBytes), f.evictions.Inc)
		reg.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "gpustore_query_frontend_cache_bytes",
			Help: "Estimated memory held by the results cache.",
		}, func() float64 { b, _ := f.cache.usage(); return float64(b) })
		reg.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "gpustore_query_frontend_cache_entries",
			Help: "Day pieces in the results cache.",
		}, func() float64 { _, n := f.cache.usage(); return float64(n) })
	}
	return f, nil
}

// Wrap returns next with query_range requests served through the
// frontend; every other request goes to next unchanged. next must be the
// query API's chain after tenant resolution (the tenant is in the
// request's context).
func (f *Frontend) Wrap(next http.Handler) http.Handler {
	if !f.cfg.SplitByDay {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/query_range") {
			next.ServeHTTP(w, r)
			return
		}
		tenantID, err := tenant.TenantID(r.Context())
		if err != nil {
			next.ServeHTTP(w, r)
			return
		}
		req, why := f.parseRequest(r, tenantID)
		if why != passNone {
			f.requests.WithLabelValues("pass_" + string(why)).Inc()
			next.ServeHTTP(w, r)
			return
		}
		f.serve(w, r, next, req, tenantID)
	})
}

// job is one sub-request: the steps [start, end] of the request.
type job struct {
	start, end int64
	ans        answer
	rec        *recorder // the API's answer when it was not a success
	err        error
}

// plan is what one day piece needs: a cached part and the jobs for the
// rest, and what to store afterwards.
type plan struct {
	piece  piece
	key    string
	cached *answer // the cached steps within the piece, if any
	entry  *entry  // the usable cached entry, if any
	head   *job    // steps before the cached ones
	tail   *job    // steps after them (or the whole piece)
	layout uint64
	ooo    time.Duration
}

// minPiecesUncached is the fewest day pieces worth splitting a request into
// when no cache is filled (no-store, or the cache off): the pieces then pay
// only by running in parallel, and each runs the engine, opens the blocks
// and encodes JSON again. A day-crossing 24 h panel (two pieces, often very
// unequal) answered whole took 14.3-16.1 ms at p50 against 16.4-19.0 ms split;
// a 7-day one (eight pieces) 26.9-32.4 ms whole against 22.8-24.0 split.
const minPiecesUncached = 3

func (f *Frontend) serve(w http.ResponseWriter, r *http.Request, next http.Handler, req *rangeRequest, tenantID string) {
	pieces := split(req.start, req.end, req.step)
	useCache := f.cache != nil && !req.noStore
	if !useCache && len(pieces) < minPiecesUncached {
		f.requests.WithLabelValues("pass_few_pieces").Inc()
		next.ServeHTTP(w, r)
		return
	}
	f.requests.WithLabelValues("split").Inc()
	plans, jobs, cacheable := f.planPieces(req, tenantID, pieces, useCache)

	if err := f.runJobs(r, next, jobs); err != nil {
		// Not joinable (native histograms): the API answers it whole.
		f.requests.WithLabelValues("pass_" + string(passHistograms)).Inc()
		next.ServeHTTP(w, r)
		return
	}
	for _, j := range jobs { // the first failed piece's answer is the request's
		if j.rec != nil {
			j.rec.copyTo(w)
			return
		}
	}

	parts := make([]answer, 0, 3*len(plans))
	for _, pl := range plans {
		var day []answer
		if pl.head != nil {
			day = append(day, pl.head.ans)
		}
		if pl.cached != nil {
			day = append(day, *pl.cached)
		}
		if pl.tail != nil {
			day = append(day, pl.tail.ans)
		}
		parts = append(parts, day...)
		if useCache {
			f.store(pl, cacheable)
		}
	}
	body, err := encodeAnswer(join(parts...))
	if err != nil {
		f.deps.Logger.Error("encode joined query_range answer", "err", err)
		next.ServeHTTP(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}

// planPieces looks each piece up in the cache (when used) and returns what each
// needs computed, the jobs to run, and the last step that may be cached.
func (f *Frontend) planPieces(req *rangeRequest, tenantID string, pieces []piece, useCache bool) ([]*plan, []*job, int64) {
	var (
		ooo       time.Duration
		cacheable = int64(-1 << 62) // last step that may be cached
		blocks    []Block
		minT      int64
		maxT      int64
		gen       string
	)
	if useCache {
		if f.deps.Generation != nil {
			gen = "gen=" + f.deps.Generation(tenantID) + "&"
		}
		if f.deps.OutOfOrderWindow != nil {
			ooo = f.deps.OutOfOrderWindow(tenantID)
		}
		limit := f.deps.Now().Add(-max(time.Duration(f.cfg.ResultsCache.MaxFreshness), ooo)).UnixMilli()
		cacheable = limit - mod(limit-req.start, req.step)
		if f.deps.Blocks != nil {
			blocks = f.deps.Blocks(tenantID)
		}
		minT, maxT = readRange(req)
	}

	plans := make([]*plan, len(pieces))
	var jobs []*job
	for i, p := range pieces {
		pl := &plan{piece: p}
		plans[i] = pl
		if !useCache {
			pl.tail = &job{start: p.start, end: p.end}
			jobs = append(jobs, pl.tail)
			continue
		}
		pl.key = req.base + gen + "day=" + strconv.FormatInt(p.day, 10)
		pl.ooo = ooo
		pl.layout = layout(blocks, p.day*dayMs+minT, (p.day+1)*dayMs+maxT)
		if e := f.cache.get(pl.key); e != nil {
			switch {
			case e.layout != pl.layout:
				f.invalidations.WithLabelValues("blocks").Inc()
				f.cache.drop(pl.key)
			case e.oooWindow < ooo:
				f.invalidations.WithLabelValues("out_of_order_window").Inc()
				f.cache.drop(pl.key)
			case p.start <= e.end+req.step && p.end >= e.start-req.step: // overlaps or adjoins the cached steps
				pl.entry = e
			}
		}
		e := pl.entry
		if e == nil {
			f.misses.Inc()
			pl.tail = &job{start: p.start, end: p.end}
			jobs = append(jobs, pl.tail)
			continue
		}
		if from, to := max(p.start, e.start), min(p.end, e.end); from <= to {
			c := cut(e.answer, from, to)
			pl.cached = &c
		}
		if p.start < e.start {
			pl.head = &job{start: p.start, end: min(p.end, e.start-req.step)}
			jobs = append(jobs, pl.head)
		}
		if p.end > e.end {
			pl.tail = &job{start: max(p.start, e.end+req.step), end: p.end}
			jobs = append(jobs, pl.tail)
		}
		if pl.head == nil && pl.tail == nil {
			f.hits.WithLabelValues("full").Inc()
		} else {
			f.hits.WithLabelValues("partial").Inc()
		}
	}

	return plans, jobs, cacheable
}

// store puts what a day piece knows now, up to the last cacheable step,
// into the cache: the previous entry grown by the steps just computed
// next to it, or a new entry.
func (f *Frontend) store(pl *plan, cacheable int64) {
	var parts []answer
	start, end := int64(0), int64(0)
	switch e := pl.entry; {
	case e == nil:
		if pl.tail == nil || pl.tail.start > cacheable {
			return
		}
		start, end = pl.tail.start, min(pl.tail.end, cacheable)
		parts = append(parts, cut(pl.tail.ans, start, end))
	default:
		if pl.head == nil && (pl.tail == nil || e.end >= cacheable) {
			return // nothing new to keep
		}
		start, end = e.start, e.end
		if pl.head != nil {
			start = pl.head.start
			parts = append(parts, pl.head.ans)
		}
		parts = append(parts, e.answer)
		if pl.tail != nil && pl.tail.start <= cacheable {
			end = min(pl.tail.end, cacheable)
			parts = append(parts, cut(pl.tail.ans, pl.tail.start, end))
		}
	}
	f.cache.put(&entry{key: pl.key, start: start, end: end, layout: pl.layout, oooWindow: pl.ooo, answer: join(parts...)})
}

// runJobs runs the jobs in parallel, each taking one of the frontend's
// slots. A job that fails (an API error answer) cancels the others. It
// returns errNotJoinable if an answer cannot be joined.
func (f *Frontend) runJobs(r *http.Request, next http.Handler, jobs []*job) error {
	// The request, not each piece, gets query.timeout: pieces waiting for
	// a slot count against it, as the unsplit query would (and the server's
	// write timeout, which must exceed query.timeout, is never reached).
	ctx, cancel := context.WithCancel(r.Context())
	if f.deps.Timeout > 0 {
		ctx, cancel = context.WithTimeout(r.Context(), f.deps.Timeout)
	}
	defer cancel()
	form := url.Values{}
	for k, v := range r.Form {
		form[k] = v
	}
	var wg sync.WaitGroup
	for _, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case f.slots <- struct{}{}:
			case <-ctx.Done():
				j.err = ctx.Err()
				return
			}
			defer func() { <-f.slots }()
			if ctx.Err() != nil {
				j.err = ctx.Err()
				return
			}
			f.pieces.Inc()
			rec := f.do(ctx, r, next, form, j.start, j.end)
			if rec.code != http.StatusOK {
				j.rec = rec
				cancel()
				return
			}
			j.ans, j.err = decodeAnswer(rec.body.Bytes())
			if j.err != nil {
				cancel()
			}
		}()
	}
	wg.Wait()
	for _, j := range jobs {
		if j.rec != nil {
			return nil // the API's error answer goes to the client
		}
	}
	for _, j := range jobs {
		if errors.Is(j.err, errNotJoinable) {
			return errNotJoinable
		}
	}
	// An answer that did not decode (a fault of ours: 500) before the
	// pieces it cancelled; the request's deadline (503, as the API answers
	// a timeout) or its client gone.
	var failed *job
	for _, j := range jobs {
		if j.err != nil && (failed == nil || errors.Is(failed.err, context.Canceled) && !errors.Is(j.err, context.Canceled)) {
			failed = j
		}
	}
	if failed != nil {
		rec := newRecorder()
		switch {
		case errors.Is(failed.err, context.DeadlineExceeded):
			rec.writeError(http.StatusServiceUnavailable, "timeout", fmt.Errorf("query timed out: %w", failed.err))
		case r.Context().Err() != nil:
			rec.writeError(http.StatusServiceUnavailable, "canceled", failed.err)
		default:
			rec.writeError(http.StatusInternalServerError, "internal", failed.err)
		}
		failed.rec = rec
	}
	return nil
}

// do sends the steps [start, end] of r to the API as a GET with the
// request's other parameters unchanged.
func (f *Frontend) do(ctx context.Context, r *http.Request, next http.Handler, form url.Values, start, end int64) *recorder {
	q := make(url.Values, len(form))
	for k, v := range form {
		q[k] = v
	}
	q.Set("start", formatTime(start))
	q.Set("end", formatTime(end))
	sub := r.Clone(ctx)
	sub.Method = http.MethodGet
	sub.URL.RawQuery = q.Encode()
	sub.Form, sub.PostForm, sub.MultipartForm = nil, nil, nil
	sub.Body, sub.ContentLength = http.NoBody, 0
	sub.Header.Del("Content-Type")
	sub.Header.Del("Content-Length")
	sub.Header.Del("Accept-Encoding")
	rec := newRecorder()
	next.ServeHTTP(rec, sub)
	return rec
}

// readRange is how far before the first and after the last step the
// request's selectors read (offsets, ranges, lookback, subqueries), with a
// margin for the bucket store's reads of downsampled windows and for
// subquery alignment.
func readRange(req *rangeRequest) (before, after int64) {
	mint, maxt := promql.FindMinMaxTime(&parser.EvalStmt{Expr: req.expr, Start: time.UnixMilli(0), End: time.UnixMilli(0),
		Interval: time.Duration(req.step) * time.Millisecond, LookbackDelta: req.lookback})
	margin := req.step + time.Hour.Milliseconds()
	return min(mint, 0) - margin, max(maxt, 0) + margin
}

// layout fingerprints the blocks overlapping [mint, maxt] and whether each
// is read from the local TSDB: compaction, downsampling, retention,
// out-of-order blocks and a block leaving the local disk after its upload
// (from then on the bucket store may read it downsampled) all change it.
func layout(blocks []Block, mint, maxt int64) uint64 {
	h := fnv.New64a()
	var buf [17]byte
	var fp uint64
	for _, b := range blocks {
		if b.MinTime > maxt || b.MaxTime <= mint {
			continue
		}
		copy(buf[:16], b.ID[:])
		buf[16] = 0
		if b.Local {
			buf[16] = 1
		}
		// Order-independent: the sum of per-block hashes.
		h.Reset()
		_, _ = h.Write(buf[:])
		fp += h.Sum64()
	}
	return fp
}

// recorder holds a sub-request's answer.
type recorder struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func newRecorder() *recorder { return &recorder{header: http.Header{}, code: http.StatusOK} }

func (r *recorder) Header() http.Header         { return r.header }
func (r *recorder) Write(b []byte) (int, error) { return r.body.Write(b) }
func (r *recorder) WriteHeader(code int)        { r.code = code }

func (r *recorder) copyTo(w http.ResponseWriter) {
	for k, v := range r.header {
		w.Header()[k] = v
	}
	w.WriteHeader(r.code)
	_, _ = w.Write(r.body.Bytes())
}

func (r *recorder) writeError(status int, typ string, err error) {
	r.header.Set("Content-Type", "application/json")
	r.code = status
	r.body.Reset()
	b, _ := json.Marshal(v1.Response{Status: "error", ErrorType: typ, Error: err.Error()})
	r.body.Write(b)
}
