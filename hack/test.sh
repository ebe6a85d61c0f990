#!/usr/bin/env bash
# Runs every test of the project: formatting and lints, the dependency check, unit tests
# and the end-to-end tests against a local control plane built from upstream sources.
# This is the README's test command and what CI runs (.ci/run).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
. "$here/versions.sh"
cd "$root"
# A fresh clone (CI) rebuilds the crate whole whatever its incremental state says, and that
# state grew by gigabytes each run in the shared target dir: 69 s instead of 81 s without it.
export CARGO_INCREMENTAL=0
t0=$(date +%s)
step() { echo; echo "== $* ($(( $(date +%s) - t0 ))s)"; }

step "prerequisites"
bash "$here/prerequisites.sh"

step "local control plane, the real node's kubelet, trace backend and Helm (built once, cached in $FLOTILLA_CACHE)"
bash "$here/build-jaeger.sh" & jaeger=$!
bash "$here/build-helm.sh" & helm=$!
bash "$here/build-control-plane.sh"
bash "$here/build-control-plane.sh" kubelet
wait "$jaeger"
wait "$helm"
bash "$here/cluster.sh" up flotilla-test
export FLOTILLA_TEST_KUBECONFIG
FLOTILLA_TEST_KUBECONFIG=$(bash "$here/cluster.sh" kubeconfig flotilla-test)
if [ "${FLOTILLA_KEEP_CLUSTER:-0}" != 1 ]; then
  trap 'for c in flotilla-test flotilla-test-sharding flotilla-test-scale flotilla-test-conversion flotilla-test-views flotilla-test-chaos flotilla-webhook; do bash "$here/cluster.sh" down "$c" >/dev/null 2>&1 || true; done; bash "$here/real-node.sh" down flotilla-real >/dev/null 2>&1 || true' EXIT
fi

step "formatting and lints"
cargo fmt --check
cargo clippy --locked --all-targets -- -D warnings

step "one version of each kube crate"
dups=$(cargo tree --locked -d --depth 0 --prefix none -e normal,build 2>/dev/null \
  | awk '{print $1, $2}' | sort -u \
  | grep -E '^(kube|kube-client|kube-core|kube-runtime|kube-derive|k8s-openapi) ' || true)
if [ -n "$dups" ]; then
  echo "error: more than one version of a kube crate in the dependency graph:" >&2
  echo "$dups" >&2
  echo "fix with: cargo update -p <crate>@<newer> --precise <older>" >&2
  exit 1
fi
echo "ok: one version each of kube, kube-client, kube-core, kube-runtime, kube-derive, k8s-openapi"

step "unit and end-to-end tests (built, then run in queues side by side: hack/test-queues.sh)"
built=$(mktemp)
cargo test --locked --all-targets --no-run --message-format=json-render-diagnostics >"$built"
python3 "$here/prune-target.py" <"$built"
bash "$here/test-queues.sh" <"$built"
rm -f "$built"

echo; echo "== all tests passed in $(( $(date +%s) - t0 ))s"
