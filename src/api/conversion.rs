//! Conversion between the served versions, lossless both ways.
//!
//! `v1beta1` can say two things `v1alpha1` cannot: a progress deadline in any unit (`10m`,
//! `1500ms`) and `spec.rollout.historyLimit`. When an object goes down to `v1alpha1`, those
//! are kept in the annotation [`ANNOTATION_V1BETA1_FIELDS`]; on the way back up they are
//! restored from it (the deadline only if the `v1alpha1` object still asks for the same number
//! of seconds) and the annotation is removed. So `v1alpha1 -> v1beta1 -> v1alpha1` and
//! `v1beta1 -> v1alpha1 -> v1beta1` give back the object they started from, as Kubernetes asks
//! of conversions. Status has the same shape in both versions and passes through untouched.

use kube::core::Status;
use kube::core::conversion::{ConversionRequest, ConversionResponse, ConversionReview};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

use super::{GROUP, v1alpha1, v1beta1};

/// Annotation on a `v1alpha1` object holding, as JSON, the `v1beta1` fields it cannot hold.
pub const ANNOTATION_V1BETA1_FIELDS: &str = "flotilla.dev/v1beta1-fields";

/// Annotations of an object, as the conversion functions read and write them.
pub type Annotations = BTreeMap<String, String>;

/// `v1beta1` fields with no place in `v1alpha1`.
#[derive(Serialize, Deserialize, Default, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
struct V1beta1Fields {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    progress_deadline: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    history_limit: Option<i32>,
}

/// Why an object could not be converted; the message goes back to the apiserver, which shows it
/// to the client whose request needed the conversion.
#[derive(Debug, thiserror::Error)]
pub enum ConversionError {
    #[error("object {index}: {field} is missing or not a string")]
    Missing { index: usize, field: &'static str },
    #[error("object {index} ({name}): {api_version} is not a version of {GROUP}/{kind} this operator converts")]
    UnknownVersion { index: usize, name: String, kind: String, api_version: String },
    #[error("desired API version {0:?} is not one this operator converts to")]
    UnknownDesiredVersion(String),
    #[error("object {index} ({name}): spec cannot be read as {api_version} {kind}: {source}")]
    Spec {
        index: usize,
        name: String,
        kind: String,
        api_version: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("object {index} ({name}): metadata.annotations must be a map of strings: {source}")]
    Annotations {
        index: usize,
        name: String,
        #[source]
        source: serde_json::Error,
    },
}

/// Seconds `v1alpha1` asks for, for a `v1beta1` deadline.
fn deadline_seconds(text: &str) -> i32 {
    v1beta1::RolloutSpec { progress_deadline: Some(text.to_string()), ..Default::default() }
        .progress_deadline_seconds()
        .unwrap_or(i32::MAX)
}

/// `v1alpha1` App spec to `v1beta1`, restoring fields kept in the annotation (which is removed).
pub fn app_spec_to_v1beta1(spec: v1alpha1::AppSpec, annotations: &mut Annotations) -> v1beta1::AppSpec {
    let kept: V1beta1Fields = annotations
        .remove(ANNOTATION_V1BETA1_FIELDS)
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or_default();
    let progress_deadline = spec.progress_deadline_seconds.map(|seconds| {
        match kept.progress_deadline.filter(|text| deadline_seconds(text) == seconds) {
            Some(text) => text,
            None => format!("{seconds}s"),
        }
    });
    v1beta1::AppSpec {
        image: spec.image,
        version: spec.version,
        replicas: spec.replicas,
        autoscaling: spec.autoscaling,
        port: spec.port,
        min_ready_seconds: spec.min_ready_seconds,
        pod_annotations: spec.pod_annotations,
        rollout: v1beta1::RolloutSpec {
            strategy: spec.strategy,
            analysis: spec.analysis,
            auto_rollback: spec.auto_rollback,
            progress_deadline,
            history_limit: kept.history_limit,
        },
    }
}

/// `v1beta1` App spec to `v1alpha1`, keeping what `v1alpha1` cannot say in the annotation.
pub fn app_spec_to_v1alpha1(spec: v1beta1::AppSpec, annotations: &mut Annotations) -> v1alpha1::AppSpec {
    let seconds = spec.rollout.progress_deadline_seconds();
    let rollout = spec.rollout;
    let kept = V1beta1Fields {
        progress_deadline: rollout
            .progress_deadline
            .filter(|text| seconds.map(|s| format!("{s}s")).as_ref() != Some(text)),
        history_limit: rollout.history_limit,
    };
    annotations.remove(ANNOTATION_V1BETA1_FIELDS);
    if kept != V1beta1Fields::default()
        && let Ok(text) = serde_json::to_string(&kept)
    {
        annotations.insert(ANNOTATION_V1BETA1_FIELDS.to_string(), text);
    }
    v1alpha1::AppSpec {
        image: spec.image,
        version: spec.version,
        replicas: spec.replicas,
        autoscaling: spec.autoscaling,
        port: spec.port,
        min_ready_seconds: spec.min_ready_seconds,
        pod_annotations: spec.pod_annotations,
        strategy: rollout.strategy,
        analysis: rollout.analysis,
        auto_rollback: rollout.auto_rollback,
        progress_deadline_seconds: seconds,
    }
}

/// `v1alpha1` Tenant spec to `v1beta1`.
pub fn tenant_spec_to_v1beta1(spec: v1alpha1::TenantSpec) -> v1beta1::TenantSpec {
    v1beta1::TenantSpec {
        namespaces: spec.namespaces,
        admins: spec.admins,
        quota: spec.quota,
        namespace_removal_policy: if spec.delete_namespaces_on_removal {
            v1beta1::NamespaceRemovalPolicy::Delete
        } else {
            v1beta1::NamespaceRemovalPolicy::Retain
        },
    }
}

/// `v1beta1` Tenant spec to `v1alpha1`.
pub fn tenant_spec_to_v1alpha1(spec: v1beta1::TenantSpec) -> v1alpha1::TenantSpec {
    v1alpha1::TenantSpec {
        namespaces: spec.namespaces,
        admins: spec.admins,
        quota: spec.quota,
        delete_namespaces_on_removal: spec.namespace_removal_policy == v1beta1::NamespaceRemovalPolicy::Delete,
    }
}

/// The two versions, by their `apiVersion`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Version {
    V1alpha1,
    V1beta1,
}

fn version_of(api_version: &str) -> Option<Version> {
    match api_version.strip_prefix(GROUP)?.strip_prefix('/')? {
        "v1alpha1" => Some(Version::V1alpha1),
        "v1beta1" => Some(Version::V1beta1),
        _ => None,
    }
}

/// Converts one object, as the apiserver sends it, to `desired_api_version`. Only `apiVersion`,
/// `spec` and `metadata.annotations` change; everything else (status included) is kept as sent.
pub fn convert_object(index: usize, mut object: Value, desired_api_version: &str) -> Result<Value, ConversionError> {
    let text = |object: &Value, field: &'static str| {
        object.get(field).and_then(Value::as_str).map(str::to_string).ok_or(ConversionError::Missing { index, field })
    };
    let api_version = text(&object, "apiVersion")?;
    let kind = text(&object, "kind")?;
    let name = object.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string();
    let desired = version_of(desired_api_version)
        .ok_or_else(|| ConversionError::UnknownDesiredVersion(desired_api_version.to_string()))?;
    let unknown = || ConversionError::UnknownVersion {
        index,
        name: name.clone(),
        kind: kind.clone(),
        api_version: api_version.clone(),
    };
    let from = version_of(&api_version).ok_or_else(unknown)?;
    if !matches!(kind.as_str(), "App" | "Tenant") {
        return Err(unknown());
    }
    if from == desired {
        return Ok(object);
    }
    let mut annotations: Annotations = match object.pointer("/metadata/annotations") {
        None | Some(Value::Null) => Annotations::new(),
        Some(value) => serde_json::from_value(value.clone()).map_err(|source| ConversionError::Annotations {
            index,
            name: name.clone(),
            source,
        })?,
    };
    let spec = object.get("spec").cloned().unwrap_or(Value::Null);
    let spec_error = |source| ConversionError::Spec {
        index,
        name: name.clone(),
        kind: kind.clone(),
        api_version: api_version.clone(),
        source,
    };
    let converted = match (kind.as_str(), desired) {
        ("App", Version::V1beta1) => serde_json::to_value(app_spec_to_v1beta1(
            serde_json::from_value(spec).map_err(spec_error)?,
            &mut annotations,
        )),
        ("App", Version::V1alpha1) => serde_json::to_value(app_spec_to_v1alpha1(
            serde_json::from_value(spec).map_err(spec_error)?,
            &mut annotations,
        )),
        (_, Version::V1beta1) => {
            serde_json::to_value(tenant_spec_to_v1beta1(serde_json::from_value(spec).map_err(spec_error)?))
        }
        (_, Version::V1alpha1) => {
            serde_json::to_value(tenant_spec_to_v1alpha1(serde_json::from_value(spec).map_err(spec_error)?))
        }
    }
    .map_err(spec_error)?;
    object["apiVersion"] = Value::String(desired_api_version.to_string());
    object["spec"] = converted;
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        if annotations.is_empty() {
            metadata.remove("annotations");
        } else {
            metadata.insert(
                "annotations".into(),
                Value::Object(annotations.into_iter().map(|(k, v)| (k, Value::String(v))).collect()),
            );
        }
    }
    Ok(object)
}

/// Answers one ConversionReview: every object converted, or a failure naming the first that
/// could not be (the apiserver then fails the request that needed it, with this message).
pub fn review(review: ConversionReview) -> ConversionReview {
    let request = match ConversionRequest::from_review(review) {
        Ok(request) => request,
        Err(e) => {
            return ConversionResponse::invalid(Status::failure(&e.to_string(), "BadRequest").with_code(400))
                .into_review();
        }
    };
    let desired = request.desired_api_version.clone();
    let objects = request.objects.clone();
    let response = ConversionResponse::for_request(request);
    let converted: Result<Vec<Value>, ConversionError> =
        objects.into_iter().enumerate().map(|(i, object)| convert_object(i, object, &desired)).collect();
    match converted {
        Ok(objects) => response.success(objects),
        Err(e) => response.failure(Status::failure(&e.to_string(), "ConversionFailed").with_code(422)),
    }
    .into_review()
}

#[cfg(test)]
#[path = "conversion_tests.rs"]
mod tests;
