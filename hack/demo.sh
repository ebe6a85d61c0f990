#!/usr/bin/env bash
# The main job: a local control plane, the operator running under its own ServiceAccount
# (real RBAC), and sample Apps whose rollout you can watch.
#
#   bash hack/demo.sh        start everything (idempotent), then roll out a new version
#   bash hack/demo.sh down   stop the operator and the cluster
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
. "$here/versions.sh"
cd "$root"
CLUSTER=flotilla
DEMO=$FLOTILLA_CACHE/demo
REPLICAS=${FLOTILLA_REPLICAS:-3}
export KWOK_WORKDIR=${KWOK_WORKDIR:-$FLOTILLA_CACHE/kwok}

stop_operators() {
  for pidfile in "$DEMO"/operator-*.pid; do
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
kubectl apply --server-side -f crds/flotilla.dev.yaml >/dev/null
kubectl wait --for=condition=Established crd/apps.flotilla.dev --timeout=60s >/dev/null
kubectl apply -f deploy/base/namespace.yaml >/dev/null
kubectl apply -k rbac >/dev/null

# The operator runs as system:serviceaccount:flotilla-system:flotilla, not as admin.
bash "$here/operator-kubeconfig.sh" "$CLUSTER" "$DEMO/operator.kubeconfig"

stop_operators
for i in $(seq 0 $((REPLICAS - 1))); do
  nohup "$BIN" run --kubeconfig "$DEMO/operator.kubeconfig" --admin-addr "127.0.0.1:$((9460 + i))" \
    --replica-id "flotilla-$i" >"$DEMO/operator-$i.log" 2>&1 &
  echo $! >"$DEMO/operator-$i.pid"
done
for i in $(seq 0 $((REPLICAS - 1))); do
  for _ in $(seq 1 120); do
    curl -fs "127.0.0.1:$((9460 + i))/readyz" >/dev/null 2>&1 && break
    sleep 0.5
  done
  echo ">> operator replica flotilla-$i ready: metrics on http://127.0.0.1:$((9460 + i))/metrics, log $DEMO/operator-$i.log"
done

echo ">> sample Tenant (onboards namespace demo) and Apps"
kubectl apply -f deploy/samples/tenant.yaml
kubectl wait --for=condition=Ready tenant/shop --timeout=120s >/dev/null
kubectl get tenants
kubectl apply -f deploy/samples/app.yaml
kubectl -n demo wait --for=jsonpath='{.status.phase}'=Healthy app/checkout --timeout=120s >/dev/null
kubectl -n demo get apps
echo ">> rolling checkout out to 1.4.2"
kubectl -n demo patch app checkout --type=merge -p '{"spec":{"version":"1.4.2"}}' >/dev/null
kubectl -n demo wait --for=jsonpath='{.status.currentVersion}'=1.4.2 app/checkout --timeout=120s >/dev/null
kubectl -n demo get apps,deployments
echo
echo ">> shards (flotilla shards)"
"$BIN" shards --kubeconfig "$KUBECONFIG" | awk 'NR==1 || /shards per holder/ || $5 > 0'
echo
echo ">> ready in $(( $(date +%s) - t0 ))s. Try:"
echo "   export KUBECONFIG=$KUBECONFIG"
echo "   kubectl -n demo get apps -w"
echo "   kubectl -n demo patch app checkout --type=merge -p '{\"spec\":{\"version\":\"1.5.0\"}}'"
echo "   kubectl -n demo scale deployment checkout --replicas=7   # drift: put back within seconds"
echo "   kubectl -n demo get events --field-selector involvedObject.name=checkout"
echo "   $BIN shards --kubeconfig \$KUBECONFIG                 # who holds which shard"
echo "   kill -9 \$(cat $DEMO/operator-0.pid)   # its shards move to the other replicas within seconds"
echo "   bash hack/demo.sh down"
