// Package docker holds gpustore's container images (gpustore.Dockerfile,
// gpusim.Dockerfile), multi-arch (linux/amd64, linux/arm64) by Go's cross
// compilation under buildx. No container engine runs where the tests do, so
// the Go tests in this folder parse the Dockerfiles with BuildKit's own
// parser and check what an image build would rely on, and read the commands
// of `make docker` (make -n): buildx, the platforms, the registry's tags,
// push or load. `make docker` builds them where an engine exists. The
// package has no code: only its tests import BuildKit.
package docker
