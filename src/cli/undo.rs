//! `flotilla undo <app> [--to-revision R]`: go back to a version that was healthy, by setting
//! `spec.version` (one JSON merge patch that carries the App's resourceVersion, so that it
//! fails instead of undoing a change it did not see).
//!
//! - A rollout under way is undone at once: `spec.version` goes back to the stable version,
//!   which the operator treats as a revert (no steps, no analysis; a blue-green Service
//!   selects the old pods again in one write, and a canary's pods serve until the stable
//!   Deployment is back to full size).
//! - Otherwise the version before the current one (or `--to-revision`, any version
//!   `status.history` lists as Promoted) rolls out again through the App's strategy, with its
//!   analysis: its pods are gone, so it is checked like any new version.

use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use crate::api::template::version_of;
use crate::api::{App, RolloutResult};

/// Field manager recorded in the App's managedFields for `spec.version`.
const FIELD_MANAGER: &str = "flotilla-cli";

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum UndoError {
    #[error(
        "App {namespace}/{name} has no status yet: the operator has not deployed it, so there is nothing to go back to"
    )]
    NoStatus { namespace: String, name: String },
    #[error(
        "App {namespace}/{name} has no earlier healthy version: status.history lists no Promoted version but the current one {current}"
    )]
    NothingEarlier { namespace: String, name: String, current: String },
    #[error("revision {wanted} was never promoted on App {namespace}/{name}; status.history lists: {known}")]
    UnknownRevision { namespace: String, name: String, wanted: String, known: String },
    #[error(
        "the rollout under way changes the pod template (or a ConfigMap it reads), not spec.version: `flotilla undo` only sets spec.version; `flotilla abort` rolls it back"
    )]
    NotAVersionChange,
    #[error("spec.version is {version} already: nothing to undo (`flotilla undo` only sets spec.version)")]
    SameVersion { version: String },
    #[error("App {namespace}/{name} not found")]
    NotFound { namespace: String, name: String },
    #[error("the spec of App {namespace}/{name} changed while undo read it; look at it and run undo again")]
    Changed { namespace: String, name: String },
    #[error("you lack the rights to patch Apps in namespace {namespace} (the apiserver said: {message})")]
    Forbidden { namespace: String, message: String },
    #[error("reading or patching App {namespace}/{name}: {message}")]
    Api { namespace: String, name: String, message: String },
}

/// What `undo` does to the App.
#[derive(Debug, PartialEq)]
pub struct Undo {
    /// The revision the App goes back to.
    pub revision: String,
    /// A rollout under way is abandoned at once (a revert), rather than a new rollout started.
    pub at_once: bool,
    /// The merge patch to send.
    pub patch: Value,
}

/// Decides the undo of `app`, to `wanted` (a version or revision from `status.history`) or
/// to the version before the current one. Pure.
pub fn plan_undo(app: &App, wanted: Option<&str>) -> Result<Undo, UndoError> {
    let namespace = app.metadata.namespace.clone().unwrap_or_default();
    let name = app.metadata.name.clone().unwrap_or_default();
    let status = app.status.as_ref();
    let Some(current) = status.and_then(|s| s.current_version.clone()) else {
        return Err(UndoError::NoStatus { namespace, name });
    };
    let status = status.cloned().unwrap_or_default();
    // A rollout under way, or a version that was rolled back: the spec asks for something
    // else than what runs.
    let in_flight = status.rollout.is_some() || app.spec.version != version_of(&current);
    // Versions that were healthy, newest first: each promoted one, and the stable version it
    // replaced (a first deployment is no rollout, so only its successor's record names it).
    let mut promoted: Vec<&str> = Vec::new();
    for h in status.history.iter().filter(|h| h.result == RolloutResult::Promoted) {
        for v in std::iter::once(h.version.as_str()).chain(h.replaced.as_deref()) {
            if !promoted.contains(&v) {
                promoted.push(v);
            }
        }
    }
    let chosen = match wanted {
        // Undo the rollout under way: back to the stable version.
        None if in_flight => current.clone(),
        None => match promoted.iter().find(|v| version_of(v) != version_of(&current)) {
            Some(v) => (*v).to_string(),
            None => return Err(UndoError::NothingEarlier { namespace, name, current }),
        },
        Some(w) => {
            let found = std::iter::once(current.as_str())
                .chain(promoted.iter().copied())
                .find(|v| *v == w || version_of(v) == w);
            match found {
                Some(v) => v.to_string(),
                None => {
                    let mut known: Vec<&str> = std::iter::once(current.as_str()).chain(promoted).collect();
                    known.dedup();
                    return Err(UndoError::UnknownRevision {
                        namespace,
                        name,
                        wanted: w.to_string(),
                        known: known.join(", "),
                    });
                }
            }
        }
    };
    // Only spec.version changes (the spec's pod template stays as it is): a rollout of a
    // template or config change cannot be undone this way, nor can a version be set again.
    let version = version_of(&chosen).to_string();
    if version == app.spec.version {
        return Err(if in_flight && wanted.is_none() {
            UndoError::NotAVersionChange
        } else {
            UndoError::SameVersion { version }
        });
    }
    let patch = json!({
        "metadata": {"resourceVersion": app.metadata.resource_version},
        "spec": {"version": version},
    });
    Ok(Undo { at_once: in_flight && chosen == current, revision: chosen, patch })
}

/// Reads the App, decides the undo and writes it; returns the line to print.
pub async fn undo(client: Client, namespace: &str, name: &str, wanted: Option<&str>) -> Result<String, UndoError> {
    let apps: Api<App> = Api::namespaced(client, namespace);
    let api_error = |e: kube::Error| match e {
        kube::Error::Api(s) if s.code == 404 => UndoError::NotFound { namespace: namespace.into(), name: name.into() },
        kube::Error::Api(s) if s.code == 409 => UndoError::Changed { namespace: namespace.into(), name: name.into() },
        kube::Error::Api(s) if s.code == 403 => {
            UndoError::Forbidden { namespace: namespace.into(), message: s.message.clone() }
        }
        other => UndoError::Api { namespace: namespace.into(), name: name.into(), message: other.to_string() },
    };
    let params = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..PatchParams::default() };
    let first = apps.get(name).await.map_err(api_error)?;
    let mut app = first.clone();
    // The operator's status writes change the resourceVersion too: a conflict with the same
    // generation (the spec did not change) is planned again from a fresh read, a few times.
    let mut tries = 0;
    let undo = loop {
        let undo = plan_undo(&app, wanted)?;
        match apps.patch(name, &params, &Patch::Merge(&undo.patch)).await {
            Ok(_) => break undo,
            Err(kube::Error::Api(s)) if s.code == 409 && tries < 5 => {
                tries += 1;
                app = apps.get(name).await.map_err(api_error)?;
                if app.metadata.generation != first.metadata.generation {
                    return Err(UndoError::Changed { namespace: namespace.into(), name: name.into() });
                }
            }
            Err(e) => return Err(api_error(e)),
        }
    };
    let from = app.spec.version.clone();
    Ok(if undo.at_once {
        format!(
            "App {namespace}/{name}: undo requested: spec.version {from} is abandoned at once and {} keeps serving",
            undo.revision
        )
    } else {
        format!(
            "App {namespace}/{name}: undo requested: {} rolls out again through the App's strategy and analysis (its pods are gone)",
            undo.revision
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{AppSpec, AppStatus, RolloutProgress, RolloutRecord};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn record(version: &str, result: RolloutResult) -> RolloutRecord {
        RolloutRecord {
            version: version.into(),
            result,
            at: Time(Timestamp::UNIX_EPOCH),
            message: None,
            replaced: None,
        }
    }

    fn app(spec_version: &str, current: &str, history: Vec<RolloutRecord>, in_flight: bool) -> App {
        let mut app =
            App::new("web", AppSpec { image: "r/web".into(), version: spec_version.into(), ..AppSpec::default() });
        app.metadata.namespace = Some("shop".into());
        app.metadata.resource_version = Some("42".into());
        app.status = Some(AppStatus {
            current_version: Some(current.into()),
            target_version: Some(spec_version.into()),
            rollout: in_flight.then_some(RolloutProgress {
                started_at: Time(Timestamp::UNIX_EPOCH),
                progress_since: None,
                promoted_by_user: false,
            }),
            history,
            ..AppStatus::default()
        });
        app
    }

    #[test]
    fn the_rollout_under_way_is_undone_at_once() {
        let a = app("3", "2", vec![record("2", RolloutResult::Promoted)], true);
        let undo = plan_undo(&a, None).expect("undo");
        assert_eq!((undo.revision.as_str(), undo.at_once), ("2", true));
        assert_eq!(undo.patch, json!({"metadata": {"resourceVersion": "42"}, "spec": {"version": "2"}}));
    }

    #[test]
    fn a_finished_rollout_goes_back_to_the_version_before_through_the_strategy() {
        let history = vec![
            record("3", RolloutResult::RolledBack),
            record("2", RolloutResult::Promoted),
            record("1", RolloutResult::Promoted),
        ];
        let a = app("2", "2", history.clone(), false);
        let undo = plan_undo(&a, None).expect("undo");
        assert_eq!((undo.revision.as_str(), undo.at_once), ("1", false), "never a version that was rolled back");
        assert_eq!(plan_undo(&a, Some("1")).map(|u| u.revision), Ok("1".to_string()));
        let err = plan_undo(&a, Some("3")).expect_err("3 was rolled back");
        assert!(err.to_string().contains("lists: 2, 1"), "{err}");
    }

    #[test]
    fn the_version_a_promotion_replaced_is_one_to_go_back_to() {
        // 1 was a first deployment: only the record of 2 names it.
        let mut promoted = record("2", RolloutResult::Promoted);
        promoted.replaced = Some("1".into());
        let a = app("2", "2", vec![promoted], false);
        assert_eq!(plan_undo(&a, None).map(|u| (u.revision, u.at_once)), Ok(("1".to_string(), false)));
    }

    #[test]
    fn a_rolled_back_version_is_undone_to_the_running_one() {
        let a =
            app("3", "2", vec![record("3", RolloutResult::RolledBack), record("2", RolloutResult::Promoted)], false);
        let undo = plan_undo(&a, None).expect("undo");
        assert_eq!((undo.revision.as_str(), undo.at_once), ("2", true));
    }

    #[test]
    fn nothing_to_go_back_to_is_an_error_that_says_why() {
        let first = app("1", "1", vec![], false);
        assert!(matches!(plan_undo(&first, None), Err(UndoError::NothingEarlier { .. })));
        let mut none = first.clone();
        none.status = None;
        assert!(matches!(plan_undo(&none, None), Err(UndoError::NoStatus { .. })));
    }

    #[test]
    fn only_spec_version_changes() {
        // A template (or config) rollout under way: the version is the same.
        let a = app("1", "1+aaa", vec![record("1+aaa", RolloutResult::Promoted)], true);
        assert_eq!(plan_undo(&a, None), Err(UndoError::NotAVersionChange));
        // The version asked for is the spec's already.
        let b = app(
            "2",
            "2+bbb",
            vec![record("2+bbb", RolloutResult::Promoted), record("2+aaa", RolloutResult::Promoted)],
            false,
        );
        assert_eq!(plan_undo(&b, Some("2")), Err(UndoError::SameVersion { version: "2".into() }));
        assert!(matches!(plan_undo(&b, None), Err(UndoError::NothingEarlier { .. })), "2+aaa is the same version");
        // Revisions of templates (or ConfigMaps) the CLI cannot recompute are fine: only the
        // version part is written.
        let mut promoted = record("2+bbb", RolloutResult::Promoted);
        promoted.replaced = Some("1+ccc".into());
        let c = app("2", "2+bbb", vec![promoted], false);
        assert_eq!(plan_undo(&c, None).map(|u| u.patch["spec"]["version"].clone()), Ok(json!("1")));
    }
}
