package dcgmexporter

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/common/promslog"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	rulepack "github.com/gpustore/gpustore/deploy/rules"
)

const csvFile = "dcgm-metrics.csv"

// counter is one line of a dcgm-exporter counters CSV.
type counter struct{ field, promType, help string }

// parseCounters reads a counters CSV the way dcgm-exporter 4.8.2 does
// (internal/pkg/counters: encoding/csv with '#' comments, every field
// trimmed of spaces, exactly three fields, type gauge, counter or label);
// any error here is an exporter that exits at start.
func parseCounters(t *testing.T, b []byte) []counter {
	t.Helper()
	r := csv.NewReader(bytes.NewReader(b))
	r.Comment = '#'
	records, err := r.ReadAll()
	if err != nil {
		t.Fatalf("the exporter cannot read the CSV: %v", err)
	}
	var out []counter
	for i, rec := range records {
		if len(rec) != 3 {
			t.Fatalf("record %d %q: %d fields, the exporter wants 3", i, rec, len(rec))
		}
		for j := range rec {
			rec[j] = strings.Trim(rec[j], " ")
		}
		if !slices.Contains([]string{"gauge", "counter", "label"}, rec[1]) {
			t.Errorf("%s: Prometheus type %q, the exporter knows gauge, counter and label", rec[0], rec[1])
		}
		out = append(out, counter{rec[0], rec[1], rec[2]})
	}
	return out
}

// knownFields are the field names dcgm-exporter 4.5.3-4.8.2 accepts
// (testdata: its go-dcgm field table and its own DCGM_EXP_* counters).
func knownFields(t *testing.T) map[string]bool {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", "dcgm-exporter-4.8.2-fields.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	known := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); line != "" && !strings.HasPrefix(line, "#") {
			known[line] = true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(known) < 600 {
		t.Fatalf("testdata lists %d fields; the 4.8.2 table has about 690", len(known))
	}
	return known
}

func shippedCSV(t *testing.T) ([]byte, []counter) {
	t.Helper()
	b, err := os.ReadFile(csvFile)
	if err != nil {
		t.Fatal(err)
	}
	return b, parseCounters(t, b)
}

// Every line of the shipped CSV is one dcgm-exporter 4.8.2 starts with: a
// name it knows (DCGM_FI_DEV_GPU_RECOVERY_ACTION, the DCGM 4.6 name, would
// stop it), once.
func TestCountersKnownToExporter(t *testing.T) {
	_, counters := shippedCSV(t)
	known := knownFields(t)
	seen := map[string]bool{}
	for _, c := range counters {
		if !known[c.field] {
			t.Errorf("%s is not a field dcgm-exporter 4.5.3-4.8.2 knows: the exporter would exit at start", c.field)
		}
		if seen[c.field] {
			t.Errorf("%s listed twice", c.field)
		}
		seen[c.field] = true
	}
	// The DCGM 4.6 name must not slip in; the 4.5 name is the one that works on both.
	if seen["DCGM_FI_DEV_GPU_RECOVERY_ACTION"] || !seen["DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION"] {
		t.Error("the recovery action must be listed as DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION (dcgm-exporter 4.8.2 links DCGM 4.5.3)")
	}
}

// The kustomization ships the CSV unchanged as the ConfigMap the README
// tells the GPU Operator to mount.
func TestConfigMapShipsTheCSV(t *testing.T) {
	b, _ := shippedCSV(t)
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), ".")
	if err != nil {
		t.Fatalf("kustomize build: %v", err)
	}
	y, err := m.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	sch := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(sch); err != nil {
		t.Fatal(err)
	}
	dec := kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, sch, sch, kjson.SerializerOptions{Yaml: true, Strict: true})
	obj, _, err := dec.Decode(y, nil, nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, y)
	}
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		t.Fatalf("kustomize renders a %T, want one ConfigMap", obj)
	}
	if cm.Name != "gpustore-dcgm-metrics" {
		t.Errorf("ConfigMap %q, the README names gpustore-dcgm-metrics", cm.Name)
	}
	if got := cm.Data[csvFile]; got != string(b) {
		t.Errorf("ConfigMap key %s differs from %s", csvFile, csvFile)
	}
}

// dcgmNames matches a DCGM metric name, or several joined by | (a regex
// matcher on __name__ that accepts any of them).
var dcgmNames = regexp.MustCompile(`DCGM_[A-Z0-9_]*[A-Z0-9](?:\|DCGM_[A-Z0-9_]*[A-Z0-9])*`)

// needs lists the expressions that read DCGM metrics, by where they are.
type needs map[string][]string

func (n needs) add(where, expr string) {
	if dcgmNames.MatchString(expr) {
		n[where] = append(n[where], expr)
	}
}

// renamedFrom maps each DCGM 4.6 field name to the name it had up to DCGM
// 4.5 (testdata/dcgm-4.6-renames.txt, from dcgm_fields.h at v4.6.0).
func renamedFrom(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "dcgm-4.6-renames.txt"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && !strings.HasPrefix(f[0], "#") {
			out[f[1]] = f[0]
		}
	}
	if len(out) < 200 {
		t.Fatalf("testdata lists %d renames; DCGM 4.6 has about 270", len(out))
	}
	return out
}

func packNeeds(t *testing.T) needs {
	t.Helper()
	n := needs{}
	for _, name := range rulepack.Files() {
		b, err := fs.ReadFile(rulepack.FS, name)
		if err != nil {
			t.Fatal(err)
		}
		groups, errs := rulefmt.Parse(b, false, model.UTF8Validation, parser.NewParser(parser.Options{}), promslog.NewNopLogger())
		if len(errs) > 0 {
			t.Fatalf("%s: %v", name, errs)
		}
		for _, g := range groups.Groups {
			for _, r := range g.Rules {
				n.add(name+" "+r.Alert+r.Record, r.Expr)
			}
		}
	}
	return n
}

// dashboardNeeds collects the expressions of the provisioned dashboards
// (every "expr" string, at any depth of the JSON).
func dashboardNeeds(t *testing.T) needs {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "..", "grafana", "dashboards", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards found (%v)", err)
	}
	n := needs{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var doc any
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		var walk func(v any)
		walk = func(v any) {
			switch v := v.(type) {
			case map[string]any:
				for k, e := range v {
					if s, ok := e.(string); ok && (k == "expr" || k == "query" || k == "definition") {
						n.add(filepath.Base(f), s)
					}
					walk(e)
				}
			case []any:
				for _, e := range v {
					walk(e)
				}
			}
		}
		walk(doc)
	}
	return n
}

// checkExported checks that every DCGM metric the expressions read is in the
// shipped CSV: a name, or one of several joined by | in a regex matcher. A
// DCGM 4.6 name is accepted only next to its DCGM 4.5 name in the same
// expression (`rate(OLD[5m]) or rate(NEW[5m])`), and only if the CSV exports
// the old one: the CSV uses 4.5 names, and the exporter names metrics after
// them.
func checkExported(t *testing.T, what string, n needs) {
	t.Helper()
	_, counters := shippedCSV(t)
	exported := map[string]bool{}
	for _, c := range counters {
		exported[c.field] = true
	}
	renamed := renamedFrom(t)
	if len(n) == 0 {
		t.Fatalf("%s read no DCGM metric: the scan is broken", what)
	}
	for where, exprs := range n {
		for _, expr := range exprs {
			for _, group := range dcgmNames.FindAllString(expr, -1) {
				names := strings.Split(group, "|")
				if slices.ContainsFunc(names, func(name string) bool { return exported[name] }) {
					continue
				}
				if old, ok := renamed[group]; ok && exported[old] && regexp.MustCompile(`\b`+old+`\b`).MatchString(expr) {
					continue
				}
				t.Errorf("%s: %s reads %s, which %s does not export", what, where, group, csvFile)
			}
		}
	}
}

// Every DCGM metric an expression of the rule pack reads is exported by the
// shipped CSV, under one of the names the expression accepts.
func TestCSVExportsWhatThePackReads(t *testing.T) {
	checkExported(t, "the rule pack", packNeeds(t))
}

// The same for the Grafana dashboards, whose panels stay empty otherwise.
func TestCSVExportsWhatTheDashboardsRead(t *testing.T) {
	checkExported(t, "the dashboards", dashboardNeeds(t))
}

// CSV lines the documentation tells users to add to their exporter's file
// are names dcgm-exporter 4.8.2 knows: a wrong name there stops every
// exporter that follows the advice.
func TestDocumentedCSVLinesKnownToExporter(t *testing.T) {
	known := knownFields(t)
	block := regexp.MustCompile("(?s)```csv\n(.*?)```")
	docs := []string{"README.md", filepath.Join("..", "..", "rules", "README.md"), filepath.Join("..", "..", "..", "README.md")}
	for _, d := range docs {
		b, err := os.ReadFile(d)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range block.FindAllSubmatch(b, -1) {
			// A block inside a list item is indented; the lines users copy are not.
			var lines []string
			for _, l := range strings.Split(string(m[1]), "\n") {
				lines = append(lines, strings.TrimSpace(l))
			}
			for _, c := range parseCounters(t, []byte(strings.Join(lines, "\n"))) {
				if !known[c.field] {
					t.Errorf("%s tells users to add %s, which dcgm-exporter 4.5.3-4.8.2 does not know (it would exit at start)", d, c.field)
				}
			}
		}
	}
}
