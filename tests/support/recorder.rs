//! Every change to a namespace's Services and Deployments, replayed in the apiserver's order.
//! A test that samples the cluster with GETs can miss a state that lasts less than one of its
//! rounds (a busy CI machine makes rounds long); a watch misses none. The apiserver numbers
//! every write of every kind from etcd's one revision counter, so the two watches merge into
//! one history by resourceVersion (this holds for the project's control plane, one etcd with
//! no --etcd-servers-overrides).
#![allow(dead_code)]

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio::task::JoinHandle;

/// One object as a watch reported it: present (applied) or deleted.
#[derive(Clone, Debug)]
pub enum Change {
    Service(String, Option<Box<Service>>),
    Deployment(String, Option<Box<Deployment>>),
}

#[derive(Clone, Debug)]
struct Seen {
    revision: u64,
    initial: bool,
    change: Change,
}

/// The namespace as it stood after one write.
#[derive(Clone, Debug, Default)]
pub struct State {
    pub revision: u64,
    pub services: BTreeMap<String, Service>,
    pub deployments: BTreeMap<String, Deployment>,
}

impl State {
    /// The `flotilla.dev/track` the Service `name` selects: `Err` when it does not exist,
    /// `Ok(None)` when it selects every pod of the App.
    pub fn track(&self, name: &str) -> Result<Option<String>, ()> {
        self.services.get(name).map(track_of).ok_or(())
    }
}

/// The `flotilla.dev/track` a Service selects (`None`: every pod of the App).
pub fn track_of(service: &Service) -> Option<String> {
    service.spec.as_ref()?.selector.as_ref()?.get("flotilla.dev/track").cloned()
}

pub struct Recorder {
    seen: Arc<Mutex<Vec<Seen>>>,
    /// Why a watch left a hole in the history (a second list), if one did.
    broken: Arc<Mutex<Option<String>>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Recorder {
    /// Starts both watches and returns once each has listed the namespace.
    pub async fn start(client: kube::Client, namespace: &str) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let broken = Arc::new(Mutex::new(None));
        let (listed_tx, mut listed_rx) = tokio::sync::mpsc::channel::<()>(2);
        let services: Api<Service> = Api::namespaced(client.clone(), namespace);
        let deployments: Api<Deployment> = Api::namespaced(client, namespace);
        let tasks = vec![
            tokio::spawn(record(services, seen.clone(), broken.clone(), listed_tx.clone(), Change::Service)),
            tokio::spawn(record(deployments, seen.clone(), broken.clone(), listed_tx, Change::Deployment)),
        ];
        for _ in 0..2 {
            tokio::time::timeout(std::time::Duration::from_secs(30), listed_rx.recv())
                .await
                .expect("the recorder's watches listed the namespace within 30 s")
                .expect("a recorder's watch ended before it listed");
        }
        Recorder { seen, broken, tasks }
    }

    /// Waits (up to `timeout`) until the namespace as the watches have delivered it so far
    /// passes `check`: the end of what a test judges is then in the history, not still on
    /// its way when the watches stop.
    pub async fn wait_until(&self, timeout: std::time::Duration, what: &str, check: impl Fn(&State) -> bool) {
        let start = std::time::Instant::now();
        loop {
            let seen = self.seen.lock().expect("recorder lock").clone();
            if check(&replay(seen).0) {
                return;
            }
            assert!(start.elapsed() < timeout, "the recorded history did not reach {what} within {timeout:?}");
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    /// Stops the watches and returns the namespace after each write made since they listed,
    /// oldest first. The states before are not returned: until every object listed is
    /// applied, a state would miss objects that existed.
    pub fn stop(self) -> Vec<State> {
        for task in &self.tasks {
            task.abort();
        }
        if let Some(why) = self.broken.lock().expect("recorder lock").clone() {
            panic!("the recorder's history has a hole: {why}");
        }
        let seen = self.seen.lock().expect("recorder lock").clone();
        replay(seen).1
    }
}

/// The namespace as the last write left it, and after each write since the lists, in
/// resourceVersion order.
fn replay(mut seen: Vec<Seen>) -> (State, Vec<State>) {
    seen.sort_by_key(|s| s.revision);
    let listed_up_to = seen.iter().filter(|s| s.initial).map(|s| s.revision).max().unwrap_or(0);
    let mut state = State::default();
    let mut after = Vec::new();
    for s in seen {
        match s.change {
            Change::Service(name, Some(o)) => drop(state.services.insert(name, *o)),
            Change::Service(name, None) => drop(state.services.remove(&name)),
            Change::Deployment(name, Some(o)) => drop(state.deployments.insert(name, *o)),
            Change::Deployment(name, None) => drop(state.deployments.remove(&name)),
        }
        state.revision = s.revision;
        if s.revision > listed_up_to {
            after.push(state.clone());
        }
    }
    (state, after)
}

async fn record<K>(
    api: Api<K>,
    seen: Arc<Mutex<Vec<Seen>>>,
    broken: Arc<Mutex<Option<String>>>,
    listed: tokio::sync::mpsc::Sender<()>,
    change: fn(String, Option<Box<K>>) -> Change,
) where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    // 0: not etcd's revision, which the merge cannot order (reported as a hole below).
    let revision = |o: &K| o.meta().resource_version.as_deref().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let name = |o: &K| o.meta().name.clone().unwrap_or_default();
    // An error is retried from the last resourceVersion seen (no hole); a 410 makes the
    // watcher list again, which is caught below.
    let mut stream = watcher(api, watcher::Config::default()).default_backoff().boxed();
    let mut lists = 0;
    while let Some(event) = stream.next().await {
        let entry = match event {
            Ok(watcher::Event::InitApply(o)) => {
                Seen { revision: revision(&o), initial: true, change: change(name(&o), Some(Box::new(o))) }
            }
            Ok(watcher::Event::Apply(o)) => {
                Seen { revision: revision(&o), initial: false, change: change(name(&o), Some(Box::new(o))) }
            }
            Ok(watcher::Event::Delete(o)) => {
                Seen { revision: revision(&o), initial: false, change: change(name(&o), None) }
            }
            Ok(watcher::Event::InitDone) => {
                let _ = listed.send(()).await;
                continue;
            }
            Ok(watcher::Event::Init) => {
                lists += 1;
                if lists > 1 {
                    // A second list replaces what the watch missed with the objects as they
                    // are now: the writes in between are lost.
                    *broken.lock().expect("recorder lock") = Some("a watch listed again".into());
                }
                continue;
            }
            Err(_) => continue,
        };
        if entry.revision == 0 {
            *broken.lock().expect("recorder lock") =
                Some(format!("an object without a numeric resourceVersion: {:?}", entry.change));
        }
        seen.lock().expect("recorder lock").push(entry);
    }
}
