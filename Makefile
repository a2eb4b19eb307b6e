# dpconform: `make conformance` runs the suite against the reference dataplane on a
# netns topology; `make test` proves the project. Both install and build what they need.

SHELL := /bin/bash
export PATH := $(PATH):/usr/local/go/bin
GO ?= go
OUT := _output
BIN := $(OUT)/bin

# Debian packages needed at run time, and to regenerate the BPF objects.
RUNTIME_PKGS := iptables nftables iproute2 conntrack util-linux kmod bpftool ipset
GENERATE_PKGS := clang llvm libbpf-dev

.PHONY: all deps deps-generate control-plane cni kube-router binaries build test lint \
        bench conformance selftest generate cleanup clean calico

# The implementation `make conformance` runs against, and the profiles to run
# (default: every profile it claims).
DRIVER ?= $(BIN)/refdp-driver
PROFILES ?=
# Stamped into the reference's driver, which reports it in `info` and so in reports.
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)

all: build

## deps: install the Debian packages needed at run time, only those missing
deps:
	@missing=$$(for p in $(RUNTIME_PKGS); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing: $$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	else echo "deps: all of $(RUNTIME_PKGS) installed"; fi

## deps-generate: install clang and libbpf headers (for `make generate` and its check)
deps-generate:
	@missing=$$(for p in $(GENERATE_PKGS); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing: $$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	else echo "deps-generate: all of $(GENERATE_PKGS) installed"; fi

## control-plane: build etcd, kube-apiserver, kube-controller-manager, kube-proxy once
control-plane:
	@topologies/binaries/build.sh control-plane

## cni: build the ptp, host-local and loopback CNI plugins once
cni:
	@topologies/binaries/build.sh cni

## kube-router: build kube-router (a NetworkPolicy peer, docs/kube-router.md) once
kube-router:
	@topologies/binaries/build.sh kube-router

binaries: control-plane cni kube-router

## calico: build Calico Felix (BPF mode), its BPF objects, CNI plugin and CRDs from a
## Calico source tree, once per version (docs/calico.md); not part of `binaries`: its
## source is not on the module proxy
CALICO_SRC ?=
calico:
	@topologies/binaries/calico/build.sh "$(CALICO_SRC)"

## build: the project's own binaries into _output/bin
build:
	@mkdir -p $(BIN)
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o $(BIN)/ ./conformance/cmd/... ./reference/cmd/...

## generate: rebuild the BPF objects and their Go bindings with clang
generate: deps-generate
	$(GO) generate ./bpf/...

## lint: gofmt, go vet, staticcheck
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) tool staticcheck ./...

## test: everything that proves the project (privileged tests need root)
test: deps deps-generate binaries lint
	$(GO) test -count=1 -p 1 -timeout 60m ./...

## bench: the project's benchmarks, with their figures (not part of `make test`)
bench: deps binaries
	$(GO) test -count=1 -p 1 -run '^$$' -bench . -benchtime 3x -timeout 60m ./...

## conformance: run the suite against DRIVER (default: the reference) on a netns topology
conformance: deps binaries build
	$(BIN)/dpconform run --driver $(DRIVER) $(if $(PROFILES),--profiles $(PROFILES)) --output $(OUT)/conformance

## selftest: every spec passes against the clean reference and fails against each fault it names
selftest: deps binaries
	$(GO) test -count=1 -timeout 60m ./conformance/selftest/ -ginkgo.v

## cleanup: remove what killed runs left behind
cleanup: build
	$(BIN)/dpconform cleanup

clean:
	rm -rf $(OUT)
