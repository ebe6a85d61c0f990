//! What a check's query may cost the Prometheus it is sent to, judged before it is sent.
//! Pure: no I/O.
//!
//! A tenant writes its checks' PromQL, and the Prometheus they go to is often shared with
//! other tenants and with the platform's alerting rules (they share its query concurrency).
//! Three shapes cost Prometheus far more than any canary check needs, and are refused here
//! with a message naming the check, so the run is invalid (the rollout stops, it never
//! promotes) and nothing is sent:
//! - a query without any series selector (`count_over_time(vector(1)[1d:1ms])`): nothing
//!   narrows it to the tenant's series, and its cost is set by its ranges alone;
//! - a selector or subquery that looks further back than `max_lookback` (its range and its
//!   offset, summed down through nested subqueries), or that is pinned with `@`: on a shared
//!   Prometheus these also read the history of series that a namespace of the same name had
//!   before the tenant was given it;
//! - subqueries that evaluate more than `max_points` steps in all (nested ones multiply).

use std::time::Duration;

use promql_parser::parser::{self, AtModifier, Expr, Offset};

/// The bounds on one query.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueryBounds {
    /// How far back any selector may read: its range window, offset and the ranges of the
    /// subqueries around it, summed.
    pub max_lookback: Duration,
    /// How many steps the query's subqueries may evaluate, multiplied through nesting
    /// (Prometheus' own limit on a range query's points is 11,000).
    pub max_points: u64,
}

impl Default for QueryBounds {
    fn default() -> Self {
        Self { max_lookback: Duration::from_secs(3600), max_points: 11_000 }
    }
}

/// The step counted for a subquery that names none: Prometheus gives it its global
/// evaluation interval, which is not known here (1 m by default, often 15 s or less), so a
/// second, the most it could cost.
const DEFAULT_SUBQUERY_STEP: Duration = Duration::from_secs(1);

/// `query` parsed, or why not. promql-parser panics on some numbers a tenant may write (a
/// duration of `1e300` seconds overflows `Duration::from_secs_f64`): such a panic is a parse
/// error here, never a reconcile's end.
pub fn parse(query: &str) -> Result<Expr, String> {
    match std::panic::catch_unwind(|| parser::parse(query)) {
        Ok(parsed) => parsed,
        Err(_) => Err("a number in the query is out of range".into()),
    }
}

/// Why a query is not sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CostError {
    #[error("parse error: {0}")]
    Parse(String),
    #[error("the query selects no series (it has no metric name or label matcher): nothing bounds what it costs")]
    NoSelector,
    #[error("{what} reads {lookback:?} back, more than the {max:?} a check may look back")]
    LooksBack { what: String, lookback: Duration, max: Duration },
    #[error("{what} is pinned to a time with @: a check reads the present only")]
    Pinned { what: String },
    #[error("{what} evaluates {points} steps, more than the {max} a check may evaluate")]
    TooManyPoints { what: String, points: u64, max: u64 },
}

/// Whether `query` stays within `bounds`.
pub fn check(query: &str, bounds: &QueryBounds) -> Result<(), CostError> {
    let expr = parse(query).map_err(|e| CostError::Parse(short(&e)))?;
    if !selects(&expr) {
        return Err(CostError::NoSelector);
    }
    Walk { bounds, points: std::cell::Cell::new(0) }.expr(&expr, Duration::ZERO, 1)
}

/// Whether `expr` has a series selector anywhere.
fn selects(expr: &Expr) -> bool {
    match expr {
        Expr::Aggregate(a) => selects(&a.expr) || a.param.as_deref().is_some_and(selects),
        Expr::Unary(u) => selects(&u.expr),
        Expr::Binary(b) => selects(&b.lhs) || selects(&b.rhs),
        Expr::Paren(p) => selects(&p.expr),
        Expr::Call(c) => c.args.args.iter().any(|arg| selects(arg)),
        Expr::Subquery(s) => selects(&s.expr),
        Expr::VectorSelector(_) | Expr::MatrixSelector(_) => true,
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => false,
    }
}

struct Walk<'a> {
    bounds: &'a QueryBounds,
    /// The steps of every subquery of the query so far, nested ones multiplied: one budget
    /// for the whole query, so that many subqueries side by side count as they cost.
    points: std::cell::Cell<u64>,
}

impl Walk<'_> {
    /// `above`: the lookback of the subqueries around `expr`; `points`: their steps, multiplied.
    fn expr(&self, expr: &Expr, above: Duration, points: u64) -> Result<(), CostError> {
        match expr {
            Expr::Aggregate(a) => {
                self.expr(&a.expr, above, points)?;
                a.param.as_deref().map_or(Ok(()), |p| self.expr(p, above, points))
            }
            Expr::Unary(u) => self.expr(&u.expr, above, points),
            Expr::Binary(b) => {
                self.expr(&b.lhs, above, points)?;
                self.expr(&b.rhs, above, points)
            }
            Expr::Paren(p) => self.expr(&p.expr, above, points),
            Expr::Call(c) => c.args.args.iter().try_for_each(|arg| self.expr(arg, above, points)),
            Expr::VectorSelector(v) => {
                let what = format!("the selector {}", short(&v.to_string()));
                self.selector(&what, &v.offset, &v.at, Duration::ZERO, above).map(|_| ())
            }
            Expr::MatrixSelector(m) => {
                let what = format!("the range selector {}", short(&m.to_string()));
                self.selector(&what, &m.vs.offset, &m.vs.at, m.range, above).map(|_| ())
            }
            Expr::Subquery(s) => {
                let what = format!("the subquery {}", short(&s.to_string()));
                let lookback = self.selector(&what, &s.offset, &s.at, s.range, above)?;
                let step = s.step.filter(|d| !d.is_zero()).unwrap_or(DEFAULT_SUBQUERY_STEP);
                let steps = (s.range.as_millis() / step.as_millis().max(1)).max(1);
                let nested = u64::try_from(steps).unwrap_or(u64::MAX).saturating_mul(points);
                let total = self.points.get().saturating_add(nested);
                if total > self.bounds.max_points {
                    return Err(CostError::TooManyPoints { what, points: total, max: self.bounds.max_points });
                }
                self.points.set(total);
                self.expr(&s.expr, lookback, nested)
            }
            Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => Ok(()),
        }
    }

    /// The lookback of a selector or subquery (its range and offset on top of `above`), if
    /// it is within bounds and not pinned.
    fn selector(
        &self,
        what: &str,
        offset: &Option<Offset>,
        at: &Option<AtModifier>,
        range: Duration,
        above: Duration,
    ) -> Result<Duration, CostError> {
        if at.is_some() {
            return Err(CostError::Pinned { what: what.to_string() });
        }
        let back = match offset {
            Some(Offset::Pos(d)) => *d,
            // A negative offset reads the future of the evaluation time: nothing there.
            Some(Offset::Neg(_)) | None => Duration::ZERO,
        };
        let lookback = above.saturating_add(range).saturating_add(back);
        if lookback > self.bounds.max_lookback {
            return Err(CostError::LooksBack { what: what.to_string(), lookback, max: self.bounds.max_lookback });
        }
        Ok(lookback)
    }
}

/// At most 120 characters of a message or a query, so a huge one is not copied into status.
fn short(text: &str) -> String {
    match text.char_indices().nth(120) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(query: &str) -> Result<(), String> {
        check(query, &QueryBounds::default()).map_err(|e| e.to_string())
    }

    #[test]
    fn canary_checks_pass() {
        for query in [
            r#"sum(rate(http_requests_total{code=~"5.."}[5m])) / sum(rate(http_requests_total[5m]))"#,
            r#"histogram_quantile(0.99, sum by (le) (rate(latency_bucket{app="web"}[2m])))"#,
            "max_over_time(rate(requests_total[1m])[30m:30s])",
            "up",
            r#"{__name__="up"}"#,
            "requests_total offset 10m",
            "rate(requests_total[50m] offset 10m)",
            "sum(requests_total) or vector(0)",
        ] {
            assert_eq!(verdict(query), Ok(()), "{query}");
        }
    }

    #[test]
    fn a_query_without_a_selector_is_refused() {
        for query in ["count_over_time(vector(1)[1d:1ms])", "vector(1)", "1 + 1", "time()", "scalar(vector(2))"] {
            let e = verdict(query).expect_err(query);
            assert!(e.contains("selects no series"), "{query}: {e}");
        }
    }

    #[test]
    fn lookback_is_bounded_through_ranges_offsets_and_nesting() {
        let cases = [
            ("rate(x[2h])", "the range selector x[2h] reads 7200s back"),
            ("x offset 2h", "reads 7200s back"),
            ("rate(x[30m] offset 31m)", "reads 3660s back"),
            ("max_over_time(rate(x[31m])[30m:1m])", "reads 3660s back"),
            ("max_over_time(x[40m:1m] offset 30m)", "the subquery"),
        ];
        for (query, want) in cases {
            let e = verdict(query).expect_err(query);
            assert!(e.contains(want) && e.contains("more than the 3600s"), "{query}: {e}");
        }
        assert_eq!(verdict("x offset -1h"), Ok(()), "a negative offset reads nothing older");
    }

    #[test]
    fn pinned_selectors_are_refused() {
        for query in ["x @ 1609746000", "rate(x[5m] @ start())", "max_over_time(x[10m:1m] @ end())"] {
            let e = verdict(query).expect_err(query);
            assert!(e.contains("pinned to a time with @"), "{query}: {e}");
        }
    }

    #[test]
    fn subquery_steps_are_bounded_and_multiply_through_nesting() {
        let e = verdict("max_over_time(x[1h:100ms])").expect_err("36,000 steps");
        assert!(e.contains("evaluates 36000 steps, more than the 11000"), "{e}");
        assert_eq!(verdict("max_over_time(x[1h:1s])"), Ok(()), "3,600 steps");
        let e = verdict("max_over_time(max_over_time(x[10m:1s])[10m:1s])").expect_err("600 x 600");
        assert!(e.contains("360600 steps"), "600 outer steps and 600 x 600 inner: {e}");
        assert_eq!(verdict("max_over_time(x[10m])"), Ok(()), "no subquery, no steps");
        assert_eq!(verdict("max_over_time(x[30m:])"), Ok(()), "the default step counted as 1 s: 1,800 steps");
        let no_step = "max_over_time(x[59m:]) + max_over_time(y[59m:]) + max_over_time(z[59m:])";
        assert_eq!(verdict(no_step), Ok(()), "3 x 3,540 steps at the 1 s counted without a step");
        let e = verdict(&format!("{no_step} + max_over_time(w[59m:])")).expect_err("4 x 3,540");
        assert!(e.contains("14160 steps, more than the 11000"), "{e}");
        let side_by_side = ["max_over_time(rate(x[5m])[55m:1s])"; 4].join(" + ");
        let e = verdict(&side_by_side).expect_err("subqueries side by side share one budget");
        assert!(e.contains("13200 steps, more than the 11000"), "{e}");
    }

    #[test]
    fn numbers_the_parser_cannot_hold_are_a_parse_error_not_a_panic() {
        for query in ["rate(x[1e300])", "x offset 1e309", "max_over_time(x[1m:1e300])"] {
            let e = verdict(query).expect_err(query);
            assert!(e.starts_with("parse error"), "{query}: {e}");
        }
    }

    #[test]
    fn messages_stay_short_whatever_the_query() {
        let long = format!("x{{a=\"{}\"}} @ 1", "b".repeat(100_000));
        let e = verdict(&long).expect_err("pinned");
        assert!(e.len() < 300, "{}", e.len());
    }
}
