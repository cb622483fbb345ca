package configref

import (
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/gpustore/gpustore/pkg/app"
)

const page = "../../../docs/configuration.md"

func reference(t *testing.T) *Reference {
	t.Helper()
	return New(Comments("../../.."))
}

// docs/configuration.md holds the reference the code generates now: run
// `make docs` after adding or changing a flag, a YAML key or its comment.
func TestReferenceUpToDate(t *testing.T) {
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	want, err := Update(string(b), reference(t))
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != want {
		t.Errorf("%s is stale: run `make docs` and commit the result", page)
	}
}

// Every YAML key says what it does: the usage of the flag that sets it or
// the doc comment of its field. A key added without either fails here.
func TestEveryKeyDescribed(t *testing.T) {
	if keys := reference(t).Undescribed(); len(keys) > 0 {
		t.Errorf("YAML keys with neither a flag nor a doc comment on their field: %v", keys)
	}
}

// The YAML file of the page is a configuration gpustore loads, and it is the
// default configuration, every section and the memberlist block included.
func TestReferenceYAMLIsTheDefault(t *testing.T) {
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	gen, ok := Generated(string(b))
	if !ok {
		t.Fatal("no generated reference in the page")
	}
	_, rest, _ := strings.Cut(gen, "```yaml\n")
	block, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatal("no YAML block in the generated reference")
	}
	file := filepath.Join(t.TempDir(), "gpustore.yml")
	if err := os.WriteFile(file, []byte(block), 0o644); err != nil {
		t.Fatal(err)
	}
	fromFile, _, err := app.Load(flag.NewFlagSet("f", flag.ContinueOnError), []string{"-config.file=" + file})
	if err != nil {
		t.Fatalf("the reference's YAML does not load: %v", err)
	}
	defaults, _, err := app.Load(flag.NewFlagSet("d", flag.ContinueOnError), nil)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := yaml.Marshal(fromFile)
	d, _ := yaml.Marshal(defaults)
	if string(a) != string(d) {
		t.Errorf("the reference's YAML differs from the defaults:\nreference:\n%s\ndefaults:\n%s", a, d)
	}
	// Every key of the configuration is in the file, not only those with a
	// value: keys left out by omitempty are shown empty.
	var shown map[string]any
	if err := yaml.Unmarshal([]byte(block), &shown); err != nil {
		t.Fatal(err)
	}
	for _, fd := range reference(t).fields {
		if !hasPath(shown, strings.Split(fd.path, ".")) {
			t.Errorf("the reference's YAML lacks %s", fd.path)
		}
	}
	// What issue 32 found missing from the README's file.
	for _, want := range []string{"all, distributor, ingest, query, rules, compact", "\nmemberlist:\n", "  max_source_resolution: auto\n", "  join_members:"} {
		if !strings.Contains(gen, want) {
			t.Errorf("the reference lacks %q", want)
		}
	}
}

func hasPath(m map[string]any, path []string) bool {
	v, ok := m[path[0]]
	if !ok || len(path) == 1 {
		return ok
	}
	sub, ok := v.(map[string]any)
	return ok && hasPath(sub, path[1:])
}

// A flag's YAML key is the field the flag writes to: setting the flag and
// setting the key to the same value give the same configuration.
func TestFlagsAndKeysMatch(t *testing.T) {
	r := reference(t)
	checked := 0
	for _, fd := range r.fields {
		if fd.flag == nil || !fd.flagWhole || fd.typ.Kind() != reflect.String {
			continue
		}
		const v = "configref-test-value"
		viaFlag := app.DefaultConfig()
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		app.BindFlags(fs, &viaFlag)
		if err := fs.Set(fd.flag.Name, v); err != nil {
			t.Fatalf("-%s: %v", fd.flag.Name, err)
		}
		viaYAML := app.DefaultConfig()
		var doc any = v
		parts := strings.Split(fd.path, ".")
		for i := len(parts) - 1; i >= 0; i-- {
			doc = map[string]any{parts[i]: doc}
		}
		b, _ := yaml.Marshal(doc)
		if err := yaml.Unmarshal(b, &viaYAML); err != nil {
			t.Fatalf("%s: %v", fd.path, err)
		}
		if !reflect.DeepEqual(viaFlag, viaYAML) {
			t.Errorf("-%s and %s set different fields", fd.flag.Name, fd.path)
		}
		checked++
	}
	if checked < 20 {
		t.Fatalf("only %d string flags checked", checked)
	}
}
