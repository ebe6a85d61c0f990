#!/usr/bin/env bash
# Builds one Go command from its module at a pinned version, into a directory keyed by that
# version (outside the repository), once: later calls return at once.
#
#   hack/build-go-tool.sh NAME PACKAGE@VERSION DEST_DIR
#     e.g. hack/build-go-tool.sh helm helm.sh/helm/v3/cmd/helm@v3.22.0 ~/.cache/flotilla/helm-v3.22.0
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/versions.sh"
name=$1 pkg_at=$2 dest=$3
pkg=${pkg_at%@*}
command -v go >/dev/null || { echo "error: Go >= 1.26 is required (https://go.dev/doc/install)" >&2; exit 1; }
[ -f "$dest/.complete" ] && exit 0
mkdir -p "$FLOTILLA_CACHE"
exec 9>"$FLOTILLA_CACHE/.$name.lock"
flock 9
[ -f "$dest/.complete" ] && exit 0
echo ">> building $name ${pkg_at#*@} from its Go module (cold: a few minutes)"
start=$(date +%s)
mod=$(mktemp -d)
(
  cd "$mod"
  go mod init "flotilla.dev/$name" >/dev/null 2>&1
  go get -tool "$pkg_at" >/dev/null 2>&1
  mkdir -p "$dest.tmp"
  CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags="-s -w" -o "$dest.tmp/$name" "$pkg"
)
rm -rf "$mod" "$dest"; mv "$dest.tmp" "$dest"; touch "$dest/.complete"
echo ">> $name built in $(( $(date +%s) - start ))s, cached in $dest"
