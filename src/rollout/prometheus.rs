//! The Prometheus HTTP API client that takes measurements: one instant query per check,
//! with a timeout, and every way of not getting a single clean value turned into an
//! inconclusive (or, for a rejected query, invalid) outcome. It never returns a pass by
//! default.
//!
//! The endpoint is chosen by the platform (see `endpoints`), but what answers there is still
//! not trusted: redirects are never followed, an answer is read only up to `MAX_ANSWER_BYTES`
//! (the cap is enforced while reading), and what is copied into an App's status (which its
//! tenant reads) is short and never a raw body: an answer that is not a Prometheus JSON answer
//! is described by its status code, content type and size only.

use serde::Deserialize;
use std::time::Duration;

use super::analysis::QueryOutcome;

/// How long one query may take before it counts as inconclusive (connecting, waiting and
/// reading the answer, all together).
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(10);

/// How long connecting may take (part of `QUERY_TIMEOUT`, never more).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// The largest answer read. An instant query that returns one series is a few hundred bytes;
/// 1 MiB leaves room for labels without letting a server run a replica out of memory.
pub const MAX_ANSWER_BYTES: usize = 1024 * 1024;

/// Longest text taken from a Prometheus answer (its `error` field) into a message.
pub const MAX_MESSAGE_CHARS: usize = 300;

/// Reaches any Prometheus-compatible API (`/api/v1/query`).
#[derive(Clone, Debug)]
pub struct PrometheusClient {
    http: reqwest::Client,
    /// `QUERY_TIMEOUT` (shorter in tests).
    timeout: Duration,
    /// `CONNECT_TIMEOUT` (shorter in tests), or `timeout` when that is shorter.
    connect_timeout: Duration,
}

/// One query's outcome, and whether it ended because time ran out (while connecting, waiting
/// or reading): what makes a dedicated endpoint rest (`measure`).
#[derive(Clone, Debug, PartialEq)]
pub struct Asked {
    pub outcome: QueryOutcome,
    pub timed_out: bool,
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

/// What came back over HTTP, before it is read as a Prometheus answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub code: u16,
    /// The media type (`application/json`), cleaned for display.
    pub content_type: String,
    pub body: Vec<u8>,
}

impl PrometheusClient {
    pub fn new() -> Result<Self, ClientError> {
        Self::with_timeouts(QUERY_TIMEOUT, CONNECT_TIMEOUT)
    }

    /// A client whose queries time out after `timeout` (connecting after `connect`, or
    /// `timeout` if shorter) instead of `QUERY_TIMEOUT` and `CONNECT_TIMEOUT`.
    pub(crate) fn with_timeouts(timeout: Duration, connect: Duration) -> Result<Self, ClientError> {
        // reqwest is built without a bundled crypto provider; use ring, like the kube client.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let connect_timeout = connect.min(timeout);
        let builder = || {
            reqwest::Client::builder()
                .timeout(timeout)
                .connect_timeout(connect_timeout)
                // A redirect would let an allowed endpoint send the operator anywhere (the cloud
                // metadata address, the apiserver): never followed, reported as an answer.
                .redirect(reqwest::redirect::Policy::none())
                .user_agent(concat!("flotilla/", env!("CARGO_PKG_VERSION")))
        };
        let http = match builder().build() {
            Ok(http) => http,
            // The system's CA certificates are missing (an image without /etc/ssl/certs):
            // plain HTTP still works, and HTTPS fails its TLS check, which pauses the rollouts
            // that use it with the reason in their status. Better than not starting at all.
            Err(error) => {
                tracing::warn!(
                    %error,
                    "the Prometheus client could not use the system's CA certificates (SSL_CERT_FILE, /etc/ssl/certs); Prometheus over HTTPS will fail its TLS check"
                );
                builder().tls_certs_only(Vec::new()).build()?
            }
        };
        Ok(Self { http, timeout, connect_timeout })
    }

    /// How long one query may take.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// How long connecting may take.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// Runs one instant query against `base` (for example `http://127.0.0.1:9090`).
    pub async fn query(&self, base: &str, promql: &str) -> QueryOutcome {
        self.ask(base, promql).await.outcome
    }

    /// `query`, saying also whether it timed out.
    #[tracing::instrument(skip(self, base), fields(prometheus = %shown(base)))]
    pub async fn ask(&self, base: &str, promql: &str) -> Asked {
        match self.fetch(base, "/api/v1/query", &[("query", promql.to_string())]).await {
            Ok(answer) => Asked { outcome: interpret(&answer), timed_out: false },
            Err(asked) => asked,
        }
    }

    /// Runs a range query from `start` to `end` (seconds since the epoch) every `step`
    /// seconds: the one series' values, or why there are none. For showing, never judging.
    pub async fn query_range(
        &self,
        base: &str,
        promql: &str,
        start: i64,
        end: i64,
        step: u64,
    ) -> Result<Vec<(i64, f64)>, String> {
        let params = [
            ("query", promql.to_string()),
            ("start", start.to_string()),
            ("end", end.to_string()),
            ("step", step.max(1).to_string()),
        ];
        match self.fetch(base, "/api/v1/query_range", &params).await {
            Ok(answer) => interpret_range(&answer),
            Err(Asked { outcome: QueryOutcome::Inconclusive(m) | QueryOutcome::Invalid(m), .. }) => Err(m),
            Err(Asked { outcome: QueryOutcome::Value(_), .. }) => Err("no answer".into()),
        }
    }

    /// GETs `path` of `base` with `params`, reading at most `MAX_ANSWER_BYTES`; what went
    /// wrong before an answer was read is an inconclusive outcome.
    async fn fetch(&self, base: &str, path: &str, params: &[(&str, String)]) -> Result<Answer, Asked> {
        let shown = shown(base);
        let url = format!("{}{path}", base.trim_end_matches('/'));
        let inconclusive = |message: String| Asked { outcome: QueryOutcome::Inconclusive(message), timed_out: false };
        let timed_out = |message: String| Asked { outcome: QueryOutcome::Inconclusive(message), timed_out: true };
        // Prometheus' own timeout, a little under ours: it stops evaluating a query nobody
        // waits for any more, instead of spending its query slots (shared with its rules) on it.
        let server_timeout = ("timeout", format!("{}ms", (self.timeout.as_millis() * 9 / 10).max(1)));
        let mut response = match self.http.get(&url).query(params).query(&[server_timeout]).send().await {
            Ok(r) => r,
            // A connection that is never made (a name that does not resolve in time, a full
            // backlog, dropped packets, a TLS handshake that stalls) ends at the connect
            // timeout, before the query's.
            Err(e) if e.is_timeout() && e.is_connect() => {
                return Err(timed_out(format!(
                    "could not connect to Prometheus at {shown} within {:?} (name lookup, TCP or TLS)",
                    self.connect_timeout
                )));
            }
            Err(e) if e.is_timeout() => {
                return Err(timed_out(format!("Prometheus at {shown} did not answer within {:?}", self.timeout)));
            }
            Err(e) => {
                return Err(inconclusive(short(&format!(
                    "Prometheus at {shown} is unreachable: {}",
                    chain(&e.without_url())
                ))));
            }
        };
        let code = response.status().as_u16();
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(media_type)
            .unwrap_or_else(|| "no content type".into());
        if response.content_length().is_some_and(|n| n > MAX_ANSWER_BYTES as u64) {
            return Err(inconclusive(too_large(&shown, code, &content_type)));
        }
        let mut body = Vec::new();
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    if body.len() + chunk.len() > MAX_ANSWER_BYTES {
                        // Dropping the response closes the connection: the rest is never read.
                        return Err(inconclusive(too_large(&shown, code, &content_type)));
                    }
                    body.extend_from_slice(&chunk);
                }
                Ok(None) => break,
                Err(e) if e.is_timeout() => {
                    return Err(timed_out(format!(
                        "Prometheus at {shown} did not finish its answer within {:?}",
                        self.timeout
                    )));
                }
                Err(e) => {
                    return Err(inconclusive(short(&format!(
                        "reading the answer of Prometheus at {shown}: {}",
                        chain(&e.without_url())
                    ))));
                }
            }
        }
        Ok(Answer { code, content_type, body })
    }
}

fn too_large(shown: &str, code: u16, content_type: &str) -> String {
    format!(
        "the answer of Prometheus at {shown} is larger than {} KiB (HTTP {code}, {content_type}); it was not read",
        MAX_ANSWER_BYTES / 1024
    )
}

/// An endpoint as shown in messages: scheme, host, port and path, never credentials, query
/// or fragment.
pub fn shown(base: &str) -> String {
    match reqwest::Url::parse(base) {
        Ok(mut url) => {
            let _ = url.set_username("");
            let _ = url.set_password(None);
            url.set_query(None);
            url.set_fragment(None);
            url.to_string().trim_end_matches('/').to_string()
        }
        Err(_) => "(an endpoint that is not a URL)".into(),
    }
}

/// The media type of a Content-Type header, without parameters, in characters a media type
/// may have (at most 64).
fn media_type(header: &str) -> String {
    let kind: String = header
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || "/.+-_".contains(*c))
        .take(64)
        .collect();
    if kind.is_empty() { "no content type".into() } else { kind.to_ascii_lowercase() }
}

/// At most `MAX_MESSAGE_CHARS` characters of `text`, control characters replaced by spaces.
pub fn short(text: &str) -> String {
    let mut out: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).take(MAX_MESSAGE_CHARS).collect();
    if text.chars().count() > MAX_MESSAGE_CHARS {
        out.push_str("...");
    }
    out
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

/// Reads Prometheus' answer. Pure, so that every shape of answer is tested. Text of the
/// answer reaches the outcome only from the `error` field of a Prometheus JSON answer, cut
/// short; anything else is described by its status code, content type and size.
pub fn interpret(answer: &Answer) -> QueryOutcome {
    let Answer { code, content_type, body } = answer;
    let not_prometheus = || {
        let what = if (300..400).contains(code) { ", a redirect, which is not followed" } else { "" };
        QueryOutcome::Inconclusive(format!(
            "not a Prometheus API response (HTTP {code}, {content_type}, {} bytes{what})",
            body.len()
        ))
    };
    let parsed: Response = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(_) => return not_prometheus(),
    };
    if parsed.status != "success" {
        if parsed.status != "error" {
            return not_prometheus();
        }
        let kind = short(&parsed.error_type.unwrap_or_default());
        let message = short(&parsed.error.unwrap_or_else(|| "no message".into()));
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
        "matrix" | "string" => {
            return QueryOutcome::Invalid(format!(
                "the query returned a {}; it must return one instant value (a vector of one series or a scalar)",
                data.result_type
            ));
        }
        _ => {
            return QueryOutcome::Inconclusive(format!(
                "not a Prometheus API response (HTTP {code}, {content_type}, {} bytes: an unknown result type)",
                body.len()
            ));
        }
    };
    let value = sample.as_ref().and_then(|s| s.get(1)).and_then(|v| v.as_str()).map(str::parse::<f64>);
    match value {
        Some(Ok(v)) => QueryOutcome::Value(v),
        _ => QueryOutcome::Inconclusive("Prometheus answered with a sample that is not a number".into()),
    }
}

/// Reads the answer of a range query: the values of its one series, oldest first. Pure.
/// Values that are not numbers are left out; an error answer gives `interpret`'s message.
pub fn interpret_range(answer: &Answer) -> Result<Vec<(i64, f64)>, String> {
    let failed = |outcome: QueryOutcome| match outcome {
        QueryOutcome::Inconclusive(m) | QueryOutcome::Invalid(m) => m,
        QueryOutcome::Value(_) => "the query returned one instant value, not a range".into(),
    };
    let parsed = match serde_json::from_slice::<Response>(&answer.body) {
        Ok(r) if r.status == "success" => r,
        _ => return Err(failed(interpret(answer))),
    };
    let Some(Data { result_type, result }) = parsed.data else {
        return Err("Prometheus answered without data".into());
    };
    if result_type != "matrix" {
        return Err(format!("the query returned a {}, not a range", short(&result_type)));
    }
    let series = result.as_array().cloned().unwrap_or_default();
    let values = match series.as_slice() {
        [] => return Err("no data: the query returned no series".into()),
        [one] => one.get("values").and_then(|v| v.as_array()).cloned().unwrap_or_default(),
        many => return Err(format!("the query returned {} series; it must return one", many.len())),
    };
    Ok(values
        .iter()
        .filter_map(|pair| {
            let t = pair.get(0)?.as_f64()?;
            let v = pair.get(1)?.as_str()?.parse::<f64>().ok()?;
            Some((t as i64, v))
        })
        .collect())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn json(code: u16, body: &str) -> QueryOutcome {
        interpret(&Answer { code, content_type: "application/json".into(), body: body.as_bytes().to_vec() })
    }

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
        assert_eq!(json(200, one), QueryOutcome::Value(0.25));
        assert_eq!(json(200, scalar), QueryOutcome::Value(3.0));
        assert!(matches!(json(200, none), QueryOutcome::Inconclusive(m) if m.contains("no series")));
        assert!(matches!(json(200, two), QueryOutcome::Inconclusive(m) if m.contains("2 series")));
        assert!(matches!(json(200, nan), QueryOutcome::Value(v) if v.is_nan()));
        assert!(matches!(json(200, matrix), QueryOutcome::Invalid(_)));
        assert!(matches!(json(400, bad), QueryOutcome::Invalid(m) if m.contains("unexpected right parenthesis")));
        assert!(matches!(json(503, timeout), QueryOutcome::Inconclusive(m) if m.contains("timed out")));
        assert!(matches!(json(200, ""), QueryOutcome::Inconclusive(_)));
    }

    /// Whatever a server that is not Prometheus answers, none of its text reaches the
    /// message: only the status code, the content type and the size.
    #[test]
    fn a_body_that_is_not_a_prometheus_answer_is_never_copied() {
        let secret = "aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
        let cases: [(u16, &str, String, &str); 6] = [
            (200, "text/plain", secret.to_string(), "not a Prometheus API response (HTTP 200, text/plain, 62 bytes)"),
            (502, "text/html", format!("<html>{secret}</html>"), "HTTP 502, text/html"),
            (302, "text/html", format!("see {secret}"), "a redirect, which is not followed"),
            (200, "application/json", format!(r#"{{"key":"{secret}"}}"#), "not a Prometheus API response"),
            (200, "application/json", format!(r#"{{"status":"{secret}"}}"#), "not a Prometheus API response"),
            (
                200,
                "application/json",
                format!(r#"{{"status":"success","data":{{"resultType":"{secret}","result":[]}}}}"#),
                "an unknown result type",
            ),
        ];
        for (code, content_type, body, want) in cases {
            let outcome =
                interpret(&Answer { code, content_type: content_type.into(), body: body.as_bytes().to_vec() });
            let message = match &outcome {
                QueryOutcome::Inconclusive(m) | QueryOutcome::Invalid(m) => m.clone(),
                QueryOutcome::Value(v) => panic!("{body} gave a value {v}"),
            };
            assert!(message.contains(want), "{body}: {message}");
            assert!(!message.contains("aws_secret"), "{body}: {message}");
            assert!(!message.contains("EXAMPLEKEY"), "{body}: {message}");
        }
    }

    #[test]
    fn prometheus_error_messages_are_cut_short() {
        let long = "x".repeat(10_000);
        let body = format!(r#"{{"status":"error","errorType":"execution","error":"{long}\nnext line"}}"#);
        let QueryOutcome::Inconclusive(m) = json(422, &body) else { panic!("inconclusive") };
        assert!(m.len() < MAX_MESSAGE_CHARS + 100, "{} characters", m.len());
        assert!(!m.contains('\n'));
    }

    #[test]
    fn endpoints_are_shown_without_credentials() {
        assert_eq!(shown("http://user:pw@prometheus.monitoring:9090/"), "http://prometheus.monitoring:9090");
        assert_eq!(shown("https://thanos.example/prom?token=abc#x"), "https://thanos.example/prom");
        assert_eq!(media_type("Text/Plain; charset=utf-8"), "text/plain");
        assert_eq!(media_type("a\u{1b}[31mb"), "a31mb");
    }

    /// A local server answering every request with `head` and then `body` chunks until the
    /// client goes away; counts requests and bytes of body sent.
    pub(crate) async fn serve(
        head: String,
        chunk: Option<Vec<u8>>,
    ) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>, std::sync::Arc<std::sync::atomic::AtomicU64>) {
        use std::sync::atomic::Ordering;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let requests = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (r, s) = (requests.clone(), sent.clone());
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let (r, s, head, chunk) = (r.clone(), s.clone(), head.clone(), chunk.clone());
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 8192];
                    let _ = stream.read(&mut buf).await;
                    r.fetch_add(1, Ordering::SeqCst);
                    if stream.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    if let Some(chunk) = chunk {
                        let framed = [format!("{:x}\r\n", chunk.len()).into_bytes(), chunk, b"\r\n".to_vec()].concat();
                        while stream.write_all(&framed).await.is_ok() {
                            s.fetch_add(framed.len() as u64, Ordering::SeqCst);
                        }
                    }
                });
            }
        });
        (url, requests, sent)
    }

    /// An endless body is cut while reading, just past 1 MiB: the client never holds more.
    #[tokio::test]
    async fn an_endless_body_is_cut_at_the_cap() {
        let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
        let (url, _, sent) = serve(head.into(), Some(vec![b'['; 64 * 1024])).await;
        let client = PrometheusClient::new().expect("client");
        let started = std::time::Instant::now();
        let outcome = client.query(&url, "up").await;
        assert!(matches!(&outcome, QueryOutcome::Inconclusive(m) if m.contains("larger than 1024 KiB")), "{outcome:?}");
        assert!(started.elapsed() < QUERY_TIMEOUT, "cut while reading, not at the timeout");
        let sent = sent.load(std::sync::atomic::Ordering::SeqCst);
        assert!(sent < 16 * 1024 * 1024, "{sent} bytes were sent before the client hung up");
    }

    #[tokio::test]
    async fn a_declared_length_over_the_cap_is_not_read() {
        let head = format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n", 1 << 30);
        let (url, _, _) = serve(head, None).await;
        let outcome = PrometheusClient::new().expect("client").query(&url, "up").await;
        assert!(matches!(&outcome, QueryOutcome::Inconclusive(m) if m.contains("larger than")), "{outcome:?}");
    }

    #[tokio::test]
    async fn redirects_are_not_followed() {
        let (target, hits, _) = serve("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n".into(), None).await;
        let head =
            format!("HTTP/1.1 307 Temporary Redirect\r\nLocation: {target}/api/v1/query\r\nContent-Length: 0\r\n\r\n");
        let (url, asked, _) = serve(head, None).await;
        let outcome = PrometheusClient::new().expect("client").query(&url, "up").await;
        assert!(
            matches!(&outcome, QueryOutcome::Inconclusive(m) if m.contains("a redirect, which is not followed")),
            "{outcome:?}"
        );
        assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 0, "the redirect was followed");
    }

    /// A server that accepts connections and never answers, and the count it accepted.
    pub(crate) async fn hanging() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                open.push(stream);
            }
        });
        (url, accepted)
    }

    /// An address whose connections are never accepted (a listener with a full backlog: the
    /// kernel drops further handshakes), and the listener and connections that keep it so.
    pub(crate) async fn unaccepting() -> (String, Vec<tokio::net::TcpStream>, tokio::net::TcpListener) {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
        let listener = socket.listen(0).expect("listen");
        let addr = listener.local_addr().expect("addr");
        let mut held = Vec::new();
        for _ in 0..8 {
            let connect = tokio::net::TcpStream::connect(addr);
            match tokio::time::timeout(std::time::Duration::from_millis(200), connect).await {
                Ok(Ok(stream)) => held.push(stream),
                Ok(Err(e)) => panic!("connecting to fill the backlog: {e}"),
                Err(_) => return (format!("http://{addr}"), held, listener),
            }
        }
        panic!("the backlog of {addr} never filled");
    }

    /// A query ends when time runs out, and says where: a connection never accepted ends at
    /// the connect timeout, an answer that never comes (or never finishes) at the query
    /// timeout. All count as timed out (what rests a dedicated endpoint); an answer, even a
    /// bad one, does not.
    #[tokio::test]
    async fn timeouts_say_where_time_ran_out() {
        let ms = std::time::Duration::from_millis;
        let client = PrometheusClient::with_timeouts(ms(2000), ms(300)).expect("client");
        let (url, _held, _listener) = unaccepting().await;
        let started = std::time::Instant::now();
        let asked = client.ask(&url, "up").await;
        assert!(asked.timed_out, "{asked:?}");
        assert!(
            matches!(&asked.outcome, QueryOutcome::Inconclusive(m) if m.contains("could not connect to Prometheus at") && m.contains("within 300ms")),
            "{asked:?}"
        );
        assert!(started.elapsed() < ms(1000), "it ended at the connect timeout: {:?}", started.elapsed());

        let client = PrometheusClient::with_timeouts(ms(300), ms(300)).expect("client");
        let (url, _) = hanging().await;
        let asked = client.ask(&url, "up").await;
        assert!(asked.timed_out, "{asked:?}");
        assert!(
            matches!(&asked.outcome, QueryOutcome::Inconclusive(m) if m.contains("did not answer within 300ms")),
            "{asked:?}"
        );

        // Headers at once, then a body that never ends: time runs out while reading.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut open = Vec::new();
            while let Ok((mut stream, _)) = listener.accept().await {
                let _ = stream.read(&mut [0u8; 8192]).await;
                let head =
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{\r\n";
                let _ = stream.write_all(head.as_bytes()).await;
                open.push(stream);
            }
        });
        let asked = client.ask(&url, "up").await;
        assert!(asked.timed_out, "{asked:?}");
        assert!(
            matches!(&asked.outcome, QueryOutcome::Inconclusive(m) if m.contains("did not finish its answer within 300ms")),
            "{asked:?}"
        );

        let (url, _, _) = serve("HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n".into(), None).await;
        let asked = client.ask(&url, "up").await;
        assert!(!asked.timed_out && matches!(asked.outcome, QueryOutcome::Inconclusive(_)), "{asked:?}");
    }

    #[test]
    fn range_answers() {
        let answer = |body: &str| Answer { code: 200, content_type: "application/json".into(), body: body.into() };
        let one = r#"{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[10,"0.5"],[12.5,"NaN"],[14,"x"],[16,"1e3"]]}]}}"#;
        let got = interpret_range(&answer(one)).expect("one series");
        assert_eq!(got.len(), 3, "a value that is not a number is left out: {got:?}");
        assert_eq!((got[0], got[2]), ((10, 0.5), (16, 1000.0)));
        let two = r#"{"status":"success","data":{"resultType":"matrix","result":[{"values":[]},{"values":[]}]}}"#;
        assert!(interpret_range(&answer(two)).is_err_and(|m| m.contains("2 series")));
        let none = r#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#;
        assert!(interpret_range(&answer(none)).is_err_and(|m| m.contains("no series")));
        let bad = r#"{"status":"error","errorType":"bad_data","error":"parse error"}"#;
        assert!(interpret_range(&answer(bad)).is_err_and(|m| m.contains("parse error")));
        assert!(interpret_range(&answer("<html>")).is_err_and(|m| m.contains("not a Prometheus API response")));
    }
}
