// Package query serves Prometheus' HTTP query API (v1) over each tenant's data.
//
// The API is Prometheus' own web/api/v1 handler with Prometheus' PromQL
// engine, so Grafana's Prometheus data source works unchanged: same
// parameters, JSON envelope and error codes (400 bad parameters, 422
// execution errors, 503 timeouts and not ready). gpustore adds what that
// handler cannot know: the tenant of each request (tenancy middleware, read
// back by TenantQueryable) and /api/v1/metadata from the metadata senders
// wrote over remote_write (the stock handler asks scrape targets).
package query

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/grafana/dskit/flagext"
	"github.com/grafana/dskit/tenant"
	"github.com/grafana/dskit/user"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/common/route"
	"github.com/prometheus/prometheus/config"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/metadata"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/rules"
	"github.com/prometheus/prometheus/scrape"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/util/features"
	"github.com/prometheus/prometheus/util/notifications"
	v1 "github.com/prometheus/prometheus/web/api/v1"

	"github.com/gpustore/gpustore/pkg/downsample"
	"github.com/gpustore/gpustore/pkg/limits/querylimit"
	"github.com/gpustore/gpustore/pkg/readopts"
	"github.com/gpustore/gpustore/pkg/tenancy"
	"github.com/gpustore/gpustore/pkg/tenantdb"
)

// Config holds the query knobs.
type Config struct {
	Timeout        model.Duration `yaml:"timeout"`
	MaxSamples     int            `yaml:"max_samples"`
	MaxConcurrency int            `yaml:"max_concurrency"`
	LookbackDelta  model.Duration `yaml:"lookback_delta"`
	// ReplicaLabels name the replica of a Prometheus HA pair in data that
	// was not deduplicated at ingest; series differing only in them are
	// merged at query time unless the request says dedup=false.
	ReplicaLabels flagext.StringSliceCSV `yaml:"replica_labels"`
	// MaxSourceResolution is the coarsest resolution of bucket data a query
	// reads when it does not say (max_source_resolution): raw, 5m, 1h or
	// auto (each select from its step and range, pkg/downsample).
	MaxSourceResolution string `yaml:"max_source_resolution"`
	// RangeParallelism is the most slices a range query runs as in
	// parallel while cores are idle (0: one per core; 1: never sliced);
	// MinStepsPerSlice the fewest steps of a slice.
	RangeParallelism int `yaml:"range_parallelism"`
	MinStepsPerSlice int `yaml:"min_steps_per_slice"`
	// Remote read (/api/v1/read), with Prometheus' flags' meanings and
	// defaults: the most samples one non-streamed answer may hold, the
	// most reads in progress (others wait; 0: no limit), the largest frame
	// of a streamed answer.
	RemoteReadSampleLimit     int `yaml:"remote_read_sample_limit"`
	RemoteReadConcurrentLimit int `yaml:"remote_read_concurrent_limit"`
	RemoteReadMaxBytesInFrame int `yaml:"remote_read_max_bytes_in_frame"`
	// MaxExpressionBytes and MaxExpressionDepth bound the PromQL of a
	// request (query, match[]) before anything parses it (bounds.go).
	MaxExpressionBytes int `yaml:"max_expression_bytes"`
	MaxExpressionDepth int `yaml:"max_expression_depth"`
	// EnableExperimentalFunctions lets PromQL use Prometheus' experimental
	// functions and aggregations (limitk, limit_ratio, sort_by_label,
	// double_exponential_smoothing, ...), in queries and in rules, as
	// Prometheus' --enable-feature=promql-experimental-functions does.
	EnableExperimentalFunctions bool `yaml:"enable_experimental_functions"`
	// EnableAdminAPI serves Prometheus' TSDB admin API (delete_series,
	// clean_tombstones, snapshot) per tenant to administrators, as
	// Prometheus' --web.enable-admin-api (admin.go).
	EnableAdminAPI bool `yaml:"enable_admin_api"`
	// SeriesCacheSize bounds, in estimated bytes, the selectors resolved on
	// immutable blocks (local and bucket) that queries keep for the next
	// query of the same selector (pkg/blockquery); 0 keeps none.
	SeriesCacheSize int64 `yaml:"series_cache_size_bytes"`
	// PushDownRangeFunctions evaluates range functions (rate, *_over_time,
	// ...) in the query path, over the decoded samples, with Prometheus'
	// own implementations, instead of in the engine (pushdown.go).
	PushDownRangeFunctions bool `yaml:"push_down_range_functions"`
}

// DefaultConfig returns Prometheus' own defaults.
func DefaultConfig() Config {
	return Config{Timeout: model.Duration(2 * time.Minute), MaxSamples: 50_000_000, MaxConcurrency: 20, LookbackDelta: model.Duration(5 * time.Minute), ReplicaLabels: flagext.StringSliceCSV{"__replica__"},
		MaxSourceResolution: "auto", MinStepsPerSlice: defaultMinStepsPerSlice,
		RemoteReadSampleLimit: 5e7, RemoteReadConcurrentLimit: 10, RemoteReadMaxBytesInFrame: 1 << 20,
		MaxExpressionBytes: defaultMaxExpressionBytes, MaxExpressionDepth: defaultMaxExpressionDepth,
		SeriesCacheSize: 256 << 20, PushDownRangeFunctions: true}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.Timeout <= 0 || c.MaxSamples <= 0 || c.MaxConcurrency <= 0 || c.LookbackDelta <= 0 {
		return errors.New("query timeout, max samples, max concurrency and lookback delta must be positive")
	}
	if c.RangeParallelism < 0 || c.MinStepsPerSlice <= 0 {
		return errors.New("query range parallelism must not be negative, min steps per slice must be positive")
	}
	if c.RemoteReadSampleLimit < 0 || c.RemoteReadConcurrentLimit < 0 || c.RemoteReadMaxBytesInFrame <= 0 {
		return errors.New("remote read sample and concurrent limits must not be negative (0: none), max bytes in frame must be positive")
	}
	if c.SeriesCacheSize < 0 {
		return errors.New("query series cache size must not be negative")
	}
	if c.MaxExpressionBytes <= 0 || c.MaxExpressionDepth <= 0 {
		return errors.New("query max expression bytes and depth must be positive")
	}
	if _, err := downsample.ParseMaxSourceResolution(c.MaxSourceResolution); err != nil {
		return err
	}
	return nil
}

// RulesRetriever gives the API the rule groups and alerts of the request's
// tenant; the rules role provides it.
type RulesRetriever func(ctx context.Context) v1.RulesRetriever

// Options wires the API to the rest of the process.
type Options struct {
	Config    Config
	Tenants   tenancy.Config
	DBs       *tenantdb.Manager
	Logger    *slog.Logger
	Registry  *prometheus.Registry
	Ready     func() error
	BuildInfo v1.PrometheusVersion
	// ActiveQueryDir holds the engine's active query log (queries.active).
	ActiveQueryDir string
	// Rules, when set, answers /api/v1/rules and /api/v1/alerts.
	Rules RulesRetriever
	// Flags is shown by /api/v1/status/flags.
	Flags map[string]string
	// TakesWrites says whether this process serves remote write and OTLP
	// (/api/v1/features: remote_write_receiver, otlp_write_receiver).
	TakesWrites bool
	// Sources are merged with each tenant's local TSDB (the bucket's blocks).
	Sources []Source
	// Receivers are the ring's receivers, read over ReceiversLookback
	// (TenantQueryable); nil without the ring.
	Receivers         Source
	ReceiversLookback time.Duration
	// Frontend, when set, wraps the chain after tenant resolution
	// (pkg/queryfrontend: query_range split by day and cached).
	Frontend func(http.Handler) http.Handler
	// Metadata, when set, adds the metric metadata held elsewhere (the
	// ring's receivers) to the local TSDB's in /api/v1/metadata.
	Metadata MetadataSource
	// Limits are the per-tenant query limits (max_fetched_series_per_query
	// ...); nil: only this Config's bounds.
	Limits TenantLimits
	// Admin, when set, serves Prometheus' TSDB admin API per tenant
	// (admin.go: delete_series, clean_tombstones, snapshot); nil: disabled
	// (web.enable-admin-api off), answered 404.
	Admin Admin
	// Notifications are what /api/v1/notifications and
	// /api/v1/notifications/live show (a failed reload, as in Prometheus);
	// nil: New makes an empty list of its own.
	Notifications *notifications.Notifications
}

// MetadataSource is metric metadata held outside this process. A partial
// answer comes with an error (shown as a warning); nil with an error when
// nothing could be read.
type MetadataSource interface {
	Metadata(ctx context.Context, tenant string) (map[string]metadata.Metadata, error)
}

// API is the query HTTP API.
type API struct {
	opts      Options
	queryable TenantQueryable
	engine    *promql.Engine
	parser    parser.Parser
	router    *route.Router
	http      *httpMetrics
}

// New builds the PromQL engine and Prometheus' API handler.
func New(opts Options) (*API, error) {
	if err := opts.Config.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(opts.ActiveQueryDir, 0o755); err != nil {
		return nil, fmt.Errorf("create active query dir: %w", err)
	}
	tracker, err := promql.NewActiveQueryTracker(opts.ActiveQueryDir, opts.Config.MaxConcurrency, opts.Logger)
	if err != nil {
		return nil, fmt.Errorf("active query tracker: %w", err)
	}
	featureSet := gpustoreFeatures(opts.TakesWrites, opts.Admin != nil)
	notes := opts.Notifications
	if notes == nil {
		notes = notifications.NewNotifications(maxNotificationSubscribers, opts.Registry)
	}
	// One parser for the engine, the API's own parsing and the rules.
	promqlParser := parser.NewParser(parser.Options{EnableExperimentalFunctions: opts.Config.EnableExperimentalFunctions})
	engineOpts := promql.EngineOpts{
		Parser:             promqlParser,
		Logger:             opts.Logger.With("component", "promql"),
		Reg:                opts.Registry,
		MaxSamples:         opts.Config.MaxSamples,
		Timeout:            time.Duration(opts.Config.Timeout),
		ActiveQueryTracker: tracker,
		LookbackDelta:      time.Duration(opts.Config.LookbackDelta),
		// Subqueries without a step use the default rule evaluation interval, as in Prometheus.
		NoStepSubqueryIntervalFn: func(int64) int64 { return noStepSubqueryInterval.Milliseconds() },
		EnableAtModifier:         true,
		EnableNegativeOffset:     true,
		FeatureRegistry:          featureSet,
	}
	engine := promql.NewEngine(engineOpts)

	se := newSlicingEngine(engine, opts.Config.RangeParallelism, opts.Config.MinStepsPerSlice, opts.Registry)
	se.pushDown, se.lookback, se.maxSamples = opts.Config.PushDownRangeFunctions, time.Duration(opts.Config.LookbackDelta), opts.Config.MaxSamples
	if opts.Limits != nil {
		se.engines = newEnginesBySamples(engine, engineOpts)
	}
	q := TenantQueryable{DBs: opts.DBs, Sources: opts.Sources, Receivers: opts.Receivers, ReceiversLookback: opts.ReceiversLookback}
	rr := opts.Rules
	if rr == nil {
		rr = func(context.Context) v1.RulesRetriever { return noRules{} }
	}
	startTime := time.Now()
	build := opts.BuildInfo
	api := v1.NewAPI(
		se, q, nil, q,
		func(context.Context) v1.ScrapePoolsRetriever { return noTargets{} },
		func(context.Context) v1.TargetRetriever { return noTargets{} },
		func(context.Context) v1.AlertmanagerRetriever { return noAlertmanagers{} },
		func() config.Config { return config.DefaultConfig },
		redactFlags(opts.Flags),
		v1.GlobalURLOptions{ListenAddress: "", Host: "", Scheme: "http"},
		func(f http.HandlerFunc) http.HandlerFunc {
			return func(w http.ResponseWriter, r *http.Request) {
				if err := opts.Ready(); err != nil {
					http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
					return
				}
				f(w, r)
			}
		},
		adminStats{dbs: opts.DBs, tenant: opts.Tenants.DefaultTenant},
		opts.DBs.Config().Dir,
		false, // no admin API: deleting series is not an operation for a shared receiver yet
		false, 0,
		opts.Logger.With("component", "api"),
		func(ctx context.Context) v1.RulesRetriever { return rr(ctx) },
		opts.Config.RemoteReadSampleLimit, remoteReadGateSize(opts.Config.RemoteReadConcurrentLimit), opts.Config.RemoteReadMaxBytesInFrame,
		false,
		nil,
		func() (v1.RuntimeInfo, error) {
			return v1.RuntimeInfo{
				StartTime: startTime, ServerTime: time.Now(), ReloadConfigSuccess: true,
				GoroutineCount: runtime.NumGoroutine(), GOMAXPROCS: runtime.GOMAXPROCS(0),
				GOGC: os.Getenv("GOGC"), GODEBUG: os.Getenv("GODEBUG"),
			}, nil
		},
		&build,
		notes.Get, notes.Sub,
		opts.Registry, opts.Registry,
		nil,
		false, nil, // remote write is served by pkg/ingest, not by this handler
		false, false, false,
		time.Duration(opts.Config.LookbackDelta),
		false, false,
		errorCodes, featureSet,
		v1.OpenAPIOptions{},
		promqlParser,
		false,
		time.Duration(opts.Config.Timeout),
	)
	var routes []string
	router := route.New().WithInstrumentation(recordRoute(&routes))
	api.Register(router.WithPrefix(apiPrefix))
	// gpustore's own handlers of these paths (RegisterRoutes) replace the
	// v1 API's; they are among its routes already.
	return &API{opts: opts, queryable: q, engine: engine, parser: promqlParser, router: router, http: newHTTPMetrics(opts.Registry, routes)}, nil
}

// Engine returns the PromQL engine, shared with rule evaluation.
func (a *API) Engine() *promql.Engine { return a.engine }

// Parser returns the PromQL parser the engine uses, shared with the rules.
func (a *API) Parser() parser.Parser { return a.parser }

// errorCodes corrects two of the v1 handler's status codes.
//
// A query whose deadline passed is answered 503 wherever it was noticed:
// PromQL reports one it meets while expanding series as a plain context
// error (an "execution" error, 422), though it is the same timeout the
// engine reports as 503 elsewhere.
//
// The handler answers "unavailable" errors with 500 (Prometheus v0.316.0
// does the same), and a 5xx tells clients and proxies to retry. A storage
// not ready yet is retried rightly (503); a disabled endpoint (the admin and
// search APIs) never becomes available by retrying: 404, as Prometheus
// answers for its disabled remote-write and OTLP receivers.
//
// (Generic only to match the unexported parameter type of
// v1.OverrideErrorCode.)
func errorCodes[N comparable](num N, err error) (int, bool) {
	switch {
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrUnavailable) || errors.Is(err, tsdb.ErrNotReady):
		return http.StatusServiceUnavailable, true
	case any(num) == any(v1.ErrorUnavailable):
		return http.StatusNotFound, true
	case querylimit.IsError(err):
		// Over a tenant's limit: as Prometheus answers a query over its
		// max samples. Retrying the same query cannot succeed.
		return http.StatusUnprocessableEntity, true
	}
	return 0, false
}

// maxNotificationSubscribers bounds the clients of
// /api/v1/notifications/live, as Prometheus'
// --web.max-notifications-subscribers (default 16) does; more are answered
// 204 No Content.
const maxNotificationSubscribers = 16

// gpustoreFeatures is what /api/v1/features lists besides the engine's
// PromQL features (which NewEngine adds): the API features gpustore serves,
// named as Prometheus names them (web.New). Prometheus' lifecycle is
// /-/quit and /-/reload together; gpustore serves /-/reload only (a
// supervisor stops it: SIGTERM).
func gpustoreFeatures(takesWrites, admin bool) features.Collector {
	r := features.NewRegistry()
	for name, on := range map[string]bool{
		"lifecycle": false, "admin": admin, "remote_write_receiver": takesWrites, "otlp_write_receiver": takesWrites,
		"query_cost": false, "search": false, "label_values_match": true, "query_warnings": true,
		"query_stats": true, "time_range_series": true, "time_range_labels": true, "exclude_alerts": true,
		"openapi_3.1": true, "openapi_3.2": true,
	} {
		r.Set(features.API, name, on)
	}
	return r
}

// ErrUnavailable is wrapped by a source's error when too much of it is down
// to answer (more receivers than the replication tolerates): the query is
// answered 503, to be retried, not 422 as if it were wrong.
var ErrUnavailable = errors.New("data source unavailable")

// noStepSubqueryInterval is the step of a subquery that names none.
const noStepSubqueryInterval = time.Minute

// RegisterRoutes mounts the API under /api/v1/, behind the tenant middleware.
// The write endpoints registered by pkg/ingest are more specific patterns and
// take precedence.
func (a *API) RegisterRoutes(mux *http.ServeMux) {
	api := a.hideRuleFiles(a.readOptions(a.router))
	if a.opts.Frontend != nil {
		api = a.opts.Frontend(api)
	}
	compress := answerCompression()
	outer := func(h http.Handler) http.Handler { return a.http.instrument(compress(h)) }
	admission := newAdmission(a.opts.Config, a.opts.Limits)
	mux.Handle(apiPrefix+"/", outer(a.tenant(admission.admit(api))))
	// format_query in front of its formatter's cost (format.go).
	mux.Handle(apiPrefix+"/format_query", outer(a.tenant(admission.admit(formatQuery(a.opts.Config.MaxExpressionDepth)))))
	// Remote read answers in snappy frames of its own, uncompressed by
	// gzip as in Prometheus; its body is read before it waits for a slot.
	mux.Handle(apiPrefix+"/read", a.http.instrument(ReadWholeBody(MaxReadRequestBytes, a.tenant(api))))
	mux.Handle(apiPrefix+"/metadata", outer(a.tenant(http.HandlerFunc(a.metadata))))
	mux.Handle(apiPrefix+"/status/tsdb", outer(a.tenant(http.HandlerFunc(a.tsdbStatus))))
	mux.Handle(apiPrefix+"/status/tsdb/blocks", outer(a.tenant(http.HandlerFunc(a.tsdbBlocks))))
	mux.Handle(apiPrefix+"/cardinality/label_names", outer(a.tenant(http.HandlerFunc(a.cardinalityLabelNames))))
	mux.Handle(apiPrefix+"/cardinality/label_values", outer(a.tenant(http.HandlerFunc(a.cardinalityLabelValues))))
	// A stream of events is not compressed: the compressor holds the
	// headers back until it has seen enough of the answer to decide, and
	// an event stream that has nothing to say yet would never start.
	mux.Handle(apiPrefix+"/notifications/live", a.http.instrument(a.tenant(a.router)))
	a.registerAdmin(mux, a.http.instrument)
}

// tenant puts the request's tenant into its context (dskit's user package,
// which TenantQueryable reads back), or answers Prometheus' error envelope.
func (a *API) tenant(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := a.opts.Tenants.FromRequest(r)
		if err != nil {
			status := http.StatusBadRequest
			var te *tenancy.Error
			if errors.As(err, &te) {
				status = te.Status
			}
			writeError(w, status, "bad_data", err)
			return
		}
		next.ServeHTTP(w, r.WithContext(user.InjectOrgID(r.Context(), id)))
	})
}

// readOptions parses the request's read options (readopts.ReadOptions),
// here and nowhere else, into its context, whence the query path takes
// them when it opens the tenant's querier:
//   - deduplication by the configured replica labels, unless the request
//     asks dedup=false (Thanos' parameter);
//   - its max_source_resolution, or the configured default;
//   - for a PromQL query, parsed once (downsample.Prepare): whether its
//     selects are evaluated at the request's steps only (the bucket store
//     then reads only the chunks the steps' windows need) and, for a
//     tenant with downsampled blocks, the labels it names (a select that
//     names a label folded in downsampled data reads finer data). For such
//     a tenant it also rewrites count_over_time and avg_over_time into sums
//     of explicit aggregates (downsample.Rewrite), which read downsampled
//     and raw data alike.
func (a *API) readOptions(next http.Handler) http.Handler {
	def, _ := downsample.ParseMaxSourceResolution(a.opts.Config.MaxSourceResolution) // validated
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o := readopts.Default()
		if len(a.opts.Config.ReplicaLabels) > 0 {
			on := true
			if v := r.FormValue("dedup"); v != "" {
				b, err := strconv.ParseBool(v)
				if err != nil {
					writeError(w, http.StatusBadRequest, "bad_data", fmt.Errorf("dedup must be true or false: %w", err))
					return
				}
				on = b
			}
			if on {
				o.ReplicaLabels = a.opts.Config.ReplicaLabels
			}
		}
		o.MaxSourceResolution = def
		if v := r.FormValue("max_source_resolution"); v != "" {
			var err error
			if o.MaxSourceResolution, err = downsample.ParseMaxSourceResolution(v); err != nil {
				writeError(w, http.StatusBadRequest, "bad_data", err)
				return
			}
		}
		p := r.URL.Path
		if strings.HasSuffix(p, "/query") || strings.HasSuffix(p, "/query_range") {
			if pq, err := downsample.Prepare(r.FormValue("query")); err == nil {
				o.AtSteps = pq.AtSteps && strings.HasSuffix(p, "/query_range")
				if a.downsampled(r.Context()) {
					o.QueryLabels = pq.Labels
					if pq.Rewritten {
						r.Form.Set("query", pq.Query) // FormValue parsed the form; the API reads r.Form
					}
				}
			}
		}
		next.ServeHTTP(w, r.WithContext(readopts.NewContext(r.Context(), o)))
	})
}

// downsampled reports whether any source holds downsampled blocks of the
// request's tenant.
func (a *API) downsampled(ctx context.Context) bool {
	id, err := tenant.TenantID(ctx)
	if err != nil {
		return false
	}
	for _, s := range a.opts.Sources {
		if s.HasDownsampled(id) {
			return true
		}
	}
	return false
}

// metadata answers /api/v1/metadata like Prometheus: {metric: [{type, help, unit}]}.
func (a *API) metadata(w http.ResponseWriter, r *http.Request) {
	limit, err := intParam(r, "limit")
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad_data", err)
		return
	}
	id, err := tenant.TenantID(r.Context())
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad_data", err)
		return
	}
	all := map[string]metadata.Metadata{}
	var warnings []string
	db := a.opts.DBs.Existing(id)
	if a.opts.Metadata != nil {
		m, err := a.opts.Metadata.Metadata(r.Context(), id)
		switch {
		case err != nil && m == nil && db == nil: // nothing to answer with
			writeError(w, http.StatusServiceUnavailable, "unavailable", err)
			return
		case err != nil:
			warnings = append(warnings, err.Error())
		}
		maps.Copy(all, m)
	}
	if db != nil {
		for _, fam := range db.Metadata.Families() {
			all[fam], _ = db.Metadata.Get(fam)
		}
	}
	names := slices.Sorted(maps.Keys(all))
	if metric := r.FormValue("metric"); metric != "" {
		names = slices.DeleteFunc(names, func(n string) bool { return n != metric })
	}
	if limit >= 0 && len(names) > limit {
		names = names[:limit]
	}
	out := make(map[string][]metadata.Metadata, len(names))
	for _, n := range names {
		out[n] = []metadata.Metadata{all[n]}
	}
	writeJSON(w, http.StatusOK, v1.Response{Status: "success", Data: out, Warnings: warnings})
}

func intParam(r *http.Request, name string) (int, error) {
	s := r.FormValue(name)
	if s == "" {
		return -1, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("%s must be a number", name)
	}
	return n, nil
}

func writeError(w http.ResponseWriter, status int, typ string, err error) {
	writeJSON(w, status, v1.Response{Status: "error", ErrorType: typ, Error: err.Error()})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

type noTargets struct{}

func (noTargets) ScrapePools() []string                       { return nil }
func (noTargets) TargetsActive() map[string][]*scrape.Target  { return map[string][]*scrape.Target{} }
func (noTargets) TargetsDropped() map[string][]*scrape.Target { return map[string][]*scrape.Target{} }
func (noTargets) TargetsDroppedCounts() map[string]int        { return map[string]int{} }
func (noTargets) ScrapePoolConfig(string) (*config.ScrapeConfig, error) {
	return nil, errors.New("gpustore does not scrape: it receives remote write")
}

type noAlertmanagers struct{}

func (noAlertmanagers) Alertmanagers() []*url.URL        { return nil }
func (noAlertmanagers) DroppedAlertmanagers() []*url.URL { return nil }

type noRules struct{}

func (noRules) RuleGroups() []*rules.Group           { return nil }
func (noRules) AlertingRules() []*rules.AlertingRule { return nil }

// adminStats answers /api/v1/status/tsdb for the default tenant. The admin
// endpoints (delete, snapshot) are disabled.
type adminStats struct {
	dbs    *tenantdb.Manager
	tenant string
}

var errNoAdmin = errors.New("not supported by gpustore")

func (s adminStats) db() (*tenantdb.DB, error) {
	db := s.dbs.Existing(s.tenant)
	if db == nil {
		return nil, tsdb.ErrNotReady
	}
	return db, nil
}

func (adminStats) CleanTombstones() error { return errNoAdmin }
func (adminStats) Delete(context.Context, int64, int64, ...*labels.Matcher) error {
	return errNoAdmin
}
func (adminStats) Snapshot(string, bool) error { return errNoAdmin }
func (s adminStats) Stats(statsByLabelName string, limit int) (*tsdb.Stats, error) {
	db, err := s.db()
	if err != nil {
		return nil, err
	}
	return db.Head().Stats(statsByLabelName, limit), nil
}
func (s adminStats) WALReplayStatus() (tsdb.WALReplayStatus, error) {
	return tsdb.WALReplayStatus{}, nil
}
func (s adminStats) BlockMetas() ([]tsdb.BlockMeta, error) {
	db, err := s.db()
	if err != nil {
		return nil, err
	}
	var metas []tsdb.BlockMeta
	for _, b := range db.Blocks() {
		metas = append(metas, b.Meta())
	}
	return metas, nil
}
