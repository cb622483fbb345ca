package bucketstore

import (
	"bytes"
	"context"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/thanos-io/objstore"
)

// A window answers every read with the object's bytes: reads within a page,
// across pages, at the end, empty, in order and at random, with read-ahead,
// a limit, and a cache small enough to evict pages under it.
func TestWindowReadsLikeTheObject(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(7, 8))
	for round := range 40 {
		data := make([]byte, 1+rng.IntN(20000))
		for i := range data {
			data[i] = byte(rng.IntN(256))
		}
		bkt := objstore.NewInMemBucket()
		if err := bkt.Upload(ctx, "obj", bytes.NewReader(data)); err != nil {
			t.Fatal(err)
		}
		ps := int64(16 + rng.IntN(600))
		c := NewPageCache(ps, ps*int64(1+rng.IntN(8)))
		o := object{bkt: bkt, name: "obj", size: int64(len(data))}
		w := &window{c: c, o: o, maxPages: int64(1 + rng.IntN(6)), streaming: round%2 == 0}
		if round%5 == 0 {
			w.limit = int64(rng.IntN(len(data)) + 1)
		}
		pos := int64(0)
		for range 300 {
			var start int64
			if rng.IntN(4) == 0 {
				start = rng.Int64N(o.size + 1) // a jump
			} else {
				start = min(o.size, pos+rng.Int64N(3*ps)) // onwards, as series sets read
			}
			end := min(o.size, start+rng.Int64N(2*ps+1))
			got, err := w.read(ctx, start, end)
			if err != nil {
				t.Fatalf("round %d: read [%d,%d) of %d bytes (page %d): %v", round, start, end, o.size, ps, err)
			}
			if !bytes.Equal(got, data[start:end]) {
				t.Fatalf("round %d: read [%d,%d) of %d bytes (page %d): wrong bytes", round, start, end, o.size, ps)
			}
			if cap(got) != len(got) {
				t.Fatalf("round %d: read [%d,%d): capacity %d past its length %d: an append would write into a cached page", round, start, end, cap(got), len(got))
			}
			pos = end
		}
		if _, err := w.read(ctx, 0, o.size+1); err == nil {
			t.Fatalf("round %d: a read past the end succeeded", round)
		}
	}
}

// Reading an object through a window copies only the reads that cross a
// page boundary, not the runs of pages it holds: a pass over a cached 4 MiB
// object in chunk-sized reads allocates a small fraction of it.
func TestWindowDoesNotCopyRuns(t *testing.T) {
	ctx := context.Background()
	data := make([]byte, 4<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	bkt := objstore.NewInMemBucket()
	if err := bkt.Upload(ctx, "obj", bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	c := NewPageCache(32<<10, 8<<20)
	o := object{bkt: bkt, name: "obj", size: int64(len(data))}
	pass := func() {
		w := &window{c: c, o: o, maxPages: 16, streaming: true}
		for off := int64(0); off < o.size; off += 200 {
			if _, err := w.read(ctx, off, min(o.size, off+180)); err != nil {
				t.Fatal(err)
			}
		}
		if w.next != nil {
			<-w.next.done
		}
	}
	pass() // fill the cache
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	pass()
	runtime.ReadMemStats(&after)
	if copied := after.TotalAlloc - before.TotalAlloc; copied > uint64(len(data))/8 {
		t.Errorf("a pass over a cached %d-byte object allocated %d bytes", len(data), copied)
	}
}
