//! What the Service cache keeps of each Service: what the drift check, the claim of a name and
//! a delete read, not the whole object. Pure: no I/O.
//!
//! `desired::service_differences` compares the selector, each port's number, protocol, name
//! and target port, and the labels; `applied::written_as` reads the applied mark; a claim and
//! a delete read the owners, the uid and the resourceVersion. What the apiserver fills in
//! (the cluster IPs, their families and policies, the session affinity, the type, a port's
//! protocol when it is the default TCP, the status) is about a third of a Service's text in
//! the cache, and none of it is read. A cached Service is never written back: the apply sends
//! what Flotilla wants.

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::app::applied::ANNOTATION_APPLIED;
use crate::app::desired::DEFAULT_PROTOCOL;

/// Keeps of `s` only what is read (see the module's text).
pub fn project_service(s: &mut Service) {
    let meta = std::mem::take(&mut s.metadata);
    // Only the applied mark is read: any other annotation, Flotilla's prefix or not, is
    // whatever a writer of the Service put there, and is not kept.
    let annotations: std::collections::BTreeMap<String, String> =
        meta.annotations.into_iter().flatten().filter(|(k, _)| k == ANNOTATION_APPLIED).collect();
    s.metadata = ObjectMeta {
        name: meta.name,
        namespace: meta.namespace,
        uid: meta.uid,
        resource_version: meta.resource_version,
        owner_references: meta.owner_references,
        deletion_timestamp: meta.deletion_timestamp,
        labels: meta.labels,
        annotations: (!annotations.is_empty()).then_some(annotations),
        ..ObjectMeta::default()
    };
    s.status = None;
    s.spec = s.spec.take().map(|spec| ServiceSpec {
        selector: spec.selector,
        ports: spec.ports.map(|ports| {
            ports
                .into_iter()
                .map(|p| ServicePort {
                    name: p.name,
                    port: p.port,
                    target_port: p.target_port,
                    // Part of a port's key: kept when it is not the default.
                    protocol: p.protocol.filter(|x| x != DEFAULT_PROTOCOL),
                    ..ServicePort::default()
                })
                .collect()
        }),
        ..ServiceSpec::default()
    });
}

/// `s` projected, as cached (`watch_cache::compact`).
pub fn compact_service(mut s: Service) -> crate::watch_cache::Compact<Service> {
    crate::watch_cache::slim(&mut s);
    project_service(&mut s);
    crate::watch_cache::Compact::of(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::applied;
    use crate::app::desired::service_differences;

    /// A Service as the apiserver returns one of Flotilla's: every defaulted field filled in,
    /// and the labels and annotations of others.
    fn full() -> Service {
        let wanted = wanted();
        let mut s: Service = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "shop", "uid": "u-1", "resourceVersion": "9",
                "creationTimestamp": "2026-12-01T10:00:00Z",
                "labels": {"app.kubernetes.io/name": "web", "team": "a"},
                "annotations": {"note": "x".repeat(2048), "flotilla.dev/junk": "y".repeat(2048)},
                "ownerReferences": [{"apiVersion": "flotilla.dev/v1beta1", "kind": "App", "name": "web",
                    "uid": "app-uid", "controller": true}],
                "managedFields": [{"manager": "flotilla", "operation": "Apply"}]},
            "spec": {"selector": {"app.kubernetes.io/name": "web"}, "clusterIP": "10.0.0.7", "clusterIPs": ["10.0.0.7"],
                "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack", "internalTrafficPolicy": "Cluster",
                "sessionAffinity": "None", "type": "ClusterIP",
                "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]},
            "status": {"loadBalancer": {}}
        }))
        .expect("a Service");
        let mark = applied::marked(&wanted).metadata.annotations.unwrap_or_default();
        s.metadata.annotations.get_or_insert_default().extend(mark);
        s
    }

    /// What Flotilla applies for that Service.
    fn wanted() -> Service {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "shop", "labels": {"app.kubernetes.io/name": "web"}},
            "spec": {"selector": {"app.kubernetes.io/name": "web"},
                "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}
        }))
        .expect("a Service")
    }

    fn projected() -> Service {
        let mut s = full();
        project_service(&mut s);
        s
    }

    #[test]
    fn what_is_read_reads_the_same_of_a_projection() {
        let (f, p) = (full(), projected());
        assert_eq!(service_differences(&wanted(), Some(&p)), service_differences(&wanted(), Some(&f)));
        assert_eq!(service_differences(&wanted(), Some(&p)), vec![]);
        assert!(applied::written_as(Some(&p), &wanted()), "the applied mark is kept");
        let m = &p.metadata;
        assert_eq!(
            (m.uid.as_deref(), m.resource_version.as_deref()),
            (Some("u-1"), Some("9")),
            "a delete's preconditions"
        );
        assert_eq!(m.owner_references, f.metadata.owner_references, "a claim reads the owner");
        assert_eq!(m.labels, f.metadata.labels);
    }

    #[test]
    fn a_drift_of_each_compared_field_still_shows_through_the_projection() {
        type Edit = fn(&mut Service);
        let edits: [(&str, Edit); 5] = [
            ("selector", |s| s.spec.as_mut().expect("spec").selector = None),
            ("port", |s| s.spec.as_mut().expect("spec").ports.as_mut().expect("ports")[0].port = 81),
            ("port name", |s| s.spec.as_mut().expect("spec").ports.as_mut().expect("ports")[0].name = None),
            ("target port", |s| s.spec.as_mut().expect("spec").ports.as_mut().expect("ports")[0].target_port = None),
            ("labels", |s| s.metadata.labels = None),
        ];
        for (what, edit) in edits {
            let mut s = full();
            edit(&mut s);
            project_service(&mut s);
            assert!(!service_differences(&wanted(), Some(&s)).is_empty(), "{what} changed by hand must show");
        }
    }

    #[test]
    fn a_projection_keeps_none_of_what_the_apiserver_fills_in() {
        let (f, p) = (full(), projected());
        let spec = p.spec.as_ref().expect("spec");
        assert_eq!((spec.cluster_ip.as_ref(), spec.type_.as_ref(), spec.ip_families.as_ref()), (None, None, None));
        assert_eq!(spec.ports.as_ref().map(|p| p[0].protocol.as_ref()), Some(None));
        assert!(p.status.is_none() && p.metadata.creation_timestamp.is_none());
        let annotations = p.metadata.annotations.as_ref().expect("the applied mark");
        assert_eq!(annotations.keys().collect::<Vec<_>>(), vec![ANNOTATION_APPLIED], "any other is a writer's");
        let size = |s: &Service| serde_json::to_string(s).map(|t| t.len()).unwrap_or(0);
        let (full, kept) = (size(&f), size(&p));
        // Without the others' annotations a Service as the apiserver returns it is about 600
        // bytes of cached text, its projection about 330.
        assert!(kept * 8 < full, "projection {kept} bytes of {full}");
    }
}
