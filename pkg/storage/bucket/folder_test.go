package bucket

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/thanos-io/objstore"
)

func openFolder(t *testing.T, dir string) objstore.Bucket {
	t.Helper()
	bkt, err := New(Config{Type: Filesystem, Config: map[string]any{"directory": dir}}, t.TempDir(), slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bkt.Close() })
	return bkt
}

func get(t *testing.T, bkt objstore.Bucket, name string) string {
	t.Helper()
	rc, err := bkt.Get(context.Background(), name)
	if err != nil {
		if bkt.IsObjNotFoundErr(err) {
			return "<absent>"
		}
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func list(t *testing.T, bkt objstore.Bucket, dir string, opts ...objstore.IterOption) []string {
	t.Helper()
	var out []string
	if err := bkt.Iter(context.Background(), dir, func(n string) error { out = append(out, n); return nil }, opts...); err != nil {
		t.Fatal(err)
	}
	return out
}

// stalledReader gives head, then waits for release and fails.
type stalledReader struct {
	head    string
	sent    bool
	reached chan struct{}
	release chan struct{}
}

func (r *stalledReader) Read(p []byte) (int, error) {
	if !r.sent {
		r.sent = true
		return copy(p, r.head), nil
	}
	close(r.reached)
	<-r.release
	return 0, errors.New("sender went away")
}

// TestFolderUploadReplacesWhole: an object of the folder bucket (the
// embedded default) is replaced whole or not at all: while an upload is in
// progress readers get the previous object, an upload that fails leaves it
// as it was, and the objects being written are not listed (meta.json, marks
// and the bucket index are written like this; a reader must never see half
// of one). The bucket's temporary directory is never listed, and files a
// crashed upload left in it are removed at open once an hour old.
func TestFolderUploadReplacesWhole(t *testing.T) {
	dir := t.TempDir()
	bkt := openFolder(t, dir)
	ctx := context.Background()
	const name = "tenant/01J0000000000000000000000/meta.json"
	if err := bkt.Upload(ctx, name, strings.NewReader(`{"old":true}`)); err != nil {
		t.Fatal(err)
	}
	r := &stalledReader{head: `{"new":`, reached: make(chan struct{}), release: make(chan struct{})}
	done := make(chan error, 1)
	go func() { done <- bkt.Upload(ctx, name, r) }()
	<-r.reached
	if got := get(t, bkt, name); got != `{"old":true}` {
		t.Errorf("during an upload a reader got %q, want the previous object", got)
	}
	if got := list(t, bkt, "", objstore.WithRecursiveIter()); len(got) != 1 || got[0] != name {
		t.Errorf("during an upload the bucket lists %q, want only %s", got, name)
	}
	close(r.release)
	if err := <-done; err == nil {
		t.Fatal("an upload whose reader failed succeeded")
	}
	if got := get(t, bkt, name); got != `{"old":true}` {
		t.Errorf("after a failed upload the object is %q, want the previous one", got)
	}
	if got := list(t, bkt, ""); len(got) != 1 || got[0] != "tenant/" {
		t.Errorf("the bucket's root lists %q, want only tenant/", got)
	}
	if err := bkt.Upload(ctx, name, strings.NewReader(`{"new":true}`)); err != nil {
		t.Fatal(err)
	}
	if got := get(t, bkt, name); got != `{"new":true}` {
		t.Errorf("after an upload the object is %q", got)
	}

	// A crashed upload's temporary file: removed at the next open once old.
	old := filepath.Join(dir, tmpDirName, "upload-crashed")
	young := filepath.Join(dir, tmpDirName, "upload-running")
	for _, f := range []string{old, young} {
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chtimes(old, time.Now().Add(-2*time.Hour), time.Now().Add(-2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	openFolder(t, dir)
	if _, err := os.Stat(old); !os.IsNotExist(err) {
		t.Errorf("an old temporary file survived the open: %v", err)
	}
	if _, err := os.Stat(young); err != nil {
		t.Errorf("a recent temporary file (an upload of another process) was removed: %v", err)
	}
}
