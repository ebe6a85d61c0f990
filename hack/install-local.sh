#!/usr/bin/env bash
# Puts in a local cluster what an install would, for replicas that run outside it: the CRDs,
# the operator's namespace and ServiceAccount, the roles of rbac/ and the Lease FlowSchema;
# then writes a kubeconfig that authenticates as that ServiceAccount. Expects KUBECONFIG to
# be the admin's. With REPLICA, the token is bound to a placeholder Pod of that name (see
# operator-kubeconfig.sh); more replicas get theirs from operator-kubeconfig.sh.
#
#   hack/install-local.sh CLUSTER KUBECONFIG_OUT [REPLICA]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
. "$here/versions.sh"
cluster=$1 out=$2
kubectl apply --server-side -f "$root/crds/flotilla.dev.yaml" >/dev/null
# kubectl wait fails at once ("accessor error") on a CRD that has no status yet: try again.
for try in $(seq 20); do
  kubectl wait --for=condition=Established crd/apps.flotilla.dev crd/tenants.flotilla.dev --timeout=60s >/dev/null 2>&1 && break
  [ "$try" = 20 ] && { echo "error: the CRDs were not Established" >&2; exit 1; }
  sleep 0.5
done
kubectl apply -f "$root/deploy/base/namespace.yaml" >/dev/null
kubectl apply -k "$root/rbac" >/dev/null
# The shard fence of older installs: one binding over every Lease (one per shard now).
kubectl delete validatingadmissionpolicybinding flotilla-shard-fence --ignore-not-found >/dev/null
kubectl delete validatingadmissionpolicy flotilla-shard-fence --ignore-not-found >/dev/null
kubectl apply -f "$root/deploy/base/flowschema.yaml" >/dev/null
bash "$here/operator-kubeconfig.sh" "$cluster" "$out" "${3:-}"
