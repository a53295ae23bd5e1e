#!/usr/bin/env bash
# Builds the DaemonSet's installer image without a container engine: one
# layer with busybox (sh, nsenter, ...), the daemon, grpc-health-probe and
# deploy/, pushed with crane.
#
#   hack/build-image.sh REF            e.g. 127.0.0.1:5000/grouped-snapshotter:dev
#   INSECURE=1 hack/build-image.sh REF  for a plain-http registry
set -euo pipefail
REF=${1:?usage: build-image.sh REF}
REPO=$(cd "$(dirname "$0")/.." && pwd)
TOOLS_BIN=${GS_TOOLS_BIN:-$REPO/.tools/bin}
CRANE=${CRANE:-$TOOLS_BIN/crane}
PROBE=${GRPC_HEALTH_PROBE:-$TOOLS_BIN/grpc-health-probe}
BUSYBOX=${BUSYBOX:-/bin/busybox}
for f in "$CRANE" "$PROBE" "$BUSYBOX"; do
	[ -x "$f" ] || { echo "build-image: $f missing (run make tools; apt-get install busybox-static)" >&2; exit 1; }
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$work/rootfs
mkdir -p "$root"/{bin,usr/local/bin,deploy/systemd,tmp,etc}
chmod 1777 "$root/tmp"
cp "$BUSYBOX" "$root/bin/busybox"
for applet in sh sleep kill nsenter cmp mktemp grep sed cat mkdir cp chmod mv rm rmdir head tail printf dirname basename echo test true false env ls; do
	ln -s busybox "$root/bin/$applet"
done
(cd "$REPO" && CGO_ENABLED=0 go build -trimpath -ldflags "-X main.version=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}" -o "$root/usr/local/bin/grouped-snapshotter" ./cmd/grouped-snapshotter)
cp "$PROBE" "$root/usr/local/bin/grpc-health-probe"
cp "$REPO/deploy/install.sh" "$root/deploy/"
cp "$REPO/deploy/systemd/grouped-snapshotter.service" "$root/deploy/systemd/"
cp "$REPO/config.toml.example" "$root/deploy/"
printf 'root:x:0:0:root:/:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\n' >"$root/etc/group"
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$root" -cf "$work/layer.tar" .

insecure=()
[ "${INSECURE:-0}" = 1 ] && insecure=(--insecure)
"$CRANE" append "${insecure[@]}" --oci-empty-base -f "$work/layer.tar" -t "$REF.raw" >/dev/null
"$CRANE" mutate "${insecure[@]}" "$REF.raw" --set-platform linux/amd64 --cmd /bin/sh \
	-e PATH=/usr/local/bin:/bin -t "$REF" >/dev/null
echo "pushed $REF"
