package app

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/grafana/dskit/kv/memberlist"

	"github.com/gpustore/gpustore/pkg/compact"
	"github.com/gpustore/gpustore/pkg/hatracker"
	"github.com/gpustore/gpustore/pkg/ingest"
	"github.com/gpustore/gpustore/pkg/limits"
	"github.com/gpustore/gpustore/pkg/query"
	"github.com/gpustore/gpustore/pkg/queryfrontend"
	"github.com/gpustore/gpustore/pkg/receiverring"
	"github.com/gpustore/gpustore/pkg/rules"
	"github.com/gpustore/gpustore/pkg/server"
	"github.com/gpustore/gpustore/pkg/storage/bucket"
	"github.com/gpustore/gpustore/pkg/storage/bucketstore"
	"github.com/gpustore/gpustore/pkg/storage/shipper"
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
	// QueryFrontend splits and caches query_range requests.
	QueryFrontend queryfrontend.Config `yaml:"query_frontend"`
	Rules         rules.Config         `yaml:"rules"`
	Limits        limits.Config        `yaml:"limits"`
	HA            hatracker.Config     `yaml:"ha_tracker"`
	// Memberlist is the gossip KV used when ha_tracker.kvstore or
	// ring.kvstore is memberlist.
	Memberlist memberlist.KVConfig `yaml:"memberlist"`
	// Ring is scale-out: the ring of receivers (pkg/receiverring).
	Ring receiverring.Config `yaml:"ring"`
	// Bucket is the object storage blocks are shipped to (objstore's client config).
	Bucket      bucket.Config      `yaml:"bucket"`
	Shipper     shipper.Config     `yaml:"shipper"`
	BucketStore bucketstore.Config `yaml:"bucket_store"`
	Compact     compact.Config     `yaml:"compact"`
	// Runtime tunes Go's garbage collector (GOGC, GOMEMLIMIT).
	Runtime RuntimeConfig `yaml:"runtime"`
}

// LogConfig chooses the log level and format.
type LogConfig struct {
	Level  string `yaml:"level"`
	Format string `yaml:"format"`
}

// DefaultConfig is the embedded default: every role in one process, data in
// ./data, one tenant, port 9201.
func DefaultConfig() Config {
	cfg := Config{
		Target:        All,
		Log:           LogConfig{Level: "info", Format: "logfmt"},
		Server:        server.DefaultConfig(),
		TSDB:          tenantdb.DefaultConfig(),
		Tenant:        tenancy.DefaultConfig(),
		Ingest:        ingest.DefaultConfig(),
		Query:         query.DefaultConfig(),
		QueryFrontend: queryfrontend.DefaultConfig(),
		Rules:         rules.DefaultConfig(),
		Limits:        limits.DefaultConfig(),
		HA:            hatracker.DefaultConfig(),
		Ring:          receiverring.DefaultConfig(),

		Bucket:      bucket.DefaultConfig(),
		Shipper:     shipper.DefaultConfig(),
		BucketStore: bucketstore.DefaultConfig(),
		Compact:     compact.DefaultConfig(),
		Runtime:     DefaultRuntimeConfig(),
	}
	// dskit sets memberlist's defaults when its flags are registered.
	cfg.Memberlist.RegisterFlags(flag.NewFlagSet("defaults", flag.ContinueOnError))
	return cfg
}

// Validate checks every section.
func (c *Config) Validate() error {
	var errs []error
	targets := strings.Split(c.Target, ",")
	for _, t := range targets {
		if !isTarget(t) {
			errs = append(errs, fmt.Errorf("unknown target %q: want one of %s", t, strings.Join(Targets(), ", ")))
		}
	}
	if err := checkRoles(targets, c.Ring.Enabled); err != nil {
		errs = append(errs, err)
	}
	if slices.Contains(targets, Ingest) || slices.Contains(targets, All) {
		if err := c.Ring.ValidateReceiver(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, v := range []interface{ Validate() error }{c.TSDB, c.Tenant, c.Ingest, c.Query, c.QueryFrontend, c.Limits, c.HA, c.Rules, c.Compact, c.Runtime, c.Ring} {
		if err := v.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := c.Server.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Server.WriteTimeout > 0 && c.Server.WriteTimeout <= c.Query.Timeout {
		errs = append(errs, fmt.Errorf("server.write_timeout (%s) must exceed query.timeout (%s), or long queries are cut off", c.Server.WriteTimeout, c.Query.Timeout))
	}
	if len(c.Tenant.Auth) > 0 && c.Server.WebConfigFile == "" {
		errs = append(errs, errors.New("tenants.auth needs --web.config.file: without it no request has an identity"))
	}
	if len(c.Ring.PeerIdentities) > 0 && c.Server.WebConfigFile == "" {
		errs = append(errs, errors.New("ring.peer_identities needs --web.config.file: without it no request has an identity"))
	}
	if c.Query.EnableAdminAPI && c.Ring.Enabled {
		errs = append(errs, errors.New("web.enable-admin-api is not supported with ring.enabled: a deletion must reach every receiver's head"))
	}
	errs = append(errs, c.validateObjstore()...)
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
	fs.StringVar(&c.Server.WebConfigFile, "web.config.file", c.Server.WebConfigFile, "Prometheus web configuration file (exporter-toolkit format): TLS, client certificates, basic auth, headers. Re-read on SIGHUP and POST /-/reload.")
	fs.Var(&c.Server.ReadHeaderTimeout, "web.read-header-timeout", "How long a client may take to send a request's headers.")
	fs.Var(&c.Server.ReadTimeout, "web.read-timeout", "How long a client may take to send a whole request.")
	fs.Var(&c.Server.WriteTimeout, "web.write-timeout", "How long a request may take from its headers to the end of its answer; must exceed query.timeout.")
	fs.Var(&c.Server.IdleTimeout, "web.idle-timeout", "How long a keep-alive connection may stay idle.")
	fs.IntVar(&c.Server.MaxConcurrentWritesPerTenant, "web.max-concurrent-writes-per-tenant", c.Server.MaxConcurrentWritesPerTenant, "Writes (remote write, OTLP) per tenant being decoded and stored, each taking its slot once its body is read; beyond it 503 with Retry-After (0: no bound).")
	fs.Var(&c.Server.WriteBodyStallTimeout, "web.write-body-stall-timeout", "A write body that sends nothing for this long is cut (503, retried) (0: only web.read-timeout bounds it).")
	fs.IntVar(&c.Server.WriteBodyMinRate, "web.write-body-min-rate", c.Server.WriteBodyMinRate, "Bytes/s a write body must average once web.write-body-stall-timeout has passed since its headers, or it is cut (503, retried) (0: none).")
	fs.StringVar(&c.TSDB.Dir, "storage.tsdb.path", c.TSDB.Dir, "Data directory; each tenant's TSDB lives in <path>/tenants/<tenant>.")
	fs.Var(&c.TSDB.BlockDuration, "storage.tsdb.block-duration", "Duration of a head block (2h in production; minutes in tests).")
	fs.Var(&c.TSDB.Retention, "storage.tsdb.retention.time", "How long local blocks are kept.")
	fs.IntVar(&c.TSDB.StripeSize, "storage.tsdb.stripe-size", c.TSDB.StripeSize, "Shards of each tenant's head series map, a power of two: each costs ~250 bytes per tenant, more shards mean less lock contention on many cores.")
	fs.BoolVar(&c.TSDB.MemorySnapshotOnShutdown, "storage.tsdb.memory-snapshot-on-shutdown", c.TSDB.MemorySnapshotOnShutdown, "On a clean stop write each tenant's head to a snapshot that the next start loads instead of replaying the WAL (a kill -9 still replays it).")
	fs.StringVar(&c.TSDB.RecoverWALAside, "storage.tsdb.recover-wal-aside", c.TSDB.RecoverWALAside, "auto, on or off. On: a tenant whose WAL is long to replay (after a kill -9) opens at once with an empty head, and its old head is replayed into blocks in the background; until then this receiver's answers lack those samples. auto: on in a ring at a replication factor of 2 or more, where the other replicas answer for them.")
	fs.Int64Var(&c.TSDB.RecoverAsideMinWALBytes, "storage.tsdb.recover-aside-min-wal-bytes", c.TSDB.RecoverAsideMinWALBytes, "WAL bytes to replay from which -storage.tsdb.recover-wal-aside sets a head aside.")
	fs.BoolVar(&c.TSDB.Isolation, "storage.tsdb.isolation", c.TSDB.Isolation, "Hide a commit in progress from queries (the TSDB's isolation). Off: remote write never delivers a scrape in one commit, and isolation costs memory per series and a lock per commit.")
	fs.Int64Var(&c.TSDB.MaxExemplars, "storage.tsdb.max-exemplars", c.TSDB.MaxExemplars, "Exemplars kept in memory per tenant; 0 disables exemplar storage.")
	fs.StringVar(&c.Tenant.DefaultTenant, "tenant.default", c.Tenant.DefaultTenant, "Tenant of requests without X-Scope-OrgID or THANOS-TENANT.")
	fs.Int64Var(&c.Ingest.MaxRequestBytes, "ingest.max-request-bytes", c.Ingest.MaxRequestBytes, "Largest compressed remote write body accepted (413 above).")
	fs.Int64Var(&c.Ingest.MaxDecodedBytes, "ingest.max-decoded-bytes", c.Ingest.MaxDecodedBytes, "Largest remote write body after snappy decoding (413 above).")
	fs.Int64Var(&c.Ingest.MaxInflightBytes, "ingest.max-inflight-bytes", c.Ingest.MaxInflightBytes, "Bytes of remote write bodies (compressed and decoded) that the writes in progress of all tenants may hold; beyond it 503 with Retry-After (0: no bound).")
	fs.Var(&c.Query.Timeout, "query.timeout", "Maximum time a query may take (503 after).")
	fs.IntVar(&c.Query.MaxSamples, "query.max-samples", c.Query.MaxSamples, "Maximum samples a single query may load into memory (422 above).")
	fs.IntVar(&c.Query.MaxConcurrency, "query.max-concurrency", c.Query.MaxConcurrency, "Maximum queries executed at once; others wait.")
	fs.Var(&c.Query.LookbackDelta, "query.lookback-delta", "How far back an instant selector looks for the latest sample.")
	fs.StringVar(&c.Query.MaxSourceResolution, "query.max-source-resolution", c.Query.MaxSourceResolution, "Coarsest bucket data a query reads unless it asks (max_source_resolution): raw, 5m, 1h or auto (from each select's step and range).")
	fs.IntVar(&c.Query.RangeParallelism, "query.range-parallelism", c.Query.RangeParallelism, "Most slices of its steps a range query runs as in parallel, on the cores no other query is using (0: one per core; 1: never sliced).")
	fs.IntVar(&c.Query.MinStepsPerSlice, "query.min-steps-per-slice", c.Query.MinStepsPerSlice, "Fewest steps of a range query's slice: shorter queries run whole.")
	fs.IntVar(&c.Query.MaxExpressionBytes, "query.max-expression-bytes", c.Query.MaxExpressionBytes, "Longest PromQL expression a request may carry (query, match[]); longer ones are answered 400 before they are parsed.")
	fs.IntVar(&c.Query.MaxExpressionDepth, "query.max-expression-depth", c.Query.MaxExpressionDepth, "Deepest nesting of a PromQL expression (brackets and operators, counted before parsing); deeper ones are answered 400: parsing and formatting cost grows with its square.")
	fs.BoolVar(&c.Query.EnableExperimentalFunctions, "query.enable-experimental-functions", c.Query.EnableExperimentalFunctions, "Let PromQL queries and rules use Prometheus' experimental functions (limitk, limit_ratio, sort_by_label, sort_by_label_desc, double_exponential_smoothing, ...), as Prometheus' --enable-feature=promql-experimental-functions does; off, they are answered 400.")
	fs.BoolVar(&c.Query.EnableAdminAPI, "web.enable-admin-api", c.Query.EnableAdminAPI, "Serve Prometheus' TSDB admin API (/api/v1/admin/tsdb/delete_series, clean_tombstones, snapshot) for the request's tenant, to identities allowed every tenant (\"*\" in tenants.auth). Not with ring.enabled.")
	fs.IntVar(&c.Query.RemoteReadSampleLimit, "storage.remote.read-sample-limit", c.Query.RemoteReadSampleLimit, "Most samples one remote read (/api/v1/read) may return, in a single query (0: no limit); ignored for streamed answers. As in Prometheus.")
	fs.IntVar(&c.Query.RemoteReadConcurrentLimit, "storage.remote.read-concurrent-limit", c.Query.RemoteReadConcurrentLimit, "Most remote reads (/api/v1/read) in progress; others wait until a slot frees or their client leaves (0: no limit). As in Prometheus.")
	fs.IntVar(&c.Query.RemoteReadMaxBytesInFrame, "storage.remote.read-max-bytes-in-frame", c.Query.RemoteReadMaxBytesInFrame, "Largest frame of a streamed remote-read answer, in bytes before marshalling. As in Prometheus.")
	fs.Int64Var(&c.Query.SeriesCacheSize, "query.series-cache-size", c.Query.SeriesCacheSize, "Bytes (estimated) of the series that queries resolved on immutable blocks, kept for the next query of the same selector (0: none).")
	fs.BoolVar(&c.Query.PushDownRangeFunctions, "query.push-down-range-functions", c.Query.PushDownRangeFunctions, "Evaluate range functions (rate, increase, *_over_time, ...) in the query path over the decoded samples, with Prometheus' own implementations, instead of in the engine step by step.")
	fs.Var(&c.Query.ReplicaLabels, "query.replica-label", "Comma-separated replica labels merged at query time (data not deduplicated at ingest); a request's dedup=false turns it off.")
	c.QueryFrontend.RegisterFlags(fs)
	c.Limits.RegisterFlags(fs)
	c.Rules.RegisterFlags(fs)
	c.HA.RegisterFlags(fs)
	c.Memberlist.RegisterFlagsWithPrefix(fs, "")
	c.Ring.RegisterFlags(fs)
	c.registerObjstoreFlags(fs)
	c.Compact.RegisterFlags(fs)
	c.Runtime.RegisterFlags(fs)
}

// BindFlags registers every flag Load parses on fs: -config.file, whose
// value the returned string receives, and cfg's knobs (RegisterFlags).
func BindFlags(fs *flag.FlagSet, cfg *Config) *string {
	file := fs.String("config.file", "", "Optional YAML configuration file; flags given on the command line override it.")
	cfg.RegisterFlags(fs)
	return file
}

// BindCommandFlags registers the gpustore command's flags that configure
// nothing: -version, whose value the returned bool receives.
func BindCommandFlags(fs *flag.FlagSet) *bool {
	return fs.Bool("version", false, "Print the version and exit.")
}

// ErrArguments is Load's error for words among args that are not flags:
// the server takes flags only (cmd/gpustore dispatches its subcommands
// before Load), and one that ignored them started serving on `gpustore
// tools bucket ls`.
var ErrArguments = errors.New("unexpected argument")

// Load builds the configuration from defaults, the YAML file named by
// --config.file (if any) and the flags in args, in increasing precedence.
func Load(fs *flag.FlagSet, args []string) (Config, string, error) {
	cfg := DefaultConfig()
	filePtr := BindFlags(fs, &cfg)
	if err := fs.Parse(args); err != nil {
		return cfg, "", err
	}
	if fs.NArg() > 0 { // flag parsing stops at the first word that is not a flag
		return cfg, "", fmt.Errorf("%w %q (the server takes flags only)", ErrArguments, fs.Arg(0))
	}
	file := *filePtr
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return cfg, file, fmt.Errorf("read config file: %w", err)
		}
		// Start again from the defaults: the first parse only found the
		// file, and list flags (memberlist.join, ...) would otherwise
		// append their values twice.
		cfg = DefaultConfig()
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
