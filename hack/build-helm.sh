#!/usr/bin/env bash
# Builds Helm from its Go module at a pinned version, cached outside the repository keyed by
# version. The deploy test renders the chart in deploy/helm with it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/versions.sh"
exec bash "$here/build-go-tool.sh" helm "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" "$HELM_BIN"
