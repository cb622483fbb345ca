package xidtable

import (
	"strings"
	"testing"
)

const header = "code\tmnemonic\tapplies_to\timmediate_action\tpriority\twhy\tmeaning\n"

func TestParseGood(t *testing.T) {
	rows, err := Parse(strings.NewReader("# comment\n\n" + header +
		"13\tROBUST_CHANNEL_GR_EXCEPTION\tA100,H100\tRESTART_APP\tP2\t\tgraphics engine exception\n" +
		"61\tPMU_BREAKPOINT\t\tCONTACT_SUPPORT\tP1\t\tmicro-controller breakpoint\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0].Code != 13 || rows[0].AppliesTo != "A100,H100" || rows[1].AppliesTo != "" {
		t.Fatalf("rows %+v", rows)
	}
	src, err := GoSource(rows)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`Code: 13`, `Action: Action("RESTART_APP")`, `AppliesTo: []string{"A100", "H100"}`, "DO NOT EDIT"} {
		if !strings.Contains(string(src), want) {
			t.Errorf("generated source lacks %s:\n%s", want, src)
		}
	}
}

// A transcription mistake is reported with its line, not rendered.
func TestParseRejects(t *testing.T) {
	for name, body := range map[string]string{
		"no header":      "13\tX\t\tIGNORE\tP2\t\tsome meaning here\n",
		"bad header":     "code\tmnemonic\n",
		"short row":      header + "13\tX\tA100\tIGNORE\tP2\n",
		"bad code":       header + "x\tX\tA100\tIGNORE\tP2\t\tsome meaning here\n",
		"bad mnemonic":   header + "13\tnot upper\tA100\tIGNORE\tP2\t\tsome meaning here\n",
		"bad priority":   header + "13\tX\tA100\tIGNORE\tP5\t\tsome meaning here\n",
		"bad action":     header + "13\tX\tA100\t\tP2\t\tsome meaning here\n",
		"unsorted":       header + "13\tX\tA100\tIGNORE\tP2\t\tsome meaning here\n8\tY\tA100\tIGNORE\tP2\t\tsome meaning here\n",
		"duplicate":      header + "13\tX\tA100\tIGNORE\tP2\t\tsome meaning here\n13\tY\tA100\tIGNORE\tP2\t\tsome meaning here\n",
		"short meaning":  header + "13\tX\tA100\tIGNORE\tP2\t\tshort\n",
		"bad applies_to": header + "13\tX\tA100 H100\tIGNORE\tP2\t\tsome meaning here\n",
	} {
		if _, err := Parse(strings.NewReader(body)); err == nil {
			t.Errorf("%s: no error", name)
		} else if name != "no header" && !strings.Contains(err.Error(), "line") {
			t.Errorf("%s: error %q names no line", name, err)
		}
	}
}
