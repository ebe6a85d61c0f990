//! What server-side apply cannot put back on a Service: a port another writer moved, added or
//! removed. Pure: no I/O.
//!
//! Flotilla writes its Services with server-side apply, which takes back each field it owns
//! when someone else changed its value (the selector is an atomic map: it is taken back
//! whole; a port's name and target port are fields of Flotilla's entry), but never removes a
//! field another writer owns. A Service's ports are a list keyed by port and protocol, so a
//! port moved by hand is an entry of the other writer's: every apply then failed with
//! "Duplicate value" (two entries named alike), and the Service was never put back; a port
//! added by hand stayed for good, told as corrected drift at each reconcile. When the ports'
//! keys (number and protocol) differ from those Flotilla wants, the ports are first replaced
//! whole with a JSON merge patch (a list in a merge patch replaces the list), conditional on
//! the resourceVersion read; the apply then writes the rest. Only then: a replacement also
//! drops what others set on Flotilla's own entry (an `appProtocol`), which an apply keeps.

use k8s_openapi::api::core::v1::Service;
use serde_json::{Value, json};

use crate::app::desired::port_key;

/// The keys of `s`'s ports (`desired::port_key`), sorted.
fn keys(s: &Service) -> Vec<(i32, &str)> {
    let mut keys: Vec<_> = s.spec.as_ref().and_then(|s| s.ports.as_ref()).into_iter().flatten().map(port_key).collect();
    keys.sort_unstable();
    keys
}

/// The merge patch that makes `observed`'s ports `wanted`'s, only if `observed` is still at
/// its resourceVersion (409 otherwise); `None` when an apply can put them back (the same
/// keys), or when Flotilla wants no port (the apiserver refuses a Service without).
pub fn replacement(observed: &Service, wanted: &Service) -> Option<Value> {
    let want = keys(wanted);
    if want.is_empty() || keys(observed) == want {
        return None;
    }
    let ports = wanted.spec.as_ref().and_then(|s| s.ports.as_ref()).map(|p| json!(p))?;
    Some(json!({
        "metadata": {"resourceVersion": observed.metadata.resource_version},
        "spec": {"ports": ports},
    }))
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
    fn ports_another_writer_moved_added_or_removed_are_replaced_whole() {
        let web = json!({"app.kubernetes.io/name": "web"});
        let cases = [
            ("a port moved", service(web.clone(), json!([{"name": "http", "port": 8081, "targetPort": 8080}]))),
            (
                "a port added",
                service(
                    web.clone(),
                    json!([{"name": "http", "port": 80, "targetPort": 8080}, {"name": "debug", "port": 6060}]),
                ),
            ),
            ("no ports", service(web.clone(), Value::Null)),
            (
                "the protocol flipped",
                service(web.clone(), json!([{"name": "http", "port": 80, "targetPort": 8080, "protocol": "UDP"}])),
            ),
            (
                "the same number added for UDP",
                service(
                    web.clone(),
                    json!([{"name": "http", "port": 80, "targetPort": 8080}, {"name": "dns", "port": 80, "protocol": "UDP"}]),
                ),
            ),
        ];
        for (what, observed) in cases {
            assert!(!service_differences(&wanted(), Some(&observed)).is_empty(), "{what}");
            let mut projected = observed.clone();
            crate::app::service_projection::project_service(&mut projected);
            assert!(!service_differences(&wanted(), Some(&projected)).is_empty(), "{what}: seen through the cache");
            let patch = replacement(&observed, &wanted()).unwrap_or_else(|| panic!("{what}: no replacement"));
            assert_eq!(patch["metadata"]["resourceVersion"], "9", "{what}: only the version read");
            let after = merged(&observed, &patch);
            assert_eq!(service_differences(&wanted(), Some(&after)), vec![], "{what}: {patch}");
        }
    }

    #[test]
    fn what_an_apply_takes_back_needs_no_replacement() {
        let web = json!({"app.kubernetes.io/name": "web"});
        let cases = [
            // Flotilla's own change of the App's port, or a hand edit of its entry.
            ("the target port", service(web.clone(), json!([{"name": "http", "port": 80, "targetPort": 9090}]))),
            ("the port's name", service(web.clone(), json!([{"name": "web", "port": 80, "targetPort": 8080}]))),
            // An atomic map: an apply replaces it whole.
            (
                "a selector key added",
                service(
                    json!({"app.kubernetes.io/name": "web", "hijack": "x"}),
                    json!([{"name": "http", "port": 80, "targetPort": 8080}]),
                ),
            ),
        ];
        for (what, observed) in cases {
            assert!(!service_differences(&wanted(), Some(&observed)).is_empty(), "{what}");
            assert_eq!(replacement(&observed, &wanted()), None, "{what}: an apply puts it back");
        }
        let none = service(web, Value::Null);
        assert_eq!(replacement(&wanted(), &none), None, "a Service with no port is never sent");
    }
}
