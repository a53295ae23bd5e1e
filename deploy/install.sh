#!/bin/sh
# shellcheck disable=SC2016 # the single-quoted scripts run in a shell of their own
# Installs or uninstalls grouped-snapshotter on a node: the binary, the service (systemd, or a
# supervised host process), its config and the containerd drop-in that registers the proxy plugin.
# Idempotent. docs/operations.md#installsh-options explains each option.
#
# usage: install.sh install   [options] [--binary PATH] [--cri [--import] | --runtime-handler NAME] [--export]
#        install.sh uninstall [options] [--export] [--purge [--force-purge]]
#        install.sh supervise [options]   (the DaemonSet pod's main loop)
#
#   --binary PATH             the binary to install (default: next to this script, or ../bin/)
#   --cri                     CRI (kubelet) pulls and runs pods with grouped
#   --import                  with --cri: first move the node's images from overlayfs into grouped
#   --runtime-handler NAME    instead of --cri: only pods of CRI runtime handler NAME run on grouped
#   --export                  install without --cri, or uninstall: first move the images to overlayfs
#   --export-namespaces NS    containerd namespaces to import or export (default "k8s.io")
#   --no-start                only files: touch no service and no containerd
#   --purge                   uninstall also removes the data and the log
#   --force-purge             --purge even while containers use the data
#   --host-root DIR           the node's / is mounted at DIR: host commands run through nsenter
#   --host-pid PID            a process in the host's namespaces, for nsenter (default 1)
#   --service-manager M       systemd | none | auto (default auto: systemd when the host runs it)
#   --containerd-restart CMD  restarts containerd (default with systemd: systemctl restart containerd.service)
#   --containerd-config F     containerd's config (default /etc/containerd/config.toml); drop-ins in conf.d/
#   --containerd-address S    containerd's socket (default /run/containerd/containerd.sock)
#   --containerd-bin PATH     the host's containerd, for its config dump (default containerd)
#   --root DIR                the daemon's data (default /var/lib/grouped-snapshotter)
#   --socket PATH             its socket (default /run/grouped-snapshotter/grouped-snapshotter.sock)
#   --bin-dir DIR             where its binary goes (default /usr/local/bin)
#   --config-file F           its config (default /etc/grouped-snapshotter/config.toml)
#   --log-file F              its log without systemd (default /var/log/grouped-snapshotter.log)
#   --daemon-flags FLAGS      more flags for the daemon: plain words, space-separated
#   --help                    this text
#
# Every option with a value but --binary can be given as GS_<OPTION> in the environment (--root:
# GS_ROOT): the DaemonSet's install, supervise and `kubectl exec` uninstall agree. Host paths.
#
# On the releases where grouped gains, use the mode the whole cost per containerd release recommends
# (docs/operations.md; the DaemonSet's default, kept so by bench's TestDefaultFollowsWholeCost):
# Recommended install mode: --cri
set -eu

ACTION=${1:-}
[ $# -gt 0 ] && shift
HOST=${GS_HOST_ROOT:-/}
HOST_PID=${GS_HOST_PID:-1}
SERVICE_MANAGER=${GS_SERVICE_MANAGER:-auto}
CONTAINERD_RESTART=${GS_CONTAINERD_RESTART:-}
CONTAINERD_CONFIG=${GS_CONTAINERD_CONFIG:-/etc/containerd/config.toml}
CONTAINERD_BIN=${GS_CONTAINERD_BIN:-containerd}
RUNTIME_HANDLER=${GS_RUNTIME_HANDLER:-}
ROOT=${GS_ROOT:-/var/lib/grouped-snapshotter}
SOCKET=${GS_SOCKET:-/run/grouped-snapshotter/grouped-snapshotter.sock}
BIN_DIR=${GS_BIN_DIR:-/usr/local/bin}
CONFIG_FILE=${GS_CONFIG_FILE:-/etc/grouped-snapshotter/config.toml}
LOG_FILE=${GS_LOG_FILE:-/var/log/grouped-snapshotter.log}
CONTAINERD_ADDRESS=${GS_CONTAINERD_ADDRESS:-/run/containerd/containerd.sock}
EXPORT_NAMESPACES=${GS_EXPORT_NAMESPACES:-k8s.io}
DAEMON_FLAGS=${GS_DAEMON_FLAGS:-}
EXPORT=0 IMPORT=0 BINARY='' CRI=0 START=1 PURGE=0 PURGE_FORCE='' PURGE_FAILED=0
# Set by the install's steps: what changed, what it moves (MOVE: import, export or ""), rendered files.
BINARY_CHANGED=0 UNIT_CHANGED=0 CONFIG_CHANGED=0 RUNTIME_CHANGED=0 MOVE='' RUNTIME_RENDERED='' CRI_RENDERED=''
usage() { sed -n '3,/^[^#]/s/^# \{0,1\}//p' "$0"; }
warn() { echo "install.sh: $*" >&2; }
die() { code=$1; shift; warn "$@"; exit "$code"; }
need() { if [ $# -lt 2 ] || [ -z "$2" ]; then die 2 "$1 needs a value"; fi; }
case "$ACTION" in -h | --help) usage; exit 0 ;; esac
while [ $# -gt 0 ]; do
	case "$1" in
	--host-root) need "$@"; HOST=$2; shift 2 ;;
	--host-pid) need "$@"; HOST_PID=$2; shift 2 ;;
	--binary) need "$@"; BINARY=$2; shift 2 ;;
	--cri) CRI=1; shift ;;
	--runtime-handler) need "$@"; RUNTIME_HANDLER=$2; shift 2 ;;
	--containerd-bin) need "$@"; CONTAINERD_BIN=$2; shift 2 ;;
	--no-start) START=0; shift ;;
	--purge) PURGE=1; shift ;;
	--force-purge) PURGE=1; PURGE_FORCE=--force; shift ;;
	--export) EXPORT=1; shift ;;
	--import) IMPORT=1; shift ;;
	--export-namespaces) need "$@"; EXPORT_NAMESPACES=$2; shift 2 ;;
	--containerd-address) need "$@"; CONTAINERD_ADDRESS=$2; shift 2 ;;
	--service-manager) need "$@"; SERVICE_MANAGER=$2; shift 2 ;;
	--containerd-restart) need "$@"; CONTAINERD_RESTART=$2; shift 2 ;;
	--containerd-config) need "$@"; CONTAINERD_CONFIG=$2; shift 2 ;;
	--root) need "$@"; ROOT=$2; shift 2 ;;
	--socket) need "$@"; SOCKET=$2; shift 2 ;;
	--bin-dir) need "$@"; BIN_DIR=$2; shift 2 ;;
	--config-file) need "$@"; CONFIG_FILE=$2; shift 2 ;;
	--log-file) need "$@"; LOG_FILE=$2; shift 2 ;;
	--daemon-flags) need "$@"; DAEMON_FLAGS=$2; shift 2 ;;
	-h | --help) usage; exit 0 ;;
	*) die 2 "unknown argument $1" ;;
	esac
done
case "$ACTION" in install | uninstall | supervise) ;; *) usage >&2; exit 2 ;; esac
for p in "$CONTAINERD_CONFIG" "$CONTAINERD_ADDRESS" "$ROOT" "$SOCKET" "$BIN_DIR" "$CONFIG_FILE" "$LOG_FILE"; do
	case "$p" in /*) ;; *) die 2 "$p is not an absolute host path" ;; esac
done
[ -z "$RUNTIME_HANDLER" ] || [ "$CRI" = 0 ] || die 2 "--runtime-handler keeps CRI's default snapshotter and --cri replaces it: choose one"
# The flags go into the unit's ExecStart by sed and to the daemon as words.
case "$DAEMON_FLAGS" in *[\#\&\\\"\'\`\$]*) die 2 "--daemon-flags $DAEMON_FLAGS: only plain words, without # & \\ quotes, backticks or \$" ;; esac
case "$HOST_PID" in *[!0-9]*) die 2 "--host-pid $HOST_PID is not a pid" ;; esac
case "$ROOT" in /|/usr|/etc|/var|/var/lib|/run|/tmp) die 2 "refusing --root $ROOT" ;; esac

HERE=$(cd "$(dirname "$0")" && pwd)
H=${HOST%/}
BIN=$BIN_DIR/grouped-snapshotter
UNIT=/etc/systemd/system/grouped-snapshotter.service
CONFD=$(dirname "$CONTAINERD_CONFIG")/conf.d
DROPIN=$CONFD/grouped-snapshotter.toml
# Turns CRI's gRPC service off while switch_cri moves the last images: it exists for seconds.
CRI_PAUSE=$CONFD/grouped-snapshotter-cri-paused.toml
RUNTIME_DROPIN=$CONFD/grouped-snapshotter-runtime.toml
# With --cri, pods without a RuntimeClass run with CRI_HANDLER, a copy of the default handler
# from before the install that follows CRI's snapshotter, while SYSTEM_HANDLER (the DaemonSet's
# RuntimeClass) stays on overlayfs for its pods and pulls: the DaemonSet's pod, which starts the
# daemon again after a reboot without systemd, never needs grouped. That handler must exist
# before the first install, hence containerd's stock one.
CRI_HANDLER=grouped-default
SYSTEM_HANDLER=runc
# DROPIN records the handler CRI_HANDLER copies: the next install's dump names CRI_HANDLER.
CRI_TEMPLATE_MARK="# CRI's default runtime handler before grouped-snapshotter:"
IMPORT_PATTERN="$CONFD/*.toml"
RUN_DIR=$(dirname "$SOCKET")
PIDFILE=$RUN_DIR/grouped-snapshotter.pid
CGROUP_NAME=grouped-snapshotter
MARK="# added by grouped-snapshotter install.sh; removed by its uninstall"

# Host commands: through nsenter when the host is mounted elsewhere (the DaemonSet).
host() {
	if [ "$H" = "" ]; then "$@"; else nsenter --target "$HOST_PID" --mount --uts --ipc --net --pid -- "$@"; fi
}

if [ "$SERVICE_MANAGER" = auto ]; then
	# --no-start only lays out files: the systemd layout, ready to enable.
	if [ "$START" = 0 ] || [ -d "$H/run/systemd/system" ]; then SERVICE_MANAGER=systemd; else SERVICE_MANAGER=none; fi
fi
case "$SERVICE_MANAGER" in
systemd) [ -n "$CONTAINERD_RESTART" ] || CONTAINERD_RESTART="systemctl restart containerd.service" ;;
none) ;;
*) die 2 "--service-manager must be systemd, none or auto, not $SERVICE_MANAGER" ;;
esac
if [ "$START" = 1 ] && [ "$ACTION" != supervise ] && [ -z "$CONTAINERD_RESTART" ]; then
	die 2 "the host has no systemd: say how to restart containerd with --containerd-restart (or GS_CONTAINERD_RESTART)"
fi

# daemon_args: flags only for values that differ from the daemon's defaults, so that a default
# install runs the plain shipped unit.
daemon_args() {
	args=serve
	[ "$CONFIG_FILE" = /etc/grouped-snapshotter/config.toml ] || args="$args --config $CONFIG_FILE"
	[ "$ROOT" = /var/lib/grouped-snapshotter ] || args="$args --root $ROOT"
	[ "$SOCKET" = /run/grouped-snapshotter/grouped-snapshotter.sock ] || args="$args --address $SOCKET"
	# idmap = "auto" asks containerd's release here.
	[ "$CONTAINERD_ADDRESS" = /run/containerd/containerd.sock ] || args="$args --containerd-address $CONTAINERD_ADDRESS"
	[ -z "$DAEMON_FLAGS" ] || args="$args $DAEMON_FLAGS"
	echo "$args"
}

# install_file SRC DST MODE copies only when different (reruns are no-ops); it returns 1 when
# DST was already up to date.
install_file() {
	if [ -f "$2" ] && cmp -s "$1" "$2"; then return 1; fi
	mkdir -p "$(dirname "$2")"
	staged="$2.tmp.$$"
	cp "$1" "$staged" && chmod "$3" "$staged" && mv -f "$staged" "$2"
	echo "installed $2"
}

# remove FILE...: those that exist, saying so.
remove() {
	for f; do
		if [ -e "$f" ]; then rm -f "$f" && echo "removed $f"; fi
	done
}

unit() { sed "s#^ExecStart=.*#ExecStart=$BIN $(daemon_args)#" "$HERE/systemd/grouped-snapshotter.service"; }

dropin() {
	# The transfer service unpacks only for the platforms listed: the node's own.
	case $(uname -m) in
	x86_64) arch=amd64 ;;
	aarch64 | arm64) arch=arm64 ;;
	*) die 1 "unsupported machine architecture $(uname -m) (amd64 and arm64 are)" ;;
	esac
	cat <<TOML
# Registers grouped-snapshotter with containerd 2.x. Installed by
# grouped-snapshotter's install.sh; imported through
# imports = ["$IMPORT_PATTERN"] in $CONTAINERD_CONFIG.
version = 3

[proxy_plugins.grouped]
  type = "snapshot"
  address = "$SOCKET"
  # remap-ids: user-namespace mappings go to the snapshotter (one view per
  # mapping) instead of a chown copy. Never "rebase": containerd's parallel
  # unpack would lose whiteouts and parent directories' owners, and the
  # daemon refuses its rebasing commits.
  capabilities = ["remap-ids"]
  [proxy_plugins.grouped.exports]
    # kubelet reports image filesystem usage from here.
    root = "$ROOT"

# Pulls through the transfer service (ctr, CRI) unpack only for listed
# snapshotters; overlayfs stays listed so existing pulls keep working.
[[plugins.'io.containerd.transfer.v1.local'.unpack_config]]
  platform = "linux/$arch"
  snapshotter = "grouped"
  differ = "walking"
[[plugins.'io.containerd.transfer.v1.local'.unpack_config]]
  platform = "linux/$arch"
  snapshotter = "overlayfs"
  differ = "walking"
TOML
	if [ "$CRI" = 1 ]; then
		[ -s "$CRI_RENDERED" ] || die 1 "internal error: CRI's runtime handlers were not rendered"
		cat <<TOML

# CRI (kubelet) pulls and runs with grouped-snapshotter.
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "grouped"
  # Pulls for pods of handler $SYSTEM_HANDLER (the DaemonSet's, whose pod
  # annotation io.containerd.cri.runtime-handler names it) unpack into
  # overlayfs: the DaemonSet's own image never needs grouped.
  [plugins.'io.containerd.cri.v1.images'.runtime_platforms.$SYSTEM_HANDLER]
    snapshotter = "overlayfs"

# Pods without a RuntimeClass run with $CRI_HANDLER, which follows CRI's
# snapshotter; $SYSTEM_HANDLER keeps overlayfs (see install.sh's CRI_HANDLER).
TOML
		cat "$CRI_RENDERED"
		cat <<TOML

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.$SYSTEM_HANDLER]
  snapshotter = "overlayfs"
TOML
	fi
}

# ensure_imports makes containerd's main config import the drop-in directory; it sets
# CONFIG_CHANGED=1 when it changed the file.
ensure_imports() {
	cfg=$H$CONTAINERD_CONFIG
	if [ ! -f "$cfg" ]; then
		mkdir -p "$(dirname "$cfg")"
		printf '%s\nversion = 3\nimports = ["%s"]\n' "$MARK (whole file)" "$IMPORT_PATTERN" >"$cfg"
		CONFIG_CHANGED=1
		echo "created $cfg importing $IMPORT_PATTERN"
		return 0
	fi
	if grep -Fq "\"$IMPORT_PATTERN\"" "$cfg" || grep -Fq "'$IMPORT_PATTERN'" "$cfg"; then
		return 0
	fi
	if grep -Eq '^[[:space:]]*imports[[:space:]]*=' "$cfg"; then
		die 1 "$cfg has an imports line without \"$IMPORT_PATTERN\"; add it by hand"
	fi
	# Top-level keys must precede every table: put imports first.
	tmp="$cfg.tmp.$$"
	{ printf '%s\nimports = ["%s"]\n' "$MARK" "$IMPORT_PATTERN"; cat "$cfg"; } >"$tmp"
	chmod --reference="$cfg" "$tmp" 2>/dev/null || true
	mv -f "$tmp" "$cfg"
	CONFIG_CHANGED=1
	echo "added imports of $IMPORT_PATTERN to $cfg"
}

answers() { host "$BIN" version --address "$SOCKET" 2>/dev/null | grep -q '^daemon: [^n]'; }

wait_for_socket() {
	i=0
	while [ $i -lt 60 ]; do
		answers && return 0
		i=$((i + 1))
		sleep 1
	done
	die 1 "grouped-snapshotter did not answer on $SOCKET within 60 s; containerd left untouched"
}

restart_containerd() {
	echo "restarting containerd ($CONTAINERD_RESTART)"
	host sh -c "$CONTAINERD_RESTART"
}

# detach CGROUP SCRIPT [ARG...] runs the shell SCRIPT, ARGs as $1..., on the host in a new
# session and in cgroup CGROUP of every hierarchy ("" is the root), so that it outlives this
# script and this pod (a pod's cgroups are killed with it, hostPID or not). No output.
detach() {
	cgroup=$1 script=$2
	shift 2
	set -- sh -c '
		for d in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
			[ -f "${d}cgroup.procs" ] || continue
			g=${d}$0
			mkdir -p "$g"
			# cgroup v1 cpuset: an empty cpuset refuses tasks.
			[ ! -f "$g/cpuset.cpus" ] || [ -n "$(cat "$g/cpuset.cpus")" ] || cat "${d}cpuset.cpus" >"$g/cpuset.cpus"
			[ ! -f "$g/cpuset.mems" ] || [ -n "$(cat "$g/cpuset.mems")" ] || cat "${d}cpuset.mems" >"$g/cpuset.mems"
			echo $$ >"$g/cgroup.procs"
		done 2>/dev/null
		'"$script" "$cgroup" "$@"
	# Not host() on the node itself: a subshell running that function would wait for setsid
	# and hold this script's output open (`install.sh install | tee log` would hang).
	if [ "$H" = "" ]; then
		setsid "$@" </dev/null >/dev/null 2>&1 &
	else
		host setsid "$@" </dev/null >/dev/null 2>&1 &
	fi
}

restart_containerd_detached() {
	echo "restarting containerd ($CONTAINERD_RESTART), detached"
	detach "" 'exec sh -c "$1"' "$CONTAINERD_RESTART"
}

# --- without systemd: a detached host process in a cgroup of its own ---

# running_pid prints the daemon's pid when the pidfile names a live process whose command line
# starts with $BIN (or an interpreter and $BIN), as start_detached execs it: a pidfile that
# outlived a reboot may name a reused pid, one merely mentioning grouped-snapshotter included.
running_pid() {
	pid=$(cat "$H$PIDFILE" 2>/dev/null) || return 1
	case "$pid" in '' | *[!0-9]*) return 1 ;; esac
	host sh -c 'kill -0 "$1" 2>/dev/null && tr "\000" "\n" <"/proc/$1/cmdline" | head -n 2 | grep -qxF -- "$2"' sh "$pid" "$BIN" || return 1
	echo "$pid"
}

# start_detached [FLAG...] starts the daemon on the host, outside this pod, logging to the log
# file. The daemon refuses to start when another one serves the socket or holds the metadata,
# unless it takes over (take_over).
start_detached() {
	mkdir -p "$H$RUN_DIR" "$(dirname "$H$LOG_FILE")"
	# shellcheck disable=SC2046 # daemon_args is a list of words
	detach "$CGROUP_NAME" '
		pidfile=$1 log=$2
		shift 2
		echo $$ >"$pidfile"
		exec "$@" >>"$log" 2>&1' "$PIDFILE" "$LOG_FILE" "$BIN" $(daemon_args) "$@"
	echo "started grouped-snapshotter on the host (log $LOG_FILE)"
}

# stop_detached removes the pidfile first, so that `supervise` does not take the stop for a crash.
stop_detached() {
	pid=$(running_pid) || { rm -f "$H$PIDFILE"; return 0; }
	rm -f "$H$PIDFILE"
	host kill -TERM "$pid"
	wait_gone "$pid" "did not stop within 45 s"
	echo "stopped grouped-snapshotter (pid $pid)"
}

# wait_gone PID WHY waits up to 45 s for the host process PID to end, and dies with WHY.
wait_gone() {
	i=0
	while host kill -0 "$1" 2>/dev/null; do
		i=$((i + 1))
		[ $i -le 450 ] || die 1 "grouped-snapshotter (pid $1) $2"
		sleep 0.1
	done
}

remove_cgroups() { host sh -c 'for d in /sys/fs/cgroup/*/'"$CGROUP_NAME"' /sys/fs/cgroup/'"$CGROUP_NAME"'; do [ ! -d "$d" ] || rmdir "$d" 2>/dev/null || true; done'; }

# start_service (re)starts the daemon and waits for its socket: containerd must not load the
# drop-in before (every pod on grouped would fail with "failed to find snapshotter"). A new
# binary or unit restarts it; an unchanged one keeps serving.
start_service() {
	if [ "$SERVICE_MANAGER" = systemd ]; then
		host systemctl daemon-reload
		host systemctl enable grouped-snapshotter.service >/dev/null
		# Type=notify: the job fails when the daemon exits before it is ready.
		verb=start
		if [ "$BINARY_CHANGED" = 1 ] || [ "$UNIT_CHANGED" = 1 ]; then verb=restart; fi
		if ! host systemctl "$verb" grouped-snapshotter.service; then
			warn "grouped-snapshotter did not start; its last lines:"
			host journalctl -u grouped-snapshotter.service -n 8 --no-pager -o cat >&2 || true
			die 1 "containerd left untouched; fix the above and run the install again"
		fi
	elif old=$(running_pid); then
		[ "$BINARY_CHANGED" = 0 ] || take_over "$old"
	else
		rm -f "$H$PIDFILE"
		start_detached
	fi
	wait_for_socket
}

# take_over PID starts the new binary with --take-over: it takes the socket from the daemon PID
# (whose calls in flight finish) before that one stops, so that the socket never refuses a call
# and containerd's calls only wait for the new daemon.
take_over() {
	start_detached --take-over
	wait_gone "$1" "still runs 45 s after the new binary started to take over from it; see $LOG_FILE"
	echo "grouped-snapshotter (pid $1) handed its socket over"
}

do_install() {
	if [ -z "$BINARY" ]; then
		for b in "$HERE/grouped-snapshotter" "$HERE/../bin/grouped-snapshotter"; do
			[ -x "$b" ] && BINARY=$b && break
		done
	fi
	if [ -z "$BINARY" ] || [ ! -x "$BINARY" ]; then die 1 "no grouped-snapshotter binary (use --binary)"; fi
	plan_move
	# Refusals come before anything is written.
	[ -z "$MOVE" ] || check_move
	render_runtime
	render_cri
	rendered=$(mktemp)
	trap 'rm -f "$rendered" "$CRI_RENDERED"' EXIT
	if install_file "$BINARY" "$H$BIN" 0755; then BINARY_CHANGED=1; fi
	if [ "$SERVICE_MANAGER" = systemd ]; then
		unit >"$rendered"
		if install_file "$rendered" "$H$UNIT" 0644; then UNIT_CHANGED=1; fi
	fi
	if [ ! -f "$H$CONFIG_FILE" ]; then
		# The operator's config is never overwritten.
		for example in "$HERE/config.toml.example" "$HERE/../config.toml.example"; do
			[ -f "$example" ] || continue
			if [ -n "$RUNTIME_HANDLER" ]; then
				# The handler's pods find the images CRI pulls into overlayfs in grouped:
				# the daemon borrows overlayfs's layers instead of an unpack at the first pod.
				borrow_config "$example" >"$rendered"
				install_file "$rendered" "$H$CONFIG_FILE" 0644 || true
			else
				install_file "$example" "$H$CONFIG_FILE" 0644 || true
			fi
			break
		done
	fi
	[ "$START" = 0 ] || start_service
	if [ ! -d "$H$CONFD" ]; then
		# Remember that conf.d is ours, so uninstall can remove it again.
		mkdir -p "$H$CONFD"
		: >"$H$CONFD/.created-by-grouped-snapshotter"
	fi
	runtime_dropin
	if [ -n "$MOVE" ]; then switch_cri; else load_dropin "can load the drop-in"; fi
	echo "grouped-snapshotter installed"
}

# load_dropin WHAT installs DROPIN as dropin renders it and, when a file changed, restarts
# containerd so that it loads it, then forget_stale.
load_dropin() {
	dropin >"$rendered"
	changed=$RUNTIME_CHANGED
	if install_file "$rendered" "$H$DROPIN" 0644; then changed=1; fi
	ensure_imports
	# Left by a switch that died with CRI off where its watchdog could not run.
	if [ -f "$H$CRI_PAUSE" ]; then
		rm -f "$H$CRI_PAUSE"
		echo "removed $H$CRI_PAUSE, left by an interrupted switch of CRI's snapshotter"
		changed=1
	fi
	if [ "$START" = 1 ] && { [ "$changed" = 1 ] || [ "$CONFIG_CHANGED" = 1 ]; }; then
		echo "the snapshotter answers on $SOCKET: containerd $1"
		restart_containerd
		forget_stale
	fi
}

# borrow_config prints the config file $1 with borrow_from = "overlayfs".
borrow_config() {
	if grep -Eq '^[[:space:]]*borrow_from[[:space:]]*=' "$1"; then
		sed -E 's/^[[:space:]]*borrow_from[[:space:]]*=.*/borrow_from = "overlayfs"/' "$1"
	else
		cat "$1"
		printf '\n# install.sh --runtime-handler\nborrow_from = "overlayfs"\n'
	fi
}

# render_runtime renders the drop-in of --runtime-handler from containerd's configuration as
# the host's containerd reads it, with the binary being installed, before anything is written.
render_runtime() {
	[ -n "$RUNTIME_HANDLER" ] || return 0
	RUNTIME_RENDERED=$(mktemp)
	if ! host sh -c '"$1" --config "$2" config dump | "$3" runtime-handler --name "$4"' sh \
		"$CONTAINERD_BIN" "$CONTAINERD_CONFIG" "$(abs_binary)" "$RUNTIME_HANDLER" >"$RUNTIME_RENDERED"; then
		rm -f "$RUNTIME_RENDERED"
		die 1 "cannot render runtime handler $RUNTIME_HANDLER from \`$CONTAINERD_BIN --config $CONTAINERD_CONFIG config dump\` (above): nothing was installed or changed"
	fi
}

# render_cri renders, before anything is written, CRI_HANDLER for DROPIN's CRI part
# (CRI_RENDERED) whenever DROPIN may make grouped CRI's snapshotter, the first step of
# --export's switch included: a copy of the default handler from before the install (the
# dump's default, or the one DROPIN recorded once CRI_HANDLER is the default).
render_cri() {
	[ "$CRI" = 1 ] || [ "$MOVE" = export ] || return 0
	dump=$(mktemp)
	raw=$(mktemp)
	CRI_RENDERED=$(mktemp)
	template=
	[ ! -f "$H$DROPIN" ] || template=$(sed -n "s/^$CRI_TEMPLATE_MARK \"\(.*\)\"\$/\1/p" "$H$DROPIN")
	if host "$CONTAINERD_BIN" --config "$CONTAINERD_CONFIG" config dump >"$dump" 2>"$raw"; then
		current=$(sed -n "s/^[[:space:]]*default_runtime_name = [\"']\([^\"']*\)[\"']\$/\1/p" "$dump" | head -n 1)
		[ -n "$template" ] || template=${current:-runc}
		if [ "$template" != "$CRI_HANDLER" ] &&
			sed "s/^\([[:space:]]*default_runtime_name = \).*\$/\1'$template'/" "$dump" |
			host "$(abs_binary)" runtime-handler --name "$CRI_HANDLER" --snapshotter "" >"$raw"; then
			# Its tables follow DROPIN's own: no comments, version or empty parent tables.
			{
				echo "$CRI_TEMPLATE_MARK \"$template\""
				sed -e '/^#/d' -e '/^version = /d' -e '/^$/d' \
					-e "/^\[plugins\]\$/d" \
					-e "/^\[plugins\.'io\.containerd\.cri\.v1\.runtime'\]\$/d" \
					-e "/^\[plugins\.'io\.containerd\.cri\.v1\.runtime'\.containerd\.runtimes\]\$/d" \
					-e "/^\[plugins\.'io\.containerd\.cri\.v1\.runtime'\.containerd\]\$/a\\
default_runtime_name = '$CRI_HANDLER'" "$raw"
			} >"$CRI_RENDERED"
			if grep -q "^default_runtime_name = '$CRI_HANDLER'\$" "$CRI_RENDERED"; then
				rm -f "$dump" "$raw"
				return 0
			fi
		fi
	fi
	cat "$raw" >&2
	rm -f "$dump" "$raw" "$CRI_RENDERED"
	die 1 "cannot render CRI's default runtime handler $CRI_HANDLER (a copy of ${template:-the default one}) from \`$CONTAINERD_BIN --config $CONTAINERD_CONFIG config dump\` (above): nothing was installed or changed"
}

# runtime_dropin installs the rendered drop-in of --runtime-handler, or removes one an earlier
# install left; it sets RUNTIME_CHANGED=1 when it changed a file.
runtime_dropin() {
	if [ -n "$RUNTIME_RENDERED" ]; then
		if install_file "$RUNTIME_RENDERED" "$H$RUNTIME_DROPIN" 0644; then
			RUNTIME_CHANGED=1
			echo "runtime handler $RUNTIME_HANDLER runs its pods on grouped; CRI's other pods and its pulls stay on its snapshotter"
			# containerd's CRI syncs writable-layer usage for its default snapshotter only
			# (plugins/cri/images/plugin.go, 2.0 to 2.4).
			echo "note: kubelet sees no writable-layer usage of pods of handler $RUNTIME_HANDLER (containerd's CRI reports it for its default snapshotter only), and while one runs kubelet's eviction manager fails to get summary stats and evicts no pod on the node: alert on grouped_snapshotter_writable_layer_bytes (docs/operations.md)"
		fi
		rm -f "$RUNTIME_RENDERED"
	elif [ -f "$H$RUNTIME_DROPIN" ]; then
		rm -f "$H$RUNTIME_DROPIN"
		echo "removed $H$RUNTIME_DROPIN: no --runtime-handler"
		RUNTIME_CHANGED=1
	fi
}

# --- moving CRI's images when its snapshotter changes (--import, --export) ---

cri_on_grouped() { [ -f "$H$DROPIN" ] && grep -q "io.containerd.cri.v1.images" "$H$DROPIN"; }

# plan_move sets MOVE and FROM/TO, the two snapshotters.
plan_move() {
	[ "$IMPORT" = 0 ] || [ "$CRI" = 1 ] || die 2 "--import moves the node's images for CRI: it needs --cri"
	[ "$IMPORT" = 0 ] || [ "$EXPORT" = 0 ] || die 2 "install takes --import (with --cri) or --export (without), not both"
	[ "$START" = 1 ] || [ "$IMPORT$EXPORT" = 00 ] || die 2 "--import and --export need the daemon and containerd running; not with --no-start"
	[ "$EXPORT" = 0 ] || [ "$CRI" = 0 ] || die 2 "install --export moves CRI's images back to overlayfs: not with --cri"
	if [ "$IMPORT" = 1 ]; then
		if cri_on_grouped; then echo "CRI already runs on grouped: nothing to import"; else MOVE=import FROM=overlayfs TO=grouped; fi
	elif [ "$EXPORT" = 1 ]; then
		if cri_on_grouped; then MOVE=export FROM=grouped TO=overlayfs; else echo "CRI does not run on grouped: nothing to export"; fi
	fi
}

# abs_binary prints --binary as a path the host can execute before it is installed: in the
# DaemonSet through this process's root (hostPID).
abs_binary() {
	b=$(cd "$(dirname "$BINARY")" && pwd)/$(basename "$BINARY")
	if [ -n "$H" ]; then b=/proc/$$/root$b; fi
	echo "$b"
}

# move_images BIN [FLAG...] runs `BIN $MOVE` for each namespace of --export-namespaces.
move_images() {
	bin=$1
	shift
	for ns in $EXPORT_NAMESPACES; do
		host "$bin" "$MOVE" --containerd-address "$CONTAINERD_ADDRESS" --namespace "$ns" "$@" || return 1
	done
}

# check_move refuses a node whose images cannot move (containerd does not answer, an image
# cannot move, copies across filesystems would not fit) with a dry run.
check_move() {
	echo "checking that the images of containerd namespaces $EXPORT_NAMESPACES can move from $FROM to $TO"
	dest=
	[ "$MOVE" = export ] || dest="--destination-root $ROOT"
	# shellcheck disable=SC2086 # dest is a list of words
	move_images "$(abs_binary)" --dry-run $dest ||
		die 1 "the node's images cannot move from $FROM to $TO (above): nothing was installed or changed"
}

# forget_stale, once containerd has loaded the plugin and before anything unpacks into grouped:
# records of snapshots an uninstall --purge deleted under running containers make containerd
# refuse to unpack those layers again. Not fatal: only images unpacked before the purge suffer.
forget_stale() {
	host "$BIN" forget --stale --containerd-address "$CONTAINERD_ADDRESS" ||
		warn "warning: containerd's records of snapshots grouped no longer has could not be removed (above); unpacking an image into grouped that was there before the last purge may fail until \`grouped-snapshotter forget --stale\` succeeds"
}

# pause_cri turns CRI's gRPC service off (a containerd restart): kubelet can neither pull nor
# start anything. Should this script die meanwhile (its pod deleted), a host process turns CRI
# on again: without CRI, kubelet could not start the pod that would finish the switch.
pause_cri() {
	cat >"$H$CRI_PAUSE.tmp.$$" <<TOML
# Written by grouped-snapshotter's install.sh while it moves the last of
# CRI's images from $FROM to $TO; removed seconds later, when CRI comes
# back on $TO. Left behind, it keeps kubelet from working: remove it and
# restart containerd, or run the install again.
version = 3
disabled_plugins = ["io.containerd.grpc.v1.cri"]
TOML
	mv -f "$H$CRI_PAUSE.tmp.$$" "$H$CRI_PAUSE"
	detach "" '
		pid=$1 pause=$2 restart=$3
		while kill -0 "$pid" 2>/dev/null && [ -e "$pause" ]; do sleep 1; done
		[ -e "$pause" ] || exit 0
		rm -f "$pause"
		exec sh -c "$restart"' "$$" "$CRI_PAUSE" "$CONTAINERD_RESTART"
	echo "turning CRI off: pods neither start nor pull until it is back"
	restart_containerd
}

# switch_cri changes CRI's snapshotter from FROM to TO so that no pod pulls or unpacks an image
# FROM holds, one created meanwhile included; the steps are docs/operations.md's "Switching
# CRI's snapshotter without a pull storm". A failed move leaves CRI on FROM.
switch_cri() {
	want_cri=$CRI
	if [ "$MOVE" = import ]; then CRI=0; else CRI=1; fi
	load_dropin "loads the drop-in; CRI keeps running pods from $FROM"
	CRI=$want_cri
	echo "${MOVE}ing the images of containerd namespaces $EXPORT_NAMESPACES from $FROM to $TO while CRI keeps serving pods from $FROM"
	move_images "$BIN" ||
		die 1 "the $MOVE from $FROM to $TO failed (above); CRI runs its pods from $FROM as before, nothing was switched; run the install again to finish (the $MOVE resumes)"
	pause_cri
	echo "${MOVE}ing what CRI pulled meanwhile"
	if ! move_images "$BIN"; then
		rm -f "$H$CRI_PAUSE"
		echo "turning CRI on again, on $FROM as before"
		restart_containerd || true
		die 1 "the $MOVE from $FROM to $TO failed (above); CRI runs its pods from $FROM as before the install, nothing was switched; run the install again to finish (the $MOVE resumes)"
	fi
	dropin >"$rendered"
	install_file "$rendered" "$H$DROPIN" 0644 || true
	rm -f "$H$CRI_PAUSE"
	echo "turning CRI on again, on $TO"
	restart_containerd
	echo "CRI switched from $FROM to $TO with every image of $EXPORT_NAMESPACES in $TO"
}

# export_images: before anything is removed, every image of the export namespaces unpacked in
# overlayfs again from the running daemon's layers; a failure leaves the node unchanged.
export_images() {
	[ "$START" = 1 ] || die 2 "--export needs the daemon and containerd running; not with --no-start"
	[ -x "$H$BIN" ] || die 1 "--export: $BIN is not installed"
	for ns in $EXPORT_NAMESPACES; do
		echo "exporting the images of containerd namespace $ns to overlayfs"
		host "$BIN" export --containerd-address "$CONTAINERD_ADDRESS" --namespace "$ns" ||
			die 1 "export of namespace $ns failed; nothing was uninstalled"
	done
}

# check_purge refuses an uninstall --purge, before anything changes, while mounts use files in
# the root (the purge would refuse too, or with --force-purge leave them on deleted files). The
# DaemonSet pod's own containers do not count: the purge waits until they are gone. A binary
# whose purge lacks --check (older releases) is not asked.
check_purge() {
	[ -x "$H$BIN" ] || return 0
	host "$BIN" purge --help 2>/dev/null | grep -q -- --check || return 0
	pod=
	if supervisor_pid=$(running_supervisor); then pod="--ignore-pod-of $supervisor_pid"; fi
	# shellcheck disable=SC2086 # pod is a list of words
	host "$BIN" purge --check --config /dev/null --root "$ROOT" $pod && return 0
	if [ -n "$PURGE_FORCE" ]; then
		warn "warning: --force-purge: the purge deletes the files of the mounts above"
		return 0
	fi
	die 1 "the purge of $ROOT is refused (above): nothing was uninstalled; remove those containers first, or uninstall with --force-purge"
}

do_uninstall() {
	[ "$PURGE" = 0 ] || check_purge
	[ "$EXPORT" = 0 ] || export_images
	if [ "$PURGE" = 1 ] && [ "$START" = 1 ] && [ -x "$H$BIN" ]; then
		# The purge deletes grouped's snapshots: containerd's records of them go first, while
		# containerd still knows the snapshotter.
		host "$BIN" forget --containerd-address "$CONTAINERD_ADDRESS" ||
			die 1 "containerd's records of grouped's snapshots could not be removed (above; containerd lists them through the running daemon); nothing was uninstalled: start the daemon, or uninstall without --purge"
	fi
	removed_dropin=0
	if [ -f "$H$DROPIN" ] || [ -f "$H$RUNTIME_DROPIN" ]; then removed_dropin=1; fi
	remove "$H$RUNTIME_DROPIN" "$H$DROPIN"
	rm -f "$H$CRI_PAUSE"
	if [ -f "$H$CONFD/.created-by-grouped-snapshotter" ]; then
		rm -f "$H$CONFD/.created-by-grouped-snapshotter"
		rmdir "$H$CONFD" 2>/dev/null || true
	fi
	# Undo ensure_imports: the whole file if install created it, else the two lines it added.
	cfg=$H$CONTAINERD_CONFIG
	if [ -f "$cfg" ]; then
		if [ "$(head -n 1 "$cfg")" = "$MARK (whole file)" ]; then
			rm -f "$cfg" && echo "removed $cfg"
			rmdir "$(dirname "$cfg")" 2>/dev/null || true
		elif [ "$(head -n 1 "$cfg")" = "$MARK" ]; then
			tmp="$cfg.tmp.$$"
			tail -n +3 "$cfg" >"$tmp"
			chmod --reference="$cfg" "$tmp" 2>/dev/null || true
			mv -f "$tmp" "$cfg" && echo "removed the imports line install added to $cfg"
		fi
	fi
	if [ "$START" = 1 ] && [ "$SERVICE_MANAGER" = systemd ]; then
		host systemctl disable --now grouped-snapshotter.service 2>/dev/null || true
		# A failed unit (a crash loop that hit the start limit) stays loaded and listed by
		# systemctl --failed, its file gone or not.
		host systemctl reset-failed grouped-snapshotter.service 2>/dev/null || true
	elif [ "$START" = 1 ]; then
		stop_detached
		remove_cgroups
	fi
	if [ "$PURGE" = 1 ] && [ -x "$H$BIN" ] && supervisor_pid=$(running_supervisor); then
		# Run from the DaemonSet pod, whose own root filesystem may be made of grouped's layers.
		deferred_purge "$supervisor_pid"
		echo "the data in $ROOT is purged once this pod is deleted; should the purge be refused then, it says why in $LOG_FILE, kept with $BIN"
	else
		# The purge refuses while a daemon serves the socket, and unmounts the mapped parents.
		# Not with the config file: one the daemon refused must not stop the purge halfway.
		# shellcheck disable=SC2086 # PURGE_FORCE is empty or one word
		if [ "$PURGE" = 1 ] && [ -x "$H$BIN" ] &&
			! host "$BIN" purge $PURGE_FORCE --config /dev/null --root "$ROOT" --address "$SOCKET"; then
			PURGE_FAILED=1
		fi
		remove_files
	fi
	[ "$START" = 0 ] || [ "$SERVICE_MANAGER" != systemd ] || host systemctl daemon-reload
	if [ "$PURGE_FAILED" = 1 ]; then
		# Not fatal before containerd's restart below: the drop-in is gone.
		warn "grouped-snapshotter uninstalled, but its data in $H$ROOT was NOT purged: the purge failed (above); $H$BIN stays for it: $BIN purge --root $ROOT --address $SOCKET"
	elif [ "$PURGE" = 1 ]; then
		echo "grouped-snapshotter uninstalled"
	else
		echo "grouped-snapshotter uninstalled (data in $H$ROOT kept; uninstall --purge removes it)"
	fi
	# Last: containerd forgets the snapshotter. Through kubectl exec this session ends with
	# containerd (CRI serves exec), so the restart runs detached on the host.
	if [ "$START" = 1 ] && [ "$removed_dropin" = 1 ]; then
		if [ -n "$H" ]; then restart_containerd_detached; else restart_containerd; fi
	fi
	[ "$PURGE_FAILED" = 0 ] || exit 1
}

# remove_files: a failed purge keeps the binary, to run it again, and the log.
remove_files() {
	remove "$H$UNIT"
	[ "$PURGE_FAILED" = 1 ] || remove "$H$BIN"
	remove "$H$CONFIG_FILE"
	[ "$PURGE$PURGE_FAILED" != 10 ] || remove "$H$LOG_FILE"
	rmdir "$(dirname "$H$CONFIG_FILE")" 2>/dev/null || true
	rmdir "$H$RUN_DIR" 2>/dev/null || true
}

# The supervise loop of a DaemonSet pod records its (host) pid in the pod's own /tmp, where an
# uninstall run with kubectl exec in the same pod finds it.
SUPERVISOR_PIDFILE=/tmp/grouped-snapshotter-supervise.pid
running_supervisor() {
	[ -n "$H" ] || return 1
	pid=$(cat "$SUPERVISOR_PIDFILE" 2>/dev/null) || return 1
	case "$pid" in '' | *[!0-9]*) return 1 ;; esac
	kill -0 "$pid" 2>/dev/null || return 1
	echo "$pid"
}

# deferred_purge PID: a host process, outside this pod's cgroups, waits (up to an hour) for PID,
# this pod's main process, to end, then purges the root and removes the binary, config, unit and
# log. The pod's log is gone by then: a refusal goes to the log file, kept with the binary.
deferred_purge() {
	detach "" '
		pid=$1 bin=$2 root=$3 socket=$4 configdir=$5 rundir=$6 log=$7 force=$8
		shift 8
		i=0
		while kill -0 "$pid" 2>/dev/null; do
			i=$((i + 1))
			[ $i -lt 3600 ] || exit 1
			sleep 1
		done
		# The container has exited; its root filesystem goes right after.
		sleep 2
		if ! "$bin" purge $force --config /dev/null --root "$root" --address "$socket" >>"$log" 2>&1; then
			echo "install.sh: the deferred purge of $root failed (above); $bin stays to run it again" >>"$log"
			exit 1
		fi
		rm -f "$@"
		rmdir "$configdir" "$rundir" 2>/dev/null
		exit 0' "$1" "$BIN" "$ROOT" "$SOCKET" "$(dirname "$CONFIG_FILE")" "$RUN_DIR" "$LOG_FILE" "$PURGE_FORCE" \
		"$UNIT" "$BIN" "$CONFIG_FILE" "$LOG_FILE"
}

# do_supervise is the DaemonSet pod's main loop: without systemd it restarts a daemon that died
# (not one uninstall stopped: that removed the pidfile first).
do_supervise() {
	echo $$ >"$SUPERVISOR_PIDFILE"
	trap 'exit 0' TERM INT
	while :; do
		if [ "$SERVICE_MANAGER" = none ] && [ -f "$H$PIDFILE" ] && [ -x "$H$BIN" ] && ! running_pid >/dev/null; then
			echo "grouped-snapshotter is not running: starting it again"
			start_detached
		fi
		sleep 5 &
		wait $! || true
	done
}

"do_$ACTION"
