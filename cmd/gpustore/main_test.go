package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestMain runs gpustore's run with the arguments in GPUSTORE_ARGS (one
// per line) when the test binary is started as a stand-in for gpustore.
func TestMain(m *testing.M) {
	if args, ok := os.LookupEnv("GPUSTORE_ARGS"); ok {
		os.Exit(run(strings.Split(args, "\n")))
	}
	os.Exit(m.Run())
}

// gpustore runs the test binary as gpustore with args, for at most 10 s,
// and returns its exit code (-1 when it was still running) and stderr.
func gpustore(t *testing.T, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "GPUSTORE_ARGS="+strings.Join(args, "\n"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		return -1, stderr.String()
	case errors.As(err, &exit):
		return exit.ExitCode(), stderr.String()
	case err != nil:
		t.Fatal(err)
	}
	return 0, stderr.String()
}

// TestPositionalArgumentsRefused: a word on the command line that is not
// a flag (`gpustore tools bucket ls`, a path typed without its flag) is an
// error with the usage and exit code 2, as a flag error is. gpustore
// ignored them and started the server (on :9201 with ./data).
func TestPositionalArgumentsRefused(t *testing.T) {
	served := []string{"-web.listen-address=127.0.0.1:0", "-storage.tsdb.path=" + t.TempDir()}
	for _, args := range [][]string{
		append(served, "tools", "bucket", "ls"),
		append(served, "./data"),
		{"serve"},
	} {
		code, stderr := gpustore(t, args...)
		if code == -1 {
			t.Fatalf("gpustore %s started the server", strings.Join(args, " "))
		}
		first := args[len(served)%len(args)]
		if args[0] != served[0] {
			first = args[0]
		}
		if code != 2 || !strings.Contains(stderr, "Usage: gpustore") || !strings.Contains(stderr, `"`+first+`"`) {
			t.Errorf("gpustore %s: exit %d, want 2 with the usage naming the argument:\n%s", strings.Join(args, " "), code, stderr)
		}
	}
	if code, stderr := gpustore(t, "-no-such-flag"); code != 2 || !strings.Contains(stderr, "Usage: gpustore") {
		t.Errorf("a flag error: exit %d:\n%s", code, stderr)
	}
	if code, _ := gpustore(t, "-h"); code != 0 {
		t.Errorf("-h: exit %d, want 0", code)
	}
}

// TestToolsSubcommand: `gpustore tools ...` runs the tools (pkg/tools), not
// the server: a command with a missing flag is a usage error (exit 2), an
// unknown one too, and a check of a good configuration succeeds.
func TestToolsSubcommand(t *testing.T) {
	code, stderr := gpustore(t, "tools", "bucket", "ls")
	if code != 2 || !strings.Contains(stderr, "Usage: gpustore tools bucket ls") || !strings.Contains(stderr, "--objstore.config-file is required") {
		t.Errorf("tools bucket ls without a bucket: exit %d:\n%s", code, stderr)
	}
	if code, stderr := gpustore(t, "tools", "bucket", "nope"); code != 2 || !strings.Contains(stderr, `unknown command "nope"`) {
		t.Errorf("tools bucket nope: exit %d:\n%s", code, stderr)
	}
	cfg := filepath.Join(t.TempDir(), "gpustore.yml")
	if err := os.WriteFile(cfg, []byte("target: all\nquery:\n  timeout: 1m\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, stderr := gpustore(t, "tools", "check", "config", cfg); code != 0 {
		t.Errorf("tools check config of a good file: exit %d:\n%s", code, stderr)
	}
	if code, _ := gpustore(t, "-h"); code != 0 {
		t.Errorf("-h: exit %d", code)
	}
}
