#!/usr/bin/env bash
# Builds a pinned Kubernetes (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet, kubectl, kube-proxy) and etcd from the Go module
# proxy into $TOOLS_DIR/k8s-<version>/bin, for the single-node cluster the
# Kubernetes end-to-end tests (integration/k8s) bring up. A version whose
# stamp is present is not rebuilt: a cold build takes about ten minutes on
# two cores, a warm run none.
set -euo pipefail

TOOLS_DIR=${TOOLS_DIR:-$(cd "$(dirname "$0")/.." && pwd)/.tools}
K8S_VERSION=${K8S_VERSION:-v1.37.2}
ETCD_VERSION=${ETCD_VERSION:-v3.7.3}
OUT="$TOOLS_DIR/k8s-$K8S_VERSION/bin"
STAMP="$TOOLS_DIR/stamps/k8s"
WANT="$K8S_VERSION etcd-$ETCD_VERSION"
mkdir -p "$TOOLS_DIR/stamps" "$TOOLS_DIR/src"

if [ "$(cat "$STAMP" 2>/dev/null)" = "$WANT" ] && [ -x "$OUT/kube-apiserver" ] && [ -x "$OUT/etcd" ]; then
	exit 0
fi

"$(dirname "$0")/install-apt.sh"

# module_copy MODULE@VERSION DIR: a writable copy of a module from the
# module proxy, in DIR.
module_copy() {
	local src
	src=$(GOFLAGS=-mod=mod go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	[ -n "$src" ] || { echo "install-k8s: cannot download $1" >&2; exit 1; }
	rm -rf "$2"
	mkdir -p "$2"
	cp -r "$src/." "$2/"
	chmod -R u+w "$2"
}

mkdir -p "$OUT"
start=$(date +%s)

# Kubernetes: the module zip has no staging/ tree, so its replace directives
# to ./staging/src/k8s.io/X point at nothing; the same code is published as
# k8s.io/X v0.<minor>.<patch>, which is what the replaces are rewritten to.
echo "install-k8s: building Kubernetes $K8S_VERSION"
work="$TOOLS_DIR/src/kubernetes"
module_copy "k8s.io/kubernetes@$K8S_VERSION" "$work"
staging="v0.${K8S_VERSION#v1.}"
minor=${K8S_VERSION#v1.}
minor=${minor%%.*}
(
	cd "$work"
	rm -f go.work go.work.sum
	# sample-* have no published release at this version and are unused.
	sed -i -E \
		-e '/k8s\.io\/sample-(cli-plugin|controller) => /d' \
		-e "s#(k8s\.io/[a-z0-9-]+) => \./staging/src/k8s\.io/[a-z0-9-]+#\1 => \1 $staging#" \
		go.mod
	GOFLAGS=-buildvcs=false CGO_ENABLED=0 go build -mod=mod -trimpath -o "$OUT/" \
		-ldflags "-X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor" \
		./cmd/kube-apiserver ./cmd/kube-controller-manager ./cmd/kube-scheduler \
		./cmd/kubelet ./cmd/kubectl ./cmd/kube-proxy
)
rm -rf "$work"

# etcd: the server module has its main package at its root and a replace
# block pointing at sibling directories the module zip does not have; the
# requires already name the same release.
echo "install-k8s: building etcd $ETCD_VERSION"
work="$TOOLS_DIR/src/etcd"
module_copy "go.etcd.io/etcd/server/v3@$ETCD_VERSION" "$work"
(
	cd "$work"
	sed -i -E '/^replace[[:space:]]*\(/,/^\)/d; /^replace[[:space:]]+go\.etcd\.io/d' go.mod
	GOFLAGS=-buildvcs=false CGO_ENABLED=0 go build -mod=mod -trimpath -o "$OUT/etcd" .
)
rm -rf "$work"

echo "$WANT" >"$STAMP"
echo "install-k8s: Kubernetes $K8S_VERSION and etcd $ETCD_VERSION in $OUT ($(($(date +%s) - start)) s)"
