#!/usr/bin/env bash
# Writes a kubeconfig that authenticates as the operator's ServiceAccount
# (flotilla-system/flotilla) with a TokenRequest token, for running replicas outside the
# cluster under exactly the roles of rbac/. Expects KUBECONFIG to be the admin's.
#
#   hack/operator-kubeconfig.sh CLUSTER OUT
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/versions.sh"
cluster=$1 out=$2
export KWOK_WORKDIR=${KWOK_WORKDIR:-$FLOTILLA_CACHE/kwok}
server=$(kubectl config view -o jsonpath='{.clusters[0].cluster.server}')
token=$(kubectl -n flotilla-system create token flotilla --duration=24h)
cat >"$out" <<KC
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "$server", certificate-authority: "$KWOK_WORKDIR/clusters/$cluster/pki/ca.crt"}}]
users: [{name: flotilla, user: {token: "$token"}}]
contexts: [{name: flotilla, context: {cluster: local, user: flotilla}}]
current-context: flotilla
KC
