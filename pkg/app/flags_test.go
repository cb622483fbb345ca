package app

import (
	"flag"
	"os"
	"path/filepath"
	"testing"
)

// TestListFlagsWithConfigFile: a list flag given with a config file holds
// its values once (the flags are parsed twice, before and after the file).
func TestListFlagsWithConfigFile(t *testing.T) {
	f := filepath.Join(t.TempDir(), "c.yml")
	if err := os.WriteFile(f, []byte("log:\n  level: info\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, _, err := Load(flag.NewFlagSet("x", flag.ContinueOnError), []string{"-config.file=" + f, "-memberlist.join=a:7946", "-storage.tsdb.path=" + t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Memberlist.JoinMembers; len(got) != 1 {
		t.Fatalf("memberlist.join = %v, want [a:7946]", got)
	}
}
