package rules

import (
	"errors"
	"flag"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/grafana/dskit/dns"
	"github.com/prometheus/common/model"
)

// Config is the `rules:` section of gpustore's configuration.
type Config struct {
	// Dir holds rule files in Prometheus' format: <Dir>/<tenant>/*.yml for
	// each tenant, and <Dir>/*.yml for the default tenant. Empty: no files.
	Dir string `yaml:"dir"`
	// GPUPack evaluates the embedded GPU rule pack (deploy/rules) for every
	// tenant that holds GPU (dcgm-exporter) data.
	GPUPack bool `yaml:"gpu_pack"`
	// EvaluationInterval applies to groups that set no interval of their own
	// (the pack's groups all set one).
	EvaluationInterval model.Duration `yaml:"evaluation_interval"`
	// QueryOffset evaluates every rule this much in the past (Prometheus'
	// global rule_query_offset), for senders whose samples arrive late.
	QueryOffset model.Duration `yaml:"query_offset"`
	// TenantPollInterval is how often tenants that started writing since the
	// last look get the GPU pack.
	TenantPollInterval model.Duration `yaml:"tenant_poll_interval"`
	// ExternalLabels are added to every alert sent (when the alert has no
	// label of that name) and are $externalLabels in templates.
	ExternalLabels map[string]string `yaml:"external_labels"`
	// TenantLabel, when not empty, is the name of an external label holding
	// the tenant, so that alerts of different tenants stay apart in a shared
	// Alertmanager.
	TenantLabel string `yaml:"tenant_label"`
	// ExternalURL is the base of the alerts' generatorURL and
	// $externalURL in templates. Empty: http://<hostname>:<port>.
	ExternalURL string `yaml:"external_url"`
	// OutageTolerance, ForGracePeriod and ResendDelay are Prometheus'
	// --rules.alert.* settings.
	OutageTolerance model.Duration `yaml:"for_outage_tolerance"`
	ForGracePeriod  model.Duration `yaml:"for_grace_period"`
	ResendDelay     model.Duration `yaml:"resend_delay"`

	Alertmanager AlertmanagerConfig `yaml:"alertmanager"`

	// ManualEvaluation (tests only, not configurable) leaves every rule
	// group idle: nothing is evaluated on the wall clock, the caller
	// evaluates the groups of Ruler.Manager(tenant).RuleGroups() with
	// (*rules.Group).Eval at the times it chooses, e.g. a simulated day in
	// minutes (test/e2e/day_test.go). Queries, results, ALERTS and the
	// notifier are the ones a running ruler uses.
	ManualEvaluation bool `yaml:"-"`
}

// AlertmanagerConfig says where alerts go.
type AlertmanagerConfig struct {
	// URLs of Alertmanagers (their v2 API is used), e.g.
	// http://alertmanager:9093 or https://user:pass@host/prefix. Every alert
	// goes to every URL. Empty: alerts are evaluated but not sent.
	//
	// Every replica of an HA Alertmanager must receive every alert: list
	// them all, or let DNS name them with dskit's syntax (as
	// --memberlist.join): dns+http://host:port does an A/AAAA lookup of host
	// (a headless Service: every pod), dnssrv+http://_web._tcp.host an SRV
	// lookup (dnssrvnoa+ without the A lookup of its targets), repeated
	// every RefreshInterval; every address found gets every alert.
	URLs []string `yaml:"urls"`
	// RefreshInterval is how often the dns+/dnssrv+ URLs are looked up.
	RefreshInterval model.Duration `yaml:"refresh_interval"`
	Timeout         model.Duration `yaml:"timeout"`
	// QueueCapacity is the number of alerts queued per tenant and Alertmanager.
	QueueCapacity int `yaml:"notification_queue_capacity"`
}

// DefaultConfig is Prometheus' defaults, with the GPU pack on, no rules
// directory and no Alertmanager.
func DefaultConfig() Config {
	return Config{
		GPUPack:            true,
		EvaluationInterval: model.Duration(time.Minute),
		TenantPollInterval: model.Duration(15 * time.Second),
		TenantLabel:        "tenant",
		OutageTolerance:    model.Duration(time.Hour),
		ForGracePeriod:     model.Duration(10 * time.Minute),
		ResendDelay:        model.Duration(time.Minute),
		Alertmanager: AlertmanagerConfig{
			RefreshInterval: model.Duration(30 * time.Second),
			Timeout:         model.Duration(10 * time.Second),
			QueueCapacity:   10000,
		},
	}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	var errs []error
	if c.EvaluationInterval <= 0 {
		errs = append(errs, errors.New("rules evaluation interval must be positive"))
	}
	if c.TenantPollInterval <= 0 {
		errs = append(errs, errors.New("rules tenant poll interval must be positive"))
	}
	if c.QueryOffset < 0 || c.OutageTolerance < 0 || c.ForGracePeriod < 0 || c.ResendDelay < 0 {
		errs = append(errs, errors.New("rules query offset, for outage tolerance, for grace period and resend delay must not be negative"))
	}
	for name, value := range c.ExternalLabels {
		if !model.UTF8Validation.IsValidLabelName(name) || name == model.MetricNameLabel {
			errs = append(errs, fmt.Errorf("rules external label name %q is not valid", name))
		}
		if value == "" {
			errs = append(errs, fmt.Errorf("rules external label %q has an empty value", name))
		}
	}
	if c.TenantLabel != "" && !model.UTF8Validation.IsValidLabelName(c.TenantLabel) {
		errs = append(errs, fmt.Errorf("rules tenant label %q is not a valid label name", c.TenantLabel))
	}
	if c.ExternalURL != "" {
		if u, err := url.Parse(c.ExternalURL); err != nil || u.Scheme == "" || u.Host == "" {
			errs = append(errs, fmt.Errorf("rules external URL %q is not an absolute URL", c.ExternalURL))
		}
	}
	for _, s := range c.Alertmanager.URLs {
		if _, _, err := parseAlertmanagerURL(s); err != nil {
			errs = append(errs, err)
		}
	}
	if c.Alertmanager.Timeout <= 0 || c.Alertmanager.QueueCapacity <= 0 || c.Alertmanager.RefreshInterval <= 0 {
		errs = append(errs, errors.New("alertmanager timeout, refresh interval and notification queue capacity must be positive"))
	}
	return errors.Join(errs...)
}

// RegisterFlags binds the rule and Alertmanager flags, in Prometheus'
// dotted style, with c's values as defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Dir, "rules.dir", c.Dir, "Directory of Prometheus rule files: <dir>/<tenant>/*.yml for a tenant, <dir>/*.yml for the default tenant. Re-read on SIGHUP and POST /-/reload.")
	fs.BoolVar(&c.GPUPack, "rules.gpu-pack", c.GPUPack, "Evaluate the embedded GPU rule pack (recording rules and P0/P1/P2 alerts, deploy/rules) for every tenant that holds dcgm-exporter (DCGM_…) data.")
	fs.Var(&c.EvaluationInterval, "rules.evaluation-interval", "Evaluation interval of rule groups that set none.")
	fs.Var(&c.QueryOffset, "rules.query-offset", "Evaluate rules this much in the past, for samples that arrive late.")
	fs.Var(&c.TenantPollInterval, "rules.tenant-poll-interval", "How often new tenants are looked for (they get the GPU pack).")
	fs.StringVar(&c.ExternalURL, "rules.external-url", c.ExternalURL, "Base URL of the alerts' generatorURL (default http://<hostname>:<port>).")
	fs.StringVar(&c.TenantLabel, "rules.tenant-label", c.TenantLabel, "Label added to sent alerts naming their tenant (empty: none).")
	fs.Var(&c.OutageTolerance, "rules.alert.for-outage-tolerance", "Max time to tolerate an outage for restoring the \"for\" state of alerts.")
	fs.Var(&c.ForGracePeriod, "rules.alert.for-grace-period", "Minimum duration between an alert and its restored \"for\" state.")
	fs.Var(&c.ResendDelay, "rules.alert.resend-delay", "Minimum time to wait before resending an alert to Alertmanager.")
	fs.Var(&listFlag{target: &c.Alertmanager.URLs}, "alertmanager.url", "Alertmanager to send alerts to (v2 API), e.g. http://alertmanager:9093; repeat for several. Every replica of an HA Alertmanager must get every alert: list them all, or prefix dns+ (A/AAAA lookup: dns+http://alertmanager-operated.monitoring.svc.cluster.local:9093) or dnssrv+ (SRV lookup: dnssrv+http://_web._tcp.alertmanager-operated.monitoring.svc.cluster.local) to send to every address found. None: alerts are not sent.")
	fs.Var(&c.Alertmanager.RefreshInterval, "alertmanager.refresh-interval", "How often dns+ and dnssrv+ Alertmanager URLs are looked up.")
	fs.Var(&c.Alertmanager.Timeout, "alertmanager.timeout", "Timeout of a request to an Alertmanager.")
	fs.IntVar(&c.Alertmanager.QueueCapacity, "alertmanager.notification-queue-capacity", c.Alertmanager.QueueCapacity, "Alerts queued per tenant and Alertmanager.")
}

// listFlag is a repeatable flag. The values given on the command line
// replace the list (from the defaults or the YAML file) as a whole, and
// parsing the same arguments twice (app.Load parses flags before and after
// reading the file) gives the same list.
type listFlag struct {
	target *[]string
	given  []string
}

func (f *listFlag) String() string {
	if f == nil || f.target == nil {
		return ""
	}
	return strings.Join(*f.target, ",")
}

func (f *listFlag) Set(s string) error {
	if !slices.Contains(f.given, s) {
		f.given = append(f.given, s)
	}
	*f.target = slices.Clone(f.given)
	return nil
}

// parseAlertmanagerURL checks an Alertmanager URL and splits off its DNS
// lookup prefix (dns+, dnssrv+, dnssrvnoa+; "" for none).
func parseAlertmanagerURL(s string) (dns.QType, *url.URL, error) {
	var qtype dns.QType
	if q, rest, ok := strings.Cut(s, "+"); ok && !strings.Contains(q, ":") {
		switch dns.QType(q) {
		case dns.A, dns.SRV, dns.SRVNoA:
			qtype, s = dns.QType(q), rest
		default:
			return "", nil, fmt.Errorf("alertmanager URL %q: lookup %q: want dns+, dnssrv+ or dnssrvnoa+", q+"+"+rest, q)
		}
	}
	u, err := url.Parse(s)
	if err != nil {
		return "", nil, fmt.Errorf("alertmanager URL %q: %w", s, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", nil, fmt.Errorf("alertmanager URL %q: want [dns+|dnssrv+]http(s)://host:port[/prefix]", s)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return "", nil, fmt.Errorf("alertmanager URL %q: no query or fragment allowed", s)
	}
	if qtype == dns.A && u.Port() == "" {
		return "", nil, fmt.Errorf("alertmanager URL dns+%s: an A/AAAA lookup needs the port (dns+http://host:9093)", u.Redacted())
	}
	return qtype, u, nil
}
