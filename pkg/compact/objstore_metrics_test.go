package compact_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpustore/gpustore/bench/gpusim"
	"github.com/gpustore/gpustore/internal/testbin"
	"github.com/gpustore/gpustore/pkg/storage/bucket"
)

// Healthy compaction passes on a real S3 server (the lease taken and
// released, marks, metas and the bucket index read before they exist,
// compaction and downsampling) count no failed object-store operation:
// objstore_bucket_operation_failures_total, which GpustoreObjectStoreErrors
// alerts on, rises only for real failures.
func TestHealthyPassesCountNoFailedOperations(t *testing.T) {
	// A real S3 server: the folder bucket has no failures to count.
	s3 := testStore{s3Addr: startS3(t, testbin.Need(t, "versitygw"))}
	reg := prometheus.NewRegistry()
	bkt, err := bucket.New(s3.bucket(), t.TempDir(), quiet(), reg)
	if err != nil {
		t.Fatal(err)
	}
	sl := simSlice{Nodes: 1, GPUs: 2, Start: gpusim.DefaultEpoch, Duration: 8 * time.Hour, Interval: time.Minute, Block: 2 * time.Hour}
	upload(t, bkt, "t", nil, sl.write(t, t.TempDir())...)
	c, creg := newCompactor(t, testConfig(), bkt, nil)
	compactUntilStable(t, c, bkt, "t")
	if n := counter(t, creg, "gpustore_compact_blocks_compacted_total"); n == 0 {
		t.Fatal("nothing compacted: the passes did not exercise the bucket")
	}
	if n := counter(t, reg, "objstore_bucket_operations_total"); n == 0 {
		t.Fatal("no object-store operation counted")
	}
	if n := counter(t, reg, "objstore_bucket_operation_failures_total"); n != 0 {
		t.Fatalf("%g failed object-store operations in healthy passes, want 0", n)
	}
}
