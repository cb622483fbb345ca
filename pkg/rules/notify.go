package rules

import (
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	commoncfg "github.com/prometheus/common/config"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/config"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/notifier"

	"github.com/gpustore/gpustore/pkg/tenancy"
)

// alertmanagerConfigs turns the configured URLs into Prometheus'
// alerting.alertmanagers entries, one per URL (its scheme, path prefix,
// credentials). Their targets are not here: alertmanagerTargets delivers
// them, keyed like ToMap. Every request carries the tenant in
// X-Scope-OrgID, which a multi-tenant Alertmanager (Mimir, Cortex) reads
// and a plain Alertmanager ignores.
func alertmanagerConfigs(cfg AlertmanagerConfig, tenantID string) (config.AlertmanagerConfigs, error) {
	var cfgs config.AlertmanagerConfigs
	for _, s := range cfg.URLs {
		_, u, err := parseAlertmanagerURL(s)
		if err != nil {
			return nil, err
		}
		amc := config.DefaultAlertmanagerConfig
		amc.Scheme = u.Scheme
		amc.PathPrefix = strings.TrimSuffix(u.Path, "/")
		amc.Timeout = cfg.Timeout
		amc.APIVersion = config.AlertmanagerAPIVersionV2
		amc.HTTPClientConfig.HTTPHeaders = &commoncfg.Headers{Headers: map[string]commoncfg.Header{
			tenancy.OrgIDHeader: {Values: []string{tenantID}},
		}}
		if u.User != nil {
			pw, _ := u.User.Password()
			amc.HTTPClientConfig.BasicAuth = &commoncfg.BasicAuth{Username: u.User.Username(), Password: commoncfg.Secret(pw)}
		}
		if err := amc.HTTPClientConfig.Validate(); err != nil {
			return nil, fmt.Errorf("alertmanager %s: %w", redact(u), err)
		}
		cfgs = append(cfgs, &amc)
	}
	return cfgs, nil
}

// redact hides a password in an Alertmanager URL for logs.
func redact(u *url.URL) string { return u.Redacted() }

// alertExternalLabels are the labels the tenant's notifier adds to each alert
// that lacks them: the configured external labels and the tenant label.
func alertExternalLabels(cfg Config, tenantID string) labels.Labels {
	m := maps.Clone(cfg.ExternalLabels)
	if m == nil {
		m = map[string]string{}
	}
	if cfg.TenantLabel != "" {
		m[cfg.TenantLabel] = tenantID
	}
	return labels.FromMap(m)
}

// newNotifier builds and configures the tenant's notifier.Manager, as
// Prometheus' main does: NewManager, then ApplyConfig with the alerting
// section. Its Run takes the targets from alertmanagerTargets.subscribe.
func newNotifier(cfg Config, tenantID string, reg prometheus.Registerer, logger *slog.Logger) (*notifier.Manager, error) {
	amcfgs, err := alertmanagerConfigs(cfg.Alertmanager, tenantID)
	if err != nil {
		return nil, err
	}
	n := notifier.NewManager(&notifier.Options{
		QueueCapacity:   cfg.Alertmanager.QueueCapacity,
		DrainOnShutdown: true,
		Registerer:      reg,
	}, model.UTF8Validation, logger)
	conf := &config.Config{
		GlobalConfig: config.GlobalConfig{
			ExternalLabels:             alertExternalLabels(cfg, tenantID),
			MetricNameValidationScheme: model.UTF8Validation,
		},
		AlertingConfig: config.AlertingConfig{AlertmanagerConfigs: amcfgs},
	}
	if err := n.ApplyConfig(conf); err != nil {
		return nil, fmt.Errorf("configure notifier of tenant %q: %w", tenantID, err)
	}
	return n, nil
}
