//! The Tenant reconciler: onboard listed namespaces, offboard the ones that left, report
//! per-namespace state. Every write is an idempotent server-side apply or a delete.

use futures::StreamExt;
use k8s_openapi::api::core::v1::{LimitRange, Namespace, ObjectReference, ResourceQuota};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::{Client, Resource, ResourceExt};

use crate::api::NamespaceRemovalPolicy;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{Span, field, info, instrument, warn};

use super::claim::{Decision, Protection, decide, offboard_refusal};
use super::desired::{
    ADMIN_BINDING, ANNOTATION_DESIRED, FINALIZER, LIMIT_RANGE, NETWORK_POLICY, OPERATOR_BINDING, OperatorIdentity,
    QUOTA, admin_binding, desired_namespace, limit_range, missing_labels, namespace_labels, network_policy,
    operator_binding, quota, tenant_name, tenant_status, to_offboard,
};
use super::unchanged::covers;
use crate::api::fingerprint::hex_fingerprint;
use crate::api::names::FIELD_MANAGER;
use crate::api::{NamespaceState, NamespaceStatus, Tenant};
use crate::telemetry::Metrics;

/// Controller name used in metrics and Events.
pub const CONTROLLER: &str = "tenant";
/// How often a Tenant with a namespace in Conflict or Error is looked at again.
const RECHECK: Duration = Duration::from_secs(30);
/// How often a settled Tenant is re-applied anyway (repairs RoleBindings or quotas deleted by hand).
const RESYNC: Duration = Duration::from_secs(300);

/// Handed to every Tenant reconcile.
pub struct TenantContext {
    pub client: Client,
    pub events: crate::telemetry::events::EventWriter,
    pub metrics: Metrics,
    pub operator: OperatorIdentity,
    /// Namespaces no Tenant may claim.
    pub protection: Protection,
    /// Namespaces every tenant namespace admits traffic from (`--network-policy-allowed-namespaces`).
    pub network_allowed: Vec<String>,
    /// Where tenants' pods may not send (`--network-policy-egress-denied-namespaces`).
    pub network_egress: Option<super::desired::EgressPolicy>,
    /// The shard count (`--shards`), for each namespace's `flotilla.dev/shard` label.
    pub shards: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum TenantError {
    #[error("{action} {kind} {namespace}/{name}: {source}")]
    Api {
        action: &'static str,
        kind: &'static str,
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("writing status of Tenant {name}: {source}")]
    Status {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("finalizer of Tenant {name}: {message}")]
    Finalizer { name: String, message: String },
}

impl TenantError {
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Api { source: kube::Error::Api(s), .. } | Self::Status { source: kube::Error::Api(s), .. } => {
                match s.code {
                    409 => "conflict",
                    403 | 404 => "refused",
                    _ => "transient",
                }
            }
            _ => "transient",
        }
    }
}

#[instrument(skip_all, fields(tenant = field::Empty, result = field::Empty))]
pub async fn reconcile(tenant: Arc<Tenant>, ctx: Arc<TenantContext>) -> Result<Action, TenantError> {
    let name = tenant.name_any();
    Span::current().record("tenant", &name);
    let started = Instant::now();
    let api: Api<Tenant> = Api::all(ctx.client.clone());
    let result = finalizer(&api, FINALIZER, tenant, |event| async {
        match event {
            Finalizer::Apply(t) => onboard(&t, &ctx).await,
            Finalizer::Cleanup(t) => offboard_all(&t, &ctx).await,
        }
    })
    .await
    .map_err(|e| match e {
        kube::runtime::finalizer::Error::ApplyFailed(e) | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
        other => TenantError::Finalizer { name: name.clone(), message: other.to_string() },
    });
    ctx.metrics.reconciled(CONTROLLER, started.elapsed(), result.as_ref().err().map(TenantError::kind));
    Span::current().record("result", if result.is_ok() { "ok" } else { "error" });
    result
}

pub fn error_policy(tenant: Arc<Tenant>, err: &TenantError, _ctx: Arc<TenantContext>) -> Action {
    warn!(tenant = tenant.name_any(), error = %err, "tenant reconcile failed");
    match err.kind() {
        "conflict" => Action::requeue(Duration::from_millis(50)),
        _ => Action::requeue(Duration::from_secs(10)),
    }
}

/// How many namespaces of one Tenant are onboarded at once.
const ONBOARD_CONCURRENCY: usize = 8;

/// What onboarding found for one namespace a Tenant lists: the namespace as read and what
/// may be done with it, or the state to report when it could not be read.
type Found = Result<(Option<Namespace>, Decision), NamespaceStatus>;

/// Reads one namespace a Tenant lists and decides whether the Tenant may onboard it.
async fn read_and_decide(ns: &str, me: &str, namespaces: &Api<Namespace>, ctx: &TenantContext) -> Found {
    let existing = namespaces.get_opt(ns).await.map_err(|source| {
        let err = TenantError::Api {
            action: "reading",
            kind: "Namespace",
            namespace: String::new(),
            name: ns.into(),
            source,
        };
        NamespaceStatus { name: ns.into(), state: NamespaceState::Error, message: err.to_string() }
    })?;
    let decision = decide(ns, me, existing.as_ref().map(|n| n.labels()), &ctx.operator.namespace, &ctx.protection);
    Ok((existing, decision))
}

/// Onboards one namespace of a Tenant; the state to report, and whether a namespace that
/// stays served had an error (the Tenant is then looked at again soon). `owned` are the
/// Tenant's namespaces that are not refused to it (its NetworkPolicy's peers).
async fn onboard_one(
    tenant: &Tenant,
    ns: &str,
    found: Found,
    owned: &[String],
    ctx: &TenantContext,
) -> (NamespaceStatus, bool) {
    let existing = match found {
        Ok((_, Decision::Refused(refused))) => return (refused, false),
        Ok((existing, _)) => existing,
        Err(unread) => return (unread, false),
    };
    let was_onboarded = tenant
        .status
        .iter()
        .flat_map(|s| s.namespaces.iter())
        .any(|n| n.name == ns && n.state == NamespaceState::Onboarded);
    match onboard_namespace(tenant, ns, existing.as_ref(), owned, ctx).await {
        Ok(()) => (
            NamespaceStatus {
                name: ns.into(),
                state: NamespaceState::Onboarded,
                message: format!("Flotilla manages Apps here through RoleBinding {OPERATOR_BINDING}"),
            },
            false,
        ),
        // A failed re-apply of a namespace that was onboarded keeps it served (its
        // RoleBindings are most likely still there); the message says what failed.
        Err(e) if was_onboarded => (
            NamespaceStatus {
                name: ns.into(),
                state: NamespaceState::Onboarded,
                message: format!("re-applying onboarding failed, retrying: {e}"),
            },
            true,
        ),
        Err(e) => (NamespaceStatus { name: ns.into(), state: NamespaceState::Error, message: e.to_string() }, false),
    }
}

async fn onboard(tenant: &Tenant, ctx: &TenantContext) -> Result<Action, TenantError> {
    let me = tenant_name(tenant);
    let namespaces: Api<Namespace> = Api::all(ctx.client.clone());
    // Namespaces are read and onboarded a few at a time: one after the other, a Tenant of a
    // hundred namespaces took minutes on a busy apiserver. Order is kept for the status. All
    // are decided first: each one's NetworkPolicy names the others the Tenant owns.
    let (me_ref, namespaces_ref) = (&me, &namespaces);
    let found: Vec<(String, Found)> = futures::stream::iter(tenant.spec.namespaces.clone())
        .map(|ns| async move {
            let found = read_and_decide(&ns, me_ref, namespaces_ref, ctx).await;
            (ns, found)
        })
        .buffered(ONBOARD_CONCURRENCY)
        .collect()
        .await;
    let owned: Vec<String> = found
        .iter()
        .filter(|(_, f)| matches!(f, Ok((_, Decision::Create | Decision::Adopt | Decision::Owned))))
        .map(|(ns, _)| ns.clone())
        .collect();
    let owned_ref = &owned;
    let results: Vec<(NamespaceStatus, bool)> = futures::stream::iter(found)
        .map(|(ns, found)| async move { onboard_one(tenant, &ns, found, owned_ref, ctx).await })
        .buffered(ONBOARD_CONCURRENCY)
        .collect()
        .await;
    let unsettled_error = results.iter().any(|(_, unsettled)| *unsettled);
    let mut states: Vec<NamespaceStatus> = results.into_iter().map(|(state, _)| state).collect();
    for ns in to_offboard(tenant) {
        let state = match offboard_namespace(tenant, &ns, ctx).await {
            Ok(skipped) => NamespaceStatus {
                name: ns.clone(),
                state: NamespaceState::Offboarded,
                message: skipped.unwrap_or_else(|| offboarded_message(tenant)),
            },
            Err(e) => NamespaceStatus { name: ns.clone(), state: NamespaceState::Offboarding, message: e.to_string() },
        };
        states.push(state);
    }

    let now = crate::api::conditions::now_to_the_second();
    let status = tenant_status(tenant, states, now);
    let reference = tenant.object_ref(&());
    let previous = tenant.status.clone().unwrap_or_default();
    for ns in &status.namespaces {
        let before = previous.namespaces.iter().find(|p| p.name == ns.name).map(|p| p.state);
        if before != Some(ns.state) {
            let (type_, reason) = match ns.state {
                NamespaceState::Onboarded => (EventType::Normal, "Onboarded"),
                NamespaceState::Offboarded => (EventType::Normal, "Offboarded"),
                NamespaceState::Conflict => (EventType::Warning, "Conflict"),
                NamespaceState::NotAdoptable => (EventType::Warning, "NotAdoptable"),
                NamespaceState::Error => (EventType::Warning, "OnboardingFailed"),
                NamespaceState::Pending => (EventType::Normal, "Pending"),
                NamespaceState::Offboarding => (EventType::Warning, "OffboardingFailed"),
            };
            info!(tenant = me, namespace = ns.name, reason, "{}", ns.message);
            publish(ctx, &reference, type_, reason, format!("namespace {}: {}", ns.name, ns.message)).await;
        }
    }
    let unsettled = unsettled_error
        || status.namespaces.iter().any(|n| {
            matches!(
                n.state,
                NamespaceState::Conflict
                    | NamespaceState::NotAdoptable
                    | NamespaceState::Error
                    | NamespaceState::Offboarding
            )
        });
    if tenant.status.as_ref() != Some(&status) {
        let api: Api<Tenant> = Api::all(ctx.client.clone());
        let patch = serde_json::json!({"apiVersion": Tenant::api_version(&()), "kind": "Tenant", "status": status});
        api.patch_status(&me, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch))
            .await
            .map_err(|source| TenantError::Status { name: me.clone(), source })?;
    }
    // Settled Tenants are still looked at now and then, so that a RoleBinding or quota deleted
    // by hand is put back.
    Ok(if unsettled { Action::requeue(RECHECK) } else { Action::requeue(RESYNC) })
}

fn offboarded_message(tenant: &Tenant) -> String {
    if tenant.spec.namespace_removal_policy == NamespaceRemovalPolicy::Delete {
        "offboarded: Flotilla's access was removed and the namespace deleted (namespaceRemovalPolicy: Delete)".into()
    } else {
        "offboarded: Flotilla's access was removed; the namespace and its workloads were left in place".into()
    }
}

/// Creates the namespace, or labels an existing one for the tenant (adoption, Pod Security
/// labels), then applies the RoleBindings and the quota. The label patch carries the
/// resourceVersion that was read: if the namespace changed meanwhile (another tenant's claim,
/// a cluster admin's relabelling), it fails and the next reconcile decides again.
async fn onboard_namespace(
    tenant: &Tenant,
    ns: &str,
    existing: Option<&Namespace>,
    owned: &[String],
    ctx: &TenantContext,
) -> Result<(), TenantError> {
    let me = tenant_name(tenant);
    let api: Api<Namespace> = Api::all(ctx.client.clone());
    let error = |action, source| TenantError::Api {
        action,
        kind: "Namespace",
        namespace: String::new(),
        name: ns.into(),
        source,
    };
    match existing {
        None => {
            // A 409 means someone created it since it was read: fail, and decide again.
            api.create(&PostParams::default(), &desired_namespace(ns, tenant, ctx.shards))
                .await
                .map_err(|source| error("creating", source))?;
            info!(tenant = me, namespace = ns, "created namespace");
        }
        Some(current) => {
            let missing = missing_labels(current.labels(), &namespace_labels(ns, tenant, ctx.shards));
            if !missing.is_empty() {
                let patch = serde_json::json!({
                    "metadata": {"resourceVersion": current.metadata.resource_version, "labels": missing},
                });
                api.patch(ns, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(|source| error("labelling", source))?;
                info!(tenant = me, namespace = ns, labels = ?missing, "labelled namespace");
            }
        }
    }
    let bindings: Api<RoleBinding> = Api::namespaced(ctx.client.clone(), ns);
    apply(&bindings, OPERATOR_BINDING, &operator_binding(ns, &me, &ctx.operator), "RoleBinding").await?;
    // The quota before the admins: the apiserver may refuse the admins' binding for a while
    // (its cache of Tenants, which an admission policy checks it against, may lag a change),
    // and a namespace must not run without its quota meanwhile.
    let quotas: Api<ResourceQuota> = Api::namespaced(ctx.client.clone(), ns);
    match quota(ns, tenant) {
        Some(q) => apply(&quotas, QUOTA, &q, "ResourceQuota").await?,
        None => delete(&quotas, QUOTA, "ResourceQuota").await?,
    }
    let limits: Api<LimitRange> = Api::namespaced(ctx.client.clone(), ns);
    match limit_range(ns, tenant) {
        Some(l) => apply(&limits, LIMIT_RANGE, &l, "LimitRange").await?,
        None => delete(&limits, LIMIT_RANGE, "LimitRange").await?,
    }
    let policies: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), ns);
    match network_policy(ns, tenant, owned, &ctx.network_allowed, ctx.network_egress.as_ref()) {
        Some(p) => apply_with(&policies, NETWORK_POLICY, &p, "NetworkPolicy", true).await?,
        None => delete(&policies, NETWORK_POLICY, "NetworkPolicy").await?,
    }
    match admin_binding(ns, tenant) {
        Some(b) => apply(&bindings, ADMIN_BINDING, &b, "RoleBinding").await?,
        None => delete(&bindings, ADMIN_BINDING, "RoleBinding").await?,
    }
    Ok(())
}

/// Removes the operator's (and the admins') access to a namespace this tenant onboarded,
/// after checking again that it is still this tenant's: a namespace that now belongs to
/// another tenant, or that is the operator's own or a system namespace, is left alone. The
/// namespace itself is deleted only when the tenant asks for it and the namespace's label
/// names this tenant. Returns why it was left alone, if it was.
async fn offboard_namespace(tenant: &Tenant, ns: &str, ctx: &TenantContext) -> Result<Option<String>, TenantError> {
    let me = tenant_name(tenant);
    let namespaces: Api<Namespace> = Api::all(ctx.client.clone());
    let (labels, seen) = match namespaces.get_opt(ns).await {
        Ok(Some(n)) => (n.labels().clone(), Preconditions { uid: n.uid(), resource_version: n.resource_version() }),
        Ok(None) => return Ok(Some("the namespace no longer exists".into())),
        Err(source) => {
            return Err(TenantError::Api {
                action: "reading",
                kind: "Namespace",
                namespace: String::new(),
                name: ns.into(),
                source,
            });
        }
    };
    let onboarded = tenant
        .status
        .iter()
        .flat_map(|s| s.namespaces.iter())
        .any(|n| n.name == ns && matches!(n.state, NamespaceState::Onboarded | NamespaceState::Offboarding));
    if let Some(why) = offboard_refusal(ns, &me, &labels, onboarded, &ctx.operator.namespace, &ctx.protection) {
        return Ok(Some(why));
    }
    let bindings: Api<RoleBinding> = Api::namespaced(ctx.client.clone(), ns);
    delete(&bindings, OPERATOR_BINDING, "RoleBinding").await?;
    delete(&bindings, ADMIN_BINDING, "RoleBinding").await?;
    let quotas: Api<ResourceQuota> = Api::namespaced(ctx.client.clone(), ns);
    delete(&quotas, QUOTA, "ResourceQuota").await?;
    let limits: Api<LimitRange> = Api::namespaced(ctx.client.clone(), ns);
    delete(&limits, LIMIT_RANGE, "LimitRange").await?;
    let policies: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), ns);
    delete(&policies, NETWORK_POLICY, "NetworkPolicy").await?;
    if tenant.spec.namespace_removal_policy == NamespaceRemovalPolicy::Delete
        && super::claim::labelled_owner(&labels) == Some(me.as_str())
    {
        // Exactly the namespace that was read: a leader that was paused since, while another
        // re-onboarded or relabelled it, gets 409 and decides again from a fresh read.
        match namespaces.delete(ns, &DeleteParams { preconditions: Some(seen), ..DeleteParams::background() }).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(source) => {
                return Err(TenantError::Api {
                    action: "deleting",
                    kind: "Namespace",
                    namespace: String::new(),
                    name: ns.into(),
                    source,
                });
            }
        }
    }
    info!(tenant = me, namespace = ns, "offboarded namespace");
    Ok(None)
}

/// On deletion of a Tenant: offboard every namespace it owns. Objects already gone count as
/// cleaned up, so a finalizer whose namespaces were deleted by hand completes.
async fn offboard_all(tenant: &Tenant, ctx: &TenantContext) -> Result<Action, TenantError> {
    let mut candidates: Vec<String> = tenant.spec.namespaces.clone();
    for n in tenant.status.iter().flat_map(|s| s.namespaces.iter()) {
        if matches!(n.state, NamespaceState::Onboarded | NamespaceState::Offboarding) && !candidates.contains(&n.name) {
            candidates.push(n.name.clone());
        }
    }
    let reference = tenant.object_ref(&());
    for ns in candidates {
        if offboard_namespace(tenant, &ns, ctx).await?.is_none() {
            publish(
                ctx,
                &reference,
                EventType::Normal,
                "Offboarded",
                format!("namespace {ns}: {}", offboarded_message(tenant)),
            )
            .await;
        }
    }
    Ok(Action::await_change())
}

/// Applies `object`, unless the one in the cluster already says everything it says: the
/// Tenant is looked at again every few minutes, and with a thousand namespaces re-applying
/// would be thousands of (unchanging) writes each time; a read is cheaper.
/// `exact_spec`: the object's spec must also equal the desired one (for objects whose spec
/// the apiserver does not default, so that a hand edit that narrows it is undone too).
async fn apply_with<K>(
    api: &Api<K>,
    name: &str,
    object: &K,
    kind: &'static str,
    exact_spec: bool,
) -> Result<(), TenantError>
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug,
{
    let namespace = || object.meta().namespace.clone().unwrap_or_default();
    let current = api.get_opt(name).await.map_err(|source| TenantError::Api {
        action: "reading",
        kind,
        namespace: namespace(),
        name: name.into(),
        source,
    })?;
    // The desired object's fingerprint goes with it as an annotation, so that a change that
    // only removes something (a LimitRange key, a quota) is not "covered" by what is there:
    // the apply then drops what Flotilla set before and no longer asks for.
    let mut object = object.clone();
    let fingerprint = serde_json::to_vec(&object).map(|b| hex_fingerprint(&b));
    object
        .meta_mut()
        .annotations
        .get_or_insert_with(Default::default)
        .insert(ANNOTATION_DESIRED.to_string(), fingerprint.unwrap_or_default());
    if let Some(current) = &current
        && let (Ok(current), Ok(desired)) = (serde_json::to_value(current), serde_json::to_value(&object))
        && covers(&current, &desired)
        && (!exact_spec || current.get("spec") == desired.get("spec"))
    {
        return Ok(());
    }
    // The version that was read goes with the apply: a deposed leader's late write (it read,
    // lost the election, and its request arrived after the new leader changed the object)
    // gets 409 instead of undoing the new leader's decision. A late creation is refused by
    // the admission policies, which check the Tenant as it is when the write arrives.
    object.meta_mut().resource_version = current.and_then(|c| c.meta().resource_version.clone());
    api.patch(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&object)).await.map(|_| ()).map_err(
        |source| TenantError::Api { action: "applying", kind, namespace: namespace(), name: name.into(), source },
    )
}

async fn apply<K>(api: &Api<K>, name: &str, object: &K, kind: &'static str) -> Result<(), TenantError>
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug,
{
    apply_with(api, name, object, kind, false).await
}

/// Deletes an object if it exists (read first, for the same reason as `apply`).
async fn delete<K>(api: &Api<K>, name: &str, kind: &'static str) -> Result<(), TenantError>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let error = |action, source| TenantError::Api { action, kind, namespace: String::new(), name: name.into(), source };
    let Some(current) = api.get_opt(name).await.map_err(|source| error("reading", source))? else {
        return Ok(());
    };
    // Exactly the object that was read (uid and version): a deposed leader's late delete
    // gets 409 if the new leader has re-created or changed it since.
    let seen = Preconditions { uid: current.uid(), resource_version: current.resource_version() };
    match api.delete(name, &DeleteParams { preconditions: Some(seen), ..DeleteParams::background() }).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(source) => Err(error("deleting", source)),
    }
}

async fn publish(ctx: &TenantContext, reference: &ObjectReference, type_: EventType, reason: &str, note: String) {
    let event = Event { type_, reason: reason.into(), note: Some(note), action: "Onboard".into(), secondary: None };
    if let Err(e) = ctx.events.publish(&event, reference).await {
        warn!(error = %e, reason, "could not record Event");
    }
}
