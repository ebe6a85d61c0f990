//! `flotilla promote|abort|retry|pause|resume`: a user's request to an App's rollout, written as
//! an annotation with a JSON merge patch (not server-side apply, so that the command never
//! takes ownership of spec fields). The operator reads it in `rollout::planner::pending_request`.

use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use crate::api::App;
use crate::api::rollout::{ANNOTATION_ACTION, ANNOTATION_PAUSED};
use crate::rollout::planner::Verb;

/// Field manager recorded in the App's managedFields for the annotations the command writes.
const FIELD_MANAGER: &str = "flotilla-cli";

/// What a user asks of a rollout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// A one-off action, carried by `flotilla.dev/action` and acted on once.
    Action(Verb),
    /// Hold the rollout where it is while `flotilla.dev/paused` is `"true"`.
    Pause,
    /// Remove `flotilla.dev/paused`.
    Resume,
}

impl Request {
    /// The word the confirmation uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Request::Action(verb) => verb.as_str(),
            Request::Pause => "pause",
            Request::Resume => "resume",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("App {namespace}/{name} not found")]
    NotFound { namespace: String, name: String },
    #[error("you lack the rights to patch Apps in namespace {namespace} (the apiserver said: {message})")]
    Forbidden { namespace: String, message: String },
    #[error("patching App {namespace}/{name}: {source}")]
    Patch {
        namespace: String,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
}

/// The value of `flotilla.dev/action` for `verb`; `id` makes each request distinct.
pub fn action_value(verb: Verb, id: i64) -> String {
    format!("{} {id}", verb.as_str())
}

/// The JSON merge patch of the App's annotations that carries `request`. Pure.
pub fn annotation_patch(request: Request, id: i64) -> Value {
    let (key, value) = match request {
        Request::Action(verb) => (ANNOTATION_ACTION, Value::String(action_value(verb, id))),
        Request::Pause => (ANNOTATION_PAUSED, Value::String("true".into())),
        // A merge patch removes a key set to null.
        Request::Resume => (ANNOTATION_PAUSED, Value::Null),
    };
    json!({ "metadata": { "annotations": { key: value } } })
}

/// The line printed once the request is written.
pub fn confirmation(namespace: &str, name: &str, request: Request, id: i64) -> String {
    let detail = match request {
        Request::Action(verb) => action_value(verb, id),
        Request::Pause => format!("{ANNOTATION_PAUSED}=true"),
        Request::Resume => format!("{ANNOTATION_PAUSED} removed"),
    };
    format!("App {namespace}/{name}: {} requested ({detail})", request.as_str())
}

/// Writes `request` on the App `namespace/name` and returns the confirmation line.
pub async fn send(client: Client, namespace: &str, name: &str, request: Request) -> Result<String, ControlError> {
    // Milliseconds since the epoch: distinct from any earlier request of this App.
    let id = Timestamp::now().as_millisecond();
    let apps: Api<App> = Api::namespaced(client, namespace);
    let params = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..PatchParams::default() };
    match apps.patch(name, &params, &Patch::Merge(annotation_patch(request, id))).await {
        Ok(_) => Ok(confirmation(namespace, name, request, id)),
        Err(kube::Error::Api(s)) if s.code == 404 => {
            Err(ControlError::NotFound { namespace: namespace.into(), name: name.into() })
        }
        Err(kube::Error::Api(s)) if s.code == 403 => {
            Err(ControlError::Forbidden { namespace: namespace.into(), message: s.message.clone() })
        }
        Err(source) => {
            Err(ControlError::Patch { namespace: namespace.into(), name: name.into(), source: Box::new(source) })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::AppSpec;
    use crate::rollout::planner::pending_request;

    #[test]
    fn patches() {
        let cases = [
            (
                Request::Action(Verb::Promote),
                json!({"metadata": {"annotations": {"flotilla.dev/action": "promote 42"}}}),
            ),
            (
                Request::Action(Verb::PromoteFull),
                json!({"metadata": {"annotations": {"flotilla.dev/action": "promote-full 42"}}}),
            ),
            (Request::Action(Verb::Abort), json!({"metadata": {"annotations": {"flotilla.dev/action": "abort 42"}}})),
            (Request::Action(Verb::Retry), json!({"metadata": {"annotations": {"flotilla.dev/action": "retry 42"}}})),
            (Request::Pause, json!({"metadata": {"annotations": {"flotilla.dev/paused": "true"}}})),
            (Request::Resume, json!({"metadata": {"annotations": {"flotilla.dev/paused": null}}})),
        ];
        for (request, want) in cases {
            assert_eq!(annotation_patch(request, 42), want, "{request:?}");
        }
    }

    #[test]
    fn action_values_are_what_the_planner_reads() {
        for verb in [Verb::Promote, Verb::PromoteFull, Verb::Abort, Verb::Retry] {
            let patch = annotation_patch(Request::Action(verb), 1_764_488_400_123);
            let value = patch["metadata"]["annotations"][ANNOTATION_ACTION].as_str().unwrap_or_default().to_string();
            let mut app = App::new("checkout", AppSpec::default());
            app.metadata.annotations = Some([(ANNOTATION_ACTION.to_string(), value.clone())].into());
            assert_eq!(pending_request(&app), Some((value, Ok(verb))));
        }
    }

    #[test]
    fn confirmations() {
        let cases = [
            (Request::Action(Verb::Abort), "App shop/checkout: abort requested (abort 1764488400123)"),
            (
                Request::Action(Verb::PromoteFull),
                "App shop/checkout: promote-full requested (promote-full 1764488400123)",
            ),
            (Request::Pause, "App shop/checkout: pause requested (flotilla.dev/paused=true)"),
            (Request::Resume, "App shop/checkout: resume requested (flotilla.dev/paused removed)"),
        ];
        for (request, want) in cases {
            assert_eq!(confirmation("shop", "checkout", request, 1_764_488_400_123), want);
        }
    }
}
