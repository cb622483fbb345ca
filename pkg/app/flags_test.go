package app

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
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

// TestPodFoldIsOptIn: by default 5m and 1h data keep every label (the pod
// fold merges series, so it is asked for: a flag or the YAML file).
func TestPodFoldIsOptIn(t *testing.T) {
	cfg, _, err := Load(flag.NewFlagSet("d", flag.ContinueOnError), []string{"-storage.tsdb.path=" + t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if l := cfg.Compact.DownsampleFoldLabels; len(l) != 0 {
		t.Fatalf("default compact.downsample_fold_labels %q, want none", l)
	}
	cfg, _, err = Load(flag.NewFlagSet("f", flag.ContinueOnError), []string{"-storage.tsdb.path=" + t.TempDir(), "-compact.downsample.fold-labels=pod"})
	if err != nil {
		t.Fatal(err)
	}
	if l := cfg.Compact.DownsampleFoldLabels; len(l) != 1 || l[0] != "pod" || cfg.Compact.DownsampleFoldMetrics != "DCGM_.+" {
		t.Fatalf("-compact.downsample.fold-labels=pod: labels %q on %q, want pod on DCGM_.+", l, cfg.Compact.DownsampleFoldMetrics)
	}
}

// TestRetentionsThatWouldDropData: retention flags under which a resolution
// would be deleted while no coarser one holds its hours are refused at
// start, with an error naming the flags; those where a coarser resolution
// always does are taken.
func TestRetentionsThatWouldDropData(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string // "" : accepted; else in the error
	}{
		{nil, ""},
		{[]string{"-compact.retention.5m=30d", "-compact.retention.1h=7d"}, "compact.retention.1h (1w) is shorter than compact.retention.5m (30d)"},
		{[]string{"-compact.retention.raw=90d", "-compact.retention.5m=30d", "-compact.retention.1h=60d"}, "compact.retention.raw (90d)"},
		{[]string{"-compact.retention.raw=90d", "-compact.retention.5m=30d", "-compact.retention.1h=1y"}, ""}, // raw goes once at 1h
		{[]string{"-compact.retention.raw=0", "-compact.retention.5m=1y"}, ""},                                // raw kept forever
		{[]string{"-compact.retention.5m=0", "-compact.retention.1h=1y"}, ""},                                 // 5m kept forever
		{[]string{"-compact.retention.5m=1y", "-compact.retention.1h=0"}, ""},
		{[]string{"-compact.downsample=false", "-compact.retention.raw=90d", "-compact.retention.5m=30d", "-compact.retention.1h=60d"}, ""},
	} {
		_, _, err := Load(flag.NewFlagSet("r", flag.ContinueOnError), append(c.args, "-storage.tsdb.path="+t.TempDir()))
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%v refused: %v", c.args, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%v: error %v, want one saying %q", c.args, err, c.want)
		}
	}
}

// TestRecoverWALAsideAuto: "auto" sets a crashed head aside only in a ring
// at RF ≥ 2, where other replicas answer for its samples meanwhile; an
// explicit on or off holds anywhere.
func TestRecoverWALAsideAuto(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "off"},
		{[]string{"-storage.tsdb.recover-wal-aside=on"}, "on"},
		{[]string{"-ring.enabled", "-ring.replication-factor=3"}, "on"},
		{[]string{"-ring.enabled", "-ring.replication-factor=1"}, "off"},
		{[]string{"-ring.enabled", "-ring.replication-factor=3", "-storage.tsdb.recover-wal-aside=off"}, "off"},
	} {
		cfg, _, err := Load(flag.NewFlagSet("r", flag.ContinueOnError), append([]string{"-storage.tsdb.path=" + t.TempDir()}, c.args...))
		if err != nil {
			t.Fatalf("%q: %v", c.args, err)
		}
		if got := (&App{Cfg: cfg}).tsdbConfig().RecoverWALAside; got != c.want {
			t.Errorf("%q: recover_wal_aside resolved to %q, want %q", c.args, got, c.want)
		}
	}
	if _, _, err := Load(flag.NewFlagSet("b", flag.ContinueOnError), []string{"-storage.tsdb.path=" + t.TempDir(), "-storage.tsdb.recover-wal-aside=yes"}); err == nil || !strings.Contains(err.Error(), "recover_wal_aside") {
		t.Errorf("recover-wal-aside=yes: %v, want an error naming recover_wal_aside", err)
	}
}
