//! End to end, with the operator authenticated as its ServiceAccount: an App that says what
//! a team really runs (env, envFrom of a ConfigMap, a volume, a readiness probe, a sidecar)
//! runs in a namespace whose quota asks for CPU requests, because the Tenant's LimitRange
//! gives its containers defaults; a change of its template reaches the pods; templates that
//! take what Flotilla owns are refused naming the field; a privileged template gets no pod
//! (Pod Security Admission) and the App says why; the Tenant's LimitRange and
//! NetworkPolicy follow its namespaces. Scenarios run concurrently on distinct tenants.

mod support;

use flotilla::api::{App, AppPhase, NamespaceState, Tenant};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, LimitRange, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use std::time::Duration;
use support::{Operator, admin_client, install_crds, operator_kubeconfig, unique, wait_for};

/// Each wait below took at most a few seconds in a run (the whole test 9.2 s).
const SETTLE: Duration = Duration::from_secs(30);

async fn create_tenant(client: &Client, name: &str, spec: Value) {
    let t: Tenant = serde_json::from_value(json!({
        "apiVersion": "flotilla.dev/v1beta1", "kind": "Tenant", "metadata": {"name": name}, "spec": spec,
    }))
    .expect("tenant");
    Api::<Tenant>::all(client.clone()).create(&PostParams::default(), &t).await.expect("creating Tenant");
}

async fn patch_tenant(client: &Client, name: &str, spec: Value) {
    Api::<Tenant>::all(client.clone())
        .patch(name, &PatchParams::default(), &Patch::Merge(&json!({"spec": spec})))
        .await
        .expect("patching Tenant");
}

async fn wait_onboarded(client: &Client, tenant: &str, ns: &str) {
    wait_for(SETTLE, &format!("tenant {tenant}: namespace {ns} onboarded"), || async {
        let t = Api::<Tenant>::all(client.clone()).get(tenant).await.ok()?;
        t.status?.namespaces.iter().any(|n| n.name == ns && n.state == NamespaceState::Onboarded).then_some(())
    })
    .await;
}

fn app(name: &str, template: Value) -> App {
    serde_json::from_value(json!({
        "apiVersion": "flotilla.dev/v1beta1", "kind": "App", "metadata": {"name": name},
        "spec": {"image": "registry.example.com/shop/checkout", "version": "1.0.0", "replicas": 2, "template": template},
    }))
    .expect("App")
}

/// The template of the docs' checkout App: what a team's first service needs.
fn checkout_template(mode: &str) -> Value {
    json!({
        "metadata": {"labels": {"team": "payments"}},
        "spec": {
            "volumes": [{"name": "config", "configMap": {"name": "checkout-config"}}],
            "containers": [
                {
                    "name": "app",
                    "env": [{"name": "MODE", "value": mode}],
                    "envFrom": [{"configMapRef": {"name": "checkout-config"}}],
                    "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, "periodSeconds": 5},
                    "volumeMounts": [{"name": "config", "mountPath": "/etc/checkout", "readOnly": true}],
                },
                {
                    "name": "proxy",
                    "image": "registry.example.com/platform/proxy:2.1",
                    "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"cpu": "200m", "memory": "64Mi"}},
                },
            ],
        },
    })
}

fn env_of(d: &Deployment, container: &str) -> Vec<(String, String)> {
    d.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.iter().find(|c| c.name == container))
        .and_then(|c| c.env.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|e| (e.name, e.value.unwrap_or_default()))
        .collect()
}

async fn ready_pods(client: &Client, ns: &str, app: &str) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let list = pods.list(&ListParams::default().labels(&format!("app.kubernetes.io/name={app}"))).await;
    list.map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .collect()
}

/// An App with a full template runs in a namespace whose quota requires CPU requests: the
/// LimitRange gives the main container (which sets none) its requests. A change of an env
/// var reaches every pod.
async fn a_real_service_runs_under_quota(client: Client) {
    let (t, ns) = (unique("ten-work"), unique("work"));
    // The quota example of docs/operations.md, with the LimitRange that makes it work.
    create_tenant(
        &client,
        &t,
        json!({
            "namespaces": [ns],
            "quota": {"hard": {"requests.cpu": "20", "requests.memory": "64Gi", "pods": "50"}},
            "limitRange": {
                "defaultRequest": {"cpu": "100m", "memory": "128Mi"},
                "default": {"cpu": "500m", "memory": "256Mi"},
                "max": {"cpu": "4", "memory": "8Gi"},
            },
        }),
    )
    .await;
    wait_onboarded(&client, &t, &ns).await;
    let limits = Api::<LimitRange>::namespaced(client.clone(), &ns).get("flotilla-tenant").await.expect("LimitRange");
    let item = &limits.spec.expect("spec").limits[0];
    assert_eq!(item.default_request.as_ref().and_then(|d| d.get("cpu")), Some(&Quantity("100m".into())));
    let config: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "checkout-config"}, "data": {"CURRENCY": "EUR", "checkout.yaml": "retries: 3\n"},
    }))
    .expect("ConfigMap");
    Api::<ConfigMap>::namespaced(client.clone(), &ns).create(&PostParams::default(), &config).await.expect("ConfigMap");
    let apps: Api<App> = Api::namespaced(client.clone(), &ns);
    apps.create(&PostParams::default(), &app("checkout", checkout_template("live"))).await.expect("creating App");
    wait_for(SETTLE, "App checkout Healthy with 2 pods ready", || async {
        let s = apps.get("checkout").await.ok()?.status?;
        (s.phase == Some(AppPhase::Healthy) && ready_pods(&client, &ns, "checkout").await.len() == 2).then_some(())
    })
    .await;

    // The Deployment carries exactly the template, with Flotilla's image, port and labels.
    let d = Api::<Deployment>::namespaced(client.clone(), &ns).get("checkout").await.expect("Deployment");
    let pod = d.spec.as_ref().and_then(|s| s.template.spec.clone()).expect("pod spec");
    let names: Vec<&str> = pod.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["app", "proxy"]);
    let main = &pod.containers[0];
    assert_eq!(main.image.as_deref(), Some("registry.example.com/shop/checkout:1.0.0"));
    assert_eq!(main.ports.as_ref().and_then(|p| p.first()).and_then(|p| p.name.as_deref()), Some("http"));
    assert!(main.readiness_probe.is_some(), "readiness probe kept");
    assert_eq!(main.env_from.as_ref().map(Vec::len), Some(1), "envFrom kept");
    assert_eq!(pod.volumes.as_ref().map(|v| v[0].name.as_str()), Some("config"));
    assert_eq!(pod.containers[1].image.as_deref(), Some("registry.example.com/platform/proxy:2.1"));
    assert_eq!(env_of(&d, "app"), [("MODE".to_string(), "live".to_string())]);
    let labels = d.spec.as_ref().and_then(|s| s.template.metadata.as_ref()).and_then(|m| m.labels.clone());
    assert_eq!(labels.as_ref().and_then(|l| l.get("team")).map(String::as_str), Some("payments"));
    assert_eq!(labels.as_ref().and_then(|l| l.get("app.kubernetes.io/name")).map(String::as_str), Some("checkout"));
    // The pods got the LimitRange's requests where the template set none; the sidecar kept its own.
    let pods = ready_pods(&client, &ns, "checkout").await;
    let requests = |p: &Pod, c: &str| {
        p.spec
            .as_ref()
            .and_then(|s| s.containers.iter().find(|x| x.name == c))
            .and_then(|c| c.resources.as_ref()?.requests.as_ref()?.get("cpu").map(|q| q.0.clone()))
    };
    assert_eq!(requests(&pods[0], "app").as_deref(), Some("100m"));
    assert_eq!(requests(&pods[0], "proxy").as_deref(), Some("50m"));

    // A template change (one env var) rolls the pods.
    apps.patch(
        "checkout",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"template": checkout_template("dry-run")}})),
    )
    .await
    .expect("changing the template");
    wait_for(SETTLE, "every checkout pod runs MODE=dry-run", || async {
        let pods = ready_pods(&client, &ns, "checkout").await;
        let all_new = pods.len() == 2
            && pods.iter().all(|p| {
                p.spec.as_ref().and_then(|s| s.containers.iter().find(|c| c.name == "app")).is_some_and(|c| {
                    c.env.iter().flatten().any(|e| e.name == "MODE" && e.value.as_deref() == Some("dry-run"))
                })
            });
        let s = apps.get("checkout").await.ok()?.status?;
        (all_new && s.phase == Some(AppPhase::Healthy)).then_some(())
    })
    .await;
}

/// Templates that take what Flotilla owns, or that leave the main container ambiguous, are
/// refused by the CRD with a message naming the field.
async fn owned_fields_are_refused(client: Client) {
    let ns = unique("refuse");
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let object = serde_json::from_value(json!({"metadata": {"name": ns}})).expect("namespace");
    namespaces.create(&PostParams::default(), &object).await.expect("namespace");
    let apps: Api<App> = Api::namespaced(client.clone(), &ns);
    let cases = [
        (
            "two containers, none named app",
            json!({"spec": {"containers": [{"name": "web", "image": "a:1"}, {"name": "proxy", "image": "b:1"}]}}),
            "spec.template.spec.containers: with more than one container, one must be named app",
        ),
        (
            "the main container's image",
            json!({"spec": {"containers": [{"name": "app", "image": "evil:latest"}]}}),
            "spec.template.spec.containers: the main container (named app, or the only one) must not set image",
        ),
        (
            "a selector label",
            json!({"metadata": {"labels": {"app.kubernetes.io/name": "other"}}, "spec": {"containers": [{"name": "app"}]}}),
            "spec.template.metadata.labels: app.kubernetes.io/name",
        ),
        (
            "a track label",
            json!({"metadata": {"labels": {"flotilla.dev/track": "stable"}}, "spec": {"containers": [{"name": "app"}]}}),
            "spec.template.metadata.labels",
        ),
    ];
    for (what, template, message) in cases {
        let err = apps.create(&PostParams::default(), &app("bad", template)).await.expect_err(what);
        let text = err.to_string();
        assert!(text.contains(message), "{what}: refused with {text:?}, want {message:?}");
    }
    let _ = namespaces.delete(&ns, &Default::default()).await;
}

/// The message of App `name`'s condition `type_` once its reason is `reason`.
async fn wait_for_condition(apps: &Api<App>, name: &str, type_: &str, reason: &str) -> String {
    wait_for(SETTLE, &format!("App {name}: {type_} with reason {reason}"), || async {
        let a = apps.get(name).await.ok()?;
        let c = a.status?.conditions.into_iter().find(|c| c.type_ == type_)?;
        (c.reason == reason).then_some(c.message)
    })
    .await
}

/// Hostile templates. Pods on the host's network, privileged, with a host path: The operator
/// writes the Deployment (the template is the tenant's to choose), and kube-apiserver's Pod
/// Security Admission (`enforce: baseline`, the Tenant's default) refuses every pod; the App
/// says so, naming the refusal. A template too large to keep a copy of: refused by the operator.
async fn a_privileged_template_gets_no_pod(client: Client) {
    let (t, ns) = (unique("ten-priv"), unique("priv"));
    create_tenant(&client, &t, json!({"namespaces": [ns]})).await;
    wait_onboarded(&client, &t, &ns).await;
    let template = json!({"spec": {
        "hostNetwork": true,
        "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
        "containers": [{
            "name": "app",
            "securityContext": {"privileged": true, "runAsNonRoot": false, "allowPrivilegeEscalation": true},
            "volumeMounts": [{"name": "root", "mountPath": "/host"}],
        }],
    }});
    let apps: Api<App> = Api::namespaced(client.clone(), &ns);
    apps.create(&PostParams::default(), &app("escape", template)).await.expect("the App is valid: PSA judges pods");
    let message = wait_for_condition(&apps, "escape", "Progressing", "ReplicaFailure").await;
    assert!(message.contains("violates PodSecurity \"baseline"), "the App names the refusal: {message}");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let list = pods.list(&ListParams::default()).await.expect("pods");
    assert!(list.items.is_empty(), "no pod of the privileged template may exist: {:?}", list.items.len());

    // A template of 80 KiB (the limit is 64 KiB): refused by the operator, nothing written.
    let env: Vec<Value> = (0..40).map(|i| json!({"name": format!("BLOB_{i}"), "value": "x".repeat(2048)})).collect();
    let huge = json!({"spec": {"containers": [{"name": "app", "env": env}]}});
    apps.create(&PostParams::default(), &app("huge", huge)).await.expect("the App is valid for the apiserver");
    let message = wait_for_condition(&apps, "huge", "Ready", "TemplateTooLarge").await;
    assert!(message.contains("spec.template is") && message.contains("65536"), "{message}");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    assert!(deployments.get_opt("huge").await.expect("reading").is_none(), "nothing of a refused App is written");
}

/// The LimitRange and the NetworkPolicy are in every namespace of the tenant, follow
/// namespaces joining and leaving, and go when the Tenant stops asking for them.
async fn policy_objects_follow_the_tenant(client: Client) {
    let (t, a, b) = (unique("ten-pol"), unique("pol-a"), unique("pol-b"));
    create_tenant(
        &client,
        &t,
        json!({
            "namespaces": [a],
            "limitRange": {"defaultRequest": {"cpu": "50m"}},
            "networkPolicy": {"allowFromNamespaces": ["ingress-nginx"]},
        }),
    )
    .await;
    wait_onboarded(&client, &t, &a).await;
    let policy = |ns: &str| Api::<NetworkPolicy>::namespaced(client.clone(), ns);
    let limits = |ns: &str| Api::<LimitRange>::namespaced(client.clone(), ns);
    let p = policy(&a).get("flotilla-tenant").await.expect("NetworkPolicy");
    let from = serde_json::to_value(p.spec.as_ref().and_then(|s| s.ingress.clone())).expect("json");
    assert_eq!(
        from,
        json!([{"from": [
            {"namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": [a]}],
                                   "matchLabels": {"flotilla.dev/tenant": t}}},
            {"namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["ingress-nginx", "monitoring"]}]}},
        ]}]),
        "the tenant's namespaces, the Tenant's and the operator's allowed namespaces"
    );
    // A hand edit that narrows the policy is undone; a limit the Tenant drops goes (the
    // desired object's fingerprint, not only "is everything asked for there").
    policy(&a)
        .patch(
            "flotilla-tenant",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"podSelector": {"matchLabels": {"only": "me"}}}})),
        )
        .await
        .expect("narrowing the NetworkPolicy by hand");
    patch_tenant(&client, &t, json!({"limitRange": {"defaultRequest": {"cpu": "50m"}, "max": {"cpu": "2"}}})).await;
    wait_for(SETTLE, "LimitRange with max", || async {
        let l = limits(&a).get("flotilla-tenant").await.ok()?;
        l.spec?.limits.first()?.max.as_ref()?.get("cpu").map(|_| ())
    })
    .await;
    // The same reconcile writes the LimitRange first, then the NetworkPolicy.
    wait_for(Duration::from_secs(10), "the narrowed podSelector put back", || async {
        let selector = policy(&a).get("flotilla-tenant").await.ok()?.spec.map(|s| s.pod_selector);
        selector.and_then(|s| s.and_then(|s| s.match_labels)).unwrap_or_default().is_empty().then_some(())
    })
    .await;
    patch_tenant(&client, &t, json!({"limitRange": {"defaultRequest": {"cpu": "50m"}, "max": null}})).await;
    wait_for(SETTLE, "max removed from the LimitRange", || async {
        let l = limits(&a).get("flotilla-tenant").await.ok()?;
        l.spec?.limits.first()?.max.is_none().then_some(())
    })
    .await;
    // A namespace joins: it gets both.
    patch_tenant(&client, &t, json!({"namespaces": [a, b]})).await;
    wait_onboarded(&client, &t, &b).await;
    wait_for(SETTLE, "NetworkPolicy and LimitRange in the joining namespace", || async {
        let p = policy(&b).get_opt("flotilla-tenant").await.ok().flatten()?;
        let l = limits(&b).get_opt("flotilla-tenant").await.ok().flatten()?;
        Some((p, l))
    })
    .await;
    // It leaves: both go (the namespace stays, Retain).
    patch_tenant(&client, &t, json!({"namespaces": [a]})).await;
    wait_for(SETTLE, "NetworkPolicy and LimitRange gone from the leaving namespace", || async {
        let p = policy(&b).get_opt("flotilla-tenant").await.ok()?;
        let l = limits(&b).get_opt("flotilla-tenant").await.ok()?;
        (p.is_none() && l.is_none()).then_some(())
    })
    .await;
    // The Tenant stops asking: isolation None and no limitRange remove them from a.
    patch_tenant(&client, &t, json!({"limitRange": null, "networkPolicy": {"isolation": "None"}})).await;
    wait_for(SETTLE, "NetworkPolicy and LimitRange removed when not asked for", || async {
        let p = policy(&a).get_opt("flotilla-tenant").await.ok()?;
        let l = limits(&a).get_opt("flotilla-tenant").await.ok()?;
        (p.is_none() && l.is_none()).then_some(())
    })
    .await;
    let owner = Api::<Tenant>::all(client.clone()).get(&t).await.expect("Tenant");
    assert!(owner.finalizers().iter().any(|f| f == "flotilla.dev/offboard"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apps_run_real_workloads_and_tenants_get_their_policy_objects() {
    let client = admin_client().await;
    install_crds(&client).await;
    let kubeconfig = operator_kubeconfig("workloads");
    let _operator = Operator::start_with(
        &kubeconfig,
        &["--network-policy-allowed-namespaces", "monitoring,ingress-nginx"],
        "workloads",
    )
    .await;
    tokio::join!(
        a_real_service_runs_under_quota(client.clone()),
        owned_fields_are_refused(client.clone()),
        policy_objects_follow_the_tenant(client.clone()),
        a_privileged_template_gets_no_pod(client.clone()),
    );
}
