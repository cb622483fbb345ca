package rules

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/grafana/dskit/dns"
	"github.com/grafana/dskit/dns/godns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/discovery/targetgroup"

	"github.com/gpustore/gpustore/internal/logging"
)

// alertmanagerTargets finds the Alertmanagers behind each configured URL
// and hands them to every tenant's notifier. An HA Alertmanager is several
// replicas that gossip silences and which notifications went out, not the
// alerts: each replica must receive every alert, so a URL that names all of
// them (a Kubernetes headless Service, an SRV record) is looked up, and
// every address found becomes an Alertmanager of that URL's set in the
// notifier (Prometheus' notifier sends each alert to every one of them).
//
// A URL prefixed dns+ is an A/AAAA lookup of its host (the port is the
// URL's), dnssrv+ an SRV lookup (each target's port unless the URL names
// one, then an A/AAAA lookup of each target) and dnssrvnoa+ an SRV lookup
// whose targets are used as they are: dskit's DNS-provider syntax, as
// --memberlist.join takes it. Lookups repeat every refresh interval; any
// other URL is its own address.
type alertmanagerTargets struct {
	sources  []amSource
	resolver dns.Resolver
	interval time.Duration
	logger   *slog.Logger
	failures prometheus.Counter

	mtx    sync.Mutex
	latest map[string][]*targetgroup.Group // by source key; nil before the first refresh
	subs   []chan map[string][]*targetgroup.Group
}

// amSource is one configured URL: the key of its Alertmanager set in the
// notifier (config.AlertmanagerConfigs.ToMap's "config-<index>") and what
// to look up.
type amSource struct {
	key   string
	qtype dns.QType // "" for a fixed address
	addr  string    // host:port to look up or use; host alone for SRV
	shown string    // the URL for logs, without a password
}

// newAlertmanagerTargets prepares the lookups of cfg's URLs with resolver
// (nil: the system's, net.DefaultResolver). Nothing is looked up before
// refresh.
func newAlertmanagerTargets(cfg AlertmanagerConfig, resolver *net.Resolver, logger *slog.Logger, reg prometheus.Registerer) (*alertmanagerTargets, error) {
	if resolver == nil {
		resolver = net.DefaultResolver
	}
	d := &alertmanagerTargets{
		resolver: dns.NewResolver(&godns.Resolver{Resolver: resolver}, logging.GoKit(logger)),
		interval: time.Duration(cfg.RefreshInterval),
		logger:   logger,
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpustore_rules_alertmanager_lookup_failures_total",
			Help: "DNS lookups of Alertmanager URLs (dns+, dnssrv+) that failed; the URL keeps the Alertmanagers of its last successful lookup.",
		}),
	}
	for i, s := range cfg.URLs {
		qtype, u, err := parseAlertmanagerURL(s)
		if err != nil {
			return nil, err
		}
		shown := redact(u)
		if qtype != "" {
			shown = string(qtype) + "+" + shown
		}
		d.sources = append(d.sources, amSource{key: fmt.Sprintf("config-%d", i), qtype: qtype, addr: u.Host, shown: shown})
	}
	if err := reg.Register(d.failures); err != nil {
		return nil, err
	}
	return d, nil
}

// dynamic reports whether some URL is looked up in DNS.
func (d *alertmanagerTargets) dynamic() bool {
	return slices.ContainsFunc(d.sources, func(s amSource) bool { return s.qtype != "" })
}

// run refreshes every interval until ctx ends.
func (d *alertmanagerTargets) run(ctx context.Context) {
	if !d.dynamic() {
		return
	}
	t := time.NewTicker(d.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			d.refresh(ctx)
		}
	}
}

// refresh looks every URL up once and hands the result to the notifiers
// when it changed. A failed lookup keeps the URL's previous Alertmanagers:
// a DNS hiccup must not silence the alerts.
func (d *alertmanagerTargets) refresh(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, min(d.interval, 30*time.Second))
	defer cancel()
	d.mtx.Lock()
	prev := d.latest
	d.mtx.Unlock()
	next := make(map[string][]*targetgroup.Group, len(d.sources))
	for _, s := range d.sources {
		addrs := []string{s.addr}
		if s.qtype != "" {
			var err error
			addrs, err = d.resolver.Resolve(ctx, s.addr, s.qtype)
			if err != nil {
				d.failures.Inc()
				d.logger.Warn("Alertmanager lookup failed; keeping the ones found before", "url", s.shown, "err", err)
				next[s.key] = prev[s.key]
				continue
			}
			slices.Sort(addrs)
			addrs = slices.Compact(addrs)
		}
		tg := &targetgroup.Group{Source: s.key}
		for _, a := range addrs {
			tg.Targets = append(tg.Targets, model.LabelSet{model.AddressLabel: model.LabelValue(a)})
		}
		next[s.key] = []*targetgroup.Group{tg}
		if s.qtype != "" && !slices.Equal(addressesOf(prev[s.key]), addrs) {
			d.logger.Info("Alertmanagers found", "url", s.shown, "addresses", addrs)
		}
	}
	d.publish(prev, next)
}

func addressesOf(tgs []*targetgroup.Group) []string {
	var a []string
	for _, tg := range tgs {
		for _, t := range tg.Targets {
			a = append(a, string(t[model.AddressLabel]))
		}
	}
	return a
}

// publish makes next the latest targets and sends them to every
// subscriber, unless they equal prev.
func (d *alertmanagerTargets) publish(prev, next map[string][]*targetgroup.Group) {
	same := prev != nil && maps.EqualFunc(prev, next, func(a, b []*targetgroup.Group) bool {
		return slices.Equal(addressesOf(a), addressesOf(b))
	})
	d.mtx.Lock()
	defer d.mtx.Unlock()
	d.latest = next
	if same {
		return
	}
	for _, ch := range d.subs {
		offerLatest(ch, next)
	}
}

// subscribe returns a channel for a notifier's Run: it delivers the
// current targets (once known) and each change.
func (d *alertmanagerTargets) subscribe() <-chan map[string][]*targetgroup.Group {
	ch := make(chan map[string][]*targetgroup.Group, 1)
	d.mtx.Lock()
	defer d.mtx.Unlock()
	d.subs = append(d.subs, ch)
	if d.latest != nil {
		ch <- d.latest
	}
	return ch
}

// offerLatest replaces what ch holds with m: a notifier that has not taken
// the previous update yet gets only the newest. Only publish sends, under
// the mutex, so the send after the drain cannot block.
func offerLatest(ch chan map[string][]*targetgroup.Group, m map[string][]*targetgroup.Group) {
	select {
	case <-ch:
	default:
	}
	ch <- m
}
