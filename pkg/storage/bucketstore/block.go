package bucketstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/tsdb/tombstones"
	"github.com/thanos-io/objstore"

	"github.com/gpustore/gpustore/pkg/block"
)

// bucketBlock is one block in the bucket, read lazily through the page cache.
type bucketBlock struct {
	meta     *block.Meta
	tenant   string
	group    string // its group within the tenant (block.GroupKey)
	cache    *PageCache
	index    object
	segments []object
	size     int64
	// readahead is the most pages a query's reader fetches at once.
	readahead int64
	added     time.Time // when Add made it visible (zero: found by listing)

	// header is published whole once loaded; readers never take a lock, so
	// a slow load (one S3 read) stalls only the queries that need this block.
	header atomic.Pointer[indexHeader]
	// lmtx guards load: at most one load of the header at a time (the
	// queries that need it meanwhile wait for it). It is never held across I/O.
	lmtx     sync.Mutex
	load     *headerLoad
	lastUsed atomic.Int64 // unix nanoseconds of the last query that opened the header
}

// headerLoad is one load of a block's index header under way.
type headerLoad struct {
	done chan struct{}
	h    *indexHeader
	err  error
	// abandoned: the loading query's context ended; each waiter loads again.
	abandoned bool
}

func newBucketBlock(bkt objstore.BucketReader, cache *PageCache, readahead int64, meta *block.Meta) (*bucketBlock, error) {
	b := &bucketBlock{meta: meta, tenant: meta.GPUStore.Tenant, group: block.GroupKey(meta), cache: cache, readahead: readahead}
	idx, _ := meta.File(block.IndexFilename)
	b.index = newObject(bkt, meta, idx)
	for _, rel := range meta.ChunkSegments() {
		f, _ := meta.File(rel)
		b.segments = append(b.segments, newObject(bkt, meta, f))
	}
	for _, f := range meta.GPUStore.Files {
		b.size += f.SizeBytes
	}
	if b.index.size <= 0 {
		return nil, fmt.Errorf("block %s: empty index", meta.ULID)
	}
	return b, nil
}

// objectNames lists the block's objects (to drop their cached pages).
func (b *bucketBlock) objectNames() []string {
	names := []string{b.index.name}
	for _, s := range b.segments {
		names = append(names, s.name)
	}
	return names
}

// indexHeader returns the block's index header, reading it on first use
// (one load at a time per block; the queries that need it meanwhile wait for
// that load, and load again themselves if the loading query was cancelled).
// A failed read is not remembered: the next query tries again.
func (b *bucketBlock) indexHeader(ctx context.Context) (*indexHeader, error) {
	b.lastUsed.Store(time.Now().UnixNano())
	for {
		if h := b.header.Load(); h != nil {
			return h, nil
		}
		b.lmtx.Lock()
		if h := b.header.Load(); h != nil {
			b.lmtx.Unlock()
			return h, nil
		}
		l, owner := b.load, false
		if l == nil {
			l, owner = &headerLoad{done: make(chan struct{})}, true
			b.load = l
		}
		b.lmtx.Unlock()

		if owner {
			h, err := loadIndexHeader(ctx, b.cache, b.index)
			b.lmtx.Lock()
			if err == nil {
				b.header.Store(h)
			}
			l.h, l.err, l.abandoned = h, err, err != nil && ctx.Err() != nil
			b.load = nil
			b.lmtx.Unlock()
			close(l.done)
			if err != nil {
				return nil, b.storageErr(ctx, err)
			}
			return h, nil
		}
		select {
		case <-l.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if l.err == nil {
			return l.h, nil
		}
		if !l.abandoned {
			return nil, b.storageErr(ctx, l.err)
		}
	}
}

// unloadIfIdle drops the index header if no query opened it since before.
// Queries that hold it keep using it (a header is never changed).
func (b *bucketBlock) unloadIfIdle(before time.Time) (freed int64) {
	if b.lastUsed.Load() >= before.UnixNano() {
		return 0
	}
	b.lmtx.Lock()
	defer b.lmtx.Unlock()
	h := b.header.Load()
	if h == nil || b.lastUsed.Load() >= before.UnixNano() {
		return 0
	}
	b.header.Store(nil)
	return h.bytes
}

func (b *bucketBlock) headerLoaded() bool { return b.header.Load() != nil }

func (b *bucketBlock) headerBytes() int64 {
	if h := b.header.Load(); h != nil {
		return h.bytes
	}
	return 0
}

// storageErr makes a bucket or decoding error a storage error of the query
// (HTTP 500 through Prometheus' API); a cancelled or timed out query keeps its
// own error.
func (b *bucketBlock) storageErr(ctx context.Context, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	if isStorageErr(err) {
		return err
	}
	return promql.ErrStorage{Err: fmt.Errorf("bucket block %s/%s: %w", b.tenant, b.meta.ULID, err)}
}

func isStorageErr(err error) bool {
	var se promql.ErrStorage
	return errors.As(err, &se)
}

// view is the block as a tsdb.BlockReader for one query: its readers fetch
// with the query's context (a cancelled query stops fetching) and share the
// query's windows on the block's objects.
type view struct {
	b   *bucketBlock
	ctx context.Context
	st  *queryState
}

// queryState is what one query's readers of one block share.
type queryState struct {
	mint, maxt int64
	// need, when set, says which chunks the select reads (stepWindows);
	// the others are left out of the series' chunk lists.
	need *stepWindows

	smtx   sync.Mutex
	series *window // series entries, read in ascending order

	// Symbol lookups: a memo of the symbols resolved (label values repeat
	// across series) and a window on the symbol table, so that a merge of
	// many blocks does not refetch each block's symbol pages per series.
	symMtx  sync.Mutex
	syms    map[uint32]string
	symbols *window

	cmtx   sync.Mutex
	chunks []*window   // one per segment file, read in ascending order
	frames []lastFrame // per zstd-columns segment file: the last frame read
}

// lastFrame is the last frame a query read of a zstd-columns segment.
type lastFrame struct {
	frame *block.ColumnFrame
	index int
}

func newView(ctx context.Context, b *bucketBlock, mint, maxt int64) view {
	st := &queryState{
		mint: mint, maxt: maxt, need: neededWindows(ctx),
		series:  &window{c: b.cache, o: b.index, maxPages: b.readahead, streaming: true},
		syms:    map[uint32]string{},
		symbols: &window{c: b.cache, o: b.index, maxPages: b.readahead},
		chunks:  make([]*window, len(b.segments)),
		frames:  make([]lastFrame, len(b.segments)),
	}
	for i, o := range b.segments {
		st.chunks[i] = &window{c: b.cache, o: o, maxPages: b.readahead, streaming: true}
	}
	return view{b: b, ctx: ctx, st: st}
}

var _ tsdb.BlockReader = view{}

func (v view) Index() (tsdb.IndexReader, error) {
	h, err := v.b.indexHeader(v.ctx)
	if err != nil {
		return nil, err
	}
	return newIndexReader(v, h), nil
}

func (v view) Chunks() (tsdb.ChunkReader, error) { return &chunkReader{view: v}, nil }

func (v view) Tombstones() (tombstones.Reader, error) {
	// Shipped blocks carry no tombstones: gpustore has no delete API.
	return tombstones.NewMemTombstones(), nil
}

func (v view) Meta() tsdb.BlockMeta { return v.b.meta.BlockMeta }
func (v view) Size() int64          { return v.b.size }

// chunkReader reads chunks from the block's segment files through the
// query's windows.
type chunkReader struct{ view }

func (r *chunkReader) ChunkOrIterable(m chunks.Meta) (chunkenc.Chunk, chunkenc.Iterable, error) {
	chk, err := r.readChunk(m)
	return chk, nil, err
}

func (*chunkReader) Close() error { return nil }

func (v view) readChunk(m chunks.Meta) (chunkenc.Chunk, error) {
	seq, off := chunks.BlockChunkRef(m.Ref).Unpack()
	if seq >= len(v.b.segments) {
		return nil, v.b.storageErr(v.ctx, fmt.Errorf("chunk ref %d: segment %d of %d", m.Ref, seq, len(v.b.segments)))
	}
	o := v.b.segments[seq]
	start := int64(off)
	if start+1 > o.size {
		return nil, v.b.storageErr(v.ctx, fmt.Errorf("chunk ref %d past the end of %s", m.Ref, o.name))
	}
	v.st.cmtx.Lock()
	defer v.st.cmtx.Unlock()
	if o.file.Encoding == block.EncodingZstdColumns {
		return v.readColumnChunk(seq, o, start)
	}
	w := v.st.chunks[seq]
	hb, err := w.read(v.ctx, start, min(o.size, start+chunks.MaxChunkLengthFieldSize))
	if err != nil {
		return nil, v.b.storageErr(v.ctx, err)
	}
	l, n := binary.Uvarint(hb)
	if n <= 0 {
		return nil, v.b.storageErr(v.ctx, fmt.Errorf("chunk ref %d: invalid length", m.Ref))
	}
	encStart := start + int64(n)
	end := encStart + chunks.ChunkEncodingSize + int64(l) + crc32.Size
	if end > o.size {
		return nil, v.b.storageErr(v.ctx, fmt.Errorf("chunk ref %d: %d bytes past the end of %s", m.Ref, end-o.size, o.name))
	}
	b, err := w.read(v.ctx, encStart, end)
	if err != nil {
		return nil, v.b.storageErr(v.ctx, err)
	}
	dataEnd := chunks.ChunkEncodingSize + int(l)
	if crc32.Checksum(b[:dataEnd], castagnoli) != binary.BigEndian.Uint32(b[dataEnd:]) {
		return nil, v.b.storageErr(v.ctx, fmt.Errorf("chunk ref %d: checksum mismatch", m.Ref))
	}
	// Capped: nothing may append into the cached page.
	chk, err := chunkenc.FromData(chunkenc.Encoding(b[0]), b[1:dataEnd:dataEnd])
	if err != nil {
		return nil, v.b.storageErr(v.ctx, err)
	}
	return chk, nil
}

// readColumnChunk reads the chunk at off of a zstd-columns segment: from
// the frame that holds it, written again alone (block.ColumnFrame), not by
// decoding the frame's pages whole. The query keeps the last frame it read
// of each segment: a series' chunks lie next to each other.
func (v view) readColumnChunk(seq int, o object, off int64) (chunkenc.Chunk, error) {
	f := &v.st.frames[seq]
	if f.frame == nil || off < f.frame.Start() || off >= f.frame.Start()+f.frame.Size() {
		t, err := v.b.cache.seekTable(v.ctx, o)
		if err != nil {
			return nil, v.b.storageErr(v.ctx, err)
		}
		f.index = t.FrameAt(off)
		if f.frame, err = v.b.cache.columnFrame(v.ctx, o, f.index); err != nil {
			return nil, v.b.storageErr(v.ctx, err)
		}
	}
	chk, written, err := f.frame.Chunk(off)
	if err != nil {
		return nil, v.b.storageErr(v.ctx, fmt.Errorf("%s: %w", o.name, err))
	}
	v.b.cache.decodedBytes.Add(int64(written))
	v.b.cache.grew(o, f.index, int64(written))
	return chk, nil
}
