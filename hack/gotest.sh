#!/usr/bin/env bash
# Runs go test with -v and fails when a package ran no test at all, or when
# any test was skipped: every test here must run (CI is root), so a skip or
# an empty package would hide a failure.
set -euo pipefail
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
go test -v -count=1 "$@" 2>&1 | tee "$log" || status=$?
if [ "$status" -ne 0 ]; then
	echo "gotest: go test failed (exit $status)" >&2
	exit "$status"
fi
if grep -q -- '--- SKIP' "$log"; then
	echo "gotest: tests were skipped:" >&2
	grep -- '--- SKIP' "$log" >&2
	exit 1
fi
if grep -E '^(ok|\?)\s' "$log" | grep -q 'no test files'; then
	echo "gotest: packages without tests:" >&2
	grep 'no test files' "$log" >&2
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
