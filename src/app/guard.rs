//! Apps in namespaces that no Tenant has onboarded: Flotilla has no rights there, so it acts
//! on nothing and says why, once, on the App itself (status condition and a Warning Event).
//! It never retries: the App is looked at again only when it or the onboarded set changes.
//!
//! Every replica watches Apps cluster-wide for this, so the guard keeps as little as it can:
//! metadata only (the App itself is read when there is something to report), and only Apps
//! in namespaces no Tenant onboarded. With 10,000 Apps in onboarded namespaces its cache is
//! empty. When a namespace leaves the onboarded set, the watch is started again, so that the
//! Apps it had skipped there are listed.

use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector;
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::controller::{Scope, apps_api};
use super::error::ReconcileError;
use super::reconcile::write_status;
use crate::api::conditions::{DesiredCondition, merge_conditions, now_to_the_second};
use crate::api::{App, AppPhase, AppStatus};
use crate::sharding::fence::Fence;
use crate::telemetry::Metrics;
use crate::tenancy::served::Ownership;
use crate::watch_cache::slim;

/// Reason on the Ready condition of an App in a namespace no Tenant onboarded.
pub const NOT_ONBOARDED: &str = "NamespaceNotOnboarded";

struct GuardContext {
    client: Client,
    recorder: Recorder,
    metrics: Metrics,
    app_resource: kube::api::ApiResource,
    ownership: watch::Receiver<Ownership>,
    fence: Fence,
}

/// The status that explains why nothing happens, or `None` when the App already shows it. Pure.
pub fn not_onboarded_status(app: &App, now: Timestamp) -> Option<AppStatus> {
    let namespace = app.namespace().unwrap_or_default();
    let previous = app.status.clone().unwrap_or_default();
    let message = format!(
        "namespace {namespace} is not onboarded: no Tenant lists it, so Flotilla has no rights here and creates nothing. \
         Ask your platform team to add it to a Tenant's spec.namespaces."
    );
    let already = previous.phase == Some(AppPhase::Degraded)
        && previous.conditions.iter().any(|c| c.type_ == "Ready" && c.reason == NOT_ONBOARDED && c.message == message);
    if already {
        return None;
    }
    let condition = DesiredCondition { type_: "Ready", status: false, reason: NOT_ONBOARDED.into(), message };
    Some(AppStatus {
        phase: Some(AppPhase::Degraded),
        conditions: merge_conditions(&previous.conditions, &[condition], app.metadata.generation, now),
        ..previous
    })
}

async fn reconcile(meta: Arc<PartialObjectMeta<App>>, ctx: Arc<GuardContext>) -> Result<Action, ReconcileError> {
    let namespace = meta.namespace().unwrap_or_default();
    {
        let ownership = ctx.ownership.borrow();
        // Another replica answers for namespaces outside our shards; served ones are fine.
        if !ownership.owns(&namespace) || ownership.served.contains(&namespace) {
            return Ok(Action::await_change());
        }
    }
    let started = Instant::now();
    // Read as a dynamic object, like the App controller does, so that a malformed App is
    // skipped rather than failing the read.
    let name = meta.name_any();
    let obj = match apps_api(&ctx.client, &Scope::Namespace(namespace.clone())).get_opt(&name).await {
        Ok(Some(obj)) => obj,
        Ok(None) => return Ok(Action::await_change()),
        Err(source) => return Err(ReconcileError::Read { kind: "App", namespace, name, source }),
    };
    let Ok(app) = serde_json::to_value(&obj).and_then(serde_json::from_value::<App>) else {
        return Ok(Action::await_change());
    };
    let now = now_to_the_second();
    let Some(status) = not_onboarded_status(&app, now) else {
        return Ok(Action::await_change());
    };
    if !ctx.fence.may_write(&namespace) {
        return Ok(Action::await_change());
    }
    let result = write_status(&ctx.client, &namespace, &name, &status).await;
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
    if !ctx.fence.may_write(&namespace) {
        return Ok(Action::await_change());
    }
    if let Err(e) = ctx.recorder.publish(&event, &obj.object_ref(&ctx.app_resource)).await {
        warn!(error = %e, "could not record Event");
    }
    Ok(Action::await_change())
}

fn error_policy(_obj: Arc<PartialObjectMeta<App>>, err: &ReconcileError, _ctx: Arc<GuardContext>) -> Action {
    warn!(error = %err, "could not report an App outside onboarded namespaces");
    Action::requeue(std::time::Duration::from_secs(60))
}

/// Whether the guard keeps an App of `namespace` in its cache. Pure.
pub fn guarded(namespace: Option<&str>, onboarded: &BTreeSet<String>) -> bool {
    namespace.is_some_and(|ns| !onboarded.contains(ns))
}

/// Whether a namespace the guard skipped is no longer onboarded (its Apps must be listed). Pure.
pub fn onboarded_set_shrank(skipped: &BTreeSet<String>, now: &BTreeSet<String>) -> bool {
    !skipped.is_subset(now)
}

/// Runs the guard until `shutdown`; looks at every App again whenever the served set changes.
pub async fn guard(
    client: Client,
    reporter: Reporter,
    metrics: Metrics,
    ownership: watch::Receiver<Ownership>,
    fence: Fence,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let ctx = Arc::new(GuardContext {
        recorder: Recorder::new(client.clone(), reporter),
        client: client.clone(),
        metrics,
        app_resource: kube::api::ApiResource::erase::<App>(&()),
        ownership: ownership.clone(),
        fence,
    });
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let skipped = ownership.borrow().onboarded.clone();
        let mut shrank = ownership.clone();
        let restart = {
            let skipped = skipped.clone();
            async move {
                let _ = shrank.wait_for(|o| onboarded_set_shrank(&skipped, &o.onboarded)).await;
            }
        };
        let (stopped_tx, stopped_rx) = tokio::sync::oneshot::channel::<()>();
        let run = run_guard(client.clone(), ctx.clone(), ownership.clone(), skipped, async move {
            let _ = stopped_rx.await;
        });
        let mut run = std::pin::pin!(run);
        tokio::select! {
            _ = &mut shutdown => {
                let _ = stopped_tx.send(());
                run.await;
                return;
            }
            _ = restart => {
                info!("a namespace left the onboarded set; listing Apps again for the guard");
                let _ = stopped_tx.send(());
                run.await;
            }
            _ = &mut run => return,
        }
    }
}

/// One run of the guard's controller over a metadata watch that skips `skipped` namespaces.
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
    let writer = reflector::store::Writer::<PartialObjectMeta<App>>::default();
    let store = writer.as_reader();
    let events = watcher(Api::<PartialObjectMeta<App>>::all(client), watcher::Config::default())
        .default_backoff()
        .modify(slim::<PartialObjectMeta<App>>)
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
    use crate::api::AppSpec;

    #[test]
    fn only_apps_outside_onboarded_namespaces_are_kept() {
        let onboarded: BTreeSet<String> = ["a", "b"].map(String::from).into();
        assert!(!guarded(Some("a"), &onboarded));
        assert!(guarded(Some("c"), &onboarded));
        assert!(!guarded(None, &onboarded));
        let fewer: BTreeSet<String> = ["b", "c"].map(String::from).into();
        assert!(onboarded_set_shrank(&onboarded, &fewer), "a left: its Apps must be listed");
        let more: BTreeSet<String> = ["a", "b", "c"].map(String::from).into();
        assert!(!onboarded_set_shrank(&onboarded, &more), "growing needs no new list");
    }

    #[test]
    fn marks_once_and_keeps_current_version() {
        let mut app = App::new("web", AppSpec { image: "a/b".into(), version: "2".into(), ..AppSpec::default() });
        app.metadata.namespace = Some("nowhere".into());
        app.status = Some(AppStatus { current_version: Some("1".into()), ..AppStatus::default() });
        let now = Timestamp::from_second(5).expect("ts");
        let status = not_onboarded_status(&app, now).expect("first time writes");
        assert_eq!(status.current_version.as_deref(), Some("1"));
        assert_eq!(status.conditions[0].reason, NOT_ONBOARDED);
        app.status = Some(status);
        assert_eq!(not_onboarded_status(&app, now), None, "second time writes nothing");
    }
}
