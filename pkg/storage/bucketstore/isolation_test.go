package bucketstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/thanos-io/objstore"
)

// gatedBucket holds GetRange calls on objects that match until the call's
// context ends or the gate is opened, and reports each held call.
type gatedBucket struct {
	objstore.Bucket
	match func(name string) bool

	mtx    sync.Mutex
	gate   chan struct{} // closed: calls pass
	held   chan string   // one send per held call
	ranges int
}

func newGatedBucket(bkt objstore.Bucket, match func(string) bool) *gatedBucket {
	return &gatedBucket{Bucket: bkt, match: match, gate: make(chan struct{}), held: make(chan string, 100)}
}

func (b *gatedBucket) open() {
	b.mtx.Lock()
	defer b.mtx.Unlock()
	select {
	case <-b.gate:
	default:
		close(b.gate)
	}
}

func (b *gatedBucket) GetRange(ctx context.Context, name string, off, length int64) (io.ReadCloser, error) {
	b.mtx.Lock()
	b.ranges++
	gate := b.gate
	b.mtx.Unlock()
	if b.match(name) {
		select {
		case <-gate:
		default:
			b.held <- name
			select {
			case <-gate:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
	return b.Bucket.GetRange(ctx, name, off, length)
}

// A query that is cancelled while it fetches a page another query waits for
// must not fail that other query (Grafana cancels queries on every refresh).
func TestCancelledFetchDoesNotFailWaiters(t *testing.T) {
	inner := objstore.NewInMemBucket()
	payload := bytes.Repeat([]byte("0123456789abcdef"), 1024) // 16 KiB
	if err := inner.Upload(context.Background(), "obj", bytes.NewReader(payload)); err != nil {
		t.Fatal(err)
	}
	bkt := newGatedBucket(inner, func(string) bool { return true })
	c := NewPageCache(4096, 1<<20)
	o := object{bkt: bkt, name: "obj", size: int64(len(payload))}

	ctx1, cancel1 := context.WithCancel(context.Background())
	defer cancel1()
	err1 := make(chan error, 1)
	go func() {
		_, err := c.Range(ctx1, o, 0, 4096)
		err1 <- err
	}()
	<-bkt.held // the first query's fetch is under way

	type result struct {
		b   []byte
		err error
	}
	res2 := make(chan result, 1)
	go func() {
		b, err := c.Range(context.Background(), o, 100, 200)
		res2 <- result{b, err}
	}()
	// Let the second query find the page in flight, then cancel the first.
	waitUntil(t, time.Second, func() bool {
		c.mtx.Lock()
		defer c.mtx.Unlock()
		return c.misses.Load() >= 2
	})
	cancel1()
	if err := <-err1; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled query: %v, want context.Canceled", err)
	}
	// The second query may fetch again (held by the gate until it opens).
	select {
	case r := <-res2:
		t.Fatalf("waiting query answered before any fetch of its own: %v", r.err)
	case <-bkt.held:
		bkt.open()
	case <-time.After(5 * time.Second):
		t.Fatal("waiting query neither answered nor fetched the page itself")
	}
	r := <-res2
	if r.err != nil {
		t.Fatalf("waiting query failed with the cancelled query's error: %v", r.err)
	}
	if !bytes.Equal(r.b, payload[100:200]) {
		t.Fatal("waiting query got wrong bytes")
	}
	// A real bucket error is still shared (not retried by every waiter).
}

// With a block's index header load held by a slow bucket, /metrics, a sync
// and a query of another block answer promptly.
func TestSlowHeaderLoadStallsNothingElse(t *testing.T) {
	dir := t.TempDir()
	series := testSeries(2)
	inner := objstore.NewInMemBucket()
	slow := uploadBlock(t, inner, "t", writeBlock(t, dir, series, 0, 60*minute, minute))
	uploadBlock(t, inner, "t", writeBlock(t, dir, series, 120*minute, 180*minute, minute))
	slowIndex := "t/" + slow.ULID.String() + "/index"
	bkt := newGatedBucket(inner, func(name string) bool { return name == slowIndex })
	defer bkt.open()

	reg := prometheus.NewRegistry()
	cfg := DefaultConfig()
	s, err := New(cfg, bkt, quietLogger(), reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}

	slowDone := make(chan error, 1)
	go func() {
		q := mustQuerier(t, s, "t", 0, 59*minute, nil)
		defer q.Close()
		ss := q.Select(ctx, true, nil, labels.MustNewMatcher(labels.MatchEqual, "__name__", "up"))
		for ss.Next() {
		}
		slowDone <- ss.Err()
	}()
	<-bkt.held // the slow block's header load is under way

	within := func(what string, f func() error) {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- f() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s: %v", what, err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("%s stalled behind a slow index header load", what)
		}
	}
	var wg sync.WaitGroup
	for what, f := range map[string]func() error{
		"metrics collection": func() error {
			mfs, err := reg.Gather()
			if err != nil {
				return err
			}
			for _, mf := range mfs {
				if strings.HasPrefix(mf.GetName(), "gpustore_bucketstore_blocks") {
					return nil
				}
			}
			return errors.New("no gpustore_bucketstore_blocks")
		},
		"sync": func() error { return s.Sync(ctx) },
		"query of another block": func() error {
			q := mustQuerier(t, s, "t", 120*minute, 179*minute, nil)
			if q == nil {
				return errors.New("no querier")
			}
			defer q.Close()
			n, err := samples(q.Select(ctx, true, nil, labels.MustNewMatcher(labels.MatchEqual, "__name__", "up")))
			if err == nil && n != 2*60 {
				return fmt.Errorf("%d samples, want %d", n, 2*60)
			}
			return err
		},
		"idle unload": func() error { s.unloadIdle(time.Now()); return nil },
	} {
		wg.Add(1)
		go func() { defer wg.Done(); within(what, f) }()
	}
	wg.Wait()
	bkt.open()
	if err := <-slowDone; err != nil {
		t.Fatalf("slow query: %v", err)
	}
}

// samples counts the float samples of a series set.
func samples(ss storage.SeriesSet) (int, error) {
	n := 0
	var it chunkenc.Iterator
	for ss.Next() {
		it = ss.At().Iterator(it)
		for it.Next() == chunkenc.ValFloat {
			n++
		}
		if err := it.Err(); err != nil {
			return n, err
		}
	}
	return n, ss.Err()
}

func waitUntil(t *testing.T, d time.Duration, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in time")
		}
		time.Sleep(time.Millisecond)
	}
}
