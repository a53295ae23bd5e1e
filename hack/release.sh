#!/usr/bin/env bash
# Builds a versioned release (make release VERSION=vX.Y.Z) into RELEASE_DIR
# (default _output/release/VERSION, which git ignores):
#
#   grouped-snapshotter-VERSION-linux-ARCH             static binary (amd64, arm64)
#   grouped-snapshotter-VERSION-linux-ARCH.tar.gz      the binary, install.sh, config.toml.example,
#                                                      systemd/, kubernetes/ (every directory of
#                                                      deploy/), README.md, CHANGELOG.md
#   *.sha256sum                                        one per binary and tarball, for sha256sum -c
#   image/                                             the installer image (hack/build-image.sh) for
#                                                      both architectures: an OCI layout whose
#                                                      index.json holds one multi-platform index
#
# The binaries print `grouped-snapshotter VERSION (commit COMMIT)`. Two runs
# at one commit write the same bytes, image included (tarballs: sorted
# names, owner 0, every mtime the commit's time, gzip -n).
# The image is built with crane through a throwaway registry on 127.0.0.1
# (no container engine) and holds the same binaries.
#
# Environment: VERSION (required), COMMIT (default git's short hash, -dirty
# when tracked files changed), RELEASE_DIR, ALLOW_DIRTY=1 (build from a tree
# with uncommitted changes: for tests, never for a published release).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
TOOLS_BIN=${GS_TOOLS_BIN:-$REPO/.tools/bin}
CRANE=${CRANE:-$TOOLS_BIN/crane}
ARCHES=(amd64 arm64)

die() { echo "release: $*" >&2; exit 1; }

VERSION=${VERSION:-}
[[ "$VERSION" =~ ^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] ||
	die "VERSION='$VERSION' is not a release version: want vMAJOR.MINOR.PATCH or vMAJOR.MINOR.PATCH-PRERELEASE, e.g. make release VERSION=v0.1.0"
dirty=$(git status --porcelain --untracked-files=no)
if [ -n "$dirty" ] && [ "${ALLOW_DIRTY:-0}" != 1 ]; then
	printf '%s\n' "$dirty" >&2
	die "the work tree has uncommitted changes (above): a release must be built from its commit alone, so that the commit its binaries report is what they contain; commit or stash them (ALLOW_DIRTY=1 builds anyway, for a test, and the binaries say <commit>-dirty)"
fi
if [ -z "${COMMIT:-}" ]; then
	COMMIT=$(git rev-parse --short HEAD)
	[ -z "$dirty" ] || COMMIT=$COMMIT-dirty
fi
[ -x "$CRANE" ] || die "$CRANE missing (run make tools)"

OUT=${RELEASE_DIR:-_output/release/$VERSION}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
[ -z "$(ls -A "$OUT")" ] || die "$OUT is not empty: remove it first (a release directory holds one build)"
# Every file in the tarballs gets the commit's time: a rebuild of the same
# commit gives the same bytes.
EPOCH=$(git log -1 --format=%ct HEAD)

work=$(mktemp -d)
registry_pid=
cleanup() {
	if [ -n "$registry_pid" ]; then
		kill "$registry_pid" 2>/dev/null || true
		wait "$registry_pid" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT

ldflags="-X main.version=$VERSION -X main.commit=$COMMIT"
name() { echo "grouped-snapshotter-$VERSION-linux-$1"; }

for arch in "${ARCHES[@]}"; do
	bin=$OUT/$(name "$arch")
	echo "release: building $(basename "$bin") (static, commit $COMMIT)"
	GOOS=linux GOARCH=$arch CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$bin" ./cmd/grouped-snapshotter

	# The tarball: install.sh finds the binary, systemd/ and
	# config.toml.example next to itself. Every directory of deploy/
	# (systemd, kubernetes, and a chart, say, when one is added), tracked
	# files only, without Go code.
	stage=$work/$(name "$arch")
	mkdir -p "$stage"
	cp "$bin" "$stage/grouped-snapshotter"
	cp deploy/install.sh config.toml.example README.md CHANGELOG.md "$stage/"
	for f in LICENSE*; do [ -f "$f" ] && cp "$f" "$stage/"; done
	git ls-files -- 'deploy/*/*' | grep -v -e '\.go$' -e '/testdata/' | while read -r f; do
		mkdir -p "$stage/$(dirname "${f#deploy/}")"
		cp "$f" "$stage/${f#deploy/}"
	done
	tar --sort=name --mtime="@$EPOCH" --owner=0 --group=0 --numeric-owner --mode=u+rwX,go+rX,go-w \
		-C "$work" -cf - "$(name "$arch")" | gzip -n -9 >"$OUT/$(name "$arch").tar.gz"
	(cd "$OUT" && for f in "$(name "$arch")" "$(name "$arch").tar.gz"; do sha256sum "$f" >"$f.sha256sum"; done)
done

# The image: build-image.sh pushes to a registry, so a throwaway one on a
# free port of 127.0.0.1 receives it, and crane copies the index out as an
# OCI layout.
mkdir -p "$work/registry"
"$CRANE" registry serve --address 127.0.0.1:0 --disk "$work/registry" >"$work/registry.log" 2>&1 &
registry_pid=$!
port=
for _ in $(seq 100); do
	port=$(sed -n 's/.*serving on port \([0-9]*\).*/\1/p' "$work/registry.log")
	[ -n "$port" ] && break
	kill -0 "$registry_pid" 2>/dev/null || break
	sleep 0.1
done
[ -n "$port" ] || { cat "$work/registry.log" >&2; die "the throwaway registry did not start"; }
ref=127.0.0.1:$port/grouped-snapshotter:$VERSION
echo "release: building the installer image for ${ARCHES[*]}"
if ! ARCH=$(IFS=,; echo "${ARCHES[*]}") INSECURE=1 VERSION=$VERSION COMMIT=$COMMIT \
	BINARY_AMD64="$OUT/$(name amd64)" BINARY_ARM64="$OUT/$(name arm64)" \
	hack/build-image.sh "$ref" >"$work/image.log" 2>&1; then
	cat "$work/image.log" >&2
	die "hack/build-image.sh failed (above)"
fi
"$CRANE" pull --insecure --format=oci "$ref" "$OUT/image"

echo "release: $VERSION (commit $COMMIT) in $OUT:"
(cd "$OUT" && find . -maxdepth 1 -type f -printf '%s\t%f\n' | sort -k2 && du -sb image | sed 's|$|/|')
