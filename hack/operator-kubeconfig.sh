#!/usr/bin/env bash
# Writes a kubeconfig that authenticates as the operator's ServiceAccount
# (flotilla-system/flotilla) with a TokenRequest token, for running replicas outside the
# cluster under exactly the roles of rbac/. Expects KUBECONFIG to be the admin's.
# With REPLICA, the token is bound to a Pod of that name, as an in-cluster replica's is, so
# that the apiserver's shard fence (rbac/shard-fence.yaml) knows the replica: the Pod is a
# placeholder held back by a scheduling gate, never run. Give the replica that id.
#
#   hack/operator-kubeconfig.sh CLUSTER OUT [REPLICA]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/versions.sh"
cluster=$1 out=$2 replica=${3:-}
export KWOK_WORKDIR=${KWOK_WORKDIR:-$FLOTILLA_CACHE/kwok}
server=$(kubectl config view -o jsonpath='{.clusters[0].cluster.server}')
ca=$(kubectl config view -o jsonpath='{.clusters[0].cluster.certificate-authority}')
ca=${ca:-$KWOK_WORKDIR/clusters/$cluster/pki/ca.crt}
bound=()
if [ -n "$replica" ]; then
  kubectl apply --server-side -f - >/dev/null <<POD
apiVersion: v1
kind: Pod
metadata: {name: $replica, namespace: flotilla-system, labels: {flotilla.dev/replica-placeholder: "true"}}
spec:
  serviceAccountName: flotilla
  automountServiceAccountToken: false
  schedulingGates: [{name: flotilla.dev/placeholder}]
  securityContext: {runAsNonRoot: true, runAsUser: 65532, seccompProfile: {type: RuntimeDefault}}
  containers:
    - name: replica
      image: flotilla.invalid/placeholder:never-pulled
      securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
POD
  bound=(--bound-object-kind=Pod "--bound-object-name=$replica")
fi
token=$(kubectl -n flotilla-system create token flotilla --duration=24h "${bound[@]}")
cat >"$out" <<KC
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "$server", certificate-authority: "$ca"}}]
users: [{name: flotilla, user: {token: "$token"}}]
contexts: [{name: flotilla, context: {cluster: local, user: flotilla}}]
current-context: flotilla
KC
