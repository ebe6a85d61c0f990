#!/usr/bin/env bash
# The in-cluster test (tests/in_cluster.rs) through the other install path: `kubectl apply -k`
# of deploy/base with an overlay for the local image and the real node, then the same rolling
# update (a changed pod annotation) and forced deletion under App version changes. CI runs the
# Helm path; the two render the same objects (tests/deploy.rs). Needs root (the real node).
#
#   sudo bash bench/in_cluster.sh
set -euo pipefail
here=$(cd "$(dirname "$0")/../hack" && pwd)
. "$here/versions.sh"
cd "$here/.."
bash hack/build-helm.sh >/dev/null
FLOTILLA_IN_CLUSTER_INSTALL=kustomize exec cargo test --locked --test in_cluster -- --nocapture
