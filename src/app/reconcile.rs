//! One reconcile of one App: read the cache, plan with the pure functions, apply only what
//! differs, write status only when it changed, and record Events for every change.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{Span, field, info, instrument, warn};

use super::context::Context;
use super::desired::{
    AppIdentity, Difference, deployment_differences, desired_deployment, desired_hpa, hpa_differences,
};
use super::error::{ReconcileError, retry_delay};
use super::names::FIELD_MANAGER;
use super::status::{Blocker, desired_status};
use crate::api::{App, AppPhase};

/// How often an App that is still converging is looked at even without a watch event.
const PROGRESS_RECHECK: Duration = Duration::from_secs(30);

/// How long a reconcile waits for the namespace's caches before it reports and backs off.
const CACHE_SYNC_LIMIT: Duration = Duration::from_secs(30);

/// Controller name used in metrics and Events.
pub const CONTROLLER: &str = "app";

/// Entry point for the controller: one span, metrics, and the failure counter reset.
#[instrument(skip_all, fields(tenant = field::Empty, namespace = field::Empty, app = field::Empty, shard = field::Empty, result = field::Empty))]
pub async fn reconcile(obj: Arc<DynamicObject>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let span = Span::current();
    let namespace = obj.namespace().unwrap_or_default();
    if let Some(tenant) = &ctx.tenant {
        span.record("tenant", tenant.as_str());
    }
    if let Some(fence) = &ctx.fence {
        span.record("shard", i64::from(fence.shard_of(&namespace)));
    }
    span.record("namespace", namespace);
    span.record("app", obj.name_any());
    let started = Instant::now();
    let result = reconcile_app(&obj, &ctx).await;
    ctx.metrics.reconciled(CONTROLLER, started.elapsed(), result.as_ref().err().map(ReconcileError::kind));
    span.record("result", if result.is_ok() { "ok" } else { "error" });
    if result.is_ok() {
        ctx.reset_failures(&obj);
    }
    result
}

/// Chooses when to retry a failed reconcile: conflicts at once, refusals with exponential
/// backoff per App, invalid objects only when they change.
pub fn error_policy(obj: Arc<DynamicObject>, err: &ReconcileError, ctx: Arc<Context>) -> Action {
    let failures = ctx.count_failure(&obj);
    warn!(namespace = obj.namespace().unwrap_or_default(), app = obj.name_any(), error = %err, failures, "reconcile failed");
    match retry_delay(err.class(), failures.saturating_sub(1)) {
        Some(delay) => Action::requeue(delay),
        None => Action::await_change(),
    }
}

async fn reconcile_app(obj: &DynamicObject, ctx: &Context) -> Result<Action, ReconcileError> {
    let namespace = obj.namespace().unwrap_or_default();
    let name = obj.name_any();
    let app: App = match serde_json::to_value(obj).and_then(serde_json::from_value) {
        Ok(app) => app,
        Err(source) => {
            let writable = ctx.may_write(&namespace);
            let err = ReconcileError::InvalidApp { namespace, name, source };
            if writable {
                ctx.publish(
                    &obj.object_ref(&ctx.app_resource),
                    EventType::Warning,
                    "InvalidSpec",
                    "Reconcile",
                    err.to_string(),
                )
                .await;
            }
            return Err(err);
        }
    };
    if app.metadata.deletion_timestamp.is_some() {
        // Owner references let the garbage collector remove the Deployment and HPA.
        return Ok(Action::await_change());
    }
    let id = AppIdentity::of(&app)
        .ok_or_else(|| ReconcileError::NotStored { namespace: namespace.clone(), name: name.clone() })?;
    if !ctx.caches_synced_within(CACHE_SYNC_LIMIT).await {
        return Err(ReconcileError::CachesNotSynced { namespace, after: CACHE_SYNC_LIMIT });
    }
    let fenced = || ReconcileError::Fenced { namespace: namespace.clone() };

    let app_ref = app.object_ref(&());
    let spec_changed = app.status.as_ref().and_then(|s| s.observed_generation) != app.metadata.generation;
    let mut failure: Option<ReconcileError> = None;

    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &namespace);
    let wanted = desired_deployment(&app, &id);
    let observed = ctx.deployments.get(&ObjectRef::new(&name).within(&namespace));
    let mut deployment = observed.as_deref().cloned();
    let diffs = deployment_differences(&wanted, observed.as_deref());
    if !diffs.is_empty() {
        if !ctx.may_write(&namespace) {
            return Err(fenced());
        }
        match apply(&deployments, &name, &wanted, "Deployment").await {
            Ok(applied) => {
                deployment = Some(applied);
                ctx.report_change(&app_ref, "Deployment", &name, observed.is_some(), spec_changed, &diffs).await;
            }
            Err(e) => failure = Some(e),
        }
    }

    if failure.is_none()
        && let Err(e) = reconcile_hpa(&app, &id, ctx, spec_changed).await
    {
        failure = Some(e);
    }

    let blocker = failure.as_ref().map(|e| Blocker { reason: e.reason().to_string(), message: e.to_string() });
    let now = crate::api::conditions::now_to_the_second();
    let status = desired_status(&app, deployment.as_ref(), blocker.as_ref(), now);
    if app.status.as_ref() != Some(&status) {
        if !ctx.may_write(&namespace) {
            return Err(fenced());
        }
        let previous_phase = app.status.as_ref().and_then(|s| s.phase);
        write_status(&ctx.client, &namespace, &name, &status).await?;
        if previous_phase != status.phase && status.phase == Some(AppPhase::Healthy) {
            let note = format!(
                "version {} is available with {} replicas",
                app.spec.version,
                status.ready.clone().unwrap_or_default()
            );
            ctx.publish(&app_ref, EventType::Normal, "Available", "Rollout", note).await;
        }
    }

    if let Some(err) = failure {
        if !ctx.may_write(&namespace) {
            return Err(fenced());
        }
        ctx.publish(&app_ref, EventType::Warning, err.reason(), "Reconcile", err.to_string()).await;
        return Err(err);
    }
    Ok(match status.phase {
        Some(AppPhase::Healthy) => Action::await_change(),
        _ => Action::requeue(PROGRESS_RECHECK),
    })
}

async fn reconcile_hpa(app: &App, id: &AppIdentity, ctx: &Context, spec_changed: bool) -> Result<(), ReconcileError> {
    let namespace = &id.namespace;
    let name = super::names::hpa_name(&id.name);
    let api: Api<HorizontalPodAutoscaler> = Api::namespaced(ctx.client.clone(), namespace);
    let observed = ctx.hpas.get(&ObjectRef::new(&name).within(namespace));
    let app_ref = app.object_ref(&());
    match desired_hpa(app, id) {
        Some(wanted) => {
            let diffs = hpa_differences(&wanted, observed.as_deref());
            if !diffs.is_empty() {
                if !ctx.may_write(namespace) {
                    return Err(ReconcileError::Fenced { namespace: namespace.clone() });
                }
                apply(&api, &name, &wanted, "HorizontalPodAutoscaler").await?;
                ctx.report_change(&app_ref, "HorizontalPodAutoscaler", &name, observed.is_some(), spec_changed, &diffs)
                    .await;
            }
        }
        None => {
            let ours = observed.as_deref().is_some_and(|h| h.owner_references().iter().any(|o| o.uid == id.owner.uid));
            if ours {
                if !ctx.may_write(namespace) {
                    return Err(ReconcileError::Fenced { namespace: namespace.clone() });
                }
                match api.delete(&name, &DeleteParams::background()).await {
                    Ok(_) => {
                        info!(namespace, hpa = name, "deleted HorizontalPodAutoscaler: autoscaling was turned off");
                        ctx.publish(
                            &app_ref,
                            EventType::Normal,
                            "Deleted",
                            "Delete",
                            format!("HorizontalPodAutoscaler {name}: autoscaling was turned off"),
                        )
                        .await;
                    }
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(source) => {
                        return Err(ReconcileError::Delete {
                            kind: "HorizontalPodAutoscaler",
                            namespace: namespace.clone(),
                            name,
                            source,
                        });
                    }
                }
            }
        }
    }
    Ok(())
}

async fn apply<K>(api: &Api<K>, name: &str, object: &K, kind: &'static str) -> Result<K, ReconcileError>
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug,
{
    api.patch(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(object)).await.map_err(|source| {
        ReconcileError::Apply {
            kind,
            namespace: object.meta().namespace.clone().unwrap_or_default(),
            name: name.to_string(),
            source,
        }
    })
}

/// Writes an App's whole status with server-side apply (the operator's field manager owns
/// every status field, so fields left out are removed).
pub(crate) async fn write_status(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    status: &crate::api::AppStatus,
) -> Result<(), ReconcileError> {
    let api: Api<App> = Api::namespaced(client.clone(), namespace);
    let patch = serde_json::json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "App", "status": status});
    api.patch_status(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch))
        .await
        .map(|_| ())
        .map_err(|source| ReconcileError::Status { namespace: namespace.to_string(), name: name.to_string(), source })
}

/// Text of the Event for a change: what was created, updated, or put back after drift.
pub fn describe_change(
    kind: &str,
    name: &str,
    existed: bool,
    spec_changed: bool,
    diffs: &[Difference],
) -> (&'static str, String) {
    let list = diffs.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ");
    match (existed, spec_changed) {
        (false, _) => ("Created", format!("created {kind} {name}")),
        (true, true) => ("Updated", format!("updated {kind} {name}: {list}")),
        (true, false) => {
            ("DriftCorrected", format!("{kind} {name} was changed outside Flotilla and was put back: {list}"))
        }
    }
}

impl Context {
    async fn report_change(
        &self,
        app: &k8s_openapi::api::core::v1::ObjectReference,
        kind: &str,
        name: &str,
        existed: bool,
        spec_changed: bool,
        diffs: &[Difference],
    ) {
        let (reason, note) = describe_change(kind, name, existed, spec_changed, diffs);
        info!(
            namespace = app.namespace.as_deref().unwrap_or_default(),
            app = app.name.as_deref().unwrap_or_default(),
            reason,
            "{note}"
        );
        if reason == "DriftCorrected" {
            self.metrics.drift_corrected(kind);
        }
        self.publish(app, EventType::Normal, reason, "Apply", note).await;
    }

    pub(crate) async fn publish(
        &self,
        reference: &k8s_openapi::api::core::v1::ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        // An Event is a write too: never after this replica's hold on the namespace lapsed.
        if !self.may_write(reference.namespace.as_deref().unwrap_or_default()) {
            return;
        }
        let mut note = note;
        if note.len() > 1000 {
            let mut cut = 1000;
            while !note.is_char_boundary(cut) {
                cut -= 1;
            }
            note.truncate(cut);
        }
        let event =
            Event { type_, reason: reason.to_string(), note: Some(note), action: action.to_string(), secondary: None };
        if let Err(e) = self.recorder.publish(&event, reference).await {
            warn!(error = %e, reason, "could not record Event");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn change_descriptions() {
        let d = [Difference { field: "spec.replicas", observed: "5".into(), desired: "3".into() }];
        assert_eq!(describe_change("Deployment", "web", false, true, &d).0, "Created");
        assert_eq!(describe_change("Deployment", "web", true, true, &d).0, "Updated");
        let (reason, note) = describe_change("Deployment", "web", true, false, &d);
        assert_eq!(reason, "DriftCorrected");
        assert!(note.contains("spec.replicas was 5, want 3"), "{note}");
    }
}
