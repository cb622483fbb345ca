package bucketstore

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/thanos-io/objstore"
	"golang.org/x/sync/errgroup"

	"github.com/gpustore/gpustore/pkg/block"
)

// PageCache holds fixed-size pages of bucket objects (index and chunk
// segment files) in memory, least recently used first out, within a byte
// budget. Every byte a query reads from a bucket block comes through it:
// missing pages are fetched with range requests (runs of adjacent missing
// pages in one request), so a query reads only the pages it touches, and the
// memory the cache holds never exceeds MaxBytes.
//
// Pages are immutable: a slice handed out keeps its page alive after
// eviction (the garbage collector frees it when the caller is done), so
// callers never see a page change under them.
type PageCache struct {
	pageSize int64
	maxBytes int64

	mtx      sync.Mutex
	lru      *list.List // of *page, front = most recently used
	pages    map[pageKey]*list.Element
	bytes    int64
	inflight map[pageKey]*fetch
	loading  map[string]*loadCall // encoded objects' frames and seek tables being read, by object and frame

	hits, misses, evictions, fetchedBytes, requests, decodedBytes atomic.Int64
}

type pageKey struct {
	object string
	page   int64
}

// page is a cached page of an object, or (pageKey.page < 0) a frame of a
// zstd-columns chunk segment that gives out its chunks one at a time.
type page struct {
	key   pageKey
	data  []byte
	frame *block.ColumnFrame
	size  int64 // what it holds (the budget's share)
}

// frameKey is the cache key of frame i of a zstd-columns segment.
func frameKey(o object, i int) pageKey { return pageKey{o.name, -1 - int64(i)} }

// fetch is one page being read from the bucket by the query that missed it
// first; the other queries that miss it meanwhile wait for it.
type fetch struct {
	done chan struct{}
	data []byte
	err  error
	// abandoned: the fetching query's context ended, so err is that query's
	// and not the bucket's; each waiter fetches the page again itself.
	abandoned bool
}

// NewPageCache returns a cache of pageSize-byte pages holding at most maxBytes.
func NewPageCache(pageSize, maxBytes int64) *PageCache {
	return &PageCache{
		pageSize: pageSize, maxBytes: maxBytes,
		lru: list.New(), pages: map[pageKey]*list.Element{}, inflight: map[pageKey]*fetch{}, loading: map[string]*loadCall{},
	}
}

// CacheStats are the cache's counters.
type CacheStats struct {
	// Bytes is what the cache holds now (always <= MaxBytes).
	Bytes, MaxBytes int64
	Pages           int
	Hits, Misses    int64
	Evictions       int64
	// FetchedBytes and Requests count what was read from the bucket through
	// the cache (pages) and by block opening (index headers).
	FetchedBytes, Requests int64
	// DecodedBytes counts what decoding encoded objects' frames gave.
	DecodedBytes int64
}

// Stats returns the cache's counters.
func (c *PageCache) Stats() CacheStats {
	c.mtx.Lock()
	b, n := c.bytes, len(c.pages)
	c.mtx.Unlock()
	return CacheStats{
		Bytes: b, MaxBytes: c.maxBytes, Pages: n,
		Hits: c.hits.Load(), Misses: c.misses.Load(), Evictions: c.evictions.Load(),
		FetchedBytes: c.fetchedBytes.Load(), Requests: c.requests.Load(), DecodedBytes: c.decodedBytes.Load(),
	}
}

// object is one file of a block read through the cache.
type object struct {
	bkt  objstore.BucketReader
	name string // the bucket object
	size int64  // the file's (decoded) size
	// file says how the object is stored: an encoded one (zstd frames) is
	// read a frame at a time through its seek table (seek, read on first
	// use), and every page of the frames read goes to the cache.
	file block.File
	seek *atomic.Pointer[block.SeekTable]
}

func newObject(bkt objstore.BucketReader, m *block.Meta, f block.File) object {
	o := object{bkt: bkt, name: block.ObjectName(m.GPUStore.Tenant, m.ULID, f.ObjectRel()), size: f.SizeBytes, file: f}
	if o.encoded() {
		o.seek = &atomic.Pointer[block.SeekTable]{}
	}
	return o
}

func (o object) encoded() bool { return o.file.Encoding != block.EncodingNone }

// Range returns bytes [start, end) of o. A range within one page is a
// sub-slice of the cached page; a longer one is a copy.
func (c *PageCache) Range(ctx context.Context, o object, start, end int64) ([]byte, error) {
	if start < 0 || end > o.size || start > end {
		return nil, fmt.Errorf("read %s: range [%d,%d) outside object of %d bytes", o.name, start, end, o.size)
	}
	if start == end {
		return nil, nil
	}
	first, last := start/c.pageSize, (end-1)/c.pageSize
	pages, err := c.getPages(ctx, o, first, last)
	if err != nil {
		return nil, err
	}
	if first == last {
		off := first * c.pageSize
		return pages[0][start-off : end-off : end-off], nil
	}
	out := make([]byte, 0, end-start)
	for i, p := range pages {
		pstart := (first + int64(i)) * c.pageSize
		lo, hi := int64(0), int64(len(p))
		if i == 0 {
			lo = start - pstart
		}
		if i == len(pages)-1 {
			hi = end - pstart
		}
		out = append(out, p[lo:hi]...)
	}
	return out, nil
}

// getPages returns pages first..last of o, fetching the missing ones.
func (c *PageCache) getPages(ctx context.Context, o object, first, last int64) ([][]byte, error) {
	out := make([][]byte, last-first+1)
	var waits []*fetch
	var waitIdx []int
	var mine []int64 // pages this call fetches
	owned := map[int64]*fetch{}

	c.mtx.Lock()
	for p := first; p <= last; p++ {
		k := pageKey{o.name, p}
		if e, ok := c.pages[k]; ok {
			c.lru.MoveToFront(e)
			out[p-first] = e.Value.(*page).data
			c.hits.Add(1)
			continue
		}
		c.misses.Add(1)
		if f, ok := c.inflight[k]; ok {
			waits = append(waits, f)
			waitIdx = append(waitIdx, int(p-first))
			continue
		}
		f := &fetch{done: make(chan struct{})}
		c.inflight[k] = f
		owned[p] = f
		mine = append(mine, p)
	}
	c.mtx.Unlock()

	// Fetch runs of adjacent pages this call owns, one request per run.
	var fetchErr error
	for i := 0; i < len(mine); {
		j := i
		for j+1 < len(mine) && mine[j+1] == mine[j]+1 {
			j++
		}
		runFirst, runLast := mine[i], mine[j]
		var data [][]byte
		if fetchErr == nil {
			data, fetchErr = c.fetchRun(ctx, o, runFirst, runLast)
		}
		c.mtx.Lock()
		for p := runFirst; p <= runLast; p++ {
			f := owned[p]
			k := pageKey{o.name, p}
			delete(c.inflight, k)
			if fetchErr != nil {
				f.err = fetchErr
				f.abandoned = ctx.Err() != nil
			} else {
				f.data = data[p-runFirst]
				out[p-first] = f.data
				c.insertLocked(&page{key: k, data: f.data, size: int64(len(f.data))})
			}
			close(f.done)
		}
		c.mtx.Unlock()
		i = j + 1
	}
	if fetchErr != nil {
		return nil, fetchErr
	}
	for i, f := range waits {
		select {
		case <-f.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		switch {
		case f.err == nil:
			out[waitIdx[i]] = f.data
		case f.abandoned:
			// The query that fetched it was cancelled: its error is not
			// this query's. Read the page again with this query's context.
			p := first + int64(waitIdx[i])
			again, err := c.getPages(ctx, o, p, p)
			if err != nil {
				return nil, err
			}
			out[waitIdx[i]] = again[0]
		default:
			return nil, f.err
		}
	}
	return out, nil
}

// fetchRun reads pages first..last of o in one range request: of the
// pages, or, for an encoded object, of the frames that hold them (whose
// other pages it offers the cache).
func (c *PageCache) fetchRun(ctx context.Context, o object, first, last int64) ([][]byte, error) {
	if o.encoded() {
		return c.decodePages(ctx, o, first, last)
	}
	start := first * c.pageSize
	end := min(o.size, (last+1)*c.pageSize)
	buf, err := c.fetch(ctx, o, start, end-start)
	if err != nil {
		return nil, err
	}
	pages := make([][]byte, 0, last-first+1)
	for p := first; p <= last; p++ {
		lo := (p - first) * c.pageSize
		hi := min(int64(len(buf)), lo+c.pageSize)
		// Each page gets its own allocation so that evicting one frees it.
		pages = append(pages, append([]byte(nil), buf[lo:hi]...))
	}
	return pages, nil
}

// fetch reads length bytes at off of o's object in one request.
func (c *PageCache) fetch(ctx context.Context, o object, off, length int64) ([]byte, error) {
	buf, err := readRange(ctx, o.bkt, o.name, off, length)
	c.requests.Add(1)
	c.fetchedBytes.Add(int64(len(buf)))
	return buf, err
}

// decodePages returns pages first..last of an encoded object's file: it
// fetches and decodes each frame that holds them (one request a frame, in
// parallel), once for all the queries that miss it meanwhile, and offers the cache
// every whole page a frame holds. Loads are keyed by frame, not by run: a
// run of pages and the read-ahead run after it often share a frame.
func (c *PageCache) decodePages(ctx context.Context, o object, first, last int64) ([][]byte, error) {
	t, err := c.seekTable(ctx, o)
	if err != nil {
		return nil, err
	}
	fa, fb := t.FrameAt(first*c.pageSize), t.FrameAt(min(o.size, (last+1)*c.pageSize)-1)
	frames := make([]*framePages, fb-fa+1)
	if fa == fb {
		frames[0], err = c.frame(ctx, o, t, fa)
	} else { // the frames' requests at once, not one round trip after the other
		g, gctx := errgroup.WithContext(ctx)
		for i := fa; i <= fb; i++ {
			g.Go(func() (err error) {
				frames[i-fa], err = c.frame(gctx, o, t, i)
				return err
			})
		}
		err = g.Wait()
	}
	if err != nil {
		return nil, err
	}
	out := make([][]byte, last-first+1)
	for _, fp := range frames {
		for k, part := range fp.pages {
			p := fp.first + int64(k)
			if p < first || p > last {
				continue
			}
			if out[p-first] == nil && int64(len(part)) == c.pageLen(o, p) {
				out[p-first] = part // a whole page, as cached
				continue
			}
			// A page two frames share: joined in a buffer of its own
			// (the parts are shared with the frame's other readers).
			if out[p-first] == nil {
				out[p-first] = make([]byte, 0, c.pageLen(o, p))
			}
			out[p-first] = append(out[p-first], part...)
		}
	}
	return out, nil
}

// framePages are a decoded frame's bytes cut at page boundaries: pages[k]
// holds its bytes of page first+k (whole pages, which the cache holds too,
// except the first and last, parts of pages the frame may share with its
// neighbours).
type framePages struct {
	first int64
	pages [][]byte
}

// decodeBufs hold frames decoded before they are cut into pages.
var decodeBufs = sync.Pool{New: func() any { return new([]byte) }}

// frame returns frame i of an encoded object as pages, loading it once for
// all the queries that ask meanwhile.
func (c *PageCache) frame(ctx context.Context, o object, t *block.SeekTable, i int) (*framePages, error) {
	return shared(c, ctx, fmt.Sprintf("%s#%d", o.name, i), func() (*framePages, error) {
		fr := t.Frames[i]
		enc, err := c.fetch(ctx, o, fr.EncStart, fr.EncSize)
		if err != nil {
			return nil, err
		}
		buf := decodeBufs.Get().(*[]byte)
		defer decodeBufs.Put(buf)
		dec, err := block.AppendFrames((*buf)[:0], o.file, t, i, i, enc)
		if err != nil {
			return nil, err
		}
		*buf = dec
		c.decodedBytes.Add(int64(len(dec)))
		return c.offer(o, fr.Start, dec), nil
	})
}

// columnFrame returns frame i of a zstd-columns chunk segment, opened once
// for all the queries that ask meanwhile and kept in the cache. Its budget
// share is what it holds: the column form and the entries' layout, then
// the chunks written back as they are read (grew).
func (c *PageCache) columnFrame(ctx context.Context, o object, i int) (*block.ColumnFrame, error) {
	k := frameKey(o, i)
	c.mtx.Lock()
	if e, ok := c.pages[k]; ok {
		c.lru.MoveToFront(e)
		c.mtx.Unlock()
		c.hits.Add(1)
		return e.Value.(*page).frame, nil
	}
	c.mtx.Unlock()
	c.misses.Add(1)
	t, err := c.seekTable(ctx, o)
	if err != nil {
		return nil, err
	}
	return shared(c, ctx, fmt.Sprintf("%s#columns%d", o.name, i), func() (*block.ColumnFrame, error) {
		fr := t.Frames[i]
		enc, err := c.fetch(ctx, o, fr.EncStart, fr.EncSize)
		if err != nil {
			return nil, err
		}
		f, err := block.OpenColumnFrame(t, i, enc)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", o.name, err)
		}
		c.mtx.Lock()
		c.insertLocked(&page{key: k, frame: f, size: f.Bytes()})
		c.mtx.Unlock()
		return f, nil
	})
}

// grew adds n bytes to the budget share of the cached frame i of o (the
// chunks a read wrote back), evicting others to stay within the budget. A
// frame no longer cached is not counted: its readers free it.
func (c *PageCache) grew(o object, i int, n int64) {
	if n == 0 {
		return
	}
	c.mtx.Lock()
	defer c.mtx.Unlock()
	e, ok := c.pages[frameKey(o, i)]
	if !ok {
		return
	}
	e.Value.(*page).size += n
	c.bytes += n
	for c.bytes > c.maxBytes {
		back := c.lru.Back()
		if back == nil {
			break
		}
		c.removeLocked(back)
		c.evictions.Add(1)
	}
}

func (c *PageCache) pageLen(o object, p int64) int64 {
	return min(o.size, (p+1)*c.pageSize) - p*c.pageSize
}

// seekTable returns an encoded object's seek table, read on first use.
func (c *PageCache) seekTable(ctx context.Context, o object) (*block.SeekTable, error) {
	if t := o.seek.Load(); t != nil {
		return t, nil
	}
	n := block.SeekTableLen(o.file)
	tail, err := shared(c, ctx, o.name+"#seek", func() ([]byte, error) { return c.fetch(ctx, o, o.file.StoredBytes-n, n) })
	if err != nil {
		return nil, err
	}
	t, err := block.ParseSeekTable(o.file, tail)
	if err != nil {
		return nil, err
	}
	o.seek.Store(t)
	return t, nil
}

// shared runs load once for all the queries that ask for key meanwhile
// (a waiter whose loader was cancelled loads again itself).
func shared[T any](c *PageCache, ctx context.Context, key string, load func() (T, error)) (T, error) {
	for {
		c.mtx.Lock()
		l, waiting := c.loading[key]
		if !waiting {
			l = &loadCall{done: make(chan struct{})}
			c.loading[key] = l
		}
		c.mtx.Unlock()
		if waiting {
			select {
			case <-l.done:
			case <-ctx.Done():
				var zero T
				return zero, ctx.Err()
			}
			if l.abandoned {
				continue
			}
			v, _ := l.val.(T)
			return v, l.err
		}
		v, err := load()
		c.mtx.Lock()
		delete(c.loading, key)
		l.val, l.err, l.abandoned = v, err, err != nil && ctx.Err() != nil
		c.mtx.Unlock()
		close(l.done)
		return v, err
	}
}

// loadCall is one load of shared, its result for the queries waiting on it.
type loadCall struct {
	done      chan struct{}
	val       any
	err       error
	abandoned bool // the loading query's context ended: each waiter loads again
}

// readHeaderRange reads [off, off+length) of o for an index header load:
// one range request on a plain object (not through the pages: the caller
// offers what it keeps), the cached pages of an encoded one.
func (c *PageCache) readHeaderRange(ctx context.Context, o object, off, length int64) ([]byte, error) {
	if o.encoded() {
		return c.Range(ctx, o, off, off+length)
	}
	return c.fetch(ctx, o, off, length)
}

// insertLocked adds a page, evicting the least recently used ones to stay
// within the budget. A page larger than the whole budget is not kept.
func (c *PageCache) insertLocked(p *page) {
	n := p.size
	if n > c.maxBytes {
		return
	}
	if _, ok := c.pages[p.key]; ok {
		return
	}
	for c.bytes+n > c.maxBytes {
		back := c.lru.Back()
		if back == nil {
			break
		}
		c.removeLocked(back)
		c.evictions.Add(1)
	}
	c.pages[p.key] = c.lru.PushFront(p)
	c.bytes += n
}

func (c *PageCache) removeLocked(e *list.Element) {
	p := e.Value.(*page)
	c.lru.Remove(e)
	delete(c.pages, p.key)
	c.bytes -= p.size
}

// offer caches the whole pages of o within buf, which holds o's bytes from
// off (bytes a header load read anyway, a decoded frame), and returns buf
// copied page by page.
func (c *PageCache) offer(o object, off int64, buf []byte) *framePages {
	fp := &framePages{first: off / c.pageSize}
	if len(buf) == 0 {
		return fp
	}
	end := off + int64(len(buf))
	for p := fp.first; p*c.pageSize < end; p++ {
		// Copied before taking the lock: a decoded frame is a megabyte.
		fp.pages = append(fp.pages, append([]byte(nil), buf[max(off, p*c.pageSize)-off:min(end, (p+1)*c.pageSize)-off]...))
	}
	c.mtx.Lock()
	defer c.mtx.Unlock()
	for k, data := range fp.pages {
		if p := fp.first + int64(k); int64(len(data)) == c.pageLen(o, p) {
			c.insertLocked(&page{key: pageKey{o.name, p}, data: data, size: int64(len(data))})
		}
	}
	return fp
}

// Drop removes every page of the named objects (a block that left the bucket).
func (c *PageCache) Drop(objects map[string]struct{}) {
	c.mtx.Lock()
	defer c.mtx.Unlock()
	for e := c.lru.Front(); e != nil; {
		next := e.Next()
		if _, ok := objects[e.Value.(*page).key.object]; ok {
			c.removeLocked(e)
		}
		e = next
	}
}

// window is a query's private view of the last run of pages it read from
// one object. Series entries and chunks are read in ascending order by a
// block's series set, and a query merging many blocks interleaves their
// reads: without a window each block's next read would find its page evicted
// by the other blocks' reads and fetch it again.
//
// A streaming window (series entries, chunks) also reads ahead: each move to
// a new run grows the run (1, 2, 4, ... up to maxPages pages) and starts
// fetching the following run in the background, so while PromQL iterates
// over one block the next pages of every other block are already on their
// way (the blocks' fetches overlap instead of queueing behind each other).
// A window holds at most two runs, as the cache's own pages: a read within
// one page is a slice of it, and only a read across a page boundary (a few
// in a hundred for chunks and series entries) is copied. (Joining each run
// into one buffer cost a 24-hour dashboard query 4.4 MB of copies, over half
// of what it allocated.)
type window struct {
	c         *PageCache
	o         object
	maxPages  int64
	streaming bool

	pages [][]byte // the run, pages of c.pageSize bytes (the object's last may be shorter)
	start int64    // offset of pages[0]
	ra    int64    // pages of the next run
	next  *prefetch
	// limit, when set, is where the reader knows its reads end: nothing
	// past it is read ahead.
	limit int64
}

type prefetch struct {
	start, end int64
	done       chan struct{}
	pages      [][]byte
	err        error
}

// runEnd is the offset just past the run.
func (w *window) runEnd() int64 {
	return min(w.o.size, w.start+int64(len(w.pages))*w.c.pageSize)
}

func (w *window) has(start, end int64) bool {
	return w.pages != nil && start >= w.start && end <= w.runEnd()
}

// slice returns bytes [start, end) of the run, capped so that nothing can
// append into a cached page.
func (w *window) slice(start, end int64) []byte {
	ps := w.c.pageSize
	if end <= start {
		return []byte{}
	}
	first, last := (start-w.start)/ps, (end-1-w.start)/ps
	if first == last {
		off := w.start + first*ps
		return w.pages[first][start-off : end-off : end-off]
	}
	out := make([]byte, 0, end-start)
	for i := first; i <= last; i++ {
		off := w.start + i*ps
		out = append(out, w.pages[i][max(start, off)-off:min(end, off+int64(len(w.pages[i])))-off]...)
	}
	return out
}

// read returns bytes [start, end) of the object.
func (w *window) read(ctx context.Context, start, end int64) ([]byte, error) {
	if err := w.load(ctx, start, end); err != nil {
		return nil, err
	}
	return w.slice(start, end), nil
}

// load makes the window hold bytes [start, end) of the object.
func (w *window) load(ctx context.Context, start, end int64) error {
	if start < 0 || end > w.o.size || start > end {
		return fmt.Errorf("read %s: range [%d,%d) outside object of %d bytes", w.o.name, start, end, w.o.size)
	}
	if start == end || w.has(start, end) {
		return nil
	}
	ps := w.c.pageSize
	if p := w.next; p != nil && start >= p.start && end <= p.end {
		w.next = nil
		select {
		case <-p.done:
		case <-ctx.Done():
			return ctx.Err()
		}
		if p.err == nil {
			w.pages, w.start = p.pages, p.start
			w.ra = min(w.maxPages, 2*w.ra)
			w.prefetchNext(ctx)
			return nil
		}
		// Read again below: the error is reported for this read.
	}
	sequential := w.pages != nil && start >= w.start && start <= w.runEnd()+ps
	switch {
	case !sequential || w.ra == 0:
		w.ra = 1
	default:
		w.ra = min(w.maxPages, 2*w.ra)
	}
	ws := start / ps * ps
	we := min(w.o.size, max(end, min(w.end(), ws+w.ra*ps)))
	pages, err := w.c.getPages(ctx, w.o, ws/ps, (max(we, ws+1)-1)/ps)
	if err != nil {
		return err
	}
	w.pages, w.start = pages, ws
	if w.streaming && sequential {
		w.prefetchNext(ctx)
	}
	return nil
}

func (w *window) end() int64 {
	if w.limit > 0 {
		return min(w.limit, w.o.size)
	}
	return w.o.size
}

// prefetchNext starts fetching the run after the current one.
func (w *window) prefetchNext(ctx context.Context) {
	s := w.runEnd()
	if s >= w.end() {
		return
	}
	e := min(w.end(), s+w.ra*w.c.pageSize)
	p := &prefetch{start: s, done: make(chan struct{})}
	first, last := s/w.c.pageSize, (e-1)/w.c.pageSize
	p.end = min(w.o.size, (last+1)*w.c.pageSize)
	w.next = p
	go func() {
		p.pages, p.err = w.c.getPages(ctx, w.o, first, last)
		close(p.done)
	}()
}

// readRange reads length bytes at off of the named object in one request.
func readRange(ctx context.Context, bkt objstore.BucketReader, name string, off, length int64) ([]byte, error) {
	rc, err := bkt.GetRange(ctx, name, off, length)
	if err != nil {
		return nil, fmt.Errorf("get range [%d,+%d) of %s: %w", off, length, name, err)
	}
	defer rc.Close()
	buf := make([]byte, length)
	n, err := io.ReadFull(rc, buf)
	if err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("get range [%d,+%d) of %s: short read of %d bytes", off, length, name, n)
		}
		return nil, fmt.Errorf("get range [%d,+%d) of %s: %w", off, length, name, err)
	}
	return buf, nil
}
