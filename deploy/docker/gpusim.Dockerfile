# syntax=docker/dockerfile:1
# gpusim: the simulated DCGM cluster (dcgm-exporter pages, remote write,
# backfill), for the compose stack and load tests.
#   docker build -f deploy/docker/gpusim.Dockerfile -t gpusim .

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
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath -ldflags "-s -w" -o /out/gpusim ./bench/cmd/gpusim

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/gpusim /usr/local/bin/gpusim
USER 65532:65532
# gpusim serve's default listen port (dcgm-exporter's is 9400 too).
EXPOSE 9400
ENTRYPOINT ["/usr/local/bin/gpusim"]
CMD ["serve"]
