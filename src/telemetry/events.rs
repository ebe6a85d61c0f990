//! Kubernetes Events, written with a small memory of what was sent. The App controllers of
//! all the namespaces a replica serves share one writer's memory, each writing through its
//! namespace's client (`with_client`: past the shard fence); the Tenant controller and the
//! guard have one each.
//!
//! kube-runtime's `Recorder` keeps every Event it sent, whole (about 3.6 KiB each with its
//! key), for 6 minutes, and prunes only when it sends another: a namespace whose App went
//! quiet after a burst of Warnings held them for good, in one cache per namespace. Its series
//! key also leaves out the note, so a second Warning of the same reason with another message
//! (a tenant who fixed one field of an App and broke another) became a count on the first
//! Event, which still showed the old message.
//!
//! This writer keeps, per series, only what a repeat needs: a keyed hash of what makes two
//! Events the same (type, reason, action, the object, the related object and the note: the
//! note too, as client-go's core/v1 correlator does, unlike its events.k8s.io recorder), the
//! Event's namespace and name, its count and when it was last sent. A repeat within
//! `SERIES_TTL` patches that Event's `series` (count and last time) instead of making another;
//! the user reads one Event with a count, as `kubectl describe` shows for Kubernetes' own
//! controllers, and each distinct message once. Series older than `SERIES_TTL` are
//! forgotten, and there are at most `MAX_SERIES` of them (100-400 bytes each, so at most about
//! 3 MiB): when all are live, the namespace with the most gives up its oldest, so a tenant who
//! floods distinct Warnings evicts its own series, not another tenant's.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a repeat still counts on the Event sent before it (client-go's and kube-runtime's
/// 6 minutes).
pub const SERIES_TTL: Duration = Duration::from_secs(6 * 60);

/// Series remembered at most by one writer, for all the namespaces it writes to.
pub const MAX_SERIES: usize = 8192;

/// How often expired series are swept out (each publish checks).
const SWEEP_EVERY: Duration = Duration::from_secs(30);

/// An Event sent before, as remembered.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Sent {
    namespace: Box<str>,
    name: Box<str>,
    count: i32,
    last: Instant,
}

/// What to do with an Event. Pure: see `SeriesCache::decide`.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Decision {
    /// A new Event.
    Create,
    /// The `count`th of the series of the Event `name`.
    Repeat { name: String, count: i32 },
}

/// The series remembered: keys are keyed hashes (see `EventWriter::key`).
#[derive(Debug)]
struct SeriesCache {
    sent: HashMap<u64, Sent>,
    swept: Option<Instant>,
    capacity: usize,
}

impl SeriesCache {
    fn new(capacity: usize) -> Self {
        Self { sent: HashMap::new(), swept: None, capacity }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.sent.len()
    }

    /// Whether the Event of `key` in `namespace` repeats one sent within `SERIES_TTL` of
    /// `now`. An entry of another namespace under the same key (a hash collision, which the
    /// random key makes as good as impossible to aim for) is never patched: a tenant's Event
    /// cannot count on another namespace's.
    fn decide(&mut self, key: u64, namespace: &str, now: Instant) -> Decision {
        self.sweep(now);
        match self.sent.get(&key) {
            Some(s) if &*s.namespace == namespace && now.saturating_duration_since(s.last) < SERIES_TTL => {
                Decision::Repeat { name: s.name.to_string(), count: s.count.saturating_add(1) }
            }
            _ => Decision::Create,
        }
    }

    /// Remembers that the Event `name` was sent as the `count`th of its series at `now`.
    fn sent(&mut self, key: u64, namespace: &str, name: &str, count: i32, now: Instant) {
        if self.capacity == 0 {
            return;
        }
        if !self.sent.contains_key(&key) && self.sent.len() >= self.capacity {
            self.sweep_all(now);
            if self.sent.len() >= self.capacity {
                self.make_room();
            }
        }
        self.sent.insert(key, Sent { namespace: namespace.into(), name: name.into(), count, last: now });
    }

    /// Full of live series: the namespace that has the most gives up the one it sent longest
    /// ago. Two passes over the cache, only when it is full.
    fn make_room(&mut self) {
        let mut per_namespace: HashMap<&str, usize> = HashMap::new();
        for s in self.sent.values() {
            *per_namespace.entry(&s.namespace).or_default() += 1;
        }
        let Some(largest) = per_namespace.into_iter().max_by_key(|(_, n)| *n).map(|(ns, _)| ns.to_string()) else {
            return;
        };
        let oldest = self.sent.iter().filter(|(_, s)| *s.namespace == *largest).min_by_key(|(_, s)| s.last);
        if let Some(key) = oldest.map(|(k, _)| *k) {
            self.sent.remove(&key);
        }
    }

    /// Forgets the series of `key` (its Event is gone, or was refused).
    fn forget(&mut self, key: u64) {
        self.sent.remove(&key);
    }

    fn sweep(&mut self, now: Instant) {
        if self.swept.is_none_or(|at| now.saturating_duration_since(at) >= SWEEP_EVERY) {
            self.sweep_all(now);
        }
    }

    fn sweep_all(&mut self, now: Instant) {
        self.sent.retain(|_, s| now.saturating_duration_since(s.last) < SERIES_TTL);
        self.swept = Some(now);
    }
}

/// The errors of writing an Event.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    #[error("creating Event {name} in namespace {namespace}: {source}")]
    Create { namespace: String, name: String, source: kube::Error },
    #[error("counting a repeat on Event {name} in namespace {namespace}: {source}")]
    Repeat { namespace: String, name: String, source: kube::Error },
}

/// Whether the apiserver refused a request for good (a client error other than throttling).
fn refused(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if (400..500).contains(&s.code) && s.code != 429)
}

/// Writes Events (events.k8s.io/v1); cheap to clone (clones share their series).
#[derive(Clone)]
pub struct EventWriter {
    client: Client,
    reporter: Reporter,
    keys: RandomState,
    series: Arc<Mutex<SeriesCache>>,
}

impl EventWriter {
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self { client, reporter, keys: RandomState::new(), series: Arc::new(Mutex::new(SeriesCache::new(MAX_SERIES))) }
    }

    /// What makes two Events one series (the module's text says which fields, and why the
    /// note), hashed with this writer's random key: a tenant who writes the App's name or a
    /// note cannot aim at another's series.
    fn key(&self, ev: &Event, regarding: &ObjectReference) -> u64 {
        let object = |r: &ObjectReference| {
            (r.api_version.clone(), r.kind.clone(), r.namespace.clone(), r.name.clone(), r.uid.clone())
        };
        let type_ = matches!(ev.type_, EventType::Warning);
        self.keys.hash_one((
            type_,
            &ev.reason,
            &ev.action,
            &ev.note,
            object(regarding),
            ev.secondary.as_ref().map(object),
        ))
    }

    /// This writer (its series and its key) writing through `client`: each namespace's
    /// controller writes its Events through that namespace's client, which looks at the
    /// shard fence again as each write leaves.
    pub fn with_client(&self, client: Client) -> Self {
        Self { client, ..self.clone() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SeriesCache> {
        // The cache holds no invariant a panic could break half-way.
        self.series.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Sends `ev` about `regarding`: a new Event, or a count on the one sent for the same
    /// thing within `SERIES_TTL`. The Event goes to `regarding`'s namespace ("default" for a
    /// cluster-scoped object, as kube-runtime does).
    pub async fn publish(&self, ev: &Event, regarding: &ObjectReference) -> Result<(), EventError> {
        self.publish_while(ev, regarding, || true).await
    }

    /// `publish`, where `may_write` is asked before each request (the first, and a new Event
    /// after the one a repeat would have counted on is gone): a replica whose hold on the
    /// namespace lapsed writes nothing, and that is no error.
    pub async fn publish_while(
        &self,
        ev: &Event,
        regarding: &ObjectReference,
        may_write: impl Fn() -> bool,
    ) -> Result<(), EventError> {
        if !may_write() {
            return Ok(());
        }
        let namespace = regarding.namespace.clone().unwrap_or_else(|| "default".into());
        let key = self.key(ev, regarding);
        let decided = self.lock().decide(key, &namespace, Instant::now());
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
        if let Decision::Repeat { name, count } = decided {
            let now = Timestamp::now();
            let patch = serde_json::json!({
                "series": EventSeries { count, last_observed_time: MicroTime(now) },
            });
            match api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => {
                    self.lock().sent(key, &namespace, &name, count, Instant::now());
                    return Ok(());
                }
                // Gone (the apiserver keeps Events for an hour by default): a new one.
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    self.lock().forget(key);
                    if !may_write() {
                        return Ok(());
                    }
                }
                Err(source) => {
                    // Refused (not throttled): the next repeat starts a new Event rather than
                    // patch this one again until the series expires.
                    if refused(&source) {
                        self.lock().forget(key);
                    }
                    return Err(EventError::Repeat { namespace, name, source });
                }
            }
        }
        let event = self.event(ev, regarding, &namespace, Timestamp::now());
        let name = event.metadata.name.clone().unwrap_or_default();
        match api.create(&PostParams::default(), &event).await {
            Ok(_) => {
                self.lock().sent(key, &namespace, &name, 1, Instant::now());
                Ok(())
            }
            Err(source) => Err(EventError::Create { namespace, name, source }),
        }
    }

    /// The Event as first sent (kube-runtime's fields and naming: `<object>.<nanoseconds>`).
    fn event(&self, ev: &Event, regarding: &ObjectReference, namespace: &str, now: Timestamp) -> K8sEvent {
        let controller = self.reporter.controller.clone();
        let prefix = regarding.name.as_deref().unwrap_or(&controller);
        K8sEvent {
            action: Some(ev.action.clone()),
            reason: Some(ev.reason.clone()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            related: ev.secondary.clone(),
            note: ev.note.clone(),
            metadata: ObjectMeta {
                namespace: Some(namespace.to_string()),
                name: Some(format!("{prefix}.{:x}", now.as_nanosecond())),
                ..Default::default()
            },
            reporting_instance: Some(self.reporter.instance.clone().unwrap_or_else(|| controller.clone())),
            reporting_controller: Some(controller),
            type_: Some(match ev.type_ {
                EventType::Normal => "Normal".into(),
                EventType::Warning => "Warning".into(),
            }),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t0: Instant, secs: u64) -> Instant {
        t0 + Duration::from_secs(secs)
    }

    #[test]
    fn a_repeat_within_the_ttl_counts_on_the_first_event() {
        let t0 = Instant::now();
        let mut c = SeriesCache::new(16);
        assert_eq!(c.decide(1, "shop", t0), Decision::Create);
        c.sent(1, "shop", "web.1", 1, t0);
        assert_eq!(c.decide(1, "shop", at(t0, 10)), Decision::Repeat { name: "web.1".into(), count: 2 });
        c.sent(1, "shop", "web.1", 2, at(t0, 10));
        // The TTL runs from the last repeat, not the first Event.
        assert_eq!(c.decide(1, "shop", at(t0, 10 + 359)), Decision::Repeat { name: "web.1".into(), count: 3 });
        assert_eq!(c.decide(1, "shop", at(t0, 10 + 360)), Decision::Create, "6 minutes after the last: a new Event");
        assert_eq!(c.decide(2, "shop", t0), Decision::Create, "another key");
    }

    #[test]
    fn an_entry_of_another_namespace_is_never_patched() {
        let t0 = Instant::now();
        let mut c = SeriesCache::new(16);
        c.sent(7, "victim", "db.1", 4, t0);
        assert_eq!(c.decide(7, "attacker", t0), Decision::Create);
    }

    #[test]
    fn expired_series_are_swept_and_the_cache_never_passes_its_capacity() {
        let t0 = Instant::now();
        let mut c = SeriesCache::new(3);
        for k in 0..3 {
            c.sent(k, "ns", "e", 1, at(t0, k));
        }
        // Full of live series: the oldest (key 0) makes room.
        c.sent(9, "ns", "e", 1, at(t0, 5));
        assert_eq!(c.len(), 3);
        assert_eq!(c.decide(0, "ns", at(t0, 5)), Decision::Create);
        assert!(matches!(c.decide(1, "ns", at(t0, 5)), Decision::Repeat { .. }));
        // A decide after the TTL sweeps every expired series out.
        let _ = c.decide(42, "ns", at(t0, 1000));
        assert_eq!(c.len(), 0);
        // Updating a remembered series at capacity evicts nothing.
        let mut c = SeriesCache::new(2);
        c.sent(1, "ns", "a", 1, t0);
        c.sent(2, "ns", "b", 1, t0);
        c.sent(1, "ns", "a", 2, at(t0, 1));
        assert_eq!(c.len(), 2);
        assert!(matches!(c.decide(2, "ns", at(t0, 1)), Decision::Repeat { .. }));
    }

    #[test]
    fn a_tenant_flooding_distinct_events_evicts_its_own_series_not_another_tenants() {
        let t0 = Instant::now();
        let mut c = SeriesCache::new(8);
        // The victim's series are the oldest of all.
        c.sent(100, "victim", "db.1", 1, t0);
        c.sent(101, "victim", "db.2", 1, t0);
        for k in 0..50 {
            c.sent(k, "flood", "x", 1, at(t0, 1 + k));
        }
        assert_eq!(c.len(), 8);
        assert!(matches!(c.decide(100, "victim", at(t0, 60)), Decision::Repeat { .. }));
        assert!(matches!(c.decide(101, "victim", at(t0, 60)), Decision::Repeat { .. }));
        assert!(matches!(c.decide(49, "flood", at(t0, 60)), Decision::Repeat { .. }), "its newest stays");
        assert_eq!(c.decide(0, "flood", at(t0, 60)), Decision::Create, "its oldest went");
    }

    #[test]
    fn a_cache_of_no_capacity_remembers_nothing() {
        let mut c = SeriesCache::new(0);
        c.sent(1, "ns", "e", 1, Instant::now());
        assert_eq!(c.len(), 0);
    }

    #[test]
    fn only_client_errors_other_than_throttling_forget_a_series() {
        let api = |code| kube::Error::Api(kube::core::Status { code, ..Default::default() }.boxed());
        assert!(refused(&api(422)) && refused(&api(403)));
        assert!(!refused(&api(429)) && !refused(&api(500)) && !refused(&api(503)));
    }

    #[test]
    fn counts_do_not_overflow() {
        let t0 = Instant::now();
        let mut c = SeriesCache::new(4);
        c.sent(1, "ns", "e", i32::MAX, t0);
        assert_eq!(c.decide(1, "ns", t0), Decision::Repeat { name: "e".into(), count: i32::MAX });
    }

    fn writer() -> EventWriter {
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("a URL"));
        let client = Client::try_from(config).expect("a client");
        EventWriter::new(client, Reporter { controller: "flotilla".into(), instance: Some("r-0".into()) })
    }

    fn app(name: &str, namespace: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("flotilla.dev/v1beta1".into()),
            kind: Some("App".into()),
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            uid: Some(format!("{namespace}-{name}")),
            ..Default::default()
        }
    }

    fn warning(note: &str) -> Event {
        Event {
            type_: EventType::Warning,
            reason: "InvalidSpec".into(),
            note: Some(note.into()),
            action: "Reconcile".into(),
            secondary: None,
        }
    }

    #[tokio::test]
    async fn the_note_and_the_object_are_part_of_the_series_key() {
        let w = writer();
        let k = w.key(&warning("a"), &app("web", "shop"));
        assert_eq!(k, w.key(&warning("a"), &app("web", "shop")));
        assert_ne!(k, w.key(&warning("b"), &app("web", "shop")), "another message is another Event");
        assert_ne!(k, w.key(&warning("a"), &app("api", "shop")));
        assert_ne!(k, w.key(&warning("a"), &app("web", "other")));
        let mut normal = warning("a");
        normal.type_ = EventType::Normal;
        assert_ne!(k, w.key(&normal, &app("web", "shop")));
        // Another writer (replica) keys with another secret.
        assert_ne!(k, writer().key(&warning("a"), &app("web", "shop")));
    }

    #[tokio::test]
    async fn nothing_is_sent_while_the_namespace_may_not_be_written() {
        let w = writer();
        w.publish_while(&warning("a"), &app("web", "shop"), || false).await.expect("nothing sent, no error");
        // The same call allowed does send, to an address where nothing answers.
        assert!(w.publish_while(&warning("a"), &app("web", "shop"), || true).await.is_err());
    }

    #[tokio::test]
    async fn a_writer_for_another_client_shares_the_series_and_the_key() {
        let w = writer();
        let other = w.with_client(writer().client.clone());
        assert_eq!(w.key(&warning("a"), &app("web", "shop")), other.key(&warning("a"), &app("web", "shop")));
        assert!(Arc::ptr_eq(&w.series, &other.series), "a repeat sent through either counts on the same Event");
    }

    #[tokio::test]
    async fn the_event_is_written_as_kubernetes_expects() {
        let w = writer();
        let e = w.event(&warning("bad"), &app("web", "shop"), "shop", Timestamp::UNIX_EPOCH);
        assert_eq!(e.metadata.namespace.as_deref(), Some("shop"));
        assert_eq!(e.metadata.name.as_deref(), Some("web.0"));
        assert_eq!(e.reporting_controller.as_deref(), Some("flotilla"));
        assert_eq!(e.reporting_instance.as_deref(), Some("r-0"));
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!(
            (e.reason.as_deref(), e.action.as_deref(), e.note.as_deref()),
            (Some("InvalidSpec"), Some("Reconcile"), Some("bad"))
        );
        assert!(e.series.is_none() && e.event_time.is_some());
    }
}
