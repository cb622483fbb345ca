package docker

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// dockerCommands is what `make -n docker` with vars would run: one line per
// command, split into words.
func dockerCommands(t *testing.T, vars ...string) [][]string {
	t.Helper()
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("make", append([]string{"-n", "-s", "-C", "../..", "docker", "DOCKER=docker"}, vars...)...)
	// Only vars: not the caller's registry or an outer make's flags.
	for _, e := range os.Environ() {
		k, _, _ := strings.Cut(e, "=")
		if !slices.Contains([]string{"REGISTRY", "IMAGE_TAG", "PUSH", "PLATFORMS", "MAKEFLAGS", "MFLAGS", "MAKELEVEL"}, k) {
			cmd.Env = append(cmd.Env, e)
		}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n docker %v: %v\n%s", vars, err, out)
	}
	var cmds [][]string
	for _, line := range strings.Split(strings.ReplaceAll(string(out), "\\\n", " "), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == "docker" {
			cmds = append(cmds, f)
		}
	}
	return cmds
}

func flagValues(cmd []string, name string) []string {
	var v []string
	for i, a := range cmd {
		if a == name && i+1 < len(cmd) {
			v = append(v, cmd[i+1])
		} else if val, ok := strings.CutPrefix(a, name+"="); ok {
			v = append(v, val)
		}
	}
	return v
}

// `make docker REGISTRY=... IMAGE_TAG=... PUSH=1` builds both images for
// amd64 and arm64 (Grace nodes) from the same Dockerfiles with buildx and
// pushes them under the registry; without PUSH it loads the builder's
// platform's image into the local engine, as compose uses it.
func TestMakeDocker(t *testing.T) {
	for _, tc := range []struct {
		vars              []string
		platforms, output string
		tags              map[string]string // Dockerfile -> tag
	}{
		{
			vars: []string{"REGISTRY=registry.example.com/team", "IMAGE_TAG=v1.2.3", "PUSH=1"}, platforms: "linux/amd64,linux/arm64", output: "--push",
			tags: map[string]string{"deploy/docker/gpustore.Dockerfile": "registry.example.com/team/gpustore:v1.2.3", "deploy/docker/gpusim.Dockerfile": "registry.example.com/team/gpusim:v1.2.3"},
		},
		{
			output: "--load",
			tags:   map[string]string{"deploy/docker/gpustore.Dockerfile": "gpustore:dev", "deploy/docker/gpusim.Dockerfile": "gpusim:dev"},
		},
	} {
		cmds := dockerCommands(t, tc.vars...)
		if len(cmds) != len(tc.tags) {
			t.Fatalf("make docker %v runs %d docker commands, want %d: %v", tc.vars, len(cmds), len(tc.tags), cmds)
		}
		for _, c := range cmds {
			line := strings.Join(c, " ")
			if len(c) < 3 || c[1] != "buildx" || c[2] != "build" {
				t.Errorf("%v: %s: want docker buildx build", tc.vars, line)
			}
			files := flagValues(c, "-f")
			if len(files) != 1 {
				t.Fatalf("%v: %s: want one -f", tc.vars, line)
			}
			if want := tc.tags[files[0]]; !slices.Equal(flagValues(c, "-t"), []string{want}) {
				t.Errorf("%v: %s: tags %v, want [%s]", tc.vars, line, flagValues(c, "-t"), want)
			}
			if p := flagValues(c, "--platform"); tc.platforms != "" && !slices.Equal(p, []string{tc.platforms}) || tc.platforms == "" && len(p) != 0 {
				t.Errorf("%v: %s: --platform %v, want %q", tc.vars, line, p, tc.platforms)
			}
			if !slices.Contains(c, tc.output) {
				t.Errorf("%v: %s: want %s", tc.vars, line, tc.output)
			}
		}
	}
}
