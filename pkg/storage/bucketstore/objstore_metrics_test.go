package bucketstore

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/thanos-io/objstore"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/storage/bucketindex"
)

// Reads of objects that may rightly be missing (a block's meta.json while it
// uploads, marks of unmarked blocks, a tenant's bucket index before the
// compactor wrote it) are answers, not failed operations: on a healthy
// bucket objstore_bucket_operation_failures_total stays 0, so the
// GpustoreObjectStoreErrors alert sees only real failures. A missing object
// read where it must exist still counts.
func TestMissingObjectsAreNoFailedOperations(t *testing.T) {
	eachBucket(t, func(t *testing.T, raw objstore.Bucket) {
		ctx := context.Background()
		reg := prometheus.NewRegistry()
		bkt := objstore.WrapWithMetrics(raw, reg, "gpustore")
		complete := uploadBlock(t, bkt, "t", writeBlock(t, t.TempDir(), testSeries(1), 0, 60*minute, minute))
		partial := ulid.Make() // an upload in progress: chunks, no meta.json yet
		if err := bkt.Upload(ctx, block.ObjectName("t", partial, "chunks/000001"), strings.NewReader("chunks")); err != nil {
			t.Fatal(err)
		}

		s := storeWith(t, bkt, prometheus.NewRegistry(), func(c *Config) { c.BucketIndexEnabled = true })
		if got := blockIDs(s, "t"); len(got) != 1 || got[0] != complete.ULID {
			t.Fatalf("visible blocks %v, want %s", got, complete.ULID)
		}
		if _, err := block.ReadMeta(ctx, bkt, "t", partial); !errors.Is(err, block.ErrNoMeta) {
			t.Fatalf("meta.json of the partial block: %v, want ErrNoMeta", err)
		}
		if m, err := block.ReadDeletionMark(ctx, bkt, "t", complete.ULID); m != nil || err != nil {
			t.Fatalf("deletion mark of an unmarked block: %v %v", m, err)
		}
		if m, err := block.ReadNoCompactMark(ctx, bkt, "t", complete.ULID); m != nil || err != nil {
			t.Fatalf("no-compact mark of an unmarked block: %v %v", m, err)
		}
		if _, err := bucketindex.Read(ctx, bkt, "t"); !errors.Is(err, bucketindex.ErrNotFound) {
			t.Fatalf("bucket index before the compactor wrote one: %v, want ErrNotFound", err)
		}
		if n := failedOperations(t, reg); n != 0 {
			t.Fatalf("%g failed operations counted on a healthy bucket, want 0", n)
		}

		// A chunk file missing where meta.json lists it is a real failure.
		rc, err := bkt.Get(ctx, block.ObjectName("t", partial, "index"))
		if err == nil {
			rc.Close()
			t.Fatal("got an object that was never uploaded")
		}
		if n := failedOperations(t, reg); n != 1 {
			t.Fatalf("%g failed operations after reading a missing object that must exist, want 1", n)
		}
	})
}

// failedOperations sums objstore_bucket_operation_failures_total.
func failedOperations(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() == "objstore_bucket_operation_failures_total" {
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}
