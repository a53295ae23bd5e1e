#!/usr/bin/env bash
# Builds the pinned real components the integration tests and the demo drive,
# from the Go module proxy, into $TOOLS_DIR/bin. Idempotent: a tool whose
# stamp file names the same version is not rebuilt.
set -euo pipefail

TOOLS_DIR=${TOOLS_DIR:-$(cd "$(dirname "$0")/.." && pwd)/.tools}
BIN="$TOOLS_DIR/bin"
mkdir -p "$BIN" "$TOOLS_DIR/stamps"

CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.4.2}
RUNC_VERSION=${RUNC_VERSION:-v1.5.2}
CRANE_VERSION=${CRANE_VERSION:-v0.22.1}

need_apt=()
[ -e /usr/include/seccomp.h ] || need_apt+=(libseccomp-dev)
[ -x /bin/busybox ] || need_apt+=(busybox-static)
command -v gcc >/dev/null || need_apt+=(gcc)
command -v pkg-config >/dev/null || need_apt+=(pkg-config)
if [ ${#need_apt[@]} -gt 0 ]; then
	echo "install-tools: apt-get install ${need_apt[*]}"
	DEBIAN_FRONTEND=noninteractive apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# build NAME VERSION TAGS PKG...
build() {
	local name=$1 version=$2 tags=$3
	shift 3
	if [ "$(cat "$TOOLS_DIR/stamps/$name" 2>/dev/null)" = "$version" ]; then
		return 0
	fi
	echo "install-tools: building $name $version"
	GOBIN="$BIN" GOFLAGS=-buildvcs=false CGO_ENABLED=1 go install ${tags:+-tags "$tags"} "$@"
	echo "$version" >"$TOOLS_DIR/stamps/$name"
}

build containerd "$CONTAINERD_VERSION" no_btrfs \
	"github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION" \
	"github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION" \
	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION"
build runc "$RUNC_VERSION" seccomp "github.com/opencontainers/runc@$RUNC_VERSION"
build crane "$CRANE_VERSION" "" "github.com/google/go-containerregistry/cmd/crane@$CRANE_VERSION"

echo "install-tools: tools in $BIN"
