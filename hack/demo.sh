#!/usr/bin/env bash
# The main job: a local control plane, a real Prometheus scraping a demo traffic exporter,
# the operator as several replicas running under its own ServiceAccount (real RBAC), two
# tenants with Apps, and three rollouts you can watch: a good canary that is promoted, a bad
# one that is rolled back, and a blue-green release.
#
#   bash hack/demo.sh        start everything (idempotent), then run the three rollouts
#   bash hack/demo.sh down   stop the operator, Prometheus, the exporter and the cluster
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
. "$here/versions.sh"
cd "$root"
CLUSTER=flotilla
DEMO=$FLOTILLA_CACHE/demo
REPLICAS=${FLOTILLA_REPLICAS:-3}
export KWOK_WORKDIR=${KWOK_WORKDIR:-$FLOTILLA_CACHE/kwok}

PROM_PORT=${FLOTILLA_DEMO_PROMETHEUS_PORT:-9490}
WEBHOOK_PORT=${FLOTILLA_DEMO_WEBHOOK_PORT:-9443}
EXPORTER_PORT=${FLOTILLA_DEMO_EXPORTER_PORT:-9470}
DASHBOARD_PORT=${FLOTILLA_DEMO_DASHBOARD_PORT:-3100}

stop_operators() {
  for pidfile in "$DEMO"/operator-*.pid "$DEMO"/prometheus.pid "$DEMO"/exporter.pid "$DEMO"/dashboard.pid; do
    [ -f "$pidfile" ] || continue
    kill "$(cat "$pidfile")" 2>/dev/null || true
    rm -f "$pidfile"
  done
}

if [ "${1:-up}" = down ]; then
  stop_operators
  bash "$here/cluster.sh" down "$CLUSTER"
  exit 0
fi

t0=$(date +%s)
bash "$here/prerequisites.sh"
bash "$here/cluster.sh" up "$CLUSTER"
KUBECONFIG=$(bash "$here/cluster.sh" kubeconfig "$CLUSTER"); export KUBECONFIG
mkdir -p "$DEMO"

echo ">> building the operator (release)"
cargo build --locked --release --bin flotilla
BIN=$CARGO_TARGET_DIR/release/flotilla

echo ">> installing CRDs, RBAC and the operator's ServiceAccount"
# The operator runs as system:serviceaccount:flotilla-system:flotilla, not as admin.
bash "$here/install-local.sh" "$CLUSTER" "$DEMO/operator.kubeconfig"

stop_operators

echo ">> demo traffic exporter on 127.0.0.1:$EXPORTER_PORT and Prometheus on 127.0.0.1:$PROM_PORT"
traffic() { # traffic APP VERSION ERROR_RATIO: what demo/APP at VERSION serves from now on
  python3 - "$DEMO/traffic.json" "$1" "$2" "$3" <<'PY'
import json, sys
path, app, version, errors = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
try:
    profiles = json.load(open(path))
except (OSError, ValueError):
    profiles = {}
profiles[f"demo/{app}/{version}"] = {"error_ratio": errors, "latency_seconds": 0.08}
json.dump(profiles, open(path + ".tmp", "w"))
PY
  mv "$DEMO/traffic.json.tmp" "$DEMO/traffic.json"
}
rm -f "$DEMO/traffic.json"
traffic checkout 1.4.1 0.002
traffic checkout 1.4.2 0.004   # the good release
traffic checkout 1.5.0 0.30    # the bad release: 30% of its answers are errors
traffic payments 1.0.0 0.001
traffic payments 1.1.0 0.002   # a good blue-green release
nohup python3 "$here/demo-exporter.py" --port "$EXPORTER_PORT" --traffic "$DEMO/traffic.json" \
  >"$DEMO/exporter.log" 2>&1 &
echo $! >"$DEMO/exporter.pid"
targets=""
for i in $(seq 0 $((REPLICAS - 1))); do targets="$targets'127.0.0.1:$((9460 + i))', "; done
cat >"$DEMO/prometheus.yml" <<PROM
global: {scrape_interval: 2s, evaluation_interval: 2s}
rule_files: [$root/deploy/prometheus/alerts.yaml]
scrape_configs:
  - job_name: demo-apps
    static_configs: [{targets: ['127.0.0.1:$EXPORTER_PORT']}]
  - job_name: flotilla
    static_configs: [{targets: [${targets%, }]}]
PROM
nohup prometheus --config.file="$DEMO/prometheus.yml" --storage.tsdb.path="$DEMO/prometheus-data" \
  --web.listen-address="127.0.0.1:$PROM_PORT" >"$DEMO/prometheus.log" 2>&1 &
echo $! >"$DEMO/prometheus.pid"
for _ in $(seq 1 60); do
  curl -fs "127.0.0.1:$PROM_PORT/-/ready" >/dev/null 2>&1 && break
  sleep 0.5
done
curl -fs "127.0.0.1:$PROM_PORT/-/ready" >/dev/null || { echo "error: Prometheus did not start; see $DEMO/prometheus.log" >&2; exit 1; }

for i in $(seq 0 $((REPLICAS - 1))); do
  # Each replica's token is bound to a Pod named like it, as in a cluster, so that the
  # apiserver refuses its writes into namespaces whose shard it does not hold.
  bash "$here/operator-kubeconfig.sh" "$CLUSTER" "$DEMO/operator-$i.kubeconfig" "flotilla-$i"
  # Every replica serves the CRDs' conversion webhook on the same port (SO_REUSEPORT).
  nohup "$BIN" run --kubeconfig "$DEMO/operator-$i.kubeconfig" --admin-addr "127.0.0.1:$((9460 + i))" \
    --webhook-addr "127.0.0.1:$WEBHOOK_PORT" --webhook-url "https://127.0.0.1:$WEBHOOK_PORT/convert" \
    --replica-id "flotilla-$i" --prometheus-url "http://127.0.0.1:$PROM_PORT" >"$DEMO/operator-$i.log" 2>&1 &
  echo $! >"$DEMO/operator-$i.pid"
done
for i in $(seq 0 $((REPLICAS - 1))); do
  for _ in $(seq 1 120); do
    curl -fs "127.0.0.1:$((9460 + i))/readyz" >/dev/null 2>&1 && break
    sleep 0.5
  done
  echo ">> operator replica flotilla-$i ready: metrics on http://127.0.0.1:$((9460 + i))/metrics, log $DEMO/operator-$i.log"
done

# The web dashboard, with the admin's kubeconfig: open it now to watch the rollouts below.
# Its log holds the session key: readable by this user only.
rm -f "$DEMO/dashboard.log"
old_umask=$(umask)
umask 077
nohup "$BIN" dashboard --kubeconfig "$KUBECONFIG" --port "$DASHBOARD_PORT" >"$DEMO/dashboard.log" 2>&1 &
echo $! >"$DEMO/dashboard.pid"
umask "$old_umask"
# The URL it prints carries the key of its session (other users of the machine lack it).
DASHBOARD_URL=
for _ in $(seq 1 60); do
  DASHBOARD_URL=$(sed -n 's/^Flotilla dashboard: \(http[^ ]*\).*/\1/p' "$DEMO/dashboard.log" | head -1)
  [ -n "$DASHBOARD_URL" ] && break
  sleep 0.5
done
echo ">> dashboard: ${DASHBOARD_URL:-(not started; see $DEMO/dashboard.log)}"
echo "   open it to watch the rollouts below"

echo ">> two tenants: shop (namespace demo) and blog (namespace blog)"
kubectl apply -f deploy/samples/tenant.yaml
kubectl wait --for=condition=Ready tenant/shop tenant/blog --timeout=120s >/dev/null
kubectl get tenants
echo ">> their Apps"
kubectl apply -f deploy/samples/app.yaml
for app in demo/checkout demo/payments demo/search blog/web; do
  kubectl -n "${app%/*}" wait --for=jsonpath='{.status.phase}'=Healthy "app/${app#*/}" --timeout=120s >/dev/null
done
kubectl get apps -A

CANARY_LINE='{.status.phase} {.status.currentVersion}->{.status.targetVersion} step={.status.canary.step} weight={.status.canary.weight}% canary={.status.canary.replicas} stable={.status.canary.stableReplicas} analysis={.status.analysis.lastResult} | {.status.conditions[?(@.type=="Progressing")].message}'
BLUE_GREEN_LINE='{.status.phase} {.status.currentVersion}->{.status.targetVersion} stage={.status.blueGreen.stage} analysis={.status.analysis.lastResult} | {.status.conditions[?(@.type=="Progressing")].message}'

# Prints a line each time the rollout of demo/$1 changes (fields: jsonpath $3), until the
# line starts with the pattern $2 ("<phase> <current>-><target>", where a version with a pod
# template reads 1.4.2+<fingerprint>: the phase alone would match the state before the
# operator saw the new version).
follow() {
  local app=$1 want=$2 fields=$3 last="" line
  for _ in $(seq 1 600); do
    line=$(kubectl -n demo get app "$app" -o jsonpath="$fields")
    if [ "$line" != "$last" ]; then
      echo "   $(date +%T) $line"
      last=$line
    fi
    # shellcheck disable=SC2254 # $want is a pattern
    case "$line" in $want" "*) return 0 ;; esac
    sleep 1
  done
  echo "error: $app did not reach $want; see $DEMO/operator-*.log" >&2
  return 1
}

echo
echo ">> a good release: checkout 1.4.1 -> 1.4.2 by canary (25%, then 50%), gated by error rate and p99 latency"
kubectl -n demo patch app checkout --type=merge -p '{"spec":{"version":"1.4.2"}}' >/dev/null
follow checkout "Healthy 1.4.2*->1.4.2*" "$CANARY_LINE"
echo
echo ">> a bad release: checkout 1.4.2 -> 1.5.0, whose canary answers 30% errors"
kubectl -n demo patch app checkout --type=merge -p '{"spec":{"version":"1.5.0"}}' >/dev/null
follow checkout "RolledBack 1.4.2*->1.4.2*" "$CANARY_LINE"
echo
echo ">> a blue-green release: payments 1.0.0 -> 1.1.0, previewed at full size behind payments-preview,"
echo "   then the Service switches in one write; 1.0.0 stays 15s in case it must switch back"
kubectl -n demo patch app payments --type=merge -p '{"spec":{"version":"1.1.0"}}' >/dev/null
follow payments "Healthy 1.1.0*->1.1.0*" "$BLUE_GREEN_LINE"
echo
"$BIN" status checkout -n demo --kubeconfig "$KUBECONFIG"
echo
echo ">> shards (flotilla shards)"
"$BIN" shards --kubeconfig "$KUBECONFIG" | awk 'NR==1 || /shards per holder/ || $5 > 0'
echo
echo ">> ready in $(( $(date +%s) - t0 ))s. Where to look:"
echo "   Dashboard: $DASHBOARD_URL   (Apps, canary steps, checks, shards; live)"
echo "   export KUBECONFIG=$KUBECONFIG"
echo "   kubectl get apps -A -w                                       # phase, weight, versions"
echo "   $BIN status checkout -n demo --watch    # steps, replicas, measurements"
echo "   $BIN shards                             # who holds which shard"
echo "   Prometheus: http://127.0.0.1:$PROM_PORT   (try: flotilla_rollouts_total, http_requests_total)"
echo "   kubectl -n demo get events --field-selector regarding.name=checkout"
echo "Try:"
echo "   kubectl -n demo patch app checkout --type=merge -p '{\"spec\":{\"version\":\"1.4.3\"}}'   # unknown to the exporter: no data, the rollout pauses"
echo "   $BIN promote checkout -n demo --full    # or: abort, retry, pause, resume"
echo "   $BIN undo payments -n demo              # back to 1.0.0, through the blue-green preview again"
echo "   kill -9 \$(cat $DEMO/operator-0.pid)   # its shards move to the other replicas within seconds"
echo "   kubectl -n demo get apps.v1alpha1.flotilla.dev checkout -o yaml   # the old API version, converted by the replicas (deprecated)"
echo "   bash hack/demo.sh down"
