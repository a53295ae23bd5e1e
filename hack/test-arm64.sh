#!/usr/bin/env bash
# Runs the root module's tests as arm64 binaries under qemu-user
# (qemu-aarch64-static, Debian's qemu-user-static), as root, on an amd64
# machine: every package's test binary is built with GOARCH=arm64
# CGO_ENABLED=0 and run as `qemu-aarch64-static pkg.test -test.v` in its
# package's directory. Among them cmd/grouped-snapshotter's, whose tests
# run the daemon binary: here the static arm64 daemon, also under
# qemu-aarch64-static (GS_TEST_DAEMON names a wrapper that runs it), and its
# TestConformanceOverDaemonSocket runs containerd's snapshotter test suite
# against that arm64 daemon over its unix socket. No binfmt_misc is needed:
# every arm64 program is started through qemu-aarch64-static by name.
#
# Syscalls pass through qemu-user to the real kernel (overlayfs, mounts,
# chown, xattrs, flock all work). What qemu-user cannot do is listed in
# `excluded` below, test by test with its reason; those tests are left out
# with -test.skip and named in the output. The run fails when a listed test
# no longer exists (the list cannot go stale), when a package ran no test,
# when a test was skipped, or on any failure.
#
# Last, a few of integration/'s tests drive a real containerd (amd64, from
# make tools) whose proxy snapshotter is the arm64 daemon under qemu:
# pulls, runs, a user-namespaced container (idmapped by containerd's shim,
# not by the daemon), a restart, image removal.
#
# Usage (as root, from anywhere): hack/test-arm64.sh [package ...]
# (packages as directories of the root module, e.g. snapshot server, and
# `integration` for the containerd tests; default: every package of
# `go list ./...`, then integration). make test-arm64 runs it, and make
# test depends on that.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
module=$(go list -m)
qemu=${QEMU_AARCH64:-qemu-aarch64-static}
out=$repo/_output/arm64
timeout=${ARM64_TEST_TIMEOUT:-15m}

# Why a test cannot run under qemu-user: each reason names the kernel or
# loader feature the test needs that qemu-user does not provide.
declare -A reasons=(
	[userns]="clone(2) with CLONE_NEWUSER: containerd's user-namespace helper (idmapped mounts: mapped parents, the idmap probe) starts a child in a new user namespace, and qemu-user's clone emulation accepts only thread- and fork-style flags (EINVAL)"
	[self-exec]="exec of an arm64 binary by an emulated process (the test binary re-running itself, or the daemon's check re-running /proc/self/exe as its probe child): the kernel runs an arm64 ELF only through a binfmt_misc registration for qemu-aarch64 (ENOEXEC without one), and this runner uses none"
	[mixed-arch]="deploy/install.sh runs natively and takes the node's platform from uname -m (linux/amd64), while the arm64 check expects linux/arm64: a mixed-architecture node that only qemu-user makes"
)

# package directory:TestName -> reason key. Top-level tests only.
declare -A excluded=(
	[cmd/grouped-snapshotter:TestCheckKilledMidProbe]=self-exec
	[cmd/grouped-snapshotter:TestGlobalFlagsReachEveryCommand]=self-exec
	[cmd/grouped-snapshotter:TestPurgeCheckIgnoresPod]=self-exec
	[cmd/grouped-snapshotter:TestPurgeWithMappedParentsMounted]=userns
	[deploy:TestInstallScript]=mixed-arch
	[internal/containerdversion:TestIdleClientSleeps]=self-exec
	[mountgroup:TestMappedParentShowsMappedOwnersReadOnly]=userns
	[mountgroup:TestMountIsIdempotentAndRestartUnmounts]=userns
	[preflight:TestProbeIDMapped]=userns
	[preflight:TestProbeLeavesALiveProbesDirectory]=self-exec
	[preflight:TestProbeStaysOutOfTheDaemonsDirs]=self-exec
	[preflight:TestProbeWithoutRoot]=self-exec
	[snapshot:TestAutoModeShapeFollowsContainerdRelease]=userns
	[snapshot:TestCleanupWaitsForNoMappedParentMount]=userns
	[snapshot:TestConcurrentFirstUsesMakeOneMappedParent]=userns
	[snapshot:TestConcurrentMappingsKeepTheirMappedParents]=userns
	[snapshot:TestFirstUseMountFailureLeavesNothing]=userns
	[snapshot:TestFirstUseTransactionFailureUnmounts]=userns
	[snapshot:TestFormatKeepsNextView]=userns
	[snapshot:TestFormatMigratesFormat1]=userns
	[snapshot:TestMappedParentMode500Layers]=userns
	[snapshot:TestMappedParentModeRestartRemounts]=userns
	[snapshot:TestMappedParentModeSharesOnePerMapping]=userns
	[snapshot:TestMappedParentMountFailureFailsOnlyItsCalls]=userns
	[snapshot:TestMountsNeverServesAnotherMappingsMappedParent]=userns
	[snapshot:TestReadOnlyMountOfMappedChainFits]=userns
	[snapshot:TestRemoveCrashLeavesNothing]=self-exec
	[snapshot:TestRemoveHoldsNoLockWhileRemovingDirectories]=userns
	[snapshot:TestRemoveWaitsForFirstUseOfItsMapping]=userns
	[snapshot:TestSecondSnapshotterOnSameRootRefused]=userns
	[snapshot:TestShimModeUnmountsMappedParents]=userns
	[snapshot:TestStartRegistersShimMadeSnapshots]=userns
	[snapshot:TestStartServesAtOnceWithManyMappings]=userns
	[snapshot:TestStartupReconciliation]=userns
)

die() {
	echo "test-arm64: $*" >&2
	exit 1
}
[ "$(id -u)" -eq 0 ] || die "must run as root (the tests mount overlays), as CI does"
command -v "$qemu" >/dev/null || die "no $qemu: install Debian's qemu-user-static (hack/install-apt.sh installs hack/apt-packages.txt)"
export GS_TOOLS_BIN=${GS_TOOLS_BIN:-$repo/.tools/bin}

if [ $# -gt 0 ]; then
	pkgs=("$@")
else
	mapfile -t pkgs < <(go list ./... | sed -e "s|^$module\$|.|" -e "s|^$module/||")
	pkgs+=(integration)
fi
for key in "${!excluded[@]}"; do
	[ -n "${reasons[${excluded[$key]}]:-}" ] || die "excluded $key: unknown reason ${excluded[$key]}"
done

start=$(date +%s)
rm -rf "$out"
mkdir -p "$out/bin" "$out/logs"
binfmt="none (not needed)"
[ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || binfmt="registered (not used)"
echo "test-arm64: $("$qemu" --version | head -1); binfmt_misc for aarch64: $binfmt"

# The static arm64 daemon, and the wrapper the cmd tests run as the daemon.
GOARCH=arm64 CGO_ENABLED=0 go build -trimpath -o "$out/bin/grouped-snapshotter" ./cmd/grouped-snapshotter
# It counts its starts, so that the run can tell the tests used it.
starts=$out/logs/daemon-starts
: >"$starts"
cat >"$out/bin/grouped-snapshotter-qemu" <<EOF
#!/bin/sh
echo "\$*" >>$starts
exec $(command -v "$qemu") $out/bin/grouped-snapshotter "\$@"
EOF
chmod +x "$out/bin/grouped-snapshotter-qemu"
file_arch=$(od -An -j18 -N2 -tu2 "$out/bin/grouped-snapshotter" | tr -d ' ')
[ "$file_arch" = 183 ] || die "$out/bin/grouped-snapshotter is not an arm64 ELF (e_machine $file_arch)"

# Real containerd (amd64, from make tools) with the arm64 daemon as its
# proxy snapshotter: a few of integration/'s tests, the client side amd64.
run_integration() {
	local ran_before integration_tests t0 log rc pass line want problem
	ran_before=$(wc -l <"$starts")
	integration_tests='TestPullAndRun|TestUserNamespace|TestSnapshotterRestart|TestImageRemovalCollectsSnapshots'
	echo "test-arm64: integration ($integration_tests) on containerd with the arm64 daemon"
	t0=$(date +%s)
	log=$out/logs/integration.log
	rc=0
	(cd integration && GS_TEST_DAEMON=$out/bin/grouped-snapshotter-qemu go test -count=1 -v -timeout "$timeout" -run "^($integration_tests)\$" .) >"$log" 2>&1 || rc=$?
	pass=$(grep -c -- '^--- PASS' "$log" || true)
	total_pass=$((total_pass + pass))
	line="integration (containerd, arm64 daemon): $pass passed, $(($(date +%s) - t0))s"
	want=$(tr '|' '\n' <<<"$integration_tests" | wc -l)
	problem=
	if [ "$pass" -ne "$want" ]; then
		problem="$pass of the $want tests ran"
	elif [ "$(wc -l <"$starts")" -le "$ran_before" ]; then
		problem="the arm64 daemon was never started"
	fi
	record integration "$log" "$rc" "$line" "$problem"
}

# record NAME LOG RC LINE [PROBLEM]: judges a run by its exit status and
# log (a failure, a skipped test), else by PROBLEM (the caller's own
# check), and adds LINE to the summary, with the problem if there is one.
record() {
	local name=$1 log=$2 rc=$3 line=$4 problem=${5:-}
	if [ "$rc" -ne 0 ] || grep -q -- '--- FAIL' "$log"; then
		problem="failed (exit $rc)"
	elif grep -q -- '--- SKIP' "$log"; then
		problem="tests were skipped: $(grep -- '--- SKIP' "$log" | tr '\n' ' ')"
	fi
	if [ -n "$problem" ]; then
		grep -E -- '--- (FAIL|SKIP)|^(panic|FAIL)' "$log" | head -40 >&2 || true
		echo "test-arm64: $name: $problem; its log: $log" >&2
		failed+=("$name: $problem")
		line="$line, $problem"
	fi
	summary+=("$line")
}

summary=()
failed=()
total_pass=0
total_excluded=0
for pkg in "${pkgs[@]}"; do
	if [ "$pkg" = integration ]; then
		run_integration
		continue
	fi
	name=${pkg//\//_}
	bin=$out/bin/$name.test
	log=$out/logs/$name.log
	t0=$(date +%s)
	rm -f "$bin"
	GOARCH=arm64 CGO_ENABLED=0 go test -c -o "$bin" "./$pkg"
	[ -x "$bin" ] || {
		failed+=("$pkg: no test files")
		continue
	}
	# The listed tests must still exist.
	tests=$(cd "$pkg" && "$qemu" "$bin" -test.list '.*')
	skip=()
	for key in "${!excluded[@]}"; do
		[ "${key%%:*}" = "$pkg" ] || continue
		tname=${key#*:}
		grep -qx -- "$tname" <<<"$tests" || die "$pkg: excluded test $tname no longer exists: remove it from hack/test-arm64.sh's list"
		skip+=("$tname")
	done
	total_excluded=$((total_excluded + ${#skip[@]}))
	skip_flags=()
	if [ ${#skip[@]} -gt 0 ]; then
		mapfile -t skip < <(printf '%s\n' "${skip[@]}" | sort)
		for tname in "${skip[@]}"; do
			echo "test-arm64: $pkg: excluded $tname: ${reasons[${excluded[$pkg:$tname]}]}"
		done
		skip_flags=(-test.skip "^($(
			IFS='|'
			echo "${skip[*]}"
		))\$")
	fi
	echo "test-arm64: $pkg: running $bin under $qemu"
	rc=0
	(cd "$pkg" && GS_TEST_DAEMON=$out/bin/grouped-snapshotter-qemu "$qemu" "$bin" -test.v -test.timeout "$timeout" "${skip_flags[@]}") >"$log" 2>&1 || rc=$?
	pass=$(grep -c -- '^--- PASS' "$log" || true)
	total_pass=$((total_pass + pass))
	secs=$(($(date +%s) - t0))
	line="$pkg: $pass passed, ${#skip[@]} excluded, ${secs}s"
	problem=
	if [ "$pass" -eq 0 ] || grep -q 'testing: warning: no tests to run' "$log"; then
		problem="ran no test"
	fi
	record "$pkg" "$log" "$rc" "$line" "$problem"
done

echo "test-arm64: arm64 under $qemu, $(($(date +%s) - start))s in all:"
printf '  %s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
	echo "test-arm64: FAILED:" >&2
	printf '  %s\n' "${failed[@]}" >&2
	exit 1
fi
echo "test-arm64: $total_pass tests passed as arm64, $total_excluded excluded (above, with reasons)"
