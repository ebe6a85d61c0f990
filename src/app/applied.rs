//! What Flotilla last applied to an object, as a mark on the object: the fingerprint of the
//! object it applied (without the mark). Pure: no I/O.
//!
//! A difference between an object and what Flotilla wants of it has two causes. Someone else
//! changed the object (drift, put back and counted as such), or Flotilla wants something new
//! of it that it has not written yet. The second is a rollout step whose write is still to
//! come, and also a decision stored before the replica that made it died, or before its
//! write failed: the next reconcile plans nothing new (the decision is already in status)
//! and completes it. Without the mark, that completion was told as drift. With it, an object
//! whose mark is the fingerprint of what Flotilla wants now was last written as wanted: what
//! differs was changed by someone else. Any other mark (or none, on an object written by an
//! earlier release) says Flotilla's own change is still to be written.
//!
//! Only objects that differ are written, in the fields the drift check compares, so a change
//! of what Flotilla wants in a field it does not compare (a label it no longer sets) leaves
//! the mark behind until the next write; drift found meanwhile is told as an update. The mark
//! is no secret: whoever may edit the object may set it, and so make their own edit read as
//! Flotilla's. It decides only how a write is told (Event reason, drift metric), never what
//! is written.

use kube::Resource;
use serde::Serialize;

use crate::api::fingerprint::hex_fingerprint;

/// The annotation that carries the mark.
pub const ANNOTATION_APPLIED: &str = "flotilla.dev/applied";

/// The fingerprint of `object` without its mark.
pub fn mark_of<K: Resource + Serialize + Clone>(object: &K) -> String {
    let mut bare = object.clone();
    if let Some(a) = bare.meta_mut().annotations.as_mut() {
        a.remove(ANNOTATION_APPLIED);
        if a.is_empty() {
            bare.meta_mut().annotations = None;
        }
    }
    hex_fingerprint(&serde_json::to_vec(&bare).unwrap_or_default())
}

/// `object` with its mark, as applied.
pub fn marked<K: Resource + Serialize + Clone>(object: &K) -> K {
    let mark = mark_of(object);
    let mut out = object.clone();
    out.meta_mut().annotations.get_or_insert_with(Default::default).insert(ANNOTATION_APPLIED.to_string(), mark);
    out
}

/// Whether `observed` was last written by Flotilla as `wanted` is now: a difference in it is
/// someone else's change.
pub fn written_as<K: Resource + Serialize + Clone>(observed: Option<&K>, wanted: &K) -> bool {
    let mark = observed.and_then(|o| o.meta().annotations.as_ref()?.get(ANNOTATION_APPLIED));
    mark.is_some_and(|m| *m == mark_of(wanted))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};

    fn service(port: i32) -> Service {
        let mut s = Service::default();
        s.metadata.name = Some("web".into());
        s.spec = Some(ServiceSpec {
            ports: Some(vec![ServicePort { port, ..ServicePort::default() }]),
            ..ServiceSpec::default()
        });
        s
    }

    #[test]
    fn an_object_written_as_wanted_then_changed_is_drift_and_a_new_want_is_not() {
        let wanted = service(80);
        let applied = marked(&wanted);
        assert_eq!(mark_of(&applied), mark_of(&wanted), "the mark does not count itself");
        // Someone edits the port: what Flotilla wants is what it last wrote.
        let mut edited = applied.clone();
        edited.spec.as_mut().and_then(|s| s.ports.as_mut()).expect("ports")[0].port = 81;
        assert!(written_as(Some(&edited), &wanted), "a hand edit is drift");
        // Flotilla wants a new port (a stored decision not yet written): its own change.
        assert!(!written_as(Some(&applied), &service(8080)), "a new want is an update");
        // Objects of an earlier release, and new ones, carry no mark.
        assert!(!written_as(Some(&wanted), &wanted));
        assert!(!written_as(None, &wanted));
        // A mark set by hand to anything else reads as Flotilla's own change, nothing more.
        let mut forged = edited.clone();
        forged.metadata.annotations.get_or_insert_with(Default::default).insert(ANNOTATION_APPLIED.into(), "x".into());
        assert!(!written_as(Some(&forged), &wanted));
    }

    #[test]
    fn the_mark_is_the_same_for_the_same_object() {
        let mut with_other = service(80);
        with_other.metadata.annotations = Some([("a".to_string(), "b".to_string())].into());
        assert_eq!(mark_of(&marked(&with_other)), mark_of(&with_other));
        assert_ne!(mark_of(&with_other), mark_of(&service(80)));
        assert_eq!(marked(&service(80)).metadata.annotations.map(|a| a.len()), Some(1));
    }
}
