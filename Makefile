# gpustore — make targets. `make run` starts gpustore on the embedded default
# with a simulated GPU cluster feeding it; `make test` runs every test.
GO        ?= go
TOOLS_DIR ?= $(HOME)/.cache/gpustore-tools/bin
export GPUSTORE_TOOLS_DIR := $(TOOLS_DIR)

# Prometheus' dedupelabels labels: each tenant keeps a label name or value
# once, and a series refers to it (pkg/tenantdb/symbols.go), a quarter less
# memory per series than the default stringlabels. Exported, so every go
# command make runs uses it, including the gpustore binaries the end-to-end
# tests build. A plain `go build` without it makes a working binary that
# uses more memory (its start-up log says labels=stringlabels).
export GOFLAGS += -tags=dedupelabels

# Prometheus and promtool are built from go.mod (tools.go): the version gpustore imports.
PROMETHEUS_VERSION := $(shell $(GO) list -m -f '{{.Version}}' github.com/prometheus/prometheus)
VM_VERSION         := v1.151.0
GOLANGCI_LINT_VERSION := v2.15.0
VERSITYGW_VERSION  := v1.8.0
FAKE_GCS_VERSION   := v1.56.1
AZURITE_VERSION    := 3.35.0

# Packages with concurrency: their tests run under the race detector, the
# others' without it; each package's tests run once. pkg/app (wiring of the
# modules raced here) stays out: it would add ~200 packages (the dskit ring,
# memberlist) to the race build for no concurrency of its own.
# The longest under the race detector first (bucketstore ~150 s, the
# query frontend and query ~90 s each): go test starts them in this order.
RACE_PKGS := ./pkg/storage/bucketstore/... # queries and bucket syncs sharing the page cache
RACE_PKGS += ./pkg/queryfrontend/... # pieces in parallel, the shared results cache
RACE_PKGS += ./pkg/query/... ./pkg/ingest/... ./pkg/rules/... ./pkg/tenantdb/...
RACE_PKGS += ./pkg/storage/shipper/... ./pkg/hatracker/... ./pkg/limits/...
RACE_PKGS += ./pkg/server/... ./pkg/auth/... # write bound, drain; web config swapped under requests
RACE_PKGS += ./pkg/blockquery/... ./pkg/seriesset/... # one series cache for every querier
RACE_PKGS += ./pkg/distributor/... ./pkg/ringread/... # quorum sends that outlive the request; concurrent fan-out reads
RACE_PKGS += ./pkg/block/... # a column frame's chunks written back by the queries that share it
UNIT_PKGS = $(filter-out $(shell $(GO) list $(RACE_PKGS)),$(shell $(GO) list ./...))
# pkg/compact runs whole in test-unit (its week, downsampling and crash tests
# take minutes under the race detector) and again under it for the tests of
# its concurrency: the lease's renewal and two compactors on one bucket.
COMPACT_RACE_TESTS := TestLeaseExpiresAfterHolderDies|TestTwoCompactorsOneBucket|TestWorkingDirectoryBounded
# test-unit's longest packages, started first (in this order).
LONG_PKGS := %/test/e2e %/deploy/devstack %/pkg/compact %/deploy/grafana %/deploy/rules

.PHONY: all build run test test-unit test-race lint fuzz fuzz-short fuzz-long soak tools tools-note vet bench bench-compare bench-compact bench-relabel bench-ring bench-cluster-day bench-panels clean docker dashboards manifests docs dev-stack

all: build

build:
	$(GO) build -o bin/gpustore ./cmd/gpustore
	$(GO) build -o bin/gpusim ./bench/cmd/gpusim

# Container images, where a container engine exists (none runs on CI: there
# deploy/docker's tests parse the Dockerfiles with BuildKit's parser and read
# this target with make -n). With Docker's buildx (BuildKit):
#   make docker                      gpustore:dev and gpusim:dev for this
#                                    machine's platform, loaded into the engine
#                                    (what deploy/compose runs)
#   make docker REGISTRY=registry.example.com/team IMAGE_TAG=v0.1.0 PUSH=1
#                                    both images for linux/amd64 and linux/arm64
#                                    (Grace nodes), pushed as one multi-arch tag
#                                    each: registry.example.com/team/gpustore:v0.1.0
# The Dockerfiles run the Go toolchain on the builder's platform and
# cross-compile (GOOS/GOARCH from TARGETOS/TARGETARCH): no emulation.
DOCKER ?= docker
IMAGE_TAG ?= dev
REGISTRY ?=
IMAGE_PREFIX = $(if $(REGISTRY),$(patsubst %/,%,$(REGISTRY))/)
ifdef PUSH
PLATFORMS ?= linux/amd64,linux/arm64
DOCKER_OUTPUT = --push
else
PLATFORMS ?=
DOCKER_OUTPUT = --load
endif
DOCKER_BUILD = $(DOCKER) buildx build $(if $(PLATFORMS),--platform $(PLATFORMS)) $(DOCKER_OUTPUT)
docker:
	$(DOCKER_BUILD) -f deploy/docker/gpustore.Dockerfile -t $(IMAGE_PREFIX)gpustore:$(IMAGE_TAG) \
		--build-arg VERSION=$(IMAGE_TAG) --build-arg REVISION=$$(git rev-parse --short HEAD 2>/dev/null || echo unknown) .
	$(DOCKER_BUILD) -f deploy/docker/gpusim.Dockerfile -t $(IMAGE_PREFIX)gpusim:$(IMAGE_TAG) .

# The whole system on loopback without containers, from deploy/compose's
# config files: versitygw (S3, in place of MinIO), gpusim, gpustore,
# Alertmanager and a Prometheus HA pair; data and logs in data/dev-stack.
# Ctrl-C stops it. Flags after -- go to gpustore:
#   make dev-stack DEV_STACK_FLAGS='-- --log.level=debug'
DEV_STACK_FLAGS ?=
dev-stack: build tools
	$(GO) run ./deploy/devstack/cmd/devstack $(DEV_STACK_FLAGS)

# Grafana dashboards: generated from deploy/grafana/*.go into
# deploy/grafana/dashboards/*.json, and a picture of each one's layout into
# docs/img/dashboards/*.png (a test fails while they are stale).
dashboards:
	$(GO) generate ./deploy/grafana

# The Prometheus Operator component's PrometheusRules, generated from
# deploy/rules/self into deploy/kubernetes/components/prometheus-operator
# (a test fails while they are stale).
manifests:
	$(GO) generate ./deploy/kubernetes

# The configuration reference (every flag and YAML key) in
# docs/configuration.md: generated from the flags, the defaults and the
# configuration structs' doc comments (a test fails while it is stale); the
# package graph in docs/ARCHITECTURE.md, from go list.
docs:
	$(GO) generate ./pkg/app/configref ./pkg/tools
	$(GO) test -count=1 -run TestPackageGraph ./docs -update

# gpustore on the embedded default (data in ./data, port 9201), fed by a
# simulated 16-node (128-GPU) cluster in real time. Ctrl-C stops both.
# gpustore listens on loopback only: it runs without a web config, every
# route open. make run LISTEN_ADDRESS=0.0.0.0:9201 opens it to the network.
LISTEN_ADDRESS ?= 127.0.0.1:9201
run: build
	LISTEN_ADDRESS=$(LISTEN_ADDRESS) ./scripts/run.sh

# -stdmethods=false: Prometheus' chunkenc.Iterator has Seek(int64) ValueType,
# which vet mistakes for a malformed io.Seeker in every iterator we write.
vet:
	@echo "== vet $$(date +%T)"
	$(GO) vet -stdmethods=false ./...

# The lint (.golangci.yml) runs go vet's checks too, go test's among them
# (so the go test runs below leave vet off); fuzz-short gives the decoders of
# what clients send a few hundred inputs each (make fuzz and fuzz-long run
# every fuzz target longer).
test: tools lint test-unit test-race fuzz-short

lint: $(TOOLS_DIR)/.golangci-lint-$(GOLANGCI_LINT_VERSION)
	@echo "== lint $$(date +%T)"
	$(TOOLS_DIR)/golangci-lint run ./...

# The longest packages first: go test starts packages in the order it is
# given them, -p at the cores' number, so test/e2e (~11 min, one test after
# another) runs beside the rest rather than after it.
test-unit:
	@echo "== test-unit $$(date +%T)"
	$(GO) test -count=1 -vet=off -timeout 30m $(foreach p,$(LONG_PKGS),$(filter $(p),$(UNIT_PKGS))) $(filter-out $(LONG_PKGS),$(UNIT_PKGS))

test-race:
	@echo "== test-race $$(date +%T)"
	$(GO) test -count=1 -vet=off -race $(RACE_PKGS)
	$(GO) test -count=1 -vet=off -race -run '^($(COMPACT_RACE_TESTS))$$' ./pkg/compact

# A few thousand inputs of every fuzz target (their seed corpora also run in
# test-unit; make test runs fuzz-short: the ingest decoders, a few hundred
# inputs each, ~2 min);
# make fuzz-long runs each for minutes (FUZZTIME_LONG=1000000x
# make fuzz-long). Budgets are counts, not durations: with a duration, Go
# 1.26's fuzzing coordinator can fail a target with a bare "context deadline
# exceeded" when the time is up while a worker is busy (golang/go#75804,
# fixed in Go 1.27), as FuzzQueryParams' 2-second queries made it do.
FUZZ_PKGS := ./pkg/ingest ./pkg/auth ./pkg/limits ./pkg/query ./pkg/block
# fuzz-short: the decoders of remote write 1.0 and 2.0 and OTLP bodies.
FUZZ_SHORT_PKGS := ./pkg/ingest
FUZZTIME ?= 3000x
FUZZTIME_SHORT ?= 300x
FUZZTIME_LONG ?= 200000x
fuzz:
	@echo "== fuzz $$(date +%T)"
	@for p in $(FUZZ_PKGS); do \
		for f in $$($(GO) test -list '^Fuzz' $$p | grep '^Fuzz'); do \
			echo "$$p $$f ($(FUZZTIME))"; \
			$(GO) test -run XXX -fuzz "^$$f\$$" -fuzztime $(FUZZTIME) $$p || exit 1; \
		done; \
	done

fuzz-short:
	$(MAKE) fuzz FUZZTIME=$(FUZZTIME_SHORT) FUZZ_PKGS="$(FUZZ_SHORT_PKGS)"

fuzz-long:
	$(MAKE) fuzz FUZZTIME=$(FUZZTIME_LONG)

# The soak tests long (test/e2e/soak_test.go; short versions run in
# test-unit): 20 kill -9 of gpustore under load, three 30-minute bucket
# outages under load, a kill -9 on a 120 MiB WAL; prints kills survived,
# samples acknowledged and lost, restart time per GiB of WAL, backlog (~4 min).
# ^TestSoak also runs TestSoakAbuse: 6 min of every abuse workload at once (+8 min).
soak:
	GPUSTORE_SOAK=long CI=true $(GO) test -count=1 -v -timeout 60m -run '^TestSoak' ./test/e2e

# The real servers the end-to-end tests run on loopback and the linter,
# pinned, installed once into $(TOOLS_DIR) (a stamp file per version);
# tools-note says which are missing and how long installing them takes.
TOOL_STAMPS := $(TOOLS_DIR)/.prometheus-mod-$(PROMETHEUS_VERSION) $(TOOLS_DIR)/.alertmanager
TOOL_STAMPS += $(TOOLS_DIR)/.versitygw-$(VERSITYGW_VERSION)
TOOL_STAMPS += $(TOOLS_DIR)/.fake-gcs-server-$(FAKE_GCS_VERSION) $(TOOLS_DIR)/.azurite-$(AZURITE_VERSION)
TOOL_STAMPS += $(TOOLS_DIR)/.golangci-lint-$(GOLANGCI_LINT_VERSION)
MISSING_TOOLS = $(patsubst $(TOOLS_DIR)/.%,%,$(filter-out $(wildcard $(TOOL_STAMPS)),$(TOOL_STAMPS)))
tools: tools-note $(TOOL_STAMPS)
tools-note:
	@$(if $(MISSING_TOOLS),echo "== installing test tools into $(TOOLS_DIR) at $$(date +%T): $(MISSING_TOOLS) (all of them: ~7 min on 2 cores, once per machine)")

# golangci-lint, from the Go module proxy (~1 min to build).
$(TOOLS_DIR)/.golangci-lint-$(GOLANGCI_LINT_VERSION):
	mkdir -p $(TOOLS_DIR)
	GOFLAGS= GOBIN=$(TOOLS_DIR) $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	touch $@

# versitygw: the S3 server the object-storage tests start on loopback
# (~2.5 min to build the first time).
$(TOOLS_DIR)/.versitygw-$(VERSITYGW_VERSION):
	mkdir -p $(TOOLS_DIR)
	GOBIN=$(TOOLS_DIR) $(GO) install github.com/versity/versitygw/cmd/versitygw@$(VERSITYGW_VERSION)
	touch $@

# fake-gcs-server: the GCS emulator the object-storage tests start on
# loopback, from the Go module proxy.
$(TOOLS_DIR)/.fake-gcs-server-$(FAKE_GCS_VERSION):
	mkdir -p $(TOOLS_DIR)
	GOBIN=$(TOOLS_DIR) $(GO) install github.com/fsouza/fake-gcs-server@$(FAKE_GCS_VERSION)
	touch $@

# Azurite: the Azure Blob emulator, from npm, with the machine's Node.js
# (Debian's nodejs when missing). 3.35.0 is the newest that runs on Node.js
# 20; 3.36 and later need 21 or 22. Installed in its own folder beside
# $(TOOLS_DIR), the blob server linked into it as azurite-blob.
AZURITE_DIR = $(TOOLS_DIR)/../azurite-$(AZURITE_VERSION)
$(TOOLS_DIR)/.azurite-$(AZURITE_VERSION):
	mkdir -p $(TOOLS_DIR) $(AZURITE_DIR)
	command -v npm >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm)
	npm install --prefix $(AZURITE_DIR) --no-audit --no-fund --loglevel=error azurite@$(AZURITE_VERSION)
	ln -sf "$$(cd $(AZURITE_DIR) && pwd)/node_modules/.bin/azurite-blob" $(TOOLS_DIR)/azurite-blob
	touch $@

# Built inside this module, not with `go install ...@version`: the packages
# they share with gpustore (tsdb, promql, storage/remote, the cloud SDKs the
# config pulls in) compile once for both, and remove_all_sd leaves out the
# service-discovery plugins (Kubernetes, AWS, Azure, ...) that the tests do
# not use: on a fresh 2-core machine this saves a whole second build of the
# Prometheus dependency graph.
$(TOOLS_DIR)/.prometheus-mod-$(PROMETHEUS_VERSION):
	mkdir -p $(TOOLS_DIR)
	$(GO) build -tags remove_all_sd -o $(TOOLS_DIR)/ github.com/prometheus/prometheus/cmd/prometheus github.com/prometheus/prometheus/cmd/promtool
	touch $@

# Alertmanager comes from Debian (0.25): `go install` of recent versions
# fails on missing UI assets.
$(TOOLS_DIR)/.alertmanager:
	mkdir -p $(TOOLS_DIR)
	command -v prometheus-alertmanager >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus-alertmanager)
	ln -sf "$$(command -v prometheus-alertmanager)" $(TOOLS_DIR)/alertmanager
	touch $@

bench:
	$(GO) test -run XXX -bench . -benchmem ./pkg/... ./bench/...

# The compactor on the week slice (16 GPUs × 7 days at 1m): compaction
# throughput and peak heap, then the dashboard queries over 7 days and 24
# hours on the 2h blocks, the compacted and the downsampled ones; the
# cluster overview over 30 days, raw against downsampled (bench/RESULTS.md).
bench-compact:
	$(GO) test -run XXX -bench 'BenchmarkCompactWeek|BenchmarkDashboardQueries|BenchmarkLongRangeOverview' -benchtime 3x -timeout 60m ./pkg/compact

# Scale-out: ingest CPU per million samples and dashboard latency, single
# node against 1, 3 and 5 receivers behind a distributor (RF 1 and 3).
bench-ring:
	bench/ring.sh

# What holding the 1024-GPU cluster costs a day (HA pair in real time, then
# hours of 8 nodes for bytes per sample and a full head's RSS), gpustore on
# one node and on a 3-receiver ring at RF 3 beside Prometheus and
# VictoriaMetrics (bench-compare installs it). ~12 minutes per two systems:
# make bench-cluster-day CLUSTER_DAY_SYSTEMS="gpustore prometheus".
CLUSTER_DAY_SYSTEMS ?= gpustore ring prometheus victoriametrics
bench-cluster-day:
	bench/cluster-day.sh "$(CLUSTER_DAY_SYSTEMS)"

# Relabeling on ingest: CPU per million samples with no rules, the dcgm
# preset and 20 user rules (known and new series), beside the Prometheus
# head's own cost of a new series (HeadNewSeries), then a simulated day of
# the 1024-GPU cluster (job churn, exporter and driver upgrades) without and
# with the dcgm preset: series, heap, bytes/sample (bench/RESULTS.md). ~4 min.
bench-relabel:
	$(GO) test -run XXX -bench 'IngestRelabel|HeadNewSeries' -benchtime 200x -benchmem ./pkg/ingest
	$(GO) run ./bench/cmd/relabelbench

clean:
	rm -rf bin data

# gpustore vs Prometheus (remote-write receiver) vs VictoriaMetrics single-node:
# the same simulated GPU-cluster samples, one system after another on loopback
# with fresh data directories; prints one table (see bench/README.md and
# bench/RESULTS.md). VictoriaMetrics is installed once into $(TOOLS_DIR).
# Extra flags for bench/cmd/benchcompare: make bench-compare BENCH_FLAGS='-keep'.
BENCH_FLAGS ?=
bench-compare: $(TOOLS_DIR)/.prometheus-mod-$(PROMETHEUS_VERSION) $(TOOLS_DIR)/.victoria-metrics-$(VM_VERSION)
	$(GO) build -o bin/gpustore ./cmd/gpustore
	$(GO) build -o bin/benchcompare ./bench/cmd/benchcompare
	./bin/benchcompare -gpustore bin/gpustore \
		-prometheus $(TOOLS_DIR)/prometheus -prometheus.version $(PROMETHEUS_VERSION) \
		-victoria-metrics $(TOOLS_DIR)/victoria-metrics -victoria-metrics.version $(VM_VERSION) \
		-gpustore.version "$$(git rev-parse --short HEAD 2>/dev/null || echo tree)+tree" $(BENCH_FLAGS)

$(TOOLS_DIR)/.victoria-metrics-$(VM_VERSION):
	mkdir -p $(TOOLS_DIR)
	@echo "installing VictoriaMetrics $(VM_VERSION) into $(TOOLS_DIR)"
	GOBIN=$(TOOLS_DIR) $(GO) install github.com/VictoriaMetrics/VictoriaMetrics/app/victoria-metrics@$(VM_VERSION)
	touch $@

# Dashboards against VictoriaMetrics and Prometheus (issue 42): the six GPU
# panels over 24 h and 7 d, on 64 GPUs x 7 days and 512 GPUs x 1 day at 1 m,
# the same bytes written in order into all three, gpustore settled (blocks
# compacted into the bucket, the head's last hours), results caches
# bypassed; p50/p99 and server CPU per query, answers compared with
# Prometheus'. ~40 minutes; the table goes to bench/panels-latest.md.
# Extra flags: make bench-panels PANEL_FLAGS='-datasets 64x7d -rounds 5'.
PANEL_FLAGS ?=
bench-panels: $(TOOLS_DIR)/.prometheus-mod-$(PROMETHEUS_VERSION) $(TOOLS_DIR)/.victoria-metrics-$(VM_VERSION)
	$(GO) build -o bin/gpustore ./cmd/gpustore
	$(GO) build -o bin/panelbench ./bench/cmd/panelbench
	./bin/panelbench -gpustore bin/gpustore -prometheus $(TOOLS_DIR)/prometheus \
		-victoria-metrics $(TOOLS_DIR)/victoria-metrics -out bench/panels-latest.md $(PANEL_FLAGS)
