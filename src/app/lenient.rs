//! An App as a person's tools read it (the dashboard, `flotilla status`): the App, or why it
//! does not read as one, so that one App cannot fail a whole list or watch.
//!
//! Read typed, an App stored in a shape the types refuse (a template of the wrong type, stored
//! through the v1alpha1 annotation before the webhook checked it, or under an older schema)
//! fails its list page, and a watch's first list fails again at every retry: the dashboard's
//! overview stayed empty for every namespace. The operator's caches never parse a list whole:
//! each App is kept as its text (`watch_cache::Compact`) and parsed on its own, an App that
//! does not parse reported as `InvalidSpec`. `LenientApp` reads each App the same way, once, as
//! it arrives, and keeps the App or the error.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use std::collections::BTreeMap;

use crate::api::{App, AppSpec, AppStatus};
use crate::watch_cache::Compact;

/// An App, or why it does not read as one (see the module's text).
#[derive(Clone, Debug)]
pub struct LenientApp {
    /// Its name, namespace, uid, resourceVersion and owners: what a cache keys it by.
    metadata: ObjectMeta,
    read: Result<App, Unreadable>,
}

/// An App that does not read as one.
#[derive(Clone, Debug, PartialEq)]
pub struct Unreadable {
    /// Why, naming the field when one top-level field of the spec (or the status, or the
    /// metadata) is what fails: `spec.template: invalid type: string "x", expected ...`.
    pub error: String,
    /// Its status, when that reads on its own (written by the operator before the App broke).
    pub status: Option<AppStatus>,
}

impl<'de> Deserialize<'de> for LenientApp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Any object reads as a Compact (its fields copied as the text they are); only then is
        // it parsed as an App, which may fail for this one object alone.
        Compact::<App>::deserialize(deserializer).map(|c| LenientApp::of(&c))
    }
}

impl From<App> for LenientApp {
    fn from(app: App) -> Self {
        let m = &app.metadata;
        let metadata = ObjectMeta {
            name: m.name.clone(),
            namespace: m.namespace.clone(),
            uid: m.uid.clone(),
            resource_version: m.resource_version.clone(),
            ..ObjectMeta::default()
        };
        LenientApp { metadata, read: Ok(app) }
    }
}

impl LenientApp {
    /// The App `cached` holds, or why it does not read as one.
    pub fn of(cached: &Compact<App>) -> Self {
        let metadata = kube::Resource::meta(cached).clone();
        let read = cached.parse().map_err(|e| Unreadable {
            error: name_the_field(cached.json()).map_or_else(|| e.to_string(), |field| format!("{field}: {e}")),
            status: status_of(cached.json()),
        });
        LenientApp { metadata, read }
    }

    /// The App, or why it does not read as one.
    pub fn app(&self) -> Result<&App, &Unreadable> {
        self.read.as_ref()
    }
}

crate::watch_cache::resource_as!(LenientApp, App);

/// The status in `json` (an App's text), if it reads on its own.
fn status_of(json: &str) -> Option<AppStatus> {
    #[derive(Deserialize)]
    struct StatusOnly {
        #[serde(default)]
        status: Option<AppStatus>,
    }
    serde_json::from_str::<StatusOnly>(json).ok().and_then(|s| s.status)
}

/// Which top-level field of the App in `json` does not read: `metadata`, `status`, or
/// `spec.<field>` (each field of the spec tried alone, beside placeholders of the required
/// ones). None when none does alone (the spec as a whole, such as a missing field).
fn name_the_field(json: &str) -> Option<String> {
    type Fields = BTreeMap<String, Box<RawValue>>;
    let top: Fields = serde_json::from_str(json).ok()?;
    if top.get("metadata").is_some_and(|m| serde_json::from_str::<ObjectMeta>(m.get()).is_err()) {
        return Some("metadata".into());
    }
    if top.get("status").is_some_and(|s| serde_json::from_str::<Option<AppStatus>>(s.get()).is_err()) {
        return Some("status".into());
    }
    let spec: Fields = match top.get("spec").map(|s| serde_json::from_str(s.get())) {
        Some(Ok(spec)) => spec,
        Some(Err(_)) => return Some("spec".into()),
        None => return None,
    };
    let placeholder = RawValue::from_string("\"x\"".into()).ok()?;
    spec.iter()
        .find(|(key, value)| {
            let mut alone: BTreeMap<&str, &RawValue> =
                BTreeMap::from([("image", &*placeholder), ("version", &*placeholder)]);
            alone.insert(key.as_str(), &**value);
            serde_json::to_string(&alone).is_ok_and(|text| serde_json::from_str::<AppSpec>(&text).is_err())
        })
        .map(|(key, _)| format!("spec.{key}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::ResourceExt;
    use serde_json::json;

    fn read(app: serde_json::Value) -> LenientApp {
        serde_json::from_value(app).expect("any App object reads")
    }

    fn app(spec: serde_json::Value, status: serde_json::Value) -> serde_json::Value {
        json!({"apiVersion": "flotilla.dev/v1beta1", "kind": "App",
            "metadata": {"name": "web", "namespace": "shop", "generation": 2, "annotations": {"a": "b"}},
            "spec": spec, "status": status})
    }

    #[test]
    fn a_readable_app_is_the_app() {
        let lenient =
            read(app(json!({"image": "registry.example.com/web", "version": "2"}), json!({"phase": "Healthy"})));
        let a = lenient.app().expect("readable");
        assert_eq!((a.spec.version.as_str(), a.metadata.generation), ("2", Some(2)));
        assert_eq!(a.annotations().get("a").map(String::as_str), Some("b"), "its metadata whole");
        assert_eq!((lenient.namespace().as_deref(), lenient.name_any().as_str()), (Some("shop"), "web"));
    }

    #[test]
    fn an_unreadable_app_is_its_key_the_error_naming_the_field_and_its_status() {
        let cases = [
            (
                app(json!({"image": "i", "version": "1", "template": "x"}), json!({"phase": "Healthy"})),
                "spec.template: invalid type: string \"x\", expected struct PodTemplate",
            ),
            (
                app(json!({"image": "i", "version": "1", "replicas": "three"}), json!({})),
                "spec.replicas: invalid type: string",
            ),
            (app(json!({"image": "i"}), json!({})), "missing field `version`"),
            (app(json!("nonsense"), json!({})), "spec: invalid type"),
            (app(json!({"image": "i", "version": "1"}), json!({"phase": 7})), "status: "),
        ];
        for (object, want) in cases {
            let lenient = read(object.clone());
            let unreadable = lenient.app().expect_err("unreadable");
            assert!(unreadable.error.starts_with(want), "{object}: want {want:?}, got {:?}", unreadable.error);
            assert!(!unreadable.error.contains(" at line "), "no position of a text the writer never sent");
            assert_eq!((lenient.namespace().as_deref(), lenient.name_any().as_str()), (Some("shop"), "web"));
        }
        let broken = read(app(json!({"image": "i", "version": "1", "template": "x"}), json!({"phase": "Healthy"})));
        let status = broken.app().expect_err("unreadable").status.clone().expect("the status reads alone");
        assert_eq!(status.phase, Some(crate::api::AppPhase::Healthy));
    }

    #[test]
    fn a_page_with_an_unreadable_app_reads_whole() {
        let page = json!({"apiVersion": "flotilla.dev/v1beta1", "kind": "AppList", "metadata": {}, "items": [
            app(json!({"image": "i", "version": "1"}), json!({})),
            app(json!({"image": "i", "version": "1", "template": "x"}), json!({})),
        ]});
        let list: kube::core::ObjectList<LenientApp> = serde_json::from_value(page).expect("the page reads");
        assert_eq!(list.items.iter().map(|a| a.app().is_ok()).collect::<Vec<_>>(), [true, false]);
    }
}
