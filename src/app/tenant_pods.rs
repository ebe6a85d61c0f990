//! Whether an App's pod keeps to its Tenant's pod policy (`spec.podPolicy`): the priority
//! and runtime classes, the nodes, tolerations, inline CSI drivers and token audiences the
//! platform allows the tenant. Pure. The same rules run at admission
//! (rbac/admission.yaml, `flotilla-tenant-pod-policy`); here they also hold for Apps written
//! before the policy was set or tightened.

use k8s_openapi::api::core::v1::PodSpec;

use crate::api::{PodTemplate, TenantPodPolicy};

/// What a pod asks for that its Tenant does not allow: the field and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {why}")]
pub struct Violation {
    pub field: String,
    pub why: String,
}

fn violation(field: impl Into<String>, why: impl Into<String>) -> Option<Violation> {
    Some(Violation { field: field.into(), why: why.into() })
}

/// The first thing `template` asks for that `policy` does not allow, if any. An App
/// without a template runs a pod that asks for none of it, but for the node selector.
pub fn check(policy: &TenantPodPolicy, template: Option<&PodTemplate>) -> Option<Violation> {
    let default = PodSpec::default();
    let pod = template.and_then(|t| t.spec.as_ref()).unwrap_or(&default);
    const SPEC: &str = "spec.template.spec";
    classes(pod, policy)
        .or_else(|| nodes(pod, policy))
        .or_else(|| tolerations(pod, policy))
        .or_else(|| volumes(pod, policy))
        .map(|v| Violation { field: format!("{SPEC}.{}", v.field), ..v })
}

fn allowed_list(allowed: &[String]) -> String {
    if allowed.is_empty() { "none is allowed".into() } else { format!("allowed: {}", allowed.join(", ")) }
}

fn classes(pod: &PodSpec, policy: &TenantPodPolicy) -> Option<Violation> {
    let named = [
        ("priorityClassName", pod.priority_class_name.as_deref(), &policy.allowed_priority_classes),
        ("runtimeClassName", pod.runtime_class_name.as_deref(), &policy.allowed_runtime_classes),
    ];
    named.into_iter().find_map(|(field, name, allowed)| {
        // An empty name is no name (the apiserver defaults it), as at admission.
        let name = name.filter(|n| !n.is_empty())?;
        (!allowed.iter().any(|a| a == name)).then(|| Violation {
            field: field.into(),
            why: format!("{name:?} is not allowed for this tenant ({})", allowed_list(allowed)),
        })
    })
}

fn nodes(pod: &PodSpec, policy: &TenantPodPolicy) -> Option<Violation> {
    if pod.node_name.as_deref().is_some_and(|n| !n.is_empty()) {
        return violation("nodeName", "may not be set: the tenant's pods are placed by the scheduler");
    }
    let selected = pod.node_selector.clone().unwrap_or_default();
    policy.node_selector.iter().find(|(k, v)| selected.get(*k) != Some(*v)).and_then(|(k, v)| {
        violation("nodeSelector", format!("must select {k}={v:?} (the tenant's nodes); add it to the template"))
    })
}

fn tolerations(pod: &PodSpec, policy: &TenantPodPolicy) -> Option<Violation> {
    pod.tolerations.iter().flatten().enumerate().find_map(|(i, t)| {
        let field = format!("tolerations[{i}]");
        match t.key.as_deref().filter(|k| !k.is_empty()) {
            None => violation(field, "tolerates every taint (no key); name the taint's key"),
            Some(key) if !policy.allowed_toleration_keys.iter().any(|a| a == key) => violation(
                field,
                format!(
                    "tolerating {key:?} is not allowed for this tenant ({})",
                    allowed_list(&policy.allowed_toleration_keys)
                ),
            ),
            Some(_) => None,
        }
    })
}

fn volumes(pod: &PodSpec, policy: &TenantPodPolicy) -> Option<Violation> {
    pod.volumes.iter().flatten().enumerate().find_map(|(i, v)| {
        let csi =
            v.csi.as_ref().map(|c| c.driver.as_str()).filter(|d| !policy.allowed_csi_drivers.iter().any(|a| a == d));
        if let Some(driver) = csi {
            return violation(
                format!("volumes[{i}].csi.driver"),
                format!("{driver:?} is not allowed for this tenant ({})", allowed_list(&policy.allowed_csi_drivers)),
            );
        }
        let mut sources = v.projected.iter().flat_map(|p| p.sources.iter().flatten()).enumerate();
        sources.find_map(|(j, s)| {
            let audience = s.service_account_token.as_ref()?.audience.as_deref().filter(|a| !a.is_empty())?;
            (!policy.allowed_token_audiences.iter().any(|a| a == audience)).then(|| Violation {
                field: format!("volumes[{i}].projected.sources[{j}].serviceAccountToken.audience"),
                why: format!(
                    "a token for {audience:?} is not allowed for this tenant ({})",
                    allowed_list(&policy.allowed_token_audiences)
                ),
            })
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::BTreeMap;

    fn template(spec: serde_json::Value) -> PodTemplate {
        serde_json::from_value(json!({"spec": spec})).expect("template")
    }

    fn policy() -> TenantPodPolicy {
        TenantPodPolicy {
            allowed_priority_classes: vec!["tenant-high".into()],
            allowed_runtime_classes: vec!["gvisor".into()],
            node_selector: BTreeMap::from([("pool".to_string(), "shop".to_string())]),
            allowed_toleration_keys: vec!["pool".into()],
            allowed_csi_drivers: vec!["secrets-store.csi.k8s.io".into()],
            allowed_token_audiences: vec!["vault".into()],
        }
    }

    fn verdict(spec: serde_json::Value) -> Option<String> {
        check(&policy(), Some(&template(spec))).map(|v| v.to_string())
    }

    const OK: fn() -> serde_json::Value = || {
        json!({"containers": [{"name": "app"}], "nodeSelector": {"pool": "shop", "disk": "ssd"},
               "priorityClassName": "tenant-high", "runtimeClassName": "gvisor",
               "tolerations": [{"key": "pool", "operator": "Equal", "value": "shop", "effect": "NoSchedule"}],
               "volumes": [{"name": "s", "csi": {"driver": "secrets-store.csi.k8s.io"}},
                           {"name": "t", "projected": {"sources": [{"serviceAccountToken": {"audience": "vault", "path": "t"}},
                                                                   {"serviceAccountToken": {"path": "k"}}]}}]})
    };

    #[test]
    fn what_the_tenant_is_allowed_passes() {
        assert_eq!(verdict(OK()), None);
        assert_eq!(check(&TenantPodPolicy::default(), Some(&template(json!({"containers": [{"name": "app"}]})))), None);
    }

    #[test]
    fn each_field_outside_the_policy_is_refused_by_name() {
        let cases = [
            (
                "priorityClassName",
                json!("system-node-critical"),
                "spec.template.spec.priorityClassName: \"system-node-critical\" is not allowed for this tenant (allowed: tenant-high)",
            ),
            ("runtimeClassName", json!("runc"), "spec.template.spec.runtimeClassName: \"runc\" is not allowed"),
            ("nodeName", json!("control-plane-1"), "spec.template.spec.nodeName: may not be set"),
            ("nodeSelector", json!({"pool": "bank"}), "spec.template.spec.nodeSelector: must select pool=\"shop\""),
            (
                "tolerations",
                json!([{"operator": "Exists"}]),
                "spec.template.spec.tolerations[0]: tolerates every taint",
            ),
            (
                "tolerations",
                json!([{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]),
                "spec.template.spec.tolerations[0]: tolerating \"node-role.kubernetes.io/control-plane\" is not allowed",
            ),
            (
                "volumes",
                json!([{"name": "x", "csi": {"driver": "hostpath.csi.k8s.io"}}]),
                "spec.template.spec.volumes[0].csi.driver: \"hostpath.csi.k8s.io\" is not allowed",
            ),
            (
                "volumes",
                json!([{"name": "x", "projected": {"sources": [{"serviceAccountToken": {"audience": "https://kubernetes.default.svc", "path": "t"}}]}}]),
                "spec.template.spec.volumes[0].projected.sources[0].serviceAccountToken.audience: a token for \"https://kubernetes.default.svc\" is not allowed",
            ),
        ];
        for (field, value, want) in cases {
            let mut spec = OK();
            spec[field] = value;
            let got = verdict(spec).unwrap_or_default();
            assert!(got.starts_with(want), "{field}: {got}");
        }
    }

    #[test]
    fn an_empty_list_allows_none_and_a_template_less_app_must_still_select_the_nodes() {
        let none = TenantPodPolicy::default();
        let spec = template(json!({"containers": [{"name": "app"}], "priorityClassName": "x"}));
        let v = check(&none, Some(&spec)).expect("refused");
        assert!(v.why.contains("none is allowed"), "{v}");
        let v = check(&policy(), None).expect("an App without a template selects no node");
        assert_eq!(v.field, "spec.template.spec.nodeSelector");
        assert_eq!(check(&TenantPodPolicy::default(), None), None);
    }

    #[test]
    fn empty_names_are_no_names_as_at_admission() {
        let mut spec = OK();
        spec["priorityClassName"] = json!("");
        spec["runtimeClassName"] = json!("");
        spec["nodeName"] = json!("");
        assert_eq!(verdict(spec), None);
    }
}
