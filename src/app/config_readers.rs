//! Which Apps read which ConfigMaps (`ConfigMapReaders`): what a ConfigMap's change maps to.
//!
//! A tenant can change a ConfigMap many times a second and name it as it likes (`app`, the
//! name of every main container, is in the JSON of every App). So an App is read for the
//! ConfigMaps its template names when it changes, as its cache gets it, and a ConfigMap's
//! change is a look-up: no App is read then.
//!
//! Reading an App for them reads only its template's ConfigMap references (`named_in`), one
//! list entry at a time, the rest skipped unread. Only an App that names one is then parsed
//! whole, once per change of it, as its reconcile will: an App that does not parse, or whose
//! template is too large to be applied, waits for a change of its own (rolled by a ConfigMap,
//! its reconcile would only report it again, with a Warning Event per change of the
//! ConfigMap), and reads none here.

use kube::Resource;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use serde::Deserialize;
use serde::de::{Deserializer, SeqAccess, Visitor};
use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use super::config_map_key::ConfigMapKey;
use crate::api::App;
use crate::api::template::MAX_TEMPLATE_BYTES;
use crate::watch_cache::Compact;

/// The most ConfigMaps an App is known by name to read. An App that names more (a template of
/// 64 KiB can name thousands) is held as reading every ConfigMap of its namespace, so that
/// what the index holds of an App stays a few KiB.
pub const MAX_NAMED: usize = 64;

/// What an App reads.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Reads {
    /// These ConfigMaps (at most `MAX_NAMED`).
    Named(BTreeSet<String>),
    /// More than `MAX_NAMED`: every ConfigMap of its namespace counts.
    Every,
}

/// An App: its namespace and name.
type AppKey = (String, String);

/// The Apps that read ConfigMaps, both ways: what each reads, and who reads each.
#[derive(Debug, Default)]
struct Index {
    reads: HashMap<AppKey, Reads>,
    /// The readers of each ConfigMap, by its namespace and name.
    readers: HashMap<(String, String), BTreeSet<String>>,
    /// The Apps of each namespace that read every ConfigMap there.
    every: HashMap<String, BTreeSet<String>>,
}

impl Index {
    fn set(&mut self, key: AppKey, reads: Option<Reads>) {
        self.remove(&key);
        let Some(reads) = reads else { return };
        let (namespace, app) = &key;
        match &reads {
            Reads::Named(names) => {
                for name in names {
                    self.readers.entry((namespace.clone(), name.clone())).or_default().insert(app.clone());
                }
            }
            Reads::Every => {
                self.every.entry(namespace.clone()).or_default().insert(app.clone());
            }
        }
        self.reads.insert(key, reads);
    }

    fn remove(&mut self, key: &AppKey) {
        let (namespace, app) = key;
        match self.reads.remove(key) {
            None => {}
            Some(Reads::Named(names)) => {
                for name in names {
                    let config_map = (namespace.clone(), name);
                    forget(&mut self.readers, &config_map, app);
                }
            }
            Some(Reads::Every) => forget(&mut self.every, namespace, app),
        }
    }

    /// The Apps that read ConfigMap `name` of `namespace`.
    fn readers_of(&self, namespace: &str, name: &str) -> impl Iterator<Item = &String> {
        let named = self.readers.get(&(namespace.to_string(), name.to_string()));
        named.into_iter().chain(self.every.get(namespace)).flatten()
    }
}

/// Removes `app` from the set at `key`, and the set once empty.
fn forget<K: std::hash::Hash + Eq>(sets: &mut HashMap<K, BTreeSet<String>>, key: &K, app: &str) {
    if let Some(apps) = sets.get_mut(key) {
        apps.remove(app);
        if apps.is_empty() {
            sets.remove(key);
        }
    }
}

/// The live index, and the one being filled while the App cache reads an initial state
/// (swapped in at its end, as the cache's store does: an App deleted meanwhile leaves both).
#[derive(Debug, Default)]
struct State {
    live: Index,
    filling: Option<Index>,
}

/// Which Apps of an App controller's cache read which ConfigMaps; fed the cache's events
/// (`observe`). See the module's text.
#[derive(Clone, Debug, Default)]
pub struct ConfigMapReaders {
    state: Arc<Mutex<State>>,
}

impl ConfigMapReaders {
    /// Takes in an event of the App cache, as the cache gets it. An App is read before the
    /// lock is taken: a ConfigMap's change does not wait for it.
    pub fn observe(&self, event: &watcher::Event<Compact<App>>) {
        match event {
            watcher::Event::Apply(app) => {
                let (key, reads) = (key(app), reads_of(app));
                self.lock().live.set(key, reads);
            }
            watcher::Event::InitApply(app) => {
                let (key, reads) = (key(app), reads_of(app));
                self.lock().filling.get_or_insert_default().set(key, reads);
            }
            watcher::Event::Delete(app) => self.lock().live.remove(&key(app)),
            watcher::Event::Init => self.lock().filling = Some(Index::default()),
            watcher::Event::InitDone => {
                let mut state = self.lock();
                state.live = state.filling.take().unwrap_or_default();
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The Apps whose templates read `config_map`: those a change of it rolls.
    pub fn apps_reading(&self, config_map: &ConfigMapKey) -> Vec<ObjectRef<Compact<App>>> {
        let (Some(namespace), Some(name)) = (config_map.meta().namespace.as_deref(), config_map.meta().name.as_deref())
        else {
            return Vec::new();
        };
        self.lock().live.readers_of(namespace, name).map(|app| ObjectRef::new(app).within(namespace)).collect()
    }
}

fn key(app: &Compact<App>) -> AppKey {
    let meta = app.meta();
    (meta.namespace.clone().unwrap_or_default(), meta.name.clone().unwrap_or_default())
}

/// What `app` reads: none when it names no ConfigMap, does not parse, or has a template
/// its reconcile refuses as too large.
fn reads_of(app: &Compact<App>) -> Option<Reads> {
    let named = named_in(app.json());
    if named.is_empty() {
        return None;
    }
    let parsed = app.parse().ok()?;
    if parsed.spec.template.as_ref().is_none_or(|t| t.json_len() > MAX_TEMPLATE_BYTES) {
        return None;
    }
    Some(if named.len() > MAX_NAMED { Reads::Every } else { Reads::Named(named) })
}

/// The ConfigMaps named in the template of the App whose JSON is `json`, as
/// `config::config_maps_of` finds them in the typed template (env `configMapKeyRef`,
/// `envFrom` `configMapRef` of containers and init containers, `configMap` and projected
/// volumes), at most `MAX_NAMED` + 1 of them; none when that JSON does not read so. Of the
/// template only these references are read, one list entry at a time; the rest is skipped
/// as the text is read.
pub fn named_in(json: &str) -> BTreeSet<String> {
    serde_json::from_str::<AppRefs>(json)
        .ok()
        .and_then(|a| a.spec?.template?.spec)
        .map(|pod| {
            let mut found = Found::default();
            for list in [pod.containers, pod.init_containers] {
                found.take(list.map(|l| l.0));
            }
            found.take(pod.volumes.map(|l| l.0));
            found.0
        })
        .unwrap_or_default()
}

/// Names found so far: at most `MAX_NAMED` + 1, enough to tell that there are more.
#[derive(Default)]
struct Found(BTreeSet<String>);

impl Found {
    fn add(&mut self, name: Option<String>) {
        if let Some(name) = name.filter(|n| !n.is_empty())
            && self.0.len() <= MAX_NAMED
        {
            self.0.insert(name);
        }
    }

    fn take(&mut self, other: Option<Found>) {
        for name in other.map(|f| f.0).into_iter().flatten() {
            self.add(Some(name));
        }
    }
}

/// An entry of a list the references are read from: gives its names to `found`.
trait Refs {
    fn give(self, found: &mut Found);
}

/// A list read one entry at a time, keeping only the names each names (`null`: none).
struct Names<T>(Found, PhantomData<T>);

impl<'de, T: Deserialize<'de> + Refs> Deserialize<'de> for Names<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entries<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de> + Refs> Visitor<'de> for Entries<T> {
            type Value = Names<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut entries: A) -> Result<Self::Value, A::Error> {
                let mut found = Found::default();
                while let Some(entry) = entries.next_element::<T>()? {
                    entry.give(&mut found);
                }
                Ok(Names(found, PhantomData))
            }
        }
        deserializer.deserialize_seq(Entries(PhantomData))
    }
}

#[derive(Deserialize)]
struct AppRefs {
    spec: Option<SpecRefs>,
}

#[derive(Deserialize)]
struct SpecRefs {
    template: Option<TemplateRefs>,
}

#[derive(Deserialize)]
struct TemplateRefs {
    spec: Option<PodRefs>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodRefs {
    containers: Option<Names<ContainerRefs>>,
    init_containers: Option<Names<ContainerRefs>>,
    volumes: Option<Names<VolumeRefs>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ContainerRefs {
    env: Option<Names<EnvRefs>>,
    env_from: Option<Names<EnvFromRefs>>,
}

impl Refs for ContainerRefs {
    fn give(self, found: &mut Found) {
        found.take(self.env.map(|l| l.0));
        found.take(self.env_from.map(|l| l.0));
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct EnvRefs {
    value_from: Option<ValueFromRefs>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ValueFromRefs {
    config_map_key_ref: Option<NameRef>,
}

impl Refs for EnvRefs {
    fn give(self, found: &mut Found) {
        found.add(self.value_from.and_then(|v| v.config_map_key_ref?.name));
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct EnvFromRefs {
    config_map_ref: Option<NameRef>,
}

impl Refs for EnvFromRefs {
    fn give(self, found: &mut Found) {
        found.add(self.config_map_ref.and_then(|r| r.name));
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct VolumeRefs {
    config_map: Option<NameRef>,
    projected: Option<ProjectedRefs>,
}

#[derive(Deserialize)]
struct ProjectedRefs {
    sources: Option<Names<SourceRefs>>,
}

impl Refs for VolumeRefs {
    fn give(self, found: &mut Found) {
        found.add(self.config_map.and_then(|c| c.name));
        found.take(self.projected.and_then(|p| p.sources).map(|l| l.0));
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SourceRefs {
    config_map: Option<NameRef>,
}

impl Refs for SourceRefs {
    fn give(self, found: &mut Found) {
        found.add(self.config_map.and_then(|c| c.name));
    }
}

#[derive(Deserialize)]
struct NameRef {
    name: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::DynamicObject;
    use serde_json::{Value, json};

    fn cached(name: &str, template: Value) -> Compact<App> {
        // "replicas": an App that is invalid elsewhere than in its template.
        let replicas = if name == "invalid" { json!("three") } else { json!(1) };
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "flotilla.dev/v1beta1", "kind": "App",
            "metadata": {"name": name, "namespace": "shop", "uid": name, "annotations": {"mentions": "settings"}},
            "spec": {"image": "registry.example.com/web", "version": "1", "replicas": replicas, "template": template}
        }))
        .expect("an App");
        Compact::of(obj)
    }

    fn config_map(name: &str) -> ConfigMapKey {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "shop"}})).expect("a ConfigMap")
    }

    fn rolled(readers: &ConfigMapReaders, name: &str) -> Vec<String> {
        let mut apps: Vec<String> = readers.apps_reading(&config_map(name)).into_iter().map(|r| r.name).collect();
        apps.sort();
        apps
    }

    fn reading(name: &str) -> Value {
        json!({"spec": {"containers": [{"name": "app", "envFrom": [{"configMapRef": {"name": name}}]}]}})
    }

    #[test]
    fn the_names_read_are_those_the_typed_template_gives() {
        let template = json!({"spec": {
            "containers": [
                {"name": "app", "env": [
                    {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "env-key", "key": "a"}}},
                    {"name": "B", "value": "plain"},
                    {"name": "C", "valueFrom": {"secretKeyRef": {"name": "a-secret", "key": "c"}}},
                    {"name": "D", "valueFrom": null}
                ]},
                {"name": "side", "image": "x", "env": null,
                    "envFrom": [{"configMapRef": {"name": "env-from"}}, {"secretRef": {"name": "s"}}]}
            ],
            "initContainers": [{"name": "init", "image": "x", "envFrom": [{"configMapRef": {"name": "init-from"}}]}],
            "volumes": [
                {"name": "v1", "configMap": {"name": "mounted"}},
                {"name": "v2", "projected": {"sources": [{"configMap": {"name": "projected"}}, {"secret": {"name": "s2"}}]}},
                {"name": "v3", "emptyDir": {}},
                {"name": "v4", "configMap": {"name": ""}}
            ]
        }});
        let typed: crate::api::template::PodTemplate = serde_json::from_value(template.clone()).expect("a template");
        let app = cached("web", template);
        assert_eq!(named_in(app.json()), crate::app::config::config_maps_of(&typed));
        assert_eq!(named_in(app.json()).len(), 5);
        assert!(named_in(cached("plain", json!({"spec": {"containers": [{"name": "app"}]}})).json()).is_empty());
        assert!(named_in(cached("none", Value::Null).json()).is_empty());
        assert!(named_in("not JSON").is_empty());
    }

    #[test]
    fn a_config_map_change_rolls_only_the_apps_whose_templates_read_it() {
        let readers = ConfigMapReaders::default();
        let volume = json!({"spec": {"containers": [{"name": "app"}],
            "volumes": [{"name": "v", "configMap": {"name": "settings"}}]}});
        // Names it only where pods do not read it (a container's name, an annotation).
        let named = json!({"spec": {"containers": [{"name": "settings", "image": "x"}, {"name": "app"}]}});
        for app in [
            cached("env", reading("settings")),
            cached("volume", volume),
            cached("named", named),
            cached("invalid", reading("settings")),
        ] {
            readers.observe(&watcher::Event::Apply(app));
        }
        assert_eq!(rolled(&readers, "settings"), ["env", "volume"]);
        assert!(rolled(&readers, "other").is_empty());
        let elsewhere = ConfigMapKey::deserialize(json!({"metadata": {"name": "settings", "namespace": "other"}}));
        assert!(readers.apps_reading(&elsewhere.expect("a ConfigMap")).is_empty(), "another namespace's");
    }

    #[test]
    fn the_index_follows_each_app_as_it_changes_and_goes() {
        let readers = ConfigMapReaders::default();
        readers.observe(&watcher::Event::Apply(cached("web", reading("a"))));
        assert_eq!(rolled(&readers, "a"), ["web"]);
        readers.observe(&watcher::Event::Apply(cached("web", reading("b"))));
        assert!(rolled(&readers, "a").is_empty(), "it reads b now");
        assert_eq!(rolled(&readers, "b"), ["web"]);
        readers.observe(&watcher::Event::Delete(cached("web", reading("b"))));
        assert!(rolled(&readers, "b").is_empty());
        let state = readers.state.lock().expect("state");
        assert!(state.live.reads.is_empty() && state.live.readers.is_empty(), "nothing left: {state:?}");
    }

    #[test]
    fn an_initial_state_replaces_the_index_at_its_end() {
        let readers = ConfigMapReaders::default();
        readers.observe(&watcher::Event::Apply(cached("gone", reading("a"))));
        readers.observe(&watcher::Event::Init);
        readers.observe(&watcher::Event::InitApply(cached("web", reading("a"))));
        assert_eq!(rolled(&readers, "a"), ["gone"], "until the state is whole, the old one stands");
        readers.observe(&watcher::Event::InitDone);
        assert_eq!(rolled(&readers, "a"), ["web"], "an App deleted while no watch ran is gone");
    }

    #[test]
    fn an_app_naming_too_many_config_maps_reads_every_one() {
        let env: Vec<Value> = (0..=MAX_NAMED)
            .map(|i| json!({"name": format!("E{i}"), "valueFrom": {"configMapKeyRef": {"name": format!("c-{i}"), "key": "k"}}}))
            .collect();
        let readers = ConfigMapReaders::default();
        let many = cached("many", json!({"spec": {"containers": [{"name": "app", "env": env}]}}));
        assert_eq!(named_in(many.json()).len(), MAX_NAMED + 1, "enough to tell");
        readers.observe(&watcher::Event::Apply(many));
        readers.observe(&watcher::Event::Apply(cached("web", reading("c-1"))));
        assert_eq!(rolled(&readers, "c-1"), ["many", "web"]);
        assert_eq!(rolled(&readers, "unnamed"), ["many"]);
        readers.observe(&watcher::Event::Delete(cached("many", Value::Null)));
        assert!(rolled(&readers, "unnamed").is_empty());
    }

    #[test]
    fn an_app_whose_template_is_refused_reads_none() {
        let filler = "x".repeat(MAX_TEMPLATE_BYTES);
        let large = json!({"spec": {"containers": [{"name": "app", "args": [filler],
            "envFrom": [{"configMapRef": {"name": "a"}}]}]}});
        let readers = ConfigMapReaders::default();
        readers.observe(&watcher::Event::Apply(cached("large", large)));
        assert!(rolled(&readers, "a").is_empty());
    }
}
