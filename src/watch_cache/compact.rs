//! Cached objects kept as text: what the reflector and the controller read of an object (its
//! name, namespace, uid, resourceVersion and owners) as metadata, the rest as its JSON.
//!
//! A `Deployment` is 2,448 bytes before any of its data and a `Service` 824, every optional
//! field inline, and each of their strings and maps a heap block of its own: the caches'
//! entries were a fifth of a replica's heap at a third of 10,000 Apps (`bench/heap.sh`). As
//! text, an entry is its metadata and one block of about the size of its JSON. A reconcile
//! that reads an object parses it back (`expand`), a few microseconds for a projected
//! Deployment, and drops it when done.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::api::DynamicObject;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

/// `K` as cached: see the module's text.
pub struct Compact<K> {
    metadata: ObjectMeta,
    /// `K` as JSON, without the fields kept in `metadata`.
    rest: Box<str>,
    kind: PhantomData<fn() -> K>,
}

impl<K> Clone for Compact<K> {
    fn clone(&self) -> Self {
        Self { metadata: self.metadata.clone(), rest: self.rest.clone(), kind: PhantomData }
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

/// Read as any object of the kind (`of` a `DynamicObject`): the controller's bound for the
/// objects it reconciles.
impl<'de, K> Deserialize<'de> for Compact<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        DynamicObject::deserialize(deserializer).map(Compact::of)
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
        // An object read from the apiserver always serializes; were one not to, it reads back
        // as its metadata alone, which differs from anything wanted (never a silent match).
        let rest = serde_json::to_string(&obj).unwrap_or_default().into_boxed_str();
        Self { metadata, rest, kind: PhantomData }
    }

    /// The object as it was cached, parsed as `K`: an error when it is not a valid `K`.
    pub fn parse(&self) -> Result<K, serde_json::Error>
    where
        K: Resource + DeserializeOwned,
    {
        let mut obj: K = serde_json::from_str(&self.rest)?;
        let m = obj.meta_mut();
        m.name.clone_from(&self.metadata.name);
        m.namespace.clone_from(&self.metadata.namespace);
        m.uid.clone_from(&self.metadata.uid);
        m.resource_version.clone_from(&self.metadata.resource_version);
        m.owner_references.clone_from(&self.metadata.owner_references);
        Ok(obj)
    }

    /// The object as it was cached, for kinds that always parse (those cached from `K`
    /// itself, see `of`).
    pub fn expand(&self) -> K
    where
        K: Resource + DeserializeOwned + Default,
    {
        self.parse().unwrap_or_else(|e| {
            tracing::warn!(error = %e, name = ?self.metadata.name, "a cached object could not be read back");
            let mut obj = K::default();
            *obj.meta_mut() = self.metadata.clone();
            obj
        })
    }

    /// The JSON the entry holds beside its metadata.
    pub fn json(&self) -> &str {
        &self.rest
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Service;

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
        assert_eq!(c.expand(), s);
        assert_eq!(c.meta().name.as_deref(), Some("web"));
        assert_eq!(c.meta().owner_references, s.metadata.owner_references, "the controller maps owners from these");
        assert!(c.meta().labels.is_none(), "kept once, in the text");
        assert_eq!(<Compact<Service> as Resource>::kind(&()), "Service");
        assert_eq!(<Compact<Service> as Resource>::plural(&()), "services");
    }

    #[test]
    fn an_entry_is_smaller_than_the_struct() {
        let c = Compact::<Service>::of(service());
        let entry = std::mem::size_of::<Compact<Service>>() + c.json().len();
        assert!(entry < std::mem::size_of::<Service>(), "{entry} bytes against {}", std::mem::size_of::<Service>());
    }
}
