//! An App read without its spec (`LightApp`), where only its key, generation and status
//! matter (the App that a status write sends back, the guard's read before it writes), and
//! what the guard's cluster-wide watch keeps of one (`GuardedApp`).
//!
//! Whoever may create an App, anywhere, reaches the guard's read on every replica, and may make
//! the App as large as the apiserver stores (about 1.5 MiB), shaped to take many times its
//! length as a tree of JSON values (`tests/parse_cost.rs`). Read as this, its spec is skipped
//! as the text is read. The status is written by replicas only (the status subresource drops
//! what anyone else sends in it).

use crate::api::{App, AppPhase, AppStatus};
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

crate::watch_cache::resource_as!(LightApp, App);

/// What the guard keeps of an App: its key and generation, and of its status only its phase
/// and its Ready condition's reason and message, which tell whether it already says what the
/// guard would write. The whole status is read again before a write (`LightApp`): a status
/// can hold a copy of a template, and the guard holds every App outside onboarded namespaces.
#[derive(Clone, Debug, Deserialize)]
#[serde(from = "GuardWire")]
pub struct GuardedApp {
    metadata: kube::api::ObjectMeta,
    /// `None` when the status does not read as one (written by another writer).
    summary: Option<StatusSummary>,
}

/// Of an App's status, what tells whether it says why nothing is done: see `GuardedApp`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatusSummary {
    pub phase: Option<AppPhase>,
    /// The Ready condition's reason and message.
    pub ready: Option<(String, String)>,
}

#[derive(Deserialize)]
struct GuardWire {
    #[serde(default)]
    metadata: LightMeta,
    #[serde(default)]
    status: Option<Box<serde_json::value::RawValue>>,
}

#[derive(Deserialize)]
struct SummaryWire {
    #[serde(default)]
    phase: Option<AppPhase>,
    #[serde(default)]
    conditions: Vec<ConditionWire>,
}

#[derive(Deserialize)]
struct ConditionWire {
    #[serde(rename = "type")]
    type_: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    message: String,
}

impl From<GuardWire> for GuardedApp {
    fn from(wire: GuardWire) -> Self {
        let LightMeta { name, namespace, uid, resource_version, generation } = wire.metadata;
        let metadata =
            kube::api::ObjectMeta { name, namespace, uid, resource_version, generation, ..Default::default() };
        // Read from the status's text, which is dropped here: a status that does not read
        // must not fail the read of the App (nor a whole list page with it).
        let summary = match wire.status {
            None => Some(StatusSummary::default()),
            Some(raw) => serde_json::from_str::<SummaryWire>(raw.get()).ok().map(|s| StatusSummary {
                phase: s.phase,
                ready: s.conditions.into_iter().find(|c| c.type_ == "Ready").map(|c| (c.reason, c.message)),
            }),
        };
        GuardedApp { metadata, summary }
    }
}

impl GuardedApp {
    /// Its status's summary; `None` when the status does not read as one.
    pub fn summary(&self) -> Option<&StatusSummary> {
        self.summary.as_ref()
    }
}

crate::watch_cache::resource_as!(GuardedApp, App);

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;

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

    #[test]
    fn the_guard_keeps_of_a_status_its_phase_and_ready_condition() {
        let template = "x".repeat(64 * 1024);
        let text = serde_json::json!({"metadata": {"name": "web", "namespace": "n", "generation": 2},
            "spec": {"image": "a/b", "version": "1"},
            "status": {"phase": "Degraded", "stableTemplate": {"big": template},
                "conditions": [{"type": "Progressing", "status": "False", "reason": "R", "message": "m"},
                    {"type": "Ready", "status": "False", "reason": "NamespaceNotOnboarded", "message": "why"}]}})
        .to_string();
        let app: GuardedApp = serde_json::from_str(&text).expect("an App");
        assert_eq!(app.meta().generation, Some(2));
        assert_eq!(
            app.summary(),
            Some(&StatusSummary {
                phase: Some(AppPhase::Degraded),
                ready: Some(("NamespaceNotOnboarded".into(), "why".into()))
            })
        );
        assert!(format!("{app:?}").len() < 1024, "no copy of the template kept: {app:?}");
        let bare: GuardedApp = serde_json::from_str(r#"{"metadata": {"name": "a"}}"#).expect("an App");
        assert_eq!(bare.summary(), Some(&StatusSummary::default()));
        let wrong: GuardedApp = serde_json::from_str(r#"{"metadata": {"name": "a"}, "status": {"phase": 7}}"#)
            .expect("read all the same: a page must not fail for it");
        assert_eq!(wrong.summary(), None);
    }
}
