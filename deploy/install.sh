#!/bin/sh
# Installs or uninstalls grouped-snapshotter on a node: the binary, the
# systemd unit, the config file and a containerd drop-in that registers the
# proxy plugin. Idempotent: running it twice changes nothing the second time.
#
#   install.sh install   [--host-root DIR] [--binary PATH] [--cri] [--no-start]
#   install.sh uninstall [--host-root DIR] [--no-start]
#
# --host-root  install into DIR instead of / (the DaemonSet mounts the host
#              there; tests use a temporary directory)
# --binary     the grouped-snapshotter binary to install (default: next to
#              this script, or bin/grouped-snapshotter)
# --cri        also make CRI (kubelet) pull and run with grouped-snapshotter
# --no-start   do not touch systemd or containerd, only files
#
# On install, the order matters for a running node: the snapshotter starts
# and its socket answers BEFORE containerd is restarted with the drop-in;
# otherwise containerd comes up with "failed to find snapshotter" for every
# pod that uses it.
set -eu

ACTION=${1:-}
[ $# -gt 0 ] && shift
HOST=/
BINARY=
CRI=0
START=1
while [ $# -gt 0 ]; do
	case "$1" in
	--host-root) HOST=$2; shift 2 ;;
	--binary) BINARY=$2; shift 2 ;;
	--cri) CRI=1; shift ;;
	--no-start) START=0; shift ;;
	*) echo "install.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done
case "$ACTION" in install|uninstall) ;; *) echo "usage: install.sh install|uninstall [options]" >&2; exit 2 ;; esac

HERE=$(cd "$(dirname "$0")" && pwd)
H=${HOST%/}
BIN_DST=$H/usr/local/bin/grouped-snapshotter
UNIT_DST=$H/etc/systemd/system/grouped-snapshotter.service
CONFIG_DST=$H/etc/grouped-snapshotter/config.toml
DROPIN_DST=$H/etc/containerd/conf.d/grouped-snapshotter.toml
CONTAINERD_CONFIG=$H/etc/containerd/config.toml
IMPORT_PATTERN=/etc/containerd/conf.d/*.toml
MARK="# added by grouped-snapshotter install.sh; removed by its uninstall"
SOCKET=/run/grouped-snapshotter/grouped-snapshotter.sock
ROOT=/var/lib/grouped-snapshotter

# Commands run on the host: directly, or through nsenter into the host's
# namespaces when the host is mounted elsewhere (the DaemonSet).
host() {
	if [ "$H" = "" ]; then "$@"; else nsenter --target 1 --mount --uts --ipc --net --pid -- "$@"; fi
}

# install_file SRC DST MODE: copy only when different, so reruns are no-ops.
install_file() {
	if [ -f "$2" ] && cmp -s "$1" "$2"; then return 0; fi
	mkdir -p "$(dirname "$2")"
	staged="$2.tmp.$$"
	cp "$1" "$staged" && chmod "$3" "$staged" && mv -f "$staged" "$2"
	echo "installed $2"
}

dropin() {
	cat <<TOML
# Registers grouped-snapshotter with containerd 2.x. Installed by
# grouped-snapshotter's install.sh; imported through
# imports = ["$IMPORT_PATTERN"] in /etc/containerd/config.toml.
version = 3

[proxy_plugins.grouped]
  type = "snapshot"
  address = "$SOCKET"
  # remap-ids: user-namespace mappings go to the snapshotter (one view per
  # mapping) instead of a chown copy; rebase: parallel layer unpack.
  capabilities = ["remap-ids", "rebase"]
  [proxy_plugins.grouped.exports]
    # kubelet reports image filesystem usage from here.
    root = "$ROOT"

# Pulls through the transfer service (ctr, CRI) unpack only for listed
# snapshotters; overlayfs stays listed so existing pulls keep working.
[[plugins.'io.containerd.transfer.v1.local'.unpack_config]]
  platform = "linux/amd64"
  snapshotter = "grouped"
  differ = "walking"
[[plugins.'io.containerd.transfer.v1.local'.unpack_config]]
  platform = "linux/amd64"
  snapshotter = "overlayfs"
  differ = "walking"
TOML
	if [ "$CRI" = 1 ]; then
		cat <<TOML

# CRI (kubelet) pulls and runs with grouped-snapshotter.
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "grouped"
TOML
	fi
}

# ensure_imports makes containerd's main config import the drop-in directory;
# it sets CONFIG_CHANGED=1 when it had to change the file.
CONFIG_CHANGED=0
ensure_imports() {
	if [ ! -f "$CONTAINERD_CONFIG" ]; then
		mkdir -p "$(dirname "$CONTAINERD_CONFIG")"
		printf '%s\nversion = 3\nimports = ["%s"]\n' "$MARK (whole file)" "$IMPORT_PATTERN" >"$CONTAINERD_CONFIG"
		CONFIG_CHANGED=1
		echo "created $CONTAINERD_CONFIG importing $IMPORT_PATTERN"
		return 0
	fi
	if grep -Eq '^[[:space:]]*imports[[:space:]]*=.*conf\.d' "$CONTAINERD_CONFIG"; then
		return 0
	fi
	if grep -Eq '^[[:space:]]*imports[[:space:]]*=' "$CONTAINERD_CONFIG"; then
		echo "install.sh: $CONTAINERD_CONFIG has an imports line without $IMPORT_PATTERN; add it by hand" >&2
		exit 1
	fi
	# Top-level keys must precede every table: put imports first.
	tmp="$CONTAINERD_CONFIG.tmp.$$"
	{ printf '%s\nimports = ["%s"]\n' "$MARK" "$IMPORT_PATTERN"; cat "$CONTAINERD_CONFIG"; } >"$tmp"
	chmod --reference="$CONTAINERD_CONFIG" "$tmp" 2>/dev/null || true
	mv -f "$tmp" "$CONTAINERD_CONFIG"
	CONFIG_CHANGED=1
	echo "added imports of $IMPORT_PATTERN to $CONTAINERD_CONFIG"
}

wait_for_socket() {
	i=0
	while [ $i -lt 60 ]; do
		if host /usr/local/bin/grouped-snapshotter version --address "$SOCKET" 2>/dev/null | grep -q '^daemon: [^n]'; then
			return 0
		fi
		i=$((i + 1))
		sleep 1
	done
	echo "install.sh: grouped-snapshotter did not answer on $SOCKET within 60 s; containerd left untouched" >&2
	exit 1
}

do_install() {
	if [ -z "$BINARY" ]; then
		for b in "$HERE/grouped-snapshotter" "$HERE/../bin/grouped-snapshotter"; do
			[ -x "$b" ] && BINARY=$b && break
		done
	fi
	[ -n "$BINARY" ] && [ -x "$BINARY" ] || { echo "install.sh: no grouped-snapshotter binary (use --binary)" >&2; exit 1; }
	install_file "$BINARY" "$BIN_DST" 0755
	install_file "$HERE/systemd/grouped-snapshotter.service" "$UNIT_DST" 0644
	if [ ! -f "$CONFIG_DST" ]; then
		# The operator's config is never overwritten.
		for example in "$HERE/config.toml.example" "$HERE/../config.toml.example"; do
			[ -f "$example" ] && install_file "$example" "$CONFIG_DST" 0644 && break
		done
	fi
	if [ "$START" = 1 ]; then
		host systemctl daemon-reload
		host systemctl enable grouped-snapshotter.service >/dev/null
		host systemctl restart grouped-snapshotter.service
		wait_for_socket
	fi
	if [ ! -d "$(dirname "$DROPIN_DST")" ]; then
		# Remember that conf.d is ours, so uninstall can remove it again.
		mkdir -p "$(dirname "$DROPIN_DST")"
		: >"$(dirname "$DROPIN_DST")/.created-by-grouped-snapshotter"
	fi
	rendered=$(mktemp)
	trap 'rm -f "$rendered"' EXIT
	dropin >"$rendered"
	dropin_changed=0
	if ! { [ -f "$DROPIN_DST" ] && cmp -s "$rendered" "$DROPIN_DST"; }; then dropin_changed=1; fi
	install_file "$rendered" "$DROPIN_DST" 0644
	ensure_imports
	if [ "$START" = 1 ] && { [ "$dropin_changed" = 1 ] || [ "$CONFIG_CHANGED" = 1 ]; }; then
		echo "restarting containerd to load the drop-in (the snapshotter answers)"
		host systemctl restart containerd.service
	fi
	echo "grouped-snapshotter installed"
}

do_uninstall() {
	if [ "$START" = 1 ]; then
		host systemctl disable --now grouped-snapshotter.service 2>/dev/null || true
	fi
	removed_dropin=0
	[ -f "$DROPIN_DST" ] && removed_dropin=1
	for f in "$DROPIN_DST" "$UNIT_DST" "$BIN_DST" "$CONFIG_DST"; do
		if [ -e "$f" ]; then rm -f "$f" && echo "removed $f"; fi
	done
	rmdir "$H/etc/grouped-snapshotter" 2>/dev/null || true
	confd=$(dirname "$DROPIN_DST")
	if [ -f "$confd/.created-by-grouped-snapshotter" ]; then
		rm -f "$confd/.created-by-grouped-snapshotter"
		rmdir "$confd" 2>/dev/null || true
	fi
	# Undo ensure_imports: the whole file if install created it, else the
	# two lines it added.
	if [ -f "$CONTAINERD_CONFIG" ]; then
		if [ "$(head -n 1 "$CONTAINERD_CONFIG")" = "$MARK (whole file)" ]; then
			rm -f "$CONTAINERD_CONFIG" && echo "removed $CONTAINERD_CONFIG"
			rmdir "$H/etc/containerd" 2>/dev/null || true
		elif [ "$(head -n 1 "$CONTAINERD_CONFIG")" = "$MARK" ]; then
			tmp="$CONTAINERD_CONFIG.tmp.$$"
			tail -n +3 "$CONTAINERD_CONFIG" >"$tmp"
			chmod --reference="$CONTAINERD_CONFIG" "$tmp" 2>/dev/null || true
			mv -f "$tmp" "$CONTAINERD_CONFIG" && echo "removed the imports line install added to $CONTAINERD_CONFIG"
		fi
	fi
	if [ "$START" = 1 ]; then
		host systemctl daemon-reload
		[ "$removed_dropin" = 1 ] && host systemctl restart containerd.service
	fi
	# Snapshots under $ROOT are left for the operator: images pulled with
	# grouped-snapshotter are gone from containerd's view once the drop-in is.
	echo "grouped-snapshotter uninstalled (data in $H$ROOT kept; remove it by hand)"
}

"do_$ACTION"
