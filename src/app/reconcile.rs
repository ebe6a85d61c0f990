//! One reconcile of one App: read the cache, plan with the pure functions, apply only what
//! differs, write status only when it changed, and record Events for every change.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{Span, debug, field, info, instrument, warn};

use super::applied;
use super::config;
use super::context::Context;
use super::desired::{
    AppIdentity, Difference, deployment_differences, desired_canary_service, desired_hpa, desired_preview_service,
    desired_service, hpa_differences, owned_by, render, service_differences,
};
use super::error::{ReconcileError, retry_delay};
use super::first_deployment::{is_first_deployment, status_deferral};
use super::namespace_turns::Taken;
use super::projection;
use super::status::{Blocker, degraded, run_may_wait};
use super::{quota, route, service_routing};
use crate::api::conditions::READY;
use crate::api::names::{self, FIELD_MANAGER};
use crate::api::template::MAX_TEMPLATE_BYTES;
use crate::api::{App, AppPhase, RolloutResult};
use crate::rollout::planner::{self, DRAIN, Input, Observed};
use crate::rollout::workload::Workload;
use crate::watch_cache::Compact;

/// How often an App that is still converging is looked at even without a watch event.
const PROGRESS_RECHECK: Duration = Duration::from_secs(30);

/// How often a routed canary's HTTPRoute is read again during a rollout, and when none is
/// under way: routes are not watched, so this bounds how long a hand-edited weight stands.
const ROUTE_RECHECK: Duration = Duration::from_secs(5);
const ROUTE_RECHECK_STEADY: Duration = Duration::from_secs(30);

/// How soon an App is looked at again when the cache does not show its last status write yet.
const CACHE_CATCH_UP: Duration = Duration::from_millis(200);

/// How long a reconcile waits for the namespace's caches before it reports and backs off.
const CACHE_SYNC_LIMIT: Duration = Duration::from_secs(30);
/// How soon a reconcile that started a cache watched on demand looks again (and then waits
/// for its list before it takes a slot).
const ON_DEMAND_LISTING: Duration = Duration::from_millis(200);

/// Controller name used in metrics and Events.
pub const CONTROLLER: &str = "app";

/// Entry point for the controller: one span, metrics, and the failure counter reset.
#[instrument(skip_all, fields(tenant = field::Empty, namespace = field::Empty, app = field::Empty, shard = field::Empty, result = field::Empty))]
pub async fn reconcile(obj: Arc<Compact<App>>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
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
    // The namespace's turn first, in the order asked (`namespace_turns`): without one, the App
    // is in line and is reconciled again when a turn is free for it. Nothing else is done,
    // counted or reset meanwhile.
    let name = obj.name_any();
    let _turn = match ctx.namespace_turns.take(&name) {
        Taken::Turn(turn) => Some(turn),
        Taken::Unbounded => None,
        Taken::InLine => return Ok(Action::await_change()),
    };
    Box::pin(reconcile_in_turn(obj, ctx)).await
}

/// `reconcile`, in the namespace's turn.
async fn reconcile_in_turn(obj: Arc<Compact<App>>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    // A replica that starts serving hundreds of namespaces has thousands of Apps to look at;
    // all in flight at once, each would hold its parsed App and desired objects while waiting
    // for the apiserver. They take turns in a few slots instead.
    // The reconcile's own state (parsed App, desired objects, requests in flight: about 13 KB)
    // is allocated only once it has a slot: a replica that inherits thousands of Apps holds
    // thousands of waiting reconciles, each of which is only this small future until its turn
    // (inlined, they were 45 MiB of a replica's peak at 3,333 Apps, `bench/heap.sh`).
    // A slot is taken only once the namespace's caches have listed: a replica that takes over
    // hundreds of namespaces has thousands of their Apps to reconcile at once, and had they
    // waited for their caches in the slots, every reconcile of the namespaces it served
    // already would have queued behind them until the last cache filled (a SIGTERM handoff's
    // changed Apps, even those that did not move, were reconciled 5 s after it at 10,000 Apps).
    let listed = ctx.caches_synced_within(CACHE_SYNC_LIMIT, Default::default()).await;
    let mut slot = if listed { ctx.slot().await } else { None };
    let started = Instant::now();
    let result = if listed {
        Box::pin(reconcile_app(&obj, &ctx, &mut slot)).await
    } else {
        Err(ReconcileError::CachesNotSynced { namespace: obj.namespace().unwrap_or_default(), after: CACHE_SYNC_LIMIT })
    };
    ctx.metrics.reconciled(CONTROLLER, started.elapsed(), result.as_ref().err().map(ReconcileError::kind));
    Span::current().record("result", if result.is_ok() { "ok" } else { "error" });
    if result.is_ok() {
        ctx.reset_failures(obj.as_ref());
    }
    result
}

/// Chooses when to retry a failed reconcile: conflicts at once, refusals with exponential
/// backoff per App, invalid objects only when they change.
pub fn error_policy(obj: Arc<Compact<App>>, err: &ReconcileError, ctx: Arc<Context>) -> Action {
    let failures = ctx.count_failure(obj.as_ref());
    warn!(namespace = obj.namespace().unwrap_or_default(), app = obj.name_any(), error = %err, failures, "reconcile failed");
    match retry_delay(err.class(), failures.saturating_sub(1)) {
        Some(delay) => Action::requeue(delay),
        None => Action::await_change(),
    }
}

async fn reconcile_app(
    obj: &Compact<App>,
    ctx: &Context,
    slot: &mut Option<tokio::sync::OwnedSemaphorePermit>,
) -> Result<Action, ReconcileError> {
    let namespace = obj.namespace().unwrap_or_default();
    let name = obj.name_any();
    let mut app: App = match obj.parse() {
        Ok(app) => app,
        Err(source) => {
            let writable = ctx.may_write(&namespace);
            let err = ReconcileError::InvalidApp { namespace, name, source };
            if writable {
                ctx.publish(&obj.object_ref(&()), EventType::Warning, "InvalidSpec", "Reconcile", err.to_string())
                    .await;
            }
            return Err(err);
        }
    };
    debug!(namespace, app = name, generation = ?app.metadata.generation, "reconciling");
    if app.metadata.deletion_timestamp.is_some() {
        // Owner references let the garbage collector remove the Deployment and HPA.
        return Ok(Action::await_change());
    }
    let id = AppIdentity::of(&app)
        .ok_or_else(|| ReconcileError::NotStored { namespace: namespace.clone(), name: name.clone() })?;
    let spec_changed = app.status.as_ref().and_then(|s| s.observed_generation) != app.metadata.generation;
    // HPAs are watched on demand (`watch_cache::OnDemand`). While they are not, an App that no
    // longer autoscales is looked up by name once per spec change: an HPA made after this
    // controller started by another writer (an earlier owner's late create) is not in the
    // empty cache, and would go on scaling the Deployment against the App.
    let hpa_left = app.spec.autoscaling.is_none()
        && app.status.is_some()
        && spec_changed
        && !ctx.hpas_watched()
        && hpa_exists(ctx, &id).await;
    let needs = super::context::Needs {
        hpas: app.spec.autoscaling.is_some() || hpa_left,
        config_maps: app.spec.template.as_ref().is_some_and(|t| !config::config_maps_of(t).is_empty()),
    };
    // The caches watched on demand (HPAs, ConfigMaps) start when an App first needs them.
    // Not listed yet, they are waited for by the next attempt, before it takes a slot
    // (`reconcile`): waiting here would hold this slot and the parsed App while a namespace's
    // ConfigMaps list, and a tenant's Apps could keep every slot of the replica so.
    if !ctx.caches_synced_now(needs) {
        debug!(namespace, app = name, "caches watched on demand are listing: looking again once they have");
        return Ok(Action::requeue(ON_DEMAND_LISTING));
    }
    let fenced = || ReconcileError::Fenced { namespace: namespace.clone() };
    if ctx.cache_behind(&namespace, &name, app.status.as_ref()) {
        return Ok(Action::requeue(CACHE_CATCH_UP));
    }
    let app_ref = app.object_ref(&());

    // Refused before anything is planned: a template too large to keep a copy of in status.
    let bytes = app.spec.template.as_ref().map_or(0, |t| t.json_len());
    if bytes > MAX_TEMPLATE_BYTES {
        let err = ReconcileError::TemplateTooLarge {
            namespace: namespace.clone(),
            name: name.clone(),
            bytes,
            limit: MAX_TEMPLATE_BYTES,
        };
        return Err(refuse(&app, ctx, err).await);
    }
    // Refused before anything is planned: pods with an annotation the platform reserves are
    // never rendered, and what runs stays as it is.
    let denied = [
        ("spec.podAnnotations", ctx.pod_policy.denied(app.spec.pod_annotations.iter().flatten().map(|(k, _)| k))),
        (
            "spec.template.metadata.annotations",
            ctx.pod_policy.denied(app.spec.template.iter().flat_map(|t| t.annotation_keys())),
        ),
        // Some meshes read their opt-outs from pod labels too (sidecar.istio.io/inject).
        ("spec.template.metadata.labels", ctx.pod_policy.denied(app.spec.template.iter().flat_map(|t| t.label_keys()))),
    ]
    .into_iter()
    .find(|(_, keys)| !keys.is_empty());
    if let Some((field, keys)) = denied {
        let err =
            ReconcileError::PodAnnotationsDenied { namespace: namespace.clone(), name: name.clone(), field, keys };
        return Err(refuse(&app, ctx, err).await);
    }
    // Refused before anything is planned: a pod its Tenant's pod policy does not allow (a
    // priority class that preempts other tenants, a node of another tenant's pool).
    if let Some(violation) = ctx.pod_policy_violation(&app) {
        let err = ReconcileError::PodPolicyDenied { namespace: namespace.clone(), name: name.clone(), violation };
        return Err(refuse(&app, ctx, err).await);
    }
    // The state of the ConfigMaps the pods read is part of the template (`app::config`): a
    // change of one is a new revision, rolled out by the App's strategy.
    if let Some(template) = app.spec.template.take() {
        let names = config::config_maps_of(&template);
        let states = ctx.config_states(&namespace, &names).await.map_err(|source| ReconcileError::Read {
            kind: "ConfigMap",
            namespace: namespace.clone(),
            name: names.iter().next().cloned().unwrap_or_default(),
            source,
        })?;
        app.spec.template =
            Some(config::stamped(template, |cm| states.get(cm).cloned().unwrap_or(config::ConfigState::Absent)));
    }

    // Read: the App's objects from the caches. One that carries Flotilla's labels but is not
    // controlled by this App (another App's, or a hand-made one) is not planned from and
    // never written: see `claim`.
    let (stable_name, canary_name) = (names::stable_deployment_name(&name), names::canary_deployment_name(&name));
    let stable_cached = ctx
        .deployment(&namespace, &stable_name)
        .map_err(|e| ReconcileError::unreadable("Deployment", &namespace, &stable_name, e))?;
    let canary_cached = ctx
        .deployment(&namespace, &canary_name)
        .map_err(|e| ReconcileError::unreadable("Deployment", &namespace, &canary_name, e))?;
    let hpa_cached = ctx.hpas.get(&ObjectRef::new(&names::hpa_name(&name)).within(&namespace));
    let stable = stable_cached.clone().filter(|d| controlled_by_app(d.as_ref(), &id));
    let canary = canary_cached.clone().filter(|d| controlled_by_app(d.as_ref(), &id));
    let hpa = hpa_cached.clone().filter(|h| controlled_by_app(h.as_ref(), &id));
    // A canary routed through Gateway API: its HTTPRoute, read on every look (there is no watch
    // of routes: a cluster without the Gateway API needs none, and drift of the weights is put
    // back at the next look, `ROUTE_RECHECK`).
    let route = match app.spec.http_route() {
        Some(route_name) => Some(route::observe(&ctx.client, &namespace, &name, route_name).await?),
        None => None,
    };
    // A route status names but the App no longer does (the field was removed or renamed, or
    // the strategy changed): its canary weight goes back to 0, and the canary's Service and pods
    // stay until they have drained (`DRAIN`); status keeps naming it until then. Status names
    // the weight asked for, which may not be the one on the route (a failed patch, a hand
    // edit), so a route named with weight 0 is read too.
    let retiring = app
        .status
        .as_ref()
        .and_then(|s| s.traffic_routing.clone())
        .filter(|t| app.spec.http_route() != Some(t.http_route.as_str()));
    let retired = match &retiring {
        Some(t) => Some(route::observe(&ctx.client, &namespace, &name, &t.http_route).await?),
        None => None,
    };
    // The stable Deployment in full, when the plan must read its pod template (see below).
    let full_stable: Option<Deployment>;
    let observed = Observed {
        stable: stable.as_deref(),
        canary: canary.as_deref(),
        hpa: hpa.as_deref(),
        route: route.as_ref().map(route::ObservedRoute::state),
        quota: None,
    };
    let now = crate::api::conditions::now_to_the_second();
    let invalid = |source| ReconcileError::InvalidSettings { namespace: namespace.clone(), name: name.clone(), source };

    // The status as stored; planned from with the latest run that was not written laid over
    // it (`status::run_may_wait`), so that the next run is due an interval after that one.
    let stored_status = app.status.clone();
    ctx.lay_unwritten_run(&namespace, &name, app.status.as_mut());

    // Decide: the planner, and once more with measurements when it asks for them.
    let mut input = Input { app: &app, observed, measurements: None, now, min_interval: ctx.analyzer.min_interval() };
    let mut plan = planner::plan(&input).map_err(invalid)?;
    // A stable template recovered from the running Deployment (status lost it) is read from the
    // Deployment in full: the cache holds projections (`projection`).
    if plan.status.stable_template.as_ref().is_some_and(projection::template_is_projected) {
        full_stable = read_in_full(ctx, &names::stable_deployment_name(&name), &id).await?;
        input.observed.stable = full_stable.as_ref();
        plan = planner::plan(&input).map_err(invalid)?;
    }
    // A blue-green preview about to be created: its pods must fit in the namespace's quota
    // beside the running version's, or none is created (`quota`).
    let preview_unstarted = app.status.as_ref().is_some_and(|s| {
        s.blue_green.is_none() || s.conditions.iter().any(|c| c.type_ == READY && c.reason == "QuotaExceeded")
    });
    if plan.preview
        && canary_cached.is_none()
        && preview_unstarted
        && let Some(preview) = plan.canary.as_ref().and_then(|w| render(&app, &id, w, None))
        && let Some(spec) = preview.spec.as_ref()
    {
        match quota::list(&ctx.client, &namespace).await {
            Ok(quotas) => {
                let pod = spec.template.spec.clone().unwrap_or_default();
                let pods = quota::pods_for_preview(spec.replicas.unwrap_or(0));
                if let Some(why) = quota::shortfall(&quotas, &pod, pods) {
                    input.observed.quota = Some(why);
                    plan = planner::plan(&input).map_err(invalid)?;
                }
            }
            // Without the right to list quotas (an older install), the preview's own pods
            // report a quota they exceed.
            Err(kube::Error::Api(e)) if e.code == 403 || e.code == 404 => {
                warn!(namespace, app = name, error = %e, "could not list ResourceQuotas")
            }
            Err(source) => {
                return Err(ReconcileError::Read {
                    kind: "ResourceQuota",
                    namespace: namespace.clone(),
                    name: String::new(),
                    source,
                });
            }
        }
    }
    let measurements;
    if plan.analysis_due {
        // The plan's stable version: recovered from the running Deployment when status lost it.
        // Queries name versions (image tags), not revisions.
        let stable_revision = plan.status.current_version.clone().unwrap_or_default();
        let stable_version = crate::api::template::version_of(&stable_revision).to_string();
        // A run can wait up to `rollout::measure::TURN_WAIT` for its analysis turns and then the
        // query timeout: it takes analysis turns, not a reconcile slot.
        drop(slot.take());
        measurements = ctx.measure(&app, &stable_version).await.measurements;
        *slot = ctx.slot().await;
        plan = planner::plan(&Input { measurements: Some(&measurements), ..input }).map_err(invalid)?;
    }

    // Until the retired route is set back, status goes on naming it (a replica that dies
    // before that write leaves the next one the name).
    let planned_routing = plan.status.traffic_routing.clone();
    if let Some(t) = &retiring {
        plan.status.traffic_routing = Some(t.clone());
    }

    // A change the rollout makes to a Deployment is planned, not drift put back.
    let previous = app.status.clone().unwrap_or_default();
    let planned = spec_changed || rollout_moved(&previous, &plan.status);
    // A new App's first deployment is written with fewer writes: see `first_deployment`.
    let first = is_first_deployment(&previous, &plan.status);
    let mut version = app.metadata.resource_version.clone();
    let mut stored = stored_status;
    // Whether the plan has Events to send (with its decision, or at the end).
    let noted = !plan.notes.is_empty();

    // Persist: a decision that must survive (a version judged failed, a step taken, a
    // promotion, the stable version) is written before any Deployment follows it, in one
    // status write that carries the App's resourceVersion, so that a writer that planned from
    // an older App fails instead of overwriting the decision. Killed after this write, the
    // next owner plans from the decision and completes it; killed before, nothing changed.
    // A first deployment decides nothing to persist (see `first_deployment`).
    // A run that decides nothing new is not a decision: it waits (see the status write below).
    if decision_changed(&previous, &plan.status) && !first && !run_may_wait(stored.as_ref(), &plan.status, now) {
        if !ctx.may_write(&namespace) {
            return Err(fenced());
        }
        version = write_status(&ctx.client, &namespace, &name, &plan.status, version.as_deref()).await?;
        ctx.remember_written(&namespace, &name, plan.status.clone());
        ctx.forget_unwritten_run(&namespace, &name);
        stored = Some(plan.status.clone());
        // The decision's Events (a rollback, a promotion, a step) go now that it is stored: the
        // applies below may fail (a cache behind, a conflict), and the reconcile that completes
        // the decision plans from it and has nothing to tell.
        tell(ctx, &app_ref, &namespace, &name, std::mem::take(&mut plan.notes)).await;
    }

    // Apply: only what differs, stable first so that capacity comes before the canary goes,
    // and the Services before a Deployment is deleted, so that no Service selects pods that
    // are going (a blue-green rollout switched back).
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut failure: Option<ReconcileError> = None;
    let mut changes = Changes::default();
    let mut to_delete = None;
    // The plan's Deployments, rendered from the spec beside the observed ones.
    let stable_wanted = render(&app, &id, &plan.stable, stable.as_deref());
    let canary_wanted = plan.canary.as_ref().and_then(|w| render(&app, &id, w, canary.as_deref()));
    let wanted = [(
        stable_wanted.as_ref(),
        Some(&plan.stable),
        stable.as_deref(),
        stable_cached.is_some(),
        names::stable_deployment_name(&name),
    )]
    .into_iter()
    .chain([(
        canary_wanted.as_ref(),
        plan.canary.as_ref(),
        canary.as_deref(),
        canary_cached.is_some(),
        names::canary_deployment_name(&name),
    )]);
    for (want, workload, have, cached, object_name) in wanted {
        if failure.is_some() {
            break;
        }
        let result = match want {
            Some(want) => {
                let diffs = deployment_differences(want, have);
                if diffs.is_empty() {
                    continue;
                }
                if !ctx.may_write(&namespace) {
                    return Err(fenced());
                }
                // A Deployment claim reads from the apiserver carries no marker of ours.
                let claimed = claim(&deployments, have, cached, &id, "Deployment", &object_name)
                    .await
                    .map(|d| d.map(|d| if cached { d } else { projection::unmarked(d) }));
                let ready = match (claimed, workload) {
                    (Ok(have), Some(workload)) => in_full(ctx, &app, &id, workload, want, have, &object_name).await,
                    (Ok(_), None) => Ok(None),
                    (Err(e), _) => Err(e),
                };
                match ready {
                    Ok(Some((want, have))) => {
                        let diffs = deployment_differences(&want, have.as_ref());
                        if diffs.is_empty() {
                            continue;
                        }
                        // Flotilla's own change still to be written, or someone else's.
                        let drift = applied::written_as(have.as_ref(), &want);
                        apply(&deployments, &object_name, &want, have.as_ref(), "Deployment")
                            .await
                            .map(|_| Some((diffs, have.is_some(), drift)))
                    }
                    Ok(None) => continue,
                    Err(e) => Err(e),
                }
            }
            None => {
                to_delete = have.map(|have| (have, object_name));
                continue;
            }
        };
        match result {
            Ok(Some((diffs, existed, drift))) => {
                let ours = planned || !drift;
                ctx.note_change(&mut changes, &app_ref, "Deployment", &object_name, existed, ours, &diffs);
            }
            Ok(None) => {}
            Err(e) => failure = Some(e),
        }
    }
    if failure.is_none() {
        let active = desired_service(&app, &id, plan.active);
        if let Err(e) = reconcile_service(&app, &id, ctx, active, planned, &mut changes).await {
            failure = Some(e);
        }
    }
    if failure.is_none() {
        let result = if plan.preview {
            let preview = desired_preview_service(&app, &id);
            reconcile_service(&app, &id, ctx, preview, planned, &mut changes).await
        } else {
            remove_service(&id, ctx, names::preview_service_name(&id.name), "preview").await
        };
        if let Err(e) = result {
            failure = Some(e);
        }
    }
    // A routed canary: the retired route's canary share set back to 0, the Service the route
    // sends the canary's share to (it stays while a route names it, so that the route's
    // backend always resolves), then the weights, before any Deployment is deleted: a
    // promotion or a rollback takes the canary's share away in one write, and the canary's
    // pods never go in the pass that lowered it (they drain, `planner::DRAIN`).
    let mut lowered = false;
    // The retired route's canary still drains (or cannot be set back): its Service and pods stay.
    let mut retire_wait: Option<Duration> = None;
    if failure.is_none()
        && let (Some(old), Some(named)) = (&retired, &retiring)
    {
        let patch = old.pairs.as_ref().ok().and_then(|p| route::weight_patch(p, old.resource_version.as_deref(), 0));
        match patch {
            Some(w) => {
                if !ctx.may_write(&namespace) {
                    return Err(fenced());
                }
                match ctx.write_weights(&app_ref, old, &w, true, &mut changes).await {
                    Ok(()) => {
                        lowered = true;
                        retire_wait = Some(DRAIN);
                        plan.status.traffic_routing = Some(crate::api::TrafficRoutingStatus {
                            canary_weight: 0,
                            problem: None,
                            retired_at: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now)),
                            ..named.clone()
                        });
                    }
                    Err(e) => failure = Some(e),
                }
            }
            // At weight 0 already, or sending the App nothing: done once drained.
            None if old.pairs.is_ok() || old.sends_nothing => {
                let waited = named
                    .retired_at
                    .as_ref()
                    .map_or(DRAIN, |at| Duration::try_from(now.duration_since(at.0)).unwrap_or(Duration::ZERO));
                if waited < DRAIN {
                    retire_wait = Some(DRAIN - waited);
                } else {
                    plan.status.traffic_routing = planned_routing.clone();
                }
            }
            // It may still send to the canary, and its weight cannot be written: keep it named.
            None => {
                let why = old.pairs.as_ref().err().cloned().unwrap_or_default();
                retire_wait = Some(ROUTE_RECHECK);
                plan.status.traffic_routing = Some(crate::api::TrafficRoutingStatus {
                    problem: Some(format!(
                        "the App no longer names HTTPRoute {}, whose canary weight must go back to 0 before the canary goes: {why}",
                        old.name
                    )),
                    ..named.clone()
                });
            }
        }
    }
    if failure.is_none() {
        let result = if route.is_some() {
            let canary_service = desired_canary_service(&app, &id);
            reconcile_service(&app, &id, ctx, canary_service, planned, &mut changes).await
        } else if retire_wait.is_none() {
            remove_service(&id, ctx, names::canary_service_name(&id.name), "canary").await
        } else {
            Ok(())
        };
        if let Err(e) = result {
            failure = Some(e);
        }
    }
    if failure.is_none()
        && let (Some(route), Some(weight)) = (&route, plan.route_weight)
        && let Ok(pairs) = &route.pairs
        && let Some(w) = route::weight_patch(pairs, route.resource_version.as_deref(), weight)
    {
        if !ctx.may_write(&namespace) {
            return Err(fenced());
        }
        // The plan moved the weight (a step, a promotion, a rollback), or a hand edit is put back.
        let before = previous.traffic_routing.as_ref().map(|t| t.canary_weight);
        let moved = before != Some(weight);
        match ctx.write_weights(&app_ref, route, &w, moved, &mut changes).await {
            Ok(()) => lowered |= w.lowered,
            Err(e) => failure = Some(e),
        }
    }
    // Requests may still reach pods whose share was just taken away: they go at a later look.
    let deletion_held = (lowered || retire_wait.is_some()) && to_delete.is_some();
    if deletion_held {
        debug!(namespace, app = name, "the canary drains before it is deleted");
    }
    if failure.is_none()
        && !deletion_held
        && let Some((have, object_name)) = to_delete
    {
        if !ctx.may_write(&namespace) {
            return Err(fenced());
        }
        match delete(&deployments, have, "Deployment").await {
            Ok(()) => info!(namespace, deployment = object_name, "deleted the canary Deployment"),
            Err(e) => failure = Some(e),
        }
    }
    if failure.is_none()
        && let Err(e) =
            reconcile_hpa(&app, &id, ctx, (hpa.as_deref(), hpa_cached.is_some()), spec_changed, &mut changes).await
    {
        failure = Some(e);
    }
    // One Event per kind of change (Created, Updated, DriftCorrected), naming every object:
    // an App's creation is one Event, not one per object.
    for (reason, note) in changes.events() {
        if first && reason == "Created" {
            continue;
        }
        ctx.publish(&app_ref, EventType::Normal, reason, "Apply", note).await;
    }
    // The cache had not shown a Deployment's last change (often this replica's own write):
    // nothing more was written, and status is not told of it; the App is planned again, with
    // the backoff of conflicts (so that a cache that stays behind is not read every 200 ms).
    if let Some(e @ ReconcileError::CacheBehind { .. }) = failure {
        return Err(e);
    }

    // Status: what the plan says, or why it could not be carried out.
    let refusal =
        ctx.analysis_refusal(&app).map(|r| Blocker { reason: r.reason().to_string(), message: r.to_string() });
    let status = match (&failure, &refusal) {
        (Some(e), _) => {
            degraded(&plan.status, &previous, &Blocker { reason: e.reason().to_string(), message: e.to_string() }, now)
        }
        (None, Some(refused)) => degraded(&plan.status, &previous, refused, now),
        (None, None) => plan.status.clone(),
    };
    // A fresh run of the same outcome is written at most once per `status::FRESH_FOR`.
    let waits = stored.as_ref() != Some(&status) && run_may_wait(stored.as_ref(), &status, now);
    if let Some(run) = status.analysis.clone().filter(|_| waits) {
        ctx.remember_unwritten_run(&namespace, &name, run, status.target_version.clone());
    }
    if stored.as_ref() != Some(&status) && !waits {
        let quiet = failure.is_none() && refusal.is_none() && !noted;
        // The stable Deployment's age: zero when this reconcile created it.
        let stable_age = match stable.as_deref() {
            None => Some(Duration::ZERO),
            Some(d) => deployment_age(d, now),
        };
        if let Some(wait) = status_deferral(first, &status, quiet, stable_age) {
            debug!(namespace, app = name, ?wait, "first deployment: status waits for the Deployment");
            return Ok(Action::requeue(wait));
        }
        if !ctx.may_write(&namespace) {
            return Err(fenced());
        }
        let ready = status.conditions.iter().find(|c| c.type_ == READY);
        debug!(
            namespace,
            app = name,
            phase = ?status.phase,
            ready = ready.map(|c| c.message.as_str()).unwrap_or_default(),
            "writing status"
        );
        write_status(&ctx.client, &namespace, &name, &status, version.as_deref()).await?;
        ctx.remember_written(&namespace, &name, status.clone());
        ctx.forget_unwritten_run(&namespace, &name);
    }
    let status_changed = app.status.as_ref() != Some(&status);
    if status_changed {
        if previous.current_version != status.current_version
            && status.phase == Some(AppPhase::Healthy)
            && !noted
            && !first
        {
            let note = format!(
                "version {} is available with {} replicas",
                app.spec.version,
                status.ready.clone().unwrap_or_default()
            );
            ctx.publish(&app_ref, EventType::Normal, "Available", "Rollout", note).await;
        }
        tell(ctx, &app_ref, &namespace, &name, std::mem::take(&mut plan.notes)).await;
        if let Some(ended) = status.history.first().filter(|h| previous.history.first() != Some(*h)) {
            let reason = status.failed_version.as_ref().filter(|_| ended.result == RolloutResult::RolledBack);
            ctx.metrics.rollout_ended(&format!("{:?}", ended.result), reason.map(|f| f.reason.as_str()));
        }
    }

    if let Some(err) = failure {
        // One Warning per new blocker: the status says it for as long as it lasts.
        let reported = previous
            .conditions
            .iter()
            .any(|c| c.type_ == READY && c.reason == err.reason() && c.message == err.to_string());
        if !reported {
            ctx.publish(&app_ref, EventType::Warning, err.reason(), "Reconcile", err.to_string()).await;
        }
        return Err(err);
    }
    let hold = retire_wait.or(deletion_held.then_some(DRAIN));
    let recheck = match hold {
        Some(h) => Some(plan.recheck.map_or(h, |r| r.min(h))),
        None => plan.recheck,
    };
    let recheck = match (app.spec.http_route(), &status.rollout) {
        (None, _) => recheck,
        (Some(_), Some(_)) => Some(recheck.map_or(ROUTE_RECHECK, |r| r.min(ROUTE_RECHECK))),
        (Some(_), None) => Some(recheck.map_or(ROUTE_RECHECK_STEADY, |r| r.min(ROUTE_RECHECK_STEADY))),
    };
    Ok(match (status.phase, recheck) {
        // Healthy with a recheck: pods draining after the switch, or a route to read again.
        (Some(AppPhase::Healthy), Some(after)) => Action::requeue(after.min(PROGRESS_RECHECK)),
        (Some(AppPhase::Healthy), None) => Action::await_change(),
        (_, Some(after)) => Action::requeue(after.min(PROGRESS_RECHECK)),
        _ => Action::requeue(PROGRESS_RECHECK),
    })
}

/// Records on the App why its spec is refused as a whole (Ready and Progressing False, the
/// spec's generation observed, one Warning Event) and returns the error. Nothing else changes.
async fn refuse(app: &App, ctx: &Context, err: ReconcileError) -> ReconcileError {
    let namespace = app.metadata.namespace.clone().unwrap_or_default();
    let name = app.metadata.name.clone().unwrap_or_default();
    let previous = app.status.clone().unwrap_or_default();
    let blocker = Blocker { reason: err.reason().to_string(), message: err.to_string() };
    let seen = crate::api::AppStatus { observed_generation: app.metadata.generation, ..previous.clone() };
    let status = degraded(&seen, &previous, &blocker, crate::api::conditions::now_to_the_second());
    if app.status.as_ref() == Some(&status) {
        return err;
    }
    if !ctx.may_write(&namespace) {
        return ReconcileError::Fenced { namespace };
    }
    let version = app.metadata.resource_version.as_deref();
    if let Err(e) = write_status(&ctx.client, &namespace, &name, &status, version).await {
        return e;
    }
    ctx.forget_unwritten_run(&namespace, &name);
    ctx.remember_written(&namespace, &name, status);
    let reported = previous.conditions.iter().any(|c| c.type_ == READY && c.message == blocker.message);
    if !reported {
        ctx.publish(&app.object_ref(&()), EventType::Warning, err.reason(), "Reconcile", err.to_string()).await;
    }
    err
}

/// How long ago `d` was created, `None` when unknown or in the future (this replica's clock
/// behind the apiserver's): a first status is then written at once, never held by skew.
fn deployment_age(d: &Deployment, now: k8s_openapi::jiff::Timestamp) -> Option<Duration> {
    let created = d.metadata.creation_timestamp.as_ref()?;
    Duration::try_from(now.duration_since(created.0)).ok()
}

/// Whether the plan moved the rollout (step, versions, rollback), so that the Deployment
/// changes it brings are reported as planned rather than as drift.
fn rollout_moved(before: &crate::api::AppStatus, after: &crate::api::AppStatus) -> bool {
    before.target_version != after.target_version
        || before.current_version != after.current_version
        || before.rollout != after.rollout
        || before.canary != after.canary
        || before.blue_green != after.blue_green
        || before.failed_version != after.failed_version
}

/// Logs the plan's notes and sends each as an Event about the App.
async fn tell(
    ctx: &Context,
    app_ref: &k8s_openapi::api::core::v1::ObjectReference,
    namespace: &str,
    name: &str,
    notes: Vec<planner::Note>,
) {
    for note in notes {
        let kind = if note.warning { EventType::Warning } else { EventType::Normal };
        if note.warning {
            warn!(namespace, app = name, reason = note.reason, "{}", note.message);
        } else {
            info!(namespace, app = name, reason = note.reason, "{}", note.message);
        }
        ctx.publish(app_ref, kind, note.reason, "Rollout", note.message).await;
    }
}

/// Whether the plan changes what must survive this replica: versions, the rollout's step,
/// the analysis' count of failures, a failed version, history, a user's request handled.
fn decision_changed(before: &crate::api::AppStatus, after: &crate::api::AppStatus) -> bool {
    rollout_moved(before, after)
        || before.analysis != after.analysis
        || before.history != after.history
        || before.handled_action != after.handled_action
}

/// Whether this App controls `object` (a controller ownerReference with the App's uid).
fn controlled_by_app<K: Resource>(object: &K, id: &AppIdentity) -> bool {
    owned_by(object.meta(), &id.owner)
}

/// Whether this App's HPA exists (true when that cannot be told: the HPAs are then watched).
async fn hpa_exists(ctx: &Context, id: &AppIdentity) -> bool {
    let api: Api<HorizontalPodAutoscaler> = Api::namespaced(ctx.client.clone(), &id.namespace);
    match api.get_metadata_opt(&names::hpa_name(&id.name)).await {
        Ok(found) => found.is_some_and(|h| owned_by(&h.metadata, &id.owner)),
        Err(e) => {
            warn!(namespace = id.namespace, app = id.name, error = %e, "could not look for the App's HPA; watching HPAs");
            true
        }
    }
}

/// The Deployment `name` read from the apiserver in full, if this App controls it. A
/// projection's marker on it was put there by someone else (a tenant may edit its
/// Deployments): it is dropped, so that what is rendered from it reads as full.
async fn read_in_full(ctx: &Context, name: &str, id: &AppIdentity) -> Result<Option<Deployment>, ReconcileError> {
    let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), &id.namespace);
    let found = api.get_opt(name).await.map_err(|source| ReconcileError::Read {
        kind: "Deployment",
        namespace: id.namespace.clone(),
        name: name.to_string(),
        source,
    })?;
    Ok(found.filter(|d| controlled_by_app(d, id)).map(projection::unmarked))
}

/// The Deployment to write and the one it replaces. When `want` copied the pod template of the
/// cache's projection (the stable pods kept during a rollout), both are made again from the
/// Deployment read in full; `None` when there is then nothing to write. The full Deployment
/// must be the version the plan was made from (the cache's `have`): one that moved on since
/// is planned from again (`CacheBehind`), so that the write's resourceVersion precondition
/// still stands for the plan. A projection is never written.
async fn in_full(
    ctx: &Context,
    app: &App,
    id: &AppIdentity,
    workload: &Workload,
    want: &Deployment,
    have: Option<Deployment>,
    name: &str,
) -> Result<Option<(Deployment, Option<Deployment>)>, ReconcileError> {
    if !projection::is_projected(want) {
        return Ok(Some((want.clone(), have)));
    }
    let full = read_in_full(ctx, name, id).await?;
    let version = |d: Option<&Deployment>| d.and_then(|d| d.metadata.resource_version.clone());
    if version(full.as_ref()) != version(have.as_ref()) {
        return Err(ReconcileError::CacheBehind {
            kind: "Deployment",
            namespace: id.namespace.clone(),
            name: name.to_string(),
        });
    }
    // The read took time: the hold on the shard is looked at again before the write.
    if !ctx.may_write(&id.namespace) {
        return Err(ReconcileError::Fenced { namespace: id.namespace.clone() });
    }
    let Some(want) = render(app, id, workload, full.as_ref()) else {
        return Ok(None);
    };
    if projection::is_projected(&want) {
        return Err(ReconcileError::Projected {
            what: "Deployment",
            namespace: id.namespace.clone(),
            name: name.to_string(),
        });
    }
    Ok(Some((want, full)))
}

/// Before writing an object the App derives: the object if this App controls it, `None` if
/// no object of that name exists, and `NameConflict` if one exists that this App does not
/// control. The caches hold only objects labelled as Flotilla's, so a missing one is looked
/// up by name first: a hand-made Service `db` must never be taken over by an App `db`. A
/// second's race (the object created between this look and the apply) can only be won by
/// someone who could write that object anyway.
///
/// The look is a quorum read, though new Apps make two and etcd's reads slow kube-apiserver's
/// Service creations at scale: a read from the apiserver's watch cache (`resourceVersion=0`)
/// has no bound on how stale it is, and a stale "absent" would let the forced apply take over
/// an object that someone else (a platform controller a tenant can set off) made before it.
async fn claim<K>(
    api: &Api<K>,
    controlled: Option<&K>,
    cached: bool,
    id: &AppIdentity,
    kind: &'static str,
    name: &str,
) -> Result<Option<K>, ReconcileError>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let conflict = || ReconcileError::NameConflict { kind, namespace: id.namespace.clone(), name: name.to_string() };
    if let Some(object) = controlled {
        return Ok(Some(object.clone()));
    }
    if cached {
        return Err(conflict());
    }
    let found = api.get_opt(name).await.map_err(|source| ReconcileError::Read {
        kind,
        namespace: id.namespace.clone(),
        name: name.to_string(),
        source,
    })?;
    match found {
        Some(object) if controlled_by_app(&object, id) => Ok(Some(object)),
        Some(_) => Err(conflict()),
        None => Ok(None),
    }
}

/// Creates or updates one of the App's Services (`wanted`: the App's own, or a blue-green
/// rollout's preview) to match `wanted`.
async fn reconcile_service(
    app: &App,
    id: &AppIdentity,
    ctx: &Context,
    wanted: Service,
    planned: bool,
    changes: &mut Changes,
) -> Result<(), ReconcileError> {
    let namespace = &id.namespace;
    let name = wanted.metadata.name.clone().unwrap_or_default();
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), namespace);
    let unreadable = |e| ReconcileError::unreadable("Service", namespace, &name, e);
    let mut observed = ctx.service(namespace, &name).map_err(unreadable)?;
    if ctx.service_cache_behind(namespace, &name, observed.as_deref()) {
        observed = api
            .get_opt(&name)
            .await
            .map_err(|source| ReconcileError::Read {
                kind: "Service",
                namespace: namespace.clone(),
                name: name.clone(),
                source,
            })?
            .map(std::sync::Arc::new);
    }
    let cached = observed.is_some();
    let observed = observed.filter(|s| controlled_by_app(s.as_ref(), id));
    let diffs = service_differences(&wanted, observed.as_deref());
    if diffs.is_empty() {
        return Ok(());
    }
    if !ctx.may_write(namespace) {
        return Err(ReconcileError::Fenced { namespace: namespace.clone() });
    }
    let observed = claim(&api, observed.as_deref(), cached, id, "Service", &name).await?;
    let diffs = service_differences(&wanted, observed.as_ref());
    if diffs.is_empty() {
        return Ok(());
    }
    let ours = planned || !applied::written_as(observed.as_ref(), &wanted);
    // What an apply cannot take back from another writer goes first (`service_routing`).
    let replacement = observed.as_ref().and_then(|o| service_routing::replacement(o, &wanted));
    let observed = match replacement {
        Some(patch) => Some(
            api.patch(
                &name,
                &PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..PatchParams::default() },
                &Patch::Merge(patch),
            )
            .await
            .map_err(|source| ReconcileError::Apply {
                kind: "Service",
                namespace: namespace.clone(),
                name: name.clone(),
                source,
            })?,
        ),
        None => observed,
    };
    let written = apply(&api, &name, &wanted, observed.as_ref(), "Service").await?;
    ctx.remember_applied_service(namespace, &name, written.metadata.resource_version);
    ctx.note_change(changes, &app.object_ref(&()), "Service", &name, observed.is_some(), ours, &diffs);
    Ok(())
}

/// Deletes a Service the App no longer needs (a finished blue-green rollout's preview, a routed
/// canary's once the route is no longer named), when the cache shows one this App controls (a
/// Service of that name that is not the App's is left alone).
async fn remove_service(id: &AppIdentity, ctx: &Context, name: String, what: &str) -> Result<(), ReconcileError> {
    let namespace = &id.namespace;
    let observed =
        ctx.service(namespace, &name).map_err(|e| ReconcileError::unreadable("Service", namespace, &name, e))?;
    let Some(observed) = observed else {
        return Ok(());
    };
    if !controlled_by_app(observed.as_ref(), id) {
        return Ok(());
    }
    if !ctx.may_write(namespace) {
        return Err(ReconcileError::Fenced { namespace: namespace.clone() });
    }
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), namespace);
    delete(&api, observed.as_ref(), "Service").await?;
    info!(namespace, service = name, "deleted the {what} Service");
    Ok(())
}

/// `observed`: the HPA this App controls, from the cache, and whether the cache holds one
/// of that name at all.
async fn reconcile_hpa(
    app: &App,
    id: &AppIdentity,
    ctx: &Context,
    observed: (Option<&HorizontalPodAutoscaler>, bool),
    spec_changed: bool,
    changes: &mut Changes,
) -> Result<(), ReconcileError> {
    let (observed, cached) = observed;
    let namespace = &id.namespace;
    let name = names::hpa_name(&id.name);
    let api: Api<HorizontalPodAutoscaler> = Api::namespaced(ctx.client.clone(), namespace);
    let app_ref = app.object_ref(&());
    match desired_hpa(app, id) {
        Some(wanted) => {
            let diffs = hpa_differences(&wanted, observed);
            if !diffs.is_empty() {
                if !ctx.may_write(namespace) {
                    return Err(ReconcileError::Fenced { namespace: namespace.clone() });
                }
                let observed = claim(&api, observed, cached, id, "HorizontalPodAutoscaler", &name).await?;
                let diffs = hpa_differences(&wanted, observed.as_ref());
                if diffs.is_empty() {
                    return Ok(());
                }
                let ours = spec_changed || !applied::written_as(observed.as_ref(), &wanted);
                apply(&api, &name, &wanted, observed.as_ref(), "HorizontalPodAutoscaler").await?;
                ctx.note_change(changes, &app_ref, "HorizontalPodAutoscaler", &name, observed.is_some(), ours, &diffs);
            }
        }
        None => {
            if let Some(observed) = observed {
                if !ctx.may_write(namespace) {
                    return Err(ReconcileError::Fenced { namespace: namespace.clone() });
                }
                delete(&api, observed, "HorizontalPodAutoscaler").await?;
                info!(namespace, hpa = name, "deleted HorizontalPodAutoscaler: autoscaling was turned off");
                let note = format!("HorizontalPodAutoscaler {name}: autoscaling was turned off");
                ctx.publish(&app_ref, EventType::Normal, "Deleted", "Delete", note).await;
            }
        }
    }
    Ok(())
}

/// Deletes an object the App controls, exactly as it was observed (uid and resourceVersion
/// preconditions: a replica that planned from an older state fails instead of deleting what
/// another one has since written); one already gone counts as deleted.
async fn delete<K>(api: &Api<K>, observed: &K, kind: &'static str) -> Result<(), ReconcileError>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let name = observed.meta().name.clone().unwrap_or_default();
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: observed.meta().uid.clone(),
            resource_version: observed.meta().resource_version.clone(),
        }),
        ..DeleteParams::background()
    };
    match api.delete(&name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(source) => Err(ReconcileError::Delete {
            kind,
            namespace: api.namespace().unwrap_or_default().to_string(),
            name,
            source,
        }),
    }
}

/// Server-side apply of `object`, marked with what was applied (`applied`). When it updates
/// an `observed` object, the apply carries
/// the resourceVersion that was observed: the apiserver refuses it (409) if anyone wrote the
/// object since, so a write that was planned from an older state, or that arrives late
/// (after this replica's hold on the namespace lapsed), cannot win.
async fn apply<K>(
    api: &Api<K>,
    name: &str,
    object: &K,
    observed: Option<&K>,
    kind: &'static str,
) -> Result<K, ReconcileError>
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug,
{
    let mut object = applied::marked(object);
    object.meta_mut().resource_version = observed.and_then(|o| o.meta().resource_version.clone());
    api.patch(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&object)).await.map_err(|source| {
        ReconcileError::Apply {
            kind,
            namespace: object.meta().namespace.clone().unwrap_or_default(),
            name: name.to_string(),
            source,
        }
    })
}

/// Writes an App's whole status with server-side apply (the operator's field manager owns
/// every status field, so fields left out are removed). With `resource_version`, the write
/// applies only to that version of the App (409 otherwise): a decision made from an older
/// App never overwrites a newer one. Returns the App's new resourceVersion.
pub(crate) async fn write_status(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    status: &crate::api::AppStatus,
    resource_version: Option<&str>,
) -> Result<Option<String>, ReconcileError> {
    // A stable template kept in status is what a rollback brings back: never a projection.
    if status.stable_template.as_ref().is_some_and(projection::template_is_projected) {
        return Err(ReconcileError::Projected { what: "status", namespace: namespace.into(), name: name.into() });
    }
    // The App sent back is read without its spec: a tenant may make it large, and shaped to
    // take many times its length when parsed.
    let api: Api<super::light::LightApp> = Api::namespaced(client.clone(), namespace);
    let mut patch = serde_json::json!({"apiVersion": App::api_version(&()), "kind": "App", "status": status});
    if let Some(version) = resource_version {
        patch["metadata"] = serde_json::json!({"resourceVersion": version});
    }
    api.patch_status(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch))
        .await
        .map(|app| app.meta().resource_version.clone())
        .map_err(|source| ReconcileError::Status { namespace: namespace.to_string(), name: name.to_string(), source })
}

/// The changes one reconcile made, as the Events that report them.
#[derive(Default, Debug)]
pub struct Changes(Vec<(&'static str, String)>);

impl Changes {
    pub fn add(&mut self, reason: &'static str, note: String) {
        self.0.push((reason, note));
    }

    /// One Event per reason, in the order first seen, its notes joined.
    pub fn events(&self) -> Vec<(&'static str, String)> {
        let mut out: Vec<(&'static str, String)> = Vec::new();
        for (reason, note) in &self.0 {
            match out.iter_mut().find(|(r, _)| r == reason) {
                Some((_, joined)) => {
                    joined.push_str("; ");
                    joined.push_str(note);
                }
                None => out.push((reason, note.clone())),
            }
        }
        out
    }
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
    /// Writes the weights of `w` to `route` and adds the change to this reconcile's Events
    /// (`moved`: the plan moved them; otherwise a hand edit is put back). The caller checks
    /// the fence.
    async fn write_weights(
        &self,
        app: &k8s_openapi::api::core::v1::ObjectReference,
        route: &route::ObservedRoute,
        w: &route::WeightPatch,
        moved: bool,
        changes: &mut Changes,
    ) -> Result<(), ReconcileError> {
        let namespace = app.namespace.as_deref().unwrap_or_default();
        route::set_weights(&self.client, namespace, route, &w.patch).await?;
        self.note_change(changes, app, "HTTPRoute", &route.name, true, moved, &w.diffs);
        Ok(())
    }

    /// Logs a change made to one of the App's objects and adds it to this reconcile's Events.
    #[allow(clippy::too_many_arguments)]
    fn note_change(
        &self,
        changes: &mut Changes,
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
        changes.add(reason, note);
    }

    pub(crate) async fn publish(
        &self,
        reference: &k8s_openapi::api::core::v1::ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let mut note = note;
        super::error::shorten(&mut note, 1000);
        let event =
            Event { type_, reason: reason.to_string(), note: Some(note), action: action.to_string(), secondary: None };
        // An Event is a write too: never after this replica's hold on the namespace lapsed.
        let namespace = reference.namespace.as_deref().unwrap_or_default();
        if let Err(e) = self.events.publish_while(&event, reference, || self.may_write(namespace)).await {
            warn!(error = %e, reason, "could not record Event");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of the futures `f` returns, without making one.
    fn future_size<A, B, F: std::future::Future>(_: fn(A, B) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// What a controller's context is made of, with a client of an address nothing answers
    /// at (the tests below send no request).
    fn offline()
    -> (kube::Client, crate::telemetry::events::EventWriter, crate::telemetry::Metrics, crate::rollout::Analyzer) {
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("a URL"));
        let client = kube::Client::try_from(config).expect("a client");
        let reporter = kube::runtime::events::Reporter { controller: "test".into(), instance: None };
        let events = crate::telemetry::events::EventWriter::new(client.clone(), reporter);
        let metrics = crate::telemetry::Metrics::new().expect("metrics");
        let analyzer = crate::rollout::Analyzer::new(None, Default::default()).expect("an analyzer");
        (client, events, metrics, analyzer)
    }

    /// A reconcile of a namespace whose caches are still listing (a replica taking over
    /// hundreds) waits without a slot: the slots stay free for the namespaces that can work.
    #[tokio::test]
    async fn a_reconcile_waits_for_its_namespaces_caches_without_taking_a_slot() {
        use crate::app::controller::{Scope, Shared, context};
        let (client, events, metrics, analyzer) = offline();
        let slots = Arc::new(tokio::sync::Semaphore::new(1));
        let shared = Shared {
            events,
            metrics,
            analyzer,
            slots: Some(slots.clone()),
            pod_policy: Arc::default(),
            streaming_lists: false,
            reconciles_per_namespace: 0,
        };
        // Its watch streams are never polled: its caches never list.
        let (ctx, _streams) = context(client, &Scope::Namespace("shop".into()), shared, None, None);
        let app: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "flotilla.dev/v1beta1", "kind": "App",
            "metadata": {"name": "web", "namespace": "shop", "uid": "u1", "resourceVersion": "1", "generation": 1},
            "spec": {"image": "registry.example.com/web", "version": "1"}
        }))
        .expect("an App");
        let waiting = tokio::spawn(reconcile(Arc::new(Compact::of(app)), ctx));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!waiting.is_finished(), "the reconcile waits for the caches");
        assert_eq!(slots.available_permits(), 1, "the waiting reconcile holds no slot");
        waiting.abort();
    }

    /// An App whose template reads a ConfigMap, in a namespace whose Deployments and Services
    /// have listed but whose ConfigMaps are not watched yet: its reconcile starts their watch
    /// and looks again soon, instead of waiting for their list in its slot.
    #[tokio::test]
    async fn a_reconcile_does_not_wait_in_its_slot_for_a_cache_watched_on_demand() {
        use crate::app::context::Caches;
        use crate::watch_cache::{Demand, on_demand, synced_flag};
        use futures::StreamExt;
        use kube::runtime::reflector::store::Writer;
        let (client, events, metrics, analyzer) = offline();
        let (listed_tx, listed) = tokio::sync::watch::channel(true);
        // Caches watched on demand, idle, whose lists never end once started (their flags'
        // senders kept, never set).
        let mut flags = Vec::new();
        let mut idle = || {
            let (never_tx, never) = synced_flag();
            flags.push(never_tx);
            let (watch, _events) = on_demand(|| futures::stream::pending::<Result<u32, _>>().boxed(), never, None);
            watch
        };
        let config_map_watch = idle();
        let hpa_watch = idle();
        let caches = Caches {
            deployments: Writer::default().as_reader(),
            hpas: Writer::default().as_reader(),
            services: Writer::default().as_reader(),
            config_maps: Writer::default().as_reader(),
            synced: vec![listed],
            hpa_watch,
            config_map_watch: config_map_watch.clone(),
        };
        let mut ctx = Context::new(client, events, metrics, caches, analyzer);
        let slots = Arc::new(tokio::sync::Semaphore::new(1));
        ctx.slots = Some(slots.clone());
        let app: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "flotilla.dev/v1beta1", "kind": "App",
            "metadata": {"name": "web", "namespace": "shop", "uid": "u1", "resourceVersion": "1", "generation": 1},
            "spec": {"image": "registry.example.com/web", "version": "1", "template": {"spec": {"containers": [
                {"name": "app", "envFrom": [{"configMapRef": {"name": "settings"}}]}]}}}
        }))
        .expect("an App");
        let answer =
            tokio::time::timeout(Duration::from_secs(2), reconcile(Arc::new(Compact::of(app)), Arc::new(ctx))).await;
        let action = answer.expect("answered without waiting for the ConfigMaps' list").expect("no error");
        assert_eq!(action, Action::requeue(ON_DEMAND_LISTING));
        assert_eq!(config_map_watch.demand(), Demand::Started, "the ConfigMaps' watch started");
        assert_eq!(slots.available_permits(), 1);
        drop((listed_tx, flags));
    }

    #[test]
    fn a_reconcile_waiting_for_its_slot_is_small() {
        let size = future_size(reconcile);
        assert!(
            size <= 1024,
            "a reconcile waiting for its turn takes {size} bytes: its body must be boxed, not inlined"
        );
        let size = future_size(reconcile_in_turn);
        assert!(size <= 1024, "a waiting reconcile takes {size} bytes: its body must be boxed, not inlined");
    }

    #[test]
    fn one_event_per_reason_naming_every_object() {
        let mut changes = Changes::default();
        changes.add("Created", "created Deployment web".into());
        changes.add("DriftCorrected", "Service web was changed outside Flotilla and was put back: port".into());
        changes.add("Created", "created HorizontalPodAutoscaler web".into());
        assert_eq!(
            changes.events(),
            [
                ("Created", "created Deployment web; created HorizontalPodAutoscaler web".to_string()),
                ("DriftCorrected", "Service web was changed outside Flotilla and was put back: port".to_string()),
            ]
        );
        assert!(Changes::default().events().is_empty());
    }

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
