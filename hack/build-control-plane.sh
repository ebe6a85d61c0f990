#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl,
# kwok and kwokctl from their upstream Go modules at pinned versions, into a
# cache outside the repository keyed by version. A second run builds nothing.
# `build-control-plane.sh kubelet` builds the real node's kubelet instead (hack/real-node.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/versions.sh"

need() { command -v "$1" >/dev/null || { echo "error: '$1' not found; install $2" >&2; exit 1; }; }
need go "Go >= 1.26 (https://go.dev/doc/install, or apt-get install golang-go if it is new enough)"

export CGO_ENABLED=0 GOFLAGS=-mod=mod
start=$(date +%s)
built=0

# build_k8s DEST WHAT CMD...: commands of k8s.io/kubernetes at K8S_VERSION into DEST.
build_k8s() {
  local dest=$1 what=$2; shift 2
  [ -f "$dest/.complete" ] && return
  echo ">> building Kubernetes $K8S_VERSION ($what)"
  local mod; mod=$(mktemp -d)
  (
    cd "$mod"
    go mod init flotilla.dev/controlplane >/dev/null 2>&1
    local gomod
    gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')
    for m in $(awk '$2=="v0.0.0"{print $1}' "$gomod"); do
      go mod edit -replace="$m=$m@$K8S_STAGING_VERSION"
    done
    go mod edit -require="k8s.io/kubernetes@$K8S_VERSION"
    { printf '//go:build tools\n\npackage tools\n\nimport (\n'; printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$@"; printf ')\n'; } > tools.go
    go mod tidy -e >/dev/null 2>&1 || go mod tidy
    local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
    mkdir -p "$dest.tmp"
    go build -trimpath -tags=selinux,notest \
      -ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor" \
      -o "$dest.tmp/" "${@/#/k8s.io/kubernetes/cmd/}"
  )
  rm -rf "$mod" "$dest"; mv "$dest.tmp" "$dest"; touch "$dest/.complete"; built=1
}

build_etcd() {
  [ -f "$ETCD_BIN/.complete" ] && return
  echo ">> building etcd $ETCD_VERSION"
  local mod; mod=$(mktemp -d)
  (
    cd "$mod"
    go mod init flotilla.dev/etcd >/dev/null 2>&1
    go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >/dev/null
    mkdir -p "$ETCD_BIN.tmp"
    go build -trimpath -ldflags="-s -w" -o "$ETCD_BIN.tmp/etcd" go.etcd.io/etcd/server/v3
  )
  rm -rf "$mod" "$ETCD_BIN"; mv "$ETCD_BIN.tmp" "$ETCD_BIN"; touch "$ETCD_BIN/.complete"; built=1
}

build_kwok() {
  [ -f "$KWOK_BIN/.complete" ] && return
  echo ">> building kwok and kwokctl $KWOK_VERSION"
  mkdir -p "$KWOK_BIN.tmp"
  GOBIN="$KWOK_BIN.tmp" go install -trimpath -ldflags="-s -w" \
    "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" "sigs.k8s.io/kwok/cmd/kwokctl@$KWOK_VERSION"
  rm -rf "$KWOK_BIN"; mv "$KWOK_BIN.tmp" "$KWOK_BIN"; touch "$KWOK_BIN/.complete"; built=1
}

mkdir -p "$FLOTILLA_CACHE"
exec 9>"$FLOTILLA_CACHE/.build.lock"
flock 9
if [ "${1:-}" = kubelet ]; then
  # Only hack/real-node.sh needs it; warm Go build cache: about a minute.
  build_k8s "$KUBELET_BIN" kubelet kubelet
  exit 0
fi
build_etcd
build_kwok
build_k8s "$K8S_BIN" "kube-apiserver, kube-controller-manager, kube-scheduler, kubectl; cold: about 6-10 min" \
  kube-apiserver kube-controller-manager kube-scheduler kubectl
if [ "$built" = 1 ]; then
  echo ">> control plane binaries built in $(( $(date +%s) - start ))s (cold build), cached in $FLOTILLA_CACHE"
else
  echo ">> control plane binaries cached in $FLOTILLA_CACHE (no build needed)"
fi
