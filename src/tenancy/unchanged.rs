//! Whether an object already says everything a desired object says, so that a periodic
//! re-apply can be a read instead of a write.

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
        (Value::String(c), Value::String(d)) if quantities && c != d => {
            matches!((quantity(c), quantity(d)), (Some(a), Some(b)) if (a - b).abs() <= 1e-9 * a.abs().max(b.abs()))
        }
        (c, d) => c == d,
    }
}

/// The value of a Kubernetes quantity (`500m`, `1.5Gi`, `2e3`), or `None`.
fn quantity(text: &str) -> Option<f64> {
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-')).unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let scale = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        exp if exp.starts_with(['e', 'E']) => 10f64.powi(exp[1..].parse().ok()?),
        _ => return None,
    };
    Some(number * scale)
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
        assert_eq!(quantity("1.5Gi"), Some(1.5 * 1024f64.powi(3)));
        assert_eq!(quantity("2e3"), Some(2000.0));
        assert_eq!(quantity("12x"), None);
    }
}
