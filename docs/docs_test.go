// Package docs holds gpustore's documentation pages; its tests keep them
// and the README true to the code: the README short, every relative link
// resolving, every gpustore flag a page names existing, and the defaults
// the pages' flag tables state being the flags' defaults.
package docs

import (
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

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

var link = regexp.MustCompile(`\]\(([^)\s]+)\)|<img src="([^"]+)"`)

// Every relative link of the README and the pages points at a file or
// directory that exists, and a link to a page's section at a heading of it.
func TestLinksResolve(t *testing.T) {
	for file, text := range pages(t) {
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
				b, err := os.ReadFile(resolved)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Contains(anchors(string(b)), anchor) {
					t.Errorf("%s: link %s: %s has no heading with that anchor", file, target, resolved)
				}
			}
		}
	}
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
