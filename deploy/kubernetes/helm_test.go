package kubernetes

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/chart/common"
	chartutil "helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/loader"
	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"helm.sh/helm/v4/pkg/engine"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/gpustore/gpustore/pkg/storage/bucket"
)

// The Helm chart (deploy/helm/gpustore) renders what the overlays render:
// its default values in each mode are the overlay of that name, object for
// object, so every check of kubernetes_test.go on the overlays holds for
// the chart too; other values are checked below.
const chartDir = "../helm/gpustore"

// renderChart renders the chart as `helm template RELEASE deploy/helm/gpustore
// -n NAMESPACE -f values.yml` does, through Helm's Go packages (the values
// checked against values.schema.json), and decodes every object strictly.
func renderChart(t *testing.T, release, namespace string, values map[string]any) *objects {
	t.Helper()
	docs, err := renderChartDocs(release, namespace, values)
	if err != nil {
		t.Fatal(err)
	}
	return decodeObjects(t, fmt.Sprintf("chart (release %s, values %v)", release, values), docs)
}

// renderChartDocs renders the chart's manifests, one object per document.
func renderChartDocs(release, namespace string, values map[string]any) ([][]byte, error) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		return nil, err
	}
	opts := common.ReleaseOptions{Name: release, Namespace: namespace, Revision: 1, IsInstall: true}
	vals, err := chartutil.ToRenderValuesWithSchemaValidation(ch, values, opts, nil, false)
	if err != nil {
		return nil, fmt.Errorf("values %v: %w", values, err)
	}
	files, err := engine.Render(ch, vals)
	if err != nil {
		return nil, fmt.Errorf("render with %v: %w", values, err)
	}
	var docs [][]byte
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if strings.HasSuffix(name, "NOTES.txt") {
			continue
		}
		for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(files[name], -1) {
			if hasContent(doc) {
				docs = append(docs, []byte(doc))
			}
		}
	}
	return docs, nil
}

// hasContent: a document of more than comments and blank lines.
func hasContent(doc string) bool {
	for _, l := range strings.Split(doc, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			return true
		}
	}
	return false
}

// TestChartMatchesOverlays: the chart's defaults, released as gpustore in
// namespace gpustore with the Namespace rendered, are the overlays: the same
// objects, each with the same image, arguments, ports, probes, resources,
// security context, volumes and configuration. What may differ: Helm's
// labels on top (app.kubernetes.io/instance, managed-by, version,
// helm.sh/chart, and part-of where the overlays have none), the release
// name in selectors (app.kubernetes.io/instance: two releases in one
// namespace select only their own pods), a checksum of the configuration on
// the pods (a change rolls them), the order of ports, and the layout of the
// configuration files (compared as YAML).
func TestChartMatchesOverlays(t *testing.T) {
	for _, mode := range []string{"single", "scaled"} {
		t.Run(mode, func(t *testing.T) {
			k := byKindName(t, render(t, "overlays/"+mode))
			h := byKindName(t, renderChart(t, "gpustore", "gpustore", map[string]any{"mode": mode, "namespace": map[string]any{"create": true}}))
			if !slices.Equal(keys(k), keys(h)) {
				t.Fatalf("the chart renders %v\nthe overlay %v", keys(h), keys(k))
			}
			for name, ko := range k {
				ho := h[name]
				normalize(ko)
				normalize(ho)
				relax(ko, ho, "")
				if !reflect.DeepEqual(ko, ho) {
					t.Errorf("%s differs from the overlay's:\n%s", name, strings.Join(diffPaths(ko, ho, ""), "\n"))
				}
			}
		})
	}
}

// byKindName converts every object to its JSON form, keyed by kind/name.
func byKindName(t *testing.T, o *objects) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	for _, obj := range o.all {
		u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
		if err != nil {
			t.Fatal(err)
		}
		m, err := meta.Accessor(obj)
		if err != nil {
			t.Fatal(err)
		}
		out[obj.GetObjectKind().GroupVersionKind().Kind+"/"+m.GetName()] = u
	}
	return out
}

// normalize puts ports in name order and a ConfigMap's files in their
// parsed form.
func normalize(obj map[string]any) {
	if obj["kind"] == "ConfigMap" {
		data, _ := obj["data"].(map[string]any)
		for k, v := range data {
			var parsed any
			if s, ok := v.(string); ok && yaml.Unmarshal([]byte(s), &parsed) == nil {
				data[k] = parsed
			}
		}
	}
	var walk func(v any, key string)
	walk = func(v any, key string) {
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				walk(e, k)
			}
		case []any:
			if key == "ports" {
				sort.SliceStable(v, func(i, j int) bool {
					return fmt.Sprint(v[i].(map[string]any)["name"]) < fmt.Sprint(v[j].(map[string]any)["name"])
				})
			}
			for _, e := range v {
				walk(e, key)
			}
		}
	}
	walk(obj, "")
}

// helmLabels are the labels only the chart sets: Helm's own and the release.
var helmLabels = []string{"app.kubernetes.io/instance", "app.kubernetes.io/managed-by", "app.kubernetes.io/version", "helm.sh/chart"}

// relax removes from the chart's object h what it may have beyond the
// overlay's object k (see TestChartMatchesOverlays).
func relax(k, h any, key string) {
	switch hv := h.(type) {
	case map[string]any:
		kv, _ := k.(map[string]any)
		switch key {
		case "labels": // the overlay's labels, and more
			for n := range hv {
				if _, ok := kv[n]; !ok {
					delete(hv, n)
				}
			}
		case "selector", "matchLabels":
			for _, n := range helmLabels {
				delete(hv, n)
			}
		case "annotations":
			for n := range hv {
				if strings.HasPrefix(n, "checksum/") {
					delete(hv, n)
				}
			}
		}
		for n, v := range hv {
			relax(kv[n], v, n)
			if m, ok := hv[n].(map[string]any); ok && len(m) == 0 && kv[n] == nil {
				delete(hv, n)
			}
		}
	case []any:
		kl, _ := k.([]any)
		for i, e := range hv {
			if i < len(kl) {
				relax(kl[i], e, "")
			}
		}
	}
}

// diffPaths lists where a and b differ, as paths.
func diffPaths(a, b any, path string) []string {
	switch av := a.(type) {
	case map[string]any:
		bv, ok := b.(map[string]any)
		if !ok {
			break
		}
		var out []string
		all := maps.Clone(av)
		maps.Copy(all, bv)
		for _, k := range slices.Sorted(maps.Keys(all)) {
			out = append(out, diffPaths(av[k], bv[k], path+"."+k)...)
		}
		return out
	case []any:
		bv, ok := b.([]any)
		if !ok || len(av) != len(bv) {
			break
		}
		var out []string
		for i := range av {
			out = append(out, diffPaths(av[i], bv[i], fmt.Sprintf("%s[%d]", path, i))...)
		}
		return out
	}
	if reflect.DeepEqual(a, b) {
		return nil
	}
	ya, _ := yaml.Marshal(a)
	yb, _ := yaml.Marshal(b)
	return []string{fmt.Sprintf("%s: overlay %s     chart %s", path, bytes.TrimSpace(ya), bytes.TrimSpace(yb))}
}

// TestChartLint: `helm lint --strict` (Helm's own linter: Chart.yaml, the
// values against values.schema.json, every template rendered and parsed as
// Kubernetes YAML) finds nothing in either mode, with the bucket Secret
// rendered or not; and it does fail a chart given wrong values.
func TestChartLint(t *testing.T) {
	for name, values := range map[string]map[string]any{
		"single": {"mode": "single"},
		"scaled": {"mode": "scaled"},
		"scaled with its bucket Secret and namespace": {
			"mode": "scaled", "namespace": map[string]any{"create": true},
			"bucket": map[string]any{"create": true, "config": map[string]any{"type": "GCS", "config": map[string]any{"bucket": "gpu-metrics"}}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			for _, m := range lintMessages(values) {
				t.Errorf("helm lint: %s", m)
			}
		})
	}
	// Wrong values: helm lint (the schema) or the rendering refuses them.
	for name, values := range map[string]map[string]any{
		"unknown mode":            {"mode": "ring"},
		"misspelt value":          {"recievers": map[string]any{"replicas": 5}},
		"a size that is no size":  {"single": map[string]any{"storage": "256 GB"}},
		"fewer receivers than RF": {"mode": "scaled", "receiver": map[string]any{"replicas": 2}},
		"Secret without config":   {"bucket": map[string]any{"create": true}},
	} {
		_, err := renderChartDocs("gpustore", "gpustore", values)
		if len(lintMessages(values)) == 0 && err == nil {
			t.Errorf("%s (%v): helm lint finds nothing and the chart renders", name, values)
		}
	}
}

// lintMessages are helm lint's findings at warning or error (what --strict
// fails on).
func lintMessages(values map[string]any) []string {
	var out []string
	for _, m := range lint.RunAll(chartDir, values, "gpustore").Messages {
		if m.Severity >= support.WarningSev {
			out = append(out, m.Error())
		}
	}
	return out
}

// TestChartOtherReleases: released under another name, in another
// namespace, with other values (image, replicas, the bucket Secret, extra
// flags, scheduling), every object is in the release namespace, every pod
// passes Pod Security "restricted", runs the chosen image, joins the
// release's gossip Service, reads the release's bucket Secret, and two
// releases in one namespace select only their own pods.
func TestChartOtherReleases(t *testing.T) {
	values := map[string]any{
		"mode":             "scaled",
		"namespace":        map[string]any{"create": true},
		"image":            map[string]any{"repository": "registry.example.com/team/gpustore", "tag": "v0.2.0", "pullPolicy": "IfNotPresent"},
		"imagePullSecrets": []any{"registry"},
		"receiver":         map[string]any{"replicas": 5},
		"bucket": map[string]any{"create": true, "config": map[string]any{
			"type": "AZURE", "config": map[string]any{"storage_account": "gpustoreacct", "container": "gpu-metrics"},
		}},
		"extraArgs":        []any{"--log.level=debug"},
		"nodeSelector":     map[string]any{"gpustore.io/pool": "metrics"},
		"tolerations":      []any{map[string]any{"key": "dedicated", "operator": "Equal", "value": "metrics", "effect": "NoSchedule"}},
		"storageClassName": "fast-ssd",
	}
	o := renderChart(t, "metrics", "observability", values)
	checkNamespaces(t, o)
	checkWorkloads(t, o)
	checkPDBs(t, o)
	checkServices(t, o, map[string]string{
		"metrics-gpustore-distributor": "Deployment/metrics-gpustore-distributor",
		"metrics-gpustore-querier":     "Deployment/metrics-gpustore-querier",
	})
	if o.namespaces[0].Name != "observability" {
		t.Errorf("Namespace %s, want the release's", o.namespaces[0].Name)
	}
	secret := o.secrets["metrics-gpustore-bucket"]
	if secret == nil {
		t.Fatalf("no Secret metrics-gpustore-bucket: %v", keys(o.secrets))
	}
	bc, err := bucket.Parse([]byte(secret.StringData["objstore.yml"]), "the Secret")
	if err != nil || bc.Validate() != nil || bc.Type != "AZURE" {
		t.Errorf("the Secret's objstore.yml %q: %+v, %v", secret.StringData["objstore.yml"], bc, err)
	}
	join := "--memberlist.join=dns+metrics-gpustore-gossip.observability.svc.cluster.local:7946"
	var gossip bool
	for _, s := range o.services {
		gossip = gossip || s.Name == "metrics-gpustore-gossip"
	}
	if !gossip {
		t.Error("no Service metrics-gpustore-gossip")
	}
	if n := replicas(o, "StatefulSet/metrics-gpustore-receiver"); n != 5 {
		t.Errorf("%d receivers, want 5", n)
	}
	for name, pod := range o.pods() {
		for _, v := range restrictedViolations(&pod.Spec) {
			t.Errorf("%s: %s", name, v)
		}
		c := pod.Spec.Containers[0]
		if c.Image != "registry.example.com/team/gpustore:v0.2.0" || c.ImagePullPolicy != corev1.PullIfNotPresent {
			t.Errorf("%s: image %s (%s)", name, c.Image, c.ImagePullPolicy)
		}
		if len(pod.Spec.ImagePullSecrets) != 1 || pod.Spec.NodeSelector["gpustore.io/pool"] != "metrics" || len(pod.Spec.Tolerations) != 1 {
			t.Errorf("%s: pull secrets %v, node selector %v, tolerations %v", name, pod.Spec.ImagePullSecrets, pod.Spec.NodeSelector, pod.Spec.Tolerations)
		}
		if !slices.Contains(c.Args, "--log.level=debug") {
			t.Errorf("%s: extraArgs missing from %v", name, c.Args)
		}
		if slices.Contains(c.Args, "--ring.enabled") != slices.Contains(c.Args, join) {
			t.Errorf("%s: a ring member must join %s: %v", name, join, c.Args)
		}
		for _, v := range pod.Spec.Volumes {
			if v.Secret != nil && v.Secret.SecretName != secret.Name {
				t.Errorf("%s: mounts Secret %s, the release's is %s", name, v.Secret.SecretName, secret.Name)
			}
			if v.Ephemeral != nil && ptrString(v.Ephemeral.VolumeClaimTemplate.Spec.StorageClassName) != "fast-ssd" {
				t.Errorf("%s: scratch volume without the storage class", name)
			}
		}
	}
	for _, s := range o.statefulSets {
		if sc := s.Spec.VolumeClaimTemplates[0].Spec.StorageClassName; ptrString(sc) != "fast-ssd" {
			t.Errorf("StatefulSet %s: storage class %v", s.Name, sc)
		}
	}

	// A second release in the same namespace: no selector of one matches
	// the other's pods.
	other := renderChart(t, "metrics-b", "observability", values)
	for name, pod := range other.pods() {
		for _, s := range o.services {
			if selects(s.Spec.Selector, pod) {
				t.Errorf("Service %s of release metrics selects %s of release metrics-b", s.Name, name)
			}
		}
		for _, p := range o.pdbs {
			if selects(p.Spec.Selector.MatchLabels, pod) {
				t.Errorf("PodDisruptionBudget %s of release metrics selects %s of release metrics-b", p.Name, name)
			}
		}
	}
}

func ptrString(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// TestChartValuesDocumented: every value of values.yaml has a row in the
// chart's README ("Values").
func TestChartValuesDocumented(t *testing.T) {
	b, err := os.ReadFile(chartDir + "/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(b, &values); err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(chartDir + "/README.md")
	if err != nil {
		t.Fatal(err)
	}
	// Free-form maps are documented as one value.
	opaque := regexp.MustCompile(`^(config|ruleFiles|bucket\.config|nodeSelector|affinity|podAnnotations|podLabels|[a-z]+\.resources)$`)
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		if m, ok := v.(map[string]any); ok && len(m) > 0 && !opaque.MatchString(prefix) {
			for k, e := range m {
				walk(strings.TrimPrefix(prefix+"."+k, "."), e)
			}
			return
		}
		if !bytes.Contains(readme, []byte("| `"+prefix+"` |")) {
			t.Errorf("value %s has no row in %s/README.md", prefix, chartDir)
		}
	}
	walk("", values)
}
