#!/usr/bin/env bash
# Runs go test with -v and fails when a package ran no test at all, or when
# any test was skipped: every test here must run (CI is root), so a skip or
# an empty package would hide a failure.
#
# A package without test files fails too, unless it is in the allowlist
# below: only `main` packages that are tools, each exercised by a test of
# another package (named in its comment).
#
# Usage: hack/gotest.sh [-flag=value ...] [pattern ...], run from the
# repository root. integration/ and bench/ are Go modules of their own, so
# their patterns (./integration/..., ./bench/...) run `go test` in their
# module's directory; ./... means all three modules. Flags must be written
# -flag=value.
set -euo pipefail
cd "$(dirname "$0")/.."

module=github.com/grouped-snapshotter/grouped-snapshotter
no_tests_allowed=(
	# The pause image's program, built and run as a pod sandbox by the CRI
	# and Kubernetes tests (harness.PushPauseImage).
	"$module/integration/cmd/pause"
	# The manifest tool the differential conformance test builds into every
	# image it runs (integration/conformance; its format is tested in
	# integration/conformance/manifest).
	"$module/integration/cmd/manifest"
)

nested=(integration bench)
flags=()
declare -A patterns # module directory -> its patterns
add() { patterns[$1]="${patterns[$1]:-} $2"; }
for arg in "$@"; do
	case "$arg" in
	-*) flags+=("$arg") ;;
	./...)
		add . ./...
		for m in "${nested[@]}"; do add "$m" ./...; done
		;;
	*)
		mod=.
		for m in "${nested[@]}"; do
			case "$arg" in ./"$m" | ./"$m"/*) mod=$m ;; esac
		done
		if [ "$mod" = . ]; then
			add . "$arg"
		else
			rest=${arg#./"$mod"}
			add "$mod" ".${rest:-/}"
		fi
		;;
	esac
done
if [ "${#patterns[@]}" -eq 0 ]; then
	echo "gotest: no package patterns given" >&2
	exit 2
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
for mod in . "${nested[@]}"; do
	[ -n "${patterns[$mod]:-}" ] || continue
	# shellcheck disable=SC2086 # the patterns are words
	(cd "$mod" && go test -v -count=1 "${flags[@]}" ${patterns[$mod]}) 2>&1 | tee -a "$log" || status=$?
	if [ "$status" -ne 0 ]; then
		echo "gotest: go test in module $mod failed (exit $status)" >&2
		exit "$status"
	fi
done
if grep -q -- '--- SKIP' "$log"; then
	echo "gotest: tests were skipped:" >&2
	grep -- '--- SKIP' "$log" >&2
	exit 1
fi
# "?   	<package>	[no test files]"
untested=()
while read -r pkg; do
	allowed=false
	for a in "${no_tests_allowed[@]}"; do
		[ "$pkg" = "$a" ] && allowed=true
	done
	$allowed || untested+=("$pkg")
done < <(grep -E '^\?\s.*\[no test files\]' "$log" | awk '{print $2}')
if [ "${#untested[@]}" -gt 0 ]; then
	echo "gotest: packages without test files (add tests, or allowlist a tool's main package in hack/gotest.sh):" >&2
	printf '  %s\n' "${untested[@]}" >&2
	exit 1
fi
if grep -q 'testing: warning: no tests to run' "$log"; then
	echo "gotest: a package ran no tests" >&2
	exit 1
fi
passed=$(grep -c -- '--- PASS' "$log" || true)
if [ "$passed" -eq 0 ]; then
	echo "gotest: no tests ran" >&2
	exit 1
fi
echo "gotest: $passed tests passed"
