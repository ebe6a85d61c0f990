//! Answers one ConversionReview body within known memory: the objects stay as the bytes they
//! were sent as (borrowed slices of the body, never copied) until each in turn is read as its
//! fields' text (`conversion::convert_text`: only the spec's small fields and the annotations
//! become values), converted, written to the answer and dropped. So a review costs its body,
//! its answer and about one object's length, whatever the number of objects or their shape;
//! before that, a review of 64 MiB of tiny values was parsed into one tree (about 2 GiB) and
//! cloned, and later each object into a tree of its own (58 times its length for an App of
//! small environment entries).
//!
//! Nesting: scanning an object's bytes (serde_json's `RawValue`) is iterative, and reading a
//! spec field as a value stops at serde_json's recursion limit of 128 levels (an App nests
//! about 10), so deep nesting cannot exhaust a stack.

use kube::core::conversion::{ConversionResponse, ConversionReview};
use kube::core::{Status, TypeMeta};
use serde::de::{Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::fmt;

use super::limits::{MAX_OBJECTS, OBJECT_LIMIT};
use crate::api::conversion::{ConversionError, RawObject, convert_text};

const REVIEW_V1: &str = "apiextensions.k8s.io/v1";
const REVIEW_V1BETA1: &str = "apiextensions.k8s.io/v1beta1";

/// A body refused before any object is converted; the HTTP status says why.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("the body is not a JSON ConversionReview: {0}")]
    Malformed(#[source] serde_json::Error),
    #[error("object {index} of the review is not a JSON object: {source}")]
    MalformedObject {
        index: usize,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "more than {MAX_OBJECTS} objects in one review: at most {MAX_OBJECTS} are converted at once (list in pages, e.g. kubectl --chunk-size=500)"
    )]
    TooManyObjects,
    #[error("object {index} of the review is {size} bytes: at most {OBJECT_LIMIT}, more than etcd stores")]
    ObjectTooLarge { index: usize, size: usize },
}

impl Refused {
    pub fn status(&self) -> http::StatusCode {
        match self {
            Refused::Malformed(_) | Refused::MalformedObject { .. } => http::StatusCode::BAD_REQUEST,
            Refused::TooManyObjects | Refused::ObjectTooLarge { .. } => http::StatusCode::PAYLOAD_TOO_LARGE,
        }
    }
}

/// A ConversionReview to send back (HTTP 200), with what the metrics and the log need.
#[derive(Debug)]
pub struct Answer {
    /// The JSON of the answering ConversionReview.
    pub body: Vec<u8>,
    /// Objects the review asked to convert.
    pub objects: usize,
    /// `None` when every object was converted; otherwise the message sent back.
    pub failure: Option<String>,
}

/// The parts of a review the webhook reads; everything else is skipped without being kept.
#[derive(Deserialize)]
struct Review<'a> {
    #[serde(rename = "apiVersion", default)]
    api_version: Option<String>,
    #[serde(default, borrow)]
    request: Option<Request<'a>>,
}

#[derive(Deserialize)]
struct Request<'a> {
    uid: String,
    #[serde(rename = "desiredAPIVersion")]
    desired_api_version: String,
    #[serde(borrow)]
    objects: Objects<'a>,
}

/// The objects as slices of the body, at most [`MAX_OBJECTS`].
struct Objects<'a> {
    items: Vec<&'a RawValue>,
}

/// The message of the parse error that stops a review at the object past the cap.
const TOO_MANY: &str = "too many objects in one review";

impl<'de: 'a, 'a> Deserialize<'de> for Objects<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Bounded;
        impl<'de> Visitor<'de> for Bounded {
            type Value = Objects<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of objects")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut items = Vec::new();
                while let Some(raw) = seq.next_element::<&'de RawValue>()? {
                    // Stops at the first object past the cap: the rest is not even scanned.
                    if items.len() == MAX_OBJECTS {
                        return Err(serde::de::Error::custom(TOO_MANY));
                    }
                    items.push(raw);
                }
                Ok(Objects { items })
            }
        }
        deserializer.deserialize_seq(Bounded)
    }
}

/// The ConversionReview answering `body`, or why it is refused.
pub fn answer(body: &[u8]) -> Result<Answer, Refused> {
    let review: Review = serde_json::from_slice(body).map_err(|e| {
        if e.is_data() && e.to_string().starts_with(TOO_MANY) { Refused::TooManyObjects } else { Refused::Malformed(e) }
    })?;
    let api_version = match review.api_version.as_deref() {
        Some(REVIEW_V1BETA1) => REVIEW_V1BETA1,
        _ => REVIEW_V1,
    };
    let Some(request) = review.request else {
        let status = Status::failure("request missing in ConversionReview", "BadRequest").with_code(400);
        return Ok(failure(api_version, String::new(), status, 0));
    };
    let objects = request.objects;
    if let Some((index, raw)) = objects.items.iter().enumerate().find(|(_, raw)| raw.get().len() > OBJECT_LIMIT) {
        return Err(Refused::ObjectTooLarge { index, size: raw.get().len() });
    }
    let desired = request.desired_api_version;
    // The answer is about as large as the objects; reserved once so that it does not double.
    let mut out = Vec::with_capacity(body.len().saturating_add(512));
    out.extend_from_slice(br#"{"apiVersion":"#);
    json_write(&mut out, api_version);
    out.extend_from_slice(br#","kind":"ConversionReview","response":{"uid":"#);
    json_write(&mut out, &request.uid);
    out.extend_from_slice(br#","result":{"status":"Success"},"convertedObjects":["#);
    for (index, raw) in objects.items.iter().enumerate() {
        // Read as its fields' text, never as a tree of values (`convert_text`). Valid JSON that
        // is not an object is a conversion failure (no apiVersion), as it was.
        let converted = match serde_json::from_str::<RawObject>(raw.get()) {
            Ok(object) => convert_text(index, object, &desired),
            Err(source) => match serde_json::from_str::<serde::de::IgnoredAny>(raw.get()) {
                Ok(_) => Err(ConversionError::Missing { index, field: "apiVersion" }),
                Err(_) => return Err(Refused::MalformedObject { index, source }),
            },
        };
        match converted {
            // A field the conversion reads that does not read as JSON (nested deeper than
            // serde_json reads): the object is malformed, as when it was read whole.
            Err(ConversionError::Spec { source, .. }) => return Err(Refused::MalformedObject { index, source }),
            Ok(converted) => {
                if index > 0 {
                    out.push(b',');
                }
                json_write(&mut out, &converted);
            }
            Err(e) => {
                let status = Status::failure(&e.to_string(), "ConversionFailed").with_code(422);
                return Ok(failure(api_version, request.uid, status, objects.items.len()));
            }
        }
    }
    out.extend_from_slice(b"]}}");
    Ok(Answer { body: out, objects: objects.items.len(), failure: None })
}

/// Appends the JSON of `value` (which serializes without error: strings, trees, plain structs).
fn json_write<T: Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    if let Err(e) = serde_json::to_writer(&mut *out, value) {
        tracing::error!(error = %e, "could not write JSON of the conversion answer");
    }
}

fn failure(api_version: &str, uid: String, result: Status, objects: usize) -> Answer {
    let message = result.message.clone();
    let review: ConversionReview = ConversionResponse {
        types: Some(TypeMeta { api_version: api_version.to_string(), kind: "ConversionReview".to_string() }),
        uid,
        result,
        converted_objects: Vec::new(),
    }
    .into_review();
    let body = serde_json::to_vec(&review).unwrap_or_default();
    Answer { body, objects, failure: Some(message) }
}

#[cfg(test)]
#[path = "review_tests.rs"]
mod tests;
