package xid

import (
	"bytes"
	"io/fs"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/common/promslog"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"

	rulepack "github.com/gpustore/gpustore/deploy/rules"
	"github.com/gpustore/gpustore/pkg/rules/xid/xidtable"
)

// The codes the rule pack promises to decode.
var required = []int{13, 31, 32, 38, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 109, 119, 120, 121, 140, 143, 154}

func TestCatalogIsSortedAndUnique(t *testing.T) {
	for i := 1; i < len(catalog); i++ {
		if catalog[i-1].Code >= catalog[i].Code {
			t.Errorf("catalog not strictly sorted at %d: %d then %d", i, catalog[i-1].Code, catalog[i].Code)
		}
	}
}

func TestRequiredCodesPresent(t *testing.T) {
	for _, c := range required {
		if _, ok := Lookup(c); !ok {
			t.Errorf("Xid %d missing from the catalogue", c)
		}
	}
}

var mnemonicRE = regexp.MustCompile(`^[A-Z0-9_]+$`)

func TestEntriesComplete(t *testing.T) {
	known := map[Action]bool{
		RestartApp: true, ResetGPU: true, RestartBM: true, Ignore: true, ContactSupport: true,
		CheckMechanicals: true, WorkflowXid45: true, WorkflowXid48: true, WorkflowNVLink: true,
		WorkflowNVLink5: true, Xid154: true, RestartVM: true, UpdateSWFW: true, CheckUVM: true, Unconfirmed: true,
	}
	for _, e := range catalog {
		if !mnemonicRE.MatchString(e.Mnemonic) {
			t.Errorf("Xid %d: mnemonic %q is not an NVIDIA-style identifier", e.Code, e.Mnemonic)
		}
		if len(e.Meaning) < 10 {
			t.Errorf("Xid %d: meaning %q too short", e.Code, e.Meaning)
		}
		if !known[e.Action] {
			t.Errorf("Xid %d: unknown action %q", e.Code, e.Action)
		}
		if e.Action.Detail() == Action("NOPE").Detail() {
			t.Errorf("Xid %d: action %q has no instruction text", e.Code, e.Action)
		}
		if e.Severity() == "" {
			t.Errorf("Xid %d: priority %q has no severity", e.Code, e.Priority)
		}
	}
}

// Priorities follow the action-based policy unless the entry says why not,
// and a reason is only given where the policy is actually overridden.
func TestPriorityPolicy(t *testing.T) {
	for _, e := range catalog {
		def := DefaultPriority(e.Action)
		switch {
		case e.Why == "" && e.Priority != def:
			t.Errorf("Xid %d: priority %s differs from the default %s for %s without a reason", e.Code, e.Priority, def, e.Action)
		case e.Why != "" && e.Priority == def:
			t.Errorf("Xid %d: has a reason for overriding but keeps the default %s", e.Code, def)
		}
	}
}

// Issue 31 item 6: codes whose severity the Xid alone cannot tell page P1,
// not P0. Xid 74's bit pattern (in the kernel log only) decides between a
// link-level retry and a reset; Xid 155 includes links taken down on purpose;
// Xid 154 only announces a recovery action, which the pack pages from the
// action's own field (GPURecoveryActionRequired, P0 for a reset or reboot):
// paging 154 P0 as well was a second page for one event; and codes past the
// catalogue are new driver codes (R620 logs a sparing event as 185), not
// failures by default. Each override says why.
func TestIssue31Priorities(t *testing.T) {
	for code, want := range map[int]Priority{74: P1, 155: P1, 154: P2} {
		e, ok := Lookup(code)
		if !ok || e.Priority != want {
			t.Errorf("Xid %d: priority %q, want %s", code, e.Priority, want)
		}
		if e.Action != Xid154 && e.Why == "" {
			t.Errorf("Xid %d: override without a reason", code)
		}
	}
	if UnknownPriority != P1 {
		t.Errorf("codes outside the catalogue page %s, want P1", UnknownPriority)
	}
	if _, ok := Lookup(185); ok {
		t.Error("Xid 185 is in the catalogue: this test wants an uncatalogued code")
	}
}

// Facts checked against NVIDIA's Xid catalog (immediate action column); they
// guard against an accidental edit of the codes the alerts rely on most.
func TestKnownNVIDIAActions(t *testing.T) {
	want := map[int]Action{
		13: RestartApp, 31: RestartApp, 43: Ignore, 45: WorkflowXid45, 48: WorkflowXid48,
		63: Ignore, 64: ResetGPU, 74: WorkflowNVLink, 79: RestartBM, 94: RestartApp,
		95: ResetGPU, 119: ResetGPU, 154: Xid154,
		// Issue 17: codes NVIDIA classes RESTART_APP or IGNORE that the
		// first table lacked, so they paged P0 as unknown.
		11: RestartApp, 14: Ignore, 25: RestartApp, 37: Ignore, 39: RestartApp, 40: RestartApp, 41: RestartApp,
		44: Ignore, 60: RestartApp, 66: Ignore, 67: Ignore, 70: RestartApp, 71: RestartApp, 72: RestartApp,
		75: RestartApp, 76: RestartApp, 77: RestartApp, 80: RestartApp, 82: RestartApp, 83: RestartApp,
		84: RestartApp, 85: RestartApp, 86: RestartApp, 88: RestartApp, 89: RestartApp, 93: Ignore,
		96: RestartApp, 97: RestartApp, 98: RestartApp, 99: RestartApp, 100: RestartApp, 101: RestartApp,
		102: RestartApp, 103: RestartApp, 104: RestartApp, 105: RestartApp, 106: Ignore, 107: Ignore,
		141: Ignore, 157: Ignore,
		149: WorkflowNVLink5, 150: WorkflowNVLink5,
	}
	for code, a := range want {
		e, ok := Lookup(code)
		if !ok || e.Action != a {
			t.Errorf("Xid %d: action %q, want %q", code, e.Action, a)
		}
	}
}

// Issue 17 items 1 and 2: Xid 149 and 150 need a GPU reset for (almost)
// every subcode NVIDIA decodes, so both page P0; and none of the
// RESTART_APP/IGNORE codes added pages above P1. (Xid 154: issue 31.)
func TestIssue17Priorities(t *testing.T) {
	for _, code := range []int{149, 150} {
		if e, ok := Lookup(code); !ok || e.Priority != P0 {
			t.Errorf("Xid %d: priority %q, want P0", code, e.Priority)
		}
	}
	for _, e := range catalog {
		if (e.Action == RestartApp || e.Action == Ignore) && e.Priority == P0 {
			t.Errorf("Xid %d (%s) pages P0", e.Code, e.Action)
		}
	}
	if e, _ := Lookup(45); !strings.Contains(e.Action.Detail(), "RESTART_FM") {
		t.Errorf("Xid 45 detail %q does not name NVIDIA's RESTART_FM", e.Action.Detail())
	}
}

// catalog_gen.go must be what gen/table makes from catalog.tsv now.
func TestGeneratedTableUpToDate(t *testing.T) {
	f, err := os.Open("catalog.tsv")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := xidtable.Parse(f)
	if err != nil {
		t.Fatal(err)
	}
	want, err := xidtable.GoSource(rows)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("catalog_gen.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("catalog_gen.go is out of date with catalog.tsv: run `go generate ./pkg/rules/xid/`")
	}
	if len(rows) != len(catalog) {
		t.Fatalf("%d rows, %d entries", len(rows), len(catalog))
	}
}

func TestSeverityMapping(t *testing.T) {
	for p, s := range map[Priority]string{P0: "critical", P1: "warning", P2: "info", "P9": ""} {
		if got := p.Severity(); got != s {
			t.Errorf("%s.Severity() = %q, want %q", p, got, s)
		}
	}
}

func TestLookupAndDescribe(t *testing.T) {
	e, ok := Lookup(79)
	if !ok || e.Mnemonic != "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS" || e.Priority != P0 {
		t.Fatalf("Lookup(79) = %+v, %v", e, ok)
	}
	if d := Describe(79); !strings.Contains(d, e.Meaning) || !strings.Contains(d, "RESTART_BM") {
		t.Errorf("Describe(79) = %q", d)
	}
	if _, ok := Lookup(9999); ok {
		t.Error("Lookup(9999) found an entry")
	}
	if d := Describe(9999); !strings.Contains(d, "not in gpustore's catalogue") {
		t.Errorf("Describe(9999) = %q", d)
	}
	all := All()
	all[0].Code = -1
	if catalog[0].Code == -1 {
		t.Error("All() returned the internal slice")
	}
}

// The shipped deploy/rules/xid-catalog.yml must be exactly what the generator
// writes now; regenerate with `go generate ./pkg/rules/xid/`.
func TestGeneratedFileUpToDate(t *testing.T) {
	shipped, err := fs.ReadFile(rulepack.FS, "xid-catalog.yml")
	if err != nil {
		t.Fatalf("read embedded xid-catalog.yml: %v", err)
	}
	if !bytes.Equal(shipped, RuleFile()) {
		t.Fatal("deploy/rules/xid-catalog.yml is out of date: run `go generate ./pkg/rules/xid/`")
	}
}

// The rendered file is a valid rule file whose rules carry each entry's
// fields, so the YAML quoting cannot silently mangle a meaning.
func TestRuleFileParses(t *testing.T) {
	p := parser.NewParser(parser.Options{})
	groups, errs := rulefmt.Parse(RuleFile(), false, model.UTF8Validation, p, promslog.NewNopLogger())
	if len(errs) > 0 {
		t.Fatalf("parse: %v", errs)
	}
	if len(groups.Groups) != 1 || groups.Groups[0].Name != GroupName {
		t.Fatalf("groups = %+v", groups.Groups)
	}
	rules := groups.Groups[0].Rules
	if len(rules) != len(catalog) {
		t.Fatalf("%d rules for %d entries", len(rules), len(catalog))
	}
	for i, r := range rules {
		e := catalog[i]
		if r.Record != RecordName || r.Expr != "vector(1)" {
			t.Errorf("rule %d: record %q expr %q", i, r.Record, r.Expr)
		}
		want := map[string]string{
			"xid": strconv.Itoa(e.Code), "mnemonic": e.Mnemonic, "meaning": e.Meaning,
			"action": string(e.Action), "action_detail": e.Action.Detail(),
			"priority": string(e.Priority), "severity": e.Severity(),
		}
		if len(r.Labels) != len(want) {
			t.Errorf("Xid %d: labels %v", e.Code, r.Labels)
		}
		for k, v := range want {
			if r.Labels[k] != v {
				t.Errorf("Xid %d: label %s = %q, want %q", e.Code, k, r.Labels[k], v)
			}
		}
	}
}
