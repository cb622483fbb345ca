// Package ringread is the read side of scale-out: every receiver serves
// its own tenants' recent data over Prometheus' remote-read protocol
// (ReadHandler), and a query process reads a read quorum of the ring's
// receivers as one query.Source (Source), merging the replicas of each
// series chunk by chunk. (The receivers' write side is pkg/ingest behind
// pkg/distributor; the ring itself is pkg/receiverring.)
package ringread

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"

	"github.com/grafana/dskit/user"
	"github.com/oklog/ulid/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/config"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/storage/remote"
	"github.com/prometheus/prometheus/util/annotations"

	"github.com/gpustore/gpustore/pkg/query"
	"github.com/gpustore/gpustore/pkg/tenancy"
	"github.com/gpustore/gpustore/pkg/tenantdb"
)

// ReadPath is where a receiver answers remote-read requests for its own data.
const ReadPath = "/receiver/read"

// Limits of the read handler. Prometheus' defaults for its own
// /api/v1/read: a query process asks each receiver once per selector, so ten
// concurrent reads are several concurrent queries; frames of about 1 MiB
// keep memory per stream bounded; the sample limit applies only to the
// SAMPLES response type (label calls ask for series without samples).
const (
	readConcurrency     = 10
	readMaxBytesInFrame = 1 << 20
	readSampleLimit     = 5e7
)

// ReadHandler answers Prometheus remote-read requests (streamed XOR chunks,
// or samples for clients that ask for them) with the requesting tenant's
// data held by this receiver: its head and local blocks only, never the
// bucket's blocks, which the querying process reads itself.
//
// The tenant comes from the request as for writes (tenancy.FromRequest:
// X-Scope-OrgID, THANOS-TENANT, the identity's single tenant, the default
// tenant) and is put into the request's context, where TenantQueryable
// finds it.
//
// A streamed answer carries LocalBlocksHeader: the tenant's blocks on this
// receiver's disk.
func ReadHandler(dbs *tenantdb.Manager, tenants tenancy.Config, logger *slog.Logger, reg prometheus.Registerer) http.Handler {
	return readHandler(receiverQueryable{SampleAndChunkQueryable: query.TenantQueryable{DBs: dbs}, dbs: dbs, blocks: localBlocks(dbs)}, tenants, dbs.Recovering, logger, reg)
}

// LocalBlocksHeader lists, in a receiver's streamed answer, the ULIDs of
// the tenant's blocks on its disk (with the compaction sources of
// compacted ones), comma-separated, as they were once its querier had
// opened: the blocks it shipped to the bucket and still answers from
// itself. The querying process does not read them from the bucket (see
// readopts.ReadOptions.ServedBlocks). A block deleted in between is not listed (the
// bucket is read for it: more work, nothing lost); one cut from the head
// in between is listed and its samples were in the head the querier read.
const LocalBlocksHeader = "X-Gpustore-Local-Blocks"

// localBlocks lists a tenant's blocks on this receiver's disk.
func localBlocks(dbs *tenantdb.Manager) func(tenant string) []ulid.ULID {
	return func(tenant string) []ulid.ULID {
		db := dbs.Existing(tenant)
		if db == nil {
			return nil
		}
		var ids []ulid.ULID
		for _, b := range db.Blocks() {
			m := b.Meta()
			ids = append(ids, m.ULID)
			for _, src := range m.Compaction.Sources {
				if src != m.ULID {
					ids = append(ids, src)
				}
			}
		}
		return ids
	}
}

// receiverQueryable is the queryable of a receiver's remote reads: its
// chunk selects read the tenant's TSDB with
// tenantdb.DB.ChunkQuerierUnmerged, leave chunks whole and report the
// tenant's local blocks.
type receiverQueryable struct {
	storage.SampleAndChunkQueryable
	dbs    *tenantdb.Manager
	blocks func(tenant string) []ulid.ULID
}

func (q receiverQueryable) ChunkQuerier(mint, maxt int64) (storage.ChunkQuerier, error) {
	return &receiverChunkQuerier{dbs: q.dbs, mint: mint, maxt: maxt, blocks: q.blocks}, nil
}

// receiverChunkQuerier opens the chunk querier of the tenant in the
// context of its first call (the read handler puts it there).
type receiverChunkQuerier struct {
	dbs        *tenantdb.Manager
	mint, maxt int64
	blocks     func(tenant string) []ulid.ULID

	mtx    sync.Mutex
	opened []storage.ChunkQuerier
}

// open returns the chunk querier of the tenant in ctx (nil when it has
// no data here).
func (q *receiverChunkQuerier) open(ctx context.Context) (storage.ChunkQuerier, string, error) {
	id, err := user.ExtractOrgID(ctx)
	if err != nil {
		return nil, "", err
	}
	db := q.dbs.Existing(id)
	if db == nil {
		return nil, id, nil
	}
	// Overlapping parts' chunks (out-of-order blocks and head) are
	// passed on as stored: the query process merges chunks that overlap
	// anyway, the replicas' (dedupChunks), where only samples are decoded,
	// never encoded again.
	cq, err := db.ChunkQuerierUnmerged(q.mint, q.maxt)
	if err != nil {
		return nil, id, fmt.Errorf("open chunk querier of tenant %q: %w", id, err)
	}
	q.mtx.Lock()
	q.opened = append(q.opened, cq)
	q.mtx.Unlock()
	return cq, id, nil
}

// Select asks the TSDB for whole chunks: trimmed to the range, a series'
// first and last chunk would be decoded and encoded again here (most of a
// receiver's work for a one-hour panel), and the querier cuts the samples
// to the range as it decodes them anyway.
//
// It lists the tenant's local blocks into the answer's LocalBlocksHeader
// (found in the context, see readHandler) after the tenant's querier
// opened, and before anything of the answer is written.
func (q *receiverChunkQuerier) Select(ctx context.Context, sortSeries bool, hints *storage.SelectHints, ms ...*labels.Matcher) storage.ChunkSeriesSet {
	h := storage.SelectHints{Start: q.mint, End: q.maxt}
	if hints != nil {
		h = *hints
	}
	h.DisableTrimming = true
	cq, id, err := q.open(ctx)
	if err != nil {
		return storage.ErrChunkSeriesSet(err)
	}
	set := storage.EmptyChunkSeriesSet()
	if cq != nil {
		set = cq.Select(ctx, sortSeries, &h, ms...)
	}
	if header, ok := ctx.Value(answerHeaderKey{}).(http.Header); ok && q.blocks != nil {
		ids := q.blocks(id)
		s := make([]string, len(ids))
		for i, id := range ids {
			s[i] = id.String()
		}
		header.Set(LocalBlocksHeader, strings.Join(s, ","))
	}
	return set
}

func (q *receiverChunkQuerier) LabelValues(ctx context.Context, name string, hints *storage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	cq, _, err := q.open(ctx)
	if err != nil || cq == nil {
		return nil, nil, err
	}
	return cq.LabelValues(ctx, name, hints, ms...)
}

func (q *receiverChunkQuerier) LabelNames(ctx context.Context, hints *storage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	cq, _, err := q.open(ctx)
	if err != nil || cq == nil {
		return nil, nil, err
	}
	return cq.LabelNames(ctx, hints, ms...)
}

func (q *receiverChunkQuerier) Close() error {
	q.mtx.Lock()
	defer q.mtx.Unlock()
	var errs []error
	for _, cq := range q.opened {
		errs = append(errs, cq.Close())
	}
	q.opened = nil
	return errors.Join(errs...)
}

// answerHeaderKey carries a read's answer header in its context.
type answerHeaderKey struct{}

// readHandler is ReadHandler over any queryable. The body is read before
// the request waits for one of the readConcurrency slots, so a request
// whose client (a querier that timed out) has gone is cancelled at once
// (query.ReadWholeBody).
//
// A tenant whose crashed head this receiver is still recovering
// (recovering, tenantdb.Manager.Recovering; nil: none) is answered 503: its
// answer would lack that head's samples, yet count toward the read quorum.
// Refused, the querier asks another replica instead, and a read quorum of
// the others holds every acknowledged sample (each went to a write quorum).
func readHandler(q storage.SampleAndChunkQueryable, tenants tenancy.Config, recovering func(tenant string) bool, logger *slog.Logger, reg prometheus.Registerer) http.Handler {
	// Prometheus' query API (pkg/query) registers the same read-handler
	// metrics on the process's registry: prefixed, both fit in one process.
	if reg != nil {
		reg = prometheus.WrapRegistererWithPrefix("gpustore_receiver_", reg)
	}
	h := remote.NewReadHandler(logger, reg, q,
		// No external labels: series are stored with their own labels only.
		func() config.Config { return config.Config{} },
		readSampleLimit, readConcurrency, readMaxBytesInFrame)
	return query.ReadWholeBody(query.MaxReadRequestBytes, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok := requestTenant(w, r, tenants)
		switch {
		case !ok: // requestTenant answered
		case recovering != nil && recovering(id):
			http.Error(w, fmt.Sprintf("recovering a crashed head of tenant %q into blocks: its samples are not readable here yet, read the replicas", id), http.StatusServiceUnavailable)
		default:
			ctx := context.WithValue(user.InjectOrgID(r.Context(), id), answerHeaderKey{}, w.Header())
			bw := newBufferedAnswer(w)
			h.ServeHTTP(bw, r.WithContext(ctx))
			// Not deferred: a handler that panics to abort a broken
			// stream (http.ErrAbortHandler) must not end it cleanly.
			bw.Flush()
			bw.release()
		}
	}))
}

// answerBufferSize is how much of a streamed answer is written at once.
// Go's server writes a response through a buffer of 2-4 KiB, each write
// a system call and an HTTP chunk that the querier reads with another:
// frames are one series each, a few hundred bytes.
const answerBufferSize = 64 << 10

var answerBuffers = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, answerBufferSize) }}

// bufferedAnswer is a response written through a large buffer.
type bufferedAnswer struct {
	http.ResponseWriter
	buf *bufio.Writer
}

func newBufferedAnswer(w http.ResponseWriter) *bufferedAnswer {
	buf := answerBuffers.Get().(*bufio.Writer)
	buf.Reset(w)
	return &bufferedAnswer{ResponseWriter: w, buf: buf}
}

func (b *bufferedAnswer) Write(p []byte) (int, error) { return b.buf.Write(p) }

// Flush implements http.Flusher (the streamed answer needs one).
func (b *bufferedAnswer) Flush() {
	if b.buf == nil || b.buf.Flush() != nil {
		return
	}
	if f, ok := b.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (b *bufferedAnswer) release() {
	b.buf.Reset(nil)
	answerBuffers.Put(b.buf)
	b.buf = nil
}

// requestTenant returns the request's tenant (tenancy.FromRequest), or
// answers the request with the reason there is none.
func requestTenant(w http.ResponseWriter, r *http.Request, tenants tenancy.Config) (string, bool) {
	id, err := tenants.FromRequest(r)
	if err != nil {
		status := http.StatusBadRequest
		if te, ok := errors.AsType[*tenancy.Error](err); ok {
			status = te.Status
		}
		http.Error(w, err.Error(), status)
		return "", false
	}
	return id, true
}
