package kubernetes

import (
	"bytes"
	"flag"
	"fmt"
	"math"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/common/model"
	"github.com/prometheus/common/promslog"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/kustomize/api/krusty"
	kustypes "sigs.k8s.io/kustomize/api/types"
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
	promRules    []*monitoringv1.PrometheusRule
	namespaces   []*corev1.Namespace
	secrets      map[string]*corev1.Secret // the Helm chart's bucket Secret, when it renders one
}

func render(t *testing.T, overlay string) *objects {
	t.Helper()
	return renderDir(t, overlay, krusty.MakeDefaultOptions())
}

// renderWith renders overlay under a kustomization of the user's: one that
// lists the overlay under resources, plus more, the rest of its YAML
// (components, images, ...) with paths relative to this folder.
func renderWith(t *testing.T, overlay, more string) *objects {
	t.Helper()
	dir := t.TempDir()
	// Paths relative to dir: kustomize refuses absolute ones.
	up, err := filepath.Abs(".")
	if err == nil {
		up, err = filepath.Rel(dir, up)
	}
	if err != nil {
		t.Fatal(err)
	}
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [" + filepath.Join(up, overlay) + "]\n" +
		strings.ReplaceAll(more, "$HERE", up)
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	opts := krusty.MakeDefaultOptions()
	opts.LoadRestrictions = kustypes.LoadRestrictionsNone // the overlay is outside dir
	return renderDir(t, dir, opts)
}

func renderDir(t *testing.T, overlay string, opts *krusty.Options) *objects {
	t.Helper()
	k := krusty.MakeKustomizer(opts)
	m, err := k.Run(filesys.MakeFsOnDisk(), overlay)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", overlay, err)
	}
	y, err := m.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	return decodeObjects(t, overlay, bytes.Split(y, []byte("\n---\n")))
}

// decodeObjects decodes rendered manifests (one object per document)
// strictly, by kind; what names where they came from.
func decodeObjects(t *testing.T, what string, docs [][]byte) *objects {
	t.Helper()
	dec := decoder(t)
	o := &objects{configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{}}
	for _, doc := range docs {
		obj, gvk, err := dec.Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v\n%s", what, err, doc)
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
		case *monitoringv1.PrometheusRule:
			o.promRules = append(o.promRules, v)
		case *corev1.Namespace:
			o.namespaces = append(o.namespaces, v)
		case *corev1.Secret:
			o.secrets[v.Name] = v
		default:
			t.Errorf("%s: unexpected %s", what, gvk)
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

// ringJoin is the scaled overlay's memberlist seed: the gossip Service's
// DNS name in dskit's DNS-provider syntax.
const ringJoin = "dns+gpustore-gossip.gpustore.svc.cluster.local:7946"

type overlayCase struct {
	overlay string
	// targets of the gpustore containers, by workload.
	targets map[string]string
	// services maps each client-facing (not headless) Service to the one
	// workload it must select.
	services map[string]string
	// ringMembers are the workloads that must run with --ring.enabled.
	ringMembers []string
	// rulers are the workloads that must run the rules role; no other may
	// (in the ring every process running rules joins the rulers' ring and
	// takes a share of the rule groups).
	rulers []string
}

var overlayCases = []overlayCase{
	{
		overlay:  "overlays/single",
		targets:  map[string]string{"StatefulSet/gpustore": "all"},
		services: map[string]string{"gpustore": "StatefulSet/gpustore"},
		rulers:   []string{"StatefulSet/gpustore"},
	},
	{
		overlay: "overlays/scaled",
		targets: map[string]string{
			"StatefulSet/gpustore-receiver":   "ingest",
			"Deployment/gpustore-distributor": "distributor",
			"Deployment/gpustore-querier":     "query",
			"Deployment/gpustore-ruler":       "rules",
			"Deployment/gpustore-compactor":   "compact",
		},
		services: map[string]string{
			"gpustore-distributor": "Deployment/gpustore-distributor",
			"gpustore-querier":     "Deployment/gpustore-querier",
		},
		ringMembers: []string{"StatefulSet/gpustore-receiver", "Deployment/gpustore-distributor", "Deployment/gpustore-querier", "Deployment/gpustore-ruler"},
		// The rulers of their own; the receivers run no rules.
		rulers: []string{"Deployment/gpustore-ruler"},
	},
}

func TestOverlays(t *testing.T) {
	for _, tc := range overlayCases {
		t.Run(filepath.Base(tc.overlay), func(t *testing.T) {
			o := render(t, tc.overlay)
			pods := o.pods()
			if len(pods) != len(tc.targets) {
				t.Errorf("workloads %v, want %v", keys(pods), keys(tc.targets))
			}
			checkWorkloads(t, o)
			checkServices(t, o, tc.services)
			checkPDBs(t, o)
			cfgs := map[string]app.Config{}
			for name, pod := range pods {
				want, ok := tc.targets[name]
				if !ok {
					t.Errorf("unexpected workload %s", name)
					continue
				}
				cfgs[name] = checkGpustorePod(t, o, name, pod, want)
			}
			for _, s := range o.statefulSets {
				if len(s.Spec.VolumeClaimTemplates) != 1 || s.Spec.VolumeClaimTemplates[0].Name != "data" {
					t.Errorf("StatefulSet %s: want one volume claim template \"data\"", s.Name)
				}
			}
			checkRulers(t, cfgs, tc.rulers)
			checkRing(t, o, cfgs, tc.ringMembers)
		})
	}
}

// Every namespaced object of an overlay lands in the overlay's namespace:
// an object without one would go to the kubeconfig's namespace, where it
// could not mount the config and bucket Secret, and the gossip seed
// (<service>.<namespace>.svc) would not resolve.
func TestEveryObjectInTheNamespace(t *testing.T) {
	for _, tc := range overlayCases {
		t.Run(filepath.Base(tc.overlay), func(t *testing.T) {
			checkNamespaces(t, render(t, tc.overlay))
		})
	}
}

// checkNamespaces checks that there is one Namespace and that every other
// object (none of the kinds rendered is cluster-scoped) is in it.
func checkNamespaces(t *testing.T, o *objects) {
	t.Helper()
	if len(o.namespaces) != 1 {
		t.Fatalf("%d Namespace objects, want 1", len(o.namespaces))
	}
	ns := o.namespaces[0].Name
	if l := o.namespaces[0].Labels["pod-security.kubernetes.io/enforce"]; l != "restricted" {
		t.Errorf("Namespace %s: pod-security.kubernetes.io/enforce %q, want restricted (TestPodsRestricted checks the pods pass it)", ns, l)
	}
	for _, obj := range o.all {
		m, err := meta.Accessor(obj)
		if err != nil {
			t.Fatal(err)
		}
		kind := obj.GetObjectKind().GroupVersionKind().Kind
		if kind == "Namespace" {
			continue
		}
		if m.GetNamespace() != ns {
			t.Errorf("%s %s: namespace %q, want %q", kind, m.GetName(), m.GetNamespace(), ns)
		}
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

// checkServices checks that every Service selects pods that have its
// target ports (by name and protocol), and that each client-facing Service
// selects exactly the one workload it is for.
func checkServices(t *testing.T, o *objects, want map[string]string) {
	t.Helper()
	clientFacing := map[string]bool{}
	for _, s := range o.services {
		var matched []string
		for name, pod := range o.pods() {
			if !selects(s.Spec.Selector, pod) {
				continue
			}
			matched = append(matched, name)
			for _, p := range s.Spec.Ports {
				if cp, ok := hasPortProto(pod, p.TargetPort.StrVal, p.Protocol); !ok || cp != p.Port {
					t.Errorf("Service %s port %d/%s → %q: %s has it as %d (%v)", s.Name, p.Port, proto(p.Protocol), p.TargetPort.StrVal, name, cp, ok)
				}
			}
		}
		if len(matched) == 0 {
			t.Errorf("Service %s selects no pod (%v)", s.Name, s.Spec.Selector)
		}
		if s.Spec.ClusterIP == corev1.ClusterIPNone {
			continue
		}
		clientFacing[s.Name] = true
		slices.Sort(matched)
		if w, ok := want[s.Name]; !ok {
			t.Errorf("unexpected Service %s (selects %v)", s.Name, matched)
		} else if !slices.Equal(matched, []string{w}) {
			t.Errorf("Service %s selects %v, want only %s", s.Name, matched, w)
		}
	}
	for name := range want {
		if !clientFacing[name] {
			t.Errorf("no Service %s", name)
		}
	}
}

func proto(p corev1.Protocol) corev1.Protocol {
	if p == "" {
		return corev1.ProtocolTCP
	}
	return p
}

// hasPortProto is hasPort for a Service port: Kubernetes resolves a named
// target port by name and protocol.
func hasPortProto(pod *corev1.PodTemplateSpec, name string, protocol corev1.Protocol) (int32, bool) {
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == name && proto(p.Protocol) == proto(protocol) {
				return p.ContainerPort, true
			}
		}
	}
	return 0, false
}

// checkPDBs checks that the disruption budgets cover every workload of more
// than one replica (and every StatefulSet) with maxUnavailable 1, each pod
// by at most one budget (the eviction API refuses a pod under two).
func checkPDBs(t *testing.T, o *objects) {
	t.Helper()
	if len(o.pdbs) == 0 {
		t.Fatal("no PodDisruptionBudget")
	}
	for name, pod := range o.pods() {
		var budgets []*policyv1.PodDisruptionBudget
		for _, pdb := range o.pdbs {
			if selects(pdb.Spec.Selector.MatchLabels, pod) {
				budgets = append(budgets, pdb)
			}
		}
		switch {
		case len(budgets) > 1:
			t.Errorf("%s is under %d PodDisruptionBudgets: evictions would fail", name, len(budgets))
		case len(budgets) == 0 && (strings.HasPrefix(name, "StatefulSet/") || replicas(o, name) > 1):
			t.Errorf("no PodDisruptionBudget covers %s", name)
		case len(budgets) == 1:
			if mu := budgets[0].Spec.MaxUnavailable; mu == nil || mu.IntValue() != 1 {
				t.Errorf("PodDisruptionBudget %s: maxUnavailable %v, want 1", budgets[0].Name, mu)
			}
		}
	}
	for _, pdb := range o.pdbs {
		if !slices.ContainsFunc(keys(o.pods()), func(n string) bool { return selects(pdb.Spec.Selector.MatchLabels, o.pods()[n]) }) {
			t.Errorf("PodDisruptionBudget %s selects no pod", pdb.Name)
		}
	}
}

// checkPodMonitor checks that the one PodMonitor scrapes every gpustore pod
// on a port the pod has, as job "gpustore".
func checkPodMonitor(t *testing.T, o *objects) {
	t.Helper()
	if len(o.podMonitors) != 1 {
		t.Fatalf("%d PodMonitors, want one", len(o.podMonitors))
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
	}
	if pm.Spec.JobLabel != "app.kubernetes.io/name" || pm.Spec.Selector.MatchLabels["app.kubernetes.io/name"] != "gpustore" {
		t.Errorf("PodMonitor jobLabel %q: the self-monitoring alerts expect job=gpustore (the pods' app.kubernetes.io/name)", pm.Spec.JobLabel)
	}
}

func replicas(o *objects, name string) int32 {
	var r *int32
	for _, s := range o.statefulSets {
		if "StatefulSet/"+s.Name == name {
			r = s.Spec.Replicas
		}
	}
	for _, d := range o.deployments {
		if "Deployment/"+d.Name == name {
			r = d.Spec.Replicas
		}
	}
	if r == nil {
		return 1
	}
	return *r
}

// sizing is README.md's "Sizing", measured by sizing.sh (16 HGX-shaped
// nodes, 128 GPUs: 5 h backfilled, 300 s in real time, dashboard queries)
// and scaled linearly to the GPUs the overlays are sized for.
var sizing = struct {
	gpus         float64 // the overlays' cluster
	seriesPerGPU float64 // head series per GPU (DCGM, node-exporter at 224 CPUs, cAdvisor, kube-state-metrics, training)
	idleMiB      float64 // RSS of a gpustore that holds no series
	// RSS per head series above idle: in real time (the request) and at
	// the peak, writing as fast as accepted with the head's block cut and
	// compaction (the limit: a receiver catching up after an outage).
	steadyKiB, peakKiB float64
	bytesPerSample     float64 // a 2 h block in the bucket (chunks + index)
	walBytesPerSeries  float64 // the WAL of a full head
	coresPerGPU        float64 // -target=all in real time: ingest of the HA pair, rules, shipping
	// A distributor keeps each series' labels once (bench/RESULTS.md's
	// heap per series).
	distributorKiB float64
	// The largest compaction's range: 14 d from seven 2 d blocks, which
	// the compactor downloads and writes beside them (2× its sources).
	compactionDays float64
}{
	gpus: 1024, seriesPerGPU: 342.4, idleMiB: 66, steadyKiB: 7.06, peakKiB: 12.10,
	bytesPerSample: 4.42, walBytesPerSeries: 7895, coresPerGPU: 0.023 / 128, distributorKiB: 1.2,
	compactionDays: 14,
}

func sizingSeries() float64 { return sizing.gpus * sizing.seriesPerGPU }

// rawBytesPerDay is one copy of a day of raw blocks at 15 s.
func rawBytesPerDay() float64 { return sizingSeries() * 86400 / 15 * sizing.bytesPerSample }

// podEnvSamples are the values the downward API would give the fields the
// manifests use, for expanding $(VAR) references in args as the kubelet does.
var podEnvSamples = map[string]string{
	"metadata.name": "gpustore-receiver-1",
	"status.podIP":  "10.12.3.4",
	// Copied from the node at binding (components/zones).
	"metadata.labels['topology.kubernetes.io/zone']": "eu-west-1b",
}

// expandArgs expands $(VAR) references to the container's env as the
// kubelet does; a reference to a variable the container does not define,
// or to a field without a sample value, is an error.
func expandArgs(t *testing.T, name string, c corev1.Container) []string {
	t.Helper()
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
			v, ok := podEnvSamples[e.ValueFrom.FieldRef.FieldPath]
			if !ok {
				t.Errorf("%s: env %s: no sample value for field %s", name, e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
			env[e.Name] = v
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		}
	}
	var out []string
	for _, a := range c.Args {
		var b strings.Builder
		for {
			i := strings.Index(a, "$(")
			if i < 0 {
				break
			}
			j := strings.Index(a[i:], ")")
			if j < 0 {
				break
			}
			v, ok := env[a[i+2:i+j]]
			if !ok {
				t.Errorf("%s: arg %q refers to $(%s), which the container's env does not define", name, a, a[i+2:i+j])
			}
			b.WriteString(a[:i] + v)
			a = a[i+j+1:]
		}
		out = append(out, b.String()+a)
	}
	return out
}

// checkGpustorePod loads the container's flags with gpustore's own loader
// (which validates the result), from the ConfigMaps and Secret the pod
// mounts (the Secret from base/objstore.example.yml) and with $(VAR)
// references expanded, and checks ports, probes and resources.
func checkGpustorePod(t *testing.T, o *objects, name string, pod *corev1.PodTemplateSpec, target string) app.Config {
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
	for _, a := range expandArgs(t, name, c) {
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
	roles := strings.Split(cfg.Target, ",")
	runs := func(role string) bool { return slices.Contains(roles, role) || slices.Contains(roles, app.All) }
	// What the process keeps on disk: the TSDBs (ingest), the active-query
	// log (query, and rules, which runs it), the compactor's scratch space.
	// A distributor alone keeps nothing and needs neither a volume nor the
	// bucket.
	disk := runs(app.Ingest) || runs(app.Query) || runs(app.Rules) || runs(app.Compact)
	if disk && cfg.Bucket.ConfigFile == "" {
		t.Errorf("%s: no bucket config file from the Secret", name)
	}
	if _, ok := mounts[cfg.TSDB.Dir]; disk && !ok && !strings.HasPrefix(cfg.TSDB.Dir, root) {
		t.Errorf("%s: storage.tsdb.path %s is not on a volume", name, cfg.TSDB.Dir)
	}
	// The root filesystem is read-only: the data path's mount must not be.
	for _, vm := range c.VolumeMounts {
		if disk && vm.ReadOnly && mounts[vm.MountPath] == cfg.TSDB.Dir {
			t.Errorf("%s: storage.tsdb.path %s is mounted read-only", name, vm.MountPath)
		}
	}
	if _, ok := mounts[cfg.Rules.Dir]; ok && !runs(app.Rules) {
		t.Errorf("%s: mounts rules.dir %s but runs no rules", name, cfg.Rules.Dir)
	}
	if runs(app.Rules) {
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
		// The Operator's Alertmanager runs as an HA set behind a headless
		// Service: a plain URL would reach one replica; each must get every
		// alert, so the URL is looked up (dns+/dnssrv+) for all of them.
		if len(cfg.Rules.Alertmanager.URLs) == 0 {
			t.Errorf("%s: runs rules but sends alerts nowhere", name)
		}
		for _, u := range cfg.Rules.Alertmanager.URLs {
			if !strings.HasPrefix(u, "dns+") && !strings.HasPrefix(u, "dnssrv+") {
				t.Errorf("%s: alertmanager URL %s reaches one replica of an HA Alertmanager; want dns+ or dnssrv+ discovery", name, u)
			}
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
	checkResources(t, o, name, pod, cfg, mounts, runs)
	return cfg
}

// checkResources checks the container's requests and limits and its data
// volume against the measured sizing: memory for the TSDB's series where
// ingest runs (in the ring each receiver holds RF/N of them) and the bucket
// store's page cache where queries run (rules run them too), a
// distributor's labels; CPU for ingest; disk for the WAL and the local
// blocks where ingest runs and twice the largest compaction where the
// compactor runs.
func checkResources(t *testing.T, o *objects, name string, pod *corev1.PodTemplateSpec, cfg app.Config, mounts map[string]string, runs func(string) bool) {
	t.Helper()
	c := pod.Spec.Containers[0]
	req, lim := c.Resources.Requests, c.Resources.Limits
	if req.Cpu().IsZero() || req.Memory().IsZero() || lim.Memory().IsZero() {
		t.Errorf("%s: needs cpu and memory requests and a memory limit", name)
	}
	if lim.Memory().Cmp(*req.Memory()) < 0 {
		t.Errorf("%s: memory limit %s below its request %s", name, lim.Memory(), req.Memory())
	}
	share := 1.0
	if n := replicas(o, name); cfg.Ring.Enabled && int(n) > cfg.Ring.ReplicationFactor {
		share = float64(cfg.Ring.ReplicationFactor) / float64(n)
	}
	series := share * sizingSeries()
	var request, limit, cores, disk float64 // MiB, MiB, cores, bytes
	var why, diskWhy []string
	if runs(app.Query) || runs(app.Rules) {
		mib := float64(cfg.BucketStore.CacheSize) / (1 << 20)
		request, limit = request+mib, limit+mib
		why = append(why, "page cache")
	}
	switch {
	case runs(app.Ingest):
		request += sizing.idleMiB + series*sizing.steadyKiB/1024
		limit += sizing.idleMiB + series*sizing.peakKiB/1024
		cores += share * sizing.gpus * sizing.coresPerGPU
		disk += series*sizing.walBytesPerSeries + share*rawBytesPerDay()*time.Duration(cfg.TSDB.Retention).Hours()/24
		diskWhy = append(diskWhy, "WAL", time.Duration(cfg.TSDB.Retention).String()+" of local blocks")
		why = append(why, fmt.Sprintf("%.0f series × %.2f / %.2f KiB", series, sizing.steadyKiB, sizing.peakKiB))
	case runs(app.Distributor):
		request += sizing.idleMiB + sizingSeries()*sizing.distributorKiB/1024
		limit += sizing.idleMiB + sizingSeries()*sizing.distributorKiB/1024
		why = append(why, fmt.Sprintf("%.0f series × %.1f KiB", sizingSeries(), sizing.distributorKiB))
	}
	if runs(app.Compact) {
		disk += 2 * sizing.compactionDays * rawBytesPerDay()
		diskWhy = append(diskWhy, fmt.Sprintf("2 × %.0f days of raw blocks (the compactor)", sizing.compactionDays))
	}
	mib := func(v float64) *resource.Quantity {
		return resource.NewQuantity(int64(math.Ceil(v))<<20, resource.BinarySI)
	}
	if req.Memory().Cmp(*mib(request)) < 0 {
		t.Errorf("%s: memory request %s < %s = %s", name, req.Memory(), strings.Join(why, " + "), mib(request))
	}
	if lim.Memory().Cmp(*mib(limit)) < 0 {
		t.Errorf("%s: memory limit %s < the measured peak, %s = %s", name, lim.Memory(), strings.Join(why, " + "), mib(limit))
	}
	if q := resource.NewMilliQuantity(int64(cores*1000), resource.DecimalSI); req.Cpu().Cmp(*q) < 0 {
		t.Errorf("%s: cpu request %s < the measured %s", name, req.Cpu(), q)
	}
	if disk == 0 {
		return
	}
	have, what := dataVolumeSize(o, name, pod, cfg.TSDB.Dir, mounts)
	if need := resource.NewQuantity(int64(math.Ceil(disk/(1<<30)))<<30, resource.BinarySI); have.Cmp(*need) < 0 {
		t.Errorf("%s: %s %s < %s = %s", name, what, &have, strings.Join(diskWhy, " + "), need)
	}
}

// dataVolumeSize is the size of the volume mounted at the data path: a
// StatefulSet's volume claim template, a generic ephemeral volume's claim,
// or an emptyDir's sizeLimit.
func dataVolumeSize(o *objects, name string, pod *corev1.PodTemplateSpec, dir string, mounts map[string]string) (resource.Quantity, string) {
	for _, vm := range pod.Spec.Containers[0].VolumeMounts {
		if mounts[vm.MountPath] != dir {
			continue
		}
		for _, s := range o.statefulSets {
			for _, vct := range s.Spec.VolumeClaimTemplates {
				if "StatefulSet/"+s.Name == name && vct.Name == vm.Name {
					return vct.Spec.Resources.Requests[corev1.ResourceStorage], "volume claim " + vm.Name
				}
			}
		}
		switch v := volume(pod, vm.Name); {
		case v != nil && v.Ephemeral != nil && v.Ephemeral.VolumeClaimTemplate != nil:
			return v.Ephemeral.VolumeClaimTemplate.Spec.Resources.Requests[corev1.ResourceStorage], "ephemeral volume " + vm.Name
		case v != nil && v.EmptyDir != nil && v.EmptyDir.SizeLimit != nil:
			return *v.EmptyDir.SizeLimit, "emptyDir " + vm.Name
		}
	}
	return resource.Quantity{}, "no sized volume at " + dir
}

// checkRulers checks that exactly the rulers run the rules role: in the
// ring every process running rules joins the rulers' ring and takes a share
// of the rule groups, so a receiver left with -target=ingest,rules would
// evaluate some groups beside the rulers.
func checkRulers(t *testing.T, cfgs map[string]app.Config, rulers []string) {
	t.Helper()
	for _, r := range rulers {
		if _, ok := cfgs[r]; !ok {
			t.Errorf("ruler %s is not a workload", r)
		}
	}
	for name, cfg := range cfgs {
		roles := strings.Split(cfg.Target, ",")
		runs := slices.Contains(roles, app.Rules) || slices.Contains(roles, app.All)
		if want := slices.Contains(rulers, name); runs != want {
			t.Errorf("%s (-target=%s): runs rules %v, want %v (the rulers: %v)", name, cfg.Target, runs, want, rulers)
		}
		// A ruler of its own (no ingest) in the ring reads like a querier
		// and writes through the ring: it must be in the ring.
		if runs && !slices.Contains(roles, app.Ingest) && !slices.Contains(roles, app.All) && !cfg.Ring.Enabled {
			t.Errorf("%s: rules without ingest need --ring.enabled", name)
		}
	}
}

// checkRing checks the ring topology: exactly the members run with
// --ring.enabled, all with the same memberlist seed, gossip port and
// gossiped HA election; the seed is a headless Service of the namespace,
// published before readiness, that selects every member and no other pod
// and exposes the gossip port over TCP and UDP, which every member's
// container declares; receivers and rulers (each registered in a ring:
// the receivers', the rulers') name themselves after their pod and
// advertise their pod IP and HTTP port; receivers have the time to flush
// and ship their heads when they stop.
func checkRing(t *testing.T, o *objects, cfgs map[string]app.Config, members []string) {
	t.Helper()
	for name, cfg := range cfgs {
		if cfg.Ring.Enabled != slices.Contains(members, name) {
			t.Errorf("%s: ring.enabled %v, want %v", name, cfg.Ring.Enabled, !cfg.Ring.Enabled)
		}
	}
	if len(members) == 0 {
		return
	}
	pods := o.pods()
	joinArgs := func(name string) []string {
		var j []string
		for _, a := range pods[name].Spec.Containers[0].Args {
			if v, ok := strings.CutPrefix(strings.TrimLeft(a, "-"), "memberlist.join="); ok {
				j = append(j, v)
			}
		}
		return j
	}
	first := members[0]
	for _, m := range members {
		cfg, ok := cfgs[m]
		if !ok {
			t.Errorf("ring member %s is not a workload", m)
			continue
		}
		if j := joinArgs(m); !slices.Equal(j, []string{ringJoin}) {
			t.Errorf("%s: --memberlist.join %v, want [%s]", m, j, ringJoin)
		}
		// Load parses the flags again after the config file: a list flag
		// may repeat its values, which the DNS provider resolves once.
		if j := slices.Compact(slices.Sorted(slices.Values(cfg.Memberlist.JoinMembers))); !slices.Equal(j, []string{ringJoin}) {
			t.Errorf("%s: gpustore joins %v, want [%s]", m, cfg.Memberlist.JoinMembers, ringJoin)
		}
		if cfg.Ring.KVStore != "memberlist" || !cfg.HA.Enabled || cfg.HA.KVStore != "memberlist" {
			t.Errorf("%s: ring store %q, HA tracker %v store %q: want both on memberlist", m, cfg.Ring.KVStore, cfg.HA.Enabled, cfg.HA.KVStore)
		}
		if p, p0 := cfg.Memberlist.TCPTransport.BindPort, cfgs[first].Memberlist.TCPTransport.BindPort; p != p0 {
			t.Errorf("%s: memberlist.bind-port %d, %s's is %d", m, p, first, p0)
		}
		if cfg.Ring.ReplicationFactor != cfgs[first].Ring.ReplicationFactor {
			t.Errorf("%s: replication factor %d, %s's is %d", m, cfg.Ring.ReplicationFactor, first, cfgs[first].Ring.ReplicationFactor)
		}
		for _, pr := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP} {
			if !slices.ContainsFunc(pods[m].Spec.Containers[0].Ports, func(p corev1.ContainerPort) bool {
				return int(p.ContainerPort) == cfg.Memberlist.TCPTransport.BindPort && proto(p.Protocol) == pr
			}) {
				t.Errorf("%s: container does not declare the gossip port %d/%s", m, cfg.Memberlist.TCPTransport.BindPort, pr)
			}
		}
	}

	// The seed: dns+<service>.<namespace>.svc.cluster.local:<port>.
	hostPort, ok := strings.CutPrefix(ringJoin, "dns+")
	if !ok {
		t.Fatalf("%s: want dskit's dns+ (A/AAAA) lookup", ringJoin)
	}
	host, port, err := net.SplitHostPort(hostPort)
	if err != nil {
		t.Fatal(err)
	}
	svcName, ns, _ := strings.Cut(strings.TrimSuffix(host, ".svc.cluster.local"), ".")
	if want := o.namespaces[0].Name; ns != want || !strings.HasSuffix(host, ".svc.cluster.local") {
		t.Errorf("%s: want <service>.%s.svc.cluster.local", ringJoin, want)
	}
	if port != strconv.Itoa(cfgs[first].Memberlist.TCPTransport.BindPort) {
		t.Errorf("%s: port %s, members gossip on %d", ringJoin, port, cfgs[first].Memberlist.TCPTransport.BindPort)
	}
	var gossip *corev1.Service
	for _, s := range o.services {
		if s.Name == svcName {
			gossip = s
		}
	}
	if gossip == nil {
		t.Fatalf("%s: no Service %s", ringJoin, svcName)
	}
	if gossip.Spec.ClusterIP != corev1.ClusterIPNone || !gossip.Spec.PublishNotReadyAddresses {
		t.Errorf("Service %s: want headless (clusterIP None) with publishNotReadyAddresses: the DNS lookup must return every member's pod, ready or not", gossip.Name)
	}
	for name, pod := range pods {
		if m := slices.Contains(members, name); selects(gossip.Spec.Selector, pod) != m {
			t.Errorf("Service %s selects %s: %v, want %v (ring member: %v)", gossip.Name, name, !m, m, m)
		}
		// Whatever the members list says: a process in the ring must be
		// found through the seed.
		if cfgs[name].Ring.Enabled && !selects(gossip.Spec.Selector, pod) {
			t.Errorf("%s runs with --ring.enabled but Service %s (selector %v) does not select its pods %v", name, gossip.Name, gossip.Spec.Selector, pod.Labels)
		}
	}
	for _, pr := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP} {
		if !slices.ContainsFunc(gossip.Spec.Ports, func(p corev1.ServicePort) bool { return itoa(p.Port) == port && proto(p.Protocol) == pr }) {
			t.Errorf("Service %s: no port %s/%s", gossip.Name, port, pr)
		}
	}

	// Receivers and rulers: each registers in a ring (the receivers', the
	// rulers'; a ruler's ID there is <instance-id>@<instance-addr>) as its
	// pod, at its pod IP and HTTP port.
	for _, m := range members {
		cfg := cfgs[m]
		roles := strings.Split(cfg.Target, ",")
		if !slices.Contains(roles, app.Ingest) && !slices.Contains(roles, app.Rules) {
			continue
		}
		pod := pods[m]
		if cfg.Ring.InstanceID != podEnvSamples["metadata.name"] {
			t.Errorf("%s: ring.instance-id %q, want the pod's name (downward API metadata.name)", m, cfg.Ring.InstanceID)
		}
		host, port, err := net.SplitHostPort(cfg.Ring.InstanceAddr)
		if err != nil {
			t.Errorf("%s: ring.instance-addr %q: %v", m, cfg.Ring.InstanceAddr, err)
		}
		if host != podEnvSamples["status.podIP"] {
			t.Errorf("%s: ring.instance-addr host %q, want the pod's IP (downward API status.podIP)", m, host)
		}
		if cp, ok := hasPort(pod, "http"); !ok || itoa(cp) != port {
			t.Errorf("%s: ring.instance-addr port %s, container port http %d", m, port, cp)
		}
		if !slices.Contains(roles, app.Ingest) {
			continue
		}
		// Receivers.
		if !strings.HasPrefix(m, "StatefulSet/") {
			t.Errorf("%s: a receiver needs a StatefulSet (a stable name and volume to rejoin with)", m)
		}
		if n := replicas(o, m); int(n) < cfg.Ring.ReplicationFactor {
			t.Errorf("%s: %d receivers, fewer than the replication factor %d", m, n, cfg.Ring.ReplicationFactor)
		}
		if g := pod.Spec.TerminationGracePeriodSeconds; cfg.Ring.FlushOnShutdown && (g == nil || *g < 120) {
			t.Errorf("%s: terminationGracePeriodSeconds %s: a leaving receiver needs minutes (≥ 120s) to flush and ship its heads", m, fmtSeconds(g))
		}
	}
}

func fmtSeconds(s *int64) string {
	if s == nil {
		return "unset (30)"
	}
	return strconv.FormatInt(*s, 10)
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
// Service with gpustore's HA labels; its comment gives the scaled overlay's
// address (the distributors' Service).
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
	if len(p.Spec.RemoteWrite) != 1 {
		t.Fatalf("%d remoteWrite entries, want 1", len(p.Spec.RemoteWrite))
	}
	u, err := url.Parse(string(p.Spec.RemoteWrite[0].URL))
	if err != nil {
		t.Fatal(err)
	}
	if want := writeAddr(t, "overlays/single", "StatefulSet/gpustore"); u.Host != want || u.Path != "/api/v1/write" {
		t.Errorf("remote write %s, want http://%s/api/v1/write", u, want)
	}
	// The scaled overlay's address, in the snippet's comment: the Service
	// in front of the distributors.
	if want := "url: http://" + writeAddr(t, "overlays/scaled", "Deployment/gpustore-distributor") + "/api/v1/write"; !strings.Contains(string(b), want) {
		t.Errorf("the snippet does not document overlays/scaled's remote write (%s)", want)
	}
}

// writeAddr is host:port of the client-facing Service in front of workload.
func writeAddr(t *testing.T, overlay, workload string) string {
	t.Helper()
	o := render(t, overlay)
	ns := o.namespaces[0].Name
	for _, s := range o.services {
		if s.Spec.ClusterIP != corev1.ClusterIPNone && selects(s.Spec.Selector, o.pods()[workload]) {
			return s.Name + "." + ns + ".svc:" + itoa(s.Spec.Ports[0].Port)
		}
	}
	t.Fatalf("%s: no Service selects %s", overlay, workload)
	return ""
}
