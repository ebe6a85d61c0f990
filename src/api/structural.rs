//! Checks JSON text against a CRD's structural schema the way kube-apiserver checks a request
//! body, for text the apiserver stores without checking it: what a conversion returns. (A
//! `v1alpha1` App carries its `v1beta1` template in an annotation, and the apiserver
//! validates the version it was sent, not the one the webhook turns it into.)
//!
//! The text is read once, as it streams (serde's `DeserializeSeed`), never as a tree of values:
//! a template of many small parts costs about its deepest path, not many times its length (the
//! conversion webhook's bounds, docs/security.md). Nesting is bounded by serde_json's limit.
//!
//! Checked ([`KEYWORDS`]): `type` and `x-kubernetes-int-or-string`, `format` (`int32`, `int64`,
//! `date-time`), `properties`, `additionalProperties`, `items`, `required`, `nullable`,
//! `maxItems`, `maxLength`, `maxProperties`, `x-kubernetes-preserve-unknown-fields`. A key the
//! schema does not know is refused, where the apiserver would drop it from a request: what a
//! conversion returns is stored as it is. A field's `null` is what the apiserver makes of it
//! (kept where `nullable`, else dropped, so it does not count as present); elsewhere (a list's
//! item, a map's value) it must be `nullable`. CEL rules (`x-kubernetes-validations`) are left
//! to the caller.

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use std::fmt;

/// The schema keywords `check` applies; `description` and the CEL rules are read by no check.
pub const KEYWORDS: [&str; 14] = [
    "type",
    "x-kubernetes-int-or-string",
    "format",
    "properties",
    "additionalProperties",
    "items",
    "required",
    "nullable",
    "maxItems",
    "maxLength",
    "maxProperties",
    "x-kubernetes-preserve-unknown-fields",
    "description",
    "x-kubernetes-validations",
];

/// Checks `text` (JSON) against `schema`; the error names the first field found wrong, under
/// `path` (the name of the value checked, such as `spec.template`).
pub fn check(text: &str, schema: &Value, path: &str) -> Result<(), String> {
    let mut at = path.to_string();
    let mut reader = serde_json::Deserializer::from_str(text);
    let node = Node { schema, path: &mut at, in_object: false };
    node.deserialize(&mut reader).and_then(|_| reader.end()).map_err(|e| {
        // The position is of this text, which is not what its writer sent as a whole.
        let message = e.to_string();
        message.rfind(" at line ").map_or(message.clone(), |at| message[..at].to_string())
    })
}

/// What a value turned out to be.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Seen {
    Null,
    Value,
}

/// A value to check against `schema`, found at `path`; `in_object`: a field of an object,
/// where the apiserver drops a `null` the schema does not allow (a map's values, which the
/// types read as values, must not be null unless `nullable`).
struct Node<'s, 'p> {
    schema: &'s Value,
    path: &'p mut String,
    in_object: bool,
}

impl<'s> Node<'s, '_> {
    fn flag(&self, key: &str) -> bool {
        self.schema.get(key).and_then(Value::as_bool).unwrap_or(false)
    }

    fn type_(&self) -> Option<&str> {
        self.schema.get("type").and_then(Value::as_str)
    }

    fn max(&self, key: &str) -> Option<u64> {
        self.schema.get(key).and_then(Value::as_u64)
    }

    /// Whether a value of JSON type `found` is allowed.
    fn allows(&self, found: &str) -> bool {
        let int_or_string = self.flag("x-kubernetes-int-or-string") && matches!(found, "integer" | "string");
        match self.type_() {
            None => int_or_string || self.flag("x-kubernetes-preserve-unknown-fields"),
            Some("number") => found == "number" || found == "integer",
            Some(t) => t == found || int_or_string,
        }
    }

    fn refuse<E: de::Error>(&self, problem: impl fmt::Display) -> E {
        E::custom(format!("{}: {problem}", self.path))
    }

    fn want<E: de::Error>(&self, found: &str) -> Result<Seen, E> {
        if self.allows(found) {
            return Ok(Seen::Value);
        }
        let wanted = match (self.type_(), self.flag("x-kubernetes-int-or-string")) {
            (_, true) => "an integer or a string",
            (Some("object"), _) => "an object",
            (Some("array"), _) => "a list",
            (Some("string"), _) => "a string",
            (Some("integer"), _) => "an integer",
            (Some("number"), _) => "a number",
            (Some("boolean"), _) => "true or false",
            _ => "of the schema's type",
        };
        Err(self.refuse(format!("must be {wanted}, not {}", article(found))))
    }

    fn integer<E: de::Error>(&self, value: i128) -> Result<Seen, E> {
        self.want("integer")?;
        let (low, high) = match self.schema.get("format").and_then(Value::as_str) {
            Some("int32") => (i128::from(i32::MIN), i128::from(i32::MAX)),
            _ if self.type_() == Some("number") => return Ok(Seen::Value),
            _ => (i128::from(i64::MIN), i128::from(i64::MAX)),
        };
        if !(low..=high).contains(&value) {
            return Err(self.refuse(format!("{value} is out of range ({low} to {high})")));
        }
        Ok(Seen::Value)
    }

    /// The schema of `key` in an object of this schema, as the path's next part; `None`: a
    /// key the schema does not know.
    fn field(&self, key: &str) -> Option<(&'s Value, String)> {
        if let Some(schema) = self.schema.get("properties").and_then(|p| p.get(key)) {
            return Some((schema, format!(".{key}")));
        }
        match self.schema.get("additionalProperties") {
            Some(Value::Bool(true)) => Some((&ANY, format!("[{key}]"))),
            Some(schema @ Value::Object(_)) => Some((schema, format!("[{key}]"))),
            _ if self.flag("x-kubernetes-preserve-unknown-fields") => Some((&ANY, format!(".{key}"))),
            _ => None,
        }
    }

    fn required(&self) -> Vec<&str> {
        self.schema.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect()
    }
}

/// The schema of any value (an unknown field's, where the schema preserves them).
static ANY: Value = Value::Null;

fn article(json_type: &str) -> &'static str {
    match json_type {
        "object" => "an object",
        "array" => "a list",
        "string" => "a string",
        "integer" => "an integer",
        "number" => "a number",
        "boolean" => "true or false",
        _ => "null",
    }
}

impl<'de> DeserializeSeed<'de> for Node<'_, '_> {
    type Value = Seen;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Seen, D::Error> {
        if self.schema.is_null() {
            // Any value: skipped without being read into anything.
            return IgnoredAny::deserialize(deserializer).map(|_| Seen::Value);
        }
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Node<'_, '_> {
    type Value = Seen;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a value for {}", self.path)
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Seen, E> {
        self.want("boolean")
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Seen, E> {
        self.integer(i128::from(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Seen, E> {
        self.integer(i128::from(v))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Seen, E> {
        self.want("number")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Seen, E> {
        self.want("string")?;
        if let Some(max) = self.max("maxLength")
            && v.chars().count() as u64 > max
        {
            return Err(self.refuse(format!("must be at most {max} characters")));
        }
        let is_time = self.schema.get("format").and_then(Value::as_str) == Some("date-time");
        if is_time && self.type_() == Some("string") && v.parse::<k8s_openapi::jiff::Timestamp>().is_err() {
            return Err(self.refuse(format!("{v:?} is not an RFC 3339 date-time")));
        }
        Ok(Seen::Value)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Seen, E> {
        if self.in_object || self.flag("nullable") { Ok(Seen::Null) } else { Err(self.refuse("must not be null")) }
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Seen, A::Error> {
        self.want::<A::Error>("array")?;
        let items = self.schema.get("items").unwrap_or(&ANY);
        let mut count: u64 = 0;
        loop {
            let len = self.path.len();
            self.path.push_str(&format!("[{count}]"));
            let next = seq.next_element_seed(Node { schema: items, path: &mut *self.path, in_object: false })?;
            self.path.truncate(len);
            if next.is_none() {
                break;
            }
            count += 1;
            if self.max("maxItems").is_some_and(|max| count > max) {
                return Err(self.refuse(format!("must have at most {} items", self.max("maxItems").unwrap_or(0))));
            }
        }
        Ok(Seen::Value)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Seen, A::Error> {
        self.want::<A::Error>("object")?;
        let mut present: Vec<String> = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            let Some((schema, part)) = self.field(&key) else {
                let _: IgnoredAny = map.next_value()?;
                return Err(self.refuse(format!("{key:?} is not a field of the v1beta1 schema")));
            };
            let len = self.path.len();
            self.path.push_str(&part);
            // A map's null value is not dropped like a field's: the types refuse it.
            let in_object = part.starts_with('.');
            let seen = map.next_value_seed(Node { schema, path: &mut *self.path, in_object })?;
            self.path.truncate(len);
            if seen == Seen::Value || schema.get("nullable").and_then(Value::as_bool).unwrap_or(false) {
                present.push(key);
            }
            if let Some(max) = self.max("maxProperties")
                && present.len() as u64 > max
            {
                return Err(self.refuse(format!("must have at most {max} entries")));
            }
        }
        if let Some(missing) = self.required().into_iter().find(|r| !present.iter().any(|p| p == r)) {
            return Err(de::Error::custom(format!("{}.{missing}: is required", self.path)));
        }
        Ok(Seen::Value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({"type": "object", "required": ["containers"], "properties": {
            "containers": {"type": "array", "maxItems": 2, "items": {"type": "object", "required": ["name"],
                "properties": {"name": {"type": "string", "maxLength": 5}, "port": {"type": "integer", "format": "int32"},
                    "cpu": {"x-kubernetes-int-or-string": true, "nullable": true}, "at": {"type": "string", "format": "date-time"}}}},
            "labels": {"type": "object", "nullable": true, "maxProperties": 2, "additionalProperties": {"type": "string"}},
            "ratio": {"type": "number"},
            "on": {"type": "boolean"},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
        }})
    }

    #[test]
    fn what_the_schema_accepts_passes() {
        for text in [
            r#"{"containers": []}"#,
            r#"{"containers": [{"name": "app", "port": 8080, "cpu": "100m", "at": "2026-12-01T10:00:00Z"}, {"name": "b", "cpu": 2}]}"#,
            r#"{"containers": [{"name": "app", "port": null}], "labels": {"a": "b"}, "ratio": 1, "on": false}"#,
            r#"{"containers": [], "labels": null, "ratio": 0.5, "free": {"anything": [1, {"x": null}]}}"#,
        ] {
            assert_eq!(check(text, &schema(), "spec.template"), Ok(()), "{text}");
        }
        assert_eq!(check("null", &json!({"type": "object", "nullable": true}), "t"), Ok(()), "a nullable value");
    }

    #[test]
    fn what_the_schema_refuses_is_named() {
        let cases = [
            (r#""x""#, "spec.template: must be an object, not a string"),
            ("7", "spec.template: must be an object, not an integer"),
            ("null", "spec.template: must not be null"),
            ("{}", "spec.template.containers: is required"),
            (r#"{"containers": null}"#, "spec.template.containers: is required"),
            (r#"{"containers": "app"}"#, "spec.template.containers: must be a list, not a string"),
            (r#"{"containers": [{}]}"#, "spec.template.containers[0].name: is required"),
            (r#"{"containers": [null]}"#, "spec.template.containers[0]: must not be null"),
            (r#"{"containers": [{"name": 5}]}"#, "spec.template.containers[0].name: must be a string, not an integer"),
            (
                r#"{"containers": [{"name": "toolong"}]}"#,
                "spec.template.containers[0].name: must be at most 5 characters",
            ),
            (
                r#"{"containers": [{"name": "a", "port": 4294967296}]}"#,
                "spec.template.containers[0].port: 4294967296 is out of range",
            ),
            (
                r#"{"containers": [{"name": "a", "port": 1.5}]}"#,
                "spec.template.containers[0].port: must be an integer, not a number",
            ),
            (
                r#"{"containers": [{"name": "a", "cpu": true}]}"#,
                "spec.template.containers[0].cpu: must be an integer or a string",
            ),
            (
                r#"{"containers": [{"name": "a", "at": "monday"}]}"#,
                "spec.template.containers[0].at: \"monday\" is not an RFC 3339",
            ),
            (
                r#"{"containers": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}"#,
                "spec.template.containers: must have at most 2 items",
            ),
            (
                r#"{"containers": [{"name": "a", "image": "x"}]}"#,
                "spec.template.containers[0]: \"image\" is not a field",
            ),
            (r#"{"containers": [], "labels": {"a": 1}}"#, "spec.template.labels[a]: must be a string"),
            (r#"{"containers": [], "labels": {"a": null}}"#, "spec.template.labels[a]: must not be null"),
            (
                r#"{"containers": [], "labels": {"a": "1", "b": "2", "c": "3"}}"#,
                "spec.template.labels: must have at most 2 entries",
            ),
            (r#"{"containers": [], "on": "yes"}"#, "spec.template.on: must be true or false, not a string"),
        ];
        for (text, want) in cases {
            let got = check(text, &schema(), "spec.template").expect_err(text);
            assert!(got.starts_with(want), "{text}: want {want:?}, got {got:?}");
            assert!(!got.contains(" at line "), "no position in {got:?}");
        }
    }

    #[test]
    fn deep_nesting_costs_no_stack() {
        // The schema is a finite tree: below its leaves, text is scanned (iteratively), not visited.
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let free = json!({"type": "object", "properties": {"a": {"type": "array"}}});
        assert_eq!(check(&format!(r#"{{"a": {deep}}}"#), &free, "t"), Ok(()), "the schema says nothing of the items");
        let typed = json!({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "string"}}}});
        let refused = check(&format!(r#"{{"a": {deep}}}"#), &typed, "t");
        assert_eq!(refused, Err("t.a[0]: must be a string, not a list".to_string()));
    }
}
