#!/usr/bin/env bash
# Builds Jaeger (all-in-one, takes OTLP) from its Go module at a pinned version, cached
# outside the repository keyed by version. Used by the trace test.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/versions.sh"
command -v go >/dev/null || { echo "error: Go >= 1.26 is required (https://go.dev/doc/install)" >&2; exit 1; }
[ -f "$JAEGER_BIN/.complete" ] && exit 0
mkdir -p "$FLOTILLA_CACHE"
exec 9>"$FLOTILLA_CACHE/.jaeger.lock"
flock 9
[ -f "$JAEGER_BIN/.complete" ] && exit 0
echo ">> building Jaeger $JAEGER_VERSION (cold: a few minutes)"
start=$(date +%s)
mod=$(mktemp -d)
(
  cd "$mod"
  go mod init flotilla.dev/jaeger >/dev/null 2>&1
  go get -tool "github.com/jaegertracing/jaeger/cmd/jaeger@$JAEGER_VERSION" >/dev/null 2>&1
  mkdir -p "$JAEGER_BIN.tmp"
  CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags="-s -w" -o "$JAEGER_BIN.tmp/jaeger" github.com/jaegertracing/jaeger/cmd/jaeger
)
rm -rf "$mod" "$JAEGER_BIN"; mv "$JAEGER_BIN.tmp" "$JAEGER_BIN"; touch "$JAEGER_BIN/.complete"
echo ">> Jaeger built in $(( $(date +%s) - start ))s, cached in $JAEGER_BIN"
