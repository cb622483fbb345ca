// Package testbin finds the real servers (prometheus, promtool, alertmanager,
// versitygw, fake-gcs-server, azurite-blob) that end-to-end tests run on
// loopback, and starts the object-storage ones (objstore.go).
//
// A missing binary skips the test on a developer's machine, but fails it when
// CI=true: CI must never pass by not running an end-to-end test.
package testbin

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Dirs searched after $PATH, in order. GPUSTORE_TOOLS_DIR is where .ci/run and
// `make tools` install pinned versions.
func searchDirs() []string {
	var dirs []string
	if d := os.Getenv("GPUSTORE_TOOLS_DIR"); d != "" {
		dirs = append(dirs, d)
	}
	if home, err := os.UserHomeDir(); err == nil {
		dirs = append(dirs, filepath.Join(home, ".cache", "gpustore-tools", "bin"), filepath.Join(home, "go", "bin"))
	}
	return append(dirs, "/usr/bin", "/usr/local/bin")
}

// Lookup returns the path of the named binary, or "" when it is not installed.
func Lookup(name string) string {
	for _, d := range searchDirs() {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	return ""
}

// Need returns the path of the named binary. When it is missing the test fails
// under CI=true and is skipped otherwise.
func Need(t testing.TB, name string) string {
	t.Helper()
	if p := Lookup(name); p != "" {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is not installed: .ci/run must install it (see Makefile target tools)", name)
	}
	t.Skipf("%s is not installed (run `make tools`); under CI=true this is a failure", name)
	return ""
}

// Start runs bin with args until the test ends: the process is killed at
// cleanup, and its output (stdout and stderr) is logged if the test failed.
func Start(t testing.TB, bin string, args ...string) {
	t.Helper()
	var out bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("%s output:\n%s", filepath.Base(bin), out.String())
		}
	})
}
