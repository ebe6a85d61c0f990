//! End to end, with the operator authenticated as its ServiceAccount (a TokenRequest token)
//! and exactly the rbac/ manifests applied (roles and ValidatingAdmissionPolicies): which
//! namespaces a Tenant may claim, what the apiserver refuses the operator's token whatever
//! RBAC would allow, Pod Security Admission in tenant namespaces and the pod annotations a
//! tenant may not set. Each scenario asserts on
//! what the cluster shows.

mod support;

use flotilla::api::{App, NamespaceState, Tenant};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{Namespace, Pod, ResourceQuota, Service};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, Config};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;
use support::{Operator, admin_client, install_crds, kubectl_ok, kubectl_try, operator_kubeconfig, unique, wait_for};

/// A Tenant in Conflict, NotAdoptable or Error is looked at again every 30 s.
const SETTLE: Duration = Duration::from_secs(60);

async fn create_tenant(client: &Client, name: &str, spec: Value) {
    let t: Tenant = serde_json::from_value(json!({
        "apiVersion": "flotilla.dev/v1beta1", "kind": "Tenant", "metadata": {"name": name}, "spec": spec,
    }))
    .expect("tenant");
    Api::<Tenant>::all(client.clone()).create(&PostParams::default(), &t).await.expect("creating Tenant");
}

async fn set_namespaces(client: &Client, tenant: &str, namespaces: &[&str]) {
    Api::<Tenant>::all(client.clone())
        .patch(tenant, &PatchParams::default(), &Patch::Merge(json!({"spec": {"namespaces": namespaces}})))
        .await
        .expect("patching Tenant");
}

async fn namespace_status(client: &Client, tenant: &str, ns: &str) -> Option<(NamespaceState, String)> {
    let t = Api::<Tenant>::all(client.clone()).get(tenant).await.ok()?;
    t.status?.namespaces.into_iter().find(|n| n.name == ns).map(|n| (n.state, n.message))
}

/// Waits until the Tenant reports `state` for `ns`; returns the message.
async fn wait_state(client: &Client, tenant: &str, ns: &str, state: NamespaceState) -> String {
    wait_for(SETTLE, &format!("tenant {tenant}: namespace {ns} {state:?}"), || async {
        namespace_status(client, tenant, ns).await.filter(|(s, _)| *s == state).map(|(_, m)| m)
    })
    .await
}

async fn labels_of(client: &Client, ns: &str) -> BTreeMap<String, String> {
    Api::<Namespace>::all(client.clone()).get(ns).await.expect("namespace").metadata.labels.unwrap_or_default()
}

async fn has_binding(client: &Client, ns: &str, name: &str) -> bool {
    Api::<RoleBinding>::namespaced(client.clone(), ns).get_opt(name).await.expect("reading RoleBinding").is_some()
}

async fn client_of(kubeconfig: &Path) -> Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).expect("reading the operator's kubeconfig");
    let config = Config::from_custom_kubeconfig(kc, &Default::default()).await.expect("kubeconfig");
    Client::try_from(config).expect("client")
}

/// §4: an existing namespace Flotilla did not create is onboarded only once a cluster admin
/// marked it adoptable; adopting labels it for the Tenant.
async fn foreign_namespace_needs_adoption(client: Client) {
    let (t, foreign) = (unique("ten-adopt"), unique("foreign"));
    kubectl_ok(&["create", "namespace", &foreign]);
    create_tenant(&client, &t, json!({"namespaces": [foreign], "admins": [{"kind": "Group", "name": "team-adopt"}]}))
        .await;
    let message = wait_state(&client, &t, &foreign, NamespaceState::NotAdoptable).await;
    assert!(message.contains("flotilla.dev/adoptable"), "the message says how to allow it: {message}");
    let ready = Api::<Tenant>::all(client.clone())
        .get(&t)
        .await
        .expect("tenant")
        .status
        .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == "Ready"))
        .expect("Ready");
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "NotAdoptable"));
    assert!(!has_binding(&client, &foreign, "flotilla-operator").await, "no operator RoleBinding in {foreign}");
    assert!(!has_binding(&client, &foreign, "flotilla-tenant-admins").await, "no admin RoleBinding in {foreign}");
    assert!(!labels_of(&client, &foreign).await.contains_key("flotilla.dev/tenant"), "{foreign} not labelled");

    // Marked adoptable for another tenant: still not this one's.
    kubectl_ok(&["label", "namespace", &foreign, "flotilla.dev/adoptable=someone-else"]);
    tokio::time::sleep(Duration::from_secs(35)).await;
    assert_eq!(namespace_status(&client, &t, &foreign).await.map(|s| s.0), Some(NamespaceState::NotAdoptable));

    kubectl_ok(&["label", "--overwrite", "namespace", &foreign, &format!("flotilla.dev/adoptable={t}")]);
    wait_state(&client, &t, &foreign, NamespaceState::Onboarded).await;
    assert_eq!(labels_of(&client, &foreign).await.get("flotilla.dev/tenant"), Some(&t), "adoption labels it");
    assert!(has_binding(&client, &foreign, "flotilla-operator").await);
}

/// §4: protected namespaces are never claimed, whatever their labels say; nor is a
/// namespace every tenant's NetworkPolicy admits (`allowed`, not created yet: the tenant that
/// took the name would be admitted into every tenant namespace).
async fn protected_namespaces_are_never_claimed(client: Client, allowed: String) {
    let (t, marked, kube_like) = (unique("ten-prot"), unique("infra"), unique("kube-tenant"));
    kubectl_ok(&["create", "namespace", &marked]);
    kubectl_ok(&["label", "namespace", &marked, "flotilla.dev/protected=true", "flotilla.dev/adoptable=true"]);
    create_tenant(&client, &t, json!({"namespaces": [marked, kube_like, allowed]})).await;
    for ns in [&marked, &kube_like, &allowed] {
        let message = wait_state(&client, &t, ns, NamespaceState::Error).await;
        assert!(message.contains("protected namespace"), "{ns}: {message}");
    }
    assert!(!has_binding(&client, &marked, "flotilla-operator").await);
    for ns in [&kube_like, &allowed] {
        assert!(Api::<Namespace>::all(client.clone()).get_opt(ns).await.expect("get").is_none(), "{ns} was created");
    }
    kubectl_ok(&["delete", "namespace", &marked, "--wait=false"]);
}

/// §4: once a namespace was a tenant's, no other tenant takes it, not even after the first
/// gave it up; the first may take it back.
async fn ownership_never_moves(client: Client) {
    let (first, second, mine, contested) = (unique("ten-own"), unique("ten-late"), unique("late"), unique("owned"));
    create_tenant(&client, &second, json!({"namespaces": [mine], "admins": [{"kind": "Group", "name": "late-devs"}]}))
        .await;
    wait_state(&client, &second, &mine, NamespaceState::Onboarded).await;
    // The second tenant is the older one: "the oldest claimant wins" would hand it the namespace.
    create_tenant(&client, &first, json!({"namespaces": [contested]})).await;
    wait_state(&client, &first, &contested, NamespaceState::Onboarded).await;
    let labels = labels_of(&client, &contested).await;
    assert_eq!(labels.get("pod-security.kubernetes.io/enforce").map(String::as_str), Some("baseline"));
    assert_eq!(labels.get("pod-security.kubernetes.io/warn").map(String::as_str), Some("restricted"));
    assert_eq!(labels.get("pod-security.kubernetes.io/audit").map(String::as_str), Some("restricted"));

    set_namespaces(&client, &first, &[]).await;
    wait_state(&client, &first, &contested, NamespaceState::Offboarded).await;
    set_namespaces(&client, &second, &[&mine, &contested]).await;
    let message = wait_state(&client, &second, &contested, NamespaceState::Conflict).await;
    assert!(message.contains(&first), "the conflict names the owner: {message}");
    tokio::time::sleep(Duration::from_secs(35)).await;
    assert_eq!(namespace_status(&client, &second, &contested).await.map(|s| s.0), Some(NamespaceState::Conflict));
    assert!(!has_binding(&client, &contested, "flotilla-tenant-admins").await, "no admin RoleBinding for {second}");
    assert!(!has_binding(&client, &contested, "flotilla-operator").await);
    assert_eq!(labels_of(&client, &contested).await.get("flotilla.dev/tenant"), Some(&first));

    set_namespaces(&client, &first, &[&contested]).await;
    wait_state(&client, &first, &contested, NamespaceState::Onboarded).await;
}

/// The apiserver's refusal of `result`: its message, which must name `policy`.
fn refused<T>(what: &str, result: Result<T, kube::Error>, policy: &str) -> Option<String> {
    match result {
        Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains(policy) => None,
        Err(e) => Some(format!("{what}: want 403 from {policy}, got {e}")),
        Ok(_) => Some(format!("{what}: want 403 from {policy}, but it was accepted")),
    }
}

/// §5: with the operator's own token, what RBAC alone would let through is refused by the
/// apiserver's admission policies, and what RBAC limits by name is refused by RBAC.
async fn operator_token_is_fenced(client: Client, operator: Client) {
    let (t, tenant_ns, victim) = (unique("ten-fence"), unique("fenced"), unique("victim"));
    create_tenant(&client, &t, json!({"namespaces": [tenant_ns]})).await;
    wait_state(&client, &t, &tenant_ns, NamespaceState::Onboarded).await;
    kubectl_ok(&["create", "namespace", &victim]);
    kubectl_ok(&["-n", &tenant_ns, "create", "rolebinding", "someone-elses", "--clusterrole=view", "--group=x"]);
    kubectl_ok(&["-n", &tenant_ns, "create", "quota", "someone-elses", "--hard=pods=1"]);
    let mut failures = Vec::new();
    let binding = |ns: &str, name: &str, role: &str| -> RoleBinding {
        serde_json::from_value(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": "flotilla", "namespace": "flotilla-system"}],
        }))
        .expect("binding")
    };
    let pp = PostParams::default();
    const ONBOARDING: &str = "flotilla-operator-onboarding";
    for ns in ["kube-system", victim.as_str()] {
        let api: Api<RoleBinding> = Api::namespaced(operator.clone(), ns);
        let r = api.create(&pp, &binding(ns, "flotilla-operator", "flotilla-tenant-workloads")).await;
        failures.extend(refused(&format!("binding flotilla-tenant-workloads in {ns}"), r, ONBOARDING));
        let r = api
            .patch(
                "flotilla-operator",
                &PatchParams::apply("attacker").force(),
                &Patch::Apply(binding(ns, "flotilla-operator", "flotilla-tenant-workloads")),
            )
            .await;
        failures.extend(refused(&format!("applying binding flotilla-operator in {ns}"), r, ONBOARDING));
        let quota: ResourceQuota = serde_json::from_value(
            json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "flotilla-tenant", "namespace": ns}, "spec": {"hard": {"pods": "0"}}}),
        )
        .expect("quota");
        let r = Api::<ResourceQuota>::namespaced(operator.clone(), ns).create(&pp, &quota).await;
        failures.extend(refused(&format!("a ResourceQuota in {ns}"), r, ONBOARDING));
    }
    // In a tenant namespace: only Flotilla's own names.
    let api: Api<RoleBinding> = Api::namespaced(operator.clone(), &tenant_ns);
    let r = api.create(&pp, &binding(&tenant_ns, "backdoor", "flotilla-tenant-workloads")).await;
    failures.extend(refused("a RoleBinding of another name in a tenant namespace", r, ONBOARDING));
    let r = api.create(&pp, &binding(&tenant_ns, "flotilla-tenant-admins", "flotilla-tenant-workloads")).await;
    failures.extend(refused("flotilla-tenant-admins bound to the workloads role", r, "flotilla-operator-"));
    // The operator's binding names the operator only.
    let mut to_attacker = binding(&tenant_ns, "flotilla-operator", "flotilla-tenant-workloads");
    if let Some(s) = to_attacker.subjects.as_mut().and_then(|s| s.first_mut()) {
        s.name = "attacker".into();
        s.namespace = Some(victim.clone());
    }
    let r = api.patch("flotilla-operator", &PatchParams::apply("attacker").force(), &Patch::Apply(&to_attacker)).await;
    failures.extend(refused("binding the workloads role to another ServiceAccount", r, ONBOARDING));
    // The admins' binding names the admins the Tenant lists, and no one else: the Flotilla
    // operator's own write of it passes, a stolen token's write of it with others does not.
    let (t2, admins_ns) = (unique("ten-admins"), unique("admins"));
    create_tenant(&client, &t2, json!({"namespaces": [admins_ns], "admins": [{"kind": "User", "name": "alice"}]}))
        .await;
    wait_state(&client, &t2, &admins_ns, NamespaceState::Onboarded).await;
    assert!(has_binding(&client, &admins_ns, "flotilla-tenant-admins").await, "the Tenant's admins are bound");
    let everyone: RoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "flotilla-tenant-admins", "namespace": admins_ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "flotilla-tenant-admin"},
        "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "alice"},
                     {"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "system:authenticated"}],
    }))
    .expect("binding");
    let r = Api::<RoleBinding>::namespaced(operator.clone(), &admins_ns)
        .patch("flotilla-tenant-admins", &PatchParams::apply("attacker").force(), &Patch::Apply(&everyone))
        .await;
    failures.extend(refused("binding every authenticated user as tenant admins", r, "flotilla-operator-tenant-admins"));
    let quota: ResourceQuota = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "other"}, "spec": {"hard": {"pods": "0"}}}),
    )
    .expect("quota");
    let r = Api::<ResourceQuota>::namespaced(operator.clone(), &tenant_ns).create(&pp, &quota).await;
    failures.extend(refused("a ResourceQuota of another name", r, ONBOARDING));
    // RBAC: resourceNames.
    let r = api.delete("someone-elses", &DeleteParams::default()).await;
    failures.extend(refused("deleting someone else's RoleBinding", r, "cannot delete resource"));
    let r = Api::<ResourceQuota>::namespaced(operator.clone(), &tenant_ns)
        .patch("someone-elses", &PatchParams::default(), &Patch::Merge(json!({"spec": {"hard": {"pods": "0"}}})))
        .await;
    failures.extend(refused("patching someone else's ResourceQuota", r, "cannot patch resource"));

    // Namespaces.
    const NAMESPACES: &str = "flotilla-operator-namespaces";
    let namespaces: Api<Namespace> = Api::all(operator.clone());
    for ns in ["kube-system", victim.as_str()] {
        let label = json!({"metadata": {"labels": {"flotilla.dev/tenant": t}}});
        let r = namespaces.patch(ns, &PatchParams::default(), &Patch::Merge(&label)).await;
        failures.extend(refused(&format!("labelling {ns} for a tenant"), r, NAMESPACES));
    }
    let moves = [
        ("moving a tenant namespace to another tenant", json!({"flotilla.dev/tenant": "thief"})),
        ("unlabelling a tenant namespace", json!({"flotilla.dev/tenant": null})),
        ("enforcing privileged", json!({"pod-security.kubernetes.io/enforce": "privileged"})),
        ("marking a namespace protected-free", json!({"flotilla.dev/protected": "false"})),
    ];
    for (what, labels) in moves {
        let r = namespaces
            .patch(&tenant_ns, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": labels}})))
            .await;
        failures.extend(refused(what, r, NAMESPACES));
    }
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": unique("unlabelled")}})).expect("ns");
    failures.extend(refused("creating an unlabelled namespace", namespaces.create(&pp, &namespace).await, NAMESPACES));

    // Workloads, even where a RoleBinding (made by someone else) gives the operator the rights.
    // (Without the onboarding policy the operator created it above: AlreadyExists.)
    let _ = kubectl_try(&[
        "-n",
        &victim,
        "create",
        "rolebinding",
        "flotilla-operator",
        "--clusterrole=flotilla-tenant-workloads",
        "--serviceaccount=flotilla-system:flotilla",
    ]);
    const WORKLOADS: &str = "flotilla-operator-workloads";
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "miner"},
        "spec": {"selector": {"matchLabels": {"app": "miner"}}, "template": {"metadata": {"labels": {"app": "miner"}},
                 "spec": {"containers": [{"name": "miner", "image": "registry.example.com/miner:1"}]}}},
    }))
    .expect("deployment");
    let service: Service =
        serde_json::from_value(json!({"metadata": {"name": "miner"}, "spec": {"ports": [{"port": 80}]}})).expect("svc");
    let hpa: HorizontalPodAutoscaler = serde_json::from_value(json!({
        "metadata": {"name": "miner"},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "miner"}, "maxReplicas": 100},
    }))
    .expect("hpa");
    // The binding takes effect at once, but RBAC is checked before admission: wait until the
    // refusal comes from the policy (a 403 from RBAC would not name it).
    let deployments: Api<Deployment> = Api::namespaced(operator.clone(), &victim);
    let first = wait_for(Duration::from_secs(10), "the workloads binding in effect", || async {
        match deployments.create(&pp, &deployment).await {
            Err(kube::Error::Api(s)) if !s.message.contains(WORKLOADS) && s.code == 403 => None,
            other => Some(other),
        }
    })
    .await;
    failures.extend(refused("a Deployment outside tenant namespaces", first, WORKLOADS));
    let r = Api::<Service>::namespaced(operator.clone(), &victim).create(&pp, &service).await;
    failures.extend(refused("a Service outside tenant namespaces", r, WORKLOADS));
    let r = Api::<HorizontalPodAutoscaler>::namespaced(operator.clone(), &victim).create(&pp, &hpa).await;
    failures.extend(refused("an HPA outside tenant namespaces", r, WORKLOADS));
    kubectl_ok(&["-n", &victim, "create", "deployment", "existing", "--image=registry.example.com/x:1"]);
    let r = deployments.delete("existing", &DeleteParams::default()).await;
    failures.extend(refused("a Deployment delete outside tenant namespaces", r, WORKLOADS));
    // The same request in the tenant namespace is allowed: the policy is not a blanket refusal.
    // The replica takes its shards a moment after it is ready (from the previous test binary's
    // replica, released or expired): until then the shard fence refuses the write, saying so.
    let allowed = wait_for(Duration::from_secs(20), "the tenant namespace's shard held by the replica", || async {
        match Api::<Deployment>::namespaced(operator.clone(), &tenant_ns).create(&pp, &deployment).await {
            Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("does not hold shard Lease") => None,
            other => Some(other),
        }
    })
    .await;
    allowed.expect("the operator may still create a Deployment in a tenant namespace");

    // Last: without the policy, this one succeeds and the namespace is gone.
    let r = namespaces.delete(&victim, &DeleteParams::default()).await;
    failures.extend(refused(&format!("deleting namespace {victim}"), r, NAMESPACES));
    assert!(
        failures.is_empty(),
        "requests with the operator's token not refused as expected:\n{}",
        failures.join("\n")
    );
    kubectl_ok(&["delete", "namespace", &victim, "--wait=false"]);
}

/// Issue 49 §1: with the operator's own token, a Tenant's spec, labels, annotations and other
/// finalizers cannot be changed (the tenant-admins policy trusts the Tenant's spec.admins):
/// only its finalizer and its status.
async fn operator_token_cannot_rewrite_tenants(client: Client, operator: Client) {
    let (t, ns) = (unique("ten-rewrite"), unique("rewrite"));
    create_tenant(
        &client,
        &t,
        json!({"namespaces": [ns], "admins": [{"kind": "User", "name": "bob"}],
                                      "quota": {"hard": {"pods": "5"}}}),
    )
    .await;
    wait_state(&client, &t, &ns, NamespaceState::Onboarded).await;
    const TENANTS: &str = "flotilla-operator-tenants";
    let tenants: Api<Tenant> = Api::all(operator.clone());
    let mut failures = Vec::new();
    let attempts = [
        (
            "widening spec.admins to every authenticated user",
            json!({"spec": {"admins": [{"kind": "Group", "name": "system:authenticated"}]}}),
        ),
        ("dropping the quota", json!({"spec": {"quota": null}})),
        ("dropping the NetworkPolicy", json!({"spec": {"networkPolicy": {"isolation": "None"}}})),
        ("adding a namespace", json!({"spec": {"namespaces": [ns, "ingress-nginx"]}})),
        ("labelling the Tenant", json!({"metadata": {"labels": {"team": "thief"}}})),
        ("annotating the Tenant", json!({"metadata": {"annotations": {"flotilla.dev/v1beta1-fields": "{}"}}})),
        (
            "adding another finalizer",
            json!({"metadata": {"finalizers": ["flotilla.dev/offboard", "example.com/hold"]}}),
        ),
    ];
    for (what, patch) in attempts {
        let r = tenants.patch(&t, &PatchParams::default(), &Patch::Merge(&patch)).await;
        failures.extend(refused(what, r, TENANTS));
    }
    // What the operator must do still passes: its finalizer and its status.
    let status = json!({"status": {"conditions": []}});
    let r = tenants.patch_status(&t, &PatchParams::default(), &Patch::Merge(&status)).await;
    if let Err(e) = r {
        failures.push(format!("the operator's status write was refused: {e}"));
    }
    let admins = Api::<Tenant>::all(client.clone()).get(&t).await.expect("tenant").spec.admins;
    assert_eq!(admins.len(), 1, "spec.admins unchanged: {admins:?}");
    assert!(failures.is_empty(), "Tenant writes with the operator's token not refused:\n{}", failures.join("\n"));
}

/// A user whose only right is to create and label namespaces (a CI robot, a self-service
/// portal), through kubectl's impersonation.
const NS_ROBOT: &str = "flotilla-test-namespace-robot";

fn as_robot(args: &[&str]) -> (bool, String) {
    let mut all = vec!["--as", NS_ROBOT];
    all.extend_from_slice(args);
    kubectl_try(&all)
}

/// Issue 49 §1: a namespace creator cannot set the labels Flotilla trusts (so cannot join a
/// tenant's network, pre-claim a namespace for a tenant, pick its shard or protect it); the
/// tenant's NetworkPolicy names its peers by the name the apiserver sets; a namespace the
/// creator made for a Tenant is onboarded only through adoption.
async fn namespace_creator_cannot_forge_trusted_labels(client: Client, monitoring: String) {
    let (t, home, spy, later) = (unique("ten-forge"), unique("home"), unique("spy"), unique("later"));
    let _ = kubectl_try(&[
        "create",
        "clusterrole",
        NS_ROBOT,
        "--verb=create,get,list,patch,update",
        "--resource=namespaces",
    ]);
    let _ = kubectl_try(&[
        "create",
        "clusterrolebinding",
        NS_ROBOT,
        &format!("--clusterrole={NS_ROBOT}"),
        &format!("--user={NS_ROBOT}"),
    ]);
    create_tenant(&client, &t, json!({"namespaces": [home]})).await;
    wait_state(&client, &t, &home, NamespaceState::Onboarded).await;
    const LABELS: &str = "flotilla-namespace-labels";
    let mut failures = Vec::new();

    // Created already labelled for the tenant: refused.
    let file = std::env::temp_dir().join(format!("{spy}.json"));
    let labelled = json!({"apiVersion": "v1", "kind": "Namespace",
                          "metadata": {"name": spy, "labels": {"flotilla.dev/tenant": t}}});
    std::fs::write(&file, labelled.to_string()).expect("write");
    let (ok, out) = as_robot(&["create", "-f", &file.display().to_string()]);
    if ok || !out.contains(LABELS) {
        failures.push(format!("creating {spy} labelled for {t}: want a refusal from {LABELS}, got: {out}"));
    }
    // Created plain (allowed), then labelled: each trusted label refused, others allowed.
    let (ok, out) = as_robot(&["create", "namespace", &spy]);
    assert!(ok, "the robot may create namespaces: {out}");
    for label in [
        format!("flotilla.dev/tenant={t}"),
        "flotilla.dev/adoptable=true".into(),
        "flotilla.dev/shard=0".into(),
        "flotilla.dev/protected=true".into(),
    ] {
        let (ok, out) = as_robot(&["label", "namespace", &spy, &label]);
        if ok || !out.contains(LABELS) {
            failures.push(format!("labelling {spy} {label}: want a refusal from {LABELS}, got: {out}"));
        }
    }
    let (ok, out) = as_robot(&["label", "namespace", &spy, "team=spies"]);
    assert!(ok, "other labels stay the creator's: {out}");
    assert!(!labels_of(&client, &spy).await.contains_key("flotilla.dev/tenant"));

    // The tenant's NetworkPolicy names its namespaces by kubernetes.io/metadata.name.
    let policy = Api::<k8s_openapi::api::networking::v1::NetworkPolicy>::namespaced(client.clone(), &home)
        .get("flotilla-tenant")
        .await
        .expect("the tenant's NetworkPolicy");
    let policy_spec = policy.spec.unwrap_or_default();
    let peers = serde_json::to_value(&policy_spec.ingress).expect("json");
    let text = peers.to_string();
    // By name (the apiserver sets it) and by the owner's label (only the platform may).
    assert!(text.contains(r#""operator":"In""#) && text.contains(&t), "{text}");
    assert!(text.contains("kubernetes.io/metadata.name") && text.contains(&home) && !text.contains(&spy), "{text}");
    // Its pods may reach neither the platform's monitoring namespace, by name or by address.
    let egress = serde_json::to_value(&policy_spec.egress).expect("json").to_string();
    assert!(egress.contains("NotIn") && egress.contains(&monitoring) && egress.contains("10.0.0.0/8"), "{egress}");
    assert_eq!(policy_spec.policy_types, Some(vec!["Ingress".to_string(), "Egress".to_string()]));

    // A namespace the creator made before the Tenant lists it: only through adoption.
    let (ok, out) = as_robot(&["create", "namespace", &later]);
    assert!(ok, "{out}");
    set_namespaces(&client, &t, &[&home, &later]).await;
    wait_state(&client, &t, &later, NamespaceState::NotAdoptable).await;
    // The platform (system:masters here) may still hand it over.
    kubectl_ok(&["label", "namespace", &later, &format!("flotilla.dev/adoptable={t}")]);
    wait_state(&client, &t, &later, NamespaceState::Onboarded).await;
    let peers = wait_for(SETTLE, "the NetworkPolicy of the first namespace names the adopted one", || async {
        let p = Api::<k8s_openapi::api::networking::v1::NetworkPolicy>::namespaced(client.clone(), &home)
            .get("flotilla-tenant")
            .await
            .ok()?;
        let text = serde_json::to_string(&p.spec?.ingress).ok()?;
        text.contains(&later).then_some(text)
    })
    .await;
    assert!(!peers.contains(&spy), "{peers}");
    assert!(failures.is_empty(), "forged namespace labels not refused:\n{}", failures.join("\n"));
    kubectl_ok(&["delete", "namespace", &spy, "--wait=false"]);
}

/// Issue 49 §5: a Tenant's pod policy. At admission, an App whose pod names a priority class,
/// a node, a toleration, an inline CSI driver or a token audience the Tenant does not allow
/// is refused, naming the field; an App written before the policy is refused by the operator
/// at its next reconcile, and nothing more of it is applied.
async fn tenant_pod_policy_is_enforced(client: Client) {
    let (t, ns) = (unique("ten-pods"), unique("pods"));
    create_tenant(&client, &t, json!({"namespaces": [ns]})).await;
    wait_state(&client, &t, &ns, NamespaceState::Onboarded).await;
    let apps: Api<App> = Api::namespaced(client.clone(), &ns);
    let app = |name: &str, pod: Value| -> App {
        let mut spec = json!({"containers": [{"name": "app"}], "nodeSelector": {"pool": "shop"}});
        if let (Some(spec), Some(extra)) = (spec.as_object_mut(), pod.as_object()) {
            spec.extend(extra.clone());
        }
        serde_json::from_value(json!({
            "apiVersion": "flotilla.dev/v1beta1", "kind": "App", "metadata": {"name": name, "namespace": ns},
            "spec": {"image": "registry.example.com/shop/web", "version": "1.0.0", "replicas": 1,
                     "template": {"spec": spec}},
        }))
        .expect("app")
    };
    // Written before the Tenant had a pod policy.
    apps.create(&PostParams::default(), &app("early", json!({"priorityClassName": "system-node-critical"})))
        .await
        .expect("creating App early");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    wait_for(SETTLE, "App early's Deployment", || async { deployments.get_opt("early").await.ok().flatten() }).await;
    Api::<Tenant>::all(client.clone())
        .patch(
            &t,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"podPolicy": {
                "allowedPriorityClasses": ["tenant-high"], "nodeSelector": {"pool": "shop"},
                "allowedTolerationKeys": ["pool"], "allowedCsiDrivers": ["secrets-store.csi.k8s.io"],
                "allowedTokenAudiences": ["vault"]}}})),
        )
        .await
        .expect("setting the pod policy");
    let refused_cases = [
        (
            "priority",
            json!({"priorityClassName": "system-node-critical"}),
            "spec.template.spec.priorityClassName: system-node-critical is not allowed",
        ),
        ("runtime", json!({"runtimeClassName": "runc"}), "spec.template.spec.runtimeClassName: runc is not allowed"),
        ("pinned", json!({"nodeName": "control-plane"}), "spec.template.spec.nodeName: may not be set"),
        (
            "elsewhere",
            json!({"nodeSelector": {"pool": "bank"}}),
            "spec.template.spec.nodeSelector: must select pool=shop",
        ),
        (
            "tolerant",
            json!({"tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]}),
            "spec.template.spec.tolerations",
        ),
        (
            "inline",
            json!({"volumes": [{"name": "x", "csi": {"driver": "hostpath.csi.k8s.io"}}]}),
            "an inline CSI volume",
        ),
        (
            "token",
            json!({"volumes": [{"name": "t", "projected": {"sources": [{"serviceAccountToken": {"audience": "https://kubernetes.default.svc", "path": "t"}}]}}]}),
            "a projected ServiceAccount token",
        ),
    ];
    let mut failures = Vec::new();
    for (name, pod, want) in refused_cases {
        // The apiserver's cache of Tenants (the policy's parameters) takes a moment to see the policy.
        let got = wait_for(Duration::from_secs(20), &format!("App {name} refused at admission"), || async {
            match apps.create(&PostParams::default(), &app(name, pod.clone())).await {
                Ok(_) => {
                    let _ = apps.delete(name, &DeleteParams::default()).await;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    None
                }
                Err(e) => Some(e.to_string()),
            }
        })
        .await;
        if !got.contains(want) || !got.contains("flotilla-tenant-pod-policy") {
            failures.push(format!("App {name}: want a refusal saying {want:?}, got: {got}"));
        }
    }
    // What the policy allows is admitted.
    let allowed = app(
        "allowed",
        json!({"priorityClassName": "tenant-high",
        "tolerations": [{"key": "pool", "operator": "Equal", "value": "shop", "effect": "NoSchedule"}]}),
    );
    if let Err(e) = apps.create(&PostParams::default(), &allowed).await {
        failures.push(format!("an App the policy allows was refused: {e}"));
    }
    // The early App is refused at its next reconcile (here: its Deployment scaled by hand),
    // and the drift is not corrected.
    kubectl_ok(&["-n", &ns, "scale", "deployment", "early", "--replicas=3"]);
    let message = wait_for(SETTLE, "App early refused by the operator", || async {
        let ready = apps.get("early").await.ok()?.status?.conditions.into_iter().find(|c| c.type_ == "Ready")?;
        (ready.status == "False" && ready.reason == "PodPolicyDenied").then_some(ready.message)
    })
    .await;
    assert!(message.contains("spec.template.spec.priorityClassName"), "{message}");
    let replicas = deployments.get("early").await.expect("Deployment").spec.and_then(|s| s.replicas);
    assert_eq!(replicas, Some(3), "nothing of a refused App is applied");
    assert!(failures.is_empty(), "the pod policy did not hold:\n{}", failures.join("\n"));
}

/// §6: a Tenant enforcing `restricted`: the namespace refuses a privileged pod and runs
/// Flotilla's pods.
async fn restricted_tenant_runs_flotillas_pods(client: Client) {
    let (t, ns) = (unique("ten-psa"), unique("restricted"));
    create_tenant(&client, &t, json!({"namespaces": [ns], "podSecurity": {"enforce": "restricted"}})).await;
    wait_state(&client, &t, &ns, NamespaceState::Onboarded).await;
    let labels = labels_of(&client, &ns).await;
    assert_eq!(labels.get("pod-security.kubernetes.io/enforce").map(String::as_str), Some("restricted"));

    // The ServiceAccount admission plugin refuses any pod until the namespace's default
    // ServiceAccount exists.
    wait_for(Duration::from_secs(30), "default ServiceAccount", || async {
        let sa: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(client.clone(), &ns);
        sa.get_opt("default").await.ok().flatten()
    })
    .await;
    let pod = format!(
        r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"privileged","namespace":"{ns}"}},"spec":{{"containers":[{{"name":"c","image":"registry.example.com/x:1","securityContext":{{"privileged":true}}}}]}}}}"#
    );
    let file = std::env::temp_dir().join(format!("{ns}-privileged.json"));
    std::fs::write(&file, pod).expect("write");
    let (ok, out) = kubectl_try(&["create", "-f", &file.display().to_string()]);
    assert!(!ok && out.contains("violates PodSecurity \"restricted"), "a privileged pod is refused: {out}");

    let app: App = serde_json::from_value(json!({
        "apiVersion": "flotilla.dev/v1beta1", "kind": "App", "metadata": {"name": "web", "namespace": ns},
        "spec": {"image": "registry.example.com/shop/web", "version": "1.0.0", "replicas": 2},
    }))
    .expect("app");
    Api::<App>::namespaced(client.clone(), &ns).create(&PostParams::default(), &app).await.expect("creating App");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    wait_for(SETTLE, "Flotilla's 2 pods admitted in the restricted namespace", || async {
        let list = pods.list(&ListParams::default().labels("app.kubernetes.io/name=web")).await.ok()?;
        (list.items.len() == 2).then_some(())
    })
    .await;
    let sets = Api::<ReplicaSet>::namespaced(client.clone(), &ns).list(&ListParams::default()).await.expect("list");
    for rs in sets.items {
        let failure = rs
            .status
            .and_then(|s| s.conditions)
            .into_iter()
            .flatten()
            .find(|c| c.type_ == "ReplicaFailure" && c.status == "True");
        assert!(failure.is_none(), "ReplicaSet reports {failure:?}");
    }
    let (_, events) = kubectl_try(&["-n", &ns, "get", "events", "-o", "jsonpath={.items[*].reason}"]);
    assert!(!events.contains("FailedCreate"), "no FailedCreate: {events}");
}

/// §6: an App asking for a pod annotation the platform reserves (here: out of the mesh) is
/// refused as a whole, naming the field and the key; without it, the App runs.
async fn reserved_pod_annotations_are_refused(client: Client) {
    let (t, ns) = (unique("ten-annot"), unique("annot"));
    create_tenant(&client, &t, json!({"namespaces": [ns]})).await;
    wait_state(&client, &t, &ns, NamespaceState::Onboarded).await;
    let apps: Api<App> = Api::namespaced(client.clone(), &ns);
    let app: App = serde_json::from_value(json!({
        "apiVersion": "flotilla.dev/v1beta1", "kind": "App", "metadata": {"name": "web", "namespace": ns},
        "spec": {"image": "registry.example.com/shop/web", "version": "1.0.0", "replicas": 1,
                 "podAnnotations": {"sidecar.istio.io/inject": "false", "example.com/team": "shop"}},
    }))
    .expect("app");
    apps.create(&PostParams::default(), &app).await.expect("creating App");
    let message = wait_for(SETTLE, "App refused for its pod annotation", || async {
        let status = apps.get("web").await.ok()?.status?;
        let ready = status.conditions.into_iter().find(|c| c.type_ == "Ready")?;
        (ready.status == "False" && ready.reason == "PodAnnotationDenied").then_some(ready.message)
    })
    .await;
    assert!(
        message.contains("spec.podAnnotations: sidecar.istio.io/inject may not be set"),
        "the message names the field and only the refused key: {message}"
    );
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    assert!(deployments.get_opt("web").await.expect("get").is_none(), "nothing of the refused App is applied");
    // One Warning Event, not one per reconcile: look again after the App was reconciled anew.
    let denied = r#"jsonpath={range .items[?(@.reason=="PodAnnotationDenied")]}{.series.count}{"|"}{end}"#;
    wait_for(SETTLE, "the PodAnnotationDenied Event", || async {
        let (_, out) = kubectl_try(&["-n", &ns, "get", "events.v1.events.k8s.io", "-o", denied]);
        out.contains('|').then_some(())
    })
    .await;
    apps.patch("web", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"poke": "1"}}})))
        .await
        .expect("labelling the App");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (_, events) = kubectl_try(&["-n", &ns, "get", "events.v1.events.k8s.io", "-o", denied]);
    assert_eq!(events, "|", "one Warning Event, never repeated (series counts between the bars): {events}");

    apps.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"podAnnotations": {"sidecar.istio.io/inject": null}}})),
    )
    .await
    .expect("removing the annotation");
    let d = wait_for(SETTLE, "the App's Deployment once the annotation is gone", || async {
        deployments.get_opt("web").await.ok().flatten()
    })
    .await;
    let annotations = d.spec.and_then(|s| s.template.metadata).and_then(|m| m.annotations).unwrap_or_default();
    assert_eq!(annotations.get("example.com/team").map(String::as_str), Some("shop"), "{annotations:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tenant_boundary_holds() {
    let client = admin_client().await;
    install_crds(&client).await;
    let kubeconfig = operator_kubeconfig("hostile-tenancy");
    let operator = client_of(&kubeconfig).await;
    let allowed = unique("ingress");
    let monitoring = unique("monitoring");
    let egress =
        ["--network-policy-egress-denied-namespaces", &monitoring, "--network-policy-cluster-cidrs", "10.0.0.0/8"];
    let args: Vec<&str> = ["--network-policy-allowed-namespaces", &allowed].into_iter().chain(egress).collect();
    let _operator = Operator::start_with(&kubeconfig, &args, "hostile-tenancy").await;
    tokio::join!(
        foreign_namespace_needs_adoption(client.clone()),
        protected_namespaces_are_never_claimed(client.clone(), allowed.clone()),
        ownership_never_moves(client.clone()),
        operator_token_is_fenced(client.clone(), operator.clone()),
        operator_token_cannot_rewrite_tenants(client.clone(), operator),
        namespace_creator_cannot_forge_trusted_labels(client.clone(), monitoring.clone()),
        tenant_pod_policy_is_enforced(client.clone()),
        restricted_tenant_runs_flotillas_pods(client.clone()),
        reserved_pod_annotations_are_refused(client.clone()),
    );
}
