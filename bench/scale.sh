#!/usr/bin/env bash
# Scale benchmark: Flotilla (3 replicas, release build) against a bare client creating the
# same Deployments, on a private local control plane with the components' QPS limits lifted.
# Prints a table at the end and keeps the raw figures as JSON in bench/results/ so that two
# runs can be compared. Never asserted by a test (tests/scale.rs checks correctness only).
#
#   bash bench/scale.sh [NAMESPACES] [APPS]      default 1000 namespaces, 10000 Apps
#   FLOTILLA_BENCH_IDLE=600 FLOTILLA_BENCH_CHANGES=50 FLOTILLA_BENCH_REPLICAS_PER_APP=0 bash bench/scale.sh 100 1000
#
# Measured:
# - baseline: time for a bare client (kubectl, 8 in parallel) to create APPS Deployments
#   spread over NAMESPACES namespaces, until all exist;
# - Flotilla: time from the first App created until every App has its Deployment and a
#   status at its current generation (Healthy), same objects, same parallelism;
# - per replica: peak and steady RSS, CPU seconds, open connections to the apiserver,
#   requests sent (from the audit log, by User-Agent);
# - writes by the operator in tenant namespaces during IDLE seconds after convergence;
# - the time for one changed App to be reconciled while all are present (p50/p99).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/hack/versions.sh"
cd "$here"
NAMESPACES=${1:-1000}
APPS=${2:-10000}
IDLE=${FLOTILLA_BENCH_IDLE:-600}
CHANGES=${FLOTILLA_BENCH_CHANGES:-50}
POD_REPLICAS=${FLOTILLA_BENCH_REPLICAS_PER_APP:-0}
PARALLEL=8
CLUSTER=flotilla-bench-scale
WORK=$(mktemp -d)
export KWOK_WORKDIR=${KWOK_WORKDIR:-$FLOTILLA_CACHE/kwok}
per_ns=$(( (APPS + NAMESPACES - 1) / NAMESPACES ))

bash hack/prerequisites.sh
echo ">> cluster $CLUSTER (QPS limits of the control-plane components lifted)"
bash hack/cluster.sh down "$CLUSTER" >/dev/null 2>&1 || true
bash hack/cluster.sh up "$CLUSTER" --disable-qps-limits >/dev/null
KUBECONFIG=$(bash hack/cluster.sh kubeconfig "$CLUSTER"); export KUBECONFIG
AUDIT=$(bash hack/cluster.sh audit-log "$CLUSTER")
echo ">> release build"
cargo build --locked --release --bin flotilla 2>&1 | tail -1
BIN=$CARGO_TARGET_DIR/release/flotilla
PIDS=()
SAMPLER=
cleanup() {
  [ -n "$SAMPLER" ] && kill "$SAMPLER" 2>/dev/null || true
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  bash hack/cluster.sh down "$CLUSTER" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
now() { date +%s.%N; }
since() { awk "BEGIN{printf \"%.1f\", $(now) - $1}"; }

# Objects, written once: one file per namespace, created with PARALLEL clients.
make_files() { # make_files PREFIX KIND
  local prefix=$1 kind=$2 ns i n=0
  mkdir -p "$WORK/$prefix"
  for ns in $(seq -f "$prefix-%04g" 0 $((NAMESPACES - 1))); do
    : >"$WORK/$prefix/$ns.yaml"
    for i in $(seq 0 $((per_ns - 1))); do
      [ "$n" -ge "$APPS" ] && break
      n=$((n + 1))
      if [ "$kind" = Deployment ]; then
        cat >>"$WORK/$prefix/$ns.yaml" <<YAML
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: app-$i, namespace: $ns, labels: {app.kubernetes.io/name: app-$i}}
spec:
  replicas: $POD_REPLICAS
  selector: {matchLabels: {app.kubernetes.io/name: app-$i}}
  template:
    metadata: {labels: {app.kubernetes.io/name: app-$i}}
    spec: {containers: [{name: app, image: "registry.example.com/bench/app:1"}]}
YAML
      else
        cat >>"$WORK/$prefix/$ns.yaml" <<YAML
---
apiVersion: flotilla.dev/v1beta1
kind: App
metadata: {name: app-$i, namespace: $ns}
spec: {image: registry.example.com/bench/app, version: "1", replicas: $POD_REPLICAS}
YAML
      fi
    done
  done
}
create_all() { ls "$WORK/$1"/*.yaml | xargs -P "$PARALLEL" -n 20 sh -c 'for f; do kubectl create -f "$f" >/dev/null; done' _; }

echo ">> baseline: a bare client creates $APPS Deployments in $NAMESPACES namespaces"
seq -f "base-%04g" 0 $((NAMESPACES - 1)) | xargs -P "$PARALLEL" -n 1 kubectl create namespace >/dev/null
make_files base Deployment
t0=$(now)
create_all base
until [ "$(kubectl get deployments -A --no-headers 2>/dev/null | grep -c '^base-')" -ge "$APPS" ]; do sleep 0.5; done
baseline=$(since "$t0")
echo "   all $APPS Deployments exist after ${baseline}s"
seq -f "base-%04g" 0 $((NAMESPACES - 1)) | xargs -P "$PARALLEL" -n 50 kubectl delete namespace --wait=false >/dev/null

echo ">> Flotilla: CRDs, RBAC, 3 replicas, tenants onboarding $NAMESPACES namespaces"
bash hack/install-local.sh "$CLUSTER" "$WORK/op.kubeconfig"
for i in 0 1 2; do
  "$BIN" run --kubeconfig "$WORK/op.kubeconfig" --admin-addr "127.0.0.1:$((9660 + i))" --webhook-addr 127.0.0.1:0 --replica-id "scale-$i" \
    >"$WORK/scale-$i.log" 2>&1 &
  PIDS+=($!)
done
for i in 0 1 2; do until curl -fs "127.0.0.1:$((9660 + i))/readyz" >/dev/null 2>&1; do sleep 0.2; done; done
# RSS of every replica, once a second: peak and steady come from here.
( while true; do
    for i in 0 1 2; do
      printf '%s %s %s\n' "$(date +%s)" "$i" "$(awk '/VmRSS/{print $2}' "/proc/${PIDS[$i]}/status" 2>/dev/null || echo 0)"
    done
    sleep 1
  done ) >"$WORK/rss" &
SAMPLER=$!
tenants=$(( (NAMESPACES + 99) / 100 ))
for t in $(seq 0 $((tenants - 1))); do
  first=$((t * 100)); last=$(( (t + 1) * 100 - 1 )); [ "$last" -ge "$NAMESPACES" ] && last=$((NAMESPACES - 1))
  list=$(seq -f "scale-%04g" "$first" "$last" | paste -sd, -)
  printf 'apiVersion: flotilla.dev/v1beta1\nkind: Tenant\nmetadata: {name: scale-%02d}\nspec: {namespaces: [%s]}\n' "$t" "$list" \
    | kubectl apply -f - >/dev/null
done
until [ "$(kubectl get tenants -o jsonpath='{range .items[*]}{.status.namespaces[*].state}{" "}{end}' | tr ' ' '\n' | grep -c '^Onboarded$')" -ge "$NAMESPACES" ]; do
  sleep 1
done
make_files scale App
echo ">> creating $APPS Apps"
conv_from=$(wc -l <"$AUDIT")
t0=$(now); start=$(date +%s)
create_all scale
converged() {
  [ "$(kubectl get apps -A -o jsonpath='{range .items[*]}{.metadata.generation}={.status.observedGeneration}:{.status.phase}{"\n"}{end}' \
      | awk -F'[=:]' '$1==$2 && $3=="Healthy"' | wc -l)" -ge "$APPS" ]
}
until converged; do sleep 1; done
flotilla=$(since "$t0"); converged_at=$(date +%s)
conv_to=$(wc -l <"$AUDIT")
echo "   every App has its Deployment and a current Healthy status after ${flotilla}s"

echo ">> idle for ${IDLE}s: writes by the operator in tenant namespaces"
idle_from=$(wc -l <"$AUDIT")
sleep "$IDLE"
idle_writes=$(tail -n +"$((idle_from + 1))" "$AUDIT" | python3 -c '
import json, sys
n = 0
for line in sys.stdin:
    e = json.loads(line)
    if e.get("stage") == "ResponseComplete" and e.get("verb") in ("create", "update", "patch", "delete") \
       and e.get("objectRef", {}).get("namespace") != "flotilla-system":
        n += 1
print(n)')
steady_at=$(date +%s)

echo ">> $CHANGES changes of one App each, while all $APPS are present"
lat=()
for c in $(seq 1 "$CHANGES"); do
  ns=$(printf 'scale-%04d' $(( (c * 7919) % NAMESPACES ))); app="app-$(( c % per_ns ))"
  kubectl -n "$ns" get app "$app" >/dev/null 2>&1 || app=app-0
  t=$(now)
  kubectl -n "$ns" patch app "$app" --type=merge -p "{\"spec\":{\"version\":\"c$c\"}}" >/dev/null
  until [ "$(kubectl -n "$ns" get app "$app" -o jsonpath='{.status.currentVersion}')" = "c$c" ]; do sleep 0.05; done
  lat+=("$(since "$t")")
done
sorted=$(printf '%s\n' "${lat[@]}" | sort -n)
p50=$(echo "$sorted" | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}')
p99=$(echo "$sorted" | awk '{a[NR]=$1} END{i=int(NR*0.99+0.999); if(i<1)i=1; print a[i]}')

api_port=$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}' | sed 's/.*://')
tck=$(getconf CLK_TCK)
rows=()
json_replicas=()
for i in 0 1 2; do
  pid=${PIDS[$i]}
  peak=$(awk -v r="$i" '$2==r && $3>m {m=$3} END{printf "%.0f", m/1024}' "$WORK/rss")
  steady=$(awk -v r="$i" -v a="$converged_at" -v b="$steady_at" '$2==r && $1>=a && $1<=b {s+=$3; n++} END{printf "%.0f", (n?s/n:0)/1024}' "$WORK/rss")
  cpu=$(awk -v t="$tck" '{printf "%.1f", ($14+$15)/t}' "/proc/$pid/stat")
  conns=$(ss -tnp 2>/dev/null | grep "pid=$pid," | grep -c ":$api_port " || true)
  requests=$(python3 - "$AUDIT" "scale-$i" <<'PY'
import json, sys
ids = set()
for line in open(sys.argv[1]):
    e = json.loads(line)
    if e.get("userAgent", "").endswith(f"({sys.argv[2]})"):
        ids.add(e.get("auditID"))
print(len(ids))
PY
)
  rows+=("| scale-$i | $peak MiB | $steady MiB | $cpu s | $conns | $requests |")
  json_replicas+=("{\"replica\":\"scale-$i\",\"peak_rss_mib\":$peak,\"steady_rss_mib\":$steady,\"cpu_seconds\":$cpu,\"apiserver_connections\":$conns,\"requests\":$requests}")
done
ratio=$(awk "BEGIN{printf \"%.2f\", $flotilla / $baseline}")

mkdir -p bench/results
out=bench/results/scale-$(date -u +%Y%m%dT%H%M%SZ).json
cat >"$out" <<JSON
{"namespaces":$NAMESPACES,"apps":$APPS,"pod_replicas_per_app":$POD_REPLICAS,"parallel_clients":$PARALLEL,
 "baseline_seconds":$baseline,"flotilla_seconds":$flotilla,"ratio":$ratio,
 "idle_seconds":$IDLE,"idle_writes":$idle_writes,
 "change_latency_seconds":{"p50":$p50,"p99":$p99,"samples":[$(IFS=,; echo "${lat[*]}")]},
 "replicas":[$(IFS=,; echo "${json_replicas[*]}")]}
JSON

echo
echo "Scale: $NAMESPACES namespaces, $APPS Apps ($POD_REPLICAS pods each), 3 replicas; raw figures in $out"
echo
echo "| measurement | result | goal |"
echo "|---|---|---|"
echo "| bare client: $APPS Deployments exist | ${baseline}s | |"
echo "| Flotilla: every App has its Deployment and current status | ${flotilla}s | |"
echo "| ratio Flotilla / bare client | ${ratio}x | <= 1.3x |"
echo "| writes by the operator in ${IDLE} idle seconds | $idle_writes | 0 |"
echo "| one changed App reconciled (p50 / p99 over $CHANGES) | ${p50}s / ${p99}s | p99 <= 1 s |"
echo
echo "Writes by the operator in the tenant namespaces per App, until every App converged (audit"
echo "log; the bare client writes one object per Deployment; the controller-manager's writes"
echo "for the Deployments are the same in both runs):"
echo
writes() { # $1 $2: audit line range, $3: prefix of the namespaces, $4: objects created
  sed -n "$(( $1 + 1 )),$2p" "$AUDIT" | python3 -c '
import collections, json, sys
prefix, objects = sys.argv[1], int(sys.argv[2])
counts = collections.Counter()
for line in sys.stdin:
    e = json.loads(line)
    ref = e.get("objectRef", {})
    if e.get("stage") != "ResponseComplete" or e.get("verb") not in ("create", "update", "patch", "delete"):
        continue
    if not ref.get("namespace", "").startswith(prefix):
        continue
    agent = e.get("userAgent", "")
    who = "flotilla" if agent.startswith("flotilla/") else agent.split("/")[0]
    what = ref.get("resource", "") + ("/" + ref["subresource"] if ref.get("subresource") else "")
    counts[(who, e["verb"], what)] += 1
total = sum(counts.values())
print(f"| writer | verb | resource | per object |")
print(f"|---|---|---|---|")
for (who, verb, what), n in counts.most_common():
    print(f"| {who} | {verb} | {what} | {n / objects:.2f} |")
print(f"| all | | | {total / objects:.2f} |")
' "$3" "$4"
}
writes "$conv_from" "$conv_to" scale- "$APPS"
echo
echo "| replica | peak RSS | steady RSS | CPU | apiserver connections | requests sent |"
echo "|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
