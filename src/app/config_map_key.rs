//! A ConfigMap as the App controller reads it (`ConfigMapKey`): its name, namespace, uid,
//! resourceVersion, the opt-out annotation, and the fingerprint of its data, computed as the
//! text is read. Nothing else is held, not even for a moment.
//!
//! A tenant may create ConfigMaps, many of them, each as large as the apiserver stores
//! (about 1.5 MiB), shaped as it likes: a million labels, or a hundred thousand tiny data keys,
//! which the apiserver also lists one by one in the managed fields. Read into typed metadata
//! (labels as a map, managed fields as a tree of JSON values), such a ConfigMap takes many
//! times its length, and a list page holds many; read into a typed ConfigMap to fingerprint
//! its data, again. Here each field is skipped unread, or, for `data` and `binaryData`, fed to
//! the fingerprint one entry at a time.
//!
//! The fingerprint is the one `config::data_fingerprint` computes of a typed ConfigMap (its
//! `data` and `binaryData` as JSON, in key order), which is what the pod templates' stamps
//! already hold: a replica of this version rolls nothing that an older one stamped. The
//! apiserver writes a map's keys in order; were they not, the entries would be fed as they
//! come (a changed stamp, never a wrong read).

use super::config::ANNOTATION_TRACKING;
use crate::api::fingerprint::Fnv1a64;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;
use serde::Deserialize;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use std::borrow::Cow;
use std::fmt;
use std::io::Write;

/// See the module's text.
#[derive(Clone, Debug)]
pub struct ConfigMapKey {
    metadata: ObjectMeta,
    data_fingerprint: String,
}

impl ConfigMapKey {
    /// The fingerprint of its `data` and `binaryData` (`config::data_fingerprint`).
    pub fn data_fingerprint(&self) -> &str {
        &self.data_fingerprint
    }

    /// Whether it opted out of the stamp (`config::ANNOTATION_TRACKING` set to "false").
    pub fn untracked(&self) -> bool {
        self.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION_TRACKING)).map(String::as_str) == Some("false")
    }
}

crate::watch_cache::resource_as!(ConfigMapKey, ConfigMap);

impl<'de> Deserialize<'de> for ConfigMapKey {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(ConfigMapVisitor)
    }
}

struct ConfigMapVisitor;

impl<'de> Visitor<'de> for ConfigMapVisitor {
    type Value = ConfigMapKey;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a ConfigMap")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ConfigMapKey, A::Error> {
        let mut metadata = ObjectMeta::default();
        // `[data,binaryData]` as `serde_json::to_vec` writes the pair: `data` goes straight to
        // the fingerprint wherever it comes; `binaryData`, written after it, is kept as text
        // until the end in case it comes first.
        let mut fingerprint = Fnv1a64::default();
        fingerprint.update(b"[");
        let mut data_seen = false;
        let mut binary = Vec::new();
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            match key.as_ref() {
                "metadata" => metadata = map.next_value_seed(MetaSeed)?,
                "data" if !data_seen => {
                    data_seen = true;
                    map.next_value_seed(EntriesSeed(&mut fingerprint))?;
                }
                "binaryData" if binary.is_empty() => map.next_value_seed(EntriesSeed(&mut binary))?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        if !data_seen {
            fingerprint.update(b"null");
        }
        fingerprint.update(b",");
        fingerprint.update(if binary.is_empty() { b"null" } else { &binary });
        fingerprint.update(b"]");
        Ok(ConfigMapKey { metadata, data_fingerprint: fingerprint.hex() })
    }
}

/// The key of a ConfigMap's metadata, and of its annotations only the opt-out one.
struct MetaSeed;

impl<'de> DeserializeSeed<'de> for MetaSeed {
    type Value = ObjectMeta;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<ObjectMeta, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for MetaSeed {
    type Value = ObjectMeta;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a ConfigMap's metadata")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ObjectMeta, A::Error> {
        let mut meta = ObjectMeta::default();
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            match key.as_ref() {
                "name" => meta.name = map.next_value()?,
                "namespace" => meta.namespace = map.next_value()?,
                "uid" => meta.uid = map.next_value()?,
                "resourceVersion" => meta.resource_version = map.next_value()?,
                "annotations" => {
                    let tracking = map.next_value::<Option<TrackingOnly>>()?.and_then(|t| t.0);
                    meta.annotations = tracking.map(|v| [(ANNOTATION_TRACKING.to_string(), v)].into());
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(meta)
    }
}

/// Of an annotations map, the opt-out annotation's value.
struct TrackingOnly(Option<String>);

impl<'de> Deserialize<'de> for TrackingOnly {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = TrackingOnly;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("annotations")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<TrackingOnly, A::Error> {
                let mut tracking = None;
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    if key == ANNOTATION_TRACKING {
                        tracking = Some(map.next_value::<String>()?);
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(TrackingOnly(tracking))
            }
        }
        deserializer.deserialize_map(V)
    }
}

/// Writes a map of strings (or null) as `serde_json::to_vec` writes a `BTreeMap<String,
/// String>`, one entry at a time, to `self.0`; a null value as `null`.
struct EntriesSeed<'a, W>(&'a mut W);

impl<'de, W: Write> DeserializeSeed<'de> for EntriesSeed<'_, W> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de, W: Write> Visitor<'de> for EntriesSeed<'_, W> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map of strings")
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<(), E> {
        self.0.write_all(b"null").map_err(E::custom)
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        self.visit_none()
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        use serde::de::Error as _;
        let out = self.0;
        let mut first = true;
        out.write_all(b"{").map_err(A::Error::custom)?;
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            // `null` too (kube-apiserver 1.36 writes a null value back as "", but were one
            // sent): a ConfigMap that did not read would fail its whole list page, and the
            // namespace's cache would never fill.
            let value = map.next_value::<Option<Cow<'de, str>>>()?;
            if !first {
                out.write_all(b",").map_err(A::Error::custom)?;
            }
            first = false;
            serde_json::to_writer(&mut *out, &key).map_err(A::Error::custom)?;
            out.write_all(b":").map_err(A::Error::custom)?;
            serde_json::to_writer(&mut *out, &value).map_err(A::Error::custom)?;
        }
        out.write_all(b"}").map_err(A::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::config::data_fingerprint;
    use kube::Resource;
    use serde_json::json;

    fn both(value: serde_json::Value) -> (String, String) {
        let typed: ConfigMap = serde_json::from_value(value.clone()).expect("a ConfigMap");
        let read: ConfigMapKey = serde_json::from_str(&value.to_string()).expect("read");
        (read.data_fingerprint().to_string(), data_fingerprint(&typed))
    }

    #[test]
    fn the_fingerprint_is_the_typed_configmaps_whatever_the_fields_order() {
        let meta = json!({"name": "settings", "namespace": "shop", "resourceVersion": "7"});
        for value in [
            json!({"metadata": meta, "data": {"a": "1", "b": "two\n\"quoted\" <&> \u{e9}\u{2028}"}}),
            json!({"metadata": meta, "binaryData": {"k": "aGVsbG8="}, "data": {"a": "1"}}),
            json!({"metadata": meta, "data": {"a": "1"}, "binaryData": {"k": "aGVsbG8=", "l": ""}}),
            json!({"metadata": meta, "data": {}}),
            json!({"metadata": meta, "data": null}),
            json!({"metadata": meta}),
            json!({"metadata": meta, "binaryData": {"k": "aGVsbG8="}}),
        ] {
            let (read, typed) = both(value.clone());
            assert_eq!(read, typed, "{value}");
        }
        // The fields' order as the apiserver writes them (serde_json's `json!` sorts them).
        let text = r#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"s"},"binaryData":{"k":"aGk="},"data":{"a":"\u003c"}}"#;
        let typed: ConfigMap = serde_json::from_str(text).expect("a ConfigMap");
        let read: ConfigMapKey = serde_json::from_str(text).expect("read");
        assert_eq!(read.data_fingerprint(), data_fingerprint(&typed), "escapes and order as Go writes them");
    }

    #[test]
    fn keeps_its_key_and_the_opt_out_only() {
        let big = "x".repeat(4096);
        let text = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "n", "resourceVersion": "7", "uid": "u",
                "labels": {"a": "b"}, "annotations": {"big": big, ANNOTATION_TRACKING: "false"},
                "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:data": {"f:a": {}}}}]},
            "data": {"a": big}})
        .to_string();
        let read: ConfigMapKey = serde_json::from_str(&text).expect("read");
        let m = read.meta();
        assert_eq!(
            (m.name.as_deref(), m.namespace.as_deref(), m.uid.as_deref(), m.resource_version.as_deref()),
            (Some("c"), Some("n"), Some("u"), Some("7"))
        );
        assert!(m.labels.is_none() && m.managed_fields.is_none());
        assert_eq!(m.annotations.as_ref().map(|a| a.len()), Some(1));
        assert!(read.untracked());
        let tracked: ConfigMapKey =
            serde_json::from_str(r#"{"metadata": {"name": "c", "annotations": null}}"#).expect("read");
        assert!(!tracked.untracked());
    }
}
