#!/usr/bin/env bash
# Builds Argo Rollouts' controller from its Go module at a pinned version, with its CRDs and
# ClusterRole beside it, into a cache outside the repository keyed by version. Only the
# side-by-side scale benchmark uses it (bench/scale.sh --with-argo). Its go.mod has replace
# directives, so it is built inside a copy of its own module, not required by another one.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/versions.sh"
command -v go >/dev/null || { echo "error: Go >= 1.26 is required (https://go.dev/doc/install)" >&2; exit 1; }
dest=$ARGO_ROLLOUTS_BIN
[ -f "$dest/.complete" ] && exit 0
mkdir -p "$FLOTILLA_CACHE"
exec 9>"$FLOTILLA_CACHE/.argo-rollouts.lock"
flock 9
[ -f "$dest/.complete" ] && exit 0
echo ">> building Argo Rollouts $ARGO_ROLLOUTS_VERSION from its Go module with $ARGO_ROLLOUTS_GOTOOLCHAIN (cold: about 5 minutes)"
start=$(date +%s)
export GOTOOLCHAIN=$ARGO_ROLLOUTS_GOTOOLCHAIN GOFLAGS=-mod=mod CGO_ENABLED=0
src=$(mktemp -d)
trap 'chmod -R u+w "$src"; rm -rf "$src"' EXIT
dir=$(cd "$src" && go mod download -json "github.com/argoproj/argo-rollouts@$ARGO_ROLLOUTS_VERSION" \
  | sed -n 's/.*"Dir": "\(.*\)",*/\1/p')
[ -d "$dir" ] || { echo "error: the Go module proxy did not serve argo-rollouts $ARGO_ROLLOUTS_VERSION" >&2; exit 1; }
cp -r "$dir/." "$src/mod"; chmod -R u+w "$src/mod"
rm -rf "$dest.tmp"; mkdir -p "$dest.tmp"
(cd "$src/mod" && go build -trimpath -ldflags="-s -w" -o "$dest.tmp/rollouts-controller" ./cmd/rollouts-controller)
cp "$src"/mod/manifests/crds/*-crd.yaml "$dest.tmp/"
cp "$src/mod/manifests/role/argo-rollouts-clusterrole.yaml" "$dest.tmp/clusterrole.yaml"
rm -rf "$dest"; mv "$dest.tmp" "$dest"; touch "$dest/.complete"
echo ">> Argo Rollouts built in $(( $(date +%s) - start ))s, cached in $dest"
