//! The Prometheus HTTP API client that takes measurements: one instant query per check,
//! with a timeout, and every way of not getting a single clean value turned into an
//! inconclusive (or, for a rejected query, invalid) outcome. It never returns a pass by
//! default.

use serde::Deserialize;
use std::time::Duration;

use super::analysis::QueryOutcome;

/// How long one query may take before it counts as inconclusive.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(10);

/// Reaches any Prometheus-compatible API (`/api/v1/query`).
#[derive(Clone, Debug)]
pub struct PrometheusClient {
    http: reqwest::Client,
}

/// Failure to build the HTTP client (a TLS setup problem at start).
#[derive(Debug, thiserror::Error)]
#[error("building the Prometheus HTTP client: {0}")]
pub struct ClientError(#[from] reqwest::Error);

#[derive(Deserialize)]
struct Response {
    status: String,
    #[serde(default)]
    data: Option<Data>,
    #[serde(default, rename = "errorType")]
    error_type: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
struct Data {
    #[serde(rename = "resultType")]
    result_type: String,
    result: serde_json::Value,
}

impl PrometheusClient {
    pub fn new() -> Result<Self, ClientError> {
        // reqwest is built without a bundled crypto provider; use ring, like the kube client.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(QUERY_TIMEOUT)
            .connect_timeout(Duration::from_secs(3))
            .user_agent(concat!("flotilla/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Self { http })
    }

    /// Runs one instant query against `base` (for example `http://127.0.0.1:9090`).
    #[tracing::instrument(skip(self), fields(prometheus = base))]
    pub async fn query(&self, base: &str, promql: &str) -> QueryOutcome {
        let url = format!("{}/api/v1/query", base.trim_end_matches('/'));
        let response = match self.http.get(&url).query(&[("query", promql)]).send().await {
            Ok(r) => r,
            Err(e) if e.is_timeout() => {
                return QueryOutcome::Inconclusive(format!(
                    "Prometheus at {base} did not answer within {QUERY_TIMEOUT:?}"
                ));
            }
            Err(e) => return QueryOutcome::Inconclusive(format!("Prometheus at {base} is unreachable: {}", chain(&e))),
        };
        let code = response.status();
        let body = match response.text().await {
            Ok(b) => b,
            Err(e) => return QueryOutcome::Inconclusive(format!("reading Prometheus' answer: {}", chain(&e))),
        };
        interpret(code.as_u16(), &body)
    }
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// Reads Prometheus' answer. Pure, so that every shape of answer is tested.
pub fn interpret(code: u16, body: &str) -> QueryOutcome {
    let parsed: Response = match serde_json::from_str(body) {
        Ok(r) => r,
        Err(_) => {
            let mut snippet: String = body.chars().take(200).collect();
            if snippet.is_empty() {
                snippet = "(empty body)".into();
            }
            return QueryOutcome::Inconclusive(format!("HTTP {code} from Prometheus, not a query answer: {snippet}"));
        }
    };
    if parsed.status != "success" {
        let kind = parsed.error_type.unwrap_or_default();
        let message = parsed.error.unwrap_or_else(|| "no message".into());
        return if kind == "bad_data" {
            QueryOutcome::Invalid(format!("Prometheus rejected the query: {message}"))
        } else {
            QueryOutcome::Inconclusive(format!("Prometheus could not run the query ({kind}): {message}"))
        };
    }
    let Some(data) = parsed.data else {
        return QueryOutcome::Inconclusive("Prometheus answered without data".into());
    };
    let sample = match data.result_type.as_str() {
        "scalar" => Some(data.result.clone()),
        "vector" => {
            let series = data.result.as_array().cloned().unwrap_or_default();
            match series.len() {
                0 => return QueryOutcome::Inconclusive("no data: the query returned no series".into()),
                1 => series[0].get("value").cloned(),
                n => {
                    return QueryOutcome::Inconclusive(format!(
                        "the query returned {n} series; it must return one (aggregate it, for example with sum())"
                    ));
                }
            }
        }
        other => {
            return QueryOutcome::Invalid(format!(
                "the query returned a {other}; it must return one instant value (a vector of one series or a scalar)"
            ));
        }
    };
    let value = sample.as_ref().and_then(|s| s.get(1)).and_then(|v| v.as_str()).map(str::parse::<f64>);
    match value {
        Some(Ok(v)) => QueryOutcome::Value(v),
        _ => QueryOutcome::Inconclusive("Prometheus answered with a sample that is not a number".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_of_answers() {
        let one = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"0.25"]}]}}"#;
        let none = r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;
        let two = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"a":"1"},"value":[1,"1"]},{"metric":{"a":"2"},"value":[1,"2"]}]}}"#;
        let scalar = r#"{"status":"success","data":{"resultType":"scalar","result":[1,"3"]}}"#;
        let nan = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"NaN"]}]}}"#;
        let matrix = r#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#;
        let bad =
            r#"{"status":"error","errorType":"bad_data","error":"1:5: parse error: unexpected right parenthesis ')'"}"#;
        let timeout = r#"{"status":"error","errorType":"timeout","error":"query timed out"}"#;
        assert_eq!(interpret(200, one), QueryOutcome::Value(0.25));
        assert_eq!(interpret(200, scalar), QueryOutcome::Value(3.0));
        assert!(matches!(interpret(200, none), QueryOutcome::Inconclusive(m) if m.contains("no series")));
        assert!(matches!(interpret(200, two), QueryOutcome::Inconclusive(m) if m.contains("2 series")));
        assert!(matches!(interpret(200, nan), QueryOutcome::Value(v) if v.is_nan()));
        assert!(matches!(interpret(200, matrix), QueryOutcome::Invalid(_)));
        assert!(matches!(interpret(400, bad), QueryOutcome::Invalid(m) if m.contains("unexpected right parenthesis")));
        assert!(matches!(interpret(503, timeout), QueryOutcome::Inconclusive(m) if m.contains("timed out")));
        assert!(
            matches!(interpret(502, "<html>bad gateway</html>"), QueryOutcome::Inconclusive(m) if m.contains("HTTP 502"))
        );
        assert!(matches!(interpret(200, ""), QueryOutcome::Inconclusive(_)));
    }
}
