package rules

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/grafana/dskit/tenant"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"

	rulepack "github.com/gpustore/gpustore/deploy/rules"
)

// PackPrefix names the embedded GPU pack's files in /api/v1/rules and in the
// rule_group label of the rule metrics: "embedded:gpu-pack/gpu-alerts.yml".
const PackPrefix = "embedded:gpu-pack/"

// ruleFile is one rule file's name and content, read once per (re)load so
// that what was checked is what is evaluated.
type ruleFile struct {
	name    string
	content []byte
}

// packFiles returns the embedded GPU pack.
func packFiles() ([]ruleFile, error) {
	var out []ruleFile
	for _, n := range rulepack.Files() {
		b, err := fs.ReadFile(rulepack.FS, n)
		if err != nil {
			return nil, fmt.Errorf("read embedded rule file %s: %w", n, err)
		}
		out = append(out, ruleFile{name: PackPrefix + n, content: b})
	}
	return out, nil
}

// isRuleFile says whether a directory entry name is a rule file.
func isRuleFile(name string) bool {
	return !strings.HasPrefix(name, ".") && (strings.HasSuffix(name, ".yml") || strings.HasSuffix(name, ".yaml"))
}

// scanDir lists the rule files of the rules directory by tenant: files at
// the top belong to defaultTenant, files in a subdirectory to the tenant it
// names. Entries starting with "." are skipped (Kubernetes ConfigMap volumes
// keep their real files under ..data). Problems with single entries (an
// invalid tenant name, top-level files without a default tenant) are
// returned as warnings; the error is for a directory that cannot be read.
func scanDir(dir, defaultTenant string) (map[string][]string, []error, error) {
	out := map[string][]string{}
	if dir == "" {
		return out, nil, nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("read rules dir: %w", err)
	}
	var warnings []error
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		path := filepath.Join(dir, name)
		st, err := os.Stat(path) // follows symlinks
		if err != nil {
			warnings = append(warnings, fmt.Errorf("rules dir entry %s: %w", path, err))
			continue
		}
		if !st.IsDir() {
			if !isRuleFile(name) {
				continue
			}
			if defaultTenant == "" {
				warnings = append(warnings, fmt.Errorf("rule file %s is for the default tenant, but no default tenant is configured (tenants.default_tenant): ignored", path))
				continue
			}
			out[defaultTenant] = append(out[defaultTenant], path)
			continue
		}
		if err := tenant.ValidTenantID(name); err != nil {
			warnings = append(warnings, fmt.Errorf("rules dir %s: %q is not a valid tenant: %w", path, name, err))
			continue
		}
		sub, err := os.ReadDir(path)
		if err != nil {
			warnings = append(warnings, fmt.Errorf("read rules dir of tenant %s: %w", name, err))
			continue
		}
		if _, ok := out[name]; !ok {
			out[name] = nil // a tenant with an empty directory is still known
		}
		for _, f := range sub {
			if !isRuleFile(f.Name()) {
				continue
			}
			p := filepath.Join(path, f.Name())
			if st, err := os.Stat(p); err != nil || st.IsDir() {
				continue
			}
			out[name] = append(out[name], p)
		}
	}
	for t := range out {
		sort.Strings(out[t])
		out[t] = slices.Compact(out[t])
	}
	return out, warnings, nil
}

// readFiles reads the named files.
func readFiles(paths []string) ([]ruleFile, []error) {
	var out []ruleFile
	var errs []error
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, ruleFile{name: p, content: b})
	}
	return out, errs
}

// checkFiles parses every file with Prometheus' rulefmt (syntax, PromQL,
// templates, duplicate groups within a file) and returns every error, each
// naming its file, and the names of the groups defined.
func checkFiles(files []ruleFile, p parser.Parser, logger *slog.Logger) (map[string]bool, []error) {
	var errs []error
	groups := map[string]bool{}
	for _, f := range files {
		rgs, ferrs := rulefmt.Parse(f.content, false, model.UTF8Validation, p, logger)
		for _, err := range ferrs {
			errs = append(errs, fmt.Errorf("%s: %w", f.name, err))
		}
		if rgs == nil {
			continue
		}
		for _, g := range rgs.Groups {
			groups[g.Name] = true
		}
	}
	return groups, errs
}

// snapshotLoader is a rules.GroupLoader serving the contents read (and
// checked) for the current load, so the manager never re-reads a file that
// may have changed in between.
//
// A tenant's own group replaces the GPU pack's group of the same name: the
// loader drops overridden groups from the pack's files.
type snapshotLoader struct {
	parser     parser.Parser
	logger     *slog.Logger
	files      map[string][]byte
	overridden map[string]bool
	// owns, when set, keeps only the groups this ruler evaluates (with the
	// ring, the rulers share them out).
	owns func(file, group string) bool
	// shared are expressions parsed once for every tenant (the pack's).
	shared map[string]parser.Expr
}

func (l *snapshotLoader) Load(name string, ignoreUnknownFields bool, scheme model.ValidationScheme) (*rulefmt.RuleGroups, []error) {
	b, ok := l.files[name]
	if !ok {
		return nil, []error{fmt.Errorf("%s: %w", name, errors.New("rule file not loaded"))}
	}
	rgs, errs := rulefmt.Parse(b, ignoreUnknownFields, scheme, l.parser, l.logger)
	for i := range errs {
		errs[i] = fmt.Errorf("%s: %w", name, errs[i])
	}
	if rgs != nil && strings.HasPrefix(name, PackPrefix) && len(l.overridden) > 0 {
		rgs.Groups = slices.DeleteFunc(rgs.Groups, func(g rulefmt.RuleGroup) bool { return l.overridden[g.Name] })
	}
	if rgs != nil && l.owns != nil {
		rgs.Groups = slices.DeleteFunc(rgs.Groups, func(g rulefmt.RuleGroup) bool { return !l.owns(name, g.Name) })
	}
	return rgs, errs
}

func (l *snapshotLoader) Parse(query string) (parser.Expr, error) {
	if e, ok := l.shared[query]; ok {
		return e, nil
	}
	return l.parser.ParseExpr(query)
}
