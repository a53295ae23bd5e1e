#!/usr/bin/env bash
# Renders the raw Kubernetes manifests from the Helm chart, their one
# source: deploy/kubernetes/grouped-snapshotter.yaml is the chart with its
# default values (and the namespace object, for `kubectl apply -f`),
# runtimeclass.yaml the RuntimeClass of its runtime-handler mode.
#
#   hack/render-manifests.sh [DIR]   writes both into DIR (default
#                                    deploy/kubernetes); `make manifests`
#
# integration/manifests' TestManifestsRendered renders into a scratch
# directory and fails while the committed files differ. HELM names the
# helm binary (default $GS_TOOLS_BIN/helm, else .tools/bin/helm).
set -euo pipefail
cd "$(dirname "$0")/.."

out=${1:-deploy/kubernetes}
helm=${HELM:-${GS_TOOLS_BIN:-.tools/bin}/helm}
chart=deploy/helm/grouped-snapshotter
release=grouped-snapshotter
namespace=grouped-snapshotter

# helm template prints "---" and a "# Source: <template>" line before each
# object and a blank line after it; the raw manifest separates objects with
# "---" alone.
render() {
	"$helm" template "$release" "$chart" --namespace "$namespace" "$@" |
		awk '/^# Source: / { next }
			NR == 1 && /^---$/ { next }
			/^$/ { blank++; next }
			/^---$/ { blank = 0 }
			{ while (blank > 0) { print ""; blank-- } print }'
}

[ -x "$helm" ] || { echo "render-manifests: no helm at $helm: run make tools (or set HELM)" >&2; exit 1; }
mkdir -p "$out"
render --set namespace.create=true >"$out/grouped-snapshotter.yaml.tmp"
render --set mode=runtime-handler --show-only templates/runtimeclass-handler.yaml >"$out/runtimeclass.yaml.tmp"
mv "$out/grouped-snapshotter.yaml.tmp" "$out/grouped-snapshotter.yaml"
mv "$out/runtimeclass.yaml.tmp" "$out/runtimeclass.yaml"
