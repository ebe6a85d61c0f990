//! Conversion between the served versions, lossless both ways.
//!
//! `v1beta1` can say three things `v1alpha1` cannot: a progress deadline in any unit (`10m`,
//! `1500ms`), `spec.rollout.historyLimit` and `spec.template`. When an object goes down to `v1alpha1`, those
//! are kept in the annotation [`ANNOTATION_V1BETA1_FIELDS`]; on the way back up they are
//! restored from it (the deadline only if the `v1alpha1` object still asks for the same number
//! of seconds) and the annotation is removed. The apiserver checks a `v1alpha1` write against
//! the `v1alpha1` schema only and stores what comes back at `v1beta1` unchecked, so what the
//! annotation holds is checked here as the `v1beta1` schema and its CEL rules would check it
//! (the template against the CRD's own schema, `template_check`), and anything they would
//! refuse, or any other key or type, fails the conversion with a message naming the field. So
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
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::time::Duration;

use super::{GROUP, v1beta1};

/// Annotation on a `v1alpha1` object holding, as JSON, the `v1beta1` fields it cannot hold.
pub const ANNOTATION_V1BETA1_FIELDS: &str = "flotilla.dev/v1beta1-fields";

/// Annotations of an object, as the conversion functions read and write them.
pub type Annotations = BTreeMap<String, String>;

/// `v1beta1` fields with no place in `v1alpha1`. Read strictly: a key it does not know, or a
/// value of another type, is refused (`KeptError`), never ignored.
#[derive(Serialize, Deserialize, Default, Debug)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct V1beta1Fields {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    progress_deadline: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    history_limit: Option<i64>,
    /// `spec.rollout: {}`, which `v1alpha1` has no place for.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    empty_rollout: bool,
    /// `spec.template`, as it was (`null` included), as its text: a template of many small
    /// parts would take many times its length as a tree of values.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    template: Option<Box<RawValue>>,
}

impl V1beta1Fields {
    fn is_empty(&self) -> bool {
        self.progress_deadline.is_none()
            && self.history_limit.is_none()
            && !self.empty_rollout
            && self.template.is_none()
    }
}

/// A field that is present, even as `null` (which `Option`'s own deserializer reads as absent).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Box<RawValue>>, D::Error> {
    Box::<RawValue>::deserialize(d).map(Some)
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
    Field { index: usize, name: String, kind: String, api_version: String, problem: SpecError },
    #[error("object {index} ({name}): spec.{key} cannot be read: {source}")]
    Spec {
        index: usize,
        name: String,
        key: String,
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

/// The `v1beta1` fields kept in the annotation hold what the `v1beta1` schema refuses. The
/// apiserver validates a `v1alpha1` write against the `v1alpha1` schema only and stores what the
/// conversion returns as it is, so a `v1beta1` body restored from them would be stored unchecked:
/// a template of the wrong shape makes the App unreadable to every typed reader.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeptError {
    #[error(
        "metadata.annotations[{ANNOTATION_V1BETA1_FIELDS}] must be a JSON object of the v1beta1 fields v1alpha1 has no place for (progressDeadline, historyLimit, emptyRollout, template): {0}"
    )]
    Unreadable(String),
    #[error(
        "spec.rollout.progressDeadline (kept in metadata.annotations[{ANNOTATION_V1BETA1_FIELDS}]): must be a duration from 10s to 1h, such as 90s or 10m, not {0:?}"
    )]
    Deadline(String),
    #[error(
        "spec.rollout.historyLimit (kept in metadata.annotations[{ANNOTATION_V1BETA1_FIELDS}]): must be from 1 to 50, not {0}"
    )]
    HistoryLimit(i64),
    #[error("{0} (kept in metadata.annotations[{ANNOTATION_V1BETA1_FIELDS}])")]
    Template(String),
}

/// Why an App's spec could not be converted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    #[error(transparent)]
    Field(#[from] FieldError),
    #[error(transparent)]
    Kept(#[from] KeptError),
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

/// A deadline `v1beta1` accepts (the CRD's rules: at most 32 characters spelled
/// `^([0-9]+(ms|s|m|h))+$`, a duration from 10s to 1h).
fn valid_deadline(text: &str) -> bool {
    text.len() <= 32
        && spelled_as_the_crd_asks(text)
        && humantime::parse_duration(text).is_ok_and(|d| DEADLINE_RANGE.contains(&d))
}

/// One or more groups of digits, each followed by `ms`, `s`, `m` or `h`.
fn spelled_as_the_crd_asks(text: &str) -> bool {
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let after = &rest[digits..];
        let unit = ["ms", "s", "m", "h"].into_iter().find(|u| after.starts_with(u));
        match unit {
            Some(unit) if digits > 0 => rest = &after[unit.len()..],
            _ => return false,
        }
    }
    !text.is_empty()
}

/// The `v1beta1` fields kept in `annotations` (removed from them), refused when they hold
/// what the `v1beta1` schema would refuse: see [`KeptError`].
fn take_kept(annotations: &mut Annotations) -> Result<V1beta1Fields, KeptError> {
    let Some(text) = annotations.remove(ANNOTATION_V1BETA1_FIELDS) else { return Ok(V1beta1Fields::default()) };
    // A struct reads from a JSON list too (its fields in order): only an object is one.
    if !text.trim_start().starts_with('{') {
        return Err(KeptError::Unreadable("it is not a JSON object".into()));
    }
    let kept: V1beta1Fields = serde_json::from_str(&text).map_err(|e| KeptError::Unreadable(e.to_string()))?;
    if let Some(deadline) = kept.progress_deadline.as_ref().filter(|d| !valid_deadline(d)) {
        return Err(KeptError::Deadline(deadline.clone()));
    }
    if let Some(limit) = kept.history_limit.filter(|n| !HISTORY_RANGE.contains(n)) {
        return Err(KeptError::HistoryLimit(limit));
    }
    if let Some(template) = &kept.template {
        super::template_check::check(template.get()).map_err(KeptError::Template)?;
    }
    Ok(kept)
}

fn object_of<'a>(value: &'a mut Value, field: &'static str) -> Result<Option<&'a mut Map<String, Value>>, FieldError> {
    match value {
        Value::Null => Ok(None),
        Value::Object(map) => Ok(Some(map)),
        _ => Err(wrong(field, "an object")),
    }
}

/// `v1alpha1` App spec to `v1beta1`, restoring fields kept in the annotation (which is removed).
/// `template` is the spec's `template`, held apart as text: the one kept is put there. Kept
/// fields the `v1beta1` schema would refuse fail the conversion (`KeptError`); a kept deadline
/// is used only while the `v1alpha1` object still asks for the same number of seconds.
pub fn app_spec_to_v1beta1(
    spec: &mut Map<String, Value>,
    template: &mut Option<Box<RawValue>>,
    annotations: &mut Annotations,
) -> Result<(), SpecError> {
    let kept = take_kept(annotations)?;
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
            let seconds =
                n.as_i64().ok_or_else(|| SpecError::from(wrong("spec.progressDeadlineSeconds", "an integer")))?;
            let text = kept
                .progress_deadline
                .filter(|text| i64::from(v1beta1::deadline_seconds(text)) == seconds)
                .unwrap_or_else(|| format!("{seconds}s"));
            rollout.insert("progressDeadline".into(), Value::String(text));
        }
        Some(_) => return Err(wrong("spec.progressDeadlineSeconds", "an integer").into()),
    }
    if let Some(limit) = kept.history_limit {
        rollout.insert("historyLimit".into(), Value::from(limit));
    }
    if !rollout.is_empty() || kept.empty_rollout {
        spec.insert("rollout".into(), Value::Object(rollout));
    }
    if let Some(kept) = kept.template {
        *template = Some(kept);
    }
    Ok(())
}

/// `v1beta1` App spec to `v1alpha1`, keeping what `v1alpha1` cannot say in the annotation.
/// `template` is the spec's `template`, held apart as text: it goes into the annotation.
pub fn app_spec_to_v1alpha1(
    spec: &mut Map<String, Value>,
    template: &mut Option<Box<RawValue>>,
    annotations: &mut Annotations,
) -> Result<(), FieldError> {
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
    kept.template = template.take();
    annotations.remove(ANNOTATION_V1BETA1_FIELDS);
    if !kept.is_empty()
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

/// An object as its fields' text (`convert_text` reads it so).
pub type RawObject = BTreeMap<String, Box<RawValue>>;

/// Converts one object to `desired_api_version` (as `convert_text`), given and returned as a
/// tree of values.
pub fn convert_object(index: usize, object: Value, desired_api_version: &str) -> Result<Value, ConversionError> {
    let text = object.to_string();
    let Ok(fields) = serde_json::from_str::<RawObject>(&text) else {
        return Err(ConversionError::Missing { index, field: "apiVersion" });
    };
    let converted = convert_text(index, fields, desired_api_version)?;
    // Text this function just wrote always parses.
    Ok(serde_json::from_str(converted.get()).unwrap_or(Value::Null))
}

/// The field `field` of `fields` as a string, if it is one.
fn string_of(fields: &RawObject, field: &str) -> Option<String> {
    fields.get(field).and_then(|raw| serde_json::from_str::<String>(raw.get()).ok())
}

/// `value` as JSON text (which values of these types always serialize to).
fn raw<T: Serialize + ?Sized>(value: &T) -> Box<RawValue> {
    serde_json::value::to_raw_value(value).unwrap_or_else(|_| RawValue::NULL.to_owned())
}

/// Converts one object, as the apiserver sends it (its top-level fields as text), to
/// `desired_api_version`. Only `apiVersion`, `spec` and `metadata.annotations` change;
/// everything else (status and the rest of the metadata included) is kept as sent, as text:
/// no part of the object is read into a tree of values but `spec`'s small fields (the
/// template stays text) and the annotations. An object of many small parts (an App's
/// environment entries, labels, managed fields) would take many times its length so.
pub fn convert_text(
    index: usize,
    mut object: RawObject,
    desired_api_version: &str,
) -> Result<Box<RawValue>, ConversionError> {
    let api_version =
        string_of(&object, "apiVersion").ok_or(ConversionError::Missing { index, field: "apiVersion" })?;
    let kind = string_of(&object, "kind").ok_or(ConversionError::Missing { index, field: "kind" })?;
    let mut metadata: Option<RawObject> =
        object.get("metadata").and_then(|raw| serde_json::from_str::<RawObject>(raw.get()).ok());
    let name = metadata
        .as_ref()
        .and_then(|m| m.get("name"))
        .and_then(|raw| serde_json::from_str::<Option<String>>(raw.get()).ok().flatten())
        .unwrap_or_default();
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
        return Ok(raw(&object));
    }
    object.insert("apiVersion".into(), raw(desired_api_version));
    let field_error = |problem: SpecError| ConversionError::Field {
        index,
        name: name.clone(),
        kind: kind.clone(),
        api_version: api_version.clone(),
        problem,
    };
    let spec_text = match object.get("spec") {
        // No spec (a partial object): nothing else to move.
        None => return Ok(raw(&object)),
        Some(spec) if spec.get() == "null" => return Ok(raw(&object)),
        Some(spec) => spec,
    };
    let Ok(mut spec_fields) = serde_json::from_str::<RawObject>(spec_text.get()) else {
        return Err(field_error(wrong("spec", "an object").into()));
    };
    let mut template = spec_fields.remove("template");
    // Every other field of the spec is small (bounded by the schema): read as values. One
    // that does not read (nested deeper than serde_json reads) fails the conversion.
    let unreadable =
        |key: &str, source| ConversionError::Spec { index, name: name.clone(), key: key.to_string(), source };
    let mut spec: Map<String, Value> = Map::new();
    for (key, value) in spec_fields {
        let value = serde_json::from_str(value.get()).map_err(|e| unreadable(&key, e))?;
        spec.insert(key, value);
    }
    let spec_back = |spec: Map<String, Value>, template: Option<Box<RawValue>>| {
        let mut fields: RawObject = spec.into_iter().map(|(k, v)| (k, raw(&v))).collect();
        if let Some(template) = template {
            fields.insert("template".into(), template);
        }
        raw(&fields)
    };
    match (kind.as_str(), desired) {
        ("Tenant", Version::V1beta1) | ("Tenant", Version::V1alpha1) => {
            if let Some(template) = template.take() {
                let value = serde_json::from_str(template.get()).map_err(|e| unreadable("template", e))?;
                spec.insert("template".into(), value);
            }
            match desired {
                Version::V1beta1 => tenant_spec_to_v1beta1(&mut spec),
                Version::V1alpha1 => tenant_spec_to_v1alpha1(&mut spec),
            }
            .map_err(|e| field_error(e.into()))?;
            object.insert("spec".into(), spec_back(spec, None));
            return Ok(raw(&object));
        }
        _ => {}
    }
    let mut annotations: Annotations = match metadata.as_ref().and_then(|m| m.get("annotations")) {
        None => Annotations::new(),
        Some(text) if text.get() == "null" => Annotations::new(),
        Some(text) => serde_json::from_str(text.get()).map_err(|source| ConversionError::Annotations {
            index,
            name: name.clone(),
            source,
        })?,
    };
    match desired {
        Version::V1beta1 => app_spec_to_v1beta1(&mut spec, &mut template, &mut annotations).map_err(field_error)?,
        Version::V1alpha1 => {
            app_spec_to_v1alpha1(&mut spec, &mut template, &mut annotations).map_err(|e| field_error(e.into()))?
        }
    }
    object.insert("spec".into(), spec_back(spec, template));
    if let Some(metadata) = metadata.as_mut() {
        if annotations.is_empty() {
            metadata.remove("annotations");
        } else {
            metadata.insert("annotations".into(), raw(&annotations));
        }
        object.insert("metadata".into(), raw(&*metadata));
    }
    Ok(raw(&object))
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
