# grouped-snapshotter. `make demo` shows it working against a real
# containerd; `make test` runs every test (as root, as CI does).

GO        ?= go
TOOLS_DIR ?= $(CURDIR)/.tools
export GS_TOOLS_BIN := $(TOOLS_DIR)/bin
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X main.version=$(VERSION)
# Unit and snapshot tests are quick; the integration tests drive a real
# containerd and take a few minutes.
TEST_TIMEOUT ?= 60m

.PHONY: all build tools tools-k8s demo test test-unit test-integration test-compat vet fuzz clean bench bench-quick bench-resume bench-readme install uninstall readme-tables update-results

all: build

build:
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/grouped-snapshotter ./cmd/grouped-snapshotter

# Pinned containerd (every 2.x minor release), runc, crane, crictl, CNI
# plugins and nerdctl, built from the Go module proxy.
tools:
	TOOLS_DIR=$(TOOLS_DIR) hack/install-tools.sh

# Kubernetes v1.37.2 and etcd for the cluster tests (integration/k8s);
# about 6 minutes cold, cached per version.
tools-k8s:
	TOOLS_DIR=$(TOOLS_DIR) hack/install-k8s.sh

demo: tools
	cd integration && $(GO) run ./cmd/demo

# Benchmarks (as root): grouped-snapshotter (idmap view and shim) against
# containerd's overlayfs (in process and behind a proxy) on containerd
# v2.4.2 and v2.0.5, and containerd's erofs on v2.4.2, interleaved. Writes
# bench/results/<name>.{md,json,png} and prints the tables; bench takes
# about 100 minutes on 2 cores (15 repetitions of every pull, burst and
# unpack chain; up to 4 hours on a slower machine), bench-quick about 4.
# bench saves what it finished after each unit (a scenario, a burst
# shape, an image size) in bench/results/latest-partial.json;
# bench-resume runs the rest of a run that stopped.
bench: tools
	cd bench && $(GO) run ./cmd/bench

bench-resume: tools
	cd bench && $(GO) run ./cmd/bench -resume results/latest-partial.json

bench-quick: tools
	cd bench && $(GO) run ./cmd/bench -quick -name quick

# Regenerates the README's benchmark tables (between the bench-tables
# markers) from bench/results/latest.json; no root or tools needed.
bench-readme:
	cd bench && $(GO) run ./cmd/bench -render results/latest.json -readme ../README.md

vet:
	$(GO) vet ./...
	cd integration && $(GO) vet ./...
	cd bench && $(GO) vet ./...

# Rewrites the README's measured figures (between its BEGIN/END markers)
# from the results files the integration tests write and that are
# committed: integration/results/mount-syscalls.json (integration's
# TestMountgroup), integration/results/compat.json (integration/compat)
# and integration/k8s/results/latest.json (integration/k8s).
# integration/cmd/readme-tables's test fails while the README is stale.
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
FUZZ_TARGETS := idmap:FuzzParseRanges idmap:FuzzFromLabels mountgroup:FuzzOverlayMount mountgroup:FuzzShimMountData

fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		echo "fuzz: $$t for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$${t#*:}\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 100x ./$${t%%:*}; \
	done

test: tools tools-k8s vet fuzz
	hack/gotest.sh -timeout=$(TEST_TIMEOUT) ./...

test-unit: vet
	hack/gotest.sh ./idmap/... ./mountgroup/... ./idmount/... ./userns/... ./differ/... ./migrate/... ./snapshot/... ./server/... ./plugin/... ./cmd/... ./preflight/... ./metrics/... ./internal/... ./integration/results/... ./integration/cmd/readme-tables/...

test-integration: tools tools-k8s
	hack/gotest.sh -timeout=$(TEST_TIMEOUT) ./integration/...

# The compatibility matrix alone (also part of `make test`): grouped on
# every containerd 2.x minor release, v2.0.5 to v2.4.2; writes
# _output/results/integration/results/compat.json (make update-results).
test-compat: tools
	hack/gotest.sh -timeout $(TEST_TIMEOUT) ./integration/compat/

# Install on this node as a systemd service and register it with containerd
# (HOST_ROOT=/some/dir installs files only, into that tree). Idempotent.
HOST_ROOT ?= /
install: build
	deploy/install.sh install --host-root $(HOST_ROOT) --binary bin/grouped-snapshotter $(if $(filter /,$(HOST_ROOT)),,--no-start)

uninstall:
	deploy/install.sh uninstall --host-root $(HOST_ROOT) $(if $(filter /,$(HOST_ROOT)),,--no-start)

clean:
	rm -rf bin
