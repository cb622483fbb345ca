// Package bucket opens the object storage bucket that blocks are shipped to
// and read back from.
//
// The configuration has the shape Thanos users already have
// (github.com/thanos-io/objstore/client's BucketConfig):
//
//	type: S3            # or GCS, AZURE, FILESYSTEM
//	config:             # the provider's own options, unchanged
//	  bucket: gpustore
//	  endpoint: minio:9000
//	  access_key: ...
//	  secret_key: ...
//	  insecure: true
//	prefix: ""          # optional: every object under this prefix
//
// objstore's client package would bring every provider (COS, OCI, Swift, OBS,
// BOS, OSS, ...) and their SDKs into gpustore's module graph; the providers
// gpustore supports, S3 (any S3-compatible store: AWS, MinIO, Ceph,
// versitygw), GCS, AZURE (Azure Blob Storage) and FILESYSTEM, are built here
// through their provider packages directly, from the same YAML.
package bucket

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/thanos-io/objstore"
	"github.com/thanos-io/objstore/providers/gcs"
	"github.com/thanos-io/objstore/providers/s3"
	"gopkg.in/yaml.v3"

	"github.com/gpustore/gpustore/internal/logging"
)

// Provider types accepted in Config.Type (case-insensitive, as in objstore).
const (
	S3         = string(objstore.S3)
	GCS        = string(objstore.GCS)
	Azure      = string(objstore.AZURE)
	Filesystem = string(objstore.FILESYSTEM)
)

// DefaultDirName is where the embedded default FILESYSTEM bucket lives,
// under the data directory.
const DefaultDirName = "bucket"

// Config is objstore's client configuration: a provider type and the
// provider's own options.
type Config struct {
	// Type is the provider: S3 (AWS, MinIO, Ceph, versitygw, ...), GCS
	// (Google Cloud Storage), AZURE (Azure Blob Storage) or FILESYSTEM (a
	// directory; <tsdb.dir>/bucket without config.directory).
	Type string `yaml:"type"`
	// Config is the provider's own options, as objstore (and Thanos) take
	// them: bucket, endpoint, access_key, secret_key, insecure, ... for S3;
	// bucket, service_account, ... for GCS; storage_account,
	// storage_account_key, container, ... for AZURE; directory for
	// FILESYSTEM.
	Config map[string]any `yaml:"config"`
	// Prefix is prepended to every object name: several gpustores can
	// share one bucket.
	Prefix string `yaml:"prefix"`
	// ConfigFile, when set, names a YAML file of the same shape (type, config,
	// prefix: a Thanos objstore.config-file works unchanged) that replaces the
	// three fields above.
	ConfigFile string `yaml:"config_file"`
}

// DefaultConfig is a FILESYSTEM bucket in <data-dir>/bucket: `make run`
// ships and reads back blocks with nothing else to set up.
func DefaultConfig() Config {
	return Config{Type: Filesystem}
}

// Resolved returns the configuration with ConfigFile (if any) read in.
func (c Config) Resolved() (Config, error) {
	if c.ConfigFile == "" {
		return c, nil
	}
	b, err := os.ReadFile(c.ConfigFile)
	if err != nil {
		return c, fmt.Errorf("read objstore config file: %w", err)
	}
	return Parse(b, c.ConfigFile)
}

// Parse reads an objstore client configuration (type, config, prefix).
func Parse(b []byte, source string) (Config, error) {
	var fc struct {
		Type   string         `yaml:"type"`
		Config map[string]any `yaml:"config"`
		Prefix string         `yaml:"prefix"`
	}
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	if err := dec.Decode(&fc); err != nil {
		return Config{}, fmt.Errorf("parse objstore config %s: %w", source, err)
	}
	return Config{Type: fc.Type, Config: fc.Config, Prefix: fc.Prefix}, nil
}

// Validate checks the provider type and the provider's own options, without
// connecting to anything.
func (c Config) Validate() error {
	r, err := c.Resolved()
	if err != nil {
		return err
	}
	switch strings.ToUpper(r.Type) {
	case Filesystem:
		return nil
	case S3:
		return r.require("S3", "bucket", "endpoint")
	case GCS:
		return r.require("GCS", "bucket")
	case Azure:
		return r.require("AZURE", "storage_account", "container")
	case "":
		return errors.New("bucket type must be set (S3, GCS, AZURE or FILESYSTEM)")
	}
	return fmt.Errorf("bucket type %q is not supported: gpustore builds S3, GCS, AZURE and FILESYSTEM", r.Type)
}

// require checks that the provider's options set every key in keys to a
// non-empty string: what the provider cannot do without. The provider
// checks the rest (unknown keys among them) when New builds its client.
func (c Config) require(provider string, keys ...string) error {
	var missing []string
	for _, k := range keys {
		if v, _ := c.Config[k].(string); v == "" {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%s bucket config needs %s", provider, strings.Join(missing, " and "))
	}
	return nil
}

// New opens the configured bucket, instrumented with objstore's metrics
// (objstore_bucket_operations_total{bucket="gpustore",operation}, failures,
// durations, fetched bytes) registered on reg. dataDir is where an empty
// FILESYSTEM config puts the bucket (<dataDir>/bucket).
func New(c Config, dataDir string, logger *slog.Logger, reg prometheus.Registerer) (objstore.InstrumentedBucket, error) {
	r, err := c.Resolved()
	if err != nil {
		return nil, err
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	var (
		bkt    objstore.Bucket
		folder *durableFolder // a FILESYSTEM bucket
	)
	switch strings.ToUpper(r.Type) {
	case Filesystem:
		dir, _ := r.Config["directory"].(string)
		if dir == "" {
			dir = filepath.Join(dataDir, DefaultDirName)
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("create bucket directory: %w", err)
		}
		if folder, err = newDurableFolder(dir); err == nil {
			bkt = folder
		}
	case S3, GCS:
		var raw []byte
		raw, err = yaml.Marshal(r.Config)
		if err != nil {
			return nil, fmt.Errorf("bucket config: %w", err)
		}
		if strings.ToUpper(r.Type) == S3 {
			bkt, err = s3.NewBucket(logging.GoKit(logger), raw, "gpustore", nil)
		} else {
			// Builds the client without connecting; the context only
			// reads a service_account key.
			bkt, err = gcs.NewBucket(context.Background(), logging.GoKit(logger), raw, "gpustore", nil)
		}
	case Azure:
		bkt, err = newAzureBucket(logging.GoKit(logger), r.Config)
	}
	if err != nil {
		return nil, fmt.Errorf("create %s bucket client: %w", r.Type, err)
	}
	if r.Prefix != "" {
		bkt = objstore.NewPrefixedBucket(bkt, r.Prefix)
	}
	ib := objstore.WrapWithMetrics(bkt, reg, "gpustore")
	if folder != nil {
		return folderBucket{InstrumentedBucket: ib, folder: folder, prefix: r.Prefix}, nil
	}
	return ib, nil
}

// folderBucket is a FILESYSTEM bucket that also takes local files by hard
// link (block.Linker): blocks uploaded from the same disk are stored once.
type folderBucket struct {
	objstore.InstrumentedBucket
	folder *durableFolder
	prefix string // the configured prefix of object names
}

// Link makes the object name the file src without copying it. A file
// already at name is removed first: writing into it would write into src
// when it is a link of src. It fails when src is on another filesystem
// (EXDEV); the caller then copies.
func (b folderBucket) Link(src, name string) error {
	return b.folder.link(src, path.Join(b.prefix, name))
}

// Describe is a one-line description of the bucket for logs (no secrets).
func (c Config) Describe(dataDir string) string {
	r, err := c.Resolved()
	if err != nil {
		return "invalid: " + err.Error()
	}
	switch strings.ToUpper(r.Type) {
	case Filesystem:
		dir, _ := r.Config["directory"].(string)
		if dir == "" {
			dir = filepath.Join(dataDir, DefaultDirName)
		}
		return "FILESYSTEM " + dir
	case S3:
		return fmt.Sprintf("S3 %v/%v", r.Config["endpoint"], r.Config["bucket"])
	case GCS:
		return fmt.Sprintf("GCS %v", r.Config["bucket"])
	case Azure:
		return fmt.Sprintf("AZURE %v/%v", r.Config["storage_account"], r.Config["container"])
	}
	return r.Type
}

// RegisterFlags binds --objstore.config-file (Thanos' flag name).
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.ConfigFile, "objstore.config-file", c.ConfigFile, "YAML file with the bucket configuration (type: S3|GCS|AZURE|FILESYSTEM, config: ...), as Thanos takes it; replaces the bucket section. Default: FILESYSTEM in <storage.tsdb.path>/bucket.")
}
