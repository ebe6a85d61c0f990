//! Whether a pod template, as JSON text, is one the `v1beta1` schema of `spec.template` and its
//! CEL rules accept: for the template a `v1alpha1` App carries in its annotation, which the
//! apiserver stores at `v1beta1` without checking it (`conversion`). A template stored that the
//! schema refuses makes the App unreadable to every typed reader (`flotilla status`, the
//! dashboard, anyone's client) until someone changes it.
//!
//! The schema is the CRD's own (generated from the types, `structural` checks the text
//! against it as it streams); its CEL rules are evaluated here, on a lean reading of the
//! template (its label keys, and each container's name and whether it sets an image), with
//! their messages taken from the CRD. A unit test keeps the rules here and the CRD's the same.

use kube::CustomResourceExt;
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::OnceLock;

use super::structural;
use super::template::MAIN_CONTAINER;
use super::v1beta1;

/// Where the template is in an App.
pub const FIELD: &str = "spec.template";

/// What of a template the CEL rules read.
#[derive(Deserialize)]
struct Shape {
    #[serde(default)]
    metadata: Option<ShapeMetadata>,
    #[serde(default)]
    spec: Option<ShapeSpec>,
}

#[derive(Deserialize)]
struct ShapeMetadata {
    #[serde(default)]
    labels: Option<BTreeMap<String, IgnoredAny>>,
}

#[derive(Deserialize)]
struct ShapeSpec {
    #[serde(default)]
    containers: Vec<ShapeContainer>,
    #[serde(default, rename = "initContainers")]
    init_containers: Option<Vec<ShapeContainer>>,
}

#[derive(Deserialize)]
struct ShapeContainer {
    #[serde(default)]
    name: String,
    /// `has(c.image)`: set and not null.
    #[serde(default)]
    image: Option<IgnoredAny>,
}

type Rule = (&'static str, fn(&Shape) -> bool);

/// The CEL rules of the template (`template.rs`), each as the CRD spells it and as Rust.
const RULES: [Rule; 4] = [
    ("!has(self.spec) || self.spec.containers.size() == 1 || self.spec.containers.exists(c, c.name == 'app')", |t| {
        t.spec.as_ref().is_none_or(|s| s.containers.len() == 1 || s.containers.iter().any(|c| c.name == MAIN_CONTAINER))
    }),
    (
        "!has(self.spec) || self.spec.containers.all(c, (c.name == 'app' || self.spec.containers.size() == 1) != has(c.image))",
        |t| {
            t.spec.as_ref().is_none_or(|s| {
                s.containers.iter().all(|c| (c.name == MAIN_CONTAINER || s.containers.len() == 1) != c.image.is_some())
            })
        },
    ),
    ("!has(self.spec) || !has(self.spec.initContainers) || self.spec.initContainers.all(c, has(c.image))", |t| {
        t.spec.as_ref().and_then(|s| s.init_containers.as_ref()).is_none_or(|i| i.iter().all(|c| c.image.is_some()))
    }),
    (
        "self.all(k, !(k in ['app.kubernetes.io/name', 'app.kubernetes.io/version', 'app.kubernetes.io/managed-by']) && !k.startsWith('flotilla.dev/'))",
        |t| {
            let reserved = ["app.kubernetes.io/name", "app.kubernetes.io/version", "app.kubernetes.io/managed-by"];
            t.metadata.as_ref().and_then(|m| m.labels.as_ref()).is_none_or(|labels| {
                labels.keys().all(|k| !reserved.contains(&k.as_str()) && !k.starts_with("flotilla.dev/"))
            })
        },
    ),
];

/// The `v1beta1` schema of `spec.template`, from the CRD (`None` only if the types lost it,
/// which a unit test rules out).
fn schema() -> Option<&'static Value> {
    static SCHEMA: OnceLock<Option<Value>> = OnceLock::new();
    SCHEMA
        .get_or_init(|| {
            let crd = serde_json::to_value(v1beta1::App::crd()).ok()?;
            let versions = crd.pointer("/spec/versions")?.as_array()?;
            let root = versions.first()?.pointer("/schema/openAPIV3Schema")?;
            root.pointer("/properties/spec/properties/template").cloned()
        })
        .as_ref()
}

/// Every CEL rule in `schema` and below it, with its message.
fn rules_in(schema: &Value, out: &mut Vec<(String, String)>) {
    for v in schema.get("x-kubernetes-validations").and_then(Value::as_array).into_iter().flatten() {
        let text = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
        out.push((text("rule"), text("message")));
    }
    for key in ["properties", "additionalProperties", "items"] {
        match schema.get(key) {
            Some(Value::Object(map)) if key == "properties" => map.values().for_each(|s| rules_in(s, out)),
            Some(sub @ Value::Object(_)) => rules_in(sub, out),
            _ => {}
        }
    }
}

/// Checks `text`, a template as JSON: `Err` says which field the `v1beta1` schema, or which
/// CEL rule (by its message), refuses.
pub fn check(text: &str) -> Result<(), String> {
    let schema = schema().ok_or_else(|| format!("{FIELD}: this operator has no v1beta1 schema of it"))?;
    structural::check(text, schema, FIELD)?;
    // The schema has been checked: the template is an object (or null) of the right types.
    let Some(shape) = serde_json::from_str::<Option<Shape>>(text).map_err(|e| format!("{FIELD}: {e}"))? else {
        return Ok(());
    };
    match RULES.iter().find(|(_, holds)| !holds(&shape)) {
        None => Ok(()),
        Some((rule, _)) => Err(message_of(schema, rule)),
    }
}

/// The message the CRD gives CEL rule `rule` (the rule itself if it has none).
fn message_of(schema: &Value, rule: &str) -> String {
    static MESSAGES: OnceLock<Vec<(String, String)>> = OnceLock::new();
    let messages = MESSAGES.get_or_init(|| {
        let mut out = Vec::new();
        rules_in(schema, &mut out);
        out
    });
    messages.iter().find(|(r, _)| r == rule).map_or_else(|| rule.to_string(), |(_, m)| m.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_rules_here_are_the_crds() {
        let schema = schema().expect("the v1beta1 schema of spec.template");
        let mut in_crd = Vec::new();
        rules_in(schema, &mut in_crd);
        let mut in_crd: Vec<String> = in_crd.into_iter().map(|(rule, _)| rule).collect();
        let mut here: Vec<String> = RULES.iter().map(|(rule, _)| rule.to_string()).collect();
        in_crd.sort();
        here.sort();
        assert_eq!(in_crd, here, "every CEL rule of the template has its twin here, and no other");
    }

    #[test]
    fn the_schema_uses_only_what_structural_checks() {
        fn keywords(schema: &Value, out: &mut std::collections::BTreeSet<String>) {
            let Some(map) = schema.as_object() else { return };
            for (k, v) in map {
                out.insert(k.clone());
                match k.as_str() {
                    "properties" => v.as_object().into_iter().flatten().for_each(|(_, s)| keywords(s, out)),
                    "items" | "additionalProperties" => keywords(v, out),
                    _ => {}
                }
            }
        }
        let mut used = std::collections::BTreeSet::new();
        keywords(schema().expect("schema"), &mut used);
        let unknown: Vec<&String> = used.iter().filter(|k| !structural::KEYWORDS.contains(&k.as_str())).collect();
        assert!(unknown.is_empty(), "keywords structural does not check: {unknown:?}");
    }

    #[test]
    fn templates_the_crd_accepts_pass() {
        for template in [
            json!(null),
            json!({}),
            json!({"spec": {"containers": [{"name": "web"}]}}),
            json!({"metadata": {"labels": {"team": "a"}, "annotations": {"x": "y"}},
                "spec": {"containers": [{"name": "app", "env": [{"name": "A", "value": "1"}],
                    "resources": {"requests": {"cpu": "100m", "memory": 128}}},
                    {"name": "proxy", "image": "envoy:1"}],
                    "initContainers": [{"name": "init", "image": "busybox"}],
                    "nodeSelector": {"kubernetes.io/os": "linux"}, "terminationGracePeriodSeconds": 45}}),
        ] {
            assert_eq!(check(&template.to_string()), Ok(()), "{template}");
        }
    }

    /// The docs' checkout template, with what a real pod adds (probes, volumes, scheduling,
    /// security settings, quantities as numbers), and every sample App's: what the CRD
    /// accepts is never refused (a stored App's template comes back through the annotation on
    /// every v1alpha1 write of it).
    #[test]
    fn real_templates_pass() {
        let checkout = r#"
metadata: {labels: {team: payments}, annotations: {prometheus.io/scrape: "true"}}
spec:
  containers:
    - name: app
      args: [--config=/etc/checkout/config.yaml]
      env:
        - {name: LOG_LEVEL, value: info}
        - name: POD_IP
          valueFrom: {fieldRef: {fieldPath: status.podIP}}
      envFrom: [{configMapRef: {name: checkout-env}}]
      resources: {requests: {cpu: 100m, memory: 128Mi}, limits: {memory: 256Mi, cpu: 1}}
      readinessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 5}
      livenessProbe: {tcpSocket: {port: http}, initialDelaySeconds: 10}
      securityContext: {runAsUser: 10001, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
      volumeMounts: [{name: config, mountPath: /etc/checkout}]
    - name: log-shipper
      image: registry.example.com/platform/log-shipper:2.3
      resources: {requests: {cpu: 10m, memory: 32Mi}}
  initContainers: [{name: migrate, image: registry.example.com/shop/migrate:1, command: [/migrate]}]
  volumes:
    - {name: config, configMap: {name: checkout-config}}
    - {name: scratch, emptyDir: {sizeLimit: 1Gi}}
  nodeSelector: {kubernetes.io/os: linux}
  tolerations: [{key: dedicated, operator: Equal, value: shop, effect: NoSchedule}]
  affinity:
    podAntiAffinity:
      preferredDuringSchedulingIgnoredDuringExecution:
        - weight: 100
          podAffinityTerm: {topologyKey: kubernetes.io/hostname, labelSelector: {matchLabels: {team: payments}}}
  securityContext: {fsGroup: 2000, seccompProfile: {type: RuntimeDefault}}
  terminationGracePeriodSeconds: 45
"#;
        let mut templates = vec![serde_yaml::from_str::<Value>(checkout).expect("YAML")];
        // Read at run time: a file the binary embeds must be one the image's build copies.
        let samples = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/samples/app.yaml"))
            .expect("reading deploy/samples/app.yaml");
        for doc in serde_yaml::Deserializer::from_str(&samples) {
            let app = Value::deserialize(doc).expect("a sample App");
            templates.extend(app.pointer("/spec/template").cloned());
        }
        assert!(templates.len() >= 2, "the samples have a template");
        for template in templates {
            assert_eq!(check(&template.to_string()), Ok(()), "{template}");
            serde_json::from_value::<crate::api::PodTemplate>(template).expect("and the types read it");
        }
    }

    #[test]
    fn templates_the_crd_refuses_are_refused_naming_the_field() {
        let labels = |n: usize| (0..n).map(|i| (format!("l{i}"), json!("x"))).collect::<serde_json::Map<_, _>>();
        let cases = [
            (json!("x"), "spec.template: must be an object, not a string"),
            (json!({"spec": {}}), "spec.template.spec.containers: is required"),
            (json!({"spec": {"containers": "app"}}), "spec.template.spec.containers: must be a list"),
            (json!({"spec": {"containers": [{"image": "a"}]}}), "spec.template.spec.containers[0].name: is required"),
            (
                json!({"spec": {"containers": [{"name": "app", "ports": "80"}]}}),
                "spec.template.spec.containers[0].ports",
            ),
            (json!({"spec": {"containers": [{"name": "app"}], "replicas": 3}}), "\"replicas\" is not a field"),
            (json!({"metadata": {"name": "x"}}), "spec.template.metadata: \"name\" is not a field"),
            (json!({"metadata": {"labels": labels(65)}}), "spec.template.metadata.labels: must have at most 64"),
            (
                json!({"spec": {"containers": (0..17).map(|i| json!({"name": format!("c{i}"), "image": "i"})).collect::<Vec<_>>()}}),
                "spec.template.spec.containers: must have at most 16 items",
            ),
            (
                json!({"spec": {"containers": [{"name": "a", "image": "i"}, {"name": "b", "image": "i"}]}}),
                "spec.template.spec.containers: with more than one container, one must be named app",
            ),
            (
                json!({"spec": {"containers": [{"name": "app", "image": "nginx"}]}}),
                "the main container (named app, or the only one) must not set image",
            ),
            (
                json!({"spec": {"containers": [{"name": "app"}, {"name": "proxy"}]}}),
                "every other container must set one",
            ),
            (
                json!({"spec": {"containers": [{"name": "app"}], "initContainers": [{"name": "init"}]}}),
                "spec.template.spec.initContainers: every init container must set image",
            ),
            (
                json!({"metadata": {"labels": {"app.kubernetes.io/name": "x"}}}),
                "spec.template.metadata.labels: app.kubernetes.io/name",
            ),
            (
                json!({"metadata": {"labels": {"flotilla.dev/track": "x"}}}),
                "spec.template.metadata.labels: app.kubernetes.io/name",
            ),
        ];
        for (template, want) in cases {
            let got = check(&template.to_string()).expect_err(&template.to_string());
            assert!(got.contains(want), "{template}: want {want:?} in {got:?}");
        }
    }
}
