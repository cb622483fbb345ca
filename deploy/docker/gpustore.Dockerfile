# syntax=docker/dockerfile:1
# gpustore: one static binary on a distroless base, running as non-root.
# Build from the repository root:
#   docker build -f deploy/docker/gpustore.Dockerfile -t gpustore .

# GO_VERSION is the Go release of go.mod's go directive (a test checks it).
ARG GO_VERSION=1.26

# Multi-arch: the Go toolchain runs on the builder's platform and
# cross-compiles for each target platform of `docker buildx build --platform
# linux/amd64,linux/arm64` (make docker PUSH=1), with no emulation; the
# runtime stage is the target platform's.

# build cross-compiles the static binary for $TARGETOS/$TARGETARCH.
FROM --platform=$BUILDPLATFORM golang:${GO_VERSION}-bookworm AS build
ARG TARGETOS TARGETARCH
WORKDIR /src
# Modules first, so a source change does not re-download them.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ARG REVISION=unknown
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath -tags dedupelabels \
      -ldflags "-s -w -X github.com/gpustore/gpustore/internal/version.Version=${VERSION} -X github.com/gpustore/gpustore/internal/version.Revision=${REVISION}" \
      -o /out/gpustore ./cmd/gpustore

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/gpustore /usr/local/bin/gpustore
# distroless' nonroot user; the data volume must be writable by it
# (Kubernetes: fsGroup 65532).
USER 65532:65532
WORKDIR /data
VOLUME ["/data"]
# The default listen port (server.DefaultConfig: :9201).
EXPOSE 9201
ENTRYPOINT ["/usr/local/bin/gpustore"]
CMD ["--storage.tsdb.path=/data"]
