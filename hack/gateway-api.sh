#!/usr/bin/env bash
# The Gateway API standard-channel CRDs, from the sigs.k8s.io/gateway-api Go module (fetched
# once through the Go module proxy into Go's module cache, outside the clone).
#   bash hack/gateway-api.sh dir                 prints the directory of the CRD manifests
#   bash hack/gateway-api.sh install KUBECONFIG  installs them and waits until they are served
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/versions.sh"

crd_dir() {
  command -v go >/dev/null || {
    echo "error: go is not installed; the Gateway API CRDs come from its module proxy (install Go 1.26, see README)" >&2
    exit 1
  }
  local module="sigs.k8s.io/gateway-api@$GATEWAY_API_VERSION" dir
  dir="$(go env GOMODCACHE)/$module/config/crd/standard"
  if [ ! -f "$dir/gateway.networking.k8s.io_httproutes.yaml" ]; then
    # Outside any module, so that no go.mod is read or changed.
    (cd "$(mktemp -d)" && GOFLAGS=-mod=mod go mod download "$module") || {
      echo "error: could not download the Go module $module (is the Go module proxy reachable?)" >&2
      exit 1
    }
  fi
  echo "$dir"
}

case "${1:-dir}" in
  dir) crd_dir ;;
  install)
    kubeconfig=${2:?usage: gateway-api.sh install KUBECONFIG}
    dir=$(crd_dir)
    kinds="gatewayclasses gateways httproutes referencegrants"
    for kind in $kinds; do
      kubectl --kubeconfig "$kubeconfig" apply --server-side --force-conflicts \
        -f "$dir/gateway.networking.k8s.io_$kind.yaml" >/dev/null
    done
    for kind in $kinds; do
      kubectl --kubeconfig "$kubeconfig" wait --for=condition=Established --timeout=60s \
        "crd/$kind.gateway.networking.k8s.io" >/dev/null
    done
    echo ">> Gateway API $GATEWAY_API_VERSION CRDs installed ($kinds)"
    ;;
  *) echo "usage: gateway-api.sh dir | install KUBECONFIG" >&2; exit 2 ;;
esac
