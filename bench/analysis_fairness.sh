#!/usr/bin/env bash
# Measures whether tenants whose Prometheus hangs keep another tenant's analysis from running,
# on a private local control plane with one operator replica (its real ServiceAccount token).
# Prints the figures (never asserted by tests: these machines are noisy).
#
#   bash bench/analysis_fairness.sh [TENANTS] [APPS] [SECONDS]   default 40 tenants, 3 Apps each, 60 s
#   FLOTILLA_BENCH_BIN=path/to/flotilla bash bench/analysis_fairness.sh  (default: a release build)
#
# - TENANTS tenants "hang-N": APPS Apps each, in canary rollouts whose analysis (every 1 s)
#   asks a server that accepts connections and never answers (each query waits for the 10 s
#   timeout). Each has one namespace, so at most 3 runs in flight (--reconciles-per-namespace);
#   together they want more than every analysis turn of the replica (40 x 3 > 32), and more
#   tenants than it has turns;
# - tenant "quiet": one App in a canary rollout whose analysis (every 1 s) asks a server that
#   answers at once with a passing value;
# - for SECONDS, quiet's last analysis run is read every 0.5 s: how many runs there were, and
#   how many were inconclusive because no turn was free within 20 s.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/hack/versions.sh"
cd "$here"
TENANTS=${1:-40}
APPS=${2:-3}
SECONDS_SAMPLED=${3:-60}
CLUSTER=flotilla-bench-fairness
WORK=$(mktemp -d)
. bench/one_replica.sh
one_replica_cluster
one_replica_background

# A server that accepts every connection and never answers.
HANG_PORT=$(one_replica_free_port)
one_replica_hanging_server "$HANG_PORT" >"$WORK/hang.log" 2>&1 &
PIDS+=($!)
# A Prometheus that answers every query at once with 0.01, and counts them.
FAST_PORT=$(one_replica_free_port)
python3 - "$FAST_PORT" "$WORK/fast.count" >"$WORK/fast.log" 2>&1 <<'PY' &
import http.server, sys
count = 0
body = b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1700000000,"0.01"]}]}}'
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        global count
        count += 1
        open(sys.argv[2], "w").write(str(count))
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    do_POST = do_GET
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
PY
PIDS+=($!)
HANG=http://127.0.0.1:$HANG_PORT
FAST=http://127.0.0.1:$FAST_PORT

one_replica_run 9591

{
  for t in $(seq 1 "$TENANTS"); do
    printf -- '---\napiVersion: flotilla.dev/v1beta1\nkind: Tenant\nmetadata: {name: hang-%d}\nspec:\n  namespaces: [bench-hang-%d]\n  prometheusEndpoints: [{url: "%s", isolation: Dedicated}]\n' "$t" "$t" "$HANG"
  done
  printf -- '---\napiVersion: flotilla.dev/v1beta1\nkind: Tenant\nmetadata: {name: quiet}\nspec:\n  namespaces: [bench-quiet]\n  prometheusEndpoints: [{url: "%s", isolation: Dedicated}]\n' "$FAST"
} | kubectl apply -f - >/dev/null
kubectl wait --for=condition=Ready tenants --all --timeout=180s >/dev/null

app() { # app NAMESPACE NAME VERSION URL
  cat <<YAML
---
apiVersion: flotilla.dev/v1beta1
kind: App
metadata: {name: $2, namespace: $1}
spec:
  image: registry.example.com/bench/$2
  version: "$3"
  replicas: 1
  rollout:
    strategy: {type: Canary, canary: {steps: [{weight: 50, pause: 1h}]}}
    analysis:
      interval: 1s
      prometheusUrl: "$4"
      metrics: [{name: q, query: 'sum(rate(http_requests_total[1m]))', max: 1}]
YAML
}
all_hanging() { for t in $(seq 1 "$TENANTS"); do for i in $(seq 1 "$APPS"); do app "bench-hang-$t" "a$i" "$1" "$HANG"; done; done; }
all_hanging v1 | kubectl apply -f - >/dev/null
app bench-quiet web v1 "$FAST" | kubectl apply -f - >/dev/null
healthy() { [ "$(kubectl get apps -A -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}' | grep -c '^Healthy$')" = "$1" ]; }
until healthy $((TENANTS * APPS + 1)); do sleep 1; done

now() { date +%s.%N; }
sample() { # SECONDS: quiet's distinct runs (by lastRun) and their results
  local until_t before; until_t=$(awk "BEGIN{printf \"%.3f\", $(now) + $1}"); before=$(cat "$WORK/fast.count" 2>/dev/null || echo 0)
  while awk "BEGIN{exit !($(now) < $until_t)}"; do
    kubectl -n bench-quiet get app web -o jsonpath='{.status.analysis.lastRun} {.status.analysis.lastResult} {.status.analysis.measurements[0].message}{"\n"}' 2>/dev/null || true
    sleep 0.5
  done | awk 'NF && !seen[$1]++' >"$WORK/runs"
  local runs inconclusive noturn
  runs=$(wc -l <"$WORK/runs")
  inconclusive=$(grep -c ' Inconclusive' "$WORK/runs" || true)
  noturn=$(grep -c 'no analysis run could start' "$WORK/runs" || true)
  echo "   quiet: $runs runs seen (one per second of lastRun at most), $inconclusive inconclusive, $noturn of them for want of a turn; $(( $(cat "$WORK/fast.count" 2>/dev/null || echo 0) - before )) queries answered"
}

echo ">> baseline: tenant quiet's analysis with nothing else going on, ${SECONDS_SAMPLED}s"
app bench-quiet web v2 "$FAST" | kubectl apply -f - >/dev/null
until [ -n "$(kubectl -n bench-quiet get app web -o jsonpath='{.status.analysis.lastRun}')" ]; do sleep 0.5; done
sample "$SECONDS_SAMPLED"

echo ">> $TENANTS tenants' $((TENANTS * APPS)) Apps start analysing against a server that never answers"
all_hanging v2 | kubectl apply -f - >/dev/null
sleep 25
echo "   connections held by the hanging server: $(ss -Htn state established "( sport = :$HANG_PORT )" | wc -l)"
echo ">> tenant quiet's analysis meanwhile, ${SECONDS_SAMPLED}s"
sample "$SECONDS_SAMPLED"
echo "   connections held by the hanging server: $(ss -Htn state established "( sport = :$HANG_PORT )" | wc -l)"
curl -fs 127.0.0.1:9591/metrics | awk '/^flotilla_analysis_measurements_total/ {print "   " $0}'
