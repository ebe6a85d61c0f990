//! What can go wrong while reconciling an App, and how each failure is retried.

use std::time::Duration;

/// A failed reconcile of one App, with the object it concerned.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("App {namespace}/{name} cannot be read as a v1beta1 App: {source}")]
    InvalidApp {
        namespace: String,
        name: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("App {namespace}/{name}: {source}")]
    InvalidSettings {
        namespace: String,
        name: String,
        #[source]
        source: crate::api::duration::DurationError,
    },
    #[error("App {namespace}/{name}: {}", crate::app::pod_policy::PodPolicy::message(.field, .keys))]
    PodAnnotationsDenied { namespace: String, name: String, field: &'static str, keys: Vec<String> },
    #[error("App {namespace}/{name}: {violation} (the Tenant's spec.podPolicy)")]
    PodPolicyDenied { namespace: String, name: String, violation: crate::app::tenant_pods::Violation },
    #[error(
        "App {namespace}/{name}: spec.template is {bytes} bytes of JSON, more than the {limit} an App's pod may take (its status keeps a copy, and each Deployment another)"
    )]
    TemplateTooLarge { namespace: String, name: String, bytes: usize, limit: usize },
    #[error("App {namespace}/{name} has no uid yet")]
    NotStored { namespace: String, name: String },
    #[error("not writing in namespace {namespace}: this replica's hold on its shard is not current (fenced)")]
    Fenced { namespace: String },
    #[error(
        "the caches of namespace {namespace} did not sync within {after:?} (can the operator list Deployments and HPAs there?)"
    )]
    CachesNotSynced { namespace: String, after: Duration },
    #[error("applying {kind} {namespace}/{name}: {}", brief(.source))]
    Apply {
        kind: &'static str,
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("reading {kind} {namespace}/{name}: {}", brief(.source))]
    Read {
        kind: &'static str,
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("the cached {kind} {namespace}/{name} could not be read back ({source}); nothing was written")]
    CacheUnreadable {
        kind: &'static str,
        namespace: String,
        name: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("deleting {kind} {namespace}/{name}: {}", brief(.source))]
    Delete {
        kind: &'static str,
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "{kind} {namespace}/{name} exists and is not controlled by this App: Flotilla leaves it as it is. Delete or rename it, or give the App another name"
    )]
    NameConflict { kind: &'static str, namespace: String, name: String },
    #[error(
        "not writing {what} {namespace}/{name}: it was made from the Deployment cache's projection, not the Deployment in full (a fault in Flotilla; this write was not sent)"
    )]
    Projected { what: &'static str, namespace: String, name: String },
    #[error("{kind} {namespace}/{name} changed since the cache showed it: planning again from the new one")]
    CacheBehind { kind: &'static str, namespace: String, name: String },
    #[error("writing status of App {namespace}/{name}: {}", brief(.source))]
    Status {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// Shortens `text` to at most `limit` bytes, at a character boundary; whether it did.
pub fn shorten(text: &mut String, limit: usize) -> bool {
    if text.len() <= limit {
        return false;
    }
    let mut cut = limit;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    true
}

/// What an apiserver error says, for status and Events: the apiserver's own message for an
/// API error (never a dump of the client's types), a short description otherwise.
pub fn brief(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) if !status.message.is_empty() => {
            format!("{} ({})", status.message, status.code)
        }
        kube::Error::Api(status) => format!("the apiserver answered {} {}", status.code, status.reason),
        kube::Error::Service(e) if e.downcast_ref::<crate::sharding::fence::Fenced>().is_some() => {
            "not sent: this replica's hold on the namespace's shard lapsed (fenced)".to_string()
        }
        kube::Error::Service(e) if e.downcast_ref::<tower::timeout::error::Elapsed>().is_some() => {
            "the apiserver did not answer in time".to_string()
        }
        kube::Error::Service(_) | kube::Error::HyperError(_) => "the apiserver could not be reached".to_string(),
        kube::Error::SerdeError(_) => "the apiserver's answer could not be read".to_string(),
        _ => "the request failed".to_string(),
    }
}

/// How a failure is retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// Someone else wrote first (409): retry at once with fresh state.
    Conflict,
    /// 403 or 404: the operator lacks rights here or the namespace is going; report it and back off.
    Refused,
    /// The object itself is unusable; wait for it to change.
    Invalid,
    /// This replica's hold on the namespace's shard is not current: look again soon (the
    /// hold is renewed, or the namespace's controller is stopped).
    Fenced,
    /// An object the App would derive exists and belongs to someone else: look again now
    /// and then (it may be removed), without hammering.
    NameConflict,
    /// Anything else (timeouts, 5xx): back off.
    Transient,
}

impl ReconcileError {
    /// A cached object that did not parse back (`Context::deployment`): the reconcile stops
    /// before any write and is retried with backoff (`Transient`).
    pub fn unreadable(kind: &'static str, namespace: &str, name: &str, source: serde_json::Error) -> Self {
        Self::CacheUnreadable { kind, namespace: namespace.to_string(), name: name.to_string(), source }
    }

    fn source_error(&self) -> Option<&kube::Error> {
        match self {
            Self::Apply { source, .. }
            | Self::Read { source, .. }
            | Self::Delete { source, .. }
            | Self::Status { source, .. } => Some(source),
            _ => None,
        }
    }

    fn api_code(&self) -> Option<u16> {
        match self.source_error()? {
            kube::Error::Api(status) => Some(status.code),
            _ => None,
        }
    }

    pub fn class(&self) -> ErrorClass {
        if self.source_error().is_some_and(crate::sharding::fence::is_fenced) {
            return ErrorClass::Fenced;
        }
        match (self, self.api_code()) {
            (Self::Fenced { .. }, _) => ErrorClass::Fenced,
            (Self::NameConflict { .. }, _) => ErrorClass::NameConflict,
            (Self::CacheBehind { .. }, _) => ErrorClass::Conflict,
            (
                Self::InvalidApp { .. }
                | Self::InvalidSettings { .. }
                | Self::NotStored { .. }
                | Self::PodAnnotationsDenied { .. }
                | Self::PodPolicyDenied { .. }
                | Self::TemplateTooLarge { .. },
                _,
            ) => ErrorClass::Invalid,
            (_, Some(409)) => ErrorClass::Conflict,
            (_, Some(403 | 404)) => ErrorClass::Refused,
            _ => ErrorClass::Transient,
        }
    }

    /// Short label for metrics.
    pub fn kind(&self) -> &'static str {
        match self.class() {
            ErrorClass::Fenced => "fenced",
            ErrorClass::Conflict => "conflict",
            ErrorClass::Refused => "refused",
            ErrorClass::Invalid => "invalid",
            ErrorClass::NameConflict => "conflict",
            ErrorClass::Transient => "transient",
        }
    }

    /// The reason shown in status and Events.
    pub fn reason(&self) -> &'static str {
        match self.api_code() {
            Some(403) => "Forbidden",
            Some(404) => "NotFound",
            _ => match self {
                Self::InvalidApp { .. } | Self::InvalidSettings { .. } => "InvalidSpec",
                Self::NameConflict { .. } => "NameConflict",
                Self::PodAnnotationsDenied { .. } => "PodAnnotationDenied",
                Self::PodPolicyDenied { .. } => "PodPolicyDenied",
                Self::TemplateTooLarge { .. } => "TemplateTooLarge",
                _ => "ReconcileError",
            },
        }
    }
}

/// Delay before the next attempt after `failures` consecutive failures of this class:
/// conflicts retry at once (then back off if they persist), a fenced write is looked at
/// again after 2 s, everything else backs off exponentially from 1 s to 5 min.
pub fn retry_delay(class: ErrorClass, failures: u32) -> Option<Duration> {
    match class {
        ErrorClass::Conflict if failures < 3 => Some(Duration::from_millis(50)),
        ErrorClass::Fenced => Some(Duration::from_secs(2)),
        ErrorClass::Conflict => Some(Duration::from_secs(1u64 << (failures - 3).min(8))),
        ErrorClass::Invalid => None,
        // Every 10 s, not backed off: the object may go away at any time (only a look shows
        // it when it is not one of the operator's own, which the caches do not watch), and
        // the App's own writes trigger several reconciles at once, so a count of failures
        // would grow in milliseconds (5 within 30 ms, measured) and push the look a minute away.
        ErrorClass::NameConflict => Some(Duration::from_secs(10)),
        ErrorClass::Refused | ErrorClass::Transient => {
            let secs = 1u64.checked_shl(failures.min(16)).unwrap_or(u64::MAX).min(300);
            Some(Duration::from_secs(secs))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreadable_cache_entry_is_retried_and_named() {
        let source = serde_json::from_str::<u32>("x").expect_err("not a number");
        let err = ReconcileError::unreadable("Deployment", "shop", "web", source);
        assert_eq!(err.class(), ErrorClass::Transient, "retried with backoff, never waited on forever");
        assert!(err.to_string().contains("cached Deployment shop/web"), "{err}");
    }

    #[test]
    fn backoff_grows_and_caps() {
        let d = |n| retry_delay(ErrorClass::Refused, n).map(|d| d.as_secs());
        assert_eq!([d(0), d(1), d(3), d(8), d(40)], [Some(1), Some(2), Some(8), Some(256), Some(300)]);
        assert_eq!(retry_delay(ErrorClass::Conflict, 0), Some(Duration::from_millis(50)));
        assert_eq!(retry_delay(ErrorClass::Conflict, 5), Some(Duration::from_secs(4)), "persistent conflicts back off");
        assert_eq!(retry_delay(ErrorClass::Fenced, 7), Some(Duration::from_secs(2)));
        assert_eq!(retry_delay(ErrorClass::Invalid, 0), None);
    }

    fn api_error(code: u16) -> ReconcileError {
        let status = kube::core::Status::failure("x", "y").with_code(code);
        ReconcileError::Apply {
            kind: "Deployment",
            namespace: "n".into(),
            name: "a".into(),
            source: kube::Error::Api(Box::new(status)),
        }
    }

    #[test]
    fn messages_carry_the_apiservers_words_not_the_clients_types() {
        let err = api_error(422);
        let text = err.to_string();
        assert_eq!(text, "applying Deployment n/a: x (422)");
        assert!(!text.contains("Status {"), "{text}");
        let conflict = ReconcileError::NameConflict { kind: "Service", namespace: "n".into(), name: "db".into() };
        assert_eq!(conflict.reason(), "NameConflict");
        assert_eq!(conflict.class(), ErrorClass::NameConflict);
        let d = |n| retry_delay(ErrorClass::NameConflict, n).map(|d| d.as_secs());
        assert_eq!([d(0), d(1), d(4), d(30)], [Some(10); 4]);
    }

    #[test]
    fn text_is_shortened_at_a_character_boundary() {
        let mut text = "ab\u{e9}cd".to_string();
        assert!(shorten(&mut text, 3), "the accented letter takes bytes 2 and 3");
        assert_eq!(text, "ab");
        let mut short = "abc".to_string();
        assert!(!shorten(&mut short, 3));
        assert_eq!(short, "abc");
    }

    #[test]
    fn classes_by_code() {
        assert_eq!(api_error(409).class(), ErrorClass::Conflict);
        assert_eq!(api_error(403).class(), ErrorClass::Refused);
        assert_eq!(api_error(403).reason(), "Forbidden");
        assert_eq!(api_error(404).class(), ErrorClass::Refused);
        assert_eq!(api_error(500).class(), ErrorClass::Transient);
    }
}
