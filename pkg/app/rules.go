package app

import (
	"context"
	"errors"

	"github.com/grafana/dskit/services"
	v1 "github.com/prometheus/prometheus/web/api/v1"

	"github.com/gpustore/gpustore/pkg/query"
	"github.com/gpustore/gpustore/pkg/readopts"
	"github.com/gpustore/gpustore/pkg/rules"
)

// initRules builds the rules role: Prometheus' rule and notifier managers
// per tenant over the query role's engine, writing to the storage role's
// tenant databases. It serves POST /-/reload.
func (a *App) initRules() (services.Service, error) {
	replicaLabels := []string(a.Cfg.Query.ReplicaLabels)
	appendable, err := a.ringAppendable()
	if err != nil {
		return nil, err
	}
	owns, ownership := a.ruleSharding()
	r, err := rules.New(rules.Options{
		Config:  a.Cfg.Rules,
		Tenants: a.Cfg.Tenant,
		DBs:     a.DBs,
		Engine:  a.API.Engine(),
		Parser:  a.API.Parser(),
		// Rules read what queries read: the tenant's TSDB merged with the
		// query sources (bucket blocks) and the ring's receivers.
		Queryable: query.TenantQueryable{
			DBs: a.DBs, Sources: a.querySources(),
			Receivers: a.Receivers, ReceiversLookback: a.receiversLookback(),
		},
		// A rule's read options: deduplicated as the API's default, each
		// select at the resolution its step and range choose.
		EvalContext: func(ctx context.Context) context.Context {
			o := readopts.Default()
			o.ReplicaLabels = replicaLabels
			return readopts.NewContext(ctx, o)
		},
		Owns:          owns,
		Ownership:     ownership,
		DataTenants:   a.ruleDataTenants(),
		Appendable:    appendable,
		Logger:        a.Logger.With("component", "rules"),
		Registerer:    a.Registry,
		ListenAddress: a.Server.Addr().String(),
	})
	if err != nil {
		return nil, err
	}
	a.Ruler = r
	a.Server.OnReload("rules", r.Reload) // SIGHUP and POST /-/reload
	return r, nil
}

// rulesRetriever answers /api/v1/rules and /api/v1/alerts for the request's
// tenant (query.Options.Rules). The query role is built before the rules
// role, so the ruler is looked up per request; without the rules role there
// are no rules.
func (a *App) rulesRetriever(ctx context.Context) v1.RulesRetriever {
	if a.Ruler == nil {
		return rules.NoRules{}
	}
	return a.Ruler.RulesRetriever(ctx)
}

// Reload re-reads what can change without a restart (SIGHUP; POST /-/reload
// does the same): the web config file, then the rule files.
func (a *App) Reload() error {
	if a.Server == nil {
		return errors.New("nothing to reload: not started")
	}
	return a.Server.Reload()
}
