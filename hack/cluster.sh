#!/usr/bin/env bash
# A local Kubernetes control plane built from upstream sources (etcd, kube-apiserver with
# RBAC, kube-controller-manager, kube-scheduler) with kwok's fake nodes, on 127.0.0.1.
#
#   hack/cluster.sh up   [NAME] [extra kwokctl flags...]   start (or reuse) cluster NAME
#   hack/cluster.sh down [NAME]                            stop its processes, remove its files
#   hack/cluster.sh env  [NAME]                            print `export KUBECONFIG=...`
#   hack/cluster.sh kubeconfig [NAME]                      print the kubeconfig path
#   hack/cluster.sh stop|start [NAME]                      stop / restart its processes, keeping its data
#   hack/cluster.sh audit-log [NAME]                       print the audit log path
#
# NAME defaults to "flotilla". Binaries are built once and cached (hack/build-control-plane.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/versions.sh"

cmd=${1:-up}; shift || true
name=flotilla
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then name=$1; shift; fi
NODES=${FLOTILLA_NODES:-3}
export KWOK_WORKDIR=${KWOK_WORKDIR:-$FLOTILLA_CACHE/kwok}
kubeconfig=$KWOK_WORKDIR/clusters/$name/kubeconfig.yaml

healthy() {
  [ -f "$kubeconfig" ] && kubectl --kubeconfig "$kubeconfig" get --raw /readyz >/dev/null 2>&1
}

nodes_yaml() {
  for i in $(seq 0 $((NODES - 1))); do
    cat <<NODE
---
apiVersion: v1
kind: Node
metadata:
  name: kwok-node-$i
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    type: kwok
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    kubernetes.io/hostname: kwok-node-$i
    topology.kubernetes.io/zone: zone-$((i % 3))
status:
  allocatable: {cpu: "64", memory: 256Gi, pods: "1000"}
  capacity: {cpu: "64", memory: 256Gi, pods: "1000"}
NODE
  done
}

# Audit only what the operator's ServiceAccounts do: tests read it to prove who wrote what.
audit_policy() {
  cat >"$KWOK_WORKDIR/audit-policy.yaml" <<'POLICY'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  # Lease bodies tell an acquire, a renewal and a release apart (tests/support/audit.rs).
  - level: Request
    userGroups: ["system:serviceaccounts:flotilla-system"]
    resources: [{group: coordination.k8s.io, resources: [leases]}]
  - level: Metadata
    userGroups: ["system:serviceaccounts:flotilla-system"]
  # Argo Rollouts' writes, counted by bench/scale.sh --with-argo like the operator's.
  - level: Metadata
    userGroups: ["system:serviceaccounts:argo-rollouts"]
  - level: None
POLICY
  echo "$KWOK_WORKDIR/audit-policy.yaml"
}

up() {
  local start; start=$(date +%s.%N)
  bash "$here/build-control-plane.sh"
  mkdir -p "$KWOK_WORKDIR"
  exec 8>"$KWOK_WORKDIR/.lock-$name"
  flock 8
  if healthy; then
    echo ">> cluster '$name' already running"
  else
    kwokctl delete cluster --name "$name" >/dev/null 2>&1 || true
    echo ">> starting cluster '$name'"
    kwokctl create cluster --name "$name" --runtime binary \
      --etcd-binary "$ETCD_BIN/etcd" \
      --kube-apiserver-binary "$K8S_BIN/kube-apiserver" \
      --kube-controller-manager-binary "$K8S_BIN/kube-controller-manager" \
      --kube-scheduler-binary "$K8S_BIN/kube-scheduler" \
      --kwok-controller-binary "$KWOK_BIN/kwok" \
      --extra-args kube-apiserver=advertise-address=127.0.0.1 \
      --extra-args kube-apiserver=service-cluster-ip-range=10.96.0.0/16 \
      --kube-authorization=true \
      --kube-audit-policy "$(audit_policy)" \
      --wait 3m "$@" >"$KWOK_WORKDIR/create-$name.log" 2>&1 8>&- || {
        cat "$KWOK_WORKDIR/create-$name.log" >&2
        echo "error: kwokctl could not start cluster '$name'; logs: $KWOK_WORKDIR/clusters/$name/logs/" >&2
        exit 1
      }
  fi
  nodes_yaml | kubectl --kubeconfig "$kubeconfig" apply -f - >/dev/null
  kubectl --kubeconfig "$kubeconfig" wait --for=condition=Ready node --all --timeout=120s >/dev/null
  for _ in $(seq 1 120); do
    kubectl --kubeconfig "$kubeconfig" -n default get serviceaccount default >/dev/null 2>&1 && break
    sleep 0.5
  done
  kubectl --kubeconfig "$kubeconfig" get --raw /readyz >/dev/null
  local took; took=$(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $start}")
  echo ">> cluster '$name' ready in ${took}s with $NODES fake nodes (RBAC on)"
  echo ">> kubeconfig: $kubeconfig"
  echo "   export KUBECONFIG=$kubeconfig"
}

down() {
  kwokctl delete cluster --name "$name" 2>/dev/null || true
  rm -rf "$KWOK_WORKDIR/clusters/$name" "$KWOK_WORKDIR/.lock-$name"
  echo ">> cluster '$name' removed"
}

case "$cmd" in
  up) up "$@" ;;
  down) down ;;
  env) echo "export KUBECONFIG=$kubeconfig" ;;
  audit-log) echo "$KWOK_WORKDIR/clusters/$name/logs/audit.log" ;;
  # Stop every process of the cluster (etcd included) but keep its data, and start it again:
  # for tests of what replicas do while the apiserver is away.
  stop) kwokctl stop cluster --name "$name" >"$KWOK_WORKDIR/stop-$name.log" 2>&1 </dev/null ;;
  start)
    kwokctl start cluster --name "$name" >"$KWOK_WORKDIR/start-$name.log" 2>&1 </dev/null 8>&-
    # A bounded wait: a component that cannot start (its port taken meanwhile) fails the
    # caller with the log's path instead of holding it for good.
    for _ in $(seq 1 300); do healthy && exit 0; sleep 0.2; done
    echo "error: cluster '$name' not healthy 60 s after its start; see $KWOK_WORKDIR/start-$name.log and $KWOK_WORKDIR/clusters/$name/logs" >&2
    exit 1
    ;;
  kubeconfig) echo "$kubeconfig" ;;
  *) echo "usage: $0 up|down|env|kubeconfig|stop|start|audit-log [NAME] [kwokctl flags]" >&2; exit 2 ;;
esac
