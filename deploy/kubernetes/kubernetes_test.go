package kubernetes

import (
	"bytes"
	"flag"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/common/model"
	"github.com/prometheus/common/promslog"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/gpustore/gpustore/pkg/app"
	"github.com/gpustore/gpustore/pkg/limits"
)

// decoder decodes YAML strictly into the Kubernetes API types and the
// Prometheus Operator's: unknown fields, duplicate fields and wrong types
// are errors.
func decoder(t *testing.T) *kjson.Serializer {
	t.Helper()
	sch := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(sch); err != nil {
		t.Fatal(err)
	}
	if err := monitoringv1.AddToScheme(sch); err != nil {
		t.Fatal(err)
	}
	return kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, sch, sch, kjson.SerializerOptions{Yaml: true, Strict: true})
}

// objects is one rendered overlay, by kind.
type objects struct {
	all          []runtime.Object
	configMaps   map[string]*corev1.ConfigMap
	services     []*corev1.Service
	statefulSets []*appsv1.StatefulSet
	deployments  []*appsv1.Deployment
	pdbs         []*policyv1.PodDisruptionBudget
	podMonitors  []*monitoringv1.PodMonitor
	namespaces   []*corev1.Namespace
}

func render(t *testing.T, overlay string) *objects {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), overlay)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", overlay, err)
	}
	y, err := m.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	dec := decoder(t)
	o := &objects{configMaps: map[string]*corev1.ConfigMap{}}
	for _, doc := range bytes.Split(y, []byte("\n---\n")) {
		obj, gvk, err := dec.Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v\n%s", overlay, err, doc)
		}
		o.all = append(o.all, obj)
		switch v := obj.(type) {
		case *corev1.ConfigMap:
			o.configMaps[v.Name] = v
		case *corev1.Service:
			o.services = append(o.services, v)
		case *appsv1.StatefulSet:
			o.statefulSets = append(o.statefulSets, v)
		case *appsv1.Deployment:
			o.deployments = append(o.deployments, v)
		case *policyv1.PodDisruptionBudget:
			o.pdbs = append(o.pdbs, v)
		case *monitoringv1.PodMonitor:
			o.podMonitors = append(o.podMonitors, v)
		case *corev1.Namespace:
			o.namespaces = append(o.namespaces, v)
		default:
			t.Errorf("%s: unexpected %s", overlay, gvk)
		}
	}
	return o
}

// pods are the pod templates of the workloads.
func (o *objects) pods() map[string]*corev1.PodTemplateSpec {
	p := map[string]*corev1.PodTemplateSpec{}
	for _, s := range o.statefulSets {
		p["StatefulSet/"+s.Name] = &s.Spec.Template
	}
	for _, d := range o.deployments {
		p["Deployment/"+d.Name] = &d.Spec.Template
	}
	return p
}

func hasPort(pod *corev1.PodTemplateSpec, name string) (int32, bool) {
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == name {
				return p.ContainerPort, true
			}
		}
	}
	return 0, false
}

// The decoder is strict: an unknown field fails it.
func TestStrictDecoderRejectsUnknownFields(t *testing.T) {
	_, _, err := decoder(t).Decode([]byte("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replicaz: 1}\n"), nil, nil)
	if err == nil || !strings.Contains(err.Error(), "replicaz") {
		t.Fatalf("unknown field replicaz: err = %v", err)
	}
	_, _, err = decoder(t).Decode([]byte("apiVersion: monitoring.coreos.com/v1\nkind: PodMonitor\nmetadata: {name: x}\nspec: {podMetricsEndpoint: []}\n"), nil, nil)
	if err == nil {
		t.Fatal("unknown PodMonitor field accepted")
	}
}

func TestOverlays(t *testing.T) {
	for _, tc := range []struct {
		overlay string
		// targets of the gpustore containers, by workload.
		targets map[string]string
	}{
		{"overlays/single", map[string]string{"StatefulSet/gpustore": "all"}},
		{"overlays/scaled", map[string]string{"StatefulSet/gpustore": "ingest,query,rules", "Deployment/gpustore-compactor": "compact"}},
	} {
		t.Run(filepath.Base(tc.overlay), func(t *testing.T) {
			o := render(t, tc.overlay)
			pods := o.pods()
			if len(pods) != len(tc.targets) {
				t.Errorf("workloads %v, want %v", keys(pods), keys(tc.targets))
			}
			checkWorkloads(t, o)
			checkServices(t, o)
			checkPodMonitorsAndPDBs(t, o)
			for name, pod := range pods {
				want, ok := tc.targets[name]
				if !ok {
					t.Errorf("unexpected workload %s", name)
					continue
				}
				checkGpustorePod(t, o, name, pod, want)
			}
			for _, s := range o.statefulSets {
				if len(s.Spec.VolumeClaimTemplates) != 1 || s.Spec.VolumeClaimTemplates[0].Name != "data" {
					t.Errorf("StatefulSet %s: want one volume claim template \"data\"", s.Name)
				}
			}
		})
	}
}

func keys[V any](m map[string]V) []string {
	var k []string
	for n := range m {
		k = append(k, n)
	}
	slices.Sort(k)
	return k
}

func selects(sel map[string]string, pod *corev1.PodTemplateSpec) bool {
	return len(sel) > 0 && labels.SelectorFromSet(sel).Matches(labels.Set(pod.Labels))
}

func checkWorkloads(t *testing.T, o *objects) {
	t.Helper()
	headless := map[string]bool{}
	for _, s := range o.services {
		if s.Spec.ClusterIP == corev1.ClusterIPNone {
			headless[s.Name] = true
		}
	}
	for _, s := range o.statefulSets {
		if !selects(s.Spec.Selector.MatchLabels, &s.Spec.Template) {
			t.Errorf("StatefulSet %s: selector %v does not match its pods %v", s.Name, s.Spec.Selector.MatchLabels, s.Spec.Template.Labels)
		}
		if !headless[s.Spec.ServiceName] {
			t.Errorf("StatefulSet %s: serviceName %q is not a headless Service", s.Name, s.Spec.ServiceName)
		}
	}
	for _, d := range o.deployments {
		if !selects(d.Spec.Selector.MatchLabels, &d.Spec.Template) {
			t.Errorf("Deployment %s: selector does not match its pods", d.Name)
		}
	}
	// Two workloads must not select each other's pods.
	pods := o.pods()
	for n1 := range pods {
		for n2, p2 := range pods {
			if n1 != n2 && selects(workloadSelector(o, n1), p2) {
				t.Errorf("%s's selector also matches %s's pods", n1, n2)
			}
		}
	}
}

func workloadSelector(o *objects, name string) map[string]string {
	for _, s := range o.statefulSets {
		if "StatefulSet/"+s.Name == name {
			return s.Spec.Selector.MatchLabels
		}
	}
	for _, d := range o.deployments {
		if "Deployment/"+d.Name == name {
			return d.Spec.Selector.MatchLabels
		}
	}
	return nil
}

func checkServices(t *testing.T, o *objects) {
	t.Helper()
	for _, s := range o.services {
		matched := false
		for name, pod := range o.pods() {
			if !selects(s.Spec.Selector, pod) {
				continue
			}
			matched = true
			for _, p := range s.Spec.Ports {
				if cp, ok := hasPort(pod, p.TargetPort.StrVal); !ok || cp != p.Port {
					t.Errorf("Service %s port %d → %q: %s has it as %d (%v)", s.Name, p.Port, p.TargetPort.StrVal, name, cp, ok)
				}
			}
		}
		if !matched {
			t.Errorf("Service %s selects no pod (%v)", s.Name, s.Spec.Selector)
		}
	}
}

func checkPodMonitorsAndPDBs(t *testing.T, o *objects) {
	t.Helper()
	if len(o.podMonitors) != 1 || len(o.pdbs) != 1 {
		t.Fatalf("%d PodMonitors and %d PodDisruptionBudgets, want one each", len(o.podMonitors), len(o.pdbs))
	}
	pm := o.podMonitors[0]
	for name, pod := range o.pods() {
		if !selects(pm.Spec.Selector.MatchLabels, pod) {
			t.Errorf("PodMonitor %s does not scrape %s", pm.Name, name)
		}
		for _, ep := range pm.Spec.PodMetricsEndpoints {
			if ep.Port == nil {
				t.Errorf("PodMonitor %s: endpoint without port", pm.Name)
			} else if _, ok := hasPort(pod, *ep.Port); !ok {
				t.Errorf("PodMonitor %s: port %s not on %s", pm.Name, *ep.Port, name)
			}
		}
		if !selects(o.pdbs[0].Spec.Selector.MatchLabels, pod) {
			t.Errorf("PodDisruptionBudget %s does not cover %s", o.pdbs[0].Name, name)
		}
	}
	if pm.Spec.JobLabel != "app.kubernetes.io/name" {
		t.Errorf("PodMonitor jobLabel %q: the self-monitoring alerts expect job=gpustore", pm.Spec.JobLabel)
	}
}

// benchSeries is the active-series count of a 1024-GPU cluster in
// bench/RESULTS.md, and benchKiBPerSeries its peak RSS per active series.
const benchSeries, benchKiBPerSeries = 70000, 3.2

// checkGpustorePod loads the container's flags with gpustore's own loader,
// from the ConfigMaps and Secret the pod mounts (the Secret from
// base/objstore.example.yml), and checks ports, probes and resources.
func checkGpustorePod(t *testing.T, o *objects, name string, pod *corev1.PodTemplateSpec, target string) {
	t.Helper()
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%s: %d containers, want 1", name, len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	sc := pod.Spec.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.FSGroup == nil || *sc.FSGroup != 65532 {
		t.Errorf("%s: must run as non-root with fsGroup 65532 (the image's user)", name)
	}
	root := t.TempDir()
	mounts := map[string]string{} // mount path -> local dir
	for _, vm := range c.VolumeMounts {
		dir := filepath.Join(root, vm.Name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		mounts[vm.MountPath] = dir
		vol := volume(pod, vm.Name)
		switch {
		case vol == nil && !slices.ContainsFunc(o.statefulSets, func(s *appsv1.StatefulSet) bool { return "StatefulSet/"+s.Name == name }):
			t.Errorf("%s: mount %s has no volume", name, vm.Name)
		case vol != nil && vol.ConfigMap != nil:
			cm := o.configMaps[vol.ConfigMap.Name]
			if cm == nil {
				t.Errorf("%s: volume %s: ConfigMap %s does not exist", name, vm.Name, vol.ConfigMap.Name)
				continue
			}
			writeItems(t, name, dir, cm.Data, vol.ConfigMap.Items)
		case vol != nil && vol.Secret != nil:
			if vol.Secret.SecretName != "gpustore-bucket" {
				t.Errorf("%s: secret %s: only gpustore-bucket (objstore.yml) is documented", name, vol.Secret.SecretName)
			}
			example, err := os.ReadFile("base/objstore.example.yml")
			if err != nil {
				t.Fatal(err)
			}
			writeItems(t, name, dir, map[string]string{"objstore.yml": string(example)}, vol.Secret.Items)
		}
	}
	var args []string
	for _, a := range c.Args {
		for mp, dir := range mounts {
			if k, v, ok := strings.Cut(a, "="); ok && (v == mp || strings.HasPrefix(v, mp+"/")) {
				a = k + "=" + dir + strings.TrimPrefix(v, mp)
			}
		}
		args = append(args, a)
	}
	cfg, file, err := app.Load(flag.NewFlagSet("gpustore", flag.ContinueOnError), args)
	if err != nil {
		t.Fatalf("%s: gpustore rejects its flags %v: %v", name, c.Args, err)
	}
	if file == "" {
		t.Errorf("%s: no --config.file", name)
	}
	if cfg.Target != target {
		t.Errorf("%s: target %s, want %s", name, cfg.Target, target)
	}
	if cfg.Bucket.ConfigFile == "" {
		t.Errorf("%s: no bucket config file from the Secret", name)
	}
	if _, ok := mounts[cfg.TSDB.Dir]; !ok && !strings.HasPrefix(cfg.TSDB.Dir, root) {
		t.Errorf("%s: storage.tsdb.path %s is not on a volume", name, cfg.TSDB.Dir)
	}
	if strings.Contains(target, "rules") || target == "all" {
		dir, ok := mounts[cfg.Rules.Dir]
		if !ok {
			t.Errorf("%s: rules.dir %s is not mounted", name, cfg.Rules.Dir)
		}
		files, _ := filepath.Glob(filepath.Join(dir, "*.yml"))
		if len(files) == 0 {
			t.Errorf("%s: rules.dir %s has no rule file from the ConfigMap", name, cfg.Rules.Dir)
		}
		for _, f := range files {
			checkRuleFile(t, f)
		}
	}
	_, port, err := net.SplitHostPort(cfg.Server.ListenAddress)
	if err != nil {
		t.Fatal(err)
	}
	if cp, ok := hasPort(pod, "http"); !ok || itoa(cp) != port {
		t.Errorf("%s: container port http = %d, gpustore listens on %s", name, cp, port)
	}
	for probe, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		want := map[string]string{"liveness": "/-/healthy", "readiness": "/-/ready"}[probe]
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != want || p.HTTPGet.Port.StrVal != "http" {
			t.Errorf("%s: %s probe %+v, want GET %s on port http", name, probe, p, want)
		}
	}
	req := c.Resources.Requests
	if req.Cpu().IsZero() || req.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("%s: needs cpu and memory requests and a memory limit", name)
	}
	if target != "compact" {
		need := resource.NewQuantity(cfg.BucketStore.CacheSize+int64(benchSeries*benchKiBPerSeries*1024), resource.BinarySI)
		if req.Memory().Cmp(*need) < 0 {
			t.Errorf("%s: memory request %s < page cache + %d series × %.1f KiB = %s", name, req.Memory(), benchSeries, benchKiBPerSeries, need)
		}
	}
}

func itoa(n int32) string { return resource.NewQuantity(int64(n), resource.DecimalSI).String() }

func volume(pod *corev1.PodTemplateSpec, name string) *corev1.Volume {
	for i := range pod.Spec.Volumes {
		if pod.Spec.Volumes[i].Name == name {
			return &pod.Spec.Volumes[i]
		}
	}
	return nil
}

// writeItems writes what a ConfigMap or Secret volume would show, failing
// for an item whose key does not exist.
func writeItems(t *testing.T, who, dir string, data map[string]string, items []corev1.KeyToPath) {
	t.Helper()
	if len(items) == 0 {
		for k := range data {
			items = append(items, corev1.KeyToPath{Key: k, Path: k})
		}
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			t.Errorf("%s: key %s does not exist", who, it.Key)
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, it.Path), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func checkRuleFile(t *testing.T, f string) {
	t.Helper()
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	_, errs := rulefmt.Parse(b, false, model.UTF8Validation, parser.NewParser(parser.Options{}), promslog.NewNopLogger())
	for _, e := range errs {
		t.Errorf("rule file %s: %v", filepath.Base(f), e)
	}
}

// The Prometheus Operator snippet is one HA pair writing to the gpustore
// Service with gpustore's HA labels.
func TestPrometheusHAPair(t *testing.T) {
	b, err := os.ReadFile("prometheus/prometheus-ha-pair.yaml")
	if err != nil {
		t.Fatal(err)
	}
	obj, _, err := decoder(t).Decode(b, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	p, ok := obj.(*monitoringv1.Prometheus)
	if !ok {
		t.Fatalf("%T, want a Prometheus", obj)
	}
	def := limits.DefaultConfig().Defaults
	if p.Spec.Replicas == nil || *p.Spec.Replicas != 2 {
		t.Error("want 2 replicas (the HA pair)")
	}
	if p.Spec.ReplicaExternalLabelName == nil || *p.Spec.ReplicaExternalLabelName != def.HAReplicaLabel {
		t.Errorf("replicaExternalLabelName %v, want gpustore's HA replica label %s", p.Spec.ReplicaExternalLabelName, def.HAReplicaLabel)
	}
	if p.Spec.ExternalLabels[def.HAClusterLabel] == "" {
		t.Errorf("no %s external label", def.HAClusterLabel)
	}
	o := render(t, "overlays/single")
	ns := o.namespaces[0].Name
	var svc *corev1.Service
	for _, s := range o.services {
		if s.Spec.ClusterIP != corev1.ClusterIPNone {
			svc = s
		}
	}
	if len(p.Spec.RemoteWrite) != 1 {
		t.Fatalf("%d remoteWrite entries, want 1", len(p.Spec.RemoteWrite))
	}
	u, err := url.Parse(string(p.Spec.RemoteWrite[0].URL))
	if err != nil {
		t.Fatal(err)
	}
	if want := svc.Name + "." + ns + ".svc:" + itoa(svc.Spec.Ports[0].Port); u.Host != want || u.Path != "/api/v1/write" {
		t.Errorf("remote write %s, want http://%s/api/v1/write", u, want)
	}
}
