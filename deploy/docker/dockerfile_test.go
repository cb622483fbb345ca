package docker

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/linter"
	"github.com/moby/buildkit/frontend/dockerfile/parser"

	"github.com/gpustore/gpustore/pkg/server"
)

// image is what each Dockerfile must build: the main package it compiles and
// the port its binary listens on by default.
type image struct {
	file, mainPkg string
	port          string
}

// gpusimDefaultPort reads the default of gpusim serve's --web.listen-address
// from its source: the command is a main package, so there is no exported
// constant to import.
func gpusimDefaultPort(t *testing.T) string {
	t.Helper()
	src, err := os.ReadFile("../../bench/cmd/gpusim/main.go")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`"web\.listen-address", ":(\d+)"`).FindSubmatch(src)
	if m == nil {
		t.Fatal("bench/cmd/gpusim/main.go: no default for --web.listen-address")
	}
	return string(m[1])
}

func images(t *testing.T) []image {
	_, gpustorePort, ok := strings.Cut(server.DefaultConfig().ListenAddress, ":")
	if !ok {
		t.Fatalf("server.DefaultConfig().ListenAddress = %q: no port", server.DefaultConfig().ListenAddress)
	}
	return []image{
		{file: "gpustore.Dockerfile", mainPkg: "./cmd/gpustore", port: gpustorePort},
		{file: "gpusim.Dockerfile", mainPkg: "./bench/cmd/gpusim", port: gpusimDefaultPort(t)},
	}
}

// parse runs BuildKit's parser and instruction decoder, with its linter
// reporting every warning as a test error.
func parse(t *testing.T, file string) ([]instructions.Stage, []instructions.ArgCommand) {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := parser.Parse(f)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	for _, w := range res.Warnings {
		t.Errorf("%s: parser warning: %s", file, w.Short)
	}
	lint := linter.New(&linter.Config{ExperimentalAll: true, Warn: func(rule, desc, url, msg string, loc []parser.Range) {
		line := 0
		if len(loc) > 0 {
			line = loc[0].Start.Line
		}
		t.Errorf("%s:%d: lint %s: %s", file, line, rule, msg)
	}})
	stages, metaArgs, err := instructions.Parse(res.AST, lint)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return stages, metaArgs
}

func goDirective(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("go.mod: no go directive")
	}
	return string(m[1])
}

func argDefault(metaArgs []instructions.ArgCommand, name string) (string, bool) {
	for _, a := range metaArgs {
		for _, kv := range a.Args {
			if kv.Key == name && kv.Value != nil {
				return *kv.Value, true
			}
		}
	}
	return "", false
}

// Each image is a two-stage build: a Go toolchain of the module's Go version
// compiles one static binary, which runs alone as a non-root user on a
// distroless base, with the exec-form entrypoint pointing at it and the
// binary's default listen port exposed.
func TestDockerfiles(t *testing.T) {
	goVersion := goDirective(t)
	for _, img := range images(t) {
		t.Run(img.file, func(t *testing.T) {
			stages, metaArgs := parse(t, img.file)
			if len(stages) != 2 {
				t.Fatalf("%d stages, want 2 (build, runtime)", len(stages))
			}
			build, run := stages[0], stages[1]

			// Build stage: the Go toolchain the module asks for.
			if build.Name != "build" {
				t.Errorf("first stage is named %q, want build", build.Name)
			}
			gv, ok := argDefault(metaArgs, "GO_VERSION")
			if !ok {
				t.Errorf("no ARG GO_VERSION before FROM")
			} else if !strings.HasPrefix(goVersion, gv) {
				t.Errorf("ARG GO_VERSION=%s, but go.mod says go %s", gv, goVersion)
			}
			if !strings.HasPrefix(build.BaseName, "golang:${GO_VERSION}") {
				t.Errorf("build stage FROM %s, want golang:${GO_VERSION}...", build.BaseName)
			}
			// Multi-arch without emulation: the toolchain runs on the
			// builder's platform and cross-compiles for the target's.
			if build.Platform != "$BUILDPLATFORM" && build.Platform != "${BUILDPLATFORM}" {
				t.Errorf("build stage FROM --platform=%q, want $BUILDPLATFORM: under buildx --platform each target would run the Go toolchain emulated", build.Platform)
			}
			if run.Platform != "" {
				t.Errorf("runtime stage FROM --platform=%s: it must be the target's platform", run.Platform)
			}
			declared := map[string]bool{}
			for _, c := range build.Commands {
				if a, ok := c.(*instructions.ArgCommand); ok {
					for _, kv := range a.Args {
						declared[kv.Key] = true
					}
				}
			}
			var out string
			for _, c := range build.Commands {
				r, ok := c.(*instructions.RunCommand)
				if !ok {
					continue
				}
				line := strings.Join(r.CmdLine, " ")
				if !strings.Contains(line, "go build") {
					continue
				}
				for _, v := range []string{"GOOS", "GOARCH"} {
					arg := "TARGET" + strings.TrimPrefix(v, "GO")
					if !strings.Contains(line, v+"=$"+arg) && !strings.Contains(line, v+"=${"+arg+"}") || !declared[arg] {
						t.Errorf("go build without %s=$%s (ARG %s declared in the build stage: %v): the binary would be the build machine's: %s", v, arg, arg, declared[arg], line)
					}
				}
				if !strings.Contains(line, "CGO_ENABLED=0") {
					t.Errorf("go build without CGO_ENABLED=0: the binary would not be static: %s", line)
				}
				if img.mainPkg == "./cmd/gpustore" && !strings.Contains(line, "-tags dedupelabels") {
					t.Errorf("gpustore built without -tags dedupelabels (as make builds it): labels would take a quarter more memory: %s", line)
				}
				f := strings.Fields(line)
				if f[len(f)-1] != img.mainPkg {
					t.Errorf("go build builds %s, want %s", f[len(f)-1], img.mainPkg)
				}
				if i := slices.Index(f, "-o"); i >= 0 && i+1 < len(f) {
					out = f[i+1]
				}
			}
			if out == "" {
				t.Fatal("build stage has no `go build -o <binary>` RUN")
			}
			if _, err := os.Stat(filepath.Join("../..", img.mainPkg, "main.go")); err != nil {
				t.Errorf("main package %s: %v", img.mainPkg, err)
			}

			// Runtime stage: distroless static, non-root, only the binary.
			if !strings.HasPrefix(run.BaseName, "gcr.io/distroless/static") {
				t.Errorf("runtime stage FROM %s, want a distroless static base", run.BaseName)
			}
			var bin, user, entry string
			var ports []string
			for _, c := range run.Commands {
				switch c := c.(type) {
				case *instructions.CopyCommand:
					if c.From != build.Name {
						t.Errorf("runtime stage copies %v from %q, want only the binary from %q", c.SourcePaths, c.From, build.Name)
						continue
					}
					if !slices.Equal(c.SourcePaths, []string{out}) {
						t.Errorf("runtime stage copies %v, want %s", c.SourcePaths, out)
					}
					bin = c.DestPath
				case *instructions.UserCommand:
					user = c.User
				case *instructions.EntrypointCommand:
					if c.PrependShell {
						t.Errorf("ENTRYPOINT in shell form: distroless has no shell and signals would not reach the binary")
					}
					if len(c.CmdLine) > 0 {
						entry = c.CmdLine[0]
					}
				case *instructions.ExposeCommand:
					ports = append(ports, c.Ports...)
				case *instructions.RunCommand:
					t.Errorf("RUN in the runtime stage: the distroless base has no shell: %v", c.CmdLine)
				}
			}
			uid, _, _ := strings.Cut(user, ":")
			if user == "" || uid == "0" || uid == "root" {
				t.Errorf("USER %q: the image must run as a non-root user", user)
			}
			if bin == "" || entry != bin {
				t.Errorf("ENTRYPOINT %q does not run the copied binary %q", entry, bin)
			}
			if !slices.Equal(ports, []string{img.port}) && !slices.Equal(ports, []string{img.port + "/tcp"}) {
				t.Errorf("EXPOSE %v, want the default listen port %s", ports, img.port)
			}
		})
	}
}
