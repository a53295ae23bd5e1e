#!/usr/bin/env bash
# Times `make test` as a newcomer runs it on a fresh machine, and writes the
# figure the README states: a fresh clone of HEAD, empty Go build and module
# caches and no built tools (all in a temporary directory, removed after),
# and the Debian packages of hack/apt-packages.txt installed by the run
# itself where missing. Writes
# _output/results/integration/results/make-test.json (`make update-results`
# commits it, `make readme-tables` renders it). As root, like make test.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
out="$repo/_output/results/integration/results/make-test.json"
work=$(mktemp -d /var/tmp/gs-make-test.XXXXXX)
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT

git clone -q "$repo" "$work/clone"
missing=$(hack/install-apt.sh --missing | paste -sd, -)
# The machine's load beside the run, sampled each minute: a figure from a
# machine busy with other work is an upper bound, and the README says so.
(while sleep 60; do cut -d' ' -f1 /proc/loadavg; done) >"$work/load" &
sampler=$!
start=$(date +%s)
status=0
(cd "$work/clone" && GOCACHE="$work/gocache" GOMODCACHE="$work/gomod" make test) >"$work/log" 2>&1 || status=$?
end=$(date +%s)
kill "$sampler"
load=$(awk '{s+=$1; n++} END {printf "%.1f", n ? s/n : 0}' "$work/load")
passed=$(grep -c -- '--- PASS' "$work/log" || true)
mkdir -p "$(dirname "$out")"
cat >"$out" <<JSON
{
  "date": "$(date -u +%Y-%m-%d)",
  "commit": "$(git rev-parse --short HEAD)",
  "seconds": $((end - start)),
  "exit_status": $status,
  "tests_passed": $passed,
  "cores": $(nproc),
  "mean_load_average": $load,
  "go": "$(go env GOVERSION)",
  "apt_installed_by_the_run": "$missing"
}
JSON
cat "$out"
if [ "$status" -ne 0 ]; then
	tail -50 "$work/log" >&2
	echo "time-make-test: make test failed (exit $status)" >&2
	exit "$status"
fi
