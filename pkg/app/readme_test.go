package app

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// The README's configuration section shows the YAML file's shape with the
// defaults: it must load, and must say what DefaultConfig says, so the
// README stays true as sections are added.
func TestREADMEConfigurationIsTheDefault(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "## Configuration")
	if i < 0 {
		t.Fatal("README has no Configuration section")
	}
	s = s[i:]
	start := strings.Index(s, "```yaml\n")
	end := strings.Index(s[start+8:], "```")
	if start < 0 || end < 0 {
		t.Fatal("no yaml block in the Configuration section")
	}
	file := filepath.Join(t.TempDir(), "gpustore.yml")
	if err := os.WriteFile(file, []byte(s[start+8:start+8+end]), 0o644); err != nil {
		t.Fatal(err)
	}
	fromFile, _, err := Load(flag.NewFlagSet("f", flag.ContinueOnError), []string{"-config.file=" + file})
	if err != nil {
		t.Fatalf("README configuration does not load: %v", err)
	}
	defaults, _, err := Load(flag.NewFlagSet("d", flag.ContinueOnError), nil)
	if err != nil {
		t.Fatal(err)
	}
	// memberlist's many knobs are dskit's and not repeated in the README.
	fromFile.Memberlist = defaults.Memberlist
	a, err := yaml.Marshal(fromFile)
	if err != nil {
		t.Fatal(err)
	}
	d, err := yaml.Marshal(defaults)
	if err != nil {
		t.Fatal(err)
	}
	if string(a) != string(d) {
		t.Errorf("README configuration differs from the defaults:\nREADME:\n%s\ndefaults:\n%s", a, d)
	}
	// Every section of the configuration is shown.
	var sections map[string]any
	if err := yaml.Unmarshal(d, &sections); err != nil {
		t.Fatal(err)
	}
	block := s[start+8 : start+8+end]
	for name := range sections {
		if name != "memberlist" && !strings.Contains(block, "\n"+name+":") && !strings.HasPrefix(block, name+":") {
			t.Errorf("README configuration lacks the %q section", name)
		}
	}
}
