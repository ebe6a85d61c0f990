//! An App read without its spec (`LightApp`), where only its key, generation and status
//! matter: the guard's cluster-wide watch, and the App that a status write sends back.
//!
//! Whoever may create an App, anywhere, reaches the guard's read on every replica, and may make
//! the App as large as the apiserver stores (about 1.5 MiB), shaped to take many times its
//! length as a tree of JSON values (`tests/parse_cost.rs`). Read as this, its spec is skipped
//! as the text is read. The status is written by replicas only (the status subresource drops
//! what anyone else sends in it).

use crate::api::{App, AppStatus};
use kube::Resource;
use serde::Deserialize;

/// An App read without its spec: its name, namespace, uid, resourceVersion and generation,
/// and its status as text. Everything else (its spec, labels, annotations, managed fields)
/// is skipped as it is read, never held.
#[derive(Clone, Debug, Deserialize)]
#[serde(from = "LightWire")]
pub struct LightApp {
    metadata: kube::api::ObjectMeta,
    status: Option<Box<serde_json::value::RawValue>>,
}

#[derive(Deserialize)]
struct LightWire {
    #[serde(default)]
    metadata: LightMeta,
    #[serde(default)]
    status: Option<Box<serde_json::value::RawValue>>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LightMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    generation: Option<i64>,
}

impl From<LightWire> for LightApp {
    fn from(wire: LightWire) -> Self {
        let LightMeta { name, namespace, uid, resource_version, generation } = wire.metadata;
        let metadata =
            kube::api::ObjectMeta { name, namespace, uid, resource_version, generation, ..Default::default() };
        LightApp { metadata, status: wire.status }
    }
}

impl LightApp {
    /// The App's status: none when it has none, an error when it does
    /// not read as one (written by another writer).
    pub fn status(&self) -> Result<AppStatus, serde_json::Error> {
        match &self.status {
            None => Ok(AppStatus::default()),
            Some(raw) => serde_json::from_str(raw.get()),
        }
    }
}

impl Resource for LightApp {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(dt: &()) -> std::borrow::Cow<'_, str> {
        App::kind(dt)
    }
    fn group(dt: &()) -> std::borrow::Cow<'_, str> {
        App::group(dt)
    }
    fn version(dt: &()) -> std::borrow::Cow<'_, str> {
        App::version(dt)
    }
    fn api_version(dt: &()) -> std::borrow::Cow<'_, str> {
        App::api_version(dt)
    }
    fn plural(dt: &()) -> std::borrow::Cow<'_, str> {
        App::plural(dt)
    }
    fn meta(&self) -> &kube::api::ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut kube::api::ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_of_an_app_its_key_generation_and_status_only() {
        let huge = "x".repeat(64 * 1024);
        let text = serde_json::json!({
            "apiVersion": "flotilla.dev/v1beta1", "kind": "App",
            "metadata": {"name": "web", "namespace": "nowhere", "uid": "u", "resourceVersion": "7",
                "generation": 3, "labels": {"big": "x"}, "annotations": {"big": huge},
                "finalizers": ["a/b"], "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap",
                    "name": "c", "uid": "c"}]},
            "spec": {"image": "a/b", "version": "2", "template": {"metadata": {"annotations": {"big": huge}}}},
            "status": {"currentVersion": "1"}
        })
        .to_string();
        let obj: LightApp = serde_json::from_str(&text).expect("an App");
        let m = &obj.metadata;
        assert_eq!(
            (m.name.as_deref(), m.namespace.as_deref(), m.uid.as_deref(), m.resource_version.as_deref(), m.generation),
            (Some("web"), Some("nowhere"), Some("u"), Some("7"), Some(3))
        );
        assert!(m.labels.is_none() && m.annotations.is_none() && m.owner_references.is_none());
        assert_eq!(obj.status.as_ref().map(|s| s.get()), Some(r#"{"currentVersion":"1"}"#), "the status kept as text");
        assert_eq!(obj.status().expect("the status").current_version.as_deref(), Some("1"));
        // No status, a null one, and one another writer wrote wrong.
        let bare: LightApp = serde_json::from_str(r#"{"metadata": {"name": "a"}}"#).expect("an App");
        assert_eq!(bare.status().expect("none"), AppStatus::default());
        let null: LightApp = serde_json::from_str(r#"{"metadata": {"name": "a"}, "status": null}"#).expect("an App");
        assert_eq!(null.status().expect("none"), AppStatus::default());
        let wrong: LightApp = serde_json::from_str(r#"{"metadata": {"name": "a"}, "status": {"phase": 7}}"#)
            .expect("read: the guard leaves it as it is");
        assert!(wrong.status().is_err());
    }
}
