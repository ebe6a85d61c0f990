#!/usr/bin/env bash
# Measures shard failover of 3 replicas on a private local control plane and prints the
# figures (never asserted by tests: these machines are noisy).
#
#   bash bench/failover.sh [KILLS]     default 20 kill -9 rounds
#
# - kill -9 of a replica: time from the kill until an App changed in every namespace has
#   been reconciled (status.currentVersion = new version), p50/p99 over KILLS rounds;
# - SIGTERM of a replica: time until every shard Lease is held by the others;
# - a replica joining two others: time until shards are balanced within one.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/hack/versions.sh"
cd "$here"
KILLS=${1:-20}
CLUSTER=flotilla-bench
NAMESPACES=${FLOTILLA_BENCH_NAMESPACES:-12}
WORK=$(mktemp -d)
export KWOK_WORKDIR=${KWOK_WORKDIR:-$FLOTILLA_CACHE/kwok}

bash hack/prerequisites.sh
bash hack/cluster.sh up "$CLUSTER" >/dev/null
KUBECONFIG=$(bash hack/cluster.sh kubeconfig "$CLUSTER"); export KUBECONFIG
cargo build --locked --release --bin flotilla 2>&1 | tail -1
BIN=$CARGO_TARGET_DIR/release/flotilla
declare -A PIDS
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  bash hack/cluster.sh down "$CLUSTER" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

bash hack/install-local.sh "$CLUSTER" "$WORK/op.kubeconfig"

start_replica() {
  local id=$1 port=$2
  [ -f "$WORK/op-$id.kubeconfig" ] || bash hack/operator-kubeconfig.sh "$CLUSTER" "$WORK/op-$id.kubeconfig" "$id"
  "$BIN" run --kubeconfig "$WORK/op-$id.kubeconfig" --admin-addr "127.0.0.1:$port" --webhook-addr 127.0.0.1:0 --replica-id "$id" >"$WORK/$id.log" 2>&1 &
  PIDS[$id]=$!
  disown "$!"
  until curl -fs "127.0.0.1:$port/readyz" >/dev/null 2>&1; do sleep 0.1; done
}
now() { date +%s.%N; }
elapsed() { awk "BEGIN{printf \"%.2f\", $(now) - $1}"; }
holders() { kubectl -n flotilla-system get leases -l flotilla.dev/lease=shard -o jsonpath='{range .items[*]}{.spec.holderIdentity}{"\n"}{end}'; }
balanced() { # balanced ID... : every shard held by one of IDs, within one of each other
  holders | awk -v ids="$*" 'BEGIN{n=split(ids,a," "); for(i=1;i<=n;i++) ok[a[i]]=1}
    {t++; if(!($0 in ok)) bad=1; c[$0]++}
    END{if(t!=32||bad) exit 1; mn=1e9; mx=0; for(i=1;i<=n;i++){v=c[a[i]]+0; if(v<mn)mn=v; if(v>mx)mx=v}; exit (mx-mn<=1)?0:1}'
}
wait_until() { until "$@"; do sleep 0.1; done; }

ns_list=$(seq -f "bench-%02g" 0 $((NAMESPACES - 1)) | paste -sd, -)
# A Tenant holds at most 100 namespaces: one Tenant per hundred.
seq -f "bench-%02g" 0 $((NAMESPACES - 1)) | split -l 100 - "$WORK/tenant-"
for part in "$WORK"/tenant-*; do
  kubectl apply -f - >/dev/null <<YAML
apiVersion: flotilla.dev/v1beta1
kind: Tenant
metadata: {name: bench-${part##*-}}
spec: {namespaces: [$(paste -sd, "$part")]}
YAML
done
start_replica r0 9560; start_replica r1 9561; start_replica r2 9562
wait_until balanced r0 r1 r2
kubectl wait --for=condition=Ready tenant --all --timeout=300s >/dev/null
for ns in ${ns_list//,/ }; do
  kubectl -n "$ns" apply -f - >/dev/null <<YAML
apiVersion: flotilla.dev/v1beta1
kind: App
metadata: {name: web}
spec: {image: registry.example.com/bench/web, version: "v0", replicas: 1}
YAML
done
all_at() { # every App at version $1
  local v=$1
  [ "$(kubectl get apps -A -o jsonpath='{range .items[*]}{.status.currentVersion}{"\n"}{end}' | grep -cx "$v")" = "$NAMESPACES" ]
}
wait_until all_at v0

echo ">> $KILLS rounds of kill -9 (3 replicas, 32 shards, $NAMESPACES namespaces, lease 6s, renew deadline 4s)"
times=()
ids=(r0 r1 r2); ports=(9560 9561 9562)
for round in $(seq 1 "$KILLS"); do
  i=$(( (round - 1) % 3 )); id=${ids[$i]}
  t0=$(now)
  kill -9 "${PIDS[$id]}"
  v="v$round"
  for ns in ${ns_list//,/ }; do kubectl -n "$ns" patch app web --type=merge -p "{\"spec\":{\"version\":\"$v\"}}" >/dev/null; done
  wait_until all_at "$v"
  t=$(elapsed "$t0"); times+=("$t")
  echo "   round $round: killed $id, every App reconciled after ${t}s"
  start_replica "$id" "${ports[$i]}"
  wait_until balanced r0 r1 r2
done
sorted=$(printf '%s\n' "${times[@]}" | sort -n)
p50=$(echo "$sorted" | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}')
p99=$(echo "$sorted" | awk '{a[NR]=$1} END{i=int(NR*0.99+0.999); if(i<1)i=1; print a[i]}')

echo ">> SIGTERM of r2"
t0=$(now); kill -TERM "${PIDS[r2]}"
wait_until balanced r0 r1
term=$(elapsed "$t0")
echo ">> a replica joins (r3)"
start_replica r3 9563
t0=$(now); wait_until balanced r0 r1 r3
join=$(elapsed "$t0")

echo
echo "| measurement | result | goal |"
echo "|---|---|---|"
echo "| kill -9, App change reconciled (p50 / p99 over $KILLS) | ${p50}s / ${p99}s | p99 <= 10 s |"
echo "| SIGTERM, shards held elsewhere | ${term}s | <= 2 s |"
echo "| a replica joins two others, balanced within one | ${join}s | <= 30 s |"
