//! Apps in namespaces that no Tenant has onboarded: Flotilla has no rights there, so it acts
//! on nothing and says why, once, on the App itself (status condition and a Warning Event).
//! It never retries: the App is looked at again only when it or the onboarded set changes.

use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::api::DynamicObject;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::{Controller, watcher};
use kube::{Client, Resource, ResourceExt};
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

async fn reconcile(obj: Arc<DynamicObject>, ctx: Arc<GuardContext>) -> Result<Action, ReconcileError> {
    let namespace = obj.namespace().unwrap_or_default();
    {
        let ownership = ctx.ownership.borrow();
        // Another replica answers for namespaces outside our shards; served ones are fine.
        if !ownership.owns(&namespace) || ownership.served.contains(&namespace) {
            return Ok(Action::await_change());
        }
    }
    let started = Instant::now();
    let Ok(app) = serde_json::to_value(obj.as_ref()).and_then(serde_json::from_value::<App>) else {
        return Ok(Action::await_change());
    };
    let now = now_to_the_second();
    let Some(status) = not_onboarded_status(&app, now) else {
        return Ok(Action::await_change());
    };
    let name = app.name_any();
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

fn error_policy(_obj: Arc<DynamicObject>, err: &ReconcileError, _ctx: Arc<GuardContext>) -> Action {
    warn!(error = %err, "could not report an App outside onboarded namespaces");
    Action::requeue(std::time::Duration::from_secs(60))
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
    let app_resource = kube::api::ApiResource::erase::<App>(&());
    let api = apps_api(&client, &Scope::All);
    let changes = futures::stream::unfold(ownership.clone(), |mut rx| async move {
        rx.changed().await.ok()?;
        Some(((), rx))
    });
    let ctx = Arc::new(GuardContext {
        recorder: Recorder::new(client.clone(), reporter),
        client,
        metrics,
        app_resource: app_resource.clone(),
        ownership,
        fence,
    });
    Controller::new_with(api, watcher::Config::default(), app_resource)
        .reconcile_all_on(changes)
        .graceful_shutdown_on(shutdown)
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
