#!/usr/bin/env bash
# How fast the apiserver creates Services with few or many clients at once: SERVICES
# Services in one namespace, split between P kubectl clients (each POSTs its share one after
# another), for each P given, each on a new local control plane. Prints Services per second.
#
#   bash bench/service_creates.sh [SERVICES] [P...]      default 600 services, P = 4 16 64
#   FLOTILLA_BENCH_SVC_MODE=apply bash bench/service_creates.sh     server-side apply instead of create
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/hack/versions.sh"
cd "$here"
SERVICES=${1:-600}; shift || true
COUNTS=${*:-4 16 64}
MODE=${FLOTILLA_BENCH_SVC_MODE:-create}
case $MODE in create) verb=(create -f) ;; apply) verb=(apply --server-side --field-manager=bench -f) ;; *) echo "error: FLOTILLA_BENCH_SVC_MODE is create or apply" >&2; exit 1 ;; esac
CLUSTER=flotilla-bench-svc
export KWOK_WORKDIR=${KWOK_WORKDIR:-$FLOTILLA_CACHE/kwok}
WORK=$(mktemp -d)
trap 'bash hack/cluster.sh down "$CLUSTER" >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT
bash hack/prerequisites.sh
echo "| kubectl $MODE: clients at once | Services | seconds | Services per second |"
echo "|---|---|---|---|"
for p in $COUNTS; do
  bash hack/cluster.sh down "$CLUSTER" >/dev/null 2>&1 || true
  bash hack/cluster.sh up "$CLUSTER" >/dev/null
  KUBECONFIG=$(bash hack/cluster.sh kubeconfig "$CLUSTER"); export KUBECONFIG
  kubectl create namespace svc >/dev/null
  rm -rf "$WORK/p"; mkdir -p "$WORK/p"
  for i in $(seq 0 $((SERVICES - 1))); do
    printf -- '---\napiVersion: v1\nkind: Service\nmetadata: {name: s-%s, namespace: svc}\nspec: {selector: {app: s-%s}, ports: [{port: 80}]}\n' "$i" "$i" \
      >>"$WORK/p/$((i % p)).yaml"
  done
  start=$(date +%s.%N)
  ls "$WORK/p"/*.yaml | xargs -P "$p" -n 1 kubectl "${verb[@]}" >/dev/null
  took=$(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $start}")
  echo "| $p | $SERVICES | $took | $(awk "BEGIN{printf \"%.1f\", $SERVICES / $took}") |"
done
