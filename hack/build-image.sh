#!/usr/bin/env bash
# The operator's image, built on this machine without a registry and loaded into the real
# node's containerd (hack/real-node.sh), for the in-cluster tests and anyone trying the chart
# locally. The Dockerfile stays the production definition (the same glibc build on distroless
# `cc`); it needs a registry for its base images, which these machines cannot reach.
#
#   hack/build-image.sh BINARY [CLUSTER]   prints the image reference, localhost/flotilla:<tag>
#
# BINARY is a flotilla binary built for this machine (cargo's, any profile); it is stripped and
# put in an image `from scratch` with the shared libraries it links (glibc's loader, libc, libm,
# libgcc_s: what `ldd` lists) and the system's CA bundle, so no second, static build is needed.
# The tag is the digest of the stripped binary and the CA bundle: the same binary gives the
# same image, a new one a new tag (which is what a `helm upgrade` to a new version looks like). The image runs as 65532:65532, like the
# Dockerfile's, and holds nothing else: no shell, no package manager.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/versions.sh"
binary=${1:?usage: $0 BINARY [CLUSTER]}
cluster=${2:-flotilla-real}
[ -x "$binary" ] || { echo "error: $binary is not an executable (build it with cargo build)" >&2; exit 1; }
for tool in buildah strip ldd; do
  command -v "$tool" >/dev/null || { echo "error: $tool is missing: bash hack/real-node.sh up installs it" >&2; exit 1; }
done
work=$FLOTILLA_CACHE/image
mkdir -p "$work"
strip -o "$work/flotilla" "$binary"
tag=$(cat "$work/flotilla" /etc/ssl/certs/ca-certificates.crt 2>/dev/null | sha256sum | cut -c1-12)
image=localhost/flotilla:$tag
if ! buildah images -q "$image" >/dev/null 2>&1; then
  c=$(buildah from scratch)
  trap 'buildah rm "$c" >/dev/null 2>&1 || true' EXIT
  buildah copy -q "$c" "$work/flotilla" /usr/local/bin/flotilla >/dev/null
  # Every library the binary links, at the path the loader looks for it.
  for lib in $(ldd "$work/flotilla" | grep -o '/[^ ]*'); do
    buildah copy -q "$c" "$(readlink -f "$lib")" "$lib" >/dev/null
  done
  # The CA bundle distroless ships, for Prometheus and trace endpoints over HTTPS.
  [ -f /etc/ssl/certs/ca-certificates.crt ] &&
    buildah copy -q "$c" /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt >/dev/null
  buildah config --user 65532:65532 --port 8080 --port 9443 \
    --entrypoint '["/usr/local/bin/flotilla"]' --cmd run "$c"
  buildah commit -q "$c" "$image" >/dev/null
fi
bash "$here/real-node.sh" import "$image" "$cluster" >&2
echo ">> $image ($(buildah images --format '{{.Size}}' "$image" | head -1)) loaded into cluster '$cluster'" >&2
echo "$image"
