// Package version holds build information, set with -ldflags -X at build time.
package version

import "runtime"

var (
	Version   = "0.1.0-dev"
	Revision  = "unknown"
	Branch    = "main"
	BuildUser = "unknown"
	BuildDate = "unknown"
)

// GoVersion is the Go release the binary was built with.
var GoVersion = runtime.Version()

// Print is the --version text.
func Print(program string) string {
	return program + ", version " + Version + " (branch: " + Branch + ", revision: " + Revision + ")\n  build date: " + BuildDate + "\n  go version: " + GoVersion + "\n"
}
