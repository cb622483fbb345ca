package app

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/gpustore/gpustore/pkg/ingest"
	"github.com/gpustore/gpustore/pkg/query"
	"github.com/gpustore/gpustore/pkg/server"
	"github.com/gpustore/gpustore/pkg/tenancy"
	"github.com/gpustore/gpustore/pkg/tenantdb"
)

// Config is gpustore's whole configuration: the YAML file's shape. Flags set
// the common knobs and win over the file.
type Config struct {
	Target string          `yaml:"target"`
	Log    LogConfig       `yaml:"log"`
	Server server.Config   `yaml:"server"`
	TSDB   tenantdb.Config `yaml:"tsdb"`
	Tenant tenancy.Config  `yaml:"tenants"`
	Ingest ingest.Config   `yaml:"ingest"`
	Query  query.Config    `yaml:"query"`
}

// LogConfig chooses the log level and format.
type LogConfig struct {
	Level  string `yaml:"level"`
	Format string `yaml:"format"`
}

// DefaultConfig is the embedded default: every role in one process, data in
// ./data, one tenant, port 9201.
func DefaultConfig() Config {
	return Config{
		Target: All,
		Log:    LogConfig{Level: "info", Format: "logfmt"},
		Server: server.DefaultConfig(),
		TSDB:   tenantdb.DefaultConfig(),
		Tenant: tenancy.DefaultConfig(),
		Ingest: ingest.DefaultConfig(),
		Query:  query.DefaultConfig(),
	}
}

// Validate checks every section.
func (c *Config) Validate() error {
	var errs []error
	for _, t := range strings.Split(c.Target, ",") {
		if !isTarget(t) {
			errs = append(errs, fmt.Errorf("unknown target %q: want one of %s", t, strings.Join(Targets(), ", ")))
		}
	}
	for _, v := range []interface{ Validate() error }{c.TSDB, c.Tenant, c.Ingest, c.Query} {
		if err := v.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// RegisterFlags binds the common knobs to fs, with c's values as defaults.
// Names follow Prometheus' dotted style.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Target, "target", c.Target, "Comma-separated roles to run: "+strings.Join(Targets(), ", ")+".")
	fs.StringVar(&c.Log.Level, "log.level", c.Log.Level, "Log level: debug, info, warn, error.")
	fs.StringVar(&c.Log.Format, "log.format", c.Log.Format, "Log format: logfmt or json.")
	fs.StringVar(&c.Server.ListenAddress, "web.listen-address", c.Server.ListenAddress, "Address for the HTTP API (remote write, query, /metrics).")
	fs.Var(&c.Server.ShutdownTimeout, "web.shutdown-timeout", "How long in-flight requests may take to finish on shutdown.")
	fs.StringVar(&c.TSDB.Dir, "storage.tsdb.path", c.TSDB.Dir, "Data directory; each tenant's TSDB lives in <path>/tenants/<tenant>.")
	fs.Var(&c.TSDB.BlockDuration, "storage.tsdb.block-duration", "Duration of a head block (2h in production; minutes in tests).")
	fs.Var(&c.TSDB.Retention, "storage.tsdb.retention.time", "How long local blocks are kept.")
	fs.Var(&c.TSDB.OutOfOrderWindow, "storage.tsdb.out-of-order-window", "Accept samples up to this much older than their series' newest sample (0 rejects them).")
	fs.Int64Var(&c.TSDB.MaxExemplars, "storage.tsdb.max-exemplars", c.TSDB.MaxExemplars, "Exemplars kept in memory per tenant; 0 disables exemplar storage.")
	fs.StringVar(&c.Tenant.DefaultTenant, "tenant.default", c.Tenant.DefaultTenant, "Tenant of requests without X-Scope-OrgID or THANOS-TENANT.")
	fs.Int64Var(&c.Ingest.MaxRequestBytes, "ingest.max-request-bytes", c.Ingest.MaxRequestBytes, "Largest compressed remote write body accepted (413 above).")
	fs.Int64Var(&c.Ingest.MaxDecodedBytes, "ingest.max-decoded-bytes", c.Ingest.MaxDecodedBytes, "Largest remote write body after snappy decoding (413 above).")
	fs.Var(&c.Query.Timeout, "query.timeout", "Maximum time a query may take (503 after).")
	fs.IntVar(&c.Query.MaxSamples, "query.max-samples", c.Query.MaxSamples, "Maximum samples a single query may load into memory (422 above).")
	fs.IntVar(&c.Query.MaxConcurrency, "query.max-concurrency", c.Query.MaxConcurrency, "Maximum queries executed at once; others wait.")
	fs.Var(&c.Query.LookbackDelta, "query.lookback-delta", "How far back an instant selector looks for the latest sample.")
}

// Load builds the configuration from defaults, the YAML file named by
// --config.file (if any) and the flags in args, in increasing precedence.
func Load(fs *flag.FlagSet, args []string) (Config, string, error) {
	cfg := DefaultConfig()
	var file string
	fs.StringVar(&file, "config.file", "", "Optional YAML configuration file; flags given on the command line override it.")
	cfg.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		return cfg, "", err
	}
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return cfg, file, fmt.Errorf("read config file: %w", err)
		}
		dec := yaml.NewDecoder(strings.NewReader(string(b)))
		dec.KnownFields(true)
		if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) {
			return cfg, file, fmt.Errorf("parse config file %s: %w", file, err)
		}
		// Parse again so that flags given explicitly override the file.
		if err := fs.Parse(args); err != nil {
			return cfg, file, err
		}
	}
	return cfg, file, cfg.Validate()
}
