//! The router's body limits, in process (no TLS): a declared body too large, an undeclared
//! one. (A body that never ends is cut off by the request timeout: tests/hostile_webhook.rs.)

use super::*;
use axum::body::Body;
use tower::ServiceExt;

fn request(body: Body, length: Option<usize>) -> http::Request<Body> {
    let mut builder = http::Request::post(WEBHOOK_PATH).header(CONTENT_TYPE, "application/json");
    if let Some(length) = length {
        builder = builder.header(http::header::CONTENT_LENGTH, length);
    }
    builder.body(body).expect("request")
}

async fn status(req: http::Request<Body>) -> StatusCode {
    let app = router(Metrics::new().expect("metrics"));
    app.oneshot(req).await.expect("infallible").status()
}

#[tokio::test]
async fn a_well_formed_review_is_answered() {
    let body = r#"{"apiVersion":"apiextensions.k8s.io/v1","kind":"ConversionReview","request":{"uid":"u","desiredAPIVersion":"flotilla.dev/v1beta1","objects":[]}}"#;
    assert_eq!(status(request(Body::from(body), Some(body.len()))).await, StatusCode::OK);
}

#[tokio::test]
async fn a_declared_body_above_the_limit_is_refused_unread() {
    // The body is never produced: the length alone refuses it.
    let never = Body::from_stream(futures::stream::pending::<Result<Bytes, std::io::Error>>());
    assert_eq!(status(request(never, Some(BODY_LIMIT + 1))).await, StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn an_undeclared_body_is_cut_off_at_the_limit() {
    let chunk = Bytes::from(vec![b' '; 1024 * 1024]);
    let chunks = (0..BODY_LIMIT / chunk.len() + 2).map(move |_| Ok::<_, std::io::Error>(chunk.clone()));
    let body = Body::from_stream(futures::stream::iter(chunks));
    assert_eq!(status(request(body, None)).await, StatusCode::PAYLOAD_TOO_LARGE);
}
