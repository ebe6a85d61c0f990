#!/usr/bin/env bash
# Builds Jaeger (all-in-one, takes OTLP) from its Go module at a pinned version, cached
# outside the repository keyed by version. Used by the trace test.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/versions.sh"
exec bash "$here/build-go-tool.sh" jaeger "github.com/jaegertracing/jaeger/cmd/jaeger@$JAEGER_VERSION" "$JAEGER_BIN"
