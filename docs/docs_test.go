// Package docs holds gpustore's documentation pages; its tests keep them
// and the README true to the code: the README short, every relative link
// of every Markdown file of the repository resolving (sections included),
// every README section named in prose existing, every gpustore flag a page
// names existing, the defaults the pages' flag tables state being the
// flags' defaults, the pages counting the GPU pack's rules right, every
// path of the repository a page names existing, and the overview's package
// graph being the code's (graph_test.go).
package docs

import (
	"flag"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"

	rulepack "github.com/gpustore/gpustore/deploy/rules"
	"github.com/gpustore/gpustore/pkg/app"
)

// pages are the README and every page of docs/.
func pages(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob("*.md")
	if err != nil || len(files) == 0 {
		t.Fatalf("no pages in docs/ (%v)", err)
	}
	out := map[string]string{}
	for _, f := range append(files, "../README.md") {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out[f] = string(b)
	}
	return out
}

// The README is what a newcomer reads in the first hour; the reference
// lives in docs/. (Issue 32: it had grown to 1,000 lines.)
func TestREADMEIsShort(t *testing.T) {
	const most = 250
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n > most {
		t.Errorf("README.md has %d lines, more than %d: move reference material to a page of docs/ and link it", n, most)
	}
}

// markdown is every Markdown file of the repository (the README, docs/,
// the READMEs of deploy/ and bench/, RESULTS), by path from docs/.
func markdown(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != ".." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "node_modules" || d.Name() == "data" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".md") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		out[filepath.Clean(path)] = string(b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"../README.md", "../docs/rules.md", "../deploy/rules/README.md", "../deploy/kubernetes/README.md", "../bench/README.md"} {
		if _, ok := out[filepath.Clean(want)]; !ok {
			t.Fatalf("%s not among the Markdown files found", want)
		}
	}
	return out
}

var link = regexp.MustCompile(`\]\(([^)\s]+)\)|<img src="([^"]+)"`)

// Every relative link of every Markdown file of the repository points at a
// file or directory that exists, and a link to a section (page.md#section,
// or #section within the page) at a heading of that page: sections get
// renamed, and five links to the README's pointed at none.
func TestLinksResolve(t *testing.T) {
	files := markdown(t)
	checked := 0
	for file, text := range files {
		for _, m := range link.FindAllStringSubmatch(text, -1) {
			target := m[1] + m[2]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, anchor, _ := strings.Cut(target, "#")
			resolved := file
			if path != "" {
				resolved = filepath.Join(filepath.Dir(file), path)
				if _, err := os.Stat(resolved); err != nil {
					t.Errorf("%s: link %s: %v", file, target, err)
					continue
				}
			}
			if anchor != "" && strings.HasSuffix(resolved, ".md") {
				page, ok := files[filepath.Clean(resolved)]
				if !ok {
					t.Fatalf("%s: link %s: %s is not among the Markdown files", file, target, resolved)
				}
				checked++
				if !slices.Contains(anchors(page), anchor) {
					t.Errorf("%s: link %s: %s has no heading with that anchor", file, target, resolved)
				}
			}
		}
	}
	if checked < 5 {
		t.Fatalf("only %d links to sections checked", checked)
	}
	t.Logf("%d links to sections checked in %d files", checked, len(files))
}

// anchors are GitHub's anchors of a page's headings: lower case, spaces to
// dashes, punctuation other than - and _ dropped.
func anchors(page string) []string {
	var out []string
	inCode := false
	for _, l := range strings.Split(page, "\n") {
		if strings.HasPrefix(l, "```") {
			inCode = !inCode
		}
		if inCode || !strings.HasPrefix(l, "#") {
			continue
		}
		h := strings.ToLower(strings.TrimSpace(strings.TrimLeft(l, "#")))
		var b strings.Builder
		for _, r := range h {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r > 127:
				b.WriteRune(r)
			}
		}
		out = append(out, b.String())
	}
	return out
}

func gpustoreFlags(t *testing.T) map[string]*flag.Flag {
	t.Helper()
	cfg := app.DefaultConfig()
	fs := flag.NewFlagSet("gpustore", flag.ContinueOnError)
	app.BindFlags(fs, &cfg)
	app.BindCommandFlags(fs)
	out := map[string]*flag.Flag{}
	fs.VisitAll(func(f *flag.Flag) { out[f.Name] = f })
	return out
}

// flagLike is a command-line flag in running text or a command: one or two
// dashes, then dotted lower-case words.
var flagLike = regexp.MustCompile("(?:^|[\\s`(\"'])--?([a-z][a-z0-9-]*(?:\\.[a-z0-9-]+)*)")

// Every gpustore flag a page names exists: a flag renamed or removed in the
// code fails here rather than leaving a page that tells users to pass it.
// Words that look like flags are checked when their first part is one of
// gpustore's flag groups (web., query., ...); other programs' flags that
// share a group name are listed in otherPrograms.
func TestPagesNameOnlyRealFlags(t *testing.T) {
	flags := gpustoreFlags(t)
	groups := map[string]bool{}
	for name := range flags {
		g, _, _ := strings.Cut(name, ".")
		groups[g] = true
	}
	otherPrograms := map[string]bool{"web.enable-remote-write-receiver": true, "web.enable-otlp-receiver": true} // Prometheus' own
	checked := 0
	for file, text := range pages(t) {
		for _, m := range flagLike.FindAllStringSubmatch(text, -1) {
			name := strings.TrimRight(m[1], ".-")
			g, _, dotted := strings.Cut(name, ".")
			if !groups[g] || (!dotted && flags[name] == nil) || otherPrograms[name] {
				continue
			}
			checked++
			if flags[name] == nil {
				t.Errorf("%s names -%s, which is no gpustore flag", file, name)
			}
		}
	}
	if checked < 50 {
		t.Fatalf("only %d flag names checked", checked)
	}
	t.Logf("%d flag names checked", checked)
}

// row is a table row naming flags and their defaults in its first two
// cells: | `--a`, `--b` | `1s`, `5m` | what they do |
var row = regexp.MustCompile("^\\| ((?:`--?[a-z0-9.-]+`(?:, )?)+) \\| ((?:`[^`]*`(?:, )?)+) \\|")

var code = regexp.MustCompile("`([^`]*)`")

// The defaults a page's flag table states are the flags' defaults.
func TestFlagTablesStateTheDefaults(t *testing.T) {
	flags := gpustoreFlags(t)
	checked := 0
	for file, text := range pages(t) {
		for _, l := range strings.Split(text, "\n") {
			m := row.FindStringSubmatch(l)
			if m == nil {
				continue
			}
			names, defs := code.FindAllStringSubmatch(m[1], -1), code.FindAllStringSubmatch(m[2], -1)
			if len(names) != len(defs) {
				continue
			}
			for i, n := range names {
				f := flags[strings.TrimLeft(n[1], "-")]
				if f == nil || strings.Contains(defs[i][1], "<") {
					continue // no flag: TestPagesNameOnlyRealFlags reports it; <...>: a default derived at start
				}
				checked++
				if defs[i][1] != f.DefValue {
					t.Errorf("%s: the table says %s defaults to %q, the flag's default is %q", file, n[1], defs[i][1], f.DefValue)
				}
			}
		}
	}
	if checked < 100 {
		t.Fatalf("only %d table defaults checked", checked)
	}
	t.Logf("%d table defaults checked", checked)
}

// readmeSection is a section of a README named in prose, as comments and
// tables name them: README "Sizing", the README's "Rules and alerts",
// (README, "Downsampling"); a comment may wrap between README and the name.
var readmeSection = regexp.MustCompile(`README(?:\.md)?(?:'s)?,?(?:\s|#|//)*"([A-Z][^"]{0,80})"`)

// wrap is where a comment wraps a quoted name onto its next line.
var wrap = regexp.MustCompile(`\s*\n\s*(?:#|//)?\s*`)

// Every README section named in prose anywhere in the repository (a
// manifest's comment, a rule file, a page) is a heading of the README it
// means: the nearest README.md at or above the file's folder (above it,
// for a README itself). Five named sections that had moved out of the
// README to docs/ when it was cut down (issue 38).
func TestREADMESectionsNamedExist(t *testing.T) {
	checked := 0
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != ".." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "node_modules" || d.Name() == "data" || d.Name() == "bin" || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(path) {
		case ".md", ".go", ".yml", ".yaml", ".sh", ".json", ".jsonnet", ".libsonnet", "":
		default:
			return nil
		}
		if path == filepath.Join("..", "bench", "RESULTS.md") || path == filepath.Join("..", "docs", "docs_test.go") {
			return nil // a log naming sections as they were on its dates; this test's examples
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range readmeSection.FindAllStringSubmatch(string(b), -1) {
			readme := nearestREADME(t, path)
			page, err := os.ReadFile(readme)
			if err != nil {
				t.Fatal(err)
			}
			name := wrap.ReplaceAllString(m[1], " ")
			checked++
			if !slices.Contains(anchors(string(page)), anchors("# " + name)[0]) {
				t.Errorf("%s names the section %q of %s, which has no such heading", path, name, readme)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 5 {
		t.Fatalf("only %d README sections named in prose checked", checked)
	}
	t.Logf("%d README sections named in prose checked", checked)
}

// nearestREADME is the README.md a file means by "README": the nearest at or
// above its folder, above it for a README itself.
func nearestREADME(t *testing.T, path string) string {
	t.Helper()
	dir := filepath.Dir(path)
	if filepath.Base(path) == "README.md" {
		dir = filepath.Dir(dir)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "README.md")); err == nil {
			return filepath.Join(dir, "README.md")
		}
		if dir == ".." {
			t.Fatalf("%s: no README.md above it", path)
		}
		dir = filepath.Dir(dir)
	}
}

// packCount is how docs/rules.md and deploy/rules/README.md count the GPU
// pack's rules.
var packCount = map[string]*regexp.Regexp{
	"rules.md":                  regexp.MustCompile(`Its (\d+) rules \((\d+) alerts, (\d+) recording rules\s+and the (\d+) series of the Xid catalogue\)`),
	"../deploy/rules/README.md": regexp.MustCompile(`The pack has (\d+) alerts and (\d+) recording rules besides the (\d+)\s+catalogue series`),
}

// The pages count the GPU pack's rules as the embedded pack has them (a
// new user read "~140" of a pack of 158).
func TestPackRuleCounts(t *testing.T) {
	var alerts, recording, catalogue int
	for _, name := range rulepack.Files() {
		b, err := fs.ReadFile(rulepack.FS, name)
		if err != nil {
			t.Fatal(err)
		}
		groups, errs := rulefmt.Parse(b, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
		if len(errs) > 0 {
			t.Fatalf("%s: %v", name, errs)
		}
		for _, g := range groups.Groups {
			for _, r := range g.Rules {
				switch {
				case r.Alert != "":
					alerts++
				case r.Record == "gpu:xid_catalog:info":
					catalogue++
				default:
					recording++
				}
			}
		}
	}
	want := map[string][]int{
		"rules.md":                  {alerts + recording + catalogue, alerts, recording, catalogue},
		"../deploy/rules/README.md": {alerts, recording, catalogue},
	}
	for file, re := range packCount {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		m := re.FindStringSubmatch(string(b))
		if m == nil {
			t.Errorf("%s does not count the pack's rules as %s", file, re)
			continue
		}
		var got []int
		for _, s := range m[1:] {
			n, _ := strconv.Atoi(s)
			got = append(got, n)
		}
		if !slices.Equal(got, want[file]) {
			t.Errorf("%s counts the pack's rules %v (%q), the pack has %v", file, got, m[0], want[file])
		}
	}
}
