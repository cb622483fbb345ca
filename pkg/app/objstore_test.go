package app

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestObjstoreModulesFollowTheRoles: the shipper runs with the ingest role,
// the bucket store with the query role (which needs ingest in its process
// until scale-out); the default bucket is a directory in the data directory.
func TestObjstoreModulesFollowTheRoles(t *testing.T) {
	for _, tc := range []struct {
		target               string
		shipper, bucketStore bool
	}{
		{All, true, true},
		{Ingest, true, false},
		{Ingest + "," + Query, true, true},
	} {
		t.Run(tc.target, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Target = tc.target
			cfg.Server.ListenAddress = "127.0.0.1:0"
			cfg.TSDB.Dir = t.TempDir()
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			a, err := New(cfg, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := a.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := a.Stop(); err != nil {
					t.Error(err)
				}
			}()
			if (a.Shipper != nil) != tc.shipper || (a.BucketStore != nil) != tc.bucketStore {
				t.Fatalf("target %s: shipper %v, bucket store %v", tc.target, a.Shipper != nil, a.BucketStore != nil)
			}
			if _, err := os.Stat(filepath.Join(cfg.TSDB.Dir, "bucket")); err != nil {
				t.Fatalf("default bucket directory: %v", err)
			}
		})
	}
}
