package scripts

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// runScript runs a copy of run.sh in a folder of its own whose bin/ holds
// stand-ins for gpustore and gpusim that write down their arguments and
// exit, with env added to the environment, and returns gpustore's
// arguments.
func runScript(t *testing.T, env ...string) string {
	t.Helper()
	root := t.TempDir()
	script, err := os.ReadFile("run.sh")
	if err != nil {
		t.Fatal(err)
	}
	for dir, files := range map[string]map[string]string{
		"scripts": {"run.sh": string(script)},
		"bin": {
			"gpustore": "#!/bin/sh\necho \"$@\" > \"$(dirname \"$0\")/gpustore.args\"\n",
			"gpusim":   "#!/bin/sh\necho \"$@\" > \"$(dirname \"$0\")/gpusim.args\"\n",
		},
	} {
		if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
		for name, text := range files {
			if err := os.WriteFile(filepath.Join(root, dir, name), []byte(text), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "scripts", "run.sh"))
	cmd.Env = append(os.Environ(), env...)
	start := time.Now()
	out, _ := cmd.CombinedOutput() // gpustore's stand-in exits at once: the script fails
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("run.sh took %s to notice that gpustore had exited: %s", took, out)
	}
	args, err := os.ReadFile(filepath.Join(root, "bin", "gpustore.args"))
	if err != nil {
		t.Fatalf("gpustore was not started: %v\n%s", err, out)
	}
	return string(args)
}

// TestMakeRunListensOnLoopback: `make run` starts gpustore with every route
// open (no web config: pprof, /-/reload, every tenant), so by default it
// listens on loopback only, not on every interface as it did; the
// LISTEN_ADDRESS variable (the Makefile passes it on) opens it on purpose.
func TestMakeRunListensOnLoopback(t *testing.T) {
	if got := runScript(t, "LISTEN_ADDRESS="); !strings.Contains(got, "--web.listen-address=127.0.0.1:9201") {
		t.Errorf("run.sh starts gpustore with %q, want it on 127.0.0.1:9201", got)
	}
	if got := runScript(t, "LISTEN_ADDRESS=0.0.0.0:9301"); !strings.Contains(got, "--web.listen-address=0.0.0.0:9301") {
		t.Errorf("run.sh with LISTEN_ADDRESS=0.0.0.0:9301 starts gpustore with %q", got)
	}
	out, err := exec.Command("make", "-C", "..", "-n", "run", "LISTEN_ADDRESS=10.0.0.1:9201").CombinedOutput()
	if err != nil {
		t.Fatalf("make -n run: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "LISTEN_ADDRESS=10.0.0.1:9201 ./scripts/run.sh") {
		t.Errorf("make run does not pass LISTEN_ADDRESS to run.sh:\n%s", out)
	}
}
