//! Keeps the CRDs' `spec.conversion` pointing at this webhook with the shared certificate as
//! `caBundle`: at start, and again whenever an install, a person or a new certificate changed it. Every replica
//! does this with the same values, so they never disagree; nothing is written while the CRDs
//! are already right.

use k8s_openapi::ByteString;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, ServiceReference, WebhookClientConfig,
};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tracing::{info, warn};

use crate::api::crds::{WEBHOOK_PATH, WEBHOOK_SERVICE, conversion};

/// The CRDs whose conversion this webhook serves.
pub const CRD_NAMES: [&str; 2] = ["apps.flotilla.dev", "tenants.flotilla.dev"];

/// Where the apiserver should send conversions, and the CA it should trust.
#[derive(Clone, Debug)]
pub struct Target {
    pub ca_pem: String,
    pub url: Option<String>,
    pub namespace: String,
}

/// The client configuration the CRDs should have.
pub fn client_config(target: &Target) -> WebhookClientConfig {
    WebhookClientConfig {
        ca_bundle: Some(ByteString(target.ca_pem.clone().into_bytes())),
        url: target.url.clone(),
        service: match target.url {
            Some(_) => None,
            None => Some(ServiceReference {
                namespace: target.namespace.clone(),
                name: WEBHOOK_SERVICE.into(),
                path: Some(WEBHOOK_PATH.into()),
                port: Some(443),
            }),
        },
    }
}

/// Whether `crd` must be patched to reach `target`.
pub fn needs_patch(crd: &CustomResourceDefinition, target: &Target) -> bool {
    crd.spec.conversion.as_ref() != Some(&conversion(client_config(target)))
}

/// The merge patch that sets the conversion of a CRD to `target` (and clears the other of
/// `url` and `service`).
pub fn patch(target: &Target) -> serde_json::Value {
    let mut config = serde_json::to_value(client_config(target)).unwrap_or_else(|_| json!({}));
    if let Some(map) = config.as_object_mut() {
        map.entry("url").or_insert(serde_json::Value::Null);
        map.entry("service").or_insert(serde_json::Value::Null);
    }
    json!({"spec": {"conversion": {"strategy": "Webhook", "webhook": {"conversionReviewVersions": ["v1"], "clientConfig": config}}}})
}

/// Patches those of the CRDs that do not point at `target`; logs what it cannot do (the next
/// check tries again).
pub async fn point(crds: &Api<CustomResourceDefinition>, target: &Target) {
    for name in CRD_NAMES {
        match crds.get_opt(name).await {
            Ok(Some(crd)) if needs_patch(&crd, target) => {
                match crds.patch(name, &PatchParams::default(), &Patch::Merge(patch(target))).await {
                    Ok(_) => info!(
                        crd = name,
                        url = target.url.as_deref().unwrap_or("(Service)"),
                        "pointed the CRD's conversion at this webhook"
                    ),
                    Err(e) => warn!(crd = name, error = %e, "could not set the CRD's conversion webhook; retrying"),
                }
            }
            Ok(Some(_)) => {}
            Ok(None) => warn!(crd = name, "CRD not installed: install crds/flotilla.dev.yaml"),
            Err(e) => warn!(crd = name, error = %e, "could not read the CRD to check its conversion webhook"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(url: Option<&str>) -> Target {
        Target { ca_pem: "PEM".into(), url: url.map(str::to_string), namespace: "ops".into() }
    }

    #[test]
    fn a_local_target_sets_the_url_and_clears_the_service() {
        let p = patch(&target(Some("https://127.0.0.1:9443/convert")));
        let config = &p["spec"]["conversion"]["webhook"]["clientConfig"];
        assert_eq!(config["url"], "https://127.0.0.1:9443/convert");
        assert!(config["service"].is_null());
        assert_eq!(config["caBundle"], "UEVN", "base64 of the PEM");
    }

    #[test]
    fn an_in_cluster_target_names_the_service_in_the_operator_namespace() {
        let p = patch(&target(None));
        let config = &p["spec"]["conversion"]["webhook"]["clientConfig"];
        assert!(config["url"].is_null());
        assert_eq!(
            config["service"],
            json!({"namespace": "ops", "name": "flotilla-webhook", "path": "/convert", "port": 443})
        );
    }

    #[test]
    fn the_generated_crds_need_their_ca_bundle() {
        for crd in crate::api::crds().expect("crds") {
            assert!(needs_patch(&crd, &target(None)), "no caBundle yet");
            let mut patched = crd.clone();
            patched.spec.conversion = Some(conversion(client_config(&target(None))));
            assert!(!needs_patch(&patched, &target(None)));
            assert!(needs_patch(&patched, &target(Some("https://127.0.0.1:9443/convert"))));
        }
    }
}
