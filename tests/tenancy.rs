//! End to end, with the operator authenticated as its ServiceAccount (a TokenRequest token)
//! and exactly the rbac/ manifests applied: onboarding, refusal of un-onboarded namespaces,
//! least privilege, offboarding, conflicts, tenant admins, schema validation, quotas and the
//! apiserver's shard fence.
//! One operator serves all scenarios, which run concurrently on distinct tenants.

mod support;

use flotilla::api::{App, AppPhase, NamespaceState, Tenant};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, ResourceQuota};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::Client;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::time::Duration;
use support::{
    Operator, admin_client, audit_events_in, install_crds, kubectl_ok, kubectl_try, operator_kubeconfig, unique,
    wait_for,
};

const SETTLE: Duration = Duration::from_secs(60);
const OPERATOR_SA: &str = "system:serviceaccount:flotilla-system:flotilla";

async fn create_tenant(client: &Client, name: &str, spec: Value) -> Tenant {
    let t: Tenant = serde_json::from_value(json!({
        "apiVersion": "flotilla.dev/v1beta1", "kind": "Tenant", "metadata": {"name": name}, "spec": spec,
    }))
    .expect("tenant");
    Api::<Tenant>::all(client.clone()).create(&PostParams::default(), &t).await.expect("creating Tenant")
}

async fn namespace_state(client: &Client, tenant: &str, ns: &str) -> Option<NamespaceState> {
    let t = Api::<Tenant>::all(client.clone()).get(tenant).await.ok()?;
    t.status?.namespaces.into_iter().find(|n| n.name == ns).map(|n| n.state)
}

async fn wait_state(client: &Client, tenant: &str, ns: &str, state: NamespaceState) {
    wait_for(SETTLE, &format!("tenant {tenant}: namespace {ns} {state:?}"), || async {
        (namespace_state(client, tenant, ns).await == Some(state)).then_some(())
    })
    .await;
}

async fn create_app(client: &Client, ns: &str, name: &str, replicas: i32) {
    let app: App = serde_json::from_value(json!({
        "apiVersion": "flotilla.dev/v1beta1", "kind": "App", "metadata": {"name": name, "namespace": ns},
        "spec": {"image": "registry.example.com/shop/web", "version": "1.0.0", "replicas": replicas},
    }))
    .expect("app");
    Api::<App>::namespaced(client.clone(), ns).create(&PostParams::default(), &app).await.expect("creating App");
}

async fn wait_app_healthy(client: &Client, ns: &str, name: &str) {
    let apps: Api<App> = Api::namespaced(client.clone(), ns);
    wait_for(SETTLE, &format!("App {ns}/{name} Healthy"), || async {
        let s = apps.get(name).await.ok()?.status?;
        (s.phase == Some(AppPhase::Healthy)).then_some(())
    })
    .await;
}

fn can_i(verb_resource: &[&str], namespace: Option<&str>) -> bool {
    let mut args = vec!["auth", "can-i"];
    args.extend_from_slice(verb_resource);
    args.extend_from_slice(&["--as", OPERATOR_SA]);
    match namespace {
        Some(ns) => args.extend_from_slice(&["-n", ns]),
        None => args.push("--all-namespaces"),
    }
    let (_, out) = kubectl_try(&args);
    out.trim() == "yes"
}

/// 1 and 3: two namespaces onboarded, bindings and quota there, an App converges, and the
/// operator's rights are namespaced.
async fn onboarding_and_least_privilege(client: Client) {
    let (t, a, b) = (unique("ten-on"), unique("on-a"), unique("on-b"));
    create_tenant(&client, &t, json!({"namespaces": [a, b], "admins": [{"kind": "Group", "name": "team-on"}], "quota": {"hard": {"pods": "50"}}})).await;
    for ns in [&a, &b] {
        wait_state(&client, &t, ns, NamespaceState::Onboarded).await;
        let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), ns);
        let op = bindings.get("flotilla-operator").await.expect("operator RoleBinding");
        assert_eq!(op.role_ref.name, "flotilla-tenant-workloads");
        assert!(bindings.get("flotilla-tenant-admins").await.is_ok(), "admin RoleBinding in {ns}");
        let quota = Api::<ResourceQuota>::namespaced(client.clone(), ns).get("flotilla-tenant").await.expect("quota");
        assert_eq!(
            quota.spec.and_then(|s| s.hard).and_then(|h| h.get("pods").map(|q| q.0.clone())).as_deref(),
            Some("50")
        );
        let nsobj = Api::<Namespace>::all(client.clone()).get(ns).await.expect("namespace");
        assert_eq!(
            nsobj.metadata.labels.and_then(|l| l.get("flotilla.dev/tenant").cloned()).as_deref(),
            Some(t.as_str())
        );
    }
    let tenant = Api::<Tenant>::all(client.clone()).get(&t).await.expect("tenant");
    let ready =
        tenant.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready").cloned()).expect("Ready");
    assert_eq!(ready.status, "True");
    create_app(&client, &a, "web", 2).await;
    wait_app_healthy(&client, &a, "web").await;

    for resource in
        ["deployments", "horizontalpodautoscalers", "pods", "replicasets", "services", "secrets", "configmaps"]
    {
        assert!(!can_i(&["list", resource], None), "operator must not list {resource} cluster-wide");
        assert!(!can_i(&["get", resource], None), "operator must not get {resource} cluster-wide");
    }
    assert!(!can_i(&["create", "deployments"], None), "no cluster-wide create of deployments");
    assert!(can_i(&["create", "deployments"], Some(&a)), "create deployments in onboarded {a}");
    assert!(can_i(&["watch", "deployments"], Some(&b)), "watch deployments in onboarded {b}");
    assert!(!can_i(&["create", "deployments"], Some("kube-system")), "no create of deployments in kube-system");
    // ConfigMaps are read (metadata, for config rollouts), never written; Secrets not at all.
    assert!(can_i(&["watch", "configmaps"], Some(&a)), "watch configmaps in onboarded {a}");
    assert!(!can_i(&["update", "configmaps"], Some(&a)), "no write of configmaps in {a}");
    assert!(!can_i(&["get", "secrets"], Some(&a)), "no read of secrets in {a}");
    assert!(!can_i(&["bind", "clusterroles/cluster-admin"], None), "cannot bind cluster-admin");
    // A routed canary's HTTPRoute: read and patched (two weights) in onboarded namespaces only,
    // never created, listed or deleted.
    // Quotas are listed (before a blue-green preview is created), never written.
    assert!(can_i(&["list", "resourcequotas"], Some(&a)), "list resourcequotas in onboarded {a}");
    assert!(!can_i(&["update", "resourcequotas"], Some(&a)), "no write of resourcequotas in {a}");
    // With the Gateway API installed, so that kubectl knows the resource (it answers with a
    // warning, not yes or no, for one it does not).
    support::install_gateway_api();
    let routes = "httproutes.gateway.networking.k8s.io";
    assert!(can_i(&["patch", routes], Some(&a)), "patch httproutes in onboarded {a}");
    assert!(can_i(&["get", routes], Some(&b)), "get httproutes in onboarded {b}");
    assert!(!can_i(&["patch", routes], Some("kube-system")), "no patch of httproutes in kube-system");
    assert!(!can_i(&["get", routes], None), "no cluster-wide read of httproutes");
    for verb in ["create", "list", "delete"] {
        assert!(!can_i(&[verb, routes], Some(&a)), "no {verb} of httproutes in {a}");
    }
}

/// 2: an App in a namespace of no tenant: nothing is created, the reason is visible, no storm.
async fn unonboarded_namespace_is_refused(client: Client) {
    let ns = unique("nobody");
    kubectl_ok(&["create", "namespace", &ns]);
    create_app(&client, &ns, "orphan", 1).await;
    let apps: Api<App> = Api::namespaced(client.clone(), &ns);
    let app = wait_for(SETTLE, "App marked NamespaceNotOnboarded", || async {
        let app = apps.get("orphan").await.ok()?;
        let ready = app.status.as_ref()?.conditions.iter().find(|c| c.type_ == "Ready")?.clone();
        (ready.reason == "NamespaceNotOnboarded").then_some(app)
    })
    .await;
    assert_eq!(app.status.as_ref().and_then(|s| s.phase), Some(AppPhase::Degraded));
    // The Event is recorded right after the status write.
    wait_for(Duration::from_secs(10), "a NamespaceNotOnboarded Warning Event on the App", || async {
        let (_, events) = kubectl_try(&["-n", &ns, "get", "events", "-o", "jsonpath={.items[*].reason}"]);
        events.contains("NamespaceNotOnboarded").then_some(())
    })
    .await;
    assert!(Api::<Deployment>::namespaced(client.clone(), &ns).get_opt("orphan").await.expect("get").is_none());

    let before = audit_events_in(&ns).len();
    let rv = apps.get("orphan").await.expect("app").metadata.resource_version;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let after = audit_events_in(&ns);
    assert!(
        after.len() - before <= 2,
        "the operator sent {} requests touching {ns} in 30 s; want at most 2 (no retry storm)",
        after.len() - before
    );
    assert_eq!(apps.get("orphan").await.expect("app").metadata.resource_version, rv, "App not rewritten while idle");
    kubectl_ok(&["delete", "namespace", &ns, "--wait=false"]);
}

/// 4: offboarding one namespace ends the operator's access there and keeps the workloads; deleting
/// the Tenant offboards the rest through its finalizer.
async fn offboarding(client: Client) {
    let (t, keep, leave) = (unique("ten-off"), unique("off-keep"), unique("off-leave"));
    create_tenant(&client, &t, json!({"namespaces": [keep, leave]})).await;
    wait_state(&client, &t, &leave, NamespaceState::Onboarded).await;
    create_app(&client, &leave, "stays", 1).await;
    wait_app_healthy(&client, &leave, "stays").await;

    let tenants: Api<Tenant> = Api::all(client.clone());
    tenants
        .patch(&t, &PatchParams::default(), &Patch::Merge(json!({"spec": {"namespaces": [keep]}})))
        .await
        .expect("patch");
    wait_state(&client, &t, &leave, NamespaceState::Offboarded).await;
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), &leave);
    assert!(bindings.get_opt("flotilla-operator").await.expect("get").is_none(), "operator RoleBinding removed");
    let (ok, out) = kubectl_try(&[
        "-n",
        &leave,
        "--as",
        OPERATOR_SA,
        "create",
        "deployment",
        "probe",
        "--image=registry.example.com/x:1",
    ]);
    assert!(!ok && out.contains("forbidden"), "a write as the operator is refused after offboarding: {out}");
    assert!(Api::<App>::namespaced(client.clone(), &leave).get("stays").await.is_ok(), "App left in place");
    // The guard skipped this namespace while it was onboarded; it lists Apps again once the
    // namespace left the onboarded set, and says why nothing happens there any more.
    let left: Api<App> = Api::namespaced(client.clone(), &leave);
    wait_for(SETTLE, "the offboarded namespace's App marked NamespaceNotOnboarded", || async {
        let app = left.get("stays").await.ok()?;
        let ready = app.status.as_ref()?.conditions.iter().find(|c| c.type_ == "Ready")?.clone();
        (ready.reason == "NamespaceNotOnboarded").then_some(())
    })
    .await;
    assert!(
        Api::<Deployment>::namespaced(client.clone(), &leave).get("stays").await.is_ok(),
        "Deployment left in place"
    );
    let (_, events) = kubectl_try(&[
        "get",
        "events",
        "-A",
        "--field-selector",
        &format!("involvedObject.name={t}"),
        "-o",
        "jsonpath={.items[*].reason}",
    ]);
    assert!(events.contains("Offboarded"), "Offboarded Event; got {events}");

    tenants.delete(&t, &DeleteParams::default()).await.expect("delete tenant");
    wait_for(SETTLE, "Tenant gone after its finalizer ran", || async {
        tenants.get_opt(&t).await.ok().flatten().is_none().then_some(())
    })
    .await;
    let kept: Api<RoleBinding> = Api::namespaced(client.clone(), &keep);
    assert!(kept.get_opt("flotilla-operator").await.expect("get").is_none(), "finalizer removed the RoleBinding");
    assert!(Api::<Namespace>::all(client.clone()).get(&keep).await.is_ok(), "namespace kept");
}

/// 5: a second tenant claiming a namespace gets Conflict; the first keeps it and keeps working.
async fn conflicting_claims(client: Client) {
    let (first, second, shared) = (unique("ten-first"), unique("ten-second"), unique("shared"));
    create_tenant(&client, &first, json!({"namespaces": [shared]})).await;
    wait_state(&client, &first, &shared, NamespaceState::Onboarded).await;
    create_tenant(&client, &second, json!({"namespaces": [shared]})).await;
    wait_state(&client, &second, &shared, NamespaceState::Conflict).await;
    let t = Api::<Tenant>::all(client.clone()).get(&second).await.expect("tenant");
    let msg = t
        .status
        .and_then(|s| s.namespaces.into_iter().find(|n| n.name == shared))
        .map(|n| n.message)
        .unwrap_or_default();
    assert!(msg.contains(&first), "conflict names the owner: {msg}");
    assert_eq!(namespace_state(&client, &first, &shared).await, Some(NamespaceState::Onboarded));
    create_app(&client, &shared, "owner-app", 1).await;
    wait_app_healthy(&client, &shared, "owner-app").await;
}

/// 6: a tenant admin can manage Apps in the tenant's namespaces and not in another tenant's.
async fn tenant_admins(client: Client) {
    let (t, other_t, mine, theirs) = (unique("ten-adm"), unique("ten-other"), unique("adm-mine"), unique("adm-theirs"));
    create_tenant(&client, &t, json!({"namespaces": [mine], "admins": [{"kind": "Group", "name": "team-adm"}]})).await;
    create_tenant(
        &client,
        &other_t,
        json!({"namespaces": [theirs], "admins": [{"kind": "Group", "name": "team-other"}]}),
    )
    .await;
    wait_state(&client, &t, &mine, NamespaceState::Onboarded).await;
    wait_state(&client, &other_t, &theirs, NamespaceState::Onboarded).await;
    let manifest = |ns: &str| {
        format!(
            r#"{{"apiVersion":"flotilla.dev/v1beta1","kind":"App","metadata":{{"name":"by-admin","namespace":"{ns}"}},"spec":{{"image":"registry.example.com/a","version":"1"}}}}"#
        )
    };
    for (ns, allowed) in [(&mine, true), (&theirs, false)] {
        let file = std::env::temp_dir().join(format!("{ns}-app.json"));
        std::fs::write(&file, manifest(ns)).expect("write");
        let (ok, out) =
            kubectl_try(&["--as", "alice", "--as-group", "team-adm", "create", "-f", &file.display().to_string()]);
        assert_eq!(ok, allowed, "alice (team-adm) creating an App in {ns}: {out}");
    }
}

/// 7: invalid Tenants are refused by the schema, naming the field.
async fn invalid_tenants(client: Client) {
    let ar = ApiResource::erase::<Tenant>(&());
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let cases = [
        ("bad namespace name", json!({"namespaces": ["Not_A_Label"]}), "spec.namespaces[0]"),
        ("reserved namespace", json!({"namespaces": ["kube-system"]}), "spec.namespaces"),
        ("default namespace", json!({"namespaces": ["default"]}), "spec.namespaces"),
        ("duplicate namespaces", json!({"namespaces": ["dup-a", "dup-a"]}), "spec.namespaces[1]"),
        ("negative quota", json!({"namespaces": ["q-neg"], "quota": {"hard": {"pods": "-1"}}}), "spec.quota.hard"),
        (
            "bad subject kind",
            json!({"namespaces": ["s-bad"], "admins": [{"kind": "Robot", "name": "r2"}]}),
            "spec.admins[0].kind",
        ),
        (
            "ServiceAccount without namespace",
            json!({"namespaces": ["s-sa"], "admins": [{"kind": "ServiceAccount", "name": "ci"}]}),
            "spec.admins[0].namespace",
        ),
        ("missing namespaces", json!({}), "spec.namespaces"),
    ];
    let mut failures = Vec::new();
    for (i, (what, spec, field)) in cases.iter().enumerate() {
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "flotilla.dev/v1beta1", "kind": "Tenant", "metadata": {"name": format!("invalid-{i}")}, "spec": spec,
        }))
        .expect("object");
        match api.create(&PostParams::default(), &obj).await {
            Ok(_) => failures.push(format!("{what}: accepted")),
            Err(kube::Error::Api(s)) if s.code == 422 && s.message.contains(field) => {}
            Err(e) => failures.push(format!("{what}: want 422 naming {field}, got {e}")),
        }
    }
    assert!(failures.is_empty(), "invalid Tenants not refused as expected:\n{}", failures.join("\n"));
}

/// 8: the quota is enforced, and an App whose pods exceed it says why it is not Ready.
async fn quota_is_enforced(client: Client) {
    let (t, ns) = (unique("ten-quota"), unique("quota"));
    create_tenant(&client, &t, json!({"namespaces": [ns], "quota": {"hard": {"pods": "2"}}})).await;
    wait_state(&client, &t, &ns, NamespaceState::Onboarded).await;
    create_app(&client, &ns, "big", 3).await;
    let apps: Api<App> = Api::namespaced(client.clone(), &ns);
    wait_for(Duration::from_secs(90), "App reports the exceeded quota", || async {
        let s = apps.get("big").await.ok()?.status?;
        let ready = s.conditions.iter().find(|c| c.type_ == "Ready")?;
        (ready.status == "False" && ready.message.contains("exceeded quota")).then_some(())
    })
    .await;
}

/// The apiserver's shard fence (rbac/shard-fence.yaml): in a tenant namespace, a write from
/// a replica that does not hold the namespace's shard Lease is refused by the apiserver
/// itself, whatever the write (here a create, which no precondition can guard); the holder's
/// is admitted. A replica whose token is bound to another Pod than its id refuses to start.
async fn shard_fence(client: Client) {
    let tenant = unique("fence");
    let ns = format!("{tenant}-a");
    create_tenant(&client, &tenant, json!({"namespaces": [ns]})).await;
    wait_state(&client, &tenant, &ns, NamespaceState::Onboarded).await;
    let shard = flotilla::sharding::shard_of(&ns, 32);
    let labelled = Api::<Namespace>::all(client.clone()).get(&ns).await.expect("namespace");
    assert_eq!(
        labelled.metadata.labels.unwrap_or_default().get("flotilla.dev/shard"),
        Some(&shard.to_string()),
        "the Tenant controller labels the namespace with its shard"
    );
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(client.clone(), "flotilla-system");
    let lease = format!("flotilla-shard-{shard}");
    let held_by_tenancy = |lease: String| {
        let leases = leases.clone();
        async move {
            wait_for(SETTLE, &format!("{lease} held by replica tenancy"), || async {
                let held = leases.get(&lease).await.ok()?.spec?.holder_identity?;
                (held == "tenancy").then_some(())
            })
            .await
        }
    };
    held_by_tenancy(lease.clone()).await;
    let write_as = |kubeconfig: &std::path::Path, ns: &str| {
        let out = std::process::Command::new(support::kubectl())
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args([
                "-n",
                ns,
                "create",
                "deployment",
                "late-write",
                "--image=registry.example.com/x",
                "--dry-run=server",
            ])
            .output()
            .expect("running kubectl");
        (
            out.status.success(),
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
        )
    };
    let impostor = operator_kubeconfig("fence-impostor");
    let (ok, out) = write_as(&impostor, &ns);
    assert!(!ok, "a replica that does not hold {lease} wrote in {ns}: {out}");
    assert!(
        out.contains(&format!("flotilla-shard-fence: replica fence-impostor does not hold shard Lease {lease}"))
            && out.contains("held by tenancy"),
        "refused by the shard fence, naming the replica, the Lease and its holder: {out}"
    );
    let holder = operator_kubeconfig("tenancy");
    let (ok, out) = write_as(&holder, &ns);
    assert!(ok, "the holder of {lease} may write in {ns}: {out}");

    // A namespace of a shard that has no binding (bindings made for fewer shards than the
    // operator runs with) is shut: no replica's write passes, whoever holds what.
    let workloads_namespace = |name: String, labels: Value| {
        let client = client.clone();
        async move {
            let namespace: Namespace =
                serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).expect("namespace");
            Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &namespace).await.expect("namespace");
            let rights: RoleBinding = serde_json::from_value(json!({"metadata": {"name": "workloads", "namespace": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "flotilla-tenant-workloads"},
                "subjects": [{"kind": "ServiceAccount", "name": "flotilla", "namespace": "flotilla-system"}]}))
            .expect("role binding");
            Api::<RoleBinding>::namespaced(client, &name)
                .create(&PostParams::default(), &rights)
                .await
                .expect("rights");
        }
    };
    let unbound = format!("{tenant}-unbound");
    workloads_namespace(unbound.clone(), json!({"flotilla.dev/tenant": tenant, "flotilla.dev/shard": "40"})).await;
    let (ok, out) = write_as(&holder, &unbound);
    let _ = Api::<Namespace>::all(client.clone()).delete(&unbound, &DeleteParams::default()).await;
    assert!(!ok, "a replica wrote in {unbound}, of shard 40, which has no binding: {out}");
    assert!(
        out.contains(&format!("namespace {unbound} is in shard 40, which has no flotilla-shard-fence binding")),
        "refused by flotilla-shard-fence-unbound, saying why: {out}"
    );

    // A binding whose Lease is not the namespace's shard's (what the apiserver meets when a
    // namespace is relabelled between its look at the bindings and its look at the
    // namespace) refuses, even when that Lease's holder is the writer.
    let other = format!("flotilla-shard-{}", (shard + 1) % 32);
    held_by_tenancy(other.clone()).await;
    let stray = format!("{tenant}-stray");
    workloads_namespace(
        stray.clone(),
        json!({"flotilla.dev/tenant": tenant, "flotilla.dev/shard": shard.to_string(), "flotilla.dev/fence-test": tenant}),
    )
    .await;
    let bindings = Api::<DynamicObject>::all_with(
        client.clone(),
        &ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingAdmissionPolicyBinding",
        )),
    );
    let binding: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": stray},
        "spec": {"policyName": "flotilla-shard-fence-per-shard", "validationActions": ["Deny"],
            "paramRef": {"name": other, "namespace": "flotilla-system", "parameterNotFoundAction": "Allow"},
            "matchResources": {"namespaceSelector": {"matchLabels": {"flotilla.dev/fence-test": tenant}}}}}))
    .expect("binding");
    bindings.create(&PostParams::default(), &binding).await.expect("stray binding");
    // The apiserver sees a new binding within a moment: the write is refused once it does.
    let refused = wait_for(Duration::from_secs(20), "the write refused through the stray binding", || async {
        let (ok, out) = write_as(&holder, &stray);
        (!ok).then_some(out)
    })
    .await;
    let _ = bindings.delete(&stray, &DeleteParams::default()).await;
    let _ = Api::<Namespace>::all(client.clone()).delete(&stray, &DeleteParams::default()).await;
    assert!(
        refused.contains(&format!(
            "namespace {stray} is in shard Lease flotilla-shard-{shard} but met the binding of {other}"
        )),
        "refused by the per-shard policy, naming both Leases: {refused}"
    );

    // A replica id that is not the Pod its token is bound to would have every write refused:
    // the replica says so and exits instead of running fenced out of everything.
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["run", "--replica-id", "not-the-pod", "--admin-addr", "127.0.0.1:0", "--webhook-addr", "127.0.0.1:0"])
        .args(["--memory-budget", "unlimited", "--kubeconfig"])
        .arg(&impostor)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("a replica with a mismatched token exits within 30 s")
        .expect("running the operator");
    let text = String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "a replica with a token bound to another Pod started: {text}");
    assert!(text.contains("bound to Pod fence-impostor") && text.contains("replica id is not-the-pod"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenancy_under_real_rbac() {
    let client = admin_client().await;
    install_crds(&client).await;
    let kubeconfig = operator_kubeconfig("tenancy");
    let _operator = Operator::start_with(&kubeconfig, &[], "tenancy").await;
    tokio::join!(
        onboarding_and_least_privilege(client.clone()),
        unonboarded_namespace_is_refused(client.clone()),
        offboarding(client.clone()),
        conflicting_claims(client.clone()),
        tenant_admins(client.clone()),
        invalid_tenants(client.clone()),
        quota_is_enforced(client.clone()),
        shard_fence(client.clone()),
    );
}
