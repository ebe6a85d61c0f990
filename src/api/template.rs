//! `spec.template` of an App: the pod it runs, as a Kubernetes pod template (labels,
//! annotations and a full PodSpec). The App's `image` at `version` goes into the main
//! container: the one named `app`, or the only one.
//!
//! The schema is Kubernetes' own PodSpec schema, without its descriptions (they would make
//! the CRD several times larger) and with bounds on the lists the CRD's rules walk, so that
//! the apiserver can price those rules. The apiserver validates the rest of the pod when it
//! validates the Deployment the operator writes.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, PodSpec};

use super::names;
use kube::KubeSchema;
use schemars::{Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// Name of the main container when the template has several.
pub const MAIN_CONTAINER: &str = "app";
/// Most bytes of JSON a template may take. The App's status keeps a copy of the stable
/// revision's template and each Deployment (and ReplicaSet) another, so a template of a few
/// hundred KiB would push the App's status past etcd's object limit (a rollback could then
/// no longer be written) and cost every replica that caches it. Real templates take a few
/// KiB (the docs' checkout: 0.7 KiB).
pub const MAX_TEMPLATE_BYTES: usize = 64 * 1024;
/// Most containers (or init containers) a template may list.
pub const MAX_CONTAINERS: u64 = 16;

/// The pod an App runs: labels and annotations for its pods and a PodSpec. The main
/// container (named `app`, or the only one) runs `spec.image` at `spec.version`; leave its
/// `image` unset.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new("!has(self.spec) || self.spec.containers.size() == 1 || self.spec.containers.exists(c, c.name == 'app')").message("spec.template.spec.containers: with more than one container, one must be named app (it runs spec.image at spec.version)").reason(kube::core::Reason::FieldValueInvalid).field_path(".spec.containers"))]
#[x_kube(validation = Rule::new("!has(self.spec) || self.spec.containers.all(c, (c.name == 'app' || self.spec.containers.size() == 1) != has(c.image))").message("spec.template.spec.containers: the main container (named app, or the only one) must not set image, which is spec.image at spec.version; every other container must set one").reason(kube::core::Reason::FieldValueInvalid).field_path(".spec.containers"))]
#[x_kube(validation = Rule::new("!has(self.spec) || !has(self.spec.initContainers) || self.spec.initContainers.all(c, has(c.image))").message("spec.template.spec.initContainers: every init container must set image").reason(kube::core::Reason::FieldValueInvalid).field_path(".spec.initContainers"))]
pub struct PodTemplate {
    /// Labels and annotations of the App's pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMetadata>,
    /// The pod's spec (Kubernetes PodSpec). `containers` lists at least the main container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "pod_spec_schema")]
    pub spec: Option<PodSpec>,
}

/// Labels and annotations of the App's pods.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct TemplateMetadata {
    /// Labels of the App's pods. The labels Flotilla selects pods by
    /// (`app.kubernetes.io/name`, `app.kubernetes.io/version`, `app.kubernetes.io/managed-by`,
    /// and `flotilla.dev/*`) are the operator's and cannot be set here. At most 64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxProperties" = 64))]
    #[x_kube(validation = Rule::new("self.all(k, !(k in ['app.kubernetes.io/name', 'app.kubernetes.io/version', 'app.kubernetes.io/managed-by']) && !k.startsWith('flotilla.dev/'))").message("spec.template.metadata.labels: app.kubernetes.io/name, app.kubernetes.io/version, app.kubernetes.io/managed-by and flotilla.dev/* are set by the operator (it selects the App's pods by them)").reason(kube::core::Reason::FieldValueForbidden))]
    pub labels: Option<BTreeMap<String, String>>,
    /// Annotations of the App's pods (merged with `spec.podAnnotations`, which wins). At most 64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxProperties" = 64))]
    pub annotations: Option<BTreeMap<String, String>>,
}

impl PodTemplate {
    /// Bytes of the template's JSON.
    pub fn json_len(&self) -> usize {
        serde_json::to_vec(self).map(|v| v.len()).unwrap_or(usize::MAX)
    }

    /// Label keys the template sets on pods.
    pub fn label_keys(&self) -> impl Iterator<Item = &String> {
        self.metadata.iter().flat_map(|m| m.labels.iter().flatten()).map(|(k, _)| k)
    }

    /// Annotation keys the template sets on pods.
    pub fn annotation_keys(&self) -> impl Iterator<Item = &String> {
        self.metadata.iter().flat_map(|m| m.annotations.iter().flatten()).map(|(k, _)| k)
    }
}

/// Index of the main container in `containers`: the one named `app`, else the only one.
/// `None` when neither exists (the CRD refuses such templates).
pub fn main_container(containers: &[Container]) -> Option<usize> {
    containers.iter().position(|c| c.name == MAIN_CONTAINER).or((containers.len() == 1).then_some(0))
}

/// The schema of an object only the operator writes (in status): any object, not validated.
pub fn opaque_object(_: &mut SchemaGenerator) -> Schema {
    schemars::json_schema!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
}

/// The revision of an App's pods: its version, and for an App with a template, `+` and a
/// fingerprint of the template (`1.4.2+3fa9c01b2e`). A change of either is a new revision,
/// rolled out by the App's strategy. Versions cannot contain `+` (the CRD's pattern).
pub fn revision(version: &str, template: Option<&PodTemplate>) -> String {
    match template {
        None => version.to_string(),
        Some(t) => {
            let bytes = serde_json::to_vec(t).unwrap_or_default();
            let fp = super::fingerprint::fnv1a64(&bytes);
            format!("{version}+{:010x}", fp >> 24)
        }
    }
}

/// Whether `template` is the one `rev` was made from (its fingerprint matches).
pub fn is_template_of(rev: &str, template: &PodTemplate) -> bool {
    revision(version_of(rev), Some(template)) == rev
}

/// The version (image tag) of a revision.
pub fn version_of(revision: &str) -> &str {
    revision.split('+').next().unwrap_or(revision)
}

/// Kubernetes' PodSpec schema, lean enough for a CRD: see the module's documentation.
fn pod_spec_schema(generator: &mut SchemaGenerator) -> Schema {
    let mut value = generator.subschema_for::<PodSpec>().to_value();
    lean(&mut value);
    if let Some(properties) = value.get_mut("properties").and_then(Value::as_object_mut) {
        for list in ["containers", "initContainers", "ephemeralContainers"] {
            if let Some(p) = properties.get_mut(list).and_then(Value::as_object_mut) {
                p.insert("maxItems".into(), Value::from(MAX_CONTAINERS));
                if let Some(name) =
                    p.get_mut("items").and_then(|i| i.pointer_mut("/properties/name")).and_then(Value::as_object_mut)
                {
                    name.insert("maxLength".into(), Value::from(63));
                }
            }
        }
    }
    Schema::try_from(value).unwrap_or_else(|_| Schema::default())
}

/// Drops descriptions and list-map markers from a schema, recursively through its
/// subschemas (not through the names of properties).
fn lean(schema: &mut Value) {
    let Some(map) = schema.as_object_mut() else { return };
    map.remove("description");
    // Server-side apply of the App treats these lists as atomic; the apiserver checks the
    // uniqueness of container names and ports when it validates the Deployment.
    map.remove("x-kubernetes-list-type");
    map.remove("x-kubernetes-list-map-keys");
    map.remove("x-kubernetes-patch-strategy");
    map.remove("x-kubernetes-patch-merge-key");
    if let Some(Value::Object(properties)) = map.get_mut("properties") {
        properties.values_mut().for_each(lean);
    }
    for key in ["items", "additionalProperties"] {
        if let Some(sub) = map.get_mut(key) {
            lean(sub);
        }
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        if let Some(Value::Array(subs)) = map.get_mut(key) {
            subs.iter_mut().for_each(lean);
        }
    }
}

/// The App-level template a running Deployment was rendered from, as near as it can be read
/// back: its pod template without Flotilla's labels and annotations and without the main
/// container's image. Rendering it again gives the same pods. Used when status lost the
/// stable revision's template and the Deployment is the only record of it.
pub fn template_from_running(d: &Deployment) -> Option<PodTemplate> {
    let running = &d.spec.as_ref()?.template;
    let mut spec = running.spec.clone()?;
    if let Some(i) = main_container(&spec.containers) {
        spec.containers[i].image = None;
    }
    let ours = |k: &String| {
        [names::LABEL_NAME, names::LABEL_VERSION, names::LABEL_MANAGED_BY].contains(&k.as_str())
            || k.starts_with("flotilla.dev/")
    };
    let meta = running.metadata.as_ref();
    let keep = |m: Option<&BTreeMap<String, String>>| {
        let kept: BTreeMap<String, String> =
            m.into_iter().flatten().filter(|(k, _)| !ours(k)).map(|(k, v)| (k.clone(), v.clone())).collect();
        (!kept.is_empty()).then_some(kept)
    };
    Some(PodTemplate {
        metadata: Some(TemplateMetadata {
            labels: keep(meta.and_then(|m| m.labels.as_ref())),
            annotations: keep(meta.and_then(|m| m.annotations.as_ref())),
        }),
        spec: Some(spec),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(name: &str) -> Container {
        Container { name: name.into(), ..Container::default() }
    }

    #[test]
    fn revisions_name_the_version_and_the_template() {
        assert_eq!(revision("1.4.2", None), "1.4.2", "without a template: the version, as before templates");
        let t = PodTemplate {
            metadata: None,
            spec: Some(PodSpec { containers: vec![container("app")], ..PodSpec::default() }),
        };
        let r = revision("1.4.2", Some(&t));
        assert!(r.starts_with("1.4.2+") && r.len() == "1.4.2+".len() + 10, "{r}");
        assert_eq!(version_of(&r), "1.4.2");
        assert_eq!(version_of("1.4.2"), "1.4.2");
        let mut other = t.clone();
        if let Some(spec) = other.spec.as_mut() {
            spec.containers[0].args = Some(vec!["--verbose".into()]);
        }
        assert_ne!(revision("1.4.2", Some(&other)), r, "a template change is a new revision");
        assert_eq!(revision("1.4.2", Some(&t.clone())), r, "stable across calls");
        assert!(is_template_of(&r, &t) && !is_template_of(&r, &other));
    }

    #[test]
    fn the_main_container_is_app_or_the_only_one() {
        assert_eq!(main_container(&[container("web")]), Some(0));
        assert_eq!(main_container(&[container("proxy"), container("app")]), Some(1));
        assert_eq!(main_container(&[container("proxy"), container("web")]), None);
        assert_eq!(main_container(&[]), None);
    }
}
