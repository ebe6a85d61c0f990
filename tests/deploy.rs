//! The install manifests are valid against a real apiserver: the kustomize base (CRDs,
//! namespace, ServiceAccount, rbac/, 3 replicas with anti-affinity, PodDisruptionBudget,
//! metrics Service) passes a server-side dry run.

mod support;

use support::{install_operator_rbac, kubectl_try};

#[test]
fn kustomize_base_passes_a_server_side_dry_run() {
    // The namespace must exist for the namespaced objects of the dry run to be checked.
    install_operator_rbac();
    let base = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/base");
    let (ok, out) = kubectl_try(&["apply", "--server-side", "--dry-run=server", "--force-conflicts", "-k", base]);
    assert!(ok, "kubectl apply --dry-run=server -k deploy/base failed:\n{out}");
    for object in [
        "customresourcedefinition.apiextensions.k8s.io/apps.flotilla.dev",
        "customresourcedefinition.apiextensions.k8s.io/tenants.flotilla.dev",
        "clusterrole.rbac.authorization.k8s.io/flotilla-operator",
        "clusterrole.rbac.authorization.k8s.io/flotilla-tenant-workloads",
        "clusterrole.rbac.authorization.k8s.io/flotilla-tenant-admin",
        "role.rbac.authorization.k8s.io/flotilla-leases",
        "deployment.apps/flotilla",
        "poddisruptionbudget.policy/flotilla",
        "service/flotilla-metrics",
    ] {
        assert!(out.contains(object), "{object} is part of the base:\n{out}");
    }
}
