#!/usr/bin/env bash
# Builds the DaemonSet's installer image without a container engine: one
# layer with busybox (sh, nsenter, ...), the daemon, grpc-health-probe and
# deploy/, pushed with crane.
#
#   hack/build-image.sh REF                   for this machine's architecture,
#                                             e.g. 127.0.0.1:5000/grouped-snapshotter:dev
#   ARCH=arm64 hack/build-image.sh REF        for linux/arm64 (cross-built on amd64)
#   ARCH=amd64,arm64 hack/build-image.sh REF  both: one multi-platform index at REF
#                                             (REF needs a tag; each image is also
#                                             pushed as REF-amd64, REF-arm64)
#   INSECURE=1 hack/build-image.sh REF        for a plain-http registry
#
# For this machine's architecture busybox is $BUSYBOX (/bin/busybox) and the
# probe is $GRPC_HEALTH_PROBE (make tools). For another architecture they
# come from <tools bin>/linux_ARCH/, made on first use and kept: Debian's
# busybox-static for ARCH (apt-get download with a private package list; the
# system's apt configuration is not touched) and the probe cross-built at the
# version of the host's. BUSYBOX_ARM64 or BUSYBOX_AMD64 names another busybox.
# The daemon is built here, stamped with VERSION and COMMIT (default: git's),
# unless BINARY_AMD64 or BINARY_ARM64 names a build to put in (hack/release.sh
# puts in the release's binaries).
set -euo pipefail
REF=${1:?usage: [ARCH=amd64|arm64|amd64,arm64] build-image.sh REF}
REPO=$(cd "$(dirname "$0")/.." && pwd)
TOOLS_BIN=${GS_TOOLS_BIN:-$REPO/.tools/bin}
CRANE=${CRANE:-$TOOLS_BIN/crane}
PROBE=${GRPC_HEALTH_PROBE:-$TOOLS_BIN/grpc-health-probe}
HOST_ARCH=$(go env GOHOSTARCH)
ARCH=${ARCH:-$HOST_ARCH}
VERSION=${VERSION:-$(git -C "$REPO" describe --tags --always --dirty 2>/dev/null || echo dev)}
if [ -z "${COMMIT:-}" ]; then
	COMMIT=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
	[ -z "$(git -C "$REPO" status --porcelain --untracked-files=no 2>/dev/null)" ] || COMMIT=$COMMIT-dirty
fi
IFS=, read -r -a arches <<<"$ARCH"
for a in "${arches[@]}"; do
	case "$a" in
	amd64 | arm64) ;;
	*)
		echo "build-image: architecture '$a' not supported (amd64, arm64)" >&2
		exit 2
		;;
	esac
done
if [ "${#arches[@]}" -gt 1 ] && [[ "${REF##*/}" != *:* ]]; then
	echo "build-image: a multi-platform REF needs a tag (REF-ARCH names each image)" >&2
	exit 2
fi
for f in "$CRANE" "$PROBE"; do
	[ -x "$f" ] || { echo "build-image: $f missing (run make tools)" >&2; exit 1; }
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
insecure=()
[ "${INSECURE:-0}" = 1 ] && insecure=(--insecure)

# elf_arch FILE prints the Go architecture of an ELF executable.
elf_arch() {
	case "$(od -An -tu2 -j18 -N2 "$1" 2>/dev/null | tr -d ' ')" in
	62) echo amd64 ;;
	183) echo arm64 ;;
	*) echo unknown ;;
	esac
}

# need_arch ROOT FILE ARCH fails unless ROOT/FILE is an ARCH executable.
need_arch() {
	local got
	got=$(elf_arch "$1/$2")
	[ "$got" = "$3" ] || { echo "build-image: $2 for the linux/$3 image is built for $got" >&2; exit 1; }
}

# busybox_for ARCH prints the path of a static busybox for ARCH.
busybox_for() {
	local arch=$1 override
	override=BUSYBOX_${arch^^}
	if [ -n "${!override:-}" ]; then
		echo "${!override}"
	elif [ "$arch" = "$HOST_ARCH" ]; then
		echo "${BUSYBOX:-/bin/busybox}"
	else
		local out=$TOOLS_BIN/linux_$arch/busybox
		if [ ! -x "$out" ]; then
			echo "build-image: fetching Debian's busybox-static for $arch" >&2
			local apt=$work/apt
			mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$(dirname "$out")"
			local opts=(-qq -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache"
				-o "APT::Architecture=$arch" -o "APT::Architectures::=$arch" -o APT::Sandbox::User=root)
			apt-get "${opts[@]}" update >&2
			(cd "$apt" && apt-get "${opts[@]}" download "busybox-static:$arch" >&2)
			dpkg-deb --fsys-tarfile "$apt"/busybox-static_*.deb | tar -xO ./bin/busybox >"$out.tmp"
			chmod 755 "$out.tmp"
			mv "$out.tmp" "$out"
		fi
		echo "$out"
	fi
}

# probe_for ARCH prints the path of grpc-health-probe for ARCH.
probe_for() {
	local arch=$1
	if [ "$arch" = "$HOST_ARCH" ]; then
		echo "$PROBE"
		return
	fi
	local version out=$TOOLS_BIN/linux_$arch/grpc-health-probe
	version=$(go version -m "$PROBE" | awk '$1 == "mod" { print $3; exit }')
	[ -n "$version" ] || { echo "build-image: cannot read the module version of $PROBE" >&2; exit 1; }
	if [ ! -x "$out" ] || [ "$(go version -m "$out" | awk '$1 == "mod" { print $3; exit }')" != "$version" ]; then
		echo "build-image: building grpc-health-probe $version for $arch" >&2
		mkdir -p "$(dirname "$out")"
		# go install refuses GOBIN for a cross build: a scratch GOPATH
		# receives it (in bin/linux_ARCH), the module cache stays shared.
		GOMODCACHE=$(go env GOMODCACHE) GOPATH=$work/gopath GOBIN='' GOOS=linux GOARCH=$arch \
			CGO_ENABLED=0 GOFLAGS=-buildvcs=false go install "github.com/grpc-ecosystem/grpc-health-probe@$version" >&2
		cp "$work/gopath/bin/linux_$arch/grpc-health-probe" "$out"
	fi
	echo "$out"
}

# build ARCH TARGET builds the image for linux/ARCH and pushes it as TARGET.
build() {
	local arch=$1 target=$2 busybox probe
	busybox=$(busybox_for "$arch")
	probe=$(probe_for "$arch")
	[ -x "$busybox" ] || { echo "build-image: $busybox missing (apt-get install busybox-static)" >&2; exit 1; }
	local root=$work/rootfs-$arch
	mkdir -p "$root"/{bin,usr/local/bin,deploy/systemd,tmp,etc}
	chmod 1777 "$root/tmp"
	cp "$busybox" "$root/bin/busybox"
	for applet in sh sleep kill nsenter cmp mktemp grep sed cat mkdir cp chmod mv rm rmdir head tail printf dirname basename echo test true false env ls; do
		ln -s busybox "$root/bin/$applet"
	done
	local binary=BINARY_${arch^^}
	if [ -n "${!binary:-}" ]; then
		cp "${!binary}" "$root/usr/local/bin/grouped-snapshotter"
	else
		(cd "$REPO" && GOOS=linux GOARCH=$arch CGO_ENABLED=0 go build -trimpath \
			-ldflags "-X main.version=$VERSION -X main.commit=$COMMIT" \
			-o "$root/usr/local/bin/grouped-snapshotter" ./cmd/grouped-snapshotter)
	fi
	cp "$probe" "$root/usr/local/bin/grpc-health-probe"
	for f in bin/busybox usr/local/bin/grouped-snapshotter usr/local/bin/grpc-health-probe; do
		need_arch "$root" "$f" "$arch"
	done
	cp "$REPO/deploy/install.sh" "$root/deploy/"
	cp "$REPO/deploy/systemd/grouped-snapshotter.service" "$root/deploy/systemd/"
	cp "$REPO/config.toml.example" "$root/deploy/"
	printf 'root:x:0:0:root:/:/bin/sh\n' >"$root/etc/passwd"
	printf 'root:x:0:\n' >"$root/etc/group"
	tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$root" -cf "$work/layer-$arch.tar" .

	"$CRANE" append "${insecure[@]}" --oci-empty-base -f "$work/layer-$arch.tar" -t "$target.raw" >/dev/null
	"$CRANE" mutate "${insecure[@]}" "$target.raw" --set-platform "linux/$arch" --cmd /bin/sh \
		-e PATH=/usr/local/bin:/bin -t "$target" >/dev/null
	echo "pushed $target (linux/$arch)"
}

if [ "${#arches[@]}" -eq 1 ]; then
	build "${arches[0]}" "$REF"
	exit 0
fi
manifests=()
for a in "${arches[@]}"; do
	build "$a" "$REF-$a"
	manifests+=(-m "$REF-$a")
done
# crane warns that it starts from an empty index: say only what failed.
if ! out=$("$CRANE" index append "${insecure[@]}" "${manifests[@]}" -t "$REF" 2>&1); then
	echo "$out" >&2
	exit 1
fi
echo "pushed $REF (index: ${arches[*]})"
