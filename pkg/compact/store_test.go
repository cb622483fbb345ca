package compact_test

import (
	"fmt"
	"strings"
	"testing"
)

// recordingTB records what a test would be failed or skipped with.
type recordingTB struct {
	testing.TB
	fatal, skip string
}

func (r *recordingTB) Fatalf(format string, args ...any) { r.fatal = fmt.Sprintf(format, args...) }
func (r *recordingTB) Skipf(format string, args ...any)  { r.skip = fmt.Sprintf(format, args...) }
func (r *recordingTB) Logf(string, ...any)               {}

// TestStoreWithoutVersitygw: without the versitygw binary the compact tests
// run against a folder bucket (they are never skipped), except under CI,
// where a missing S3 server fails them; GPUSTORE_TEST_BUCKET=filesystem
// asks for the folder bucket.
func TestStoreWithoutVersitygw(t *testing.T) {
	r := &recordingTB{TB: t}
	s := pickStore(r, "", "", false)
	if r.fatal != "" || r.skip != "" || s.s3Addr != "" || s.dir == "" {
		t.Fatalf("no versitygw, not CI: store %+v, fatal %q, skip %q; want a folder bucket", s, r.fatal, r.skip)
	}
	bkt := openBucket(t, s)
	if err := bkt.Upload(t.Context(), "t/x", strings.NewReader("x")); err != nil {
		t.Fatalf("the folder bucket does not take an object: %v", err)
	}
	r = &recordingTB{TB: t}
	pickStore(r, "", "", true)
	if r.fatal == "" {
		t.Fatal("no versitygw under CI=true: the test was not failed")
	}
	r = &recordingTB{TB: t}
	if s := pickStore(r, "/nonexistent/versitygw", "FILESYSTEM", true); s.s3Addr != "" || r.fatal != "" {
		t.Fatalf("GPUSTORE_TEST_BUCKET=filesystem: store %+v, fatal %q", s, r.fatal)
	}
}
