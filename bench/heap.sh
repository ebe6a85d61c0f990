#!/usr/bin/env bash
# Heap profile of one replica holding APPS Apps in NAMESPACES namespaces: which allocation
# sites hold the memory once every App has converged. Runs the release build under heaptrack
# (Debian package `heaptrack`, installed here when missing) on a private local control plane,
# then prints heaptrack's top consumers of memory at the peak and once every App is Healthy.
#
#   bash bench/heap.sh [NAMESPACES] [APPS]      default 20 namespaces, 1000 Apps
#   FLOTILLA_BENCH_BIN=path                     another build of the replica to profile
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/hack/versions.sh"
cd "$here"
NAMESPACES=${1:-20}
APPS=${2:-1000}
CLUSTER=flotilla-bench-heap
WORK=$(mktemp -d)
. bench/one_replica.sh
. bench/heaptrack.sh
heaptrack_installed
PID=
cleanup() {
  [ -n "$PID" ] && kill -9 "$PID" 2>/dev/null || true
  bash hack/cluster.sh down "$CLUSTER" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

one_replica_cluster
one_replica_tenants heap
heaptrack -o "$WORK/heap" "$BIN" run --kubeconfig "$WORK/op.kubeconfig" --admin-addr 127.0.0.1:9670 --webhook-addr 127.0.0.1:0 \
  --replica-id heap-0 >"$WORK/replica.log" 2>&1 &
PID=$!
CHILD=$(heaptrack_child "$PID" "$BIN" "$WORK/replica.log")
one_replica_wait_ready 9670
echo ">> creating $APPS Apps in $NAMESPACES namespaces"
one_replica_apps heap >"$WORK/apps.yaml"
kubectl create -f "$WORK/apps.yaml" >/dev/null
one_replica_wait_healthy
sleep 10
rss=$(awk '/VmRSS/{printf "%.0f", $2/1024}' "/proc/$CHILD/status" 2>/dev/null || echo "?")
echo ">> every App Healthy; RSS of the replica under heaptrack: ${rss} MiB; killing it (-9: what it held is what the profile ends with)"
kill -9 "$CHILD" 2>/dev/null || true
wait "$PID" || true
PID=
file=$(ls "$WORK"/heap* 2>/dev/null | head -1)
[ -n "$file" ] || { echo "heaptrack wrote no profile; its output:" >&2; cat "$WORK/replica.log" >&2; exit 1; }
mkdir -p "$FLOTILLA_CACHE/heap"
kept="$FLOTILLA_CACHE/heap/$(date -u +%Y%m%dT%H%M%SZ)-$(basename "$file")"
cp "$file" "$kept"
echo ">> profile kept in $kept (heaptrack_gui or heaptrack_print can read it)"
# Heap at its peak, by the first frame of the stack that names what holds the memory (a
# cache's reflector, a serde_json value, an h2 buffer...), not by the allocator's own frames.
python3 bench/heap_holders.py "$file" peak
# What it held when it was killed, every App Healthy and 10 s idle.
python3 bench/heap_holders.py "$file" leaked
# The heap while the replica was steady (every App Healthy, 10 s idle), which the peak above
# is not: the median of heaptrack's snapshots from 8 s to 1 s before the profile ends.
heaptrack_print -f "$file" --print-peaks 0 --print-allocators 0 --print-temporary 0 --print-leaks 0 \
  --print-massif "$WORK/massif" --massif-threshold 100 >/dev/null
python3 - "$WORK/massif" <<'PY'
import re, statistics, sys
snaps = [(float(t), int(b)) for t, b in re.findall(r"time=([0-9.]+)\nmem_heap_B=([0-9]+)", open(sys.argv[1]).read())]
end = snaps[-1][0] if snaps else 0
steady = [b for t, b in snaps if end - 8 <= t < end - 1]
if steady:
    print(f"heap when steady (every App Healthy; median of the 7 s before the stop): {statistics.median(steady) / 2**20:.1f} MiB")
else:
    print("heap when steady: no snapshot in the 7 s before the stop")
PY
