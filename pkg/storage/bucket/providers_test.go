package bucket_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/thanos-io/objstore"

	"github.com/gpustore/gpustore/internal/testbin"
	"github.com/gpustore/gpustore/pkg/storage/bucket"
)

// TestEveryProviderThroughTheBucketConfig: for each cloud provider, a real
// server on loopback (versitygw, fake-gcs-server, Azurite) behind the
// configuration a user writes (type, config, prefix), through every bucket
// operation the shipper, the bucket store and the compactor use.
func TestEveryProviderThroughTheBucketConfig(t *testing.T) {
	for _, provider := range testbin.ObjectStoreProviders {
		t.Run(provider, func(t *testing.T) {
			srv := testbin.StartObjectStore(t, provider)
			cfg := bucket.Config{Type: srv.Type(), Config: srv.Config(), Prefix: "cluster-a"}
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			bkt, err := bucket.New(cfg, t.TempDir(), slog.New(slog.DiscardHandler), prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			defer bkt.Close()
			exerciseBucket(t, bkt)

			// The prefix is where the objects are: a bucket without it sees them under it.
			raw, err := bucket.New(bucket.Config{Type: srv.Type(), Config: srv.Config()}, t.TempDir(), slog.New(slog.DiscardHandler), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			if ok, err := raw.Exists(context.Background(), "cluster-a/tenant/01BLOCK/meta.json"); err != nil || !ok {
				t.Fatalf("object not under the prefix: %v %v", ok, err)
			}
		})
	}
}

// exerciseBucket writes a block-shaped set of objects and reads them back
// every way gpustore does.
func exerciseBucket(t *testing.T, bkt objstore.Bucket) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	index := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB: more than one upload chunk for some clients
	objects := map[string][]byte{
		"tenant/01BLOCK/chunks/000001": []byte("chunks"),
		"tenant/01BLOCK/index":         index,
		"tenant/01BLOCK/meta.json":     []byte(`{"ulid":"01BLOCK"}`),
		"tenant/bucket-index.json.gz":  []byte("idx"),
	}
	for name, b := range objects {
		if err := bkt.Upload(ctx, name, bytes.NewReader(b)); err != nil {
			t.Fatalf("upload %s: %v", name, err)
		}
	}
	for name, want := range objects {
		r, err := bkt.Get(ctx, name)
		if err != nil {
			t.Fatalf("get %s: %v", name, err)
		}
		got, err := io.ReadAll(r)
		r.Close()
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("get %s: %d bytes (want %d), %v", name, len(got), len(want), err)
		}
		attrs, err := bkt.Attributes(ctx, name)
		if err != nil || attrs.Size != int64(len(want)) {
			t.Fatalf("attributes %s: %+v %v", name, attrs, err)
		}
	}
	// Range reads: the bucket store's pages, in the middle and at the end.
	for _, rg := range [][2]int64{{0, 16}, {1<<20 - 100, 100}, {12345, 32 << 10}} {
		r, err := bkt.GetRange(ctx, "tenant/01BLOCK/index", rg[0], rg[1])
		if err != nil {
			t.Fatalf("range %v: %v", rg, err)
		}
		got, err := io.ReadAll(r)
		r.Close()
		if err != nil || !bytes.Equal(got, index[rg[0]:rg[0]+rg[1]]) {
			t.Fatalf("range %v: %d bytes, %v", rg, len(got), err)
		}
	}
	// Listing: one level (tenants, then blocks), and recursive.
	list := func(dir string, opts ...objstore.IterOption) []string {
		var names []string
		if err := bkt.Iter(ctx, dir, func(n string) error { names = append(names, n); return nil }, opts...); err != nil {
			t.Fatalf("iter %q: %v", dir, err)
		}
		slices.Sort(names)
		return names
	}
	if got, want := list(""), []string{"tenant/"}; !slices.Equal(got, want) {
		t.Fatalf("top level: %q, want %q", got, want)
	}
	if got, want := list("tenant/"), []string{"tenant/01BLOCK/", "tenant/bucket-index.json.gz"}; !slices.Equal(got, want) {
		t.Fatalf("tenant: %q, want %q", got, want)
	}
	if got := list("tenant/01BLOCK/", objstore.WithRecursiveIter()); len(got) != 3 || !strings.HasSuffix(got[0], "chunks/000001") {
		t.Fatalf("recursive: %q", got)
	}
	// A missing object is "not found", as the bucket store and the marks rely on.
	if ok, err := bkt.Exists(ctx, "tenant/01BLOCK/deletion-mark.json"); err != nil || ok {
		t.Fatalf("exists on a missing object: %v %v", ok, err)
	}
	if _, err := bkt.Get(ctx, "tenant/01BLOCK/deletion-mark.json"); !bkt.IsObjNotFoundErr(err) {
		t.Fatalf("get of a missing object: %v is not a not-found error", err)
	}
	// Replacing an object replaces it whole; deleting removes it.
	if err := bkt.Upload(ctx, "tenant/01BLOCK/meta.json", strings.NewReader("{}")); err != nil {
		t.Fatal(err)
	}
	if attrs, err := bkt.Attributes(ctx, "tenant/01BLOCK/meta.json"); err != nil || attrs.Size != 2 {
		t.Fatalf("replaced object: %+v %v", attrs, err)
	}
	if err := bkt.Delete(ctx, "tenant/bucket-index.json.gz"); err != nil {
		t.Fatal(err)
	}
	if ok, err := bkt.Exists(ctx, "tenant/bucket-index.json.gz"); err != nil || ok {
		t.Fatalf("deleted object still exists: %v %v", ok, err)
	}
}

// TestCloudBucketOpensWhileTheCloudIsDown: gpustore must start, and ingest,
// while its bucket cannot be reached (the shipper keeps blocks until it can).
// Azure's client checks for, and creates, its container when it is built
// (storage_create_container, on by default): that must wait for the first
// operation, not fail the start.
func TestCloudBucketOpensWhileTheCloudIsDown(t *testing.T) {
	for _, provider := range testbin.ObjectStoreProviders {
		t.Run(provider, func(t *testing.T) {
			srv := testbin.StartObjectStore(t, provider)
			srv.Stop()
			start := time.Now()
			bkt, err := bucket.New(bucket.Config{Type: srv.Type(), Config: srv.Config()}, t.TempDir(), slog.New(slog.DiscardHandler), nil)
			if err != nil {
				t.Fatalf("open while the server is down: %v", err)
			}
			defer bkt.Close()
			if d := time.Since(start); d > 2*time.Second {
				t.Fatalf("open took %v while the server is down", d)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := bkt.Upload(ctx, "t/x", strings.NewReader("x")); err == nil {
				t.Fatal("upload succeeded while the server is down")
			}
			srv.Start()
			if err := bkt.Upload(ctx, "t/x", strings.NewReader("x")); err != nil {
				t.Fatalf("upload once the server is back: %v", err)
			}
			if ok, err := bkt.Exists(ctx, "t/x"); err != nil || !ok {
				t.Fatalf("uploaded object: %v %v", ok, err)
			}
		})
	}
}
