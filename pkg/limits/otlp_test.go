package limits

import (
	"strings"
	"testing"
)

// A tenant's otlp block is checked with Prometheus' rules when the file is
// loaded: a bad block refuses the file, a good one keeps the defaults of
// the fields it leaves out.
func TestOTLPOverrides(t *testing.T) {
	for _, bad := range []string{
		"overrides:\n  t:\n    otlp:\n      translation_strategy: Whatever\n",
		"overrides:\n  t:\n    otlp:\n      promote_all_resource_attributes: true\n      promote_resource_attributes: [a]\n",
		"overrides:\n  t:\n    otlp:\n      promote_resource_attributes: [a, a]\n",
		"overrides:\n  t:\n    otlp:\n      ignore_resource_attributes: [a]\n",
		"overrides:\n  t:\n    otlp:\n      convert_delta: true\n",
	} {
		if _, err := Load(strings.NewReader(bad), Defaults()); err == nil {
			t.Errorf("accepted:\n%s", bad)
		}
	}
	f, err := Load(strings.NewReader("overrides:\n  t:\n    otlp:\n      translation_strategy: NoUTF8EscapingWithSuffixes\n      convert_delta_to_cumulative: true\n"), Defaults())
	if err != nil {
		t.Fatal(err)
	}
	o := f.Overrides["t"].OTLP
	if o.TranslationStrategy != "NoUTF8EscapingWithSuffixes" || !o.ConvertDeltaToCumulative || !o.LabelNameUnderscoreSanitization || !o.LabelNamePreserveMultipleUnderscores {
		t.Errorf("otlp block %+v", o)
	}
}
