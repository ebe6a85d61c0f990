#!/usr/bin/env bash
# Builds Helm from its Go module at a pinned version, cached outside the repository keyed by
# version. The deploy test renders the chart in deploy/helm with it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/versions.sh"
command -v go >/dev/null || { echo "error: Go >= 1.26 is required (https://go.dev/doc/install)" >&2; exit 1; }
[ -f "$HELM_BIN/.complete" ] && exit 0
mkdir -p "$FLOTILLA_CACHE"
exec 9>"$FLOTILLA_CACHE/.helm.lock"
flock 9
[ -f "$HELM_BIN/.complete" ] && exit 0
echo ">> building Helm $HELM_VERSION (cold: a few minutes)"
start=$(date +%s)
mod=$(mktemp -d)
(
  cd "$mod"
  go mod init flotilla.dev/helm >/dev/null 2>&1
  go get -tool "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >/dev/null 2>&1
  mkdir -p "$HELM_BIN.tmp"
  CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags="-s -w" -o "$HELM_BIN.tmp/helm" helm.sh/helm/v3/cmd/helm
)
rm -rf "$mod" "$HELM_BIN"; mv "$HELM_BIN.tmp" "$HELM_BIN"; touch "$HELM_BIN/.complete"
echo ">> Helm built in $(( $(date +%s) - start ))s, cached in $HELM_BIN"
