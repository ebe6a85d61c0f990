//! Conversion between the served versions, lossless both ways.
//!
//! `v1beta1` can say three things `v1alpha1` cannot: a progress deadline in any unit (`10m`,
//! `1500ms`), `spec.rollout.historyLimit` and `spec.template`. When an object goes down to `v1alpha1`, those
//! are kept in the annotation [`ANNOTATION_V1BETA1_FIELDS`]; on the way back up they are
//! restored from it (only values `v1beta1` accepts, and the deadline only if the `v1alpha1`
//! object still asks for the same number of seconds) and the annotation is removed. So
//! `v1alpha1 -> v1beta1 -> v1alpha1` and `v1beta1 -> v1alpha1 -> v1beta1` give back the object
//! they started from, as Kubernetes asks of conversions.
//!
//! The conversion moves and renames keys of the JSON object and leaves everything else as it
//! is: the apiserver also converts partial objects (the field sets of server-side apply, where
//! required fields may be missing), and status, which has the same shape in both versions,
//! passes through untouched.

use kube::core::Status;
use kube::core::conversion::{ConversionRequest, ConversionResponse, ConversionReview};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::time::Duration;

use super::{GROUP, v1beta1};

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
    history_limit: Option<i64>,
    /// `spec.rollout: {}`, which `v1alpha1` has no place for.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    empty_rollout: bool,
    /// `spec.template`, as it was (`null` included).
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    template: Option<Value>,
}

/// A field that is present, even as `null` (which `Option`'s own deserializer reads as absent).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
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
    #[error("object {index} ({name}) as {api_version} {kind}: {problem}")]
    Field { index: usize, name: String, kind: String, api_version: String, problem: FieldError },
    #[error("object {index} ({name}): metadata.annotations must be a map of strings: {source}")]
    Annotations {
        index: usize,
        name: String,
        #[source]
        source: serde_json::Error,
    },
}

/// A field of the wrong type, which the conversion cannot move.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{field} must be {expected}")]
pub struct FieldError {
    pub field: &'static str,
    pub expected: &'static str,
}

fn wrong(field: &'static str, expected: &'static str) -> FieldError {
    FieldError { field, expected }
}

/// Keys that move between `v1alpha1` `spec` and `v1beta1` `spec.rollout` unchanged.
const ROLLOUT_KEYS: [&str; 3] = ["strategy", "analysis", "autoRollback"];
const DEADLINE_RANGE: std::ops::RangeInclusive<Duration> = Duration::from_secs(10)..=Duration::from_secs(3600);
const HISTORY_RANGE: std::ops::RangeInclusive<i64> = 1..=50;

/// A deadline `v1beta1` accepts (the CRD's rule: a duration from 10s to 1h).
fn valid_deadline(text: &str) -> bool {
    text.len() <= 32
        && text.bytes().all(|b| b.is_ascii_alphanumeric())
        && humantime::parse_duration(text).is_ok_and(|d| DEADLINE_RANGE.contains(&d))
}

fn object_of<'a>(value: &'a mut Value, field: &'static str) -> Result<Option<&'a mut Map<String, Value>>, FieldError> {
    match value {
        Value::Null => Ok(None),
        Value::Object(map) => Ok(Some(map)),
        _ => Err(wrong(field, "an object")),
    }
}

/// `v1alpha1` App spec to `v1beta1`, restoring fields kept in the annotation (which is removed).
pub fn app_spec_to_v1beta1(spec: &mut Map<String, Value>, annotations: &mut Annotations) -> Result<(), FieldError> {
    let kept: V1beta1Fields = annotations
        .remove(ANNOTATION_V1BETA1_FIELDS)
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or_default();
    let mut rollout = match spec.remove("rollout") {
        Some(Value::Object(map)) => map,
        _ => Map::new(),
    };
    for key in ROLLOUT_KEYS {
        if let Some(value) = spec.remove(key) {
            rollout.insert(key.into(), value);
        }
    }
    match spec.remove("progressDeadlineSeconds") {
        None => {}
        Some(Value::Null) => {
            rollout.insert("progressDeadline".into(), Value::Null);
        }
        Some(Value::Number(n)) => {
            let seconds = n.as_i64().ok_or_else(|| wrong("spec.progressDeadlineSeconds", "an integer"))?;
            let text = kept
                .progress_deadline
                .filter(|text| valid_deadline(text) && i64::from(v1beta1::deadline_seconds(text)) == seconds)
                .unwrap_or_else(|| format!("{seconds}s"));
            rollout.insert("progressDeadline".into(), Value::String(text));
        }
        Some(_) => return Err(wrong("spec.progressDeadlineSeconds", "an integer")),
    }
    if let Some(limit) = kept.history_limit.filter(|n| HISTORY_RANGE.contains(n)) {
        rollout.insert("historyLimit".into(), Value::from(limit));
    }
    if !rollout.is_empty() || kept.empty_rollout {
        spec.insert("rollout".into(), Value::Object(rollout));
    }
    if let Some(template) = kept.template {
        spec.insert("template".into(), template);
    }
    Ok(())
}

/// `v1beta1` App spec to `v1alpha1`, keeping what `v1alpha1` cannot say in the annotation.
pub fn app_spec_to_v1alpha1(spec: &mut Map<String, Value>, annotations: &mut Annotations) -> Result<(), FieldError> {
    let mut kept = V1beta1Fields::default();
    let mut rollout = spec.remove("rollout").unwrap_or(Value::Null);
    if let Some(rollout) = object_of(&mut rollout, "spec.rollout")? {
        kept.empty_rollout = rollout.is_empty();
        for key in ROLLOUT_KEYS {
            if let Some(value) = rollout.remove(key) {
                spec.insert(key.into(), value);
            }
        }
        match rollout.remove("progressDeadline") {
            None => {}
            Some(Value::Null) => {
                spec.insert("progressDeadlineSeconds".into(), Value::Null);
            }
            Some(Value::String(text)) => {
                // The CRD refuses deadlines it cannot read; should one be stored, v1alpha1
                // shows the default.
                let seconds = i64::from(v1beta1::deadline_seconds(&text));
                if text != format!("{seconds}s") {
                    kept.progress_deadline = Some(text);
                }
                spec.insert("progressDeadlineSeconds".into(), Value::from(seconds));
            }
            Some(_) => return Err(wrong("spec.rollout.progressDeadline", "a duration string")),
        }
        match rollout.remove("historyLimit") {
            None | Some(Value::Null) => {}
            Some(Value::Number(n)) => {
                kept.history_limit = Some(n.as_i64().ok_or_else(|| wrong("spec.rollout.historyLimit", "an integer"))?);
            }
            Some(_) => return Err(wrong("spec.rollout.historyLimit", "an integer")),
        }
    }
    kept.template = spec.remove("template");
    annotations.remove(ANNOTATION_V1BETA1_FIELDS);
    if kept != V1beta1Fields::default()
        && let Ok(text) = serde_json::to_string(&kept)
    {
        annotations.insert(ANNOTATION_V1BETA1_FIELDS.to_string(), text);
    }
    Ok(())
}

/// `v1alpha1` Tenant spec to `v1beta1`: `deleteNamespacesOnRemoval` becomes `namespaceRemovalPolicy`.
pub fn tenant_spec_to_v1beta1(spec: &mut Map<String, Value>) -> Result<(), FieldError> {
    match spec.remove("deleteNamespacesOnRemoval") {
        None => {}
        Some(Value::Null) => {
            spec.insert("namespaceRemovalPolicy".into(), Value::Null);
        }
        Some(Value::Bool(delete)) => {
            spec.insert("namespaceRemovalPolicy".into(), Value::from(if delete { "Delete" } else { "Retain" }));
        }
        Some(_) => return Err(wrong("spec.deleteNamespacesOnRemoval", "true or false")),
    }
    Ok(())
}

/// `v1beta1` Tenant spec to `v1alpha1`.
pub fn tenant_spec_to_v1alpha1(spec: &mut Map<String, Value>) -> Result<(), FieldError> {
    match spec.remove("namespaceRemovalPolicy") {
        None => {}
        Some(Value::Null) => {
            spec.insert("deleteNamespacesOnRemoval".into(), Value::Null);
        }
        Some(Value::String(policy)) if policy == "Delete" || policy == "Retain" => {
            spec.insert("deleteNamespacesOnRemoval".into(), Value::Bool(policy == "Delete"));
        }
        Some(_) => return Err(wrong("spec.namespaceRemovalPolicy", "Retain or Delete")),
    }
    Ok(())
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
    object["apiVersion"] = Value::String(desired_api_version.to_string());
    let field_error = |problem| ConversionError::Field {
        index,
        name: name.clone(),
        kind: kind.clone(),
        api_version: api_version.clone(),
        problem,
    };
    let Some(spec) =
        object.get_mut("spec").map(|spec| object_of(spec, "spec")).transpose().map_err(field_error)?.flatten()
    else {
        // No spec (a partial object): nothing else to move.
        return Ok(object);
    };
    match (kind.as_str(), desired) {
        ("Tenant", Version::V1beta1) => return tenant_spec_to_v1beta1(spec).map(|()| object).map_err(field_error),
        ("Tenant", Version::V1alpha1) => return tenant_spec_to_v1alpha1(spec).map(|()| object).map_err(field_error),
        _ => {}
    }
    let mut annotations: Annotations = match object.pointer("/metadata/annotations") {
        None | Some(Value::Null) => Annotations::new(),
        Some(value) => serde_json::from_value(value.clone()).map_err(|source| ConversionError::Annotations {
            index,
            name: name.clone(),
            source,
        })?,
    };
    let spec = object.get_mut("spec").and_then(Value::as_object_mut);
    match (spec, desired) {
        (Some(spec), Version::V1beta1) => app_spec_to_v1beta1(spec, &mut annotations).map_err(field_error)?,
        (Some(spec), Version::V1alpha1) => app_spec_to_v1alpha1(spec, &mut annotations).map_err(field_error)?,
        (None, _) => {}
    }
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
