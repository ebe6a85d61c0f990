//! Whether an object already says everything a desired object says, so that a periodic
//! re-apply can be a read instead of a write.

use kube_quantity::ParsedQuantity;
use serde_json::Value;

/// `current` covers `desired` when every key `desired` sets is in `current` with a covering
/// value; arrays must match element by element (a RoleBinding's subjects are a whole).
/// Fields only `current` has (server defaults, other managers' fields) do not matter. Pure.
/// Under the keys of a ResourceQuota's or a LimitRange's resource maps, values are
/// quantities, compared by value: the apiserver stores `0.5` as `500m` and `1024Mi` as `1Gi`.
pub fn covers(current: &Value, desired: &Value) -> bool {
    covers_in(current, desired, false)
}

/// Keys whose values map resource names to quantities.
const QUANTITY_MAPS: &[&str] = &["hard", "default", "defaultRequest", "max", "min", "maxLimitRequestRatio"];

fn covers_in(current: &Value, desired: &Value, quantities: bool) -> bool {
    match (current, desired) {
        (Value::Object(c), Value::Object(d)) => d.iter().all(|(k, dv)| {
            let q = quantities || QUANTITY_MAPS.contains(&k.as_str());
            c.get(k).is_some_and(|cv| covers_in(cv, dv, q))
        }),
        (Value::Array(c), Value::Array(d)) => {
            c.len() == d.len() && c.iter().zip(d).all(|(cv, dv)| covers_in(cv, dv, false))
        }
        (Value::String(c), Value::String(d)) if quantities && c != d => same_quantity(c, d),
        (c, d) => c == d,
    }
}

/// Whether two texts are the same Kubernetes quantity (`500m` and `0.5`, `1Gi` and
/// `1024Mi`), compared in decimal by kube_quantity; false when either is not one it reads
/// (it does not read the `E` and `Ei` suffixes: such a quantity costs a write per resync).
fn same_quantity(a: &str, b: &str) -> bool {
    match (ParsedQuantity::try_from(a), ParsedQuantity::try_from(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
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

    #[test]
    fn quantities_are_compared_by_value_where_they_are_quantities() {
        let current = json!({
            "metadata": {"labels": {"v": "500m"}},
            "spec": {"hard": {"cpu": "500m", "memory": "1Gi"}, "limits": [{"defaultRequest": {"cpu": "2"}}]}
        });
        let cases = [
            (
                json!({"spec": {"hard": {"cpu": "0.5", "memory": "1024Mi"}}}),
                true,
                "the same quantities, written otherwise",
            ),
            (json!({"spec": {"hard": {"cpu": "0.6"}}}), false, "another quantity"),
            (json!({"spec": {"limits": [{"defaultRequest": {"cpu": "2000m"}}]}}), true, "in a LimitRange item"),
            (json!({"spec": {"limits": [{"defaultRequest": {"cpu": "3"}}]}}), false, "another request"),
            (json!({"spec": {"hard": {"cpu": "lots"}}}), false, "not a quantity"),
            (json!({"metadata": {"labels": {"v": "0.5"}}}), false, "a label is text, not a quantity"),
        ];
        for (desired, want, what) in cases {
            assert_eq!(covers(&current, &desired), want, "{what}");
        }
        assert!(same_quantity("1.5Gi", "1536Mi"));
        assert!(same_quantity("2e3", "2k"));
        assert!(same_quantity("1Gi", "1073741824"));
        assert!(!same_quantity("1G", "1Gi"));
        assert!(!same_quantity("12x", "12x"), "not a quantity");
    }
}
