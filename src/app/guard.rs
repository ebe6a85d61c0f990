//! Apps in namespaces that no Tenant has onboarded: Flotilla has no rights there, so it acts
//! on nothing and says why, once, on the App itself (status condition and a Warning Event).
//! It never retries: the App is looked at again only when it or the onboarded set changes.
//!
//! Every replica watches Apps cluster-wide for this, so the guard keeps only the Apps in
//! namespaces no Tenant onboarded: with 10,000 Apps in onboarded namespaces its cache is
//! empty (it held every App of the cluster, in full, on every replica). When the onboarded
//! set changes (and has settled), the watch is started again: the Apps of a namespace that
//! left it are listed, those of one that joined it dropped.
//!
//! Anyone who may create Apps in any namespace, onboarded or not, reaches this watch on every
//! replica, so what it reads is bounded: it lists in pages of `APP_LIST_PAGE`, and reads of
//! each App only its key, generation and status (`LightApp`), skipping its spec, labels and
//! annotations as they are read: they can be as large as the apiserver stores an object.

use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Reporter};
use kube::runtime::reflector;
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::controller::{Scope, watch_apps};
use super::error::ReconcileError;
use super::light::{GuardedApp, LightApp, StatusSummary};
use super::reconcile::write_status;
use crate::api::conditions::{DesiredCondition, merge_conditions, now_to_the_second};
use crate::api::{AppPhase, AppStatus};
use crate::sharding::fence::Fence;
use crate::telemetry::Metrics;
use crate::telemetry::events::EventWriter;
use crate::tenancy::served::Ownership;

/// Reason on the Ready condition of an App in a namespace no Tenant onboarded.
pub const NOT_ONBOARDED: &str = "NamespaceNotOnboarded";

struct GuardContext {
    client: Client,
    events: EventWriter,
    metrics: Metrics,
    ownership: watch::Receiver<Ownership>,
    fence: Fence,
    /// Whether the apiserver streams a watch's initial state (`watch_cache::streaming_lists`).
    streaming_lists: bool,
}

/// The Ready condition's message on an App of `namespace` no Tenant onboarded. Pure.
pub fn not_onboarded_message(namespace: &str) -> String {
    format!(
        "namespace {namespace} is not onboarded: no Tenant lists it, so Flotilla has no rights here and creates nothing. \
         Ask your platform team to add it to a Tenant's spec.namespaces."
    )
}

/// Whether a status summed up as `summary` already says that `namespace` is not onboarded
/// (what `not_onboarded_status` would write). Pure.
pub fn already_marked(summary: &StatusSummary, namespace: &str) -> bool {
    summary.phase == Some(AppPhase::Degraded)
        && summary
            .ready
            .as_ref()
            .is_some_and(|(reason, message)| reason == NOT_ONBOARDED && *message == not_onboarded_message(namespace))
}

/// The status that explains why nothing happens to an App of `namespace` at `generation`
/// whose status is `previous`, or `None` when it already shows it. Pure.
pub fn not_onboarded_status(
    namespace: &str,
    generation: Option<i64>,
    previous: AppStatus,
    now: Timestamp,
) -> Option<AppStatus> {
    let message = not_onboarded_message(namespace);
    let already = previous.phase == Some(AppPhase::Degraded)
        && previous.conditions.iter().any(|c| c.type_ == "Ready" && c.reason == NOT_ONBOARDED && c.message == message);
    if already {
        return None;
    }
    let condition = DesiredCondition { type_: "Ready", status: false, reason: NOT_ONBOARDED.into(), message };
    Some(AppStatus {
        phase: Some(AppPhase::Degraded),
        conditions: merge_conditions(&previous.conditions, &[condition], generation, now),
        ..previous
    })
}

async fn reconcile(obj: Arc<GuardedApp>, ctx: Arc<GuardContext>) -> Result<Action, ReconcileError> {
    let namespace = obj.namespace().unwrap_or_default();
    {
        let ownership = ctx.ownership.borrow();
        // Another replica answers for namespaces outside our shards; served ones are fine.
        if !ownership.owns(&namespace) || ownership.served.contains(&namespace) {
            return Ok(Action::await_change());
        }
    }
    let started = Instant::now();
    // A status that does not read as one (written by another writer) is left as it is.
    let Some(summary) = obj.summary() else {
        return Ok(Action::await_change());
    };
    if already_marked(summary, &namespace) || !ctx.fence.may_write(&namespace) {
        return Ok(Action::await_change());
    }
    let name = obj.name_any();
    // The whole status as it is now (the cache keeps only its summary), which the write keeps.
    let api: kube::Api<LightApp> = kube::Api::namespaced(ctx.client.clone(), &namespace);
    let current = match api.get_opt(&name).await {
        Ok(Some(current)) => current,
        Ok(None) => return Ok(Action::await_change()),
        Err(source) => return Err(ReconcileError::Read { kind: "App", namespace, name, source }),
    };
    let Ok(previous) = current.status() else {
        return Ok(Action::await_change());
    };
    let Some(status) = not_onboarded_status(&namespace, current.meta().generation, previous, now_to_the_second())
    else {
        return Ok(Action::await_change());
    };
    // Looked at again after the read: the namespace may have been onboarded, or its shard
    // lost, meanwhile.
    {
        let ownership = ctx.ownership.borrow();
        if !ownership.owns(&namespace) || ownership.served.contains(&namespace) || !ctx.fence.may_write(&namespace) {
            return Ok(Action::await_change());
        }
    }
    let result =
        write_status(&ctx.client, &namespace, &name, &status, current.meta().resource_version.as_deref()).await;
    ctx.metrics.reconciled("guard", started.elapsed(), result.as_ref().err().map(|_| "refused"));
    result?;
    ctx.metrics.app_not_onboarded();
    info!(namespace, app = name, "App is in a namespace no Tenant onboarded; acting on nothing");
    let note = status.conditions.iter().find(|c| c.type_ == "Ready").map(|c| c.message.clone());
    let event = Event {
        type_: EventType::Warning,
        reason: NOT_ONBOARDED.into(),
        note,
        action: "Reconcile".into(),
        secondary: None,
    };
    let may_write = || ctx.fence.may_write(&namespace);
    if let Err(e) = ctx.events.publish_while(&event, &obj.object_ref(&()), may_write).await {
        warn!(error = %e, "could not record Event");
    }
    Ok(Action::await_change())
}

fn error_policy(_obj: Arc<GuardedApp>, err: &ReconcileError, _ctx: Arc<GuardContext>) -> Action {
    warn!(error = %err, "could not report an App outside onboarded namespaces");
    Action::requeue(std::time::Duration::from_secs(60))
}

/// Whether the guard keeps an App of `namespace` in its cache. Pure.
pub fn guarded(namespace: Option<&str>, onboarded: &BTreeSet<String>) -> bool {
    namespace.is_some_and(|ns| !onboarded.contains(ns))
}

/// Runs the guard until `shutdown`; looks at every App again whenever the served set changes.
pub async fn guard(
    client: Client,
    reporter: Reporter,
    metrics: Metrics,
    ownership: watch::Receiver<Ownership>,
    fence: Fence,
    streaming_lists: bool,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let ctx = Arc::new(GuardContext {
        streaming_lists,
        events: EventWriter::new(client.clone(), reporter),
        client: client.clone(),
        metrics,
        ownership: ownership.clone(),
        fence,
    });
    let mut shutdown = std::pin::pin!(shutdown);
    // Until the Tenants are known, every namespace would look un-onboarded.
    let mut published = ownership.clone();
    tokio::select! {
        _ = &mut shutdown => return,
        first = published.wait_for(|o| o.shards > 0) => if first.is_err() { return },
    }
    loop {
        let skipped = ownership.borrow().onboarded.clone();
        let restart = relist_needed(ownership.clone(), skipped.clone());
        let (stopped_tx, stopped_rx) = tokio::sync::oneshot::channel::<()>();
        let run = run_guard(client.clone(), ctx.clone(), ownership.clone(), skipped, async move {
            let _ = stopped_rx.await;
        });
        let mut run = std::pin::pin!(run);
        tokio::select! {
            // Shutting down: in-flight reconciles are cancelled (dropped with `run`), not
            // awaited; a write held up by a slow apiserver must not hold up the exit.
            _ = &mut shutdown => return,
            _ = restart => {
                info!("the onboarded namespaces changed; listing Apps again for the guard");
                let _ = stopped_tx.send(());
                run.await;
            }
            _ = &mut run => return,
        }
    }
}

/// Guard reconciles at once: each reads its App whole before it writes (as text, its spec
/// skipped, but the body is read whole), and a relist looks at every App outside the
/// onboarded namespaces.
const GUARD_CONCURRENCY: u16 = 4;

/// How long the onboarded set must stay unchanged before the guard lists Apps again: a
/// Tenant onboarding many namespaces changes it many times within seconds.
const ONBOARDED_SETTLE: std::time::Duration = std::time::Duration::from_secs(5);

/// Resolves once the onboarded set differs from `skipped` and has been quiet for
/// `ONBOARDED_SETTLE`. A namespace that left the set must be listed (its Apps were skipped);
/// one that joined it only frees memory, but both are rare.
async fn relist_needed(mut ownership: watch::Receiver<Ownership>, skipped: Arc<BTreeSet<String>>) {
    if ownership.wait_for(|o| o.onboarded != skipped).await.is_err() {
        return std::future::pending().await;
    }
    while let Ok(Ok(())) = tokio::time::timeout(ONBOARDED_SETTLE, ownership.changed()).await {}
}

/// One run of the guard's controller over a watch of Apps that skips `skipped` namespaces.
async fn run_guard(
    client: Client,
    ctx: Arc<GuardContext>,
    ownership: watch::Receiver<Ownership>,
    skipped: Arc<BTreeSet<String>>,
    stop: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let changes = futures::stream::unfold(ownership, |mut rx| async move {
        rx.changed().await.ok()?;
        Some(((), rx))
    });
    let writer = reflector::store::Writer::<GuardedApp>::new(());
    let store = writer.as_reader();
    let events = watch_apps::<GuardedApp>(&client, &Scope::All, ctx.streaming_lists)
        .default_backoff()
        .filter(move |event| {
            let keep = match event {
                Ok(watcher::Event::Apply(m) | watcher::Event::InitApply(m)) => {
                    guarded(m.namespace().as_deref(), &skipped)
                }
                _ => true,
            };
            std::future::ready(keep)
        })
        .reflect(writer)
        .touched_objects();
    Controller::for_stream(events, store)
        .with_config(kube::runtime::controller::Config::default().concurrency(GUARD_CONCURRENCY))
        .reconcile_all_on(changes)
        .graceful_shutdown_on(stop)
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                debug!(error = %e, "guard reconcile did not complete");
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_apps_outside_onboarded_namespaces_are_kept() {
        let onboarded: BTreeSet<String> = ["a", "b"].map(String::from).into();
        assert!(!guarded(Some("a"), &onboarded));
        assert!(guarded(Some("c"), &onboarded));
        assert!(!guarded(None, &onboarded));
    }

    #[test]
    fn a_summary_tells_whether_the_app_is_marked_already() {
        let marked = StatusSummary {
            phase: Some(AppPhase::Degraded),
            ready: Some((NOT_ONBOARDED.into(), not_onboarded_message("nowhere"))),
        };
        assert!(already_marked(&marked, "nowhere"));
        assert!(!already_marked(&marked, "elsewhere"), "the message names the namespace");
        assert!(!already_marked(&StatusSummary { phase: Some(AppPhase::Healthy), ..marked.clone() }, "nowhere"));
        assert!(!already_marked(&StatusSummary { ready: Some(("Other".into(), "x".into())), ..marked }, "nowhere"));
        assert!(!already_marked(&StatusSummary::default(), "nowhere"));
    }

    #[test]
    fn marks_once_and_keeps_current_version() {
        let previous = AppStatus { current_version: Some("1".into()), ..AppStatus::default() };
        let now = Timestamp::from_second(5).expect("ts");
        let status = not_onboarded_status("nowhere", Some(2), previous, now).expect("first time writes");
        assert_eq!(status.current_version.as_deref(), Some("1"));
        assert_eq!(status.conditions[0].reason, NOT_ONBOARDED);
        assert_eq!(status.conditions[0].observed_generation, Some(2));
        assert_eq!(not_onboarded_status("nowhere", Some(2), status, now), None, "second time writes nothing");
    }
}
