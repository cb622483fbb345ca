// Package configref writes gpustore's configuration reference, every flag
// and every key of the YAML file with its default and what it does, from
// the code itself: the flags gpustore registers (their usage), the
// defaults (app.DefaultConfig) and, for keys no flag sets, the Go doc
// comment of the configuration field. docs/configuration.md holds it
// (`make docs`); a test fails while it is stale, so it cannot drift.
package configref

import (
	"flag"
	"fmt"
	"reflect"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/gpustore/gpustore/pkg/app"
)

// field is one key of the YAML file that the reference describes: a leaf
// (a value, list, map, or a struct of another module shown whole).
type field struct {
	path      string // dotted YAML path, e.g. server.listen_address
	typ       reflect.Type
	addr      uintptr
	size      uintptr
	doc       string // the Go doc comment, "" when none
	flag      *flag.Flag
	flagWhole bool // flag sets the whole field (not a part of it)
}

// Reference is the configuration's flags and YAML keys, joined by the
// fields the flags are bound to.
type Reference struct {
	cfg    app.Config
	flags  []*flag.Flag
	fields []*field // in YAML order
	byPath map[string]*field
}

// New reads the default configuration and its flags; docs gives a
// configuration struct field's doc comment (Comments).
func New(docs func(structType reflect.Type, fieldName string) string) *Reference {
	r := &Reference{cfg: app.DefaultConfig(), byPath: map[string]*field{}}
	fs := flag.NewFlagSet("gpustore", flag.ContinueOnError)
	app.BindFlags(fs, &r.cfg)
	app.BindCommandFlags(fs)
	fs.VisitAll(func(f *flag.Flag) { r.flags = append(r.flags, f) })
	r.walk(reflect.ValueOf(&r.cfg).Elem(), "", docs)
	for _, f := range r.flags {
		for _, p := range targets(f.Value) {
			if r.bind(f, p) {
				break
			}
		}
	}
	return r
}

// targets are the addresses a flag's value may write to: the value itself
// when it is a pointer, and the pointers a struct behind it holds (a list
// flag wrapping the slice it appends to).
func targets(v flag.Value) []uintptr {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return nil
	}
	out := []uintptr{rv.Pointer()}
	if e := rv.Elem(); e.Kind() == reflect.Struct {
		for i := range e.NumField() {
			if fv := e.Field(i); fv.Kind() == reflect.Pointer && !fv.IsNil() {
				out = append(out, fv.Pointer())
			}
		}
	}
	return out
}

// bind records f as the flag of the field at (or holding) address p.
func (r *Reference) bind(f *flag.Flag, p uintptr) bool {
	for _, fd := range r.fields {
		if p >= fd.addr && p < fd.addr+max(fd.size, 1) {
			fd.flag, fd.flagWhole = f, p == fd.addr
			return true
		}
	}
	return false
}

// ownStructs are the modules whose configuration structs are described key
// by key; a struct of any other module (Prometheus' HTTP client config) is
// one key, shown whole.
var ownStructs = []string{"github.com/gpustore/gpustore/", "github.com/grafana/dskit/"}

func described(t reflect.Type) bool {
	if t.Kind() != reflect.Struct {
		return false
	}
	for _, p := range ownStructs {
		if strings.HasPrefix(t.PkgPath(), p) {
			return true
		}
	}
	return false
}

// yamlName returns a struct field's YAML key, whether it is inlined, and
// whether it is in the file at all.
func yamlName(sf reflect.StructField) (name string, inline, ok bool) {
	tag := sf.Tag.Get("yaml")
	if tag == "-" || !sf.IsExported() {
		return "", false, false
	}
	name, opts, _ := strings.Cut(tag, ",")
	if strings.Contains(opts, "inline") {
		return "", true, true
	}
	if name == "" {
		name = strings.ToLower(sf.Name)
	}
	return name, false, true
}

func (r *Reference) walk(v reflect.Value, prefix string, docs func(reflect.Type, string) string) {
	t := v.Type()
	for i := range t.NumField() {
		sf := t.Field(i)
		name, inline, ok := yamlName(sf)
		if !ok {
			continue
		}
		fv := v.Field(i)
		if inline {
			r.walk(fv, prefix, docs)
			continue
		}
		path := prefix + name
		if described(sf.Type) {
			r.walk(fv, path+".", docs)
			continue
		}
		fd := &field{path: path, typ: sf.Type, addr: fv.Addr().Pointer(), size: sf.Type.Size(), doc: ownName(docs(t, sf.Name), sf.Name, name)}
		r.fields = append(r.fields, fd)
		r.byPath[path] = fd
	}
}

// ownName makes a doc comment that begins with its Go field's name ("Allowed,
// when not empty, is ...") begin with the YAML key instead.
func ownName(doc, goName, key string) string {
	rest, ok := strings.CutPrefix(doc, goName)
	if ok && !strings.HasPrefix(rest, " and ") && (rest == "" || rest[0] == ' ' || rest[0] == ',') {
		return key + rest
	}
	return doc
}

// Undescribed lists the YAML keys with neither a flag setting them nor a
// doc comment.
func (r *Reference) Undescribed() []string {
	var out []string
	for _, fd := range r.fields {
		if r.description(fd) == "" {
			out = append(out, fd.path)
		}
	}
	return out
}

// description is the key's flag usage, else its doc comment.
func (r *Reference) description(fd *field) string {
	if fd.flag != nil && fd.flagWhole {
		return fd.flag.Usage
	}
	return fd.doc
}

// Markdown is the generated part of docs/configuration.md: a table of every
// flag and the YAML file with every key's default and description.
func (r *Reference) Markdown() (string, error) {
	var b strings.Builder
	b.WriteString("## Flags\n\n")
	b.WriteString("Every flag of `gpustore -h`, its default, and the YAML key it sets (a flag given on the command line wins over the file).\n\n")
	b.WriteString("| flag | default | YAML key | |\n|---|---|---|---|\n")
	keyOf := map[*flag.Flag]string{}
	for _, fd := range r.fields {
		if fd.flag != nil {
			keyOf[fd.flag] = fd.path
			if !fd.flagWhole {
				keyOf[fd.flag] += " (part)"
			}
		}
	}
	flags := append([]*flag.Flag(nil), r.flags...)
	sort.Slice(flags, func(i, j int) bool { return flags[i].Name < flags[j].Name })
	for _, f := range flags {
		def, key := "", ""
		if f.DefValue != "" {
			def = "`" + f.DefValue + "`"
		}
		if k := keyOf[f]; k != "" {
			key = "`" + k + "`"
		}
		fmt.Fprintf(&b, "| `-%s` | %s | %s | %s |\n", f.Name, def, key, cell(f.Usage))
	}
	y, err := r.YAML()
	if err != nil {
		return "", err
	}
	b.WriteString("\n## YAML file\n\n")
	b.WriteString("The whole file with every default; a key left out keeps its default. Keys a flag sets name it.\n\n")
	b.WriteString("```yaml\n" + y + "```\n")
	return b.String(), nil
}

// cell makes text fit a Markdown table cell.
func cell(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "|", `\|`), "\n", " ")
}

// YAML is the default configuration as a YAML file, each key preceded by
// its description and flag.
func (r *Reference) YAML() (string, error) {
	var root yaml.Node
	if err := root.Encode(&r.cfg); err != nil {
		return "", err
	}
	r.comment(&root, "")
	var b strings.Builder
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&root); err != nil {
		return "", err
	}
	if err := enc.Close(); err != nil {
		return "", err
	}
	return b.String(), nil
}

// comment puts each described key's text above it, walking the mapping
// nodes down to the reference's fields. A key the encoder left out (empty,
// omitempty) is added with its empty value, so that every key is shown.
func (r *Reference) comment(n *yaml.Node, prefix string) {
	if n.Kind != yaml.MappingNode {
		return
	}
	present := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		present[n.Content[i].Value] = true
	}
	for _, fd := range r.fields {
		name, ok := strings.CutPrefix(fd.path, prefix)
		if !ok || strings.Contains(name, ".") || present[name] {
			continue
		}
		var v yaml.Node
		if err := v.Encode(reflect.Zero(fd.typ).Interface()); err != nil || v.Kind == 0 {
			continue
		}
		n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: name}, &v)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		path := prefix + k.Value
		fd, ok := r.byPath[path]
		if !ok {
			r.comment(v, path+".")
			continue
		}
		text := r.description(fd)
		if fd.flag != nil {
			text = "-" + fd.flag.Name + ": " + text
		}
		k.HeadComment = wrap(text, 96)
	}
}

// wrap breaks text into lines of at most width characters.
func wrap(text string, width int) string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(text) {
		if line != "" && len(line)+1+len(w) > width {
			lines = append(lines, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += w
	}
	if line != "" {
		lines = append(lines, line)
	}
	return strings.Join(lines, "\n")
}

// The generated reference sits between these lines of its page; the text
// around them is written by hand.
const (
	BeginMarker = "<!-- BEGIN GENERATED REFERENCE: `make docs` writes what follows, from the code; do not edit it by hand. -->"
	EndMarker   = "<!-- END GENERATED REFERENCE -->"
)

// Update returns page with its generated part replaced by r's reference.
func Update(page string, r *Reference) (string, error) {
	before, rest, ok := strings.Cut(page, BeginMarker)
	_, after, ok2 := strings.Cut(rest, EndMarker)
	if !ok || !ok2 {
		return "", fmt.Errorf("the page lacks the markers %q and %q", BeginMarker, EndMarker)
	}
	md, err := r.Markdown()
	if err != nil {
		return "", err
	}
	return before + BeginMarker + "\n\n" + md + "\n" + EndMarker + after, nil
}

// Generated returns the generated part of page, between its markers.
func Generated(page string) (string, bool) {
	_, rest, ok := strings.Cut(page, BeginMarker)
	gen, _, ok2 := strings.Cut(rest, EndMarker)
	return gen, ok && ok2
}
