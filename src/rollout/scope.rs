//! Limiting a tenant's PromQL to its own series on a shared Prometheus, the way
//! prom-label-proxy does for Grafana: every vector selector of the query (instant, range,
//! inside subqueries, functions, aggregations and both sides of binary operators, and every
//! `or` group of a selector) gets the matcher `namespace="<the App's namespace>"`, added to
//! the matchers it has (never replacing one). A selector that already names another namespace
//! could only come back empty: it is refused here, with a message saying why, and nothing is
//! sent. Pure: no I/O.
//!
//! The query is parsed with `promql-parser` (the PromQL grammar, as an AST) and the rewritten
//! AST is printed back; what is sent to Prometheus is that printed text, never the tenant's
//! text, and it is parsed once more and checked to carry the matcher on every selector, so
//! that a printing mistake cannot send an unscoped query.

use promql_parser::label::{MatchOp, Matcher, Matchers};
use promql_parser::parser::{Expr, VectorSelector};

/// The label that names a series' namespace: set by Prometheus' Kubernetes service
/// discovery (relabelled from the target's namespace), so a tenant cannot choose it.
pub const NAMESPACE_LABEL: &str = "namespace";

/// Why a query cannot be sent, limited to a namespace.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScopeError {
    /// The query is not PromQL this parser reads.
    #[error("parse error: {message} (a query must parse to be limited to namespace {namespace})")]
    Parse { namespace: String, message: String },
    /// A selector names a namespace other than the App's: it would read nothing.
    #[error(
        "the selector {selector} has the matcher {matcher}; on this Prometheus an App's checks read only its own namespace ({namespace}), so it would read nothing"
    )]
    ForeignNamespace { selector: String, matcher: String, namespace: String },
    /// The rewritten query did not come back with the matcher on every selector.
    #[error("the query could not be limited to namespace {namespace}; it was not sent")]
    Unscoped { namespace: String },
}

/// `query` with every vector selector limited to `namespace`, as the text to send.
pub fn scope_to_namespace(query: &str, namespace: &str) -> Result<String, ScopeError> {
    let parse_error =
        |message: String| ScopeError::Parse { namespace: namespace.to_string(), message: short(&message) };
    let mut expr = super::query_cost::parse(query).map_err(parse_error)?;
    let mut refusal = None;
    visit_selectors(&mut expr, &mut |selector: &mut VectorSelector| {
        if refusal.is_none() {
            refusal = foreign(selector, namespace);
        }
        add_namespace(selector, namespace);
    });
    if let Some(refusal) = refusal {
        return Err(refusal);
    }
    let scoped = expr.to_string();
    // The printed text is what Prometheus will run: read it back and check every selector.
    let mut again =
        super::query_cost::parse(&scoped).map_err(|_| ScopeError::Unscoped { namespace: namespace.to_string() })?;
    let mut every = true;
    visit_selectors(&mut again, &mut |selector: &mut VectorSelector| every &= carries(selector, namespace));
    if every { Ok(scoped) } else { Err(ScopeError::Unscoped { namespace: namespace.to_string() }) }
}

/// Calls `f` on every vector selector of `expr`, those of range selectors included.
fn visit_selectors(expr: &mut Expr, f: &mut dyn FnMut(&mut VectorSelector)) {
    match expr {
        Expr::Aggregate(a) => {
            visit_selectors(&mut a.expr, f);
            if let Some(param) = a.param.as_mut() {
                visit_selectors(param, f);
            }
        }
        Expr::Unary(u) => visit_selectors(&mut u.expr, f),
        Expr::Binary(b) => {
            visit_selectors(&mut b.lhs, f);
            visit_selectors(&mut b.rhs, f);
        }
        Expr::Paren(p) => visit_selectors(&mut p.expr, f),
        Expr::Subquery(s) => visit_selectors(&mut s.expr, f),
        Expr::Call(c) => {
            for arg in c.args.args.iter_mut() {
                visit_selectors(arg, f);
            }
        }
        Expr::VectorSelector(v) => f(v),
        Expr::MatrixSelector(m) => f(&mut m.vs),
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) => {}
        // Never produced by the parser; printed as it is, it would not be checked: the check
        // after printing refuses the query.
        Expr::Extension(_) => {}
    }
}

/// The groups of matchers of a selector: one, or one per `or` alternative.
fn groups(matchers: &Matchers) -> impl Iterator<Item = &Matcher> {
    matchers.matchers.iter().chain(matchers.or_matchers.iter().flatten())
}

/// A refusal when a matcher of the selector on `namespace` does not match the App's namespace.
fn foreign(selector: &VectorSelector, namespace: &str) -> Option<ScopeError> {
    groups(&selector.matchers).find(|m| m.name == NAMESPACE_LABEL && !m.is_match(namespace)).map(|m| {
        ScopeError::ForeignNamespace {
            selector: short(&selector.to_string()),
            matcher: short(&m.to_string()),
            namespace: namespace.to_string(),
        }
    })
}

fn namespace_matcher(namespace: &str) -> Matcher {
    Matcher::new(MatchOp::Equal, NAMESPACE_LABEL, namespace)
}

/// Adds `namespace="<namespace>"` to the selector (to every `or` group when it has them).
fn add_namespace(selector: &mut VectorSelector, namespace: &str) {
    let m = &mut selector.matchers;
    if m.or_matchers.is_empty() {
        m.matchers.push(namespace_matcher(namespace));
    } else {
        // The parser moves plain matchers into the first group once an `or` is seen; any left
        // would not be printed, so they join every group (what they mean: and-ed with each).
        let plain = std::mem::take(&mut m.matchers);
        for group in &mut m.or_matchers {
            group.extend(plain.iter().cloned());
            group.push(namespace_matcher(namespace));
        }
    }
}

/// Whether every alternative of the selector requires `namespace="<namespace>"`.
fn carries(selector: &VectorSelector, namespace: &str) -> bool {
    let m = &selector.matchers;
    let wanted = namespace_matcher(namespace);
    if m.or_matchers.is_empty() {
        m.matchers.contains(&wanted)
    } else {
        m.matchers.is_empty() && m.or_matchers.iter().all(|g| g.contains(&wanted))
    }
}

fn short(text: &str) -> String {
    const MAX: usize = 200;
    let mut out: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).take(MAX).collect();
    if text.chars().count() > MAX {
        out.push_str("...");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use promql_parser::parser;
    use proptest::prelude::*;

    /// Every query of the samples, the docs and the tests, as rendered for an App.
    const QUERIES: &[&str] = &[
        r#"(sum(rate(http_requests_total{namespace="shop",app="checkout",version="1.4.2",code=~"5.."}[30s])) or vector(0)) / sum(rate(http_requests_total{namespace="shop",app="checkout",version="1.4.2"}[30s]))"#,
        r#"histogram_quantile(0.99, sum by (le) (rate(http_request_duration_seconds_bucket{namespace="shop",app="checkout",version="1.4.2"}[30s]))) * 1000"#,
        r#"histogram_quantile(0.99, sum by (le) (rate(http_request_duration_seconds_bucket{app="checkout",version="1.4.2"}[2m]))) * 1000"#,
        r#"sum(rate(http_requests_total{namespace="shop",app="web",version="2",code="500"}[10s])) / sum(rate(http_requests_total{namespace="shop",app="web",version="2"}[10s]))"#,
        "up",
        "vector(1)",
        "scalar(up{job=\"x\"})",
        r#"sum without (instance) (rate(x_total[5m] offset 1m))"#,
        r#"max_over_time(rate(x_total{a="b"}[1m])[10m:30s])"#,
        r#"x{a="1"} * on (pod) group_left (version) y"#,
        r#"topk(3, sum by (pod) (x))"#,
        r#"count_values("v", build_info)"#,
        r#"label_replace(up, "dst", "$1", "src", "(.*)")"#,
        r#"-x > bool 0.5"#,
        r#"{__name__=~"http_.+", app="web"}"#,
        r#"{"http_requests_total", app="web"}"#,
        r#"x @ 1700000000"#,
        r#"absent(x{app="web"})"#,
        r#"x{app="a" or app="b"}"#,
        r#"rate(x[1m:]) * on () group_left y"#,
        r#"quantile_over_time(0.5, x[5m])"#,
    ];

    /// The selectors of a scoped query, each with its matchers printed.
    fn selectors(query: &str) -> Vec<String> {
        let mut expr = parser::parse(query).expect("scoped query parses");
        let mut out = Vec::new();
        visit_selectors(&mut expr, &mut |s: &mut VectorSelector| out.push(s.to_string()));
        out
    }

    #[test]
    fn every_selector_gets_the_namespace() {
        for q in QUERIES {
            let scoped = scope_to_namespace(q, "shop").unwrap_or_else(|e| panic!("{q}: {e}"));
            let all = selectors(&scoped);
            let expected = match *q {
                "vector(1)" => 0,
                _ => 1,
            };
            assert!(all.len() >= expected, "{q} -> {scoped}");
            for s in all {
                assert!(s.contains(r#"namespace="shop""#), "{q} -> {scoped}: {s}");
            }
        }
    }

    /// Printing and parsing again gives the same tree: what is sent means what was checked.
    #[test]
    fn scoped_queries_round_trip() {
        for q in QUERIES {
            let scoped = scope_to_namespace(q, "shop").expect("scoped");
            let tree = parser::parse(&scoped).expect("parses");
            assert_eq!(tree.to_string(), scoped, "{q}");
            assert_eq!(parser::parse(&tree.to_string()).expect("parses"), tree, "{q}");
            // Scoping twice changes nothing more than once.
            assert_eq!(selectors(&scope_to_namespace(&scoped, "shop").expect("again")).len(), selectors(&scoped).len());
        }
    }

    #[test]
    fn table_of_rewrites() {
        let cases = [
            ("up", r#"up{namespace="shop"}"#),
            (r#"rate(x{a="b"}[1m])"#, r#"rate(x{a="b",namespace="shop"}[1m])"#),
            (r#"x{namespace="shop"}"#, r#"x{namespace="shop",namespace="shop"}"#),
            (r#"x{namespace=~"sh.*"}"#, r#"x{namespace="shop",namespace=~"sh.*"}"#),
            (r#"x{a="1" or b="2"}"#, r#"x{a="1", namespace="shop" or b="2", namespace="shop"}"#),
        ];
        for (q, want) in cases {
            assert_eq!(scope_to_namespace(q, "shop").as_deref(), Ok(want), "{q}");
        }
    }

    #[test]
    fn another_namespace_is_refused_with_the_reason() {
        for q in [
            r#"sum(rate(http_requests_total{namespace="bank",app="ledger"}[1m]))"#,
            r#"x{namespace!="shop"}"#,
            r#"x{namespace=~"bank|vault"}"#,
            r#"x{namespace!~"sh.*"}"#,
            r#"up or x{app="a" or namespace="bank"}"#,
            r#"sum(rate(x[1m])) / sum(rate(y{namespace=""}[1m]))"#,
        ] {
            match scope_to_namespace(q, "shop") {
                Err(e @ ScopeError::ForeignNamespace { .. }) => {
                    let m = e.to_string();
                    assert!(m.contains("its own namespace (shop)"), "{m}");
                }
                other => panic!("{q}: {other:?}"),
            }
        }
    }

    #[test]
    fn what_the_parser_cannot_read_is_not_sent() {
        assert!(matches!(scope_to_namespace("sum(", "shop"), Err(ScopeError::Parse { .. })));
        assert!(matches!(scope_to_namespace("", "shop"), Err(ScopeError::Parse { .. })));
    }

    fn label() -> impl Strategy<Value = String> {
        "[a-z][a-z_]{0,6}".prop_filter("not the namespace label", |l| l != NAMESPACE_LABEL)
    }

    /// Random queries made of selectors, functions, aggregations and binary operators.
    fn query() -> impl Strategy<Value = String> {
        let selector = (label(), proptest::collection::vec((label(), "[a-z0-9]{0,5}", 0..4usize), 0..3))
            .prop_map(|(name, matchers)| {
                let ops = ["=", "!=", "=~", "!~"];
                let m: Vec<String> = matchers.iter().map(|(l, v, op)| format!("{l}{}\"{v}\"", ops[*op])).collect();
                if m.is_empty() { name } else { format!("{name}{{{}}}", m.join(",")) }
            })
            .boxed();
        let leaf = prop_oneof![
            selector.clone(),
            selector.clone().prop_map(|s| format!("rate({s}[5m])")),
            "[0-9]{1,3}".prop_map(|n| n.to_string()),
        ];
        leaf.prop_recursive(4, 16, 2, |inner| {
            prop_oneof![
                (inner.clone(), inner.clone(), 0..5usize)
                    .prop_map(|(a, b, op)| format!("({a}) {} ({b})", ["+", "/", "or", "and", "unless"][op])),
                inner.clone().prop_map(|a| format!("sum by (pod) ({a})")),
                inner.clone().prop_map(|a| format!("abs({a})")),
            ]
        })
    }

    proptest! {
        /// Whatever the query, every selector of what is sent requires the App's namespace,
        /// and what is sent parses to the tree that was checked.
        #[test]
        fn what_is_sent_is_always_scoped(q in query()) {
            let Ok(tree) = parser::parse(&q) else { return Ok(()) };
            let scoped = scope_to_namespace(&q, "shop");
            let Ok(scoped) = scoped else {
                prop_assert!(false, "{q} parses but was refused: {scoped:?}");
                return Ok(());
            };
            let mut sent = parser::parse(&scoped).expect("parses");
            let mut every = true;
            visit_selectors(&mut sent, &mut |s: &mut VectorSelector| every &= carries(s, "shop"));
            prop_assert!(every, "{q} -> {scoped}");
            let mut original = tree;
            let mut count = 0;
            visit_selectors(&mut original, &mut |_: &mut VectorSelector| count += 1);
            let mut after = 0;
            visit_selectors(&mut sent, &mut |_: &mut VectorSelector| after += 1);
            prop_assert_eq!(count, after, "{} -> {}", q, scoped);
        }
    }
}
