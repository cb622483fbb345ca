// Package limits holds the per-tenant limits of ingestion, with defaults
// from the configuration and per-tenant overrides from a runtime file that
// is reloaded without a restart (dskit runtimeconfig).
//
// The overrides file:
//
//	overrides:
//	  gpu-prod:
//	    ingestion_rate: 2000000
//	    max_active_series: 5000000
//	  lab:
//	    max_active_series: 20000
//
// Fields a tenant does not set keep the defaults. Relabeling on ingest is
// set here too:
//
//	overrides:
//	  gpu-prod:
//	    ingest_preset: dcgm           # pkg/relabel's dcgm-exporter preset
//	    dcgm_hostname_label: Hostname # or hostname
//	    metric_relabel_configs:       # Prometheus' format, after the preset
//	      - action: labeldrop
//	        regex: pci_bus_id
//
// A file whose rules do not validate is refused as a whole, like any other
// invalid limit: the previous overrides stay in force.
package limits

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/grafana/dskit/flagext"
	"github.com/grafana/dskit/runtimeconfig"
	"github.com/grafana/dskit/services"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	promrelabel "github.com/prometheus/prometheus/model/relabel"
	"gopkg.in/yaml.v3"

	"github.com/gpustore/gpustore/internal/logging"
	"github.com/gpustore/gpustore/pkg/relabel"
)

// Limits are one tenant's limits. Zero means unlimited where noted.
type Limits struct {
	// IngestionRate is the sustained samples/s (samples + histograms) a
	// tenant may write; 0 = unlimited. IngestionBurstSize is the bucket size.
	IngestionRate      float64 `yaml:"ingestion_rate"`
	IngestionBurstSize int     `yaml:"ingestion_burst_size"`
	// RateLimitStatusCode answers writes over the rate: 503 (default; every
	// Prometheus retries it, so a burst is delayed, not lost) or 429 (for
	// senders with retry_on_http_429: true).
	RateLimitStatusCode int `yaml:"rate_limit_status_code"`
	// MaxActiveSeries bounds the series in the tenant's head; 0 = unlimited.
	MaxActiveSeries int `yaml:"max_active_series"`
	// MaxSeriesPerMetric bounds the head's series of one metric name, and
	// MaxNewSeriesPerDay the series the head creates in a UTC day (the
	// churn of jobs re-creating every series); 0 = unlimited.
	MaxSeriesPerMetric int `yaml:"max_series_per_metric"`
	MaxNewSeriesPerDay int `yaml:"max_new_series_per_day"`
	// Label limits, checked when a series is first seen.
	MaxLabelNamesPerSeries int `yaml:"max_label_names_per_series"`
	MaxLabelNameLength     int `yaml:"max_label_name_length"`
	MaxLabelValueLength    int `yaml:"max_label_value_length"`
	// MaxSeriesPerRequest rejects larger requests whole; 0 = unlimited.
	MaxSeriesPerRequest int `yaml:"max_series_per_request"`
	// Metadata (type, help, unit per metric family) kept for the tenant:
	// at most MaxMetadataFamilies families (0 = unlimited), each help and
	// unit at most MaxMetadataLength bytes.
	MaxMetadataFamilies int `yaml:"max_metadata_families"`
	MaxMetadataLength   int `yaml:"max_metadata_length"`
	// OutOfOrderWindow accepts samples this much older than their series'
	// newest sample.
	OutOfOrderWindow model.Duration `yaml:"out_of_order_window"`
	// HA pair labels: the cluster label is kept, the replica label is
	// removed before storage.
	HAClusterLabel string `yaml:"ha_cluster_label"`
	HAReplicaLabel string `yaml:"ha_replica_label"`
	// CompactorRetentionRaw is how long the tenant's raw blocks stay in the
	// bucket; 0 = the compactor's --compact.retention.raw.
	CompactorRetentionRaw model.Duration `yaml:"compactor_retention_raw"`
	// CompactorRetention5m and CompactorRetention1h are how long the
	// tenant's downsampled blocks stay in the bucket; 0 = the compactor's
	// --compact.retention.5m and .1h. As with the compactor's own, a block
	// goes only once a coarser resolution holds its hours: 5m data kept
	// longer than 1h data stays (set 1h at least as long).
	CompactorRetention5m model.Duration `yaml:"compactor_retention_5m"`
	CompactorRetention1h model.Duration `yaml:"compactor_retention_1h"`
	// Relabeling on ingest (pkg/relabel): the tenant's own rules, in
	// Prometheus' metric_relabel_configs format, applied after the preset
	// named by IngestPreset ("" or "dcgm"); DCGMHostnameLabel is the host
	// label the dcgm preset keeps ("Hostname" or "hostname").
	MetricRelabelConfigs []*promrelabel.Config `yaml:"metric_relabel_configs,omitempty"`
	IngestPreset         string                `yaml:"ingest_preset,omitempty"`
	DCGMHostnameLabel    string                `yaml:"dcgm_hostname_label,omitempty"`
	// CreatedTimestampZeroIngestion stores, before a remote-write 2.0 (or
	// OTLP) sample that carries a start (created) timestamp, a zero sample
	// at that timestamp, as Prometheus' created-timestamp-zero-ingestion
	// feature does: rate() and increase() then count a new counter's first
	// value. Off by default, as in Prometheus.
	CreatedTimestampZeroIngestion bool `yaml:"created_timestamp_zero_ingestion"`
	// OTLP is how the tenant's OTLP metrics are translated (otlp.go).
	OTLP OTLP `yaml:"otlp"`
	// Query limits (one request of the query API, whatever slices or days
	// it is split into): the distinct series it may fetch and the bytes of
	// block chunks it may read (0: unlimited), the samples it may hold at
	// once (0: query.max_samples), how long it may run (0: query.timeout;
	// never longer) and how many of the tenant's queries run at once (0:
	// only query.max_concurrency bounds them).
	MaxFetchedSeriesPerQuery     int            `yaml:"max_fetched_series_per_query"`
	MaxFetchedChunkBytesPerQuery int            `yaml:"max_fetched_chunk_bytes_per_query"`
	MaxSamplesPerQuery           int            `yaml:"max_samples_per_query"`
	QueryTimeout                 model.Duration `yaml:"query_timeout"`
	MaxConcurrentQueries         int            `yaml:"max_concurrent_queries"`
	// IngestionShardSize is how many of the ring's receivers hold the
	// tenant's series (shuffle sharding, dskit's ring.ShuffleShard, as
	// Mimir's ingestion_shard_size): distributors write the tenant only to
	// them, queriers and rulers read only them (and those that held the
	// tenant within the lookback). 0: every receiver. Below the replication
	// factor it is raised to it.
	IngestionShardSize int `yaml:"ingestion_shard_size"`
	// relabel is compiled from the three fields above by compileRelabel
	// (Load, New); nil: no rules.
	relabel *relabel.Rules
}

// Relabel returns the tenant's compiled relabel rules; nil when it has none.
func (l Limits) Relabel() *relabel.Rules { return l.relabel }

// compileRelabel validates the relabel fields and compiles them.
func (l *Limits) compileRelabel() error {
	r, err := relabel.New(l.relabelConfig())
	if err != nil {
		return err
	}
	l.relabel = r
	return nil
}

func (l *Limits) relabelConfig() relabel.Config {
	return relabel.Config{MetricRelabelConfigs: l.MetricRelabelConfigs, Preset: l.IngestPreset, DCGMHostnameLabel: l.DCGMHostnameLabel}
}

// Defaults fit dcgm-exporter with Kubernetes pod labels (about 15 labels
// plus target and external labels) with room to spare.
func Defaults() Limits {
	return Limits{
		IngestionRate:          0,
		IngestionBurstSize:     2_000_000,
		RateLimitStatusCode:    http.StatusServiceUnavailable,
		MaxActiveSeries:        0,
		MaxLabelNamesPerSeries: 40,
		MaxLabelNameLength:     1024,
		MaxLabelValueLength:    2048,
		MaxSeriesPerRequest:    100_000,
		MaxMetadataFamilies:    20_000,
		MaxMetadataLength:      1024,
		HAClusterLabel:         "cluster",
		HAReplicaLabel:         "__replica__",
		DCGMHostnameLabel:      relabel.HostnameOld,
		OTLP:                   DefaultOTLP(),
	}
}

// RegisterFlags adds flags for the default limits.
func (l *Limits) RegisterFlags(fs *flag.FlagSet) {
	fs.Float64Var(&l.IngestionRate, "limits.ingestion-rate", l.IngestionRate, "Default per-tenant ingestion rate in samples/s (0: unlimited).")
	fs.IntVar(&l.IngestionBurstSize, "limits.ingestion-burst-size", l.IngestionBurstSize, "Default per-tenant ingestion burst in samples.")
	fs.IntVar(&l.RateLimitStatusCode, "limits.rate-limit-status-code", l.RateLimitStatusCode, "Answer to writes over the ingestion rate: 503 (retried by every Prometheus) or 429 (retried only with retry_on_http_429).")
	fs.IntVar(&l.MaxActiveSeries, "limits.max-active-series", l.MaxActiveSeries, "Default per-tenant limit of series in the head (0: unlimited).")
	fs.IntVar(&l.MaxSeriesPerMetric, "limits.max-series-per-metric", l.MaxSeriesPerMetric, "Default per-tenant limit of series of one metric name in the head (0: unlimited).")
	fs.IntVar(&l.MaxNewSeriesPerDay, "limits.max-new-series-per-day", l.MaxNewSeriesPerDay, "Default per-tenant limit of series created in the head in a UTC day (0: unlimited).")
	fs.IntVar(&l.MaxLabelNamesPerSeries, "limits.max-label-names-per-series", l.MaxLabelNamesPerSeries, "Maximum labels of a series.")
	fs.IntVar(&l.MaxLabelNameLength, "limits.max-label-name-length", l.MaxLabelNameLength, "Maximum length of a label name.")
	fs.IntVar(&l.MaxLabelValueLength, "limits.max-label-value-length", l.MaxLabelValueLength, "Maximum length of a label value.")
	fs.IntVar(&l.MaxSeriesPerRequest, "limits.max-series-per-request", l.MaxSeriesPerRequest, "Maximum series in one remote write request (0: unlimited).")
	fs.IntVar(&l.MaxMetadataFamilies, "limits.max-metadata-families", l.MaxMetadataFamilies, "Metric families whose metadata (type, help, unit) a tenant keeps at most; past it new families' metadata is refused (0: unlimited).")
	fs.IntVar(&l.MaxMetadataLength, "limits.max-metadata-length", l.MaxMetadataLength, "Maximum length of a metric family's help and of its unit.")
	fs.Var(&l.OutOfOrderWindow, "limits.out-of-order-window", "Default out-of-order window per tenant (0: reject out-of-order samples).")
	fs.IntVar(&l.MaxFetchedSeriesPerQuery, "limits.max-fetched-series-per-query", l.MaxFetchedSeriesPerQuery, "Distinct series one query may fetch from every source together (0: unlimited); past it the query is answered 422.")
	fs.IntVar(&l.MaxFetchedChunkBytesPerQuery, "limits.max-fetched-chunk-bytes-per-query", l.MaxFetchedChunkBytesPerQuery, "Bytes of block chunks (local and bucket blocks) one query may read (0: unlimited); past it the query is answered 422.")
	fs.IntVar(&l.MaxSamplesPerQuery, "limits.max-samples-per-query", l.MaxSamplesPerQuery, "Samples one query may hold in memory at once, as query.max-samples (0: query.max-samples); past it the query is answered 422.")
	fs.Var(&l.QueryTimeout, "limits.query-timeout", "How long one query of a tenant may run (0: query.timeout, which also bounds it); past it the query is answered 503.")
	fs.IntVar(&l.MaxConcurrentQueries, "limits.max-concurrent-queries", l.MaxConcurrentQueries, "Queries of one tenant that run at once; more wait for a slot within their timeout (0: only query.max-concurrency bounds them).")
	fs.IntVar(&l.IngestionShardSize, "limits.ingestion-shard-size", l.IngestionShardSize, "Default per-tenant shuffle shard: receivers of the ring that hold a tenant's series, chosen per tenant by dskit's ShuffleShard (0: every receiver; below ring.replication-factor: the replication factor).")
	fs.StringVar(&l.HAClusterLabel, "limits.ha-cluster-label", l.HAClusterLabel, "Label naming a Prometheus HA pair's cluster.")
	fs.StringVar(&l.HAReplicaLabel, "limits.ha-replica-label", l.HAReplicaLabel, "Label naming the replica of an HA pair; removed before storage.")
	fs.BoolVar(&l.CreatedTimestampZeroIngestion, "limits.created-timestamp-zero-ingestion", l.CreatedTimestampZeroIngestion, "Store a zero sample at the start (created) timestamp that remote-write 2.0 samples carry, as Prometheus' created-timestamp-zero-ingestion does (per tenant: created_timestamp_zero_ingestion in the overrides file).")
}

// Validate checks one set of limits.
func (l Limits) Validate() error {
	var errs []error
	if l.IngestionRate < 0 || l.IngestionBurstSize < 0 || l.MaxActiveSeries < 0 || l.MaxSeriesPerRequest < 0 || l.MaxMetadataFamilies < 0 ||
		l.MaxSeriesPerMetric < 0 || l.MaxNewSeriesPerDay < 0 || l.IngestionShardSize < 0 {
		errs = append(errs, errors.New("limits must not be negative"))
	}
	if l.MaxFetchedSeriesPerQuery < 0 || l.MaxFetchedChunkBytesPerQuery < 0 || l.MaxSamplesPerQuery < 0 || l.QueryTimeout < 0 || l.MaxConcurrentQueries < 0 {
		errs = append(errs, errors.New("query limits must not be negative (0: unlimited or the query section's)"))
	}
	if l.IngestionRate > 0 && l.IngestionBurstSize <= 0 {
		errs = append(errs, errors.New("ingestion_burst_size must be positive when ingestion_rate is set"))
	}
	if l.RateLimitStatusCode != http.StatusTooManyRequests && l.RateLimitStatusCode != http.StatusServiceUnavailable {
		errs = append(errs, fmt.Errorf("rate_limit_status_code %d: want 429 or 503", l.RateLimitStatusCode))
	}
	if l.MaxLabelNamesPerSeries <= 0 || l.MaxLabelNameLength <= 0 || l.MaxLabelValueLength <= 0 {
		errs = append(errs, errors.New("label limits must be positive"))
	}
	if l.MaxMetadataLength <= 0 {
		errs = append(errs, errors.New("max_metadata_length must be positive"))
	}
	if l.OutOfOrderWindow < 0 || l.CompactorRetentionRaw < 0 || l.CompactorRetention5m < 0 || l.CompactorRetention1h < 0 {
		errs = append(errs, errors.New("out_of_order_window and compactor_retention_raw, _5m and _1h must not be negative"))
	}
	if l.CompactorRetention5m > 0 && l.CompactorRetention1h > 0 && l.CompactorRetention1h < l.CompactorRetention5m {
		errs = append(errs, fmt.Errorf("compactor_retention_1h (%s) is shorter than compactor_retention_5m (%s): 5m data is deleted only once 1h data holds its hours, so it would be kept past its retention",
			l.CompactorRetention1h, l.CompactorRetention5m))
	}
	if l.HAClusterLabel == "" || l.HAReplicaLabel == "" || l.HAClusterLabel == l.HAReplicaLabel {
		errs = append(errs, errors.New("ha cluster and replica labels must be set and differ"))
	}
	if _, err := relabel.New(l.relabelConfig()); err != nil {
		errs = append(errs, err)
	}
	if err := l.OTLP.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Config is the limits section of the configuration.
type Config struct {
	Defaults Limits `yaml:"defaults"`
	// OverridesFile is the per-tenant overrides file, reloaded every ReloadPeriod.
	OverridesFile string         `yaml:"overrides_file"`
	ReloadPeriod  model.Duration `yaml:"reload_period"`
	// MaxTenants bounds the tenants the process holds (0: no bound). Past
	// it a write of a new tenant is answered 429; tenants already on disk
	// are never refused. Each idle tenant costs ~0.7 MB of heap, one with
	// GPU data and the rule pack ~13 MB (bench/RESULTS.md).
	MaxTenants int `yaml:"max_tenants"`
}

// DefaultConfig returns the defaults with no overrides file.
func DefaultConfig() Config {
	return Config{Defaults: Defaults(), ReloadPeriod: model.Duration(10 * time.Second), MaxTenants: 1000}
}

// RegisterFlags adds the limits flags.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	c.Defaults.RegisterFlags(fs)
	fs.StringVar(&c.OverridesFile, "limits.overrides-file", c.OverridesFile, "YAML file of per-tenant limit overrides, reloaded at run time.")
	fs.Var(&c.ReloadPeriod, "limits.overrides-reload-period", "How often the overrides file is re-read.")
	fs.IntVar(&c.MaxTenants, "limits.max-tenants", c.MaxTenants, "Tenants the process holds at most; a write of a new tenant past it is answered 429 (tenants on disk always open; 0: no bound).")
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if err := c.Defaults.Validate(); err != nil {
		return fmt.Errorf("default limits: %w", err)
	}
	if c.MaxTenants < 0 {
		return errors.New("limits.max_tenants must not be negative (0: no bound)")
	}
	return nil
}

// overridesFile is the file's shape.
type overridesFile struct {
	Overrides map[string]Limits
}

// Tenants is the number of tenants the file overrides.
func (f *overridesFile) Tenants() int { return len(f.Overrides) }

// Overrides answers the limits of a tenant.
type Overrides struct {
	services.Service
	defaults   Limits
	maxTenants int
	manager    *runtimeconfig.Manager // nil without an overrides file
	shards     shardHistory
}

// New returns the overrides; with an overrides file it is a service that
// reloads the file (a bad file is reported and the previous one kept).
func New(cfg Config, logger *slog.Logger, reg prometheus.Registerer) (*Overrides, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	o := &Overrides{defaults: cfg.Defaults, maxTenants: cfg.MaxTenants}
	if err := o.defaults.compileRelabel(); err != nil {
		return nil, fmt.Errorf("default limits: %w", err)
	}
	if cfg.OverridesFile == "" {
		o.Service = services.NewIdleService(nil, nil)
		return o, nil
	}
	defaults := cfg.Defaults
	rcfg := runtimeconfig.Config{
		ReloadPeriod: time.Duration(cfg.ReloadPeriod),
		LoadPath:     flagext.StringSliceCSV{cfg.OverridesFile},
		Loader: func(r io.Reader) (any, error) {
			f, err := Load(r, defaults)
			if err == nil {
				o.shards.loaded(f, defaults, time.Now())
			}
			return f, err
		},
	}
	m, err := runtimeconfig.New(rcfg, "limits-overrides", reg, logging.GoKit(logger))
	if err != nil {
		return nil, fmt.Errorf("limits overrides: %w", err)
	}
	o.manager = m
	o.Service = m
	return o, nil
}

// Load parses an overrides file; fields a tenant leaves out keep defaults.
func Load(r io.Reader, defaults Limits) (*overridesFile, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	var raw struct {
		Overrides map[string]yaml.Node `yaml:"overrides"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&raw); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("parse overrides: %w", err)
	}
	out := &overridesFile{Overrides: map[string]Limits{}}
	for tenant, node := range raw.Overrides {
		l := defaults
		// Node.Decode is not strict; re-decode the tenant's section with a
		// decoder that rejects unknown fields, so a typo is an error.
		raw, err := yaml.Marshal(&node)
		if err != nil {
			return nil, fmt.Errorf("overrides of tenant %q: %w", tenant, err)
		}
		tdec := yaml.NewDecoder(bytes.NewReader(raw))
		tdec.KnownFields(true)
		if err := tdec.Decode(&l); err != nil {
			return nil, fmt.Errorf("overrides of tenant %q: %w", tenant, err)
		}
		if err := l.Validate(); err != nil {
			return nil, fmt.Errorf("overrides of tenant %q: %w", tenant, err)
		}
		if err := l.compileRelabel(); err != nil {
			return nil, fmt.Errorf("overrides of tenant %q: %w", tenant, err)
		}
		out.Overrides[tenant] = l
	}
	return out, nil
}

// For returns the tenant's limits.
func (o *Overrides) For(tenant string) Limits {
	if o.manager != nil {
		if f, ok := o.manager.GetConfig().(*overridesFile); ok && f != nil {
			if l, ok := f.Overrides[tenant]; ok {
				return l
			}
		}
	}
	return o.defaults
}

// Listen returns a channel that receives a value each time the overrides
// are reloaded (never, without an overrides file).
func (o *Overrides) Listen(ctx context.Context) <-chan struct{} {
	ch := make(chan struct{}, 1)
	if o.manager == nil {
		return ch
	}
	src := o.manager.CreateListenerChannel(1)
	go func() {
		defer o.manager.CloseListenerChannel(src)
		for {
			select {
			case <-ctx.Done():
				return
			case <-src:
				select {
				case ch <- struct{}{}:
				default:
				}
			}
		}
	}()
	return ch
}

// RateStrategy adapts the overrides to dskit's rate limiter.
type RateStrategy struct{ O *Overrides }

// Limit implements limiter.RateLimiterStrategy (0 = unlimited → +Inf).
func (s RateStrategy) Limit(tenant string) float64 {
	if r := s.O.For(tenant).IngestionRate; r > 0 {
		return r
	}
	return float64(1 << 62)
}

// Burst implements limiter.RateLimiterStrategy.
func (s RateStrategy) Burst(tenant string) int {
	l := s.O.For(tenant)
	if l.IngestionRate <= 0 {
		return 1 << 62
	}
	return l.IngestionBurstSize
}

// SharedRateStrategy is RateStrategy for processes that each take part of a
// tenant's writes (the ring's distributors): each allows its share of the
// tenant's rate, the rate divided by Processes() (asked at every refill, as
// dskit's global strategy does), and the whole burst, so one request of
// burst size still passes.
type SharedRateStrategy struct {
	RateStrategy
	Processes func() int
}

// Limit implements limiter.RateLimiterStrategy.
func (s SharedRateStrategy) Limit(tenant string) float64 {
	l := s.RateStrategy.Limit(tenant)
	if s.O.For(tenant).IngestionRate <= 0 {
		return l
	}
	return l / float64(max(1, s.Processes()))
}

// MaxTenants is limits.max_tenants (tenantdb.Manager.SetMaxTenants).
func (o *Overrides) MaxTenants() int { return o.maxTenants }

// MaxActiveSeries implements tenantdb.TenantLimits.
func (o *Overrides) MaxActiveSeries(tenant string) int { return o.For(tenant).MaxActiveSeries }

// MaxSeriesPerMetric implements tenantdb.TenantLimits.
func (o *Overrides) MaxSeriesPerMetric(tenant string) int { return o.For(tenant).MaxSeriesPerMetric }

// MaxNewSeriesPerDay implements tenantdb.TenantLimits.
func (o *Overrides) MaxNewSeriesPerDay(tenant string) int { return o.For(tenant).MaxNewSeriesPerDay }

// OutOfOrderWindow implements tenantdb.TenantLimits.
func (o *Overrides) OutOfOrderWindow(tenant string) time.Duration {
	return time.Duration(o.For(tenant).OutOfOrderWindow)
}

// CompactorRetentionRaw implements compact.Limits.
func (o *Overrides) CompactorRetentionRaw(tenant string) time.Duration {
	return time.Duration(o.For(tenant).CompactorRetentionRaw)
}

// QueryLimits are a tenant's limits of one query of the query API.
type QueryLimits struct {
	MaxFetchedSeries     int
	MaxFetchedChunkBytes int
	MaxSamples           int           // 0: query.max_samples
	Timeout              time.Duration // 0: query.timeout
	MaxConcurrent        int
}

// QueryLimits implements query.TenantLimits.
func (o *Overrides) QueryLimits(tenant string) QueryLimits {
	l := o.For(tenant)
	return QueryLimits{
		MaxFetchedSeries: l.MaxFetchedSeriesPerQuery, MaxFetchedChunkBytes: l.MaxFetchedChunkBytesPerQuery,
		MaxSamples: l.MaxSamplesPerQuery, Timeout: time.Duration(l.QueryTimeout), MaxConcurrent: l.MaxConcurrentQueries,
	}
}

// CompactorRetention5m implements compact.Limits.
func (o *Overrides) CompactorRetention5m(tenant string) time.Duration {
	return time.Duration(o.For(tenant).CompactorRetention5m)
}

// CompactorRetention1h implements compact.Limits.
func (o *Overrides) CompactorRetention1h(tenant string) time.Duration {
	return time.Duration(o.For(tenant).CompactorRetention1h)
}
