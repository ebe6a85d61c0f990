#!/usr/bin/env bash
# Builds the kubelet of the control plane's Kubernetes version from its upstream Go module,
# into a cache outside the repository keyed by version (like build-control-plane.sh, whose
# Go build cache it shares: warm, about a minute). Only hack/real-node.sh needs it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/versions.sh"
command -v go >/dev/null || { echo "error: Go >= 1.26 is required (https://go.dev/doc/install)" >&2; exit 1; }
export CGO_ENABLED=0 GOFLAGS=-mod=mod
[ -f "$KUBELET_BIN/.complete" ] && exit 0
echo ">> building kubelet $K8S_VERSION"
mod=$(mktemp -d)
(
  cd "$mod"
  go mod init flotilla.dev/kubelet >/dev/null 2>&1
  gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')
  for m in $(awk '$2=="v0.0.0"{print $1}' "$gomod"); do go mod edit -replace="$m=$m@$K8S_STAGING_VERSION"; done
  go mod edit -require="k8s.io/kubernetes@$K8S_VERSION"
  cat > tools.go <<'GO'
//go:build tools

package tools

import _ "k8s.io/kubernetes/cmd/kubelet"
GO
  go mod tidy -e >/dev/null 2>&1 || go mod tidy
  minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  mkdir -p "$KUBELET_BIN.tmp"
  go build -trimpath -tags=selinux,notest \
    -ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor" \
    -o "$KUBELET_BIN.tmp/" k8s.io/kubernetes/cmd/kubelet
)
rm -rf "$mod" "$KUBELET_BIN"; mv "$KUBELET_BIN.tmp" "$KUBELET_BIN"; touch "$KUBELET_BIN/.complete"
