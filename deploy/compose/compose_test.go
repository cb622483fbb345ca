package compose

import (
	"context"
	"flag"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	amconfig "github.com/prometheus/alertmanager/config"
	"github.com/prometheus/common/model"
	"github.com/prometheus/common/promslog"
	promconfig "github.com/prometheus/prometheus/config"
	"github.com/prometheus/prometheus/discovery/http"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"gopkg.in/yaml.v3"

	"github.com/gpustore/gpustore/pkg/app"
)

func loadProject(t *testing.T, file string) (*types.Project, error) {
	t.Helper()
	opts, err := cli.NewProjectOptions([]string{file},
		cli.WithWorkingDirectory(filepath.Dir(file)),
		// Only the file's own values: no .env or shell variables.
		cli.WithEnv(nil),
		cli.WithDiscardEnvFile,
	)
	if err != nil {
		return nil, err
	}
	return opts.LoadProject(context.Background())
}

func project(t *testing.T) *types.Project {
	t.Helper()
	p, err := loadProject(t, "compose.yaml")
	if err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	return p
}

// The loader is the real validator: a misspelt key fails it.
func TestComposeLoaderRejectsUnknownKeys(t *testing.T) {
	f := filepath.Join(t.TempDir(), "compose.yaml")
	if err := os.WriteFile(f, []byte("services:\n  a:\n    image: busybox:1.37\n    volumez: [./x:/x]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := loadProject(t, f); err == nil || !strings.Contains(err.Error(), "volumez") {
		t.Fatalf("unknown key volumez: err = %v, want a schema error naming it", err)
	}
}

// mounts maps each container path a service bind-mounts to the host path.
func mounts(t *testing.T, s types.ServiceConfig) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, v := range s.Volumes {
		if v.Type != types.VolumeTypeBind {
			continue
		}
		if _, err := os.Stat(v.Source); err != nil {
			t.Errorf("service %s mounts %s: %v", s.Name, v.Source, err)
		}
		if !v.ReadOnly {
			t.Errorf("service %s mounts config %s writable; mount it :ro", s.Name, v.Source)
		}
		m[v.Target] = v.Source
	}
	return m
}

func flagValue(cmd []string, name string) (string, bool) {
	for _, a := range cmd {
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// hostPort splits an address into its compose service name and port.
func hostPort(t *testing.T, addr string) (string, string) {
	t.Helper()
	if u, err := url.Parse(addr); err == nil && u.Host != "" {
		addr = u.Host
	}
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("address %q: %v", addr, err)
	}
	return h, p
}

// stack is what the checks learn about the services from their configs.
type stack struct {
	p     *types.Project
	ports map[string]string // service -> port its program listens on
}

// service returns the named service and fails the test if it is missing.
func (s *stack) service(t *testing.T, name string) types.ServiceConfig {
	t.Helper()
	svc, ok := s.p.Services[name]
	if !ok {
		t.Fatalf("compose.yaml has no service %s", name)
	}
	return svc
}

// points checks that addr names a service of the stack and the port its
// program listens on.
func (s *stack) points(t *testing.T, what, addr string) {
	t.Helper()
	host, port := hostPort(t, addr)
	want, ok := s.ports[host]
	if !ok {
		t.Errorf("%s: %s is not a service of the stack", what, addr)
	} else if port != want {
		t.Errorf("%s: %s, but service %s listens on %s", what, addr, host, want)
	}
}

func newStack(t *testing.T) *stack {
	p := project(t)
	s := &stack{p: p, ports: map[string]string{
		"minio": "9000", "alertmanager": "9093", "grafana": "3000",
		"prometheus-0": "9090", "prometheus-1": "9090",
	}}
	for _, name := range []string{"minio", "minio-init", "gpustore", "gpusim", "prometheus-0", "prometheus-1", "alertmanager", "grafana"} {
		s.service(t, name)
	}
	// gpusim's and gpustore's ports come from their command and config.
	if v, ok := flagValue(s.service(t, "gpusim").Command, "--web.listen-address"); ok {
		_, s.ports["gpusim"] = hostPort(t, v)
	} else {
		t.Error("gpusim: no --web.listen-address")
	}
	gs := gpustoreConfig(t, s)
	_, s.ports["gpustore"] = hostPort(t, gs.Server.ListenAddress)
	return s
}

func gpustoreConfig(t *testing.T, s *stack) app.Config {
	t.Helper()
	svc := s.service(t, "gpustore")
	file, ok := flagValue(svc.Command, "--config.file")
	if !ok {
		t.Fatal("gpustore: no --config.file in its command")
	}
	host := mounts(t, svc)[file]
	if host == "" {
		t.Fatalf("gpustore: --config.file=%s is not mounted", file)
	}
	args := slices.Clone([]string(svc.Command))
	args[slices.Index(args, "--config.file="+file)] = "--config.file=" + host
	cfg, _, err := app.Load(flag.NewFlagSet("gpustore", flag.ContinueOnError), args)
	if err != nil {
		t.Fatalf("gpustore config %s: %v", host, err)
	}
	return cfg
}

// Every image is pinned to a version, and built images use this
// repository's Dockerfiles.
func TestImagesPinned(t *testing.T) {
	for name, svc := range project(t).Services {
		if svc.Build != nil {
			if _, err := os.Stat(filepath.Join(svc.Build.Context, svc.Build.Dockerfile)); err != nil {
				t.Errorf("%s: Dockerfile: %v", name, err)
			}
			continue
		}
		_, tag, ok := strings.Cut(svc.Image[strings.LastIndex(svc.Image, "/")+1:], ":")
		if !ok || tag == "" || tag == "latest" {
			t.Errorf("%s: image %q is not pinned to a version", name, svc.Image)
		}
	}
}

// gpustore's config loads with gpustore's own loader, ships to the MinIO
// bucket that minio-init creates with MinIO's credentials, and sends alerts
// to the stack's Alertmanager; its port is published as itself.
func TestGpustoreConfig(t *testing.T) {
	s := newStack(t)
	cfg := gpustoreConfig(t, s)
	r, err := cfg.Bucket.Resolved()
	if err != nil {
		t.Fatal(err)
	}
	if r.Type != "S3" {
		t.Fatalf("bucket type %s, want S3 (MinIO)", r.Type)
	}
	s.points(t, "gpustore bucket endpoint", "http://"+r.Config["endpoint"].(string))
	minio := s.service(t, "minio").Environment
	if r.Config["access_key"] != *minio["MINIO_ROOT_USER"] || r.Config["secret_key"] != *minio["MINIO_ROOT_PASSWORD"] {
		t.Errorf("gpustore's S3 credentials are not MinIO's root user of compose.yaml")
	}
	initCmd := strings.Join(s.service(t, "minio-init").Entrypoint, " ")
	if !strings.Contains(initCmd, "mc mb --ignore-existing local/"+r.Config["bucket"].(string)) {
		t.Errorf("minio-init does not create bucket %v: %s", r.Config["bucket"], initCmd)
	}
	if !strings.Contains(initCmd, "http://minio:9000 "+*minio["MINIO_ROOT_USER"]+" "+*minio["MINIO_ROOT_PASSWORD"]) {
		t.Errorf("minio-init does not log in to minio:9000 with MinIO's root user: %s", initCmd)
	}
	if len(cfg.Rules.Alertmanager.URLs) == 0 {
		t.Error("gpustore sends its GPU alerts nowhere: rules.alertmanager.urls is empty")
	}
	for _, u := range cfg.Rules.Alertmanager.URLs {
		s.points(t, "gpustore alertmanager url", u)
	}
	if !strings.HasPrefix(cfg.TSDB.Dir, "/data") || !slices.ContainsFunc(s.service(t, "gpustore").Volumes, func(v types.ServiceVolumeConfig) bool {
		return v.Type == types.VolumeTypeVolume && v.Target == cfg.TSDB.Dir
	}) {
		t.Errorf("gpustore's tsdb.dir %s is not on a named volume", cfg.TSDB.Dir)
	}
	published := false
	for _, p := range s.service(t, "gpustore").Ports {
		published = published || (p.Published == s.ports["gpustore"] && p.Target == uint32(atoi(t, s.ports["gpustore"])))
	}
	if !published {
		t.Errorf("gpustore's port %s is not published as itself", s.ports["gpustore"])
	}
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n := 0
	for _, c := range s {
		if c < '0' || c > '9' {
			t.Fatalf("port %q", s)
		}
		n = n*10 + int(c-'0')
	}
	return n
}

// Both Prometheus replicas load the shared prometheus.yml with Prometheus'
// own loader, are one HA pair (same cluster, their own __replica__), scrape
// the simulator and gpustore, remote-write to gpustore, load the
// self-monitoring rules and alert to the stack's Alertmanager.
func TestPrometheusPair(t *testing.T) {
	s := newStack(t)
	replicas := map[string]bool{}
	var cluster string
	for _, name := range []string{"prometheus-0", "prometheus-1"} {
		svc := s.service(t, name)
		mnt := mounts(t, svc)
		file, ok := flagValue(svc.Command, "--config.file")
		if !ok || mnt[file] == "" {
			t.Fatalf("%s: --config.file %q not mounted", name, file)
		}
		for k, v := range svc.Environment {
			t.Setenv(k, *v)
		}
		cfg, err := promconfig.LoadFile(mnt[file], false, promslog.NewNopLogger())
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		ext := cfg.GlobalConfig.ExternalLabels
		if ext.Get("__replica__") == "" || replicas[ext.Get("__replica__")] {
			t.Errorf("%s: __replica__ %q is empty or shared", name, ext.Get("__replica__"))
		}
		replicas[ext.Get("__replica__")] = true
		if cluster != "" && ext.Get("cluster") != cluster || ext.Get("cluster") == "" {
			t.Errorf("%s: cluster %q, want one shared non-empty cluster label", name, ext.Get("cluster"))
		}
		cluster = ext.Get("cluster")

		if len(cfg.RemoteWriteConfigs) != 1 {
			t.Fatalf("%s: %d remote_write entries, want 1 (gpustore)", name, len(cfg.RemoteWriteConfigs))
		}
		rw := cfg.RemoteWriteConfigs[0].URL.URL
		s.points(t, name+" remote_write", rw.String())
		if rw.Path != "/api/v1/write" {
			t.Errorf("%s: remote_write path %s", name, rw.Path)
		}

		jobs := map[string]bool{}
		scrapes, err := cfg.GetScrapeConfigs()
		if err != nil {
			t.Fatal(err)
		}
		for _, sc := range scrapes {
			jobs[sc.JobName] = true
			for _, d := range sc.ServiceDiscoveryConfigs {
				switch d := d.(type) {
				case *http.SDConfig:
					s.points(t, name+" "+sc.JobName+" http_sd", d.URL)
				default:
					for _, tg := range staticTargets(t, d) {
						s.points(t, name+" "+sc.JobName+" target", tg)
					}
				}
			}
		}
		for _, j := range []string{"gpu-node", "gpustore"} {
			if !jobs[j] {
				t.Errorf("%s: no scrape job %s", name, j)
			}
		}

		for _, rf := range cfg.RuleFiles {
			if _, err := os.Stat(mnt[rf]); mnt[rf] == "" || err != nil {
				t.Errorf("%s: rule file %s is not mounted (%v)", name, rf, err)
			}
		}
		if !slices.Contains(cfg.RuleFiles, "/etc/prometheus/rules/gpustore-alerts.yml") {
			t.Errorf("%s: the self-monitoring rules are not loaded", name)
		}
		for _, am := range cfg.AlertingConfig.AlertmanagerConfigs {
			for _, d := range am.ServiceDiscoveryConfigs {
				for _, tg := range staticTargets(t, d) {
					s.points(t, name+" alertmanager", tg)
				}
			}
		}
	}
}

func staticTargets(t *testing.T, d any) []string {
	t.Helper()
	sc, ok := d.(interface{ Name() string })
	if !ok || sc.Name() != "static" {
		t.Fatalf("service discovery %T: the stack uses static and http_sd only", d)
	}
	var out []string
	b, err := yaml.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`(?m)^\s*-\s*([a-z0-9.-]+:\d+)\s*$`).FindAllStringSubmatch(string(b), -1) {
		out = append(out, m[1])
	}
	if len(out) == 0 {
		t.Fatalf("static targets of %T: none found in %s", d, b)
	}
	return out
}

// Alertmanager's config loads with Alertmanager's own loader.
func TestAlertmanagerConfig(t *testing.T) {
	s := newStack(t)
	svc := s.service(t, "alertmanager")
	file, ok := flagValue(svc.Command, "--config.file")
	host := mounts(t, svc)[file]
	if !ok || host == "" {
		t.Fatalf("alertmanager: --config.file %q not mounted", file)
	}
	cfg, err := amconfig.LoadFile(host)
	if err != nil {
		t.Fatalf("alertmanager config: %v", err)
	}
	if cfg.Route == nil || cfg.Route.Receiver == "" {
		t.Error("alertmanager config has no default route")
	}
}

// grafanaDatasources is the part of Grafana's provisioning format the stack
// uses (https://grafana.com/docs/grafana/latest/administration/provisioning/).
// Grafana's own loader is not importable here (not a Go library), so unknown
// fields fail the strict decode instead.
type grafanaDatasources struct {
	APIVersion  int `yaml:"apiVersion"`
	Datasources []struct {
		Name      string         `yaml:"name"`
		UID       string         `yaml:"uid"`
		Type      string         `yaml:"type"`
		Access    string         `yaml:"access"`
		URL       string         `yaml:"url"`
		IsDefault bool           `yaml:"isDefault"`
		Editable  bool           `yaml:"editable"`
		JSONData  map[string]any `yaml:"jsonData"`
	} `yaml:"datasources"`
}

type grafanaDashboards struct {
	APIVersion int `yaml:"apiVersion"`
	Providers  []struct {
		Name                  string `yaml:"name"`
		Folder                string `yaml:"folder"`
		Type                  string `yaml:"type"`
		DisableDeletion       bool   `yaml:"disableDeletion"`
		AllowUIUpdates        bool   `yaml:"allowUiUpdates"`
		UpdateIntervalSeconds int    `yaml:"updateIntervalSeconds"`
		Options               struct {
			Path                      string `yaml:"path"`
			FoldersFromFilesStructure bool   `yaml:"foldersFromFilesStructure"`
		} `yaml:"options"`
	} `yaml:"providers"`
}

func decodeStrict(t *testing.T, file string, v any) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
}

// Grafana gets gpustore as its default Prometheus data source and the
// generated dashboards from the mounted folder.
func TestGrafanaProvisioning(t *testing.T) {
	s := newStack(t)
	mnt := mounts(t, s.service(t, "grafana"))
	prov := mnt["/etc/grafana/provisioning"]
	if prov == "" {
		t.Fatal("grafana: /etc/grafana/provisioning is not mounted")
	}
	var ds grafanaDatasources
	decodeStrict(t, filepath.Join(prov, "datasources", "gpustore.yml"), &ds)
	if ds.APIVersion != 1 || len(ds.Datasources) != 1 {
		t.Fatalf("datasources: apiVersion %d, %d sources; want 1 and 1", ds.APIVersion, len(ds.Datasources))
	}
	d := ds.Datasources[0]
	if d.Type != "prometheus" || !d.IsDefault || d.UID != "gpustore" {
		t.Errorf("data source %+v: want the default prometheus source, uid gpustore", d)
	}
	s.points(t, "grafana data source", d.URL)

	var db grafanaDashboards
	decodeStrict(t, filepath.Join(prov, "dashboards", "gpustore.yml"), &db)
	if db.APIVersion != 1 || len(db.Providers) != 1 || db.Providers[0].Type != "file" {
		t.Fatalf("dashboard providers: %+v, want one file provider", db)
	}
	dir := mnt[db.Providers[0].Options.Path]
	if dir == "" {
		t.Fatalf("dashboard path %s is not mounted", db.Providers[0].Options.Path)
	}
	jsons, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	if len(jsons) == 0 {
		t.Errorf("no dashboards in %s", dir)
	}
	home := *s.service(t, "grafana").Environment["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
	if rel, ok := strings.CutPrefix(home, db.Providers[0].Options.Path+"/"); !ok {
		t.Errorf("home dashboard %s is not in the provisioned folder", home)
	} else if _, err := os.Stat(filepath.Join(dir, rel)); err != nil {
		t.Errorf("home dashboard: %v", err)
	}
}

// Every published port is bound to loopback by default: MinIO's root
// credentials and Grafana's admin/admin are for this machine only.
// BIND_ADDRESS (e.g. 0.0.0.0) publishes them elsewhere on purpose.
func TestPortsOnLoopback(t *testing.T) {
	p := project(t)
	n := 0
	for name, svc := range p.Services {
		for _, port := range svc.Ports {
			n++
			if port.HostIP != "127.0.0.1" {
				t.Errorf("%s publishes %s:%s->%d on %q, want 127.0.0.1", name, port.HostIP, port.Published, port.Target, port.HostIP)
			}
		}
	}
	if n == 0 {
		t.Fatal("no published port")
	}
}

// NodeUnreachable (deploy/rules/node-alerts.yml, in gpustore's GPU rule
// pack) reads `up` of the node-exporter job: the pair scrapes every
// simulated node's page under that job, so a node that stops answering
// fires it. (TestDevStack checks that gpustore receives that `up` for every
// node.)
func TestNodeUnreachableJobScraped(t *testing.T) {
	job := nodeUnreachableJob(t)
	s := newStack(t)
	svc := s.service(t, "prometheus-0")
	for k, v := range svc.Environment {
		t.Setenv(k, *v)
	}
	cfg, err := promconfig.LoadFile(mounts(t, svc)["/etc/prometheus/prometheus.yml"], false, promslog.NewNopLogger())
	if err != nil {
		t.Fatal(err)
	}
	scrapes, err := cfg.GetScrapeConfigs()
	if err != nil {
		t.Fatal(err)
	}
	for _, sc := range scrapes {
		if sc.JobName != job {
			continue
		}
		for _, d := range sc.ServiceDiscoveryConfigs {
			if h, ok := d.(*http.SDConfig); !ok || !strings.HasPrefix(h.URL, "http://gpusim:") || !strings.HasSuffix(h.URL, "/sd") {
				t.Errorf("job %s: discovery %T %v, want gpusim's node pages (http_sd at gpusim /sd)", job, d, d)
			}
		}
		return
	}
	t.Errorf("no scrape job %q: NodeUnreachable (up{job=%q} == 0) can never fire", job, job)
}

// nodeUnreachableJob is the job NodeUnreachable's `up` selector names.
func nodeUnreachableJob(t *testing.T) string {
	t.Helper()
	rgs, errs := rulefmt.ParseFile("../rules/node-alerts.yml", false, model.UTF8Validation, parser.NewParser(parser.Options{}), promslog.NewNopLogger())
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	for _, g := range rgs.Groups {
		for _, r := range g.Rules {
			// NodeUnreachable reads node-exporter's `up` through this record.
			if r.Record != "node:node_exporter_down:up" {
				continue
			}
			expr, err := parser.NewParser(parser.Options{}).ParseExpr(r.Expr)
			if err != nil {
				t.Fatal(err)
			}
			for _, vs := range parser.ExtractSelectors(expr) {
				for _, m := range vs {
					if m.Name == "job" && m.Type == labels.MatchEqual {
						return m.Value
					}
				}
			}
			t.Fatalf("node:node_exporter_down:up %q names no job", r.Expr)
		}
	}
	t.Fatal("no node:node_exporter_down:up (NodeUnreachable's input) in ../rules/node-alerts.yml")
	return ""
}
