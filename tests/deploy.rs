//! The install manifests are valid against a real apiserver: the kustomize base (CRDs,
//! namespace, ServiceAccount, rbac/, 3 replicas with anti-affinity, PodDisruptionBudget,
//! metrics Service) passes a server-side dry run, and the Helm chart in deploy/helm renders
//! the same objects with its default values and passes a dry run with its values set.

mod support;

use support::{helm, install_operator_rbac, kubectl_try, repo_root};

#[test]
fn kustomize_base_passes_a_server_side_dry_run() {
    // The namespace must exist for the namespaced objects of the dry run to be checked.
    install_operator_rbac();
    let base = support::repo_root().join("deploy/base");
    let base = base.to_str().expect("a UTF-8 path");
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

fn helm_template(args: &[&str]) -> String {
    let out = std::process::Command::new(helm())
        .args(["template", "flotilla"])
        .arg(repo_root().join("deploy/helm/flotilla"))
        .args(["--namespace", "flotilla-system", "--include-crds"])
        .args(args)
        .output()
        .expect("running helm");
    assert!(out.status.success(), "helm template failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// Objects of a YAML stream by (kind, namespace, name).
fn objects(yaml: &str) -> std::collections::BTreeMap<(String, String, String), serde_json::Value> {
    let mut out = std::collections::BTreeMap::new();
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let v: serde_json::Value = serde::Deserialize::deserialize(doc).expect("YAML document");
        if v.is_null() {
            continue;
        }
        let s = |p: &str| v.pointer(p).and_then(|x| x.as_str()).unwrap_or_default().to_string();
        out.insert((s("/kind"), s("/metadata/namespace"), s("/metadata/name")), v);
    }
    out
}

#[test]
fn the_helm_chart_with_default_values_renders_the_kustomize_base() {
    let base = kubectl_try(&["kustomize", support::repo_root().join("deploy/base").to_str().expect("a UTF-8 path")]);
    assert!(base.0, "kubectl kustomize deploy/base failed: {}", base.1);
    let mut kustomize = objects(&base.1);
    // Helm creates the release namespace (`--create-namespace`); kustomize has to.
    kustomize.remove(&("Namespace".to_string(), String::new(), "flotilla-system".to_string()));
    let chart = objects(&helm_template(&[]));
    let keys = |m: &std::collections::BTreeMap<(String, String, String), serde_json::Value>| {
        m.keys().cloned().collect::<Vec<_>>()
    };
    assert_eq!(keys(&chart), keys(&kustomize), "the same objects");
    let mut differences = Vec::new();
    for (key, object) in &kustomize {
        if let Some(rendered) = chart.get(key) {
            differences.extend(paths_that_differ("", rendered, object).into_iter().map(|p| format!("{key:?} at {p}")));
        }
    }
    assert!(differences.is_empty(), "the chart and the kustomize base differ:\n{}", differences.join("\n"));
}

/// JSON paths where `a` and `b` differ, with both values (at most a few per object).
fn paths_that_differ(path: &str, a: &serde_json::Value, b: &serde_json::Value) -> Vec<String> {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter()
                .flat_map(|k| {
                    let (va, vb) = (x.get(k).unwrap_or(&Value::Null), y.get(k).unwrap_or(&Value::Null));
                    paths_that_differ(&format!("{path}/{k}"), va, vb)
                })
                .take(5)
                .collect()
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .flat_map(|(i, (va, vb))| paths_that_differ(&format!("{path}/{i}"), va, vb))
            .take(5)
            .collect(),
        // kustomize writes 100.0 as 100: compare numbers by value.
        (Value::Number(x), Value::Number(y)) if x.as_f64() == y.as_f64() => Vec::new(),
        _ if a == b => Vec::new(),
        _ => vec![format!("{path}: chart {a}, kustomize {b}")],
    }
}

#[test]
fn the_helm_chart_values_reach_the_deployment_and_pass_a_server_side_dry_run() {
    install_operator_rbac();
    let rendered = helm_template(&[
        "--set",
        "replicas=5,shards=64,leaseDuration=10s,renewDeadline=7s",
        "--set",
        "prometheusUrl=http://prometheus.monitoring:9090,otlpEndpoint=http://collector:4318",
        "--set",
        "networkPolicyAllowedNamespaces={ingress-nginx,monitoring}",
    ]);
    let deployment = objects(&rendered)
        .remove(&("Deployment".to_string(), "flotilla-system".to_string(), "flotilla".to_string()))
        .expect("Deployment");
    assert_eq!(deployment.pointer("/spec/replicas"), Some(&serde_json::json!(5)));
    let env = deployment.pointer("/spec/template/spec/containers/0/env").expect("env").to_string();
    for want in [
        r#"{"name":"FLOTILLA_SHARDS","value":"64"}"#,
        r#"{"name":"FLOTILLA_LEASE_DURATION","value":"10s"}"#,
        r#"{"name":"FLOTILLA_RENEW_DEADLINE","value":"7s"}"#,
        r#"{"name":"FLOTILLA_PROMETHEUS_URL","value":"http://prometheus.monitoring:9090"}"#,
        r#"{"name":"OTEL_EXPORTER_OTLP_ENDPOINT","value":"http://collector:4318"}"#,
        r#"{"name":"FLOTILLA_NETWORK_POLICY_ALLOWED_NAMESPACES","value":"ingress-nginx,monitoring"}"#,
    ] {
        assert!(env.contains(want), "{want} in {env}");
    }
    // The shard fence: one binding per shard of the 64, each naming its shard's Lease, and the
    // one that shuts any other shard.
    let objects = objects(&rendered);
    let binding = |name: &str| {
        objects
            .get(&("ValidatingAdmissionPolicyBinding".to_string(), String::new(), name.to_string()))
            .cloned()
            .unwrap_or_else(|| panic!("binding {name} is rendered"))
    };
    for shard in 0..64 {
        let b = binding(&format!("flotilla-shard-fence-{shard}"));
        assert_eq!(b.pointer("/spec/paramRef/name"), Some(&serde_json::json!(format!("flotilla-shard-{shard}"))));
        assert_eq!(
            b.pointer("/spec/matchResources/namespaceSelector/matchLabels"),
            Some(&serde_json::json!({"flotilla.dev/shard": shard.to_string()}))
        );
    }
    let bindings = objects.keys().filter(|(kind, _, _)| kind == "ValidatingAdmissionPolicyBinding");
    assert_eq!(
        bindings.filter(|(_, _, n)| n.starts_with("flotilla-shard-fence-")).count(),
        65,
        "64 shards and unbound"
    );
    let unbound = binding("flotilla-shard-fence-unbound");
    let shards: Vec<String> = (0..64).map(|s| s.to_string()).collect();
    assert_eq!(
        unbound.pointer("/spec/matchResources/namespaceSelector/matchExpressions/0"),
        Some(&serde_json::json!({"key": "flotilla.dev/shard", "operator": "NotIn", "values": shards}))
    );
    let file = std::env::temp_dir().join(format!("flotilla-helm-{}.yaml", std::process::id()));
    std::fs::write(&file, &rendered).expect("writing the rendered chart");
    let (ok, out) = kubectl_try(&[
        "apply",
        "--server-side",
        "--dry-run=server",
        "--force-conflicts",
        "-f",
        file.to_str().expect("path"),
    ]);
    let _ = std::fs::remove_file(&file);
    assert!(ok, "the rendered chart fails a server-side dry run:\n{out}");
}
