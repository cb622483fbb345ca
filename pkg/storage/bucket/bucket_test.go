package bucket

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestDefaultIsAFilesystemBucketInTheDataDir(t *testing.T) {
	dir := t.TempDir()
	reg := prometheus.NewRegistry()
	bkt, err := New(DefaultConfig(), dir, slog.New(slog.DiscardHandler), reg)
	if err != nil {
		t.Fatal(err)
	}
	defer bkt.Close()
	if err := bkt.Upload(context.Background(), "t/x", strings.NewReader("hello")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, DefaultDirName, "t", "x")); err != nil {
		t.Fatalf("object not under <data>/bucket: %v", err)
	}
	if n, err := testutil.GatherAndCount(reg, "objstore_bucket_operations_total"); err != nil || n == 0 {
		t.Fatalf("bucket metrics not registered: %d %v", n, err)
	}
}

func TestConfigFileInThanosFormat(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "objstore.yml")
	// What a Thanos user has, for MinIO.
	if err := os.WriteFile(file, []byte("type: s3\nconfig:\n  bucket: gpustore\n  endpoint: minio:9000\n  access_key: k\n  secret_key: s\n  insecure: true\nprefix: cluster-a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := DefaultConfig()
	c.ConfigFile = file
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	r, err := c.Resolved()
	if err != nil || r.Type != "s3" || r.Prefix != "cluster-a" || r.Config["endpoint"] != "minio:9000" {
		t.Fatalf("resolved %+v, %v", r, err)
	}
	if got := c.Describe(dir); got != "S3 minio:9000/gpustore" {
		t.Fatalf("describe: %q", got)
	}
	// The S3 client is built without connecting.
	bkt, err := New(c, dir, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	bkt.Close()
}

func TestInvalidConfigs(t *testing.T) {
	for name, c := range map[string]Config{
		"no type":            {},
		"unknown type":       {Type: "COS"},
		"s3 no bucket":       {Type: "S3", Config: map[string]any{"endpoint": "x:9000"}},
		"s3 no endpoint":     {Type: "S3", Config: map[string]any{"bucket": "b"}},
		"gcs no bucket":      {Type: "GCS", Config: map[string]any{"service_account": "{}"}},
		"azure no container": {Type: "AZURE", Config: map[string]any{"storage_account": "acct"}},
		"azure no account":   {Type: "azure", Config: map[string]any{"container": "gpustore"}},
		"missing file":       {Type: "S3", ConfigFile: "/nonexistent/objstore.yml"},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := Parse([]byte("type: S3\nconfg: {}\n"), "x"); err == nil {
		t.Error("unknown field accepted")
	}
}

// TestCloudConfigFilesInThanosFormat: the GCS and Azure files Thanos users
// have are valid as they are, and described without their secrets.
func TestCloudConfigFilesInThanosFormat(t *testing.T) {
	dir := t.TempDir()
	for file, want := range map[string]string{
		"type: GCS\nconfig:\n  bucket: gpu-metrics\n  service_account: '{\"type\": \"service_account\"}'\n":                         "GCS gpu-metrics",
		"type: azure\nconfig:\n  storage_account: gpustoreacct\n  storage_account_key: c2VjcmV0\n  container: blocks\nprefix: eu\n": "AZURE gpustoreacct/blocks",
	} {
		c := DefaultConfig()
		c.ConfigFile = filepath.Join(dir, "objstore.yml")
		if err := os.WriteFile(c.ConfigFile, []byte(file), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := c.Validate(); err != nil {
			t.Errorf("%s: %v", want, err)
		}
		if got := c.Describe(dir); got != want {
			t.Errorf("describe: %q, want %q", got, want)
		}
	}
}
