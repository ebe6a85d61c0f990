#!/usr/bin/env bash
# Measures what one tenant's analysis costs another tenant on a shared Prometheus: the
# query latency a quiet tenant sees while a greedy tenant runs the most expensive analysis
# the operator lets through, on a private local control plane with one replica (its real
# ServiceAccount token) and a real Prometheus (Debian's package) scraping the traffic
# exporter. Prints the figures (never asserted by tests: these machines are noisy).
#
#   bash bench/prometheus_load.sh [APPS] [SAMPLES]     default 40 Apps, 200 samples
#   FLOTILLA_BENCH_BIN=path/to/flotilla bash bench/prometheus_load.sh   (default: a release build)
#
# - tenant "greedy": APPS Apps in 4 namespaces, each in a canary held at its first step with
#   20 checks, every 1 s (the replica runs with --analysis-min-interval 1s, the lowest), each
#   check the costliest shape within the bounds: a 55-minute subquery at a 1 s step (3,300
#   steps) over a 5-minute rate;
# - tenant "quiet": SAMPLES instant queries of its own series, one after another, timed with
#   curl: first with nothing else going on, then during greedy's analysis, then while a client
#   sends greedy's checks straight to Prometheus as the operator used to (all 20 checks of 8
#   runs at once: 160 queries in flight, where the operator now sends at most 8 x 4 = 32).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/hack/versions.sh"
cd "$here"
APPS=${1:-40}
SAMPLES=${2:-200}
CLUSTER=flotilla-bench-prometheus
WORK=$(mktemp -d)
. bench/one_replica.sh
one_replica_cluster
one_replica_background

# The exporter: greedy's and quiet's traffic; Prometheus scraping it every 2 s.
EXPORTER_PORT=$(one_replica_free_port)
PROM_PORT=$(one_replica_free_port)
{
  printf '{'
  for n in 0 1 2 3; do for v in v1 v2; do printf '"bench-greedy-%d/a/%s": {"error_ratio": 0.01},' "$n" "$v"; done; done
  printf '"bench-quiet/web/v1": {"error_ratio": 0.01}}'
} >"$WORK/traffic.json"
python3 hack/demo-exporter.py --port "$EXPORTER_PORT" --traffic "$WORK/traffic.json" >"$WORK/exporter.log" 2>&1 &
PIDS+=($!)
cat >"$WORK/prometheus.yml" <<PROM
global: {scrape_interval: 2s, evaluation_interval: 2s}
scrape_configs:
  - job_name: apps
    static_configs: [{targets: ['127.0.0.1:$EXPORTER_PORT']}]
PROM
prometheus --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/prometheus-data" \
  --web.listen-address="127.0.0.1:$PROM_PORT" >"$WORK/prometheus.log" 2>&1 &
PIDS+=($!)
PROM=http://127.0.0.1:$PROM_PORT
until curl -fs "$PROM/-/ready" >/dev/null 2>&1; do sleep 0.5; done

"$BIN" run --kubeconfig "$WORK/op.kubeconfig" --admin-addr 127.0.0.1:9591 --webhook-addr 127.0.0.1:0 \
  --replica-id bench-0 --prometheus-url "$PROM" --analysis-min-interval 1s >"$WORK/operator.log" 2>&1 &
PIDS+=($!)
until curl -fs 127.0.0.1:9591/readyz >/dev/null 2>&1; do sleep 0.2; done

kubectl apply -f - >/dev/null <<YAML
apiVersion: flotilla.dev/v1beta1
kind: Tenant
metadata: {name: greedy}
spec: {namespaces: [bench-greedy-0, bench-greedy-1, bench-greedy-2, bench-greedy-3]}
---
apiVersion: flotilla.dev/v1beta1
kind: Tenant
metadata: {name: quiet}
spec: {namespaces: [bench-quiet]}
YAML
kubectl wait --for=condition=Ready tenant/greedy tenant/quiet --timeout=120s >/dev/null
CHECK='max_over_time(sum(rate(http_requests_total[5m]))[55m:1s])'
app() { # app NUMBER VERSION
  printf -- '---\napiVersion: flotilla.dev/v1beta1\nkind: App\nmetadata: {name: a%d, namespace: bench-greedy-%d}\n' "$1" $(( $1 % 4 ))
  printf 'spec:\n  image: registry.example.com/bench/a\n  version: "%s"\n  replicas: 2\n' "$2"
  printf '  rollout:\n    strategy: {type: Canary, canary: {steps: [{weight: 50, pause: 1h}]}}\n'
  printf '    analysis:\n      interval: 1s\n      metrics:\n'
  for c in $(seq 1 20); do printf "      - {name: c%d, query: '%s', max: 1e12}\n" "$c" "$CHECK"; done
}
for i in $(seq 1 "$APPS"); do app "$i" v1; done | kubectl apply -f - >/dev/null
until [ "$(kubectl get apps -A -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}' | grep -c '^Healthy$')" -ge "$APPS" ]; do sleep 1; done

quiet_latency() { # prints one time per sample, in seconds
  local q='sum(rate(http_requests_total{namespace="bench-quiet"}[1m]))'
  for _ in $(seq 1 "$SAMPLES"); do
    curl -s -o /dev/null -w '%{time_total}\n' --get --data-urlencode "query=$q" "$PROM/api/v1/query"
  done
}
summary() { sort -n | awk '{a[NR]=$1*1000} END{printf "p50 %.1f ms, p90 %.1f ms, p99 %.1f ms, max %.1f ms over %d queries\n", a[int((NR+1)/2)], a[int(NR*0.9+0.5)], a[int(NR*0.99+0.5)], a[NR], NR}'; }
queries_total() { curl -fs 127.0.0.1:9591/metrics | awk '/^flotilla_analysis_measurements_total/ {s+=$2} END{print s+0}'; }

echo ">> quiet's queries, nothing else going on"
quiet_latency | summary

echo ">> greedy's $APPS Apps analyse (20 checks each, every 1 s, through the operator)"
for i in $(seq 1 "$APPS"); do app "$i" v2; done | kubectl apply -f - >/dev/null
sleep 15
before=$(queries_total); t0=$(date +%s.%N)
quiet_latency | summary
after=$(queries_total); t1=$(date +%s.%N)
awk "BEGIN{printf \"   the operator measured %.1f checks a second meanwhile\n\", ($after - $before) / ($t1 - $t0)}"
kubectl delete apps -A --all --wait=false >/dev/null

echo ">> the same checks sent straight to Prometheus, 160 at a time (8 runs of 20 checks, as before the bound)"
(
  end=$(( $(date +%s) + 600 ))
  while [ "$(date +%s)" -lt "$end" ] && [ ! -e "$WORK/stop" ]; do
    for _ in $(seq 1 160); do
      curl -s -o /dev/null --get --data-urlencode "query=$CHECK" "$PROM/api/v1/query" &
    done
    wait
  done
) &
flood=$!
sleep 5
quiet_latency | summary
touch "$WORK/stop"; wait "$flood" 2>/dev/null || true
