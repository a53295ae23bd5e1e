#!/usr/bin/env bash
# Installs the Debian packages of hack/apt-packages.txt that are missing, and
# nothing else: idempotent and quiet (a run with everything present makes no
# apt call and prints nothing). With --missing, only prints them, one a line.
set -euo pipefail
list="$(dirname "$0")/apt-packages.txt"
mapfile -t want < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' -e '/^$/d' "$list")
missing=()
for p in "${want[@]}"; do
	# "install ok installed" only: a removed package leaves "deinstall ... config-files".
	[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing+=("$p")
done
if [ "${1:-}" = --missing ]; then
	[ ${#missing[@]} -eq 0 ] || printf '%s\n' "${missing[@]}"
	exit 0
fi
[ ${#missing[@]} -gt 0 ] || exit 0
if [ "$(id -u)" -ne 0 ]; then
	echo "install-apt: missing Debian packages ${missing[*]}: run as root, or apt-get install them" >&2
	exit 1
fi
echo "install-apt: apt-get install ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
