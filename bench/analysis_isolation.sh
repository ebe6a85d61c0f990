#!/usr/bin/env bash
# Measures how much one tenant's hanging Prometheus delays another tenant's drift correction,
# on a private local control plane with one operator replica (its real ServiceAccount token).
# Prints the figures (never asserted by tests: these machines are noisy).
#
#   bash bench/analysis_isolation.sh [APPS] [ROUNDS]     default 200 Apps, 20 rounds
#   FLOTILLA_BENCH_BIN=path/to/flotilla bash bench/analysis_isolation.sh   (default: a release build)
#
# - tenant "greedy": APPS Apps, 10 to a namespace, each in a canary rollout whose analysis
#   (every 1s) asks a server that accepts connections and never answers (each query waits
#   for the 10 s timeout). The server is listed as Shared, the strongest case: a shared
#   endpoint never rests. The Apps are spread over namespaces because each namespace has
#   only a few reconciles at a time (`--reconciles-per-namespace`): in one namespace, the
#   hanging runs would keep most of greedy's Apps from starting at all;
# - tenant "quiet": one App; its Deployment is scaled by hand ROUNDS times, and the time until
#   the operator has put spec.replicas back is taken each time (polled every 50 ms);
# - the same drift rounds before the greedy rollouts start, as the baseline.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/hack/versions.sh"
cd "$here"
APPS=${1:-200}
ROUNDS=${2:-20}
CLUSTER=flotilla-bench-analysis
WORK=$(mktemp -d)
. bench/one_replica.sh
one_replica_cluster
one_replica_background

HANG_PORT=$(one_replica_free_port)
one_replica_hanging_server "$HANG_PORT" >"$WORK/hang.log" 2>&1 &
PIDS+=($!)
HANG=http://127.0.0.1:$HANG_PORT

one_replica_run 9590

GREEDY_NS=$(( (APPS + 9) / 10 ))
greedy_namespaces=$(seq -f "bench-greedy-%03g" 0 $((GREEDY_NS - 1)) | paste -sd, -)
kubectl apply -f - >/dev/null <<YAML
apiVersion: flotilla.dev/v1beta1
kind: Tenant
metadata: {name: greedy}
spec:
  namespaces: [$greedy_namespaces]
  prometheusEndpoints: [{url: "$HANG", isolation: Shared}]
---
apiVersion: flotilla.dev/v1beta1
kind: Tenant
metadata: {name: quiet}
spec: {namespaces: [bench-quiet]}
YAML
kubectl wait --for=condition=Ready tenant/greedy tenant/quiet --timeout=120s >/dev/null
kubectl -n bench-quiet apply -f - >/dev/null <<YAML
apiVersion: flotilla.dev/v1beta1
kind: App
metadata: {name: web}
spec: {image: registry.example.com/bench/web, version: "v1", replicas: 1}
YAML
app() { # app NUMBER VERSION
  cat <<YAML
---
apiVersion: flotilla.dev/v1beta1
kind: App
metadata: {name: a$1, namespace: $(printf 'bench-greedy-%03d' $(( ($1 - 1) / 10 )))}
spec:
  image: registry.example.com/bench/a$1
  version: "$2"
  replicas: 2
  rollout:
    strategy: {type: Canary, canary: {steps: [{weight: 50, pause: 1h}]}}
    analysis:
      interval: 1s
      prometheusUrl: "$HANG"
      metrics: [{name: q, query: 'sum(rate(http_requests_total[1m]))', max: 1}]
YAML
}
for i in $(seq 1 "$APPS"); do app "$i" v1; done | kubectl apply -f - >/dev/null
# Greedy's Apps: NAMESPACE FIELD lines.
greedy() { kubectl get apps -A -o jsonpath="{range .items[*]}{.metadata.namespace} $1{\"\\n\"}{end}" | awk '$1 ~ /^bench-greedy-/ {print $2}'; }
healthy() { [ "$(kubectl -n "$1" get apps -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}' | grep -c '^Healthy$')" = "$2" ]; }
until [ "$(greedy '{.status.phase}' | grep -c '^Healthy$')" = "$APPS" ] && healthy bench-quiet 1; do sleep 1; done

now() { date +%s.%N; }
drift_rounds() { # prints one time per round, in seconds
  for r in $(seq 1 "$ROUNDS"); do
    kubectl -n bench-quiet scale deployment web --replicas=3 >/dev/null
    local t0; t0=$(now)
    until [ "$(kubectl -n bench-quiet get deployment web -o jsonpath='{.spec.replicas}')" = 1 ]; do sleep 0.05; done
    awk "BEGIN{printf \"%.2f\n\", $(now) - $t0}"
    sleep 0.5
  done
}
summary() { sort -n | awk '{a[NR]=$1} END{printf "p50 %.2f s, p90 %.2f s, max %.2f s over %d rounds\n", a[int((NR+1)/2)], a[int(NR*0.9+0.5)], a[NR], NR}'; }

echo ">> baseline: drift of tenant quiet corrected, nothing else going on"
drift_rounds | tee "$WORK/baseline.txt" | summary

echo ">> $APPS Apps of tenant greedy start analysing against a server that never answers"
for i in $(seq 1 "$APPS"); do app "$i" v2; done | kubectl apply -f - >/dev/null
# Every greedy App asks at least once before the rounds start.
started=$(now)
until [ "$(greedy '{.status.canary.step}' | grep -c .)" -ge "$APPS" ]; do sleep 1; done
echo "   every greedy App had taken its first step after $(awk "BEGIN{printf \"%.0f\", $(now) - $started}")s"
sleep 12
waiting=$(curl -fs 127.0.0.1:9590/metrics | awk '/^flotilla_analysis_measurements_total/ {s+=$2} END{print s+0}')
echo "   measurements taken so far: $waiting; connections held by the hanging server: $(ss -Htn state established "( sport = :$HANG_PORT )" | wc -l)"
echo ">> drift of tenant quiet corrected while greedy's analysis hangs"
drift_rounds | tee "$WORK/loaded.txt" | summary
echo "   greedy Apps by phase: $(greedy '{.status.phase}' | sort | uniq -c | xargs)"
