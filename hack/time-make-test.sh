#!/usr/bin/env bash
# Times `make test` (or `make demo`: hack/time-make-test.sh demo) as a
# newcomer runs it on a fresh machine, and writes the figure the README
# states: a fresh clone of HEAD, empty Go build and module caches and no
# built tools (all in a temporary directory, removed after), and the Debian
# packages of hack/apt-packages.txt installed by the run itself where
# missing. Writes _output/results/integration/results/make-TARGET.json
# (`make update-results` commits it, `make readme-tables` renders it) and
# the run's log, _output/make-TARGET.log. As root, like make test and demo.
set -euo pipefail
target=${1:-test}
case "$target" in
test | demo) ;;
*)
	echo "usage: time-make-test.sh [test|demo]" >&2
	exit 2
	;;
esac
cd "$(dirname "$0")/.."
repo=$(pwd)
out="$repo/_output/results/integration/results/make-$target.json"
work=$(mktemp -d "/var/tmp/gs-make-$target.XXXXXX")
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT

git clone -q "$repo" "$work/clone"
missing=$(hack/install-apt.sh --missing | paste -sd, -)
# The machine's load beside the run, sampled each minute: a figure from a
# machine busy with other work is an upper bound, and the README says so.
(while :; do cut -d' ' -f1 /proc/loadavg; sleep 60; done) >"$work/load" &
sampler=$!
start=$(date +%s)
status=0
(cd "$work/clone" && unset TOOLS_DIR GS_TOOLS_BIN && GOCACHE="$work/gocache" GOMODCACHE="$work/gomod" make "$target") >"$work/log" 2>&1 || status=$?
end=$(date +%s)
kill "$sampler"
load=$(awk '{s+=$1; n++} END {printf "%.1f", n ? s/n : 0}' "$work/load")
# The demo runs no tests: its file has no tests_passed.
passed=""
if [ "$target" = test ]; then
	passed="
  \"tests_passed\": $(grep -c -- '--- PASS' "$work/log" || true),"
fi
mkdir -p "$(dirname "$out")"
cat >"$out" <<JSON
{
  "date": "$(date -u +%Y-%m-%d)",
  "commit": "$(git rev-parse --short HEAD)",
  "seconds": $((end - start)),
  "exit_status": $status,$passed
  "cores": $(nproc),
  "mean_load_average": $load,
  "go": "$(go env GOVERSION)",
  "apt_installed_by_the_run": "$missing"
}
JSON
cat "$out"
cp "$work/log" "$repo/_output/make-$target.log"
if [ "$status" -ne 0 ]; then
	tail -50 "$work/log" >&2
	echo "time-make-test: make $target failed (exit $status)" >&2
	exit "$status"
fi
