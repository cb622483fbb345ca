# gpustore — make targets. `make run` starts gpustore on the embedded default
# with a simulated GPU cluster feeding it; `make test` runs every test.
GO        ?= go
TOOLS_DIR ?= $(HOME)/.cache/gpustore-tools/bin
export GPUSTORE_TOOLS_DIR := $(TOOLS_DIR)

PROMETHEUS_VERSION := v0.316.0
VM_VERSION         := v1.151.0
VERSITYGW_VERSION  := v1.8.0

# Packages with concurrency, run again under the race detector.
RACE_PKGS := ./pkg/ingest/... ./pkg/tenantdb/... ./pkg/query/... ./pkg/app/...

.PHONY: all build run test test-unit test-race fuzz tools vet bench bench-compare clean

all: build

build:
	$(GO) build -o bin/gpustore ./cmd/gpustore
	$(GO) build -o bin/gpusim ./bench/cmd/gpusim

# gpustore on the embedded default (data in ./data, port 9201), fed by a
# simulated 16-node (128-GPU) cluster in real time. Ctrl-C stops both.
run: build
	./scripts/run.sh

vet:
	$(GO) vet ./...

test: tools vet test-unit test-race fuzz

test-unit:
	$(GO) test -count=1 ./...

test-race:
	$(GO) test -count=1 -race $(RACE_PKGS)

# A few seconds of each decoder fuzz target (longer: FUZZTIME=5m make fuzz).
FUZZTIME ?= 10s
fuzz:
	$(GO) test -run XXX -fuzz '^FuzzDecodeV1$$' -fuzztime $(FUZZTIME) ./pkg/ingest
	$(GO) test -run XXX -fuzz '^FuzzDecodeV2$$' -fuzztime $(FUZZTIME) ./pkg/ingest

# The real servers the end-to-end tests run on loopback, pinned, installed
# once into $(TOOLS_DIR) (a stamp file per version).
tools: $(TOOLS_DIR)/.prometheus-$(PROMETHEUS_VERSION) $(TOOLS_DIR)/.alertmanager

$(TOOLS_DIR)/.prometheus-$(PROMETHEUS_VERSION):
	mkdir -p $(TOOLS_DIR)
	GOBIN=$(TOOLS_DIR) $(GO) install github.com/prometheus/prometheus/cmd/prometheus@$(PROMETHEUS_VERSION) github.com/prometheus/prometheus/cmd/promtool@$(PROMETHEUS_VERSION)
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

clean:
	rm -rf bin data
