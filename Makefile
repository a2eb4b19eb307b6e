# dpconform: `make conformance` runs the suite against the reference dataplane on a
# netns topology; `make test` proves the project. Both install and build what they need.

SHELL := /bin/bash
export PATH := $(PATH):/usr/local/go/bin
GO ?= go
OUT := _output
BIN := $(OUT)/bin

# Debian packages needed at run time, to regenerate the BPF objects, and for kind.
RUNTIME_PKGS := iptables nftables iproute2 conntrack util-linux kmod bpftool ipset
GENERATE_PKGS := clang llvm libbpf-dev
KIND_PKGS := docker.io debootstrap
# The Cilium agent compiles its datapath with clang at run time and needs LLVM >= 18.1
# (Debian 12's default clang is 14); its driver runs /usr/lib/llvm-19/bin/clang.
CILIUM_PKGS := clang-19

.PHONY: all deps deps-generate deps-kind deps-browser deps-cilium control-plane cni \
        kube-router cilium kind-node-binaries binaries build check test test-peers test-time \
        lint lint-ci actionlint bench conformance fuzz fuzz-faults kind-image kind-conformance \
        kind-cluster-conformance selftest calico generate docs publish-conformance cleanup clean

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

## deps-kind: install Docker (Debian's docker.io) and debootstrap, only those missing.
## No service is started: the project runs its own dockerd only while a kind run or
## an image build needs it (topologies/kind/dockerd), so policy-rc.d keeps the
## package's init script from starting one on the host's network.
deps-kind:
	@missing=$$(for p in $(KIND_PKGS); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing: $$missing"; \
		made=; if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; made=1; fi; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; rc=$$?; \
		[ -z "$$made" ] || rm -f /usr/sbin/policy-rc.d; exit $$rc; \
	else echo "deps-kind: all of $(KIND_PKGS) installed"; fi

## deps-browser: Debian's chromium, for the test that loads report.html in a real browser
deps-browser:
	@if command -v chromium >/dev/null; then echo "deps-browser: chromium installed"; else \
		echo "installing: chromium"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; fi

## deps-cilium: install the clang the Cilium agent compiles its datapath with at run time
deps-cilium:
	@missing=$$(for p in $(CILIUM_PKGS); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing: $$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	else echo "deps-cilium: all of $(CILIUM_PKGS) installed"; fi

## control-plane: build etcd, kube-apiserver, kube-controller-manager, kube-proxy once
control-plane:
	@topologies/binaries/build.sh control-plane

## cni: build the ptp, host-local and loopback CNI plugins once
cni:
	@topologies/binaries/build.sh cni

## kube-router: build kube-router (a NetworkPolicy peer, docs/kube-router.md) once
kube-router:
	@topologies/binaries/build.sh kube-router

## cilium: build cilium-agent and cilium-cni (an eBPF dataplane peer, docs/cilium.md) once,
## with the agent's BPF sources and CRDs, and install the clang it needs
cilium: deps-cilium
	@topologies/binaries/build.sh cilium

## kind-node-binaries: build kubelet, kubeadm, kubectl, kube-scheduler once (beside the control plane)
kind-node-binaries:
	@topologies/binaries/build.sh kind-node

binaries: control-plane cni kube-router cilium

## actionlint: build actionlint (its own module, topologies/binaries/actionlint) once
actionlint:
	@topologies/binaries/build.sh actionlint

ACTIONLINT = $(lastword $(shell topologies/binaries/build.sh dir))/actionlint

## lint-ci: lint the vendors' workflows in ci/github with actionlint, offline (its
## shellcheck and pyflakes integrations off), and require it to reject a broken one
lint-ci: actionlint
	$(ACTIONLINT) -shellcheck= -pyflakes= ci/github/*.yml
	@if $(ACTIONLINT) -shellcheck= -pyflakes= ci/github/testdata/broken.yml >/dev/null; then \
		echo "lint-ci: actionlint accepted ci/github/testdata/broken.yml, which has known defects"; exit 1; fi

## calico: build Calico Felix (BPF mode), its BPF objects, CNI plugin and CRDs from a
## Calico source tree, once per version (docs/calico.md); not part of `binaries`: its
## source is not on the module proxy
CALICO_SRC ?=
calico:
	@topologies/binaries/calico/build.sh "$(CALICO_SRC)"

## kind-image: build the kind node image offline once (docs/topologies.md, the kind topology)
kind-image: deps-kind control-plane kind-node-binaries
	@nice -n 19 $(GO) run ./topologies/kind/cmd/kind-image

## build: the project's own binaries into _output/bin. Static (CGO_ENABLED=0): the
## kind topology's pods run dpconform from an image that holds it alone.
build:
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -ldflags "-X main.version=$(VERSION)" -o $(BIN)/ ./conformance/cmd/... ./drivers/... ./reference/cmd/...

## generate: rebuild the BPF objects and their Go bindings with clang
generate: deps-generate
	$(GO) generate ./bpf/...

## lint: gofmt, go vet, staticcheck
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) tool staticcheck ./...

## check: the fast tier, for the edit-test loop: gofmt, vet, staticcheck and every test
## that needs neither root nor a third-party binary (go test -short); no install, no build
check: lint
	$(GO) test -short -count=1 ./...

# make test's record of where its time went (make test-time prints it).
TESTLOG := $(OUT)/test
# The packages of the peers tier (make test-peers): the drivers' own suites, which need
# their peer's binaries. make test runs every other package, the self-test and the
# kube-proxy peers on their own lines, and guards the tier's results in the ledger
# (conformance/peers, TestPeerTierResultsCurrent).
PEER_TIER_PKGS := ./drivers/cilium-driver ./drivers/kube-router-driver
TEST_PKGS = $(shell $(GO) list ./... | grep -v -e '/conformance/peers$$' -e '/conformance/selftest$$' \
	$(foreach p,$(PEER_TIER_PKGS),-e '$(patsubst ./%,/%,$(p))$$'))

# step NAME,COMMAND runs COMMAND and notes its seconds in $(TESTLOG)/steps.tsv; a step
# that fails prints where the time went before make stops.
define step
	@s=$$SECONDS; $(2); rc=$$?; printf '%s\t%d\t%d\n' '$(1)' $$((SECONDS - s)) $$rc >> $(TESTLOG)/steps.tsv; \
	if [ $$rc -ne 0 ]; then $(MAKE) --no-print-directory test-time; fi; exit $$rc
endef

## test: everything that proves the project (privileged tests need root): the fast tier
## (check); every other test as root; the self-test; the kube-proxy peers (Core in both
## modes, ModeSwitch); on one 3-node kind cluster, Core against the reference through the
## kind topology and the cluster topology's tests; then where the time went. The peers
## tier (Cilium, kube-router) is guarded by its results in docs/results, not run.
test:
	@rm -rf $(TESTLOG); mkdir -p $(TESTLOG)
	$(call step,check,$(MAKE) --no-print-directory check)
	$(call step,installs and builds,$(MAKE) --no-print-directory deps deps-generate deps-browser control-plane cni kind-image build lint-ci)
	$(call step,go test (privileged),set -o pipefail; $(GO) test -count=1 -p 1 -timeout 40m $(TEST_PKGS) 2>&1 | tee $(TESTLOG)/go-test.log)
	$(call step,self-test,set -o pipefail; $(GO) test -count=1 -timeout 40m ./conformance/selftest/ 2>&1 | tee -a $(TESTLOG)/go-test.log)
	$(call step,peers: kube-proxy,set -o pipefail; $(GO) test -count=1 -timeout 30m ./conformance/peers/ -ginkgo.label-filter '!cilium && !kube-router' 2>&1 | tee -a $(TESTLOG)/go-test.log)
	$(call step,kind-cluster-conformance,$(MAKE) --no-print-directory kind-cluster-conformance)
	@$(MAKE) --no-print-directory test-time

## test-time: print where the last make test's time went: its steps, each package, and
## the self-test's and peers' runs by phase
test-time:
	@$(GO) run ./internal/testtime $(TESTLOG) $(OUT)/selftest/phases.tsv $(OUT)/peers/phases.tsv

## test-peers: the peers tier: the Cilium and kube-router drivers' suites and their
## peers' full profiles, and kube-proxy's runs (PEERS=cilium, say, for one), each
## complete run written into the results ledger (docs/results) with the commit it ran
## at; commit the entries: make test fails while one is older than what it is judged by
PEERS ?= cilium kube-router kube-proxy
test-peers: deps control-plane cni $(filter cilium kube-router,$(PEERS)) build
	$(GO) test -count=1 -p 1 -timeout 30m $(foreach p,$(PEERS),./drivers/$(p)-driver)
	DPC_LEDGER=1 $(GO) test -count=1 -timeout 60m ./conformance/peers/ -run 'TestPeers$$' -ginkgo.v \
		-ginkgo.label-filter '$(subst $() , || ,$(strip $(PEERS)))'

## bench: the project's benchmarks, with their figures (not part of `make test`)
bench: deps control-plane cni
	$(GO) test -count=1 -p 1 -run '^$$' -bench . -benchtime 3x -timeout 60m ./...

## conformance: run the suite against DRIVER (default: the reference) on a netns topology
## (QUIET=1: a line per result, for CI logs)
conformance: deps control-plane cni build
	$(BIN)/dpconform run --driver $(DRIVER) $(if $(PROFILES),--profiles $(PROFILES)) $(if $(QUIET),--quiet) --output $(OUT)/conformance

## fuzz: random compositions of transitions against DRIVER (default: the reference) for
## FUZZ_DURATION (default 30m) from FUZZ_SEED (default: from the time); a violation is
## shrunk to _output/fuzz/replay.yaml (docs/fuzzing.md)
FUZZ_DURATION ?= 30m
fuzz: deps control-plane cni build
	$(BIN)/dpconform fuzz --driver $(DRIVER) --duration $(FUZZ_DURATION) $(if $(FUZZ_SEED),--seed $(FUZZ_SEED)) $(if $(QUIET),--quiet) --output $(OUT)/fuzz

## fuzz-faults: fuzz the reference with each named fault on (FAULTS: a comma-separated
## few), at most FUZZ_ROUNDS rounds of seed FUZZ_SEED each, and write how long each took
## to find and what it shrank to into FUZZ_DETECT (docs/results/notes/fuzzing.md cites it)
FUZZ_ROUNDS ?= 3
FUZZ_DETECT ?= $(OUT)/fuzz-detection.tsv
fuzz-faults: deps control-plane cni
	@mkdir -p $(dir $(FUZZ_DETECT))
	DPC_FUZZ_DETECT=$(abspath $(FUZZ_DETECT)) DPC_FUZZ_SEED=$(or $(FUZZ_SEED),1) DPC_FUZZ_ROUNDS=$(FUZZ_ROUNDS) $(if $(FAULTS),DPC_FUZZ_FAULTS=$(FAULTS)) \
		$(GO) test -count=1 -timeout 3h -run '^TestDetection$$' -v ./conformance/fuzz/

## publish-conformance: put the last make conformance run into the results ledger as
## RUN (default all-profiles), with the commit it ran at (commit first; then make docs)
RUN ?= all-profiles
publish-conformance: build
	$(BIN)/dpconform publish --run $(RUN) --command "make conformance$(if $(PROFILES), PROFILES=$(PROFILES))" $(OUT)/conformance docs/results

## kind-conformance: the Core profile (PROFILES) against DRIVER on a 2-node kind cluster:
## cluster up, suite, report in _output/kind-conformance, cluster down (also on failure)
kind-conformance: deps deps-kind control-plane cni kind-image build
	$(BIN)/dpconform run --topology kind --driver $(DRIVER) --profiles $(or $(PROFILES),Core) --output $(OUT)/kind-conformance -v

## kind-cluster-conformance: one kind cluster of three nodes serving two runs: Core
## through the kind topology (report in _output/kind-conformance), then on the same
## cluster, known by its kubeconfig alone, the cluster provider's own tests and Core
## through --topology cluster (report in _output/cluster-conformance; the third node
## carries the external client), cluster down (also on failure). Part of `make test`.
## CLUSTER_CORE=1 runs Core through the cluster topology, 0 leaves it out (saying so);
## by default it runs on a machine of CLUSTER_CORE_CPUS CPUs or more. On 2 cores the
## three nodes' probes, relays and control plane want more than the machine has, and
## the restart specs' probes starve (docs/topologies.md, the cluster topology).
CLUSTER_CORE_CPUS := 4
CLUSTER_CORE ?= $(shell [ "$$(nproc)" -ge $(CLUSTER_CORE_CPUS) ] && echo 1 || echo 0)
kind-cluster-conformance: deps deps-kind control-plane cni kind-image build
	$(GO) test -c -o $(OUT)/cluster.test ./topologies/cluster/
	$(BIN)/dpconform run --topology kind --kind-nodes 3 --driver $(DRIVER) --profiles $(or $(PROFILES),Core) --output $(OUT)/kind-conformance -v \
		--kind-then 'export DPC_CLUSTER_KUBECONFIG="$$DPC_KIND_KUBECONFIG" DPC_CLUSTER_DPCONFORM=$(CURDIR)/$(BIN)/dpconform; \
			$(CURDIR)/$(OUT)/cluster.test -test.count=1 -test.v -test.timeout 15m; t=$$?; \
			if [ "$(CLUSTER_CORE)" != 1 ]; then \
				echo "kind-cluster-conformance: NOT RUN: Core through the cluster topology: this machine has $$(nproc) CPUs, fewer than $(CLUSTER_CORE_CPUS), too few for the three nodes (docs/topologies.md, the cluster topology); CLUSTER_CORE=1 runs it"; \
				exit $$t; fi; \
			$(CURDIR)/$(BIN)/dpconform run --topology cluster --kubeconfig "$$DPC_KIND_KUBECONFIG" \
				--spare-address "$$DPC_KIND_SPARE_ADDRESSES" --driver $(DRIVER) --profiles $(or $(PROFILES),Core) \
				--output $(OUT)/cluster-conformance -v && exit $$t'

## selftest: every spec passes against the clean reference and fails against each fault it names
## (CLOCK_SKEW=1000s: with every node and the external client on a clock of its own)
selftest: deps control-plane cni
	$(if $(CLOCK_SKEW),DPC_CLOCK_SKEW=$(CLOCK_SKEW)) $(GO) test -count=1 -timeout 60m ./conformance/selftest/ -ginkgo.v

## docs: write docs/specs.md from the spec registry, and from the results ledger its page
## (docs/results/README.md, the transition matrix) and README.md's generated blocks (tests
## fail when they differ)
docs:
	$(GO) run ./conformance/cmd/dpconform specs --markdown > docs/specs.md.new && mv docs/specs.md.new docs/specs.md
	$(GO) run ./conformance/cmd/dpconform matrix --write docs/results

## cleanup: remove what killed runs left behind (netns and kind)
cleanup: build
	$(BIN)/dpconform cleanup

clean:
	rm -rf $(OUT)
