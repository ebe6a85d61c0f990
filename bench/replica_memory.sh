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
. bench/one_replica.sh
PID= SAMPLER=
cleanup() {
  [ -n "$SAMPLER" ] && kill "$SAMPLER" 2>/dev/null || true
  [ -n "$PID" ] && kill -9 "$PID" 2>/dev/null || true
  bash hack/cluster.sh down "$CLUSTER" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

one_replica_cluster
one_replica_tenants mem
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
one_replica_wait_ready 9671
onboarded_rss=$(awk '/VmRSS/{printf "%.0f", $2/1024}' "/proc/$PID/status")
echo ">> $NAMESPACES namespaces onboarded, RSS ${onboarded_rss} MiB; creating $APPS Apps"
one_replica_apps mem >"$WORK/apps.yaml"
start=$(date +%s.%N)
kubectl create -f "$WORK/apps.yaml" >/dev/null
one_replica_wait_healthy
converged=$(python3 -c "import time; print(f'{time.time() - $start:.1f}')")
at_converged=$(awk '/VmRSS/{printf "%.0f", $2/1024}' "/proc/$PID/status")
echo ">> every App Healthy after ${converged} s, RSS ${at_converged} MiB; idle for ${IDLE} s"
sleep "$IDLE"
steady=$(awk '/VmRSS/{printf "%.0f", $2/1024}' "/proc/$PID/status")
# What the steady RSS is made of: anonymous pages (heap, stacks, allocator slack) against
# pages of the binary and its libraries; and the threads that hold stacks.
split=$(awk '/^RssAnon/{a=$2} /^RssFile/{f=$2} /^Threads/{t=$2}
  END{printf "anonymous %.0f MiB, file-backed %.0f MiB, %d threads", a/1024, f/1024, t}' "/proc/$PID/status")
cpu=$(awk '{printf "%.1f", ($14 + $15) / 100}' "/proc/$PID/stat")
peak=$(awk 'BEGIN{m=0} {if ($2 > m) m = $2} END{printf "%.0f", m/1024}' "$WORK/rss")
echo
echo "One replica, $NAMESPACES namespaces, $APPS Apps ($(git rev-parse --short HEAD)${FLOTILLA_BENCH_ENV:+, $FLOTILLA_BENCH_ENV}):"
echo "| RSS onboarded | RSS peak | RSS when Healthy | RSS after ${IDLE} s idle | converged | CPU |"
echo "|---|---|---|---|---|---|"
echo "| ${onboarded_rss} MiB | ${peak} MiB | ${at_converged} MiB | ${steady} MiB | ${converged} s | ${cpu} s |"
echo "Steady RSS: $split"
