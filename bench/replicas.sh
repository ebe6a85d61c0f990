#!/usr/bin/env bash
# How the operator grows past one replica's budget: bench/scale.sh at 1, 3 and 5 replicas
# (same Apps, same namespaces, no failover), then one table of convergence and RSS per
# replica from the three JSON results.
#
#   bash bench/replicas.sh [NAMESPACES] [APPS]      default 100 namespaces, 1000 Apps
#   FLOTILLA_BENCH_REPLICA_COUNTS="1 2 3" bash bench/replicas.sh
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
NAMESPACES=${1:-100}
APPS=${2:-1000}
results=()
for n in ${FLOTILLA_BENCH_REPLICA_COUNTS:-1 3 5}; do
  echo ">> $n replicas"
  log=$(mktemp)
  FLOTILLA_BENCH_OPERATOR_REPLICAS=$n FLOTILLA_BENCH_FAILOVER=0 FLOTILLA_BENCH_IDLE=${FLOTILLA_BENCH_IDLE:-60} \
    FLOTILLA_BENCH_CHANGES=${FLOTILLA_BENCH_CHANGES:-10} bash bench/scale.sh "$NAMESPACES" "$APPS" | tee "$log"
  results+=("$(sed -n 's/.*raw figures in \(bench\/results\/[^ ]*\.json\).*/\1/p' "$log")")
  rm -f "$log"
done
echo
echo "Replicas at $APPS Apps in $NAMESPACES namespaces (bench/replicas.sh; raw: ${results[*]}):"
echo
python3 - "${results[@]}" <<'PY'
import json, sys
print("| replicas | converged | ratio to the bare client | RSS per replica, peak (max) | RSS per replica, steady (mean / max) | CPU, all replicas | one change p50 / p99 |")
print("|---|---|---|---|---|---|---|")
for path in sys.argv[1:]:
    r = json.load(open(path))
    reps = r["replicas"]
    peak = max(x["peak_rss_mib"] for x in reps)
    steady = [x["steady_rss_mib"] for x in reps]
    cpu = sum(x["cpu_seconds"] for x in reps)
    lat = r["change_latency_seconds"]
    print(f"| {len(reps)} | {r['flotilla_seconds']} s | {r['ratio']}x | {peak} MiB | {sum(steady) / len(steady):.0f} / {max(steady)} MiB | {cpu:.1f} s | {lat['p50']} / {lat['p99']} s |")
PY
