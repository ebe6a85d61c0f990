#!/usr/bin/env bash
# Memory of one replica serving NAMESPACES namespaces and APPS Apps of 0 pods: what one of
# three replicas holds at 10,000 Apps with `bench/replica_memory.sh 333 3333`. Runs the release build
# (no profiler: heaptrack replaces the allocator, bench/heap.sh says where the heap goes) on
# a private local control plane, samples its RSS twice a second, and prints: the peak while
# the Apps are created, the RSS when every App is Healthy, and the steady RSS after IDLE
# seconds with nothing to do; then the time to converge and the CPU seconds.
#
#   bash bench/replica_memory.sh [NAMESPACES] [APPS]     default 333 namespaces, 3333 Apps
#   FLOTILLA_BENCH_IDLE=60       idle seconds before the steady RSS is read (default 60)
#   FLOTILLA_BENCH_BIN=path      another build of the replica to measure (default: release)
#   FLOTILLA_BENCH_ENV="K=V ..." environment for the replica (MALLOC_ARENA_MAX=2, ...)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/hack/versions.sh"
cd "$here"
NAMESPACES=${1:-333}
APPS=${2:-3333}
IDLE=${FLOTILLA_BENCH_IDLE:-60}
CLUSTER=flotilla-bench-memory
WORK=$(mktemp -d)
export KWOK_WORKDIR=${KWOK_WORKDIR:-$FLOTILLA_CACHE/kwok}
per_ns=$(( (APPS + NAMESPACES - 1) / NAMESPACES ))

bash hack/prerequisites.sh
bash hack/cluster.sh down "$CLUSTER" >/dev/null 2>&1 || true
bash hack/cluster.sh up "$CLUSTER" --disable-qps-limits >/dev/null
KUBECONFIG=$(bash hack/cluster.sh kubeconfig "$CLUSTER"); export KUBECONFIG
if [ -z "${FLOTILLA_BENCH_BIN:-}" ]; then
  cargo build --locked --release --bin flotilla 2>&1 | tail -1
fi
BIN=${FLOTILLA_BENCH_BIN:-$CARGO_TARGET_DIR/release/flotilla}
PID= SAMPLER=
cleanup() {
  [ -n "$SAMPLER" ] && kill "$SAMPLER" 2>/dev/null || true
  [ -n "$PID" ] && kill -9 "$PID" 2>/dev/null || true
  bash hack/cluster.sh down "$CLUSTER" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

bash hack/install-local.sh "$CLUSTER" "$WORK/op.kubeconfig"
list=$(seq -f "mem-%04g" 0 $((NAMESPACES - 1)) | paste -sd, -)
# A Tenant lists at most 100 namespaces: one Tenant per hundred.
for t in $(seq 0 $(( (NAMESPACES - 1) / 100 ))); do
  part=$(seq -f "mem-%04g" $((t * 100)) $(( t * 100 + 99 < NAMESPACES - 1 ? t * 100 + 99 : NAMESPACES - 1 )) | paste -sd, -)
  printf 'apiVersion: flotilla.dev/v1beta1\nkind: Tenant\nmetadata: {name: mem-%d}\nspec: {namespaces: [%s]}\n' "$t" "$part"
  echo ---
done | kubectl apply -f - >/dev/null
# shellcheck disable=SC2086
env ${FLOTILLA_BENCH_ENV:-} "$BIN" run --kubeconfig "$WORK/op.kubeconfig" --admin-addr 127.0.0.1:9671 \
  --webhook-addr 127.0.0.1:0 --replica-id mem-0 >"$WORK/replica.log" 2>&1 &
PID=$!
# RSS in KiB, twice a second, with the time: one line per sample.
( while kill -0 "$PID" 2>/dev/null; do
    awk -v t="$(date +%s.%N)" '/VmRSS/{print t, $2}' "/proc/$PID/status" 2>/dev/null || true
    sleep 0.5
  done ) >"$WORK/rss" &
SAMPLER=$!
until curl -fs 127.0.0.1:9671/readyz >/dev/null 2>&1; do
  kill -0 "$PID" 2>/dev/null || { echo "the replica exited; its log:" >&2; cat "$WORK/replica.log" >&2; exit 1; }
  sleep 0.5
done
until [ "$(kubectl get tenants -o jsonpath='{.items[*].status.namespaces[*].state}' | tr ' ' '\n' | grep -c '^Onboarded$')" -ge "$NAMESPACES" ]; do sleep 1; done
onboarded_rss=$(awk '/VmRSS/{printf "%.0f", $2/1024}' "/proc/$PID/status")
echo ">> $NAMESPACES namespaces onboarded, RSS ${onboarded_rss} MiB; creating $APPS Apps"
n=0
for ns in ${list//,/ }; do
  for i in $(seq 0 $((per_ns - 1))); do
    [ "$n" -ge "$APPS" ] && break
    n=$((n + 1))
    printf -- '---\napiVersion: flotilla.dev/v1beta1\nkind: App\nmetadata: {name: app-%d, namespace: %s}\nspec: {image: registry.example.com/bench/app, version: "1", replicas: 0}\n' "$i" "$ns"
  done
done >"$WORK/apps.yaml"
start=$(date +%s.%N)
kubectl create -f "$WORK/apps.yaml" >/dev/null
until [ "$(kubectl get apps -A -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}' | grep -c '^Healthy$')" -ge "$APPS" ]; do sleep 2; done
converged=$(python3 -c "import time; print(f'{time.time() - $start:.1f}')")
at_converged=$(awk '/VmRSS/{printf "%.0f", $2/1024}' "/proc/$PID/status")
echo ">> every App Healthy after ${converged} s, RSS ${at_converged} MiB; idle for ${IDLE} s"
sleep "$IDLE"
steady=$(awk '/VmRSS/{printf "%.0f", $2/1024}' "/proc/$PID/status")
cpu=$(awk '{printf "%.1f", ($14 + $15) / 100}' "/proc/$PID/stat")
peak=$(awk 'BEGIN{m=0} {if ($2 > m) m = $2} END{printf "%.0f", m/1024}' "$WORK/rss")
echo
echo "One replica, $NAMESPACES namespaces, $APPS Apps ($(git rev-parse --short HEAD)${FLOTILLA_BENCH_ENV:+, $FLOTILLA_BENCH_ENV}):"
echo "| RSS onboarded | RSS peak | RSS when Healthy | RSS after ${IDLE} s idle | converged | CPU |"
echo "|---|---|---|---|---|---|"
echo "| ${onboarded_rss} MiB | ${peak} MiB | ${at_converged} MiB | ${steady} MiB | ${converged} s | ${cpu} s |"
