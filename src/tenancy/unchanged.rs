//! Whether an object already says everything a desired object says, so that a periodic
//! re-apply can be a read instead of a write.

use serde_json::Value;

/// `current` covers `desired` when every key `desired` sets is in `current` with a covering
/// value; arrays must match element by element (a RoleBinding's subjects are a whole).
/// Fields only `current` has (server defaults, other managers' fields) do not matter. Pure.
pub fn covers(current: &Value, desired: &Value) -> bool {
    match (current, desired) {
        (Value::Object(c), Value::Object(d)) => d.iter().all(|(k, dv)| c.get(k).is_some_and(|cv| covers(cv, dv))),
        (Value::Array(c), Value::Array(d)) => c.len() == d.len() && c.iter().zip(d).all(|(cv, dv)| covers(cv, dv)),
        (c, d) => c == d,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn table() {
        let current = json!({
            "metadata": {"name": "b", "labels": {"a": "1", "other": "x"}, "resourceVersion": "7"},
            "roleRef": {"kind": "ClusterRole", "name": "r"},
            "subjects": [{"kind": "ServiceAccount", "name": "s", "namespace": "n"}]
        });
        let cases = [
            (json!({"metadata": {"name": "b", "labels": {"a": "1"}}}), true, "a subset of labels"),
            (json!({"metadata": {"labels": {"a": "2"}}}), false, "a changed label"),
            (json!({"metadata": {"labels": {"b": "1"}}}), false, "a missing label"),
            (json!({"subjects": [{"kind": "ServiceAccount", "name": "s"}]}), true, "subject fields are a subset"),
            (json!({"subjects": []}), false, "arrays are compared whole"),
            (json!({"subjects": [{"name": "s"}, {"name": "t"}]}), false, "an extra subject"),
            (json!({"roleRef": {"name": "q"}}), false, "another role"),
            (json!({}), true, "nothing desired"),
            (json!(null), false, "null is not an object"),
        ];
        for (desired, want, what) in cases {
            assert_eq!(covers(&current, &desired), want, "{what}");
        }
    }
}
