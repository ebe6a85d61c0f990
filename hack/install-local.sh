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
# Running replicas point the CRDs' conversion at their webhook by URL (src/webhook/crd.rs).
# Applying crds/ as it is would add the in-cluster Service beside that URL, which the
# apiserver refuses ("exactly one of url or service"): a second run of the demo failed so.
# So the CRDs are applied with the conversion they have now, and the replicas keep it.
# --ignore-not-found: a fresh cluster has no CRDs yet; an unreachable apiserver still fails.
conversion() { # the conversion URL and caBundle a CRD has now, one per line (empty: none)
  kubectl get crd "$1" --ignore-not-found \
    -o jsonpath='{.spec.conversion.webhook.clientConfig.url}{"\n"}{.spec.conversion.webhook.clientConfig.caBundle}{"\n"}'
}
apps_conversion=$(conversion apps.flotilla.dev)
tenants_conversion=$(conversion tenants.flotilla.dev)
APPS_CONVERSION=$apps_conversion TENANTS_CONVERSION=$tenants_conversion \
python3 - "$root/crds/flotilla.dev.yaml" <<'PY' | kubectl apply --server-side --force-conflicts -f - >/dev/null
import json, os, sys
docs = open(sys.argv[1]).read().split("\n---\n")
service = ("        service:\n          name: flotilla-webhook\n          namespace: flotilla-system\n"
           "          path: /convert\n          port: 443\n")
for i, doc in enumerate(docs):
    crd = "apps" if "\n  name: apps.flotilla.dev\n" in doc else "tenants" if "\n  name: tenants.flotilla.dev\n" in doc else None
    if crd is None:
        continue
    url, _, ca = os.environ.get(f"{crd.upper()}_CONVERSION", "").partition("\n")
    if not url.strip():
        continue
    if doc.count(service) != 1:
        sys.exit("crds/flotilla.dev.yaml: the conversion's Service block changed; update hack/install-local.sh")
    # JSON strings are YAML strings: any URL or bundle is written as it is.
    keep = f"        url: {json.dumps(url.strip())}\n"
    if ca.strip():
        keep += f"        caBundle: {json.dumps(ca.strip())}\n"
    docs[i] = doc.replace(service, keep)
sys.stdout.write("\n---\n".join(docs))
PY
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
