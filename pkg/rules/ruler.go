// Package rules evaluates Prometheus recording and alerting rules inside
// gpustore, per tenant, and sends alerts to Alertmanager.
//
// Each tenant gets Prometheus' own rules.Manager (and, when Alertmanagers are
// configured, its own notifier.Manager), so rule files, evaluation, the `for`
// state, ALERTS/ALERTS_FOR_STATE series, templates and /api/v1/rules and
// /api/v1/alerts behave exactly as in Prometheus:
//
//   - queries go through gpustore's PromQL engine and query.TenantQueryable,
//     with the tenant in the evaluation context (dskit user.InjectOrgID), so a
//     tenant's rules only ever see that tenant's data;
//   - results (recording rules, ALERTS, ALERTS_FOR_STATE) are appended to the
//     tenant's TSDB (tenantdb.Manager.Get), so they are stored, queried and
//     shipped like written series;
//   - alerts go to every configured Alertmanager (v2 API) with the
//     configured external labels plus a tenant label.
//
// Which rules a tenant gets: the files of <rules.dir>/<tenant>/ (and, for
// the default tenant, the files at the top of rules.dir), plus the embedded
// GPU rule pack (deploy/rules) when rules.gpu_pack is on. The pack applies to
// every tenant that holds GPU data (a series of dcgm-exporter, DCGM_…, in its
// last gpuDataWindow), including tenants that start sending it while
// gpustore runs: the tenants are polled every rules.tenant_poll_interval, and
// a tenant keeps the pack once it has it. A tenant without GPU data, on which
// the pack would record and alert nothing, does not pay for its rules
// (what they cost a tenant, and share with the others: share.go and
// bench/RESULTS.md). A tenant's group with the
// same name as a pack group replaces the pack's group for that tenant.
//
// Files are read at start-up and on Reload (SIGHUP, POST /-/reload). A
// tenant's files are checked with Prometheus' rulefmt before anything
// changes; if one has an error, it is logged,
// gpustore_rules_config_last_reload_successful{tenant} drops to 0 and the
// tenant keeps the rules it had.
package rules

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/grafana/dskit/services"
	"github.com/grafana/dskit/tenant"
	"github.com/grafana/dskit/user"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/notifier"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/rules"
	"github.com/prometheus/prometheus/storage"
	v1 "github.com/prometheus/prometheus/web/api/v1"

	"github.com/gpustore/gpustore/pkg/query"
	"github.com/gpustore/gpustore/pkg/tenancy"
	"github.com/gpustore/gpustore/pkg/tenantdb"
)

// Options wires the ruler to the rest of the process.
type Options struct {
	Config  Config
	Tenants tenancy.Config
	DBs     *tenantdb.Manager
	// Engine is gpustore's PromQL engine ((*query.API).Engine()).
	Engine promql.QueryEngine
	// Parser parses the rules' expressions: the engine's own
	// ((*query.API).Parser()), so a rule may use what a query may (the
	// experimental functions when query.enable_experimental_functions is
	// on). nil: Prometheus' default parser.
	Parser parser.Parser
	// Queryable defaults to query.TenantQueryable over DBs. Pass the query
	// API's (with its sources) so that rules read what queries read.
	Queryable storage.Queryable
	// EvalContext, when set, decorates each tenant's evaluation context
	// (after the tenant is injected), e.g. with query-time deduplication.
	EvalContext func(context.Context) context.Context
	Logger      *slog.Logger
	// Registerer gets the rule managers' and notifiers' metrics (labelled
	// with the tenant) and gpustore_rules_*.
	Registerer prometheus.Registerer
	// ListenAddress (host:port actually listened on) gives the default
	// external URL http://<hostname>:<port>.
	ListenAddress string
	// Appendable, when set, takes a tenant's rule results instead of its
	// TSDB in DBs: with the ring, the distributors' write path, so results
	// are replicated and shipped like every other sample.
	Appendable func(tenant string) (storage.AppendableV2, error)
	// Owns, when set, says whether this ruler evaluates a tenant's rule
	// group (of a file): with the ring, each group is evaluated by the
	// ruler that owns its hash in the rulers' ring, so the rulers share the
	// groups and none is evaluated twice. nil: every group.
	Owns func(tenant, file, group string) bool
	// Ownership, when set, describes what Owns answers from (the ring's
	// ACTIVE rulers); asked every tenant poll, a change reloads every
	// tenant so the groups move with the ring.
	Ownership func() string
	// Resolver looks up dns+/dnssrv+ Alertmanager URLs; nil: the system's
	// (net.DefaultResolver: /etc/resolv.conf, /etc/hosts).
	Resolver *net.Resolver
	// DataTenants, when set, lists the tenants that hold data (those of
	// them with GPU data get the GPU pack); asked every tenant poll. nil:
	// the tenants of DBs. With the ring a ruler's own DBs hold no tenant's
	// data, the receivers do.
	DataTenants func() []string
}

// Ruler runs the rule managers of every tenant. It is a dskit service.
type Ruler struct {
	services.Service

	opts        Options
	cfg         Config
	logger      *slog.Logger
	reg         prometheus.Registerer
	queryable   storage.Queryable
	parser      parser.Parser
	externalURL *url.URL
	pack        []ruleFile
	// packExprs are the pack's expressions, parsed once for every tenant
	// (share.go).
	packExprs map[string]parser.Expr

	ctx    context.Context // parent of every evaluation; cancelled on stop
	cancel context.CancelFunc

	// syncMtx serialises loads (start-up, reload, tenant polls) and stop.
	syncMtx sync.Mutex
	stopped bool

	mtx     sync.RWMutex
	tenants map[string]*tenantRules

	reloadSuccess *prometheus.GaugeVec
	reloadTime    *prometheus.GaugeVec
	// ownership is Options.Ownership's answer of the last load (the
	// running loop's, and starting's, before it).
	ownership string
	// amTargets finds the Alertmanagers; nil without any.
	amTargets *alertmanagerTargets
}

// tenantRules is one tenant's rule and notifier managers.
type tenantRules struct {
	id      string
	manager *rules.Manager
	loader  *snapshotLoader
	// externalLabels are the tenant's alerts' external labels, given to
	// every load (and to the rules rebuilt by share.go's ruleLabels).
	externalLabels labels.Labels
	notifier       *notifier.Manager // nil without Alertmanagers
	notifierDone   chan struct{}

	// Guarded by Ruler.syncMtx: the tenant's own files as last loaded, and
	// whether the GPU pack is part of its rules.
	own     []ruleFile
	hasPack bool
}

// New builds the ruler; nothing is loaded or evaluated before the service starts.
func New(opts Options) (*Ruler, error) {
	cfg := opts.Config
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if opts.DBs == nil || opts.Engine == nil {
		return nil, errors.New("rules: tenant databases and PromQL engine are required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Registerer == nil {
		opts.Registerer = prometheus.NewRegistry()
	}
	q := opts.Queryable
	if q == nil {
		q = query.TenantQueryable{DBs: opts.DBs}
	}
	ext, err := externalURL(cfg.ExternalURL, opts.ListenAddress)
	if err != nil {
		return nil, err
	}
	p := opts.Parser
	if p == nil {
		p = parser.NewParser(parser.Options{})
	}
	var pack []ruleFile
	var exprs map[string]parser.Expr
	if cfg.GPUPack {
		if pack, err = packFiles(); err != nil {
			return nil, err
		}
		if exprs, err = packExprs(pack, p, opts.Logger); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Ruler{
		opts: opts, cfg: cfg, logger: opts.Logger, reg: opts.Registerer, queryable: q,
		parser:      p,
		externalURL: ext, pack: pack, packExprs: exprs, ctx: ctx, cancel: cancel,
		tenants: map[string]*tenantRules{},
		reloadSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpustore_rules_config_last_reload_successful",
			Help: "Whether the last load of the tenant's rule files succeeded (0: the previous rules keep running).",
		}, []string{"tenant"}),
		reloadTime: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpustore_rules_config_last_reload_success_timestamp_seconds",
			Help: "Time of the last successful load of the tenant's rule files.",
		}, []string{"tenant"}),
	}
	if err := r.reg.Register(r.reloadSuccess); err != nil {
		return nil, err
	}
	if err := r.reg.Register(r.reloadTime); err != nil {
		return nil, err
	}
	if len(cfg.Alertmanager.URLs) > 0 {
		if r.amTargets, err = newAlertmanagerTargets(cfg.Alertmanager, opts.Resolver, opts.Logger.With("component", "alertmanager discovery"), r.reg); err != nil {
			return nil, err
		}
	}
	r.Service = services.NewBasicService(r.starting, r.running, r.stopping)
	return r, nil
}

// externalURL is the configured URL, or http://<hostname>:<port>.
func externalURL(configured, listen string) (*url.URL, error) {
	if configured != "" {
		return url.Parse(configured)
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	port := "9201"
	if _, p, err := net.SplitHostPort(listen); err == nil && p != "" && p != "0" {
		port = p
	}
	return &url.URL{Scheme: "http", Host: net.JoinHostPort(host, port)}, nil
}

func (r *Ruler) starting(context.Context) error {
	if len(r.cfg.Alertmanager.URLs) == 0 {
		r.logger.Warn("no Alertmanager configured (--alertmanager.url): alerts are evaluated and listed at /api/v1/alerts, but not sent")
	} else {
		var redacted []string
		for _, s := range r.amTargets.sources {
			redacted = append(redacted, s.shown)
		}
		r.logger.Info("sending alerts", "alertmanagers", redacted)
		// Before the first tenant's notifier subscribes; DNS lookups then
		// repeat until the ruler stops.
		r.amTargets.refresh(r.ctx)
		go r.amTargets.run(r.ctx)
	}
	if r.cfg.Dir != "" {
		if _, err := os.Stat(r.cfg.Dir); err != nil {
			return fmt.Errorf("rules dir: %w", err)
		}
	}
	// Errors in rule files are reported per tenant (log, gauge) and do not
	// stop gpustore: other tenants' rules and the data path keep working.
	r.ownershipChanged()
	_ = r.sync(true)
	return nil
}

func (r *Ruler) running(ctx context.Context) error {
	t := time.NewTicker(time.Duration(r.cfg.TenantPollInterval))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if r.ownershipChanged() {
				_ = r.sync(true)
				continue
			}
			_ = r.sync(false)
		}
	}
}

// ownershipChanged asks Options.Ownership and reports whether it changed.
func (r *Ruler) ownershipChanged() bool {
	if r.opts.Ownership == nil {
		return false
	}
	o := r.opts.Ownership()
	if o == r.ownership {
		return false
	}
	r.logger.Info("the ring changed: rule groups are shared out again", "rulers", o)
	r.ownership = o
	return true
}

func (r *Ruler) stopping(error) error {
	r.syncMtx.Lock()
	r.stopped = true
	r.syncMtx.Unlock()
	// In-flight queries end at once; the groups stop after their current rule.
	r.cancel()

	r.mtx.RLock()
	trs := make([]*tenantRules, 0, len(r.tenants))
	for _, tr := range r.tenants {
		trs = append(trs, tr)
	}
	r.mtx.RUnlock()

	var wg sync.WaitGroup
	for _, tr := range trs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Rule manager first: stopping the notifier under a running
			// rule manager drops its last alerts (as in Prometheus' main).
			if r.cfg.ManualEvaluation {
				// Its groups wait for Run before their loops can see the
				// stop; they return at once.
				go tr.manager.Run()
			}
			tr.manager.Stop()
			if tr.notifier != nil {
				tr.notifier.Stop()
				select {
				case <-tr.notifierDone:
				case <-time.After(time.Duration(r.cfg.Alertmanager.Timeout) + 5*time.Second):
					r.logger.Warn("notifier did not drain in time", "tenant", tr.id)
				}
			}
		}()
	}
	wg.Wait()
	return nil
}

// Reload re-reads the rule files of every tenant (SIGHUP, POST /-/reload).
// It returns the errors of the tenants whose files failed; those tenants keep
// their previous rules.
func (r *Ruler) Reload() error {
	if s := r.State(); s != services.Running {
		return fmt.Errorf("rules are not running (%s)", s)
	}
	return r.sync(true)
}

// ServeReload answers POST /-/reload as Prometheus does: 200 once reloaded,
// 500 with the errors otherwise.
func (r *Ruler) ServeReload(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost && req.Method != http.MethodPut {
		w.Header().Set("Allow", "POST, PUT")
		http.Error(w, "only POST or PUT requests allowed", http.StatusMethodNotAllowed)
		return
	}
	if err := r.Reload(); err != nil {
		http.Error(w, fmt.Sprintf("failed to reload config: %s", err), http.StatusInternalServerError)
		return
	}
}

// RulesRetriever returns the rule groups and alerts of the context's tenant,
// for /api/v1/rules and /api/v1/alerts (query.Options.Rules).
func (r *Ruler) RulesRetriever(ctx context.Context) v1.RulesRetriever {
	id, err := tenant.TenantID(ctx)
	if err != nil {
		return NoRules{}
	}
	if tr := r.tenant(id); tr != nil {
		return tr.manager
	}
	return NoRules{}
}

// NoRules is the empty v1.RulesRetriever.
type NoRules struct{}

// RuleGroups implements v1.RulesRetriever.
func (NoRules) RuleGroups() []*rules.Group { return nil }

// AlertingRules implements v1.RulesRetriever.
func (NoRules) AlertingRules() []*rules.AlertingRule { return nil }

// Tenants lists the tenants that have a rule manager, sorted.
func (r *Ruler) Tenants() []string {
	r.mtx.RLock()
	defer r.mtx.RUnlock()
	out := make([]string, 0, len(r.tenants))
	for t := range r.tenants {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// Manager returns the tenant's rules.Manager, or nil.
func (r *Ruler) Manager(tenantID string) *rules.Manager {
	if tr := r.tenant(tenantID); tr != nil {
		return tr.manager
	}
	return nil
}

func (r *Ruler) tenant(id string) *tenantRules {
	r.mtx.RLock()
	defer r.mtx.RUnlock()
	return r.tenants[id]
}

// sync loads rules. full (start-up, reload) re-reads the rules directory and
// reloads every tenant; otherwise only tenants that appeared in the tenant
// databases since the last look are loaded (with the GPU pack).
func (r *Ruler) sync(full bool) error {
	r.syncMtx.Lock()
	defer r.syncMtx.Unlock()
	if r.stopped {
		return errors.New("rules are stopped")
	}
	if !full {
		if !r.cfg.GPUPack {
			return nil
		}
		// Tenants that wrote their first GPU data since the last look get
		// the pack, alongside the files they already had.
		var errs []error
		for _, t := range r.dataTenants() {
			if !r.allowed(t) {
				continue
			}
			var own []ruleFile
			tr := r.tenant(t)
			if tr != nil {
				if tr.hasPack {
					continue
				}
				own = tr.own
			}
			if !r.hasGPUData(t) {
				continue
			}
			r.logger.Info("tenant holds GPU data: loading the GPU rule pack", "tenant", t)
			if err := r.load(t, own, nil, true, tr == nil); err != nil {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	}

	byTenant, warnings, err := scanDir(r.cfg.Dir, r.opts.Tenants.DefaultTenant)
	if err != nil {
		// Without the directory nothing can be told apart from "no rules":
		// keep every tenant's rules as they are.
		r.logger.Error("reading rule files failed; previous rules keep running", "dir", r.cfg.Dir, "err", err)
		for _, t := range r.Tenants() {
			r.reloadSuccess.WithLabelValues(t).Set(0)
		}
		return err
	}
	for _, w := range warnings {
		r.logger.Warn("rule files", "err", w)
	}
	set := map[string]bool{}
	for t := range byTenant {
		if !r.allowed(t) {
			r.logger.Warn("rules dir names a tenant that is not in tenants.allowed: ignored", "tenant", t)
			delete(byTenant, t)
			continue
		}
		set[t] = true
	}
	withData := map[string]bool{}
	if r.cfg.GPUPack {
		for _, t := range r.dataTenants() {
			if !r.allowed(t) {
				continue
			}
			set[t] = true
			if tr := r.tenant(t); (tr != nil && tr.hasPack) || r.hasGPUData(t) {
				withData[t] = true
			}
		}
	}
	for _, t := range r.Tenants() {
		set[t] = true // a tenant whose files are gone gets an empty rule set
	}
	ids := make([]string, 0, len(set))
	for t := range set {
		ids = append(ids, t)
	}
	sort.Strings(ids)
	var errs []error
	for _, t := range ids {
		own, readErrs := readFiles(byTenant[t])
		// A tenant keeps the pack once it had it: a list of data tenants
		// missing it (a receiver that did not answer) must not unload it.
		hasData := withData[t]
		if tr := r.tenant(t); tr != nil && tr.hasPack {
			hasData = true
		}
		if err := r.load(t, own, readErrs, hasData, true); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// gpuDataWindow is how far back a tenant's GPU data is looked for: the
// pack's longest range (1h) and offset (10m), and margin. A tenant whose
// exporters went quiet longer ago gets no pack after a restart, and the
// pack's rules would find nothing of it anyway.
const gpuDataWindow = 2 * time.Hour

// gpuMetrics matches the names of dcgm-exporter's metrics, which the pack
// is written for.
var gpuMetrics = labels.MustNewMatcher(labels.MatchRegexp, model.MetricNameLabel, "DCGM_.+")

// hasGPUData says whether tenant t holds a series of dcgm-exporter in the
// last gpuDataWindow, read through the rules' queryable (with the ring, the
// receivers): one label-values call, at most one name back.
func (r *Ruler) hasGPUData(t string) bool {
	ctx, cancel := context.WithTimeout(user.InjectOrgID(r.ctx, t), 30*time.Second)
	defer cancel()
	now := time.Now()
	q, err := r.queryable.Querier(now.Add(-gpuDataWindow).UnixMilli(), now.UnixMilli())
	if err != nil {
		r.logger.Warn("looking for the tenant's GPU data", "tenant", t, "err", err)
		return false
	}
	defer q.Close()
	names, _, err := q.LabelValues(ctx, model.MetricNameLabel, &storage.LabelHints{Limit: 1}, gpuMetrics)
	if err != nil {
		r.logger.Warn("looking for the tenant's GPU data", "tenant", t, "err", err)
		return false
	}
	return len(names) > 0
}

// dataTenants lists the tenants holding data (Options.DataTenants).
func (r *Ruler) dataTenants() []string {
	if r.opts.DataTenants != nil {
		return r.opts.DataTenants()
	}
	return r.opts.DBs.Tenants()
}

func (r *Ruler) allowed(t string) bool {
	return len(r.opts.Tenants.Allowed) == 0 || slices.Contains(r.opts.Tenants.Allowed, t)
}

// load gives tenant t its own rule files and, when it holds data (hasData)
// and the pack is on, the GPU pack. Nothing changes for t unless every file was read
// (readErrs empty) and checks. setGauge is false when only the pack is
// added to a tenant's last loaded files, so that doing so after a failed
// reload does not hide the failure.
func (r *Ruler) load(t string, own []ruleFile, readErrs []error, hasData, setGauge bool) error {
	logger := r.logger.With("tenant", t)
	groups, cerrs := checkFiles(own, r.parser, logger)
	errs := append(slices.Clone(readErrs), cerrs...)
	var failed error
	if len(errs) > 0 {
		for _, err := range errs {
			logger.Error("rule file has errors; the tenant's previous rules keep running", "err", err)
		}
		r.reloadSuccess.WithLabelValues(t).Set(0)
		failed = fmt.Errorf("tenant %s: %w", t, errors.Join(errs...))
		if r.tenant(t) != nil {
			return failed
		}
		// First load: there are no previous rules. The tenant runs the GPU
		// pack (if it has data) without its broken files.
		own, groups, setGauge = nil, nil, false
	}

	// The pack is for tenants with data: a tenant known only from the rules
	// directory gets it once it holds data (see sync).
	withPack := r.cfg.GPUPack && hasData
	var files []ruleFile
	if withPack {
		files = append(files, r.pack...)
	}
	files = append(files, own...)
	snapshot := make(map[string][]byte, len(files))
	names := make([]string, 0, len(files))
	for _, f := range files {
		snapshot[f.name] = f.content
		names = append(names, f.name)
	}
	tr, err := r.tenantRules(t)
	if err != nil {
		logger.Error("start rule manager", "err", err)
		r.reloadSuccess.WithLabelValues(t).Set(0)
		return fmt.Errorf("tenant %s: %w", t, err)
	}
	tr.loader.files = snapshot
	tr.loader.overridden = groups
	if err := tr.manager.Update(time.Duration(r.cfg.EvaluationInterval), names, tr.externalLabels, r.externalURL.String(), nil); err != nil {
		logger.Error("loading rules failed; the tenant's previous rules keep running", "err", err)
		r.reloadSuccess.WithLabelValues(t).Set(0)
		return fmt.Errorf("tenant %s: %w", t, err)
	}
	tr.own, tr.hasPack = own, withPack
	if setGauge {
		r.reloadSuccess.WithLabelValues(t).Set(1)
		r.reloadTime.WithLabelValues(t).SetToCurrentTime()
	}
	logger.Debug("rules loaded", "files", len(names), "groups", len(tr.manager.RuleGroups()))
	return failed
}

// tenantRules returns the tenant's managers, creating and starting them on
// first use. Managers live until the ruler stops (their metrics are
// registered once per tenant).
func (r *Ruler) tenantRules(t string) (*tenantRules, error) {
	if tr := r.tenant(t); tr != nil {
		return tr, nil
	}
	logger := r.logger.With("tenant", t)
	reg := prometheus.WrapRegistererWith(prometheus.Labels{"tenant": t}, r.reg)
	tr := &tenantRules{id: t, loader: &snapshotLoader{parser: r.parser, logger: logger, shared: r.packExprs},
		externalLabels: alertExternalLabels(r.cfg, t)}
	if owns := r.opts.Owns; owns != nil {
		tr.loader.owns = func(file, group string) bool { return owns(t, file, group) }
	}

	notify := func(context.Context, string, ...*rules.Alert) {}
	if r.amTargets != nil {
		n, err := newNotifier(r.cfg, t, reg, logger.With("component", "notifier"))
		if err != nil {
			return nil, err
		}
		// The Alertmanagers found now and on every change.
		ch := r.amTargets.subscribe()
		tr.notifier, tr.notifierDone = n, make(chan struct{})
		go func() {
			defer close(tr.notifierDone)
			n.Run(ch)
		}()
		notify = rules.SendAlerts(n, r.externalURL.String())
	}

	offset := time.Duration(r.cfg.QueryOffset)
	ctx := user.InjectOrgID(r.ctx, t)
	if r.opts.EvalContext != nil {
		ctx = r.opts.EvalContext(ctx)
	}
	tr.manager = rules.NewManager(&rules.ManagerOptions{
		ExternalURL:            r.externalURL,
		QueryFunc:              rules.EngineQueryFunc(r.opts.Engine, r.queryable),
		NotifyFunc:             notify,
		Context:                ctx,
		AppendableV2:           r.appendable(t),
		Queryable:              r.queryable,
		Logger:                 logger.With("component", "rule manager"),
		Registerer:             reg,
		OutageTolerance:        time.Duration(r.cfg.OutageTolerance),
		ForGracePeriod:         time.Duration(r.cfg.ForGracePeriod),
		ResendDelay:            time.Duration(r.cfg.ResendDelay),
		GroupLoader:            tr.loader,
		DefaultRuleQueryOffset: func() time.Duration { return offset },
		Parser:                 r.parser,
		// Each rule's labels and annotations in one symbol table of the
		// tenant's, in place of one each (share.go).
		RuleDependencyController: newRuleLabels(tr.externalLabels, r.externalURL.String(), logger.With("component", "rule manager")),
	})
	if !r.cfg.ManualEvaluation {
		go tr.manager.Run()
	}

	r.mtx.Lock()
	r.tenants[t] = tr
	r.mtx.Unlock()
	return tr, nil
}

// appendable is where tenant t's rule results go.
func (r *Ruler) appendable(t string) storage.AppendableV2 {
	if r.opts.Appendable == nil {
		return tenantAppendable{dbs: r.opts.DBs, tenant: t}
	}
	a, err := r.opts.Appendable(t)
	if err != nil {
		return failingAppendable{err}
	}
	return a
}

// failingAppendable fails every append with err (the rules manager logs it
// per evaluation).
type failingAppendable struct{ err error }

func (f failingAppendable) AppenderV2(context.Context) storage.AppenderV2 {
	return &lazyAppender{err: f.err}
}

// tenantAppendable appends rule results to the tenant's TSDB. The database
// is opened (created for a new tenant) on the first sample, so evaluating
// rules that return nothing creates nothing.
type tenantAppendable struct {
	dbs    *tenantdb.Manager
	tenant string
}

func (a tenantAppendable) AppenderV2(ctx context.Context) storage.AppenderV2 {
	return &lazyAppender{a: a, ctx: ctx}
}

type lazyAppender struct {
	a   tenantAppendable
	ctx context.Context
	app storage.AppenderV2
	err error
}

func (l *lazyAppender) Append(ref storage.SeriesRef, ls labels.Labels, st, t int64, v float64, h *histogram.Histogram, fh *histogram.FloatHistogram, opts storage.AOptions) (storage.SeriesRef, error) {
	if l.app == nil && l.err == nil {
		db, err := l.a.dbs.Get(l.a.tenant)
		if err != nil {
			l.err = err
		} else {
			l.app = db.AppenderV2(l.ctx)
		}
	}
	if l.err != nil {
		return 0, l.err
	}
	return l.app.Append(ref, ls, st, t, v, h, fh, opts)
}

func (l *lazyAppender) Commit() error {
	if l.app == nil {
		return nil
	}
	return l.app.Commit()
}

func (l *lazyAppender) Rollback() error {
	if l.app == nil {
		return nil
	}
	return l.app.Rollback()
}
