#!/usr/bin/env bash
# Builds the pinned real components the integration tests and the demo drive,
# from the Go module proxy, into $TOOLS_DIR/bin. Idempotent: a tool whose
# stamp file names the same version is not rebuilt.
#
#   hack/install-tools.sh        everything make test needs (the default)
#   hack/install-tools.sh demo   only what make demo runs: containerd v2.4.2
#                                and v2.0.5 (containerd, ctr, the runc shim),
#                                runc, crane
set -euo pipefail

SET=${1:-all}
case "$SET" in
all | demo) ;;
*)
	echo "usage: install-tools.sh [all|demo]" >&2
	exit 2
	;;
esac

TOOLS_DIR=${TOOLS_DIR:-$(cd "$(dirname "$0")/.." && pwd)/.tools}
BIN="$TOOLS_DIR/bin"
mkdir -p "$BIN" "$TOOLS_DIR/stamps"

CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.4.2}
RUNC_VERSION=${RUNC_VERSION:-v1.5.2}
CRANE_VERSION=${CRANE_VERSION:-v0.22.1}
# containerd v2.0.5: the last 2.0 release the module proxy serves from before
# containerd idmapped once per mount instead of once per layer.
CONTAINERD_OLD_VERSION=${CONTAINERD_OLD_VERSION:-v2.0.5}
CRICTL_VERSION=${CRICTL_VERSION:-v1.37.0}
CNI_VERSION=${CNI_VERSION:-v1.9.0}
NERDCTL_VERSION=${NERDCTL_VERSION:-v2.2.1}
# Helm 4: the chart's lint and rendering (integration/manifests), and the
# Kubernetes tests install through the chart.
HELM_VERSION=${HELM_VERSION:-v4.3.2}

"$(dirname "$0")/install-apt.sh"

# build NAME VERSION TAGS PKG...
build() {
	local name=$1 version=$2 tags=$3
	shift 3
	if [ "$(cat "$TOOLS_DIR/stamps/$name" 2>/dev/null)" = "$version" ]; then
		return 0
	fi
	echo "install-tools: building $name $version"
	# OUT_DIR overrides the directory; GOBIN_SUB names one under $BIN.
	local out=${OUT_DIR:-$BIN/${GOBIN_SUB:-}}
	mkdir -p "$out"
	GOBIN="$out" GOFLAGS=-buildvcs=false CGO_ENABLED=${CGO:-1} go install ${tags:+-tags "$tags"} "$@"
	echo "$version" >"$TOOLS_DIR/stamps/$name"
}

build containerd "$CONTAINERD_VERSION" no_btrfs \
	"github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION" \
	"github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION" \
	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION"
build runc "$RUNC_VERSION" seccomp "github.com/opencontainers/runc@$RUNC_VERSION"
build crane "$CRANE_VERSION" "" "github.com/google/go-containerregistry/cmd/crane@$CRANE_VERSION"
# build_module NAME MODULE VERSION OUTDIR TAGS PKG... builds from a copy of a
# module whose go.mod `go install` refuses (exclude or replace directives).
build_module() {
	local name=$1 module=$2 version=$3 out=$4 tags=$5
	shift 5
	if [ "$(cat "$TOOLS_DIR/stamps/$name" 2>/dev/null)" = "$version" ]; then
		return 0
	fi
	echo "install-tools: building $name $version from a module copy"
	local src
	src=$(GOFLAGS=-mod=mod go mod download -json "$module@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	[ -n "$src" ] || { echo "install-tools: cannot download $module@$version" >&2; exit 1; }
	local work="$TOOLS_DIR/src/$name"
	rm -rf "$work"
	mkdir -p "$work" "$out"
	cp -r "$src/." "$work/"
	chmod -R u+w "$work"
	if [ -n "${PREPARE:-}" ]; then (cd "$work" && eval "$PREPARE"); fi
	(cd "$work" && GOFLAGS=-buildvcs=false CGO_ENABLED=1 go build -mod=mod ${tags:+-tags "$tags"} -o "$out/" "$@")
	rm -rf "$work"
	echo "$version" >"$TOOLS_DIR/stamps/$name"
}

# The demo shows the mount calls of a user-namespaced start on v2.0.5 too.
build_module containerd-old github.com/containerd/containerd/v2 "$CONTAINERD_OLD_VERSION" \
	"$TOOLS_DIR/containerd-$CONTAINERD_OLD_VERSION/bin" no_btrfs \
	./cmd/containerd ./cmd/ctr ./cmd/containerd-shim-runc-v2

if [ "$SET" = demo ]; then
	echo "install-tools: demo tools in $BIN"
	exit 0
fi
# Static: it runs in the DaemonSet's busybox image, which has no libc.
CGO=0 build grpc-health-probe "${GRPC_HEALTH_PROBE_VERSION:-v0.4.62} static" "" "github.com/grpc-ecosystem/grpc-health-probe@${GRPC_HEALTH_PROBE_VERSION:-v0.4.62}"
build crictl "$CRICTL_VERSION" "" "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"
CGO=0 build helm "$HELM_VERSION" "" "helm.sh/helm/v4/cmd/helm@$HELM_VERSION"
GOBIN_SUB=cni build cni "$CNI_VERSION" "" \
	"github.com/containernetworking/plugins/plugins/main/bridge@$CNI_VERSION" \
	"github.com/containernetworking/plugins/plugins/main/loopback@$CNI_VERSION" \
	"github.com/containernetworking/plugins/plugins/ipam/host-local@$CNI_VERSION"


# The compatibility matrix (integration/compat) runs every containerd 2.x
# minor release; each goes to $TOOLS_DIR/containerd-<version>/bin. v2.1.4 is
# the last 2.1 release before containerd idmapped once per mount; like
# v2.0.5 its go.mod has directives `go install` refuses. v2.2.9 and v2.3.7,
# the newest patches of their minors on the module proxy, install plainly.
CONTAINERD_V21_VERSION=${CONTAINERD_V21_VERSION:-v2.1.4}
CONTAINERD_V22_VERSION=${CONTAINERD_V22_VERSION:-v2.2.9}
CONTAINERD_V23_VERSION=${CONTAINERD_V23_VERSION:-v2.3.7}
build_module containerd-v2.1 github.com/containerd/containerd/v2 "$CONTAINERD_V21_VERSION" \
	"$TOOLS_DIR/containerd-$CONTAINERD_V21_VERSION/bin" no_btrfs \
	./cmd/containerd ./cmd/ctr ./cmd/containerd-shim-runc-v2
for v in "$CONTAINERD_V22_VERSION" "$CONTAINERD_V23_VERSION"; do
	OUT_DIR=$TOOLS_DIR/containerd-$v/bin build "containerd-${v%.*}" "$v" no_btrfs \
		"github.com/containerd/containerd/v2/cmd/containerd@$v" \
		"github.com/containerd/containerd/v2/cmd/ctr@$v" \
		"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$v"
done
# nerdctl's module refers to a sibling module (tigron) only its repository
# has, and one test helper needs it: stub the module, drop the helper.
PREPARE='mkdir -p mod/tigron && printf "module github.com/containerd/nerdctl/mod/tigron\n\ngo 1.24\n" >mod/tigron/go.mod && rm -f cmd/nerdctl/helpers/testing_linux.go' \
	build_module nerdctl github.com/containerd/nerdctl/v2 "$NERDCTL_VERSION" "$BIN" "" ./cmd/nerdctl

echo "install-tools: tools in $BIN"
