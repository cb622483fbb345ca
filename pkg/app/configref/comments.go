package configref

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"unicode"
)

// module is gpustore's module path: its packages' sources are read for
// doc comments.
const module = "github.com/gpustore/gpustore/"

// Comments returns a function giving the doc comment of a field of a
// gpustore configuration struct, read from the sources under root (the
// module's directory). A field without a comment of its own that directly
// follows one with a comment (no blank line between) shares that comment:
// one comment often describes a group of fields.
func Comments(root string) func(reflect.Type, string) string {
	cache := map[string]map[string]string{} // package path → "Type.Field" → comment
	return func(t reflect.Type, name string) string {
		pkg := t.PkgPath()
		rel, ok := strings.CutPrefix(pkg, module)
		if !ok {
			return ""
		}
		docs, ok := cache[pkg]
		if !ok {
			docs = packageComments(filepath.Join(root, filepath.FromSlash(rel)))
			cache[pkg] = docs
		}
		return docs[t.Name()+"."+name]
	}
}

// packageComments reads the struct field comments of the non-test Go files
// in dir.
func packageComments(dir string) map[string]string {
	out := map[string]string{}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return out
	}
	fset := token.NewFileSet()
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, n), nil, parser.ParseComments)
		if err != nil {
			continue
		}
		ast.Inspect(f, func(node ast.Node) bool {
			ts, ok := node.(*ast.TypeSpec)
			if !ok {
				return true
			}
			if st, ok := ts.Type.(*ast.StructType); ok {
				structComments(fset, ts.Name.Name, st, out)
			}
			return false
		})
	}
	return out
}

func structComments(fset *token.FileSet, typeName string, st *ast.StructType, out map[string]string) {
	var shared, carrier string // the last comment and the field it was written on
	prevEnd := -1
	for _, fl := range st.Fields.List {
		doc := strings.Join(strings.Fields(fl.Doc.Text()+" "+fl.Comment.Text()), " ")
		start := fset.Position(fl.Pos()).Line
		if fl.Doc != nil {
			start = fset.Position(fl.Doc.Pos()).Line
		}
		contiguous := start == prevEnd+1
		prevEnd = fset.Position(fl.End()).Line
		if doc != "" {
			shared, carrier = doc, ""
			if len(fl.Names) > 0 {
				carrier = fl.Names[0].Name
			}
		}
		for _, id := range fl.Names {
			switch {
			case doc != "":
				out[typeName+"."+id.Name] = doc
			case contiguous && sharedBy(shared, carrier, id.Name):
				out[typeName+"."+id.Name] = shared
			}
		}
		if doc == "" && !contiguous {
			shared, carrier = "", ""
		}
	}
}

// sharedBy reports whether a comment written on the field carrier also
// describes the field name below it: it names that field, or it is about a
// group rather than about carrier alone (it does not begin with carrier's
// name, as "Scheme and Client are ..." does).
func sharedBy(comment, carrier, name string) bool {
	if comment == "" {
		return false
	}
	for _, w := range strings.FieldsFunc(comment, func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) }) {
		if w == name {
			return true
		}
	}
	return carrier == "" || !strings.HasPrefix(comment, carrier+" ")
}
