//! Judging measurements: queries are rendered from their templates, each value is compared
//! with its bounds, and anything that is not a clean single finite value is inconclusive.
//! Pure: no I/O.

use crate::api::{Measurement, MeasurementResult, MetricCheck};

/// What Prometheus answered to one query.
#[derive(Clone, Debug, PartialEq)]
pub enum QueryOutcome {
    /// Exactly one sample.
    Value(f64),
    /// No usable answer (unreachable, timeout, no series, several series, server error):
    /// the reason, with Prometheus' own message when it gave one.
    Inconclusive(String),
    /// Prometheus rejected the query itself (for example a PromQL syntax error).
    Invalid(String),
}

/// The names a query may use, replaced before it runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TemplateValues<'a> {
    pub app: &'a str,
    pub namespace: &'a str,
    pub version: &'a str,
    pub stable_version: &'a str,
}

/// Replaces `{{app}}`, `{{namespace}}`, `{{version}}` and `{{stable_version}}` (spaces inside
/// the braces allowed).
pub fn render(query: &str, values: &TemplateValues) -> String {
    let mut out = query.to_string();
    for (name, value) in [
        ("app", values.app),
        ("namespace", values.namespace),
        ("version", values.version),
        ("stable_version", values.stable_version),
    ] {
        for pattern in [format!("{{{{{name}}}}}"), format!("{{{{ {name} }}}}")] {
            out = out.replace(&pattern, value);
        }
    }
    out
}

fn show(v: f64) -> String {
    let s = format!("{v:.6}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s.is_empty() || s == "-" { "0".into() } else { s.to_string() }
}

/// The bounds of a check, for messages: `max 0.05`, `min 10`, `min 1, max 5`.
pub fn bounds(check: &MetricCheck) -> String {
    match (check.min, check.max) {
        (Some(min), Some(max)) => format!("min {}, max {}", show(min), show(max)),
        (Some(min), None) => format!("min {}", show(min)),
        (None, Some(max)) => format!("max {}", show(max)),
        (None, None) => "no bounds".into(),
    }
}

/// One check's result from Prometheus' answer.
pub fn judge(check: &MetricCheck, outcome: &QueryOutcome) -> Measurement {
    let base = Measurement {
        name: check.name.clone(),
        result: MeasurementResult::Inconclusive,
        value: None,
        min: check.min,
        max: check.max,
        message: None,
    };
    match outcome {
        QueryOutcome::Value(v) if !v.is_finite() => {
            Measurement { message: Some(format!("the query returned {v}, not a finite number")), ..base }
        }
        QueryOutcome::Value(v) => {
            let above = check.max.is_some_and(|max| *v > max);
            let below = check.min.is_some_and(|min| *v < min);
            let (result, message) = if above || below {
                (MeasurementResult::Fail, Some(format!("{} = {} is outside {}", check.name, show(*v), bounds(check))))
            } else {
                (MeasurementResult::Pass, None)
            };
            Measurement { result, value: Some(*v), message, ..base }
        }
        QueryOutcome::Inconclusive(reason) => Measurement { message: Some(reason.clone()), ..base },
        QueryOutcome::Invalid(reason) => {
            Measurement { result: MeasurementResult::Invalid, message: Some(reason.clone()), ..base }
        }
    }
}

/// The result of a run as a whole: any failure fails it; otherwise any invalid query makes
/// it invalid, any missing value inconclusive; only all passes pass. An empty run is
/// inconclusive, never a pass.
pub fn summarise(measurements: &[Measurement]) -> MeasurementResult {
    let has = |r| measurements.iter().any(|m| m.result == r);
    if has(MeasurementResult::Fail) {
        MeasurementResult::Fail
    } else if has(MeasurementResult::Invalid) {
        MeasurementResult::Invalid
    } else if has(MeasurementResult::Inconclusive) || measurements.is_empty() {
        MeasurementResult::Inconclusive
    } else {
        MeasurementResult::Pass
    }
}

/// One line per check that did not pass, for conditions and Events.
pub fn explain(measurements: &[Measurement]) -> String {
    measurements
        .iter()
        .filter(|m| m.result != MeasurementResult::Pass)
        .map(|m| format!("{}: {}", m.name, m.message.clone().unwrap_or_else(|| format!("{:?}", m.result))))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn check(min: Option<f64>, max: Option<f64>) -> MetricCheck {
        MetricCheck { name: "error-rate".into(), query: "q".into(), min, max }
    }

    #[test]
    fn renders_every_name() {
        let v = TemplateValues { app: "web", namespace: "shop", version: "2", stable_version: "1" };
        assert_eq!(
            render(r#"x{app="{{app}}",ns="{{ namespace }}",v="{{version}}",s="{{stable_version}}"}"#, &v),
            r#"x{app="web",ns="shop",v="2",s="1"}"#
        );
    }

    #[test]
    fn table_of_judgements() {
        use MeasurementResult::*;
        let cases = [
            ("under max", check(None, Some(0.05)), QueryOutcome::Value(0.01), Pass),
            ("at max", check(None, Some(0.05)), QueryOutcome::Value(0.05), Pass),
            ("over max", check(None, Some(0.05)), QueryOutcome::Value(0.2), Fail),
            ("under min", check(Some(10.0), None), QueryOutcome::Value(3.0), Fail),
            ("between", check(Some(1.0), Some(5.0)), QueryOutcome::Value(3.0), Pass),
            ("NaN", check(None, Some(1.0)), QueryOutcome::Value(f64::NAN), Inconclusive),
            ("infinity", check(None, Some(1.0)), QueryOutcome::Value(f64::INFINITY), Inconclusive),
            ("no data", check(None, Some(1.0)), QueryOutcome::Inconclusive("no data".into()), Inconclusive),
            ("bad query", check(None, Some(1.0)), QueryOutcome::Invalid("parse error".into()), Invalid),
        ];
        for (name, c, outcome, want) in cases {
            assert_eq!(judge(&c, &outcome).result, want, "{name}");
        }
        let failed = judge(&check(None, Some(0.05)), &QueryOutcome::Value(0.2));
        assert_eq!(failed.message.as_deref(), Some("error-rate = 0.2 is outside max 0.05"));
    }

    #[test]
    fn a_run_passes_only_when_every_check_passes() {
        use MeasurementResult::*;
        let m = |r| Measurement { name: "m".into(), result: r, value: None, min: None, max: None, message: None };
        assert_eq!(summarise(&[m(Pass), m(Pass)]), Pass);
        assert_eq!(summarise(&[m(Pass), m(Inconclusive)]), Inconclusive);
        assert_eq!(summarise(&[m(Inconclusive), m(Fail)]), Fail);
        assert_eq!(summarise(&[m(Invalid), m(Inconclusive)]), Invalid);
        assert_eq!(summarise(&[]), Inconclusive);
    }

    proptest! {
        #[test]
        fn a_pass_is_always_a_finite_value_within_bounds(v in proptest::num::f64::ANY, min in proptest::option::of(-1e6f64..1e6), max in proptest::option::of(-1e6f64..1e6)) {
            let m = judge(&check(min, max), &QueryOutcome::Value(v));
            if m.result == MeasurementResult::Pass {
                prop_assert!(v.is_finite());
                prop_assert!(min.is_none_or(|min| v >= min));
                prop_assert!(max.is_none_or(|max| v <= max));
            }
        }
    }
}
