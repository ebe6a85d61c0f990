//! Reading an object straight into its cached form (`Compact`), without building a tree of it
//! first.
//!
//! Anyone who may write an App can make it as large as the apiserver stores (about 1.5 MiB),
//! and shape it as they like. Read as a `DynamicObject` (a tree of `serde_json::Value`s) an
//! App of many small list entries (`env: [{"name": ""}, ...]`) takes some 50 times its text,
//! and a list page holds 50 of them at once: a handful of such Apps, anywhere the replica
//! reads, could take its whole memory. Read this way, each field of the object is copied as
//! the text it is (`RawValue`), so an object takes about its own length however it is shaped.
//!
//! What is dropped on the way is what `slim` drops: managed fields (skipped without being
//! read into anything) and kubectl's last-applied annotation. The owner references stay in
//! the text: only caches of owned objects map events by them, and those are kept through
//! `Compact::of`.

use super::compact::Compact;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;
use std::fmt;
use std::marker::PhantomData;

/// The annotation `slim` drops (kubectl's copy of the whole object).
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Reads an object into a `Compact`: see the module's text.
pub(super) fn read<'de, D: Deserializer<'de>, K>(deserializer: D) -> Result<Compact<K>, D::Error> {
    deserializer.deserialize_map(ObjectVisitor(PhantomData))
}

struct ObjectVisitor<K>(PhantomData<fn() -> K>);

impl<'de, K> Visitor<'de> for ObjectVisitor<K> {
    type Value = Compact<K>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Kubernetes object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Compact<K>, A::Error> {
        let mut rest = Json::default();
        let mut metadata = ObjectMeta::default();
        while let Some(key) = map.next_key::<String>()? {
            if key == "metadata" {
                rest.key(&key);
                metadata = map.next_value_seed(MetaSeed(&mut rest))?;
            } else {
                let value: Box<RawValue> = map.next_value()?;
                rest.field(&key, value.get());
            }
        }
        Ok(Compact::from_parts(metadata, rest.finish()))
    }
}

/// JSON text written an object's field at a time.
#[derive(Default)]
struct Json {
    text: String,
    /// Whether the object being written has a field yet (when not, the next opens it).
    open: Vec<bool>,
}

impl Json {
    /// Opens the object (if this is its first field) and writes `key`.
    fn key(&mut self, key: &str) {
        match self.open.last_mut() {
            Some(true) => self.text.push(','),
            Some(started) => *started = true,
            None => {
                self.text.push('{');
                self.open.push(true);
            }
        }
        // A string always serializes.
        self.text.push_str(&serde_json::to_string(key).unwrap_or_default());
        self.text.push(':');
    }

    fn field(&mut self, key: &str, raw: &str) {
        self.key(key);
        self.text.push_str(raw);
    }

    /// Starts an object as the value of the key just written.
    fn begin(&mut self) {
        self.text.push('{');
        self.open.push(false);
    }

    fn end(&mut self) {
        self.open.pop();
        self.text.push('}');
    }

    fn finish(mut self) -> Box<str> {
        if self.open.is_empty() {
            self.text.push('{');
        }
        self.text.push('}');
        self.text.into_boxed_str()
    }
}

/// Reads an object's metadata: its key into the returned `ObjectMeta`, the rest as text into
/// the object's.
struct MetaSeed<'a>(&'a mut Json);

impl<'de> DeserializeSeed<'de> for MetaSeed<'_> {
    type Value = ObjectMeta;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<ObjectMeta, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for MetaSeed<'_> {
    type Value = ObjectMeta;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object's metadata")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ObjectMeta, A::Error> {
        let out = self.0;
        out.begin();
        let mut meta = ObjectMeta::default();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "name" => meta.name = map.next_value()?,
                "namespace" => meta.namespace = map.next_value()?,
                "uid" => meta.uid = map.next_value()?,
                "resourceVersion" => meta.resource_version = map.next_value()?,
                "managedFields" => {
                    map.next_value::<IgnoredAny>()?;
                }
                "annotations" => {
                    out.key(&key);
                    map.next_value_seed(AnnotationsSeed(out))?;
                }
                _ => {
                    let value: Box<RawValue> = map.next_value()?;
                    out.field(&key, value.get());
                }
            }
        }
        out.end();
        Ok(meta)
    }
}

/// Copies an annotations map into the text, without kubectl's last-applied annotation.
struct AnnotationsSeed<'a>(&'a mut Json);

impl<'de> DeserializeSeed<'de> for AnnotationsSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for AnnotationsSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("annotations")
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<(), E> {
        self.0.text.push_str("null");
        Ok(())
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        self.visit_none()
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let out = self.0;
        out.begin();
        while let Some(key) = map.next_key::<String>()? {
            if key == LAST_APPLIED {
                map.next_value::<IgnoredAny>()?;
            } else {
                let value: Box<RawValue> = map.next_value()?;
                out.field(&key, value.get());
            }
        }
        out.end();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::App;
    use crate::watch_cache::slim;
    use kube::Resource;
    use kube::api::DynamicObject;

    fn app() -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "flotilla.dev/v1beta1", "kind": "App",
            "metadata": {"name": "web", "namespace": "shop", "uid": "app-uid", "resourceVersion": "7",
                "generation": 4, "labels": {"team": "a"},
                "annotations": {"note": "n\"quoted\"", LAST_APPLIED: "{\"a\": 1}"},
                "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
                "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "c", "uid": "c-uid"}],
                "finalizers": ["x/y"], "creationTimestamp": "2026-12-01T09:00:00Z"},
            "spec": {"image": "registry.example.com/web", "version": "2",
                "template": {"spec": {"containers": [{"name": "app", "env": [{"name": "A", "value": "\u{e9}\n"}]}]}}},
            "status": {"currentVersion": "1", "observedGeneration": 3}
        })
    }

    #[test]
    fn an_object_read_as_text_reads_back_as_the_slimmed_object() {
        let text = app().to_string();
        let streamed: Compact<App> = serde_json::from_str(&text).expect("read");
        let mut dynamic: DynamicObject = serde_json::from_str(&text).expect("a dynamic object");
        slim(&mut dynamic);
        let through_tree = Compact::<App>::of(dynamic).parse().expect("a valid App");
        let read = streamed.parse().expect("a valid App");
        assert_eq!(
            serde_json::to_value(&read).expect("serializes"),
            serde_json::to_value(&through_tree).expect("serializes"),
            "the same App as read through a tree, slimmed"
        );
        let m = streamed.meta();
        assert_eq!(
            (m.name.as_deref(), m.namespace.as_deref(), m.uid.as_deref(), m.resource_version.as_deref()),
            (Some("web"), Some("shop"), Some("app-uid"), Some("7"))
        );
        let annotations = read.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(annotations.get("note").map(String::as_str), Some("n\"quoted\""));
        assert!(!annotations.contains_key(LAST_APPLIED), "kubectl's copy dropped");
        assert!(read.metadata.managed_fields.is_none(), "managed fields dropped");
        assert!(!streamed.json().contains("managedFields") && !streamed.json().contains("kubectl"));
        assert_eq!(read.metadata.owner_references.map(|o| o.len()), Some(1), "owners kept, in the text");
        assert_eq!(read.metadata.generation, Some(4));
        assert_eq!(read.spec.version, "2");
    }

    #[test]
    fn odd_but_valid_objects_read_back() {
        for text in [
            r#"{"metadata": {"name": "a", "annotations": null}, "spec": {"image": "i", "version": "1"}}"#,
            r#"{"metadata": {"name": "a", "annotations": {}}, "spec": {"image": "i", "version": "1"}}"#,
            r#"{"metadata": {}, "spec": {"image": "i", "version": "1"}}"#,
            r#"{"spec": {"image": "i", "version": "1"}, "metadata": {"name": "a"}}"#,
        ] {
            let c: Compact<App> = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            let a = c.parse().unwrap_or_else(|e| panic!("{text} as {}: {e}", c.json()));
            assert_eq!(a.spec.image, "i");
        }
        let empty: Compact<App> = serde_json::from_str("{}").expect("read");
        assert_eq!(empty.json(), "{}");
        assert!(serde_json::from_str::<Compact<App>>("[]").is_err(), "not an object");
        assert!(serde_json::from_str::<Compact<App>>(r#"{"metadata": 7}"#).is_err(), "metadata not an object");
    }

    #[test]
    fn a_list_page_reads_the_same_way() {
        let page = serde_json::json!({"apiVersion": "flotilla.dev/v1beta1", "kind": "AppList",
            "metadata": {"resourceVersion": "9"}, "items": [app(), app()]})
        .to_string();
        let list: kube::core::ObjectList<Compact<App>> = serde_json::from_str(&page).expect("a page");
        assert_eq!(list.items.len(), 2);
        assert_eq!(list.items[1].parse().expect("an App").spec.version, "2");
        // As the apiserver writes an event: its type first (were the object first, serde would
        // hold it as a tree until it knew the type, and could not copy its text).
        let event = format!(r#"{{"type": "MODIFIED", "object": {}}}"#, app());
        let event: kube::core::WatchEvent<Compact<App>> = serde_json::from_str(&event).expect("an event");
        assert!(matches!(event, kube::core::WatchEvent::Modified(a) if a.meta().name.as_deref() == Some("web")));
    }
}
