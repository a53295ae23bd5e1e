# grouped-snapshotter. `make demo` shows it working against a real
# containerd; `make test` runs every test (as root, as CI does).

GO        ?= go
TOOLS_DIR ?= $(CURDIR)/.tools
export GS_TOOLS_BIN := $(TOOLS_DIR)/bin
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# The commit, "-dirty" when tracked files differ from it (as VERSION's).
COMMIT    ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)$(shell test -z "$$(git status --porcelain --untracked-files=no 2>/dev/null)" || echo -dirty)
LDFLAGS   := -X main.version=$(VERSION) -X main.commit=$(COMMIT)
# Unit and snapshot tests are quick; the integration tests drive a real
# containerd and take a few minutes.
TEST_TIMEOUT ?= 60m

.PHONY: all build tools tools-demo tools-k8s demo test test-arm64 test-unit test-integration test-compat vet fuzz clean bench bench-full bench-density bench-ab bench-quick bench-resume bench-readme install uninstall readme-tables update-results

all: build

build:
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/grouped-snapshotter ./cmd/grouped-snapshotter

# Pinned containerd (every 2.x minor release), runc, crane, crictl, CNI
# plugins, nerdctl and helm, built from the Go module proxy.
tools:
	TOOLS_DIR=$(TOOLS_DIR) hack/install-tools.sh

# Only what the demo runs: containerd v2.4.2 and v2.0.5, runc and crane.
tools-demo:
	TOOLS_DIR=$(TOOLS_DIR) hack/install-tools.sh demo

# The raw manifests deploy/kubernetes/*.yaml, rendered from the Helm chart
# deploy/helm/grouped-snapshotter (their one source) with helm template;
# integration/manifests fails while they are stale, and lints the chart.
.PHONY: manifests
manifests:
	GS_TOOLS_BIN=$(GS_TOOLS_BIN) hack/render-manifests.sh

# Kubernetes v1.37.2 and etcd for the cluster tests (integration/k8s);
# about 6 minutes cold, cached per version.
tools-k8s:
	TOOLS_DIR=$(TOOLS_DIR) hack/install-k8s.sh

demo: tools-demo
	cd integration && $(GO) run ./cmd/demo

# Benchmarks (as root), contenders interleaved, ratios with bootstrap 95%
# intervals; each writes bench/results/<name>.{md,json,png}.
# bench: the headline, within 20 minutes on 2 cores: grouped view against
# containerd's overlayfs on v2.4.2 and v2.0.5 in bursts of 30
# user-namespaced containers, pulls of 50 and 400 layers and the mount calls
# of a start (bench/results/headline.*).
# bench-full: every scenario and contender (bench/results/latest.*), about
# 3.5 hours on 2 cores; it saves what it finished after each unit in
# bench/results/latest-partial.json, and bench-resume runs the rest of a
# run that stopped. bench-quick: a smoke run of every scenario, minutes.
# bench-ab: build A (AB_REF) against build B (B_REF, default HEAD) of
# grouped-snapshotter, each built from git in a temporary worktree, in
# AB_PAIRS interleaved pairs of bursts and pulls (bench/results/ab-DATE.*).
bench: tools
	cd bench && $(GO) run ./cmd/bench

bench-full: tools tools-k8s
	cd bench && $(GO) run ./cmd/bench -full

# bench-density: scenario 7 of bench-full alone, pod startup at node
# density on the real single-node Kubernetes (bench/results/density.*).
bench-density: tools tools-k8s
	cd bench && $(GO) run ./cmd/bench -density

bench-resume: tools
	cd bench && $(GO) run ./cmd/bench -resume results/latest-partial.json

bench-quick: tools
	cd bench && $(GO) run ./cmd/bench -quick -name quick

AB_REF   ?= b2d463f
B_REF    ?= HEAD
AB_PAIRS ?= 10
bench-ab: tools
	cd bench && $(GO) run ./cmd/bench -a $(AB_REF) -b $(B_REF) -pairs $(AB_PAIRS)

# Regenerates the README's benchmark headline (between the bench-headline
# markers) from bench/results/headline.json (make bench, the current
# code's run) and docs/benchmarks.md's tables (bench-tables, bench-density)
# from bench/results/latest.json (make bench-full), each with
# bench/results/density.json's pod rows where the run has none; no root or
# tools needed. bench's TestBenchREADMECurrent fails while they are stale.
# Then the whole cost per install mode and release (README's advice,
# docs/operations.md's table; TestWholeCostCurrent).
bench-readme:
	cd bench && $(GO) run ./cmd/bench -render results/latest.json -headline results/headline.json -density-results results/density.json -mountlock-results results/mountlock.json -lockstress-results results/lockstress.json -handler-results results/density-handler.json -profile-results results/profile.json -cri-results results/density-cri.json,results/density-cri-v242.json -readme ../docs/benchmarks.md && \
		$(GO) run ./cmd/bench -wholecost ..

# Every module for the host's architecture and for arm64 (one code path on
# both), and the daemon built for arm64 (static: no cgo anywhere).
vet:
	$(GO) vet ./...
	cd integration && $(GO) vet ./...
	cd bench && $(GO) vet ./...
	GOARCH=arm64 $(GO) vet ./...
	cd integration && GOARCH=arm64 $(GO) vet ./...
	cd bench && GOARCH=arm64 $(GO) vet ./...
	GOARCH=arm64 CGO_ENABLED=0 $(GO) build -trimpath -o /dev/null ./cmd/grouped-snapshotter

# Rewrites the measured figures of README.md and docs/benchmarks.md
# (between their BEGIN/END markers) from the committed results files:
# integration/results/mount-syscalls.json (integration's TestMountgroup),
# integration/results/compat.json (integration/compat) and
# integration/k8s/results/latest.json, rollout.json and upgrade.json
# (integration/k8s). integration/cmd/readme-tables's test fails while a document is stale.
readme-tables:
	cd integration && $(GO) run ./cmd/readme-tables -root ..

# Tests never write tracked files (`make test` leaves the work tree as it
# found it, and CI checks that): the integration tests write their fresh
# results under the ignored _output/results, each at its committed file's
# own path (integration/results/results.go). When a person decides the new
# figures should be committed, update-results copies them over the
# committed files, then runs readme-tables. It copies whatever is there:
# remove _output/results before the test run to copy only that run's.
RESULTS_OUT := _output/results
update-results:
	@set -e; \
	test -d $(RESULTS_OUT) || { echo "update-results: no $(RESULTS_OUT); run the tests that write results first (make test, test-integration or test-compat)" >&2; exit 1; }; \
	files=$$(cd $(RESULTS_OUT) && find . -type f ! -name '.*' | sed 's|^\./||' | sort); \
	test -n "$$files" || { echo "update-results: $(RESULTS_OUT) holds no results" >&2; exit 1; }; \
	for f in $$files; do \
		git ls-files --error-unmatch -- "$$f" >/dev/null 2>&1 || { echo "update-results: $(RESULTS_OUT)/$$f: $$f is not a committed file" >&2; exit 1; }; \
	done; \
	for f in $$files; do cp "$(RESULTS_OUT)/$$f" "$$f"; echo "update-results: $$f"; done
	$(MAKE) readme-tables

# A short run of every fuzz target; each one's corpus is committed under
# <package>/testdata/fuzz and also runs with the plain tests.
# A count, not a duration: a timed run can end with the fuzzer's own
# "context deadline exceeded" failure when its workers are slow to stop on a
# loaded machine (seen here), which would fail CI for no input.
FUZZTIME ?= 100000x
FUZZ_TARGETS := mountgroup:FuzzParseRanges mountgroup:FuzzFromLabels mountgroup:FuzzOverlayMount mountgroup:FuzzShimMountData

fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		echo "fuzz: $$t for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$${t#*:}\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 100x ./$${t%%:*}; \
	done

test: tools tools-k8s vet fuzz test-arm64
	hack/gotest.sh -timeout=$(TEST_TIMEOUT) ./...

# The root module's tests as arm64 binaries under qemu-aarch64-static (as
# root), the daemon they run too, among them containerd's snapshotter suite
# over the arm64 daemon's socket; the few tests qemu-user cannot run are
# listed, with the reason, in hack/test-arm64.sh. About 4 minutes on 2
# cores with a warm Go cache, 11 with an empty one (arm64 builds).
test-arm64: tools
	hack/test-arm64.sh

test-unit: vet
	hack/gotest.sh ./mountgroup/... ./migrate/... ./forget/... ./snapshot/... ./server/... ./plugin/... ./config/... ./cmd/... ./preflight/... ./metrics/... ./internal/... ./integration/results/... ./integration/cmd/readme-tables/... ./integration/repository/...

test-integration: tools tools-k8s
	hack/gotest.sh -timeout=$(TEST_TIMEOUT) ./integration/...

# The compatibility matrix alone (also part of `make test`): grouped on
# every containerd 2.x minor release, v2.0.5 to v2.4.2; writes
# _output/results/integration/results/compat.json (make update-results).
test-compat: tools
	hack/gotest.sh -timeout $(TEST_TIMEOUT) ./integration/compat/

# Install on this node as a systemd service and register it with containerd
# (HOST_ROOT=/some/dir installs files only, into that tree). Idempotent.
# It installs what `make build` built and does not build: `sudo make
# install` runs with sudo's PATH, which has no Go on most nodes, and a build
# as root would leave root-owned files in the checkout.
HOST_ROOT ?= /
install:
	@test -x bin/grouped-snapshotter || { echo "make install: no bin/grouped-snapshotter: run make build first (as yourself)" >&2; exit 1; }
	deploy/install.sh install --host-root $(HOST_ROOT) --binary bin/grouped-snapshotter $(if $(filter /,$(HOST_ROOT)),,--no-start)

uninstall:
	deploy/install.sh uninstall --host-root $(HOST_ROOT) $(if $(filter /,$(HOST_ROOT)),,--no-start)

# A versioned release under RELEASE_DIR (hack/release.sh): static binaries
# for linux/amd64 and linux/arm64, a tarball per architecture (the binary,
# install.sh, the systemd unit, the manifests), a .sha256sum file for each,
# and the multi-arch installer image as an OCI layout (image/). Needs
# VERSION=vX.Y.Z and a clean tree (ALLOW_DIRTY=1 for a test build).
.PHONY: release
RELEASE_DIR ?= _output/release/$(VERSION)
release: tools
	VERSION=$(VERSION) COMMIT=$(COMMIT) RELEASE_DIR=$(RELEASE_DIR) ALLOW_DIRTY=$(ALLOW_DIRTY) hack/release.sh

clean:
	rm -rf bin
