#!/usr/bin/env bash
# Prints the shard fence's bindings (rbac/shard-fence.yaml) for SHARDS shards: one per shard,
# selecting the shard's namespaces and naming its Lease, and the binding that refuses a
# replica's writes in a namespace of any other shard. rbac/shard-fence-bindings.yaml is its
# output for the default 32; the Helm chart makes the same from its `shards` value.
#
#   bash hack/shard-fence-bindings.sh [SHARDS] [NAMESPACE]     default 32, flotilla-system
#   bash hack/shard-fence-bindings.sh 64 | kubectl apply -f -   after raising --shards to 64
set -euo pipefail
SHARDS=${1:-32}
NAMESPACE=${2:-flotilla-system}
[[ "$SHARDS" =~ ^[1-9][0-9]{0,3}$ ]] && [ "$SHARDS" -le 4096 ] || {
  echo "error: SHARDS must be a number from 1 to 4096 (the operator's --shards)" >&2
  exit 1
}
echo "# Made by hack/shard-fence-bindings.sh $SHARDS: one binding per shard of --shards $SHARDS."
for i in $(seq 0 $((SHARDS - 1))); do
  cat <<YAML
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: flotilla-shard-fence-$i
  labels: {app.kubernetes.io/name: flotilla}
spec:
  policyName: flotilla-shard-fence-per-shard
  validationActions: [Deny]
  paramRef:
    name: flotilla-shard-$i
    namespace: $NAMESPACE
    parameterNotFoundAction: Allow
  matchResources:
    namespaceSelector:
      matchLabels: {flotilla.dev/shard: "$i"}
YAML
done
values=$(seq 0 $((SHARDS - 1)) | sed 's/.*/"&"/' | paste -sd, - | sed 's/,/, /g')
cat <<YAML
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: flotilla-shard-fence-unbound
  labels: {app.kubernetes.io/name: flotilla}
spec:
  policyName: flotilla-shard-fence-unbound
  validationActions: [Deny]
  matchResources:
    namespaceSelector:
      matchExpressions:
        - {key: flotilla.dev/shard, operator: NotIn, values: [$values]}
YAML
