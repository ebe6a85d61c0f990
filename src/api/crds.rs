//! The CRD documents: both served versions of each kind, `v1beta1` stored, converted by the
//! operator's webhook.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceConversion, CustomResourceDefinition, ServiceReference, WebhookClientConfig, WebhookConversion,
};
use kube::CustomResourceExt;
use kube::core::crd::{MergeError, merge_crds};

use super::{STORAGE_VERSION, v1alpha1, v1beta1};

/// Path of the conversion webhook on the operator's webhook server.
pub const WEBHOOK_PATH: &str = "/convert";
/// Service in front of the operator's webhook port, in the operator's namespace.
pub const WEBHOOK_SERVICE: &str = "flotilla-webhook";
/// Namespace the install manifests put the operator in (the operator corrects it at start
/// when it runs elsewhere).
pub const DEFAULT_NAMESPACE: &str = "flotilla-system";

/// Every CRD Flotilla serves, as installed: both versions, `v1beta1` stored, conversion by the
/// webhook behind the `flotilla-webhook` Service. The operator fills in the CA bundle at start.
pub fn crds() -> Result<Vec<CustomResourceDefinition>, MergeError> {
    let app = merge_crds(vec![v1alpha1::App::crd(), v1beta1::App::crd()], STORAGE_VERSION)?;
    let tenant = merge_crds(vec![v1alpha1::Tenant::crd(), v1beta1::Tenant::crd()], STORAGE_VERSION)?;
    Ok(vec![with_conversion(app), with_conversion(tenant)])
}

fn with_conversion(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    crd.spec.conversion = Some(conversion(WebhookClientConfig {
        service: Some(ServiceReference {
            namespace: DEFAULT_NAMESPACE.into(),
            name: WEBHOOK_SERVICE.into(),
            path: Some(WEBHOOK_PATH.into()),
            port: Some(443),
        }),
        ..Default::default()
    }));
    crd
}

/// The `spec.conversion` of a Flotilla CRD that calls the webhook at `client_config`.
pub fn conversion(client_config: WebhookClientConfig) -> CustomResourceConversion {
    CustomResourceConversion {
        strategy: "Webhook".into(),
        webhook: Some(WebhookConversion {
            client_config: Some(client_config),
            conversion_review_versions: vec!["v1".into()],
        }),
    }
}

/// The CRDs as one multi-document YAML stream, exactly as checked in under `crds/`.
pub fn crds_yaml() -> Result<String, CrdsError> {
    let mut out = String::new();
    for crd in crds()? {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&crd)?);
    }
    Ok(out)
}

#[derive(Debug, thiserror::Error)]
pub enum CrdsError {
    #[error("merging the versions of a CRD: {0}")]
    Merge(#[from] MergeError),
    #[error("rendering YAML: {0}")]
    Yaml(#[from] serde_yaml::Error),
}
