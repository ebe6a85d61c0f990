//! What server-side apply cannot put back on a Service: a port another writer moved or added.
//! Pure: no I/O.
//!
//! Flotilla writes its Services with server-side apply, which takes back each field it owns
//! when someone else changed its value (the selector is an atomic map: it is taken back
//! whole), but never removes a field another writer owns. A Service's ports are a list keyed
//! by port number and protocol, so a port moved by hand is an entry of the other writer's:
//! every apply then failed with "Duplicate value" (two entries named alike), and the Service
//! was never put back; a port added by hand stayed for good, told as corrected drift at each
//! reconcile. When the ports differ, they are first replaced whole with a JSON merge patch
//! (a list in a merge patch replaces the list), conditional on the resourceVersion read; the
//! apply then writes the rest.

use k8s_openapi::api::core::v1::Service;
use serde_json::{Value, json};

use crate::app::desired::Difference;

/// Whether `diffs` (`desired::service_differences`) name the ports, which an apply may not be
/// able to put back.
pub fn needs_replacing(diffs: &[Difference]) -> bool {
    diffs.iter().any(|d| d.field == "spec.ports")
}

/// The merge patch that makes `observed`'s ports `wanted`'s, only if `observed` is still at
/// its resourceVersion (409 otherwise).
pub fn replacement(observed: &Service, wanted: &Service) -> Value {
    let ports = wanted.spec.as_ref().and_then(|s| s.ports.as_ref()).map(|p| json!(p)).unwrap_or(json!([]));
    json!({
        "metadata": {"resourceVersion": observed.metadata.resource_version},
        "spec": {"ports": ports},
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::desired::service_differences;

    fn service(selector: Value, ports: Value) -> Service {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "shop", "resourceVersion": "9"},
            "spec": {"selector": selector, "ports": ports}
        }))
        .expect("a Service")
    }

    fn wanted() -> Service {
        service(json!({"app.kubernetes.io/name": "web"}), json!([{"name": "http", "port": 80, "targetPort": 8080}]))
    }

    /// `observed` with `patch` merged into it (RFC 7386), as the apiserver does.
    fn merged(observed: &Service, patch: &Value) -> Service {
        let mut doc = serde_json::to_value(observed).expect("JSON");
        json_patch::merge(&mut doc, patch);
        serde_json::from_value(doc).expect("a Service")
    }

    #[test]
    fn the_ports_another_writer_changed_are_replaced_whole() {
        let web = json!({"app.kubernetes.io/name": "web"});
        let cases = [
            ("a port moved", service(web.clone(), json!([{"name": "http", "port": 8081, "targetPort": 8080}]))),
            ("a target port changed", service(web.clone(), json!([{"name": "http", "port": 80, "targetPort": 9090}]))),
            (
                "a port added",
                service(
                    web.clone(),
                    json!([{"name": "http", "port": 80, "targetPort": 8080}, {"name": "debug", "port": 6060}]),
                ),
            ),
            ("no ports", service(web.clone(), Value::Null)),
        ];
        for (what, observed) in cases {
            let diffs = service_differences(&wanted(), Some(&observed));
            assert!(needs_replacing(&diffs), "{what}: {diffs:?}");
            let patch = replacement(&observed, &wanted());
            assert_eq!(patch["metadata"]["resourceVersion"], "9", "{what}: only the version read");
            let after = merged(&observed, &patch);
            assert_eq!(service_differences(&wanted(), Some(&after)), vec![], "{what}: {patch}");
        }
    }

    #[test]
    fn what_an_apply_takes_back_needs_no_replacement() {
        let mut wanted = wanted();
        wanted.metadata.labels = Some([("app.kubernetes.io/name".to_string(), "web".to_string())].into());
        let diffs = service_differences(&wanted, Some(&self::wanted()));
        assert_eq!(diffs.iter().map(|d| d.field).collect::<Vec<_>>(), vec!["metadata.labels"]);
        assert!(!needs_replacing(&diffs), "an apply takes labels back");
        let hijacked = service(
            json!({"app.kubernetes.io/name": "web", "hijack": "x"}),
            json!([{"name": "http", "port": 80, "targetPort": 8080}]),
        );
        let diffs = service_differences(&self::wanted(), Some(&hijacked));
        assert_eq!(diffs.iter().map(|d| d.field).collect::<Vec<_>>(), vec!["spec.selector"]);
        assert!(!needs_replacing(&diffs), "the selector is an atomic map: an apply replaces it whole");
    }
}
