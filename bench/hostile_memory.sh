#!/usr/bin/env bash
# What one tenant can make a replica hold (issue 49 §2, "no tenant can run a replica out of
# memory"): REPLICAS replicas on a private local control plane, one tenant namespace filled
# with the largest objects the schemas admit on three paths, then, while every replica's
# /metrics is scraped twice at once over and over:
# - APPS Apps of `replicas: 0` whose templates are env entries up to the operator's 64 KiB
#   (their status keeps a copy, `stableTemplate`): what a scrape of the per-App series reads;
# - an HTTPRoute of 16 rules of the largest short entries (8 matches of 16 headers and 16
#   query parameters, backends with request and response header modifiers of 16 entries a
#   list), named by ROUTED canary Apps paused at their first step, which read it every 5 s;
# - a ConfigMap named `app` (a string in the JSON of every App above: their main container
#   is named so), changed once a second, which one App reads.
# It prints each replica's peak RSS (VmHWM) while it set up and under that load, against the
# manifests' memory limit; then kills the replica that serves the namespace (kill -9), lets
# a peer take it, and prints them again.
#
#   bash bench/hostile_memory.sh [REPLICAS] [APPS]    default 3 replicas, 150 Apps
#   FLOTILLA_BENCH_BIN=path         another build of the replica (default: the release build)
#   FLOTILLA_BENCH_ROUTED=6         canary Apps naming the route
#   FLOTILLA_BENCH_LOAD=30          seconds of load each time
#   FLOTILLA_BENCH_LIMIT_MIB=320    the limit printed beside (deploy/base/deployment.yaml)
#   FLOTILLA_BENCH_FAILOVER=0       no kill -9 and second round
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/hack/versions.sh"
cd "$here"
REPLICAS=${1:-3}
APPS=${2:-150}
ROUTED=${FLOTILLA_BENCH_ROUTED:-6}
LOAD=${FLOTILLA_BENCH_LOAD:-30}
LIMIT=${FLOTILLA_BENCH_LIMIT_MIB:-320}
CLUSTER=flotilla-bench-hostile
NAMESPACES=1
NS=hostile-0000
WORK=$(mktemp -d)
. bench/one_replica.sh
declare -A PID PORT
cleanup() {
  for p in "${PID[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  bash hack/cluster.sh down "$CLUSTER" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

one_replica_cluster
bash hack/gateway-api.sh install "$KUBECONFIG"
one_replica_tenants hostile

start_replica() { # ID PORT
  bash hack/operator-kubeconfig.sh "$CLUSTER" "$WORK/op-$1.kubeconfig" "$1"
  "$BIN" run --kubeconfig "$WORK/op-$1.kubeconfig" --admin-addr "127.0.0.1:$2" --webhook-addr 127.0.0.1:0 \
    --replica-id "$1" >"$WORK/$1.log" 2>&1 &
  PID[$1]=$! PORT[$1]=$2
  until curl -fs "127.0.0.1:$2/readyz" >/dev/null 2>&1; do
    kill -0 "${PID[$1]}" 2>/dev/null || { echo "replica $1 exited; its log:" >&2; cat "$WORK/$1.log" >&2; exit 1; }
    sleep 0.2
  done
}
for i in $(seq 0 $((REPLICAS - 1))); do start_replica "r$i" $((9580 + i)); done
until [ "$(kubectl get tenants -o jsonpath='{.items[*].status.namespaces[*].state}')" = Onboarded ]; do sleep 1; done

# The replica serving the namespace (none while it moves).
holder() {
  local id
  for id in "${!PID[@]}"; do
    curl -fs "127.0.0.1:${PORT[$id]}/metrics" 2>/dev/null | grep -qx 'flotilla_namespaces_served 1' && { echo "$id"; return; }
  done
  return 1
}
hwm_mib() { awk '/VmHWM/{printf "%.0f", $2/1024}' "/proc/$1/status"; }
rss_mib() { awk '/VmRSS/{printf "%.0f", $2/1024}' "/proc/$1/status"; }
# Resets a process's peak RSS to its RSS now (proc(5), clear_refs "5").
reset_hwm() { echo 5 >"/proc/$1/clear_refs"; }

echo ">> filling namespace $NS: $APPS Apps of 64 KiB templates, an HTTPRoute, $ROUTED routed canaries"
python3 - "$APPS" "$ROUTED" "$NS" >"$WORK/objects.json" <<'PY'
import json, sys
apps, routed, ns = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
items = []
def app(name, spec):
    return {"apiVersion": "flotilla.dev/v1beta1", "kind": "App", "metadata": {"name": name, "namespace": ns},
            "spec": {"image": "registry.example.com/bench/app", "version": "1", **spec}}
# Env entries up to the operator's limit on a template (64 KiB of JSON, as it writes it).
env, size = [], 200
while size < 64 * 1024 - 400:
    env.append({"name": f"E{len(env):05d}"})
    size += len(json.dumps(env[-1], separators=(",", ":"))) + 1
for i in range(apps):
    items.append(app(f"big-{i}", {"replicas": 0, "template": {"spec": {"containers": [{"name": "app", "env": env}]}}}))
items.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app", "namespace": ns}, "data": {"n": "0"}})
items.append(app("reader", {"replicas": 0, "template": {"spec": {"containers": [
    {"name": "app", "envFrom": [{"configMapRef": {"name": "app"}}]}]}}}))
# The route: a rule for each canary (its two Services), the rest of 16 backends each.
pairs = lambda p: [{"name": f"x-{p}-{i:02d}", "value": "v"} for i in range(16)]
modifier = {"set": pairs("s"), "add": pairs("a"), "remove": [f"x-r-{i:02d}" for i in range(16)]}
filters = [{"type": "RequestHeaderModifier", "requestHeaderModifier": modifier},
           {"type": "ResponseHeaderModifier", "responseHeaderModifier": modifier}]
backend = lambda name: {"name": name, "port": 80, "weight": 1, "filters": filters}
match = {"path": {"type": "PathPrefix", "value": "/"},
         "headers": [{"type": "Exact", "name": f"x-h-{i:02d}", "value": "v"} for i in range(16)],
         "queryParams": [{"type": "Exact", "name": f"q-{i:02d}", "value": "v"} for i in range(16)]}
rules = []
for r in range(16):
    backends = ([backend(f"canary-{r}"), backend(f"canary-{r}-canary")] if r < routed
                else [backend(f"other-{r:02d}-{b:02d}") for b in range(16)])
    rules.append({"matches": [match] * 8, "backendRefs": backends})
items.append({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
              "metadata": {"name": "big", "namespace": ns},
              "spec": {"parentRefs": [{"name": "public"}], "rules": rules}})
strategy = {"type": "Canary", "canary": {"steps": [{"weight": 10, "pause": "untilPromoted"}],
                                         "trafficRouting": {"gatewayAPI": {"httpRoute": "big"}}}}
for i in range(routed):
    items.append(app(f"canary-{i}", {"replicas": 2, "rollout": {"strategy": strategy}}))
for item in items:
    print(json.dumps(item, separators=(",", ":")))
PY
route_bytes=$(grep '"kind":"HTTPRoute"' "$WORK/objects.json" | wc -c)
app_bytes=$(grep -m1 '"name":"big-0"' "$WORK/objects.json" | wc -c)
# One object a request: a list of 150 such Apps is over the apiserver's request limit.
while read -r obj; do echo "$obj" | kubectl create -f - >/dev/null; done <"$WORK/objects.json"
count_phase() { kubectl -n "$NS" get apps -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}' | grep -cx "$1" || true; }
until [ "$(count_phase Healthy)" -ge $((APPS + 1 + ROUTED)) ]; do sleep 2; done
for i in $(seq 0 $((ROUTED - 1))); do
  kubectl -n "$NS" patch app "canary-$i" --type merge -p '{"spec":{"version":"2"}}' >/dev/null
done
until [ "$(count_phase Paused)" -ge "$ROUTED" ]; do sleep 1; done
echo ">> every App Healthy (Apps of $app_bytes bytes as written, the route $route_bytes bytes), the canaries paused at 10%"

# LOAD seconds of: two scrapes at once of every replica's /metrics, again and again; the
# ConfigMap `app` changed once a second; the canaries reading the route every 5 s.
load() {
  local until=$(($(date +%s) + LOAD)) n=0 id jobs
  while [ "$(date +%s)" -lt "$until" ]; do
    jobs=()
    for id in "${!PID[@]}"; do
      curl -fs -o /dev/null "127.0.0.1:${PORT[$id]}/metrics" & jobs+=($!)
      curl -fs -o /dev/null "127.0.0.1:${PORT[$id]}/metrics" & jobs+=($!)
    done
    n=$((n + 1))
    kubectl -n "$NS" patch configmap app --type merge -p "{\"data\":{\"n\":\"$n\"}}" >/dev/null & jobs+=($!)
    wait "${jobs[@]}" || true
    sleep 1
  done
}
declare -A SETUP
report() { # TITLE
  local id holding
  echo
  echo "$1 ($(git rev-parse --short HEAD), $(basename "$BIN"); limit $LIMIT MiB):"
  echo "| replica | serves $NS | peak RSS before the load (setup; then since the first load, the takeover included) | peak RSS under load | RSS after | peak under load, of the limit |"
  echo "|---|---|---|---|---|---|"
  for id in $(printf '%s\n' "${!PID[@]}" | sort); do
    holding=no
    [ "$id" = "$2" ] && holding=yes
    local peak; peak=$(hwm_mib "${PID[$id]}")
    echo "| $id | $holding | ${SETUP[$id]} MiB | $peak MiB | $(rss_mib "${PID[$id]}") MiB | $((100 * peak / LIMIT)) % |"
  done
}
round() { # TITLE
  local id served
  served=$(holder)
  for id in "${!PID[@]}"; do SETUP[$id]=$(hwm_mib "${PID[$id]}"); reset_hwm "${PID[$id]}"; done
  load
  report "$1" "$served"
}
round "Under load, $APPS Apps, an HTTPRoute of $route_bytes bytes named by $ROUTED canaries"

if [ "${FLOTILLA_BENCH_FAILOVER:-1}" = 1 ] && [ "$REPLICAS" -gt 1 ]; then
  gone=$(holder)
  kill -9 "${PID[$gone]}"
  unset "PID[$gone]"
  echo
  echo ">> killed $gone (kill -9); waiting for a peer to serve $NS"
  until next=$(holder) && curl -fs "127.0.0.1:${PORT[$next]}/readyz" >/dev/null 2>&1; do sleep 1; done
  # Its caches listed: the namespace's Apps reconciled by the new holder.
  sleep 15
  round "After the kill -9 of $gone, the same load on its peers"
fi
