package app

import (
	"log/slog"
	"math"
	"os"
	"runtime/debug"
	"testing"
)

// The collector's target comes from the config unless GOGC is in the
// environment; GOMEMLIMIT is set to the ratio of the machine's or
// container's memory unless the environment has one.
func TestRuntimeConfigApply(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	logger := slog.New(slog.DiscardHandler)

	t.Setenv("GOGC", "")
	t.Setenv("GOMEMLIMIT", "") // restored after the test
	os.Unsetenv("GOMEMLIMIT")
	if err := (RuntimeConfig{GOGC: 37, AutoGOMEMLIMITRatio: 0.5}).Apply(logger); err != nil {
		t.Fatal(err)
	}
	if got := debug.SetGCPercent(100); got != 37 {
		t.Errorf("GOGC %d, want the configured 37", got)
	}
	if got := debug.SetMemoryLimit(-1); got <= 0 || got == math.MaxInt64 {
		t.Errorf("GOMEMLIMIT %d, want half the memory of the machine or container", got)
	}
	debug.SetMemoryLimit(math.MaxInt64)
	t.Setenv("GOMEMLIMIT", "1GiB")
	if err := (RuntimeConfig{GOGC: 37, AutoGOMEMLIMITRatio: 0.5}).Apply(logger); err != nil {
		t.Fatal(err)
	}
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Errorf("GOMEMLIMIT %d, want the environment's left alone", got)
	}

	t.Setenv("GOGC", "80")
	debug.SetGCPercent(80) // as the runtime read it at start
	if err := (RuntimeConfig{GOGC: 37}).Apply(logger); err != nil {
		t.Fatal(err)
	}
	if got := debug.SetGCPercent(100); got != 80 {
		t.Errorf("GOGC %d, want the environment's 80", got)
	}

	for _, bad := range []RuntimeConfig{{GOGC: 0}, {GOGC: 50, AutoGOMEMLIMITRatio: 1.5}, {GOGC: 50, AutoGOMEMLIMITRatio: -1}} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	if err := DefaultRuntimeConfig().Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
}
