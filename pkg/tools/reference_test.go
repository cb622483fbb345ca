package tools

import (
	"os"
	"testing"
)

// docs/tools.md is the reference the commands generate now: run `make docs`
// after adding or changing a command or a flag.
func TestReferenceUpToDate(t *testing.T) {
	const page = "../../docs/tools.md"
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != Reference() {
		t.Errorf("%s is stale: run `make docs` and commit the result", page)
	}
}
