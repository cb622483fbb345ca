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

// A generation of dcgm-exporter releases that accept the same counters CSV:
// its CSV in this folder and the field names every release of it accepts
// (testdata/fields-<name>.txt, generated from each release's go-dcgm field
// table by testdata/gen-fields.sh).
type generation struct {
	name, csv string
	tags      string // the release tags, for messages
}

// generations lists the shipped CSVs, oldest first. dcgm-metrics.csv is the
// newest generation's, and the ConfigMap's.
var generations = []generation{
	{"3.2-3.3", "dcgm-metrics-3.2-3.3.csv", "3.3.0-3.2.0 to 3.3.3-3.3.1"},
	{"3.4-3.6", "dcgm-metrics-3.4-3.6.csv", "3.3.5-3.4.0 to 3.3.9-3.6.1"},
	{"4.0-4.2", "dcgm-metrics-4.0-4.2.csv", "4.0.0-4.0.1 to 4.2.3-4.2.0"},
	{"4.4-4.7", "dcgm-metrics-4.4-4.7.csv", "4.3.1-4.4.0 to 4.4.2-4.7.1"},
	{"4.8", csvFile, "4.5.1-4.8.0 to 4.5.3-4.8.2"},
}

// knownFields are the field names every release of generation g accepts.
func knownFields(t *testing.T, g string) map[string]bool {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", "fields-"+g+".txt"))
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
	if len(known) < 400 {
		t.Fatalf("testdata lists %d fields for %s; every generation has over 400", len(known), g)
	}
	return known
}

func readCSV(t *testing.T, name string) ([]byte, []counter) {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return b, parseCounters(t, b)
}

func shippedCSV(t *testing.T) ([]byte, []counter) { return readCSV(t, csvFile) }

// Every line of each shipped CSV is one every release of its generation
// starts with: a name it knows (a single unknown name stops the exporter,
// and the node then exports no GPU metric at all), once.
func TestCountersKnownToExporter(t *testing.T) {
	for _, g := range generations {
		_, counters := readCSV(t, g.csv)
		known := knownFields(t, g.name)
		seen := map[string]bool{}
		for _, c := range counters {
			if !known[c.field] {
				t.Errorf("%s: %s is not a field every dcgm-exporter %s release (%s) knows: the exporter would exit at start", g.csv, c.field, g.name, g.tags)
			}
			if seen[c.field] {
				t.Errorf("%s: %s listed twice", g.csv, c.field)
			}
			seen[c.field] = true
		}
	}
	// The DCGM 4.6 name must not slip in; the 4.5 name is the one that works on both.
	_, counters := shippedCSV(t)
	if slices.ContainsFunc(counters, func(c counter) bool { return c.field == "DCGM_FI_DEV_GPU_RECOVERY_ACTION" }) ||
		!slices.ContainsFunc(counters, func(c counter) bool { return c.field == "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION" }) {
		t.Error("the recovery action must be listed as DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION (dcgm-exporter 4.8.2 links DCGM 4.5.3)")
	}
}

// An older generation's CSV leaves out only what its releases do not know:
// every field of dcgm-metrics.csv they accept (the clock event reasons under
// their older name DCGM_FI_DEV_CLOCK_THROTTLE_REASONS where that is the one
// they know) is in it, so an older exporter gives the pack all it can.
func TestOlderCSVsKeepWhatTheirReleasesKnow(t *testing.T) {
	_, newest := shippedCSV(t)
	for _, g := range generations[:len(generations)-1] {
		_, counters := readCSV(t, g.csv)
		known := knownFields(t, g.name)
		has := map[string]bool{}
		for _, c := range counters {
			has[c.field] = true
		}
		for _, c := range newest {
			name := c.field
			if name == "DCGM_FI_DEV_CLOCKS_EVENT_REASONS" && !known[name] {
				name = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
			}
			if known[name] && !has[name] {
				t.Errorf("%s leaves out %s, which dcgm-exporter %s knows", g.csv, name, g.name)
			}
		}
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
	known := knownFields(t, "4.8")
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
					t.Errorf("%s tells users to add %s, which dcgm-exporter 4.8 does not know (it would exit at start)", d, c.field)
				}
			}
		}
	}
}
