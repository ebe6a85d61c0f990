//! Cached objects kept as text: what the reflector and the controller read of an object (its
//! name, namespace, uid, resourceVersion and owners) as metadata, the rest as its JSON.
//!
//! A `Deployment` is 2,448 bytes before any of its data and a `Service` 824, every optional
//! field inline, and each of their strings and maps a heap block of its own: the caches'
//! entries were a fifth of a replica's heap at a third of 10,000 Apps (`bench/heap.sh`). As
//! text, an entry is its metadata and one block of about the size of its JSON. A reconcile
//! that reads an object parses it back (`parse`), a few microseconds for a projected
//! Deployment, and drops it when done.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

/// `K` as cached: see the module's text.
pub struct Compact<K> {
    metadata: ObjectMeta,
    /// `K` as JSON, without the fields kept in `metadata`; empty when `oversized`.
    rest: Box<str>,
    /// The length of that JSON and the limit it was cached under, when it was longer than
    /// the limit: its text is then not kept, and `parse` says why.
    oversized: Option<(u32, u32)>,
    kind: PhantomData<fn() -> K>,
}

impl<K> Clone for Compact<K> {
    fn clone(&self) -> Self {
        Self { metadata: self.metadata.clone(), rest: self.rest.clone(), oversized: self.oversized, kind: PhantomData }
    }
}

impl<K> fmt::Debug for Compact<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Compact")
            .field("namespace", &self.metadata.namespace)
            .field("name", &self.metadata.name)
            .field("resource_version", &self.metadata.resource_version)
            .field("bytes", &self.rest.len())
            .finish()
    }
}

/// Read as any object, the kind not checked, straight into its cached form: each field copied
/// as the text it is, whatever its shape, with what `slim` drops dropped (`streamed`). A
/// cache of Apps is filled this way; its owner references stay in the text.
impl<'de, K> Deserialize<'de> for Compact<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        super::streamed::read(deserializer)
    }
}

impl<K: Resource<DynamicType = ()>> Resource for Compact<K> {
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }
    fn api_version(dt: &()) -> Cow<'_, str> {
        K::api_version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl<K> Compact<K> {
    /// `obj`, an object of `K`'s kind read as `T` (`K` itself, or a `DynamicObject` that `K`
    /// may not parse), as cached.
    pub fn of<T: Resource + Serialize>(mut obj: T) -> Self {
        let m = obj.meta_mut();
        let metadata = ObjectMeta {
            name: m.name.take(),
            namespace: m.namespace.take(),
            uid: m.uid.take(),
            resource_version: m.resource_version.take(),
            owner_references: m.owner_references.take(),
            ..ObjectMeta::default()
        };
        // An object read from the apiserver always serializes. Were one not to, its text would
        // be empty, which `parse` refuses: a reader fails rather than act on half an object.
        let rest = serde_json::to_string(&obj).unwrap_or_default().into_boxed_str();
        Self { metadata, rest, oversized: None, kind: PhantomData }
    }

    /// An entry of `metadata` (the fields `of` keeps there) and the JSON of the rest.
    pub(super) fn from_parts(metadata: ObjectMeta, rest: Box<str>) -> Self {
        Self { metadata, rest, oversized: None, kind: PhantomData }
    }

    /// This entry without its text when that is longer than `limit` bytes. A writer of the
    /// object's namespace can make it as large as the apiserver stores (1.5 MiB by etcd's
    /// default), and a cache keeps every object of its kind there: kept whole, a few hundred
    /// of them would take a replica's whole memory, and with it every tenant's rollouts, on
    /// each replica the namespace's shard moved to after that. `compact_cache` caps every
    /// entry it keeps with it.
    ///
    /// The owner references kept in the metadata count too (a writer may put a thousand on
    /// an object); over the limit only the controller's is kept, which maps the object's
    /// events to its App.
    pub fn at_most(mut self, limit: usize) -> Self {
        let owners = self.metadata.owner_references.as_ref().map_or(0, json_len);
        let bytes = self.rest.len().saturating_add(owners);
        if bytes > limit {
            let clamp = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
            self.oversized = Some((clamp(bytes), clamp(limit)));
            self.rest = Box::from("");
            if let Some(owners) = self.metadata.owner_references.as_mut() {
                owners.retain(|o| o.controller == Some(true));
                owners.truncate(1);
            }
        }
        self
    }

    /// The length of the object's JSON and the limit it was over, when its text was not kept.
    pub fn oversized(&self) -> Option<(u32, u32)> {
        self.oversized
    }

    /// The object as it was cached, parsed as `K`: an error when it is not a valid `K` (an App
    /// a tenant wrote wrong; never an object cached from `K` itself).
    pub fn parse(&self) -> Result<K, serde_json::Error>
    where
        K: Resource + DeserializeOwned,
    {
        if let Some((bytes, limit)) = self.oversized {
            return Err(serde::de::Error::custom(format!(
                "it is {bytes} bytes of JSON, more than the {limit} Flotilla reads of one; make it smaller"
            )));
        }
        // On error, its message names no line or column: they would be of this text, which is
        // not the text the object's writer sent. (Not parsed again as a tree of values for a
        // message without them: an object of many small parts takes 58 times its length so.)
        let mut obj: K = serde_json::from_str(&self.rest).map_err(|e| {
            let message = e.to_string();
            let without_position = message.rfind(" at line ").map_or(message.as_str(), |at| &message[..at]);
            serde::de::Error::custom(without_position)
        })?;
        let m = obj.meta_mut();
        m.name.clone_from(&self.metadata.name);
        m.namespace.clone_from(&self.metadata.namespace);
        m.uid.clone_from(&self.metadata.uid);
        m.resource_version.clone_from(&self.metadata.resource_version);
        // Read through `Deserialize`, an object's owners stay in its text.
        if self.metadata.owner_references.is_some() {
            m.owner_references.clone_from(&self.metadata.owner_references);
        }
        Ok(obj)
    }

    /// The JSON the entry holds beside its metadata (none when `oversized`).
    pub fn json(&self) -> &str {
        &self.rest
    }
}

/// The length of `value` as JSON (0 if it does not serialize, which a value read from the
/// apiserver always does).
fn json_len<T: Serialize>(value: &T) -> usize {
    serde_json::to_string(value).map_or(0, |s| s.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Service;
    use kube::api::DynamicObject;

    fn service() -> Service {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "shop", "uid": "u-1", "resourceVersion": "9",
                "labels": {"app.kubernetes.io/name": "web"},
                "ownerReferences": [{"apiVersion": "flotilla.dev/v1beta1", "kind": "App", "name": "web",
                    "uid": "app-uid", "controller": true}]},
            "spec": {"selector": {"app.kubernetes.io/name": "web"}, "clusterIP": "10.0.0.7",
                "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}
        }))
        .expect("a Service")
    }

    #[test]
    fn an_object_reads_back_as_it_was_cached() {
        let s = service();
        let c = Compact::<Service>::of(s.clone());
        assert_eq!(c.parse().expect("parses"), s);
        assert_eq!(c.meta().name.as_deref(), Some("web"));
        assert_eq!(c.meta().owner_references, s.metadata.owner_references, "the controller maps owners from these");
        assert!(c.meta().labels.is_none(), "kept once, in the text");
        assert_eq!(<Compact<Service> as Resource>::kind(&()), "Service");
        assert_eq!(<Compact<Service> as Resource>::plural(&()), "services");
    }

    /// An App as a watch of dynamic objects delivers it.
    fn app(spec: serde_json::Value) -> DynamicObject {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "flotilla.dev/v1beta1", "kind": "App",
            "metadata": {"name": "web", "namespace": "shop", "uid": "app-uid", "resourceVersion": "7",
                "generation": 4, "labels": {"team": "a"}, "annotations": {"note": "n"},
                "finalizers": ["x/y"], "deletionTimestamp": "2026-12-01T10:00:00Z",
                "creationTimestamp": "2026-12-01T09:00:00Z"},
            "spec": spec,
            "status": {"currentVersion": "1", "observedGeneration": 3}
        }))
        .expect("an App")
    }

    #[test]
    fn an_app_watched_as_a_dynamic_object_reads_back_whole() {
        use crate::api::App;
        let c = Compact::<App>::of(app(serde_json::json!({"image": "registry.example.com/web", "version": "2"})));
        let a = c.parse().expect("a valid App");
        let m = &a.metadata;
        assert_eq!(
            (m.name.as_deref(), m.namespace.as_deref(), m.uid.as_deref()),
            (Some("web"), Some("shop"), Some("app-uid"))
        );
        assert_eq!((m.resource_version.as_deref(), m.generation), (Some("7"), Some(4)));
        assert_eq!(m.labels.as_ref().and_then(|l| l.get("team")).map(String::as_str), Some("a"));
        assert_eq!(m.annotations.as_ref().and_then(|l| l.get("note")).map(String::as_str), Some("n"));
        assert_eq!(m.finalizers.as_deref(), Some(&["x/y".to_string()][..]));
        assert!(m.deletion_timestamp.is_some() && m.creation_timestamp.is_some());
        assert_eq!(a.spec.version, "2");
        assert_eq!(a.status.as_ref().and_then(|s| s.current_version.as_deref()), Some("1"));
    }

    #[test]
    fn a_malformed_app_is_an_error_that_names_no_column_of_the_cached_text() {
        use crate::api::App;
        let c = Compact::<App>::of(app(
            serde_json::json!({"image": "registry.example.com/web", "version": "2", "replicas": "three"}),
        ));
        let e = c.parse().expect_err("replicas is not a number").to_string();
        assert!(e.contains("three") && !e.contains("column"), "{e}");
        // Text that is not even JSON (never written, but refused all the same).
        let empty =
            Compact::<Service> { metadata: ObjectMeta::default(), rest: "".into(), oversized: None, kind: PhantomData };
        assert!(empty.parse().is_err(), "half an object is never read back");
    }

    #[test]
    fn an_object_over_the_limit_keeps_its_metadata_and_says_why_it_cannot_be_read() {
        use crate::api::App;
        let huge = "x".repeat(300 * 1024);
        let obj = app(serde_json::json!({"image": "registry.example.com/web", "version": "2",
            "template": {"spec": {"containers": [{"name": "app", "env": [{"name": "E", "value": huge}]}]}}}));
        let c = Compact::<App>::of(obj.clone()).at_most(256 * 1024);
        assert!(c.json().is_empty(), "its text is not kept");
        assert_eq!(c.meta().name.as_deref(), Some("web"), "its key is");
        let (bytes, limit) = c.oversized().expect("over the limit");
        assert!(bytes > 300 * 1024 && limit == 256 * 1024, "{bytes} {limit}");
        let e = c.parse().expect_err("not read").to_string();
        assert!(e.contains(&format!("it is {bytes} bytes of JSON, more than the 262144")), "{e}");
        // Owner references count, and only the controller's is kept over the limit.
        let mut owned = service();
        let stray = |i: usize| k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "example.com/v1".into(),
            kind: "Thing".into(),
            name: "x".repeat(200),
            uid: format!("stray-{i}"),
            ..Default::default()
        };
        if let Some(owners) = owned.metadata.owner_references.as_mut() {
            owners.extend((0..2000).map(stray));
        }
        let c = Compact::<Service>::of(owned).at_most(256 * 1024);
        assert!(c.oversized().is_some_and(|(bytes, _)| bytes > 256 * 1024), "the owners counted");
        let owners = c.meta().owner_references.as_deref().unwrap_or_default();
        assert_eq!(owners.len(), 1, "only the controller's kept");
        assert_eq!(owners[0].uid, "app-uid");
        // At or under the limit, kept whole.
        let whole = Compact::<App>::of(obj).at_most(400 * 1024);
        assert!(whole.oversized().is_none());
        assert_eq!(whole.parse().expect("read").spec.version, "2");
    }

    #[test]
    fn an_owned_object_maps_to_the_key_of_its_cached_app() {
        use crate::api::App;
        use kube::runtime::reflector::ObjectRef;
        // What the controller does with a Deployment's (or Service's) event: its owners, in its
        // namespace, as keys of the App cache.
        let cached_app = Compact::<App>::of(app(serde_json::json!({"image": "i", "version": "1"})));
        let owned = Compact::<Service>::of(service());
        let owner = owned.meta().owner_references.as_ref().and_then(|o| o.first()).expect("an owner");
        let mut owner = owner.clone();
        owner.name = "web".into();
        let key = ObjectRef::<Compact<App>>::from_owner_ref(owned.meta().namespace.as_deref(), &owner, ());
        assert_eq!(key, Some(ObjectRef::from_obj(&cached_app)));
        owner.kind = "Rollout".into();
        assert_eq!(ObjectRef::<Compact<App>>::from_owner_ref(Some("shop"), &owner, ()), None, "another kind's");
    }

    #[test]
    fn an_entry_is_smaller_than_the_struct() {
        let c = Compact::<Service>::of(service());
        let entry = std::mem::size_of::<Compact<Service>>() + c.json().len();
        assert!(entry < std::mem::size_of::<Service>(), "{entry} bytes against {}", std::mem::size_of::<Service>());
    }
}
