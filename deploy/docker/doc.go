// Package docker holds gpustore's container images (gpustore.Dockerfile,
// gpusim.Dockerfile). No container engine runs where the tests do, so the Go
// test in this folder parses the Dockerfiles with BuildKit's own parser and
// checks what an image build would rely on; `make docker` builds them where an
// engine exists. The package has no code: only its test imports BuildKit.
package docker
